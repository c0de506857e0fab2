//! 2-D pooling of `[n, c, h, w]` images: the max or the mean of each `kernel x kernel` window,
//! windows `stride` apart (no padding, as PyTorch's default; a window that would pass the edge is
//! not taken). Output size `(h - kernel) / stride + 1` on each side.

use super::conv::nchw;
use super::{beats, work};
use crate::autograd::{self, Recorder, Rule};
use crate::element::Element;
use crate::error::{or_panic, Error, Result};
use crate::tensor::Tensor;

/// Which pooling: the window's max (its backward needs the positions) or its mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pooling {
    Max,
    Avg,
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

impl<'s, T: Element> Tensor<'s, T> {
    /// The max of each `kernel x kernel` window of `[n, c, h, w]`, windows `stride` apart:
    /// `[n, c, (h - kernel) / stride + 1, (w - kernel) / stride + 1]` (PyTorch's `max_pool2d` with
    /// no padding). A window holding NaN gives NaN. The gradient goes to each window's max (the
    /// first, among equal values). Fails with [`Error::InvalidShape`] for a tensor that is not
    /// 4-D, [`Error::InvalidArgument`] for a zero kernel or stride or a kernel larger than the
    /// image.
    pub fn try_max_pool2d(&self, kernel: usize, stride: usize) -> Result<Tensor<'s, T>> {
        self.pool2d(Pooling::Max, kernel, stride)
    }

    /// The max of each window; see [`Tensor::try_max_pool2d`].
    ///
    /// # Panics
    /// For a bad shape, kernel or stride, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn max_pool2d(&self, kernel: usize, stride: usize) -> Tensor<'s, T> {
        or_panic(self.try_max_pool2d(kernel, stride))
    }

    /// The mean of each `kernel x kernel` window of `[n, c, h, w]`, windows `stride` apart
    /// (PyTorch's `avg_pool2d` with no padding). Fails as [`Tensor::try_max_pool2d`].
    pub fn try_avg_pool2d(&self, kernel: usize, stride: usize) -> Result<Tensor<'s, T>> {
        self.pool2d(Pooling::Avg, kernel, stride)
    }

    /// The mean of each window; see [`Tensor::try_avg_pool2d`].
    ///
    /// # Panics
    /// For a bad shape, kernel or stride, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn avg_pool2d(&self, kernel: usize, stride: usize) -> Tensor<'s, T> {
        or_panic(self.try_avg_pool2d(kernel, stride))
    }

    pub(crate) fn pool2d(
        &self,
        kind: Pooling,
        kernel: usize,
        stride: usize,
    ) -> Result<Tensor<'s, T>> {
        let op = kind.op();
        let [n, c, h, w] = nchw(op, self)?;
        let (ho, wo) = (
            pooled(op, h, kernel, stride)?,
            pooled(op, w, kernel, stride)?,
        );
        let recorder = Recorder::of(&[self]);
        let mut out = Tensor::try_rent_in(&self.rents_in, &[n, c, ho, wo])?;
        // The max's position in its plane, for the backward (only when recording).
        let mut at = match (kind, &recorder) {
            (Pooling::Max, Some(_)) => {
                Some(Tensor::<i64>::try_rent_in(&self.rents_in, &[n, c, ho, wo])?)
            }
            _ => None,
        };
        if !out.is_empty() {
            work::visit(n * c);
            let src = self.as_slice();
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
        Ok(autograd::finish(recorder, out, |_| Rule::Pool2d {
            kind,
            kernel,
            stride,
            at: at.map(Tensor::into_saved),
            input: [n, c, h, w],
        }))
    }
}

/// The gradient of a pooling of an `input`-shaped image, given `g`.
pub(crate) fn pool2d_backward<T: Element>(
    g: &Tensor<'static, T>,
    kind: Pooling,
    kernel: usize,
    stride: usize,
    at: Option<&Tensor<'static, i64>>,
    input: [usize; 4],
) -> Result<Tensor<'static, T>> {
    let [_, _, h, w] = input;
    let [_, _, ho, wo] = nchw(kind.op(), g)?;
    let mut dx = Tensor::try_rent_zeroed_in(&g.rents_in, &input)?;
    if dx.is_empty() || g.is_empty() {
        return Ok(dx);
    }
    let scale = T::from_f64(1.0 / (kernel * kernel) as f64);
    let planes = dx
        .unique_slice_mut()
        .chunks_exact_mut(h * w)
        .zip(g.as_slice().chunks_exact(ho * wo));
    for (plane, (d, gp)) in planes.enumerate() {
        for (o, &gv) in gp.iter().enumerate() {
            match kind {
                Pooling::Max => {
                    let at = at.expect("a recorded max pooling keeps the positions");
                    let i = at.as_slice()[plane * ho * wo + o] as usize;
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
    Ok(dx)
}
