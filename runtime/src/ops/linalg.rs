//! Matrix products.
//!
//! Products of `f32` and `f64` run on the library's own packed kernels (`ops/gemm.rs`: FMA vector
//! code, both cores, no heap allocation after warm-up); `f16` and `bf16` on ndarray's generic
//! `general_mat_mul`. Either writes straight into the rented output.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, ShapeBuilder};

use crate::dims::Dims;

use super::gemm::{self, Matrix};
use super::reduce::reduce_to;
use super::{broadcast_shape, work, Operand};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::{DType, Element};
use crate::error::{panicking, Error, Result, Shape};
use crate::scope::State;
use crate::tensor::Tensor;

/// The matrix product.
#[derive(Debug, Clone, Copy)]
struct Matmul;

impl<T: Element> Op<T> for Matmul {
    /// Both operands.
    type Saved = (Saved<T>, Saved<T>);

    fn name(&self) -> &'static str {
        "matmul"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved>)> {
        let (a, b) = (cx.input(0), cx.input(1));
        let out = matmul_kernel(a, b, cx.scope())?;
        Ok((out, cx.saving().then(|| (cx.save(a), cx.save(b)))))
    }

    fn backward<'b>(
        &self,
        (a, b): Self::Saved,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (a, b) = (a.get(cx), b.get(cx));
        let (k, n) = (a.shape()[a.ndim() - 1], g.shape()[g.ndim() - 1]);
        // The transposes are views: the products read them where they lie.
        let da = cx
            .needs(0)
            .then(|| reduce_to(g.try_matmul(&b.try_t()?)?, a.shape()));
        let db = cx.needs(1).then(|| {
            if b.shape()[..b.ndim() - 2].iter().all(|&l| l == 1) {
                // One right matrix for every left one: the batch sums in one `[k, rows] x
                // [rows, n]` product.
                let rows = a.shape()[..a.ndim() - 1].iter().product();
                let (a, g) = (a.try_reshape(&[rows, k])?, g.try_reshape(&[rows, n])?);
                a.try_t()?.try_matmul(&g)?.try_reshape(b.shape())
            } else {
                reduce_to(a.try_t()?.try_matmul(&g)?, b.shape())
            }
        });
        Ok(Grads::from([da.transpose()?, db.transpose()?]))
    }

    fn reads_views(&self) -> bool {
        true
    }
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
        let other = other.bind_beside(self);
        autograd::run(
            Matmul,
            &mut args([Arg::Borrowed(self), Arg::Borrowed(&*other)]),
        )
    }

    panicking! {
        /// The matrix product.
        pub fn matmul(&self, other: &impl Operand<'s, T>) -> Tensor<'s, T> = try_matmul;
    }
}

/// `a b` with the batch axes broadcast, into a tensor of `scope`.
fn matmul_kernel<'s, T: Element>(
    this: &Tensor<'s, T>,
    other: &Tensor<'s, T>,
    scope: &State,
) -> Result<Tensor<'s, T>> {
    let mismatch = |reason: String| Error::ShapeMismatch {
        op: "matmul",
        lhs: Shape::from(this.shape()),
        rhs: Shape::from(other.shape()),
        reason,
    };
    let (a_batch, b_batch) = match (this.shape(), other.shape()) {
        ([a_batch @ .., _, _], [b_batch @ .., _, _]) => (a_batch, b_batch),
        _ => {
            return Err(mismatch(format!(
                "operands need rank 2 or more, got ranks {} and {}",
                this.ndim(),
                other.ndim()
            )))
        }
    };
    let [m, k] = this.shape()[a_batch.len()..] else {
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
    let mut out_shape = Dims::zeros(batch.len() + 2);
    out_shape.slice_mut()[..batch.len()].copy_from_slice(batch);
    out_shape.slice_mut()[batch.len()..].copy_from_slice(&[m, n]);
    let mut out = Tensor::try_rent_in(scope, out_shape.slice())?;
    if out.is_empty() {
        return Ok(out);
    }
    let count = |s: &[usize]| s.iter().product::<usize>();
    let c = out.unique_slice_mut();
    if count(b_batch) == 1 && count(a_batch) == count(batch) {
        if let Some(rows) = rows_of(this) {
            // One right matrix for every left one, whose rows lie evenly: `[.., m, k]` is one
            // `[rows, k]` matrix.
            work::visit(1);
            let a = Matrix {
                rows: rows * m,
                ..Batched::of(this, a_batch.len()).first
            };
            product(a, Batched::of(other, b_batch.len()).first, c, false);
            return Ok(out);
        }
    }
    // The matrix of each operand for output matrix `i`: its index along each batch axis, or 0
    // along an axis the operand broadcasts.
    work::visit(count(batch));
    // Runs of whole matrices over the threads (attention's many small products would each be
    // too small to split).
    let min_matrices = gemm::PER_PART.div_ceil((m * k * n).max(1));
    let (a, b) = (
        Batched::of(this, batch.len()),
        Batched::of(other, batch.len()),
    );
    super::split_mut(c, m * n, min_matrices, |start, c| {
        for (j, c) in c.chunks_exact_mut(m * n).enumerate() {
            let (mut ai, mut bi, mut rest) = (0, 0, start / (m * n) + j);
            for axis in (0..batch.len()).rev() {
                let pos = rest % batch[axis];
                rest /= batch[axis];
                ai += pos * a.steps[axis];
                bi += pos * b.steps[axis];
            }
            product(a.at(ai), b.at(bi), c, false);
        }
    });
    Ok(out)
}

