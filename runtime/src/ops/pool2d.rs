//! 2-D pooling of `[n, c, h, w]` images: the max or the mean of each `kernel x kernel` window,
//! windows `stride` apart (no padding, as PyTorch's default; a window that would pass the edge is
//! not taken). Output size `(h - kernel) / stride + 1` on each side.

use super::conv::nchw;
use super::{beats, work};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::Element;
use crate::error::{panicking, Error, Result};
use crate::tensor::Tensor;

/// Which pooling: the window's max (its backward needs the positions) or its mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    Max,
    Avg,
}

/// A pooling with its window.
#[derive(Debug, Clone, Copy)]
struct Pool2d {
    kind: Pooling,
    kernel: usize,
    stride: usize,
}

impl Pooling {
    fn op(self) -> &'static str {
        match self {
            Pooling::Max => "max_pool2d",
            Pooling::Avg => "avg_pool2d",
        }
    }
}

/// The output side for an input side of `len`, or an error naming what does not fit.
fn pooled(op: &'static str, len: usize, kernel: usize, stride: usize) -> Result<usize> {
    let invalid = |arg, reason: String| Error::InvalidArgument { op, arg, reason };
    if kernel == 0 {
        return Err(invalid("kernel", "must be at least 1".into()));
    }
    if stride == 0 {
        return Err(invalid("stride", "must be at least 1".into()));
    }
    if kernel > len {
        return Err(invalid(
            "kernel",
            format!("{kernel} is larger than the image side {len}"),
        ));
    }
    Ok((len - kernel) / stride + 1)
}

impl<T: Element> Op<T> for Pool2d {
    /// The max's position in its plane (max pooling) and the input's shape.
    type Saved<'s> = (Option<Saved<'s, i64>>, [usize; 4]);

    fn name(&self) -> &'static str {
        self.kind.op()
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let Pool2d {
            kind,
            kernel,
            stride,
        } = *self;
        let x = cx.input(0);
        let op = kind.op();
        let [n, c, h, w] = nchw(op, x)?;
        let (ho, wo) = (
            pooled(op, h, kernel, stride)?,
            pooled(op, w, kernel, stride)?,
        );
        let mut out = cx.rent::<T>(&[n, c, ho, wo])?;
        // The max's position in its plane, for the backward (only when it will run).
        let mut at = match (kind, cx.saving()) {
            (Pooling::Max, true) => Some(cx.rent::<i64>(&[n, c, ho, wo])?),
            _ => None,
        };
        if !out.is_empty() {
            work::visit(n * c);
            let src = x.slice();
            let scale = T::from_f64(1.0 / (kernel * kernel) as f64);
            let mut positions = at
                .as_mut()
                .map(|t| t.unique_slice_mut().chunks_exact_mut(ho * wo));
            for (plane, dst) in out.unique_slice_mut().chunks_exact_mut(ho * wo).enumerate() {
                let image = &src[plane * h * w..][..h * w];
                let mut pos = positions.as_mut().and_then(|p| p.next());
                for (o, v) in dst.iter_mut().enumerate() {
                    let (y0, x0) = ((o / wo) * stride, (o % wo) * stride);
                    let window =
                        (y0..y0 + kernel).flat_map(|y| (x0..x0 + kernel).map(move |x| y * w + x));
                    *v = match kind {
                        Pooling::Avg => window.map(|i| image[i]).sum::<T>() * scale,
                        Pooling::Max => {
                            let mut best = y0 * w + x0;
                            for i in window {
                                if beats(image[i], image[best], true) {
                                    best = i;
                                }
                            }
                            if let Some(p) = pos.as_mut() {
                                p[o] = best as i64;
                            }
                            image[best]
                        }
                    };
                }
            }
        }
        let saved = cx
            .saving()
            .then(|| (at.as_ref().map(|at| cx.save(at)), [n, c, h, w]));
        Ok((out, saved))
    }

    /// The gradient to each window's max, or spread over the window.
    fn backward<'b>(
        &self,
        (at, input): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let Pool2d {
            kind,
            kernel,
            stride,
        } = *self;
        let [_, _, h, w] = input;
        let [_, _, ho, wo] = nchw(kind.op(), &g)?;
        let mut dx = cx.zeros::<T>(&input)?;
        if dx.is_empty() || g.is_empty() {
            return Ok(Grads::from([Some(dx)]));
        }
        let scale = T::from_f64(1.0 / (kernel * kernel) as f64);
        let planes = dx
            .unique_slice_mut()
            .chunks_exact_mut(h * w)
            .zip(g.slice().chunks_exact(ho * wo));
        for (plane, (d, gp)) in planes.enumerate() {
            for (o, &gv) in gp.iter().enumerate() {
                match kind {
                    Pooling::Max => {
                        let at = at
                            .as_ref()
                            .expect("a recorded max pooling keeps the positions");
                        let i = at.0.slice()[plane * ho * wo + o] as usize;
                        d[i] = d[i] + gv;
                    }
                    Pooling::Avg => {
                        let (y0, x0) = ((o / wo) * stride, (o % wo) * stride);
                        for y in y0..y0 + kernel {
                            for v in &mut d[y * w + x0..][..kernel] {
                                *v = *v + gv * scale;
                            }
                        }
                    }
                }
            }
        }
        Ok(Grads::from([Some(dx)]))
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// The max of each `kernel x kernel` window of `[n, c, h, w]`, windows `stride` apart:
    /// `[n, c, (h - kernel) / stride + 1, (w - kernel) / stride + 1]` (PyTorch's `max_pool2d` with
    /// no padding). A window holding NaN gives NaN. The gradient goes to each window's max (the
    /// first, among equal values). Fails with [`Error::InvalidShape`] for a tensor that is not
    /// 4-D, [`Error::InvalidArgument`] for a zero kernel or stride or a kernel larger than the
    /// image.
    pub fn try_max_pool2d(&self, kernel: usize, stride: usize) -> Result<Tensor<'s, T>> {
        let op = Pool2d {
            kind: Pooling::Max,
            kernel,
            stride,
        };
        autograd::run(op, &mut args([Arg::Borrowed(self)]))
    }

    /// The mean of each `kernel x kernel` window of `[n, c, h, w]`, windows `stride` apart
    /// (PyTorch's `avg_pool2d` with no padding). Fails as [`Tensor::try_max_pool2d`].
    pub fn try_avg_pool2d(&self, kernel: usize, stride: usize) -> Result<Tensor<'s, T>> {
        let op = Pool2d {
            kind: Pooling::Avg,
            kernel,
            stride,
        };
        autograd::run(op, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// The max of each window.
        pub fn max_pool2d(&self, kernel: usize, stride: usize) -> Tensor<'s, T> = try_max_pool2d;
        /// The mean of each window.
        pub fn avg_pool2d(&self, kernel: usize, stride: usize) -> Tensor<'s, T> = try_avg_pool2d;
    }
}
