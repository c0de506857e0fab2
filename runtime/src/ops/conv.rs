//! Image ops on `[batch, channels, height, width]` tensors: convolution, group normalization and
//! nearest-neighbour upsampling, with their backward kernels.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::{check_addressable, dimension_overflow, lane_op, work, Arg, Lane, Lanes, Operand};
use crate::autograd::{self, Recorder, Rule};
use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::deeper;
use crate::tensor::Tensor;

pub(crate) fn nchw<T: Element>(op: &'static str, t: &Tensor<'_, T>) -> Result<[usize; 4]> {
    match *t.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(Error::InvalidShape {
            op,
            shape: Shape::from(t.shape()),
            reason: "expected [batch, channels, height, width]".into(),
        }),
    }
}

/// The sizes of a convolution, checked: input `[n, c_in, h, w]`, weight `[c_out, c_in, kh, kw]`,
/// output `[n, c_out, ho, wo]`. A patch matrix (im2col) has `rows = c_in kh kw` rows and
/// `positions = ho wo` columns.
struct Conv {
    n: usize,
    c_in: usize,
    h: usize,
    w: usize,
    c_out: usize,
    kh: usize,
    kw: usize,
    stride: usize,
    padding: usize,
    ho: usize,
    wo: usize,
}

impl Conv {
    fn new<T: Element>(
        x: &Tensor<'_, T>,
        weight: &Tensor<'_, T>,
        stride: usize,
        padding: usize,
    ) -> Result<Conv> {
        let [n, c_in, h, w] = nchw("conv2d", x)?;
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: "conv2d",
            lhs: Shape::from(x.shape()),
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
        let overflow = || dimension_overflow("conv2d", "padding", padding, x.shape());
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
        // Addressable, so `ho * wo` (both at least 1) cannot overflow.
        check_addressable::<T>(&[n, c_out, ho, wo], overflow)?;
        Ok(Conv {
            n,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            stride,
            padding,
            ho,
            wo,
        })
    }

    fn out_shape(&self) -> [usize; 4] {
        [self.n, self.c_out, self.ho, self.wo]
    }

    fn rows(&self) -> usize {
        self.c_in * self.kh * self.kw
    }

    fn positions(&self) -> usize {
        self.ho * self.wo
    }

