//! Matrix products and transposition.
//!
//! Products run on ndarray's `general_mat_mul` (the `matrixmultiply` kernels for `f32` and `f64`, a
//! generic loop for `f16`/`bf16`), writing straight into the rented output.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use super::{work, Operand};
use crate::autograd::{self, Recorder, Rule};
use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::deeper;
use crate::tensor::Tensor;

fn matrix<T>(rows: usize, cols: usize, data: &[T]) -> ArrayView2<'_, T> {
    ArrayView2::from_shape((rows, cols), data).expect("matmul checked the operand sizes")
}

impl<'s, T: Element> Tensor<'s, T> {
    /// The matrix product with a tensor or a [`Param`](crate::Param) (`x.matmul(&w)`). Accepted shapes:
    /// - `[m, k] x [k, n] -> [m, n]`;
    /// - `[b, m, k] x [k, n] -> [b, m, n]` (one matrix applied to every batch entry);
    /// - `[b, m, k] x [b, k, n] -> [b, m, n]` (batched).
    ///
    /// Fails with [`Error::ShapeMismatch`] naming both shapes when the inner dimensions or the batch
    /// sizes differ or the ranks are not one of the above.
    pub fn try_matmul(&self, other: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
        let other = &*other.bind_beside(self);
        let recorder = Recorder::of(&[self, other]);
        let out = self.matmul_kernel(other)?;
        Ok(autograd::finish(recorder, out, |_| {
            Rule::Matmul(self.saved(), other.saved())
        }))
    }

    fn matmul_kernel(&self, other: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: "matmul",
            lhs: Shape::from(self.shape()),
            rhs: Shape::from(other.shape()),
            reason,
        };
        let (batch, m, k, batched_rhs) = match *self.shape() {
            [m, k] => (1, m, k, false),
            [b, m, k] => (b, m, k, other.ndim() == 3),
            _ => {
                return Err(mismatch(format!(
                    "the left operand has rank {}; expected 2 or 3",
                    self.ndim()
                )))
            }
        };
        let (k2, n) = match (other.shape(), batched_rhs) {
            (&[k2, n], false) => (k2, n),
            (&[b2, k2, n], true) if b2 == batch => (k2, n),
            (&[b2, _, _], true) => {
                return Err(mismatch(format!("batch sizes differ ({batch} and {b2})")))
            }
            _ => {
                return Err(mismatch(format!(
                    "a rank-{} left operand needs a rank-2{} right operand, got rank {}",
                    self.ndim(),
                    if self.ndim() == 3 { " or rank-3" } else { "" },
                    other.ndim()
                )))
            }
        };
        if k != k2 {
            return Err(mismatch(format!("inner dimensions differ ({k} and {k2})")));
        }
        let out_shape: Vec<usize> = match self.ndim() {
            2 => vec![m, n],
            _ => vec![batch, m, n],
        };
        let mut out = Tensor::try_rent_in(deeper(&self.scope, &other.scope), &out_shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let (a, b, c) = (self.as_slice(), other.as_slice(), out.unique_slice_mut());
        if batched_rhs {
            work::visit(batch);
            for i in 0..batch {
                let (ai, bi) = (&a[i * m * k..][..m * k], &b[i * k * n..][..k * n]);
                let ci = &mut c[i * m * n..][..m * n];
                product(matrix(m, k, ai), matrix(k, n, bi), ci, m, n);
            }
        } else {
            // `[b, m, k]` is one `[b * m, k]` matrix in row-major order.
            work::visit(1);
            product(matrix(batch * m, k, a), matrix(k, n, b), c, batch * m, n);
        }
        Ok(out)
    }

    /// The matrix product; see [`Tensor::try_matmul`].
    ///
    /// # Panics
    /// If the shapes do not fit or the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn matmul(&self, other: &impl Operand<'s, T>) -> Tensor<'s, T> {
        or_panic(self.try_matmul(other))
    }

    /// A copy with the last two axes swapped (`[.., m, n] -> [.., n, m]`). Fails with
    /// [`Error::InvalidShape`] for tensors of rank below 2.
    pub fn try_transpose(&self) -> Result<Tensor<'s, T>> {
        let nd = self.ndim();
        if nd < 2 {
            return Err(Error::InvalidShape {
                op: "transpose",
                shape: Shape::from(self.shape()),
                reason: "needs at least two axes".into(),
            });
        }
        let mut view = self.view();
        view.swap_axes(nd - 2, nd - 1);
        let mut out = Tensor::try_rent_in(&self.scope, view.shape())?;
        if !out.is_empty() {
            work::visit(1);
            out.unique_view_mut().assign(&view);
        }
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Transpose
        }))
    }

    /// A copy with the last two axes swapped; see [`Tensor::try_transpose`].
    ///
    /// # Panics
    /// For a rank below 2 or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn transpose(&self) -> Tensor<'s, T> {
        or_panic(self.try_transpose())
    }
}

/// `c = a b` for an `[m, n]` output slice.
fn product<T: Element>(
    a: ArrayView2<'_, T>,
    b: ArrayView2<'_, T>,
    c: &mut [T],
    m: usize,
    n: usize,
) {
    let mut c = ArrayViewMut2::from_shape((m, n), c).expect("matmul rented an [m, n] output");
    general_mat_mul(T::one(), &a, &b, T::zero(), &mut c);
}
