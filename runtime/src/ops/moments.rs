//! The variance and the standard deviation along an axis: composed of recorded ops (a shift by
//! each lane's first element, a mean, a difference, a square, a sum and a division), so their
//! gradients are those ops' and a `#[checkpoint]` replays them as it does any op.

use super::elementwise::{scalar, ScalarKind};
use super::{check_axis, Dim};
use crate::autograd::Arg;
use crate::element::Element;
use crate::error::{panicking, Result};
use crate::tensor::Tensor;
use crate::TensorOps;

impl<'s, T: Element> Tensor<'s, T> {
    /// The variance along `axis`, keeping it with length 1: the sum of the squared deviations from
    /// the mean divided by `n - correction` (PyTorch's `var(dim, correction=.., keepdim=True)`;
    /// PyTorch's default `correction` is 1, the unbiased estimate, and 0 gives the biased one). A
    /// lane of at most `correction` elements gives NaN or infinity, as PyTorch (a division by 0).
    /// Fails with [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_var_keepdim(&self, axis: impl Dim, correction: usize) -> Result<Tensor<'s, T>> {
        let axis = check_axis("var", self, axis)?;
        let dof = self.shape()[axis].saturating_sub(correction);
        // Composed of recorded ops, so the gradient is theirs: `2 (x - mean) / (n - correction)`.
        // Each lane is first shifted by its first element, which changes no variance (nor, but
        // for rounding, any gradient: the first element's share through the shift sums to 0).
        // Values close to it subtract exactly, so the mean of the differences is not rounded to
        // the values' scale, as a mean of the values themselves is (the 1000 values 33333.3 gave
        // an unbiased variance of 1.2e-3, not 0).
        let first = self.try_narrow(axis, 0, self.shape()[axis].min(1))?;
        let shifted = self.try_sub(&first)?;
        let centered = shifted.try_sub(&shifted.try_mean_keepdim(axis)?)?;
        let squares = centered.try_pow(T::from_f64(2.0))?;
        let sums = squares.try_sum_keepdim(axis)?;
        scalar(Arg::Owned(sums), ScalarKind::Div, T::from_f64(dof as f64))
    }

    /// The variance along `axis`, with that axis removed; as [`Tensor::try_var_keepdim`]
    /// otherwise.
    pub fn try_var(&self, axis: impl Dim, correction: usize) -> Result<Tensor<'s, T>> {
        let axis = check_axis("var", self, axis)?;
        self.try_var_keepdim(axis, correction)?.try_squeeze(axis)
    }

    /// The standard deviation along `axis`, keeping it with length 1: the square root of
    /// [`Tensor::try_var_keepdim`], whose errors it has.
    pub fn try_std_keepdim(&self, axis: impl Dim, correction: usize) -> Result<Tensor<'s, T>> {
        let axis = check_axis("std", self, axis)?;
        self.try_var_keepdim(axis, correction)?.try_sqrt()
    }

    /// The standard deviation along `axis`, with that axis removed; as
    /// [`Tensor::try_std_keepdim`] otherwise.
    pub fn try_std(&self, axis: impl Dim, correction: usize) -> Result<Tensor<'s, T>> {
        let axis = check_axis("std", self, axis)?;
        self.try_std_keepdim(axis, correction)?.try_squeeze(axis)
    }

    panicking! {
        /// The variance along `axis` with `correction`, keeping it.
        pub fn var_keepdim(&self, axis: impl Dim, correction: usize) -> Tensor<'s, T> = try_var_keepdim;
        /// The variance along `axis` with `correction`.
        pub fn var(&self, axis: impl Dim, correction: usize) -> Tensor<'s, T> = try_var;
        /// The standard deviation along `axis` with `correction`, keeping it.
        pub fn std_keepdim(&self, axis: impl Dim, correction: usize) -> Tensor<'s, T> = try_std_keepdim;
        /// The standard deviation along `axis` with `correction`.
        pub fn std(&self, axis: impl Dim, correction: usize) -> Tensor<'s, T> = try_std;
    }
}
