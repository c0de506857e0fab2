//! Matrix products.
//!
//! Products of `f32` and `f64` run on the library's own packed kernels (`ops/gemm.rs`: FMA vector
//! code, both cores, no heap allocation after warm-up); `f16` and `bf16` on ndarray's generic
//! `general_mat_mul`. Either writes straight into the rented output.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2, Dimension, IxDyn, ShapeBuilder};

use super::gemm::{self, Matrix};
use super::reduce::reduce_to;
use super::{broadcast_shape, work, Operand};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::Element;
use crate::error::{panicking, Error, Result, Shape};
use crate::scope::{deeper, State};
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
        // One right matrix for every left one: the rows of every left matrix are the rows of one
        // `[rows, k]` matrix, and the products read the transposes where they lie.
        let one_matrix = b.shape()[..b.ndim() - 2].iter().all(|&l| l == 1);
        let rows = a.shape()[..a.ndim() - 1].iter().product();
        let matrix = |t: &Tensor<'b, T>, cols| t.try_reshape(&[rows, cols]);
        let da = cx.needs(0).then(|| {
            if one_matrix {
                let b2 = b.try_reshape(&[k, n])?;
                matmul_transposed((&matrix(&g, n)?, false), (&b2, true))?.try_reshape(a.shape())
            } else {
                reduce_to(g.try_matmul(&b.try_t()?)?, a.shape())
            }
        });
        let db = cx.needs(1).then(|| {
            if one_matrix {
                // The batch sums in the one product.
                matmul_transposed((&matrix(&a, k)?, true), (&matrix(&g, n)?, false))?
                    .try_reshape(b.shape())
            } else {
                reduce_to(a.try_t()?.try_matmul(&g)?, b.shape())
            }
        });
        Ok(Grads::from([da.transpose()?, db.transpose()?]))
    }
}

/// `m` as an ndarray view, its strides kept.
fn matrix<T>(m: Matrix<'_, T>) -> ArrayView2<'_, T> {
    let shape = (m.rows, m.cols).strides((m.rs, m.cs));
    ArrayView2::from_shape(shape, m.data).expect("the caller checked the operand sizes")
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
    let mut out_shape = IxDyn::zeros(batch.len() + 2);
    out_shape.slice_mut()[..batch.len()].copy_from_slice(batch);
    out_shape.slice_mut()[batch.len()..].copy_from_slice(&[m, n]);
    let mut out = Tensor::try_rent_in(scope, out_shape.slice())?;
    if out.is_empty() {
        return Ok(out);
    }
    let count = |s: &[usize]| s.iter().product::<usize>();
    let (a, b, c) = (this.as_slice(), other.as_slice(), out.unique_slice_mut());
    if count(b_batch) == 1 && count(a_batch) == count(batch) {
        // One right matrix for every left one: `[.., m, k]` is one `[rows, k]` matrix.
        work::visit(1);
        let rows = count(batch) * m;
        let (a, b) = (Matrix::row_major(a, rows, k), Matrix::row_major(b, k, n));
        product(a, b, c, false);
        return Ok(out);
    }
    // The matrix of each operand for output matrix `i`: its index along each batch axis, or 0
    // along an axis the operand broadcasts.
    let (a_steps, b_steps) = (batch_steps(a_batch, batch), batch_steps(b_batch, batch));
    work::visit(count(batch));
    // Runs of whole matrices over the threads (attention's many small products would each be
    // too small to split).
    let min_matrices = gemm::PER_PART.div_ceil((m * k * n).max(1));
    super::split_mut(c, m * n, min_matrices, |start, c| {
        for (j, c) in c.chunks_exact_mut(m * n).enumerate() {
            let (mut ai, mut bi, mut rest) = (0, 0, start / (m * n) + j);
            for axis in (0..batch.len()).rev() {
                let pos = rest % batch[axis];
                rest /= batch[axis];
                ai += pos * a_steps[axis];
                bi += pos * b_steps[axis];
            }
            let (am, bm) = (&a[ai * m * k..][..m * k], &b[bi * k * n..][..k * n]);
            product(
                Matrix::row_major(am, m, k),
                Matrix::row_major(bm, k, n),
                c,
                false,
            );
        }
    });
    Ok(out)
}

/// `a b` of two matrices, either read as its transpose when asked (`ta`, `tb`): `[m, k] x [k, n]`
/// after the transposes. The backward of [`Tensor::try_matmul`] multiplies by transposes, which the
/// products of `f32` and `f64` read where they lie instead of copying them first.
fn matmul_transposed<'s, T: Element>(
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
    general_mat_mul(T::one(), &matrix(a), &matrix(b), beta, &mut c);
}
