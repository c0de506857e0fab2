//! Image ops on `[batch, channels, height, width]` tensors: convolution, group normalization and
//! nearest-neighbour upsampling, with their backward kernels.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::lanes::LaneOp;
use super::{check_addressable, dimension_overflow, work, Operand};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::Element;
use crate::error::{panicking, Error, Result, Shape};
use crate::tensor::Tensor;

/// 2-D convolution with a stride and zero padding.
#[derive(Debug, Clone, Copy)]
struct Conv2d {
    stride: usize,
    padding: usize,
}

impl<T: Element> Op<T> for Conv2d {
    /// The input and the weight.
    type Saved = (Saved<T>, Saved<T>);

    fn name(&self) -> &'static str {
        "conv2d"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved>)> {
        let (x, weight) = (cx.input(0), cx.input(1));
        let conv = Conv::new(x, weight, self.stride, self.padding)?;
        let mut out = cx.rent(&conv.out_shape())?;
        if !out.is_empty() {
            let (rows, positions) = (conv.rows(), conv.positions());
            let mut cols = cx.rent::<T>(&[rows, positions])?;
            let kernel = ArrayView2::from_shape((conv.c_out, rows), weight.as_slice())
                .expect("the weight holds c_out x rows elements");
            let image_len = conv.c_in * conv.h * conv.w;
            let out_len = conv.c_out * positions;
            // Every image is visited by index, also an empty one (no channels, or no pixels but
            // padding): its output is the product with all-zero patches, and must be written.
            work::visit(conv.n);
            for (i, out_image) in out.unique_slice_mut().chunks_exact_mut(out_len).enumerate() {
                conv.im2col(
                    &x.as_slice()[i * image_len..][..image_len],
                    cols.unique_slice_mut(),
                );
                let patches = ArrayView2::from_shape((rows, positions), cols.as_slice())
                    .expect("cols holds rows x positions");
                let mut result = ArrayViewMut2::from_shape((conv.c_out, positions), out_image)
                    .expect("the output image holds c_out x positions");
                general_mat_mul(T::one(), &kernel, &patches, T::zero(), &mut result);
            }
        }
        Ok((out, cx.saving().then(|| (cx.save(x), cx.save(weight)))))
    }

    /// `dW = sum_i g_i cols_i^T` and `dx_i = col2im(W^T g_i)`, each only if needed.
    fn backward<'b>(
        &self,
        (x, weight): Self::Saved,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (x, weight) = (x.get(cx), weight.get(cx));
        let conv = Conv::new(&x, &weight, self.stride, self.padding)?;
        let (rows, positions) = (conv.rows(), conv.positions());
        let mut dx = cx.needs(0).then(|| cx.zeros::<T>(x.shape())).transpose()?;
        let mut dw = cx
            .needs(1)
            .then(|| cx.zeros::<T>(weight.shape()))
            .transpose()?;
        if g.is_empty() || rows == 0 {
            return Ok(Grads::from([dx, dw]));
        }
        let mut cols = cx.rent::<T>(&[rows, positions])?;
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
                let mut dcols =
                    ArrayViewMut2::from_shape((rows, positions), cols.unique_slice_mut())
                        .expect("cols holds rows x positions");
                general_mat_mul(T::one(), &kernel.t(), &gi, T::zero(), &mut dcols);
                conv.col2im(
                    cols.as_slice(),
                    &mut dx.unique_slice_mut()[i * image_len..][..image_len],
                );
            }
        }
        Ok(Grads::from([dx, dw]))
    }
}

/// Nearest-neighbour upsampling by an integer scale.
#[derive(Debug, Clone, Copy)]
struct Upsample {
    scale: usize,
}

impl<T: Element> Op<T> for Upsample {
    type Saved = ();

    fn name(&self) -> &'static str {
        "upsample_nearest2d"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved>)> {
        let (x, scale) = (cx.input(0), self.scale);
        let [n, c, h, w] = nchw("upsample_nearest2d", x)?;
        let overflow = || dimension_overflow("upsample_nearest2d", "scale", scale, x.shape());
        let (ho, wo) = (
            h.checked_mul(scale).ok_or_else(overflow)?,
            w.checked_mul(scale).ok_or_else(overflow)?,
        );
        let out_shape = [n, c, ho, wo];
        check_addressable::<T>(&out_shape, overflow)?;
        let mut out = cx.rent(&out_shape)?;
        if !out.is_empty() {
            let src = x.as_slice();
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
        Ok((out, cx.saving().then_some(())))
    }

    /// Each input pixel gets the sum of its block.
    fn backward<'b>(&self, (): (), g: Tensor<'b, T>, cx: &Backward<'b>) -> Result<Grads<'b, T>> {
        let scale = self.scale;
        let [n, c, ho, wo] = nchw("upsample_nearest2d backward", &g)?;
        let (h, w) = (ho / scale, wo / scale);
        let mut dx = cx.zeros::<T>(&[n, c, h, w])?;
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
        Ok(Grads::from([Some(dx)]))
    }
}

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
        let weight = weight.bind_beside(self);
        let inputs = &mut args([Arg::Borrowed(self), Arg::Borrowed(&*weight)]);
        autograd::run(Conv2d { stride, padding }, inputs)
    }

    /// Group normalization of `[n, c, h, w]`: the channels are split into `groups` groups and each
    /// (image, group) is normalized to zero mean and unit variance over its channels and pixels.
    /// Scale and shift by broadcasting with `[c, 1, 1]` tensors. Fails with [`Error::InvalidShape`]
    /// if `groups` is zero or does not divide the channels.
    pub fn try_group_norm(&self, groups: usize, eps: T) -> Result<Tensor<'s, T>> {
        let [_, c, _, _] = nchw("group_norm", self)?;
        if groups == 0 || c % groups != 0 {
            return Err(Error::InvalidShape {
                op: "group_norm",
                shape: Shape::from(self.shape()),
                reason: format!("{groups} groups do not divide {c} channels"),
            });
        }
        LaneOp::groups(groups, eps).run(Arg::Borrowed(self))
    }

    /// Nearest-neighbour upsampling of `[n, c, h, w]` by an integer `scale`: `[n, c, scale h, scale w]`,
    /// each pixel repeated in a `scale x scale` block. Fails with [`Error::InvalidShape`] for a zero
    /// scale or a tensor that is not 4-D, and with [`Error::DimensionOverflow`] for a scale that
    /// makes the output too large.
    pub fn try_upsample_nearest2d(&self, scale: usize) -> Result<Tensor<'s, T>> {
        nchw("upsample_nearest2d", self)?;
        if scale == 0 {
            return Err(Error::InvalidShape {
                op: "upsample_nearest2d",
                shape: Shape::from(self.shape()),
                reason: "the scale must be at least 1".into(),
            });
        }
        autograd::run(Upsample { scale }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// 2-D convolution.
        pub fn conv2d(&self, weight: &impl Operand<'s, T>, stride: usize, padding: usize) -> Tensor<'s, T> = try_conv2d;
        /// Group normalization.
        pub fn group_norm(&self, groups: usize, eps: T) -> Tensor<'s, T> = try_group_norm;
        /// Nearest-neighbour upsampling.
        pub fn upsample_nearest2d(&self, scale: usize) -> Tensor<'s, T> = try_upsample_nearest2d;
    }
}
