//! Matrix products.
//!
//! Products of `f32` and `f64` run on the library's own packed kernels (`ops/gemm.rs`: FMA vector
//! code, both cores, no heap allocation after warm-up); `f16` and `bf16` on ndarray's generic
//! `general_mat_mul`. Either writes straight into the rented output. Under
//! [`autocast`]`(Products::Bf16, ..)` the products of `f32` tensors round their operands to bf16
//! as they pack them and sum in `f32` (`gemm::bf16`).

use std::any::TypeId;
use std::cell::Cell;

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

/// How the matrix products of `f32` tensors compute: set for a closure by [`autocast`], and kept
/// by each product for its backward (and a checkpoint's replay). Tensors of other element types
/// always multiply in their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Products {
    /// In `f32`: the operands as they are, sums in `f32`.
    #[default]
    F32,
    /// Mixed precision, as PyTorch's `torch.autocast(dtype=torch.bfloat16)` runs products: each
    /// operand rounded to bf16 (to nearest, ties to even) as it is packed, the products summed in
    /// `f32`, the result `f32`. The tensors, the parameters and every other op stay `f32` (`f32`
    /// master weights). On a CPU with AVX512-BF16 the tiles use its dot-product instruction
    /// (`vdpbf16ps`, twice the multiply-adds of an `f32` FMA); elsewhere the rounded operands go
    /// through the `f32` kernel, with the same values up to the order of the sums.
    Bf16,
}

thread_local! {
    /// The products of `f32` tensors that ops recorded on this thread make.
    static PRODUCTS: Cell<Products> = const { Cell::new(Products::F32) };
}

/// Runs `f` with the matrix products (`matmul`, and the products of its backward) of `f32`
/// tensors computing as `products` says, restoring the previous setting afterwards, also when `f`
/// panics. A product keeps the setting it was made under: its backward, and its replay under
/// `#[checkpoint]`, compute the same way wherever they run.
///
/// ```
/// use tensorscope::ops::{autocast, Products};
/// use tensorscope::Pool;
///
/// let pool = Pool::with_max_memory_mb(16);
/// pool.scope(|s| {
///     let x = s.from_slice::<f32>(&[1, 2], &[1.0, 1.0 / 3.0]);
///     let w = s.from_slice::<f32>(&[2, 1], &[1.0, 1.0]);
///     let exact = x.matmul(&w).item();
///     let mixed = autocast(Products::Bf16, || x.matmul(&w).item());
///     // 1/3 rounded to bf16's 8 significant bits: 0.333984375.
///     assert_eq!((exact, mixed), (1.0 + 1.0 / 3.0, 1.333984375));
/// });
/// ```
pub fn autocast<R>(products: Products, f: impl FnOnce() -> R) -> R {
    autograd::with_local(&PRODUCTS, products, f)
}

/// The matrix product, computing as `products` says.
#[derive(Debug, Clone, Copy)]
struct Matmul {
    products: Products,
}

impl<T: Element> Op<T> for Matmul {
    /// Both operands.
    type Saved<'s> = (Saved<'s, T>, Saved<'s, T>);

    fn name(&self) -> &'static str {
        "matmul"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (a, b) = (cx.input(0), cx.input(1));
        let out = matmul_kernel(a, b, cx.scope(), self.products)?;
        Ok((out, cx.saving().then(|| (cx.save(a), cx.save(b)))))
    }

    fn backward<'b>(
        &self,
        (a, b): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (a, b) = (a.get(cx), b.get(cx));
        // The gradient's products compute as the forward's did.
        autocast(self.products, || self.gradients(a, b, g, cx))
    }

    fn reads_views(&self) -> bool {
        true
    }
}

impl Matmul {
    /// The gradients of `a b` from `g`, for the inputs the backward needs.
    fn gradients<'b, T: Element>(
        &self,
        a: Tensor<'b, T>,
        b: Tensor<'b, T>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
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
        let products = PRODUCTS.get();
        autograd::run(
            Matmul { products },
            &mut args([Arg::Borrowed(self), Arg::Borrowed(&*other)]),
        )
    }

    panicking! {
        /// The matrix product.
        pub fn matmul(&self, other: &impl Operand<'s, T>) -> Tensor<'s, T> = try_matmul;
    }
}

/// `a b` with the batch axes broadcast, into a tensor of `scope`, computing as `products` says.
fn matmul_kernel<'s, T: Element>(
    this: &Tensor<'s, T>,
    other: &Tensor<'s, T>,
    scope: &State,
    products: Products,
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
            let b = Batched::of(other, b_batch.len()).first;
            product(products, a, b, c, false);
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
            product(products, a.at(ai), b.at(bi), c, false);
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
/// row-major `[m, n]` output slice: the library's packed product for `f32` and `f64` (for `f32`
/// in bf16 if `products` says so), ndarray's `general_mat_mul` for the others.
pub(super) fn product<T: Element>(
    products: Products,
    a: Matrix<'_, T>,
    b: Matrix<'_, T>,
    c: &mut [T],
    add: bool,
) {
    if products == Products::Bf16 && TypeId::of::<T>() == TypeId::of::<f32>() {
        // `T` is `f32`: the casts change no type, only the name of it.
        let (a, b) = (f32s(a), f32s(b));
        let c = bytemuck::cast_slice_mut::<T, f32>(c);
        return gemm::bf16::product_bf16(a, b, c, add);
    }
    product_band(a, b, c, (b.cols, 0), add)
}

/// `c[.., first..first + n] = a b` (or `+=` if `add`) for strided `a: [m, k]`, `b: [k, n]` and a
/// row-major output slice of `width` columns: the library's packed product for `f32` and `f64`,
/// ndarray's `general_mat_mul` for the others (no bf16 rounding: the convolutions' products).
pub(super) fn product_band<T: Element>(
    a: Matrix<'_, T>,
    b: Matrix<'_, T>,
    c: &mut [T],
    (width, first): (usize, usize),
    add: bool,
) {
    if T::GEMM {
        return gemm::product_band(a, b, c, (width, first), add);
    }
    let (m, n) = (a.rows, b.cols);
    let shape = (m, n).strides((width, 1));
    let mut c = ArrayViewMut2::from_shape(shape, &mut c[first..]).expect("an [m, n] band");
    let beta = if add { T::one() } else { T::zero() };
    general_mat_mul(T::one(), &ndarray_view(a), &ndarray_view(b), beta, &mut c);
}

/// `x` with its elements as `f32`s: the same matrix when `T` is `f32`.
fn f32s<T: Element>(x: Matrix<'_, T>) -> Matrix<'_, f32> {
    Matrix {
        data: bytemuck::cast_slice::<T, f32>(x.data),
        rows: x.rows,
        cols: x.cols,
        rs: x.rs,
        cs: x.cs,
    }
}

/// `x` as an ndarray view, for the products of `f16` and `bf16`.
fn ndarray_view<T>(x: Matrix<'_, T>) -> ArrayView2<'_, T> {
    if x.rows * x.cols == 0 {
        // ndarray refuses steps that reach past the slice even for a matrix of no element (an
        // operand of a product with `k` = 0, whose output is zeros): it reads nothing.
        return ArrayView2::from_shape((x.rows, x.cols), &[]).expect("an empty matrix");
    }
    let last = (x.rows - 1) * x.rs + (x.cols - 1) * x.cs + 1;
    ArrayView2::from_shape((x.rows, x.cols).strides((x.rs, x.cs)), &x.data[..last])
        .expect("matmul checked the operand sizes")
}
