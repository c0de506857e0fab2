//! Image ops on `[batch, channels, height, width]` tensors: convolution, group normalization and
//! nearest-neighbour upsampling.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::{deeper, rent_scope};
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
        weight: &Tensor<'s, T>,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<'s, T>> {
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
        let (ph, pw) = (h + 2 * padding, w + 2 * padding);
        if kh > ph || kw > pw || kh == 0 || kw == 0 {
            return Err(mismatch(format!(
                "a {kh}x{kw} kernel does not fit a {ph}x{pw} padded image"
            )));
        }
        let (ho, wo) = ((ph - kh) / stride + 1, (pw - kw) / stride + 1);
        let rows = c_in * kh * kw;
        let scope = rent_scope(deeper(&self.scope, &weight.scope));
        let mut out = Tensor::try_rent_in(&scope, &[n, c_out, ho, wo])?;
        let mut cols = Tensor::<T>::try_rent_in(&scope, &[rows, ho * wo])?;
        let kernel = ArrayView2::from_shape((c_out, rows), weight.as_slice())
            .expect("the weight holds c_out x rows elements");
        let image_len = c_in * h * w;
        let out_len = c_out * ho * wo;
        for (image, out_image) in self
            .as_slice()
            .chunks_exact(image_len.max(1))
            .zip(out.unique_slice_mut().chunks_exact_mut(out_len.max(1)))
            .take(n)
        {
            let patches = cols.unique_slice_mut();
            for c in 0..c_in {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let row = (c * kh + ky) * kw + kx;
                        let dst = &mut patches[row * ho * wo..][..ho * wo];
                        for oy in 0..ho {
                            let iy = (oy * stride + ky) as isize - padding as isize;
                            for ox in 0..wo {
                                let ix = (ox * stride + kx) as isize - padding as isize;
                                dst[oy * wo + ox] =
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        T::zero()
                                    } else {
                                        image[(c * h + iy as usize) * w + ix as usize]
                                    };
                            }
                        }
                    }
                }
            }
            let patches = ArrayView2::from_shape((rows, ho * wo), cols.as_slice())
                .expect("cols holds rows x positions");
            let mut result = ArrayViewMut2::from_shape((c_out, ho * wo), out_image)
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
    pub fn conv2d(&self, weight: &Tensor<'s, T>, stride: usize, padding: usize) -> Tensor<'s, T> {
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
        let mut out = Tensor::try_rent_in(&rent_scope(&self.scope), self.shape())?;
        let group_len = (c / groups) * h * w;
        if group_len == 0 {
            return Ok(out);
        }
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
        let (ho, wo) = (h * scale, w * scale);
        let mut out = Tensor::try_rent_in(&rent_scope(&self.scope), &[n, c, ho, wo])?;
        if w > 0 {
            let src = self.as_slice();
            for (plane, dst) in out
                .unique_slice_mut()
                .chunks_exact_mut((ho * wo).max(1))
                .enumerate()
            {
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
