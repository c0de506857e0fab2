//! Matrix products.
//!
//! Products of `f32` and `f64` run on the library's own packed kernels (`ops/gemm.rs`: FMA vector
//! code, both cores, no heap allocation after warm-up); `f16` and `bf16` on ndarray's generic
//! `general_mat_mul`. Either writes straight into the rented output.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, Dimension, IxDyn};

use super::gemm::{self, Matrix};
use super::{broadcast_shape, work, Operand};
use crate::autograd::{self, Recorder, Rule};
use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::deeper;
use crate::tensor::Tensor;
use crate::threads;

fn matrix<T>(rows: usize, cols: usize, data: &[T]) -> ArrayView2<'_, T> {
    ArrayView2::from_shape((rows, cols), data).expect("matmul checked the operand sizes")
}

impl<'s, T: Element> Tensor<'s, T> {
    /// The matrix product with a tensor or a [`Param`](crate::Param) (`x.matmul(&w)`), as PyTorch's
    /// `matmul` for operands of rank 2 or more: `[.., m, k] x [.., k, n] -> [.., m, n]`, the leading
    /// (batch) axes broadcast with NumPy's rule. So `[b, t, c] x [c, d]` applies one matrix to every
    /// row, `[b, h, t, d] x [b, h, d, t]` multiplies per batch and head, and `[b, 1, m, k] x
    /// [h, k, n]` gives `[b, h, m, n]`.
    ///
    /// Fails with [`Error::ShapeMismatch`] naming both shapes when an operand has rank below 2, the
    /// inner dimensions differ, or the batch axes do not broadcast.
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
        let (a_batch, b_batch) = match (self.shape(), other.shape()) {
            ([a_batch @ .., _, _], [b_batch @ .., _, _]) => (a_batch, b_batch),
            _ => {
                return Err(mismatch(format!(
                    "operands need rank 2 or more, got ranks {} and {}",
                    self.ndim(),
                    other.ndim()
                )))
            }
        };
        let [m, k] = self.shape()[a_batch.len()..] else {
            unreachable!("rank checked")
        };
        let [k2, n] = other.shape()[b_batch.len()..] else {
            unreachable!("rank checked")
        };
        if k != k2 {
            return Err(mismatch(format!("inner dimensions differ ({k} and {k2})")));
        }
        let batch = broadcast_shape("matmul", a_batch, b_batch).map_err(|_| {
            mismatch(format!(
                "batch axes {} and {} do not broadcast",
                Shape::from(a_batch),
                Shape::from(b_batch)
            ))
        })?;
        let batch = batch.slice();
        // Up to 4 axes held inline: no heap allocation.
        let mut out_shape = IxDyn::zeros(batch.len() + 2);
        out_shape.slice_mut()[..batch.len()].copy_from_slice(batch);
        out_shape.slice_mut()[batch.len()..].copy_from_slice(&[m, n]);
        let mut out =
            Tensor::try_rent_in(deeper(&self.rents_in, &other.rents_in), out_shape.slice())?;
        if out.is_empty() {
            return Ok(out);
        }
        let count = |s: &[usize]| s.iter().product::<usize>();
        let (a, b, c) = (self.as_slice(), other.as_slice(), out.unique_slice_mut());
        if count(b_batch) == 1 && count(a_batch) == count(batch) {
            // One right matrix for every left one: `[.., m, k]` is one `[rows, k]` matrix.
            work::visit(1);
            let rows = count(batch) * m;
            product(&a[..rows * k], b, c, rows, k, n);
            return Ok(out);
        }
        // The matrix of each operand for output matrix `i`: its index along each batch axis, or 0
        // along an axis the operand broadcasts.
        let (a_steps, b_steps) = (batch_steps(a_batch, batch), batch_steps(b_batch, batch));
        work::visit(count(batch));
        // Runs of whole matrices over the threads (attention's many small products would each be
        // too small to split).
        let min_matrices = gemm::PER_PART.div_ceil((m * k * n).max(1));
        threads::split_mut(c, m * n, min_matrices, |start, c| {
            for (j, c) in c.chunks_exact_mut(m * n).enumerate() {
                let (mut ai, mut bi, mut rest) = (0, 0, start / (m * n) + j);
                for axis in (0..batch.len()).rev() {
                    let pos = rest % batch[axis];
                    rest /= batch[axis];
                    ai += pos * a_steps[axis];
                    bi += pos * b_steps[axis];
                }
                let (am, bm) = (&a[ai * m * k..][..m * k], &b[bi * k * n..][..k * n]);
                product(am, bm, c, m, k, n);
            }
        });
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
}

/// `a b` of two matrices, either read as its transpose when asked (`ta`, `tb`): `[m, k] x [k, n]`
/// after the transposes. The backward of [`Tensor::try_matmul`] multiplies by transposes, which the
/// products of `f32` and `f64` read where they lie instead of copying them first.
pub(crate) fn matmul_transposed<'s, T: Element>(
    (a, ta): (&Tensor<'s, T>, bool),
    (b, tb): (&Tensor<'s, T>, bool),
) -> Result<Tensor<'s, T>> {
    let (&[ar, ac], &[br, bc]) = (a.shape(), b.shape()) else {
        unreachable!("the backward passes matrices")
    };
    if !T::GEMM {
        let t = |x: &Tensor<'s, T>, t: bool| if t { x.try_t() } else { Ok(x.clone()) };
        return t(a, ta)?.try_matmul(&t(b, tb)?);
    }
    let matrix = |data, rows, cols, t: bool| {
        let m = Matrix::row_major(data, rows, cols);
        if t {
            m.t()
        } else {
            m
        }
    };
    let scope = deeper(&a.rents_in, &b.rents_in);
    let (a, b) = (
        matrix(a.as_slice(), ar, ac, ta),
        matrix(b.as_slice(), br, bc, tb),
    );
    debug_assert_eq!(a.cols, b.rows, "the backward multiplies fitting matrices");
    let mut out = Tensor::try_rent_in(scope, &[a.rows, b.cols])?;
    gemm::product(a, b, out.unique_slice_mut());
    Ok(out)
}

/// For each axis of the broadcast batch shape `batch`, how many matrices of an operand with batch
/// axes `own` (aligned from the right) one step along it moves: 0 where the operand broadcasts.
fn batch_steps(own: &[usize], batch: &[usize]) -> IxDyn {
    let lead = batch.len() - own.len();
    let mut steps = IxDyn::zeros(batch.len());
    let mut stride = 1;
    for (j, &len) in own.iter().enumerate().rev() {
        steps[lead + j] = if len == 1 { 0 } else { stride };
        stride *= len;
    }
    steps
}

/// `c = a b` for an `[m, n]` output slice.
fn product<T: Element>(a: &[T], b: &[T], c: &mut [T], m: usize, k: usize, n: usize) {
    if T::GEMM {
        let (a, b) = (Matrix::row_major(a, m, k), Matrix::row_major(b, k, n));
        return gemm::product(a, b, c);
    }
    let (a, b) = (matrix(m, k, a), matrix(k, n, b));
    let mut c = ArrayViewMut2::from_shape((m, n), c).expect("matmul rented an [m, n] output");
    general_mat_mul(T::one(), &a, &b, T::zero(), &mut c);
}
