//! Image ops on `[batch, channels, height, width]` tensors: convolution, group normalization and
//! nearest-neighbour upsampling.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::{check_addressable, dimension_overflow, work, Operand};
use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::deeper;
use crate::tensor::Tensor;

fn nchw<T: Element>(op: &'static str, t: &Tensor<'_, T>) -> Result<[usize; 4]> {
    match *t.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(Error::InvalidShape {
            op,
            shape: Shape::from(t.shape()),
            reason: "expected [batch, channels, height, width]".into(),
        }),
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// 2-D convolution (cross-correlation, as in PyTorch) of `[n, c_in, h, w]` with `weight`
    /// `[c_out, c_in, k_h, k_w]`, zero `padding` on every side and `stride`; the output is
    /// `[n, c_out, (h + 2 padding - k_h) / stride + 1, ...]`. Computed by im2col: each image's patches
    /// go into one rented `[c_in k_h k_w, h_out w_out]` matrix, multiplied by the weight straight into
    /// the output. Fails with [`Error::InvalidShape`] or [`Error::ShapeMismatch`] naming both shapes
    /// (channels that differ, a kernel larger than the padded image, a zero stride).
    pub fn try_conv2d(
        &self,
        weight: &impl Operand<'s, T>,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<'s, T>> {
        let weight = &*weight.bind_beside(self);
        let [n, c_in, h, w] = nchw("conv2d", self)?;
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: "conv2d",
            lhs: Shape::from(self.shape()),
            rhs: Shape::from(weight.shape()),
            reason,
        };
        let &[c_out, wc_in, kh, kw] = weight.shape() else {
            return Err(mismatch(
                "the weight must be [c_out, c_in, k_h, k_w]".into(),
            ));
        };
        if wc_in != c_in {
            return Err(mismatch(format!(
                "input channels differ ({c_in} and {wc_in})"
            )));
        }
        if stride == 0 {
            return Err(mismatch("stride must be at least 1".into()));
        }
        let overflow = || dimension_overflow("conv2d", "padding", padding, self.shape());
        let padded = |len: usize| {
            padding
                .checked_mul(2)
                .and_then(|p| p.checked_add(len))
                .ok_or_else(overflow)
        };
        let (ph, pw) = (padded(h)?, padded(w)?);
        if kh > ph || kw > pw || kh == 0 || kw == 0 {
            return Err(mismatch(format!(
                "a {kh}x{kw} kernel does not fit a {ph}x{pw} padded image"
            )));
        }
        let (ho, wo) = ((ph - kh) / stride + 1, (pw - kw) / stride + 1);
        let out_shape = [n, c_out, ho, wo];
        // Addressable, so `ho * wo` (both at least 1) cannot overflow.
        check_addressable::<T>(&out_shape, overflow)?;
        let positions = ho * wo;
        let rows = c_in * kh * kw;
        let scope = deeper(&self.scope, &weight.scope);
        let mut out = Tensor::try_rent_in(scope, &out_shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let mut cols = Tensor::<T>::try_rent_in(scope, &[rows, positions])?;
        let kernel = ArrayView2::from_shape((c_out, rows), weight.as_slice())
            .expect("the weight holds c_out x rows elements");
        let image_len = c_in * h * w;
        let out_len = c_out * positions;
        // Every image is visited by index, also an empty one (no channels, or no pixels but
        // padding): its output is the product with all-zero patches, and must be written.
        work::visit(n);
        for (i, out_image) in out.unique_slice_mut().chunks_exact_mut(out_len).enumerate() {
            let image = &self.as_slice()[i * image_len..][..image_len];
            let patches = cols.unique_slice_mut();
            for c in 0..c_in {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let row = (c * kh + ky) * kw + kx;
                        let dst = &mut patches[row * positions..][..positions];
                        // A padded coordinate below `padding` or at `padding + len` and past is
                        // in the zero border; `checked_sub` finds the first kind without casts.
                        let inside = |o: usize, k: usize, len: usize| {
                            (o * stride + k).checked_sub(padding).filter(|&i| i < len)
                        };
                        for oy in 0..ho {
                            let iy = inside(oy, ky, h);
                            for ox in 0..wo {
                                dst[oy * wo + ox] = match (iy, inside(ox, kx, w)) {
                                    (Some(iy), Some(ix)) => image[(c * h + iy) * w + ix],
                                    _ => T::zero(),
                                };
                            }
                        }
                    }
                }
            }
            let patches = ArrayView2::from_shape((rows, positions), cols.as_slice())
                .expect("cols holds rows x positions");
            let mut result = ArrayViewMut2::from_shape((c_out, positions), out_image)
                .expect("the output image holds c_out x positions");
            general_mat_mul(T::one(), &kernel, &patches, T::zero(), &mut result);
        }
        Ok(out)
    }

    /// 2-D convolution; see [`Tensor::try_conv2d`].
    ///
    /// # Panics
    /// If the shapes do not fit or the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &impl Operand<'s, T>,
        stride: usize,
        padding: usize,
    ) -> Tensor<'s, T> {
        or_panic(self.try_conv2d(weight, stride, padding))
    }

    /// Group normalization of `[n, c, h, w]`: the channels are split into `groups` groups and each
    /// (image, group) is normalized to zero mean and unit variance over its channels and pixels.
    /// Scale and shift by broadcasting with `[c, 1, 1]` tensors. Fails with [`Error::InvalidShape`]
    /// if `groups` is zero or does not divide the channels.
    pub fn try_group_norm(&self, groups: usize, eps: T) -> Result<Tensor<'s, T>> {
        let [_, c, h, w] = nchw("group_norm", self)?;
        if groups == 0 || c % groups != 0 {
            return Err(Error::InvalidShape {
                op: "group_norm",
                shape: Shape::from(self.shape()),
                reason: format!("{groups} groups do not divide {c} channels"),
            });
        }
        let mut out = Tensor::try_rent_in(&self.scope, self.shape())?;
        if out.is_empty() {
            return Ok(out);
        }
        let group_len = (c / groups) * h * w;
        work::visit(out.len() / group_len);
        let n = T::from_f64(group_len as f64);
        for (src, dst) in self
            .as_slice()
            .chunks_exact(group_len)
            .zip(out.unique_slice_mut().chunks_exact_mut(group_len))
        {
            let mean = src.iter().copied().sum::<T>() / n;
            let var = src
                .iter()
                .fold(T::zero(), |a, &v| a + (v - mean) * (v - mean))
                / n;
            let inv = (var + eps).sqrt().recip();
            dst.iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = (v - mean) * inv);
        }
        Ok(out)
    }

    /// Group normalization; see [`Tensor::try_group_norm`].
    ///
    /// # Panics
    /// For a bad shape or group count, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn group_norm(&self, groups: usize, eps: T) -> Tensor<'s, T> {
        or_panic(self.try_group_norm(groups, eps))
    }

    /// Nearest-neighbour upsampling of `[n, c, h, w]` by an integer `scale`: `[n, c, scale h, scale w]`,
    /// each pixel repeated in a `scale x scale` block. Fails with [`Error::InvalidShape`] for a zero
    /// scale or a tensor that is not 4-D.
    pub fn try_upsample_nearest2d(&self, scale: usize) -> Result<Tensor<'s, T>> {
        let [n, c, h, w] = nchw("upsample_nearest2d", self)?;
        if scale == 0 {
            return Err(Error::InvalidShape {
                op: "upsample_nearest2d",
                shape: Shape::from(self.shape()),
                reason: "the scale must be at least 1".into(),
            });
        }
        let overflow = || dimension_overflow("upsample_nearest2d", "scale", scale, self.shape());
        let (ho, wo) = (
            h.checked_mul(scale).ok_or_else(overflow)?,
            w.checked_mul(scale).ok_or_else(overflow)?,
        );
        let out_shape = [n, c, ho, wo];
        check_addressable::<T>(&out_shape, overflow)?;
        let mut out = Tensor::try_rent_in(&self.scope, &out_shape)?;
        if !out.is_empty() {
            let src = self.as_slice();
            work::visit(n * c);
            for (plane, dst) in out.unique_slice_mut().chunks_exact_mut(ho * wo).enumerate() {
                let input = &src[plane * h * w..][..h * w];
                for (oy, row) in dst.chunks_exact_mut(wo).enumerate() {
                    let in_row = &input[(oy / scale) * w..][..w];
                    row.iter_mut()
                        .enumerate()
                        .for_each(|(ox, v)| *v = in_row[ox / scale]);
                }
            }
        }
        Ok(out)
    }

    /// Nearest-neighbour upsampling; see [`Tensor::try_upsample_nearest2d`].
    ///
    /// # Panics
    /// For a bad shape or scale, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn upsample_nearest2d(&self, scale: usize) -> Tensor<'s, T> {
        or_panic(self.try_upsample_nearest2d(scale))
    }
}