    /// Calls `f(patch row, patch column, image offset)` for every patch entry that lies inside the
    /// image (the others are the zero border). A padded coordinate below `padding` or at
    /// `padding + len` and past is in the border; `checked_sub` finds the first kind without casts.
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize, usize)) {
        let inside = |o: usize, k: usize, len: usize| {
            (o * self.stride + k)
                .checked_sub(self.padding)
                .filter(|&i| i < len)
        };
        for c in 0..self.c_in {
            for ky in 0..self.kh {
                for kx in 0..self.kw {
                    let row = (c * self.kh + ky) * self.kw + kx;
                    for oy in 0..self.ho {
                        let Some(iy) = inside(oy, ky, self.h) else {
                            continue;
                        };
                        for ox in 0..self.wo {
                            if let Some(ix) = inside(ox, kx, self.w) {
                                f(row, oy * self.wo + ox, (c * self.h + iy) * self.w + ix);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The patch matrix of one image (im2col), written whole: the border entries are zeros.
    fn im2col<T: Element>(&self, image: &[T], patches: &mut [T]) {
        patches.fill(T::zero());
        let positions = self.positions();
        self.for_each_tap(|row, col, at| patches[row * positions + col] = image[at]);
    }

    /// The transpose of im2col: each patch entry added into the image pixel it came from.
    fn col2im<T: Element>(&self, patches: &[T], image: &mut [T]) {
        let positions = self.positions();
        self.for_each_tap(|row, col, at| {
            image[at] = image[at] + patches[row * positions + col];
        });
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// 2-D convolution (cross-correlation, as in PyTorch) of `[n, c_in, h, w]` with `weight`
    /// `[c_out, c_in, k_h, k_w]` (a tensor or a [`Param`](crate::Param)), zero `padding` on every
    /// side and `stride`; the output is `[n, c_out, (h + 2 padding - k_h) / stride + 1, ...]`.
    /// Computed by im2col: each image's patches go into one rented `[c_in k_h k_w, h_out w_out]`
    /// matrix, multiplied by the weight straight into the output. Fails with
    /// [`Error::InvalidShape`] or [`Error::ShapeMismatch`] naming both shapes (channels that differ,
    /// a kernel larger than the padded image, a zero stride), and with
    /// [`Error::DimensionOverflow`] for a padding that makes the output too large.
    pub fn try_conv2d(
        &self,
        weight: &impl Operand<'s, T>,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<'s, T>> {
        let weight = &*weight.bind_beside(self);
        let conv = Conv::new(self, weight, stride, padding)?;
        let scope = deeper(&self.rents_in, &weight.rents_in);
        let mut out = Tensor::try_rent_in(scope, &conv.out_shape())?;
        if !out.is_empty() {
            let (rows, positions) = (conv.rows(), conv.positions());
            let mut cols = Tensor::<T>::try_rent_in(scope, &[rows, positions])?;
            let kernel = ArrayView2::from_shape((conv.c_out, rows), weight.as_slice())
                .expect("the weight holds c_out x rows elements");
            let image_len = conv.c_in * conv.h * conv.w;
            let out_len = conv.c_out * positions;
            // Every image is visited by index, also an empty one (no channels, or no pixels but
            // padding): its output is the product with all-zero patches, and must be written.
            work::visit(conv.n);
            for (i, out_image) in out.unique_slice_mut().chunks_exact_mut(out_len).enumerate() {
                conv.im2col(
                    &self.as_slice()[i * image_len..][..image_len],
                    cols.unique_slice_mut(),
                );
                let patches = ArrayView2::from_shape((rows, positions), cols.as_slice())
                    .expect("cols holds rows x positions");
                let mut result = ArrayViewMut2::from_shape((conv.c_out, positions), out_image)
                    .expect("the output image holds c_out x positions");
                general_mat_mul(T::one(), &kernel, &patches, T::zero(), &mut result);
            }
        }
        Ok(autograd::finish(Recorder::of(&[self, weight]), out, |_| {
            Rule::Conv2d(self.saved(), weight.saved(), stride, padding)
        }))
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
        let group = Lanes::runs((c / groups) * h * w);
        let out = lane_op(Arg::Borrowed(self), group, Lane::LayerNorm(eps))?;
        let recorder = Recorder::of(&[self]);
        Ok(autograd::finish(recorder, out, |y| {
            Rule::GroupNorm(self.saved(), y.saved(), groups, eps)
        }))
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
    /// scale or a tensor that is not 4-D, and with [`Error::DimensionOverflow`] for a scale that
    /// makes the output too large.
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
        let mut out = Tensor::try_rent_in(&self.rents_in, &out_shape)?;
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
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Upsample(scale)
        }))
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

/// The gradients of a convolution's input and weight (each only if asked for), given `g`, the
/// gradient of its output, all rented in `g`'s scope: `dW = sum_i g_i cols_i^T` and
/// `dx_i = col2im(W^T g_i)`.
#[allow(clippy::type_complexity)]
pub(crate) fn conv2d_backward<'s, T: Element>(
    x: &Tensor<'s, T>,
    weight: &Tensor<'s, T>,
    g: &Tensor<'s, T>,
    stride: usize,
    padding: usize,
    need_x: bool,
    need_w: bool,
) -> Result<(Option<Tensor<'s, T>>, Option<Tensor<'s, T>>)> {
    let conv = Conv::new(x, weight, stride, padding)?;
    let (rows, positions) = (conv.rows(), conv.positions());
    let mut dx = need_x
        .then(|| Tensor::try_rent_zeroed_in(&g.rents_in, x.shape()))
        .transpose()?;
    let mut dw = need_w
        .then(|| Tensor::try_rent_zeroed_in(&g.rents_in, weight.shape()))
        .transpose()?;
    if g.is_empty() || rows == 0 {
        return Ok((dx, dw));
    }
    let mut cols = Tensor::<T>::try_rent_in(&g.rents_in, &[rows, positions])?;
    let kernel = ArrayView2::from_shape((conv.c_out, rows), weight.as_slice())
        .expect("the weight holds c_out x rows elements");
    let image_len = conv.c_in * conv.h * conv.w;
    let out_len = conv.c_out * positions;
    work::visit(conv.n);
    for i in 0..conv.n {
        let gi = ArrayView2::from_shape(
            (conv.c_out, positions),
            &g.as_slice()[i * out_len..][..out_len],
        )
        .expect("the gradient image holds c_out x positions");
        if let Some(dw) = &mut dw {
            conv.im2col(
                &x.as_slice()[i * image_len..][..image_len],
                cols.unique_slice_mut(),
            );
            let patches = ArrayView2::from_shape((rows, positions), cols.as_slice())
                .expect("cols holds rows x positions");
            let mut acc = ArrayViewMut2::from_shape((conv.c_out, rows), dw.unique_slice_mut())
                .expect("the weight gradient holds c_out x rows");
            general_mat_mul(T::one(), &gi, &patches.t(), T::one(), &mut acc);
        }
        if let Some(dx) = &mut dx {
            let mut dcols = ArrayViewMut2::from_shape((rows, positions), cols.unique_slice_mut())
                .expect("cols holds rows x positions");
            general_mat_mul(T::one(), &kernel.t(), &gi, T::zero(), &mut dcols);
            conv.col2im(
                cols.as_slice(),
                &mut dx.unique_slice_mut()[i * image_len..][..image_len],
            );
        }
    }
    Ok((dx, dw))
}

/// The gradient of nearest upsampling by `scale`: each input pixel gets the sum of its block.
pub(crate) fn upsample_backward<'s, T: Element>(
    g: &Tensor<'s, T>,
    scale: usize,
) -> Result<Tensor<'s, T>> {
    let [n, c, ho, wo] = nchw("upsample_nearest2d backward", g)?;
    let (h, w) = (ho / scale, wo / scale);
    let mut dx = Tensor::try_rent_zeroed_in(&g.rents_in, &[n, c, h, w])?;
    if !dx.is_empty() {
        work::visit(n * c);
        let src = g.as_slice();
        for (plane, dst) in dx.unique_slice_mut().chunks_exact_mut(h * w).enumerate() {
            let block = &src[plane * ho * wo..][..ho * wo];
            for (oy, row) in block.chunks_exact(wo).enumerate() {
                let in_row = &mut dst[(oy / scale) * w..][..w];
                for (ox, &v) in row.iter().enumerate() {
                    in_row[ox / scale] = in_row[ox / scale] + v;
                }
            }
        }
    }
    Ok(dx)
}