/// An operand of a batched product, read where it lies (any steps: a transposed or permuted view
/// costs nothing): its first matrix over the rest of its buffer, and how far one position along
/// each axis of the broadcast batch shape moves in the buffer (0 where it broadcasts).
struct Batched<'a, T> {
    first: Matrix<'a, T>,
    steps: Dims,
}

impl<'a, T: DType> Batched<'a, T> {
    /// `x` (`[.., r, c]`) in a product whose batch shape has `axes` axes (aligned from the right).
    fn of(x: &'a Tensor<'_, T>, axes: usize) -> Self {
        let nd = x.ndim();
        let (data, offset) = x.buffer();
        let lead = axes - (nd - 2);
        let mut steps = Dims::zeros(axes);
        for axis in 0..nd - 2 {
            if x.shape()[axis] != 1 {
                steps[lead + axis] = x.step(axis);
            }
        }
        let first = Matrix {
            data: &data[offset..],
            rows: x.shape()[nd - 2],
            cols: x.shape()[nd - 1],
            rs: x.step(nd - 2),
            cs: x.step(nd - 1),
        };
        Batched { first, steps }
    }

    /// The matrix `at` elements past the first.
    fn at(&self, at: usize) -> Matrix<'a, T> {
        Matrix {
            // An operand of no element (`k` = 0) may step past its buffer: it reads nothing.
            data: self.first.data.get(at..).unwrap_or_default(),
            ..self.first
        }
    }
}

/// How many matrices `x` (`[.., r, c]`) holds if its rows lie one step apart across them, so
/// that all are one matrix of their rows (always, for a contiguous tensor); `None` otherwise.
fn rows_of<T: DType>(x: &Tensor<'_, T>) -> Option<usize> {
    let nd = x.ndim();
    let mut step = x.step(nd - 2) * x.shape()[nd - 2];
    let mut count = 1;
    for axis in (0..nd - 2).rev() {
        let len = x.shape()[axis];
        if len != 1 && x.step(axis) != step {
            return None;
        }
        step *= len;
        count *= len;
    }
    Some(count)
}

/// `c = a b` (or `c += a b` if `add`) for strided matrices `a: [m, k]`, `b: [k, n]` and a
/// row-major `[m, n]` output slice: the library's packed product for `f32` and `f64`, ndarray's
/// `general_mat_mul` for the others.
pub(super) fn product<T: Element>(a: Matrix<'_, T>, b: Matrix<'_, T>, c: &mut [T], add: bool) {
    if T::GEMM {
        return match add {
            true => gemm::product_add(a, b, c),
            false => gemm::product(a, b, c),
        };
    }
    let (m, n) = (a.rows, b.cols);
    let mut c = ArrayViewMut2::from_shape((m, n), &mut c[..m * n]).expect("an [m, n] output");
    let beta = if add { T::one() } else { T::zero() };
    general_mat_mul(T::one(), &ndarray_view(a), &ndarray_view(b), beta, &mut c);
}

/// `x` as an ndarray view, for the products of `f16` and `bf16`.
fn ndarray_view<T>(x: Matrix<'_, T>) -> ArrayView2<'_, T> {
    let last = match x.rows * x.cols {
        0 => 0,
        _ => (x.rows - 1) * x.rs + (x.cols - 1) * x.cs + 1,
    };
    ArrayView2::from_shape((x.rows, x.cols).strides((x.rs, x.cs)), &x.data[..last])
        .expect("matmul checked the operand sizes")
}
