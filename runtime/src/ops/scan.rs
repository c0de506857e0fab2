//! Scans: running totals along an axis (`cumsum`), whose backward is the same scan of the
//! gradient run from the other end.

use ndarray::Axis;

use super::{check_axis, work, Dim};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op};
use crate::element::{DType, Element};
use crate::error::{panicking, Result};
use crate::scope::State;
use crate::tensor::Tensor;

/// `cumsum` along an axis.
#[derive(Debug, Clone, Copy)]
struct Cumsum {
    axis: usize,
}

impl<T: Element> Op<T> for Cumsum {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        "cumsum"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let out = running_sums(cx.input(0), cx.scope(), self.axis, false)?;
        Ok((out, cx.saving().then_some(())))
    }

    /// Every position's gradient is the sum of the output's gradients from it to the end: the
    /// running sums of the gradient taken backwards.
    fn backward<'b>(&self, (): (), g: Tensor<'b, T>, cx: &Backward<'b>) -> Result<Grads<'b, T>> {
        Ok(Grads::from([Some(running_sums(
            &g,
            cx.at(),
            self.axis,
            true,
        )?)]))
    }
}

/// The running sums of `x` along `axis`, from the front (or from the back if `reverse`), in
/// `scope`. Summed in `f64`, as PyTorch's CPU kernel sums `f32` in `double`, so a long axis does
/// not drift.
fn running_sums<'s, T: Element>(
    x: &Tensor<'s, T>,
    scope: &State,
    axis: usize,
    reverse: bool,
) -> Result<Tensor<'s, T>> {
    let mut out = Tensor::try_rent_in(scope, x.shape())?;
    if out.is_empty() {
        return Ok(out);
    }
    work::visit(x.len() / x.shape()[axis]);
    let (src, mut dst) = (x.view(), out.unique_view_mut());
    for (mut o, x) in dst
        .lanes_mut(Axis(axis))
        .into_iter()
        .zip(src.lanes(Axis(axis)))
    {
        let mut total = 0.0;
        let mut add = |o: &mut T, &x: &T| {
            total += DType::to_f64(x);
            *o = T::from_f64(total);
        };
        if reverse {
            o.iter_mut()
                .rev()
                .zip(x.iter().rev())
                .for_each(|(o, x)| add(o, x));
        } else {
            o.iter_mut().zip(x).for_each(|(o, x)| add(o, x));
        }
    }
    Ok(out)
}

impl<'s, T: Element> Tensor<'s, T> {
    /// The running sums along `axis` (PyTorch's `cumsum`): position `i` holds the sum of positions
    /// `0..=i`. Fails with [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_cumsum(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("cumsum", self, axis)?;
        autograd::run(Cumsum { axis }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// The running sums along `axis`.
        pub fn cumsum(&self, axis: impl Dim) -> Tensor<'s, T> = try_cumsum;
    }
}
