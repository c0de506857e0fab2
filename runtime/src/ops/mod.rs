//! Tensor operations, as methods of [`Tensor`] and of [`TensorOps`].
//!
//! Every op is a method, so all of them are listed on [`Tensor`]'s page (those that can write in
//! place on [`TensorOps`]'s); this page sorts them by family. Each checks shapes first and reports
//! a mismatch as an [`Error`] naming the op and both shapes: the `try_` form returns it
//! ([`Tensor::try_matmul`]), the plain form and the operators panic with its message. A second
//! operand may be a tensor or a [`Param`] ([`Operand`]); the output is rented from the pool in the
//! deeper of the operands' scopes. An axis argument may be negative, counting from the back
//! ([`Dim`]).
//!
//! - **Arithmetic**: `+ - * /` with NumPy broadcasting, for every mix of `Tensor` and `&Tensor`,
//!   with a `&Param` on the right (`&h + &bias`) and with an element scalar on the right
//!   (`&x * 2.0`; `f32` and `f64` scalars also on the left, `2.0 * &x`); negation;
//!   [`Tensor::try_add`], [`try_sub`](Tensor::try_sub), [`try_mul`](Tensor::try_mul),
//!   [`try_div`](Tensor::try_div); [`Tensor::maximum`], [`Tensor::minimum`] and
//!   [`Tensor::pow_tensor`] with broadcasting; [`Tensor::zip_map`] for a function of your own. A
//!   by-value operand that is unique and already has the output's shape receives the result in
//!   place (a parameter never does).
//! - **Integer arithmetic** on `i64` and `i32` tensors: `+ - *` with broadcasting and with a
//!   scalar, wrapping as PyTorch's, and floor division ([`Tensor::div_floor`],
//!   [`Tensor::div_floor_scalar`]); no gradient.
//! - **In place when they can** ([`TensorOps`], for `Tensor` and `&Tensor`): the activations
//!   [`relu`](TensorOps::relu), [`gelu`](TensorOps::gelu), [`gelu_erf`](TensorOps::gelu_erf),
//!   [`silu`](TensorOps::silu), [`sigmoid`](TensorOps::sigmoid) and [`tanh`](TensorOps::tanh);
//!   [`exp`](TensorOps::exp), [`log`](TensorOps::log), [`erf`](TensorOps::erf),
//!   [`sqrt`](TensorOps::sqrt), [`abs`](TensorOps::abs), [`sin`](TensorOps::sin),
//!   [`cos`](TensorOps::cos), [`pow`](TensorOps::pow), [`clamp`](TensorOps::clamp),
//!   [`map`](TensorOps::map); along an axis
//!   [`softmax`](TensorOps::softmax) and [`log_softmax`](TensorOps::log_softmax); over the last
//!   axis [`layer_norm`](TensorOps::layer_norm) and [`rms_norm`](TensorOps::rms_norm). On an owned
//!   tensor that is the only handle on its buffer they overwrite it; on a `&Tensor` they rent.
//! - **Products**: [`Tensor::matmul`], ranks 2 and up, the leading axes broadcast. `f32` and `f64`
//!   run on the library's own packed, vectorised and threaded kernels (no heap allocation after
//!   warm-up), `f16` and `bf16` on ndarray's `general_mat_mul`.
//! - **Reductions**: [`Tensor::sum`] and [`Tensor::mean`] along an axis, with the axis kept
//!   ([`sum_keepdim`](Tensor::sum_keepdim), [`mean_keepdim`](Tensor::mean_keepdim)) or of
//!   everything ([`sum_all`](Tensor::sum_all), [`mean_all`](Tensor::mean_all));
//!   [`Tensor::logsumexp`], [`Tensor::var`], [`Tensor::std`], [`Tensor::max`] and
//!   [`Tensor::min`] (and their `_keepdim` forms), [`Tensor::argmax`] and [`Tensor::argmin`] along
//!   an axis.
//! - **Scans**: [`Tensor::cumsum`] along an axis.
//! - **Sorting** along an axis: [`Tensor::sort`], [`Tensor::argsort`], [`Tensor::topk`] (NaN the
//!   largest, ties in their original order).
//! - **Shape**: [`Tensor::concat`], [`Tensor::stack`], [`Tensor::narrow`], [`Tensor::split`],
//!   [`Tensor::chunk`], [`Tensor::permute`], [`Tensor::transpose`], [`Tensor::t`],
//!   [`Tensor::repeat`] and [`Tensor::expand`] copy into the pool; [`Tensor::reshape`],
//!   [`Tensor::squeeze`], [`Tensor::unsqueeze`] and [`Tensor::flatten`] are zero-copy aliases.
//! - **Padding** of the last axes, in PyTorch's `F.pad` order: [`Tensor::pad`] with a value,
//!   [`Tensor::pad_reflect`] with the mirrored values.
//! - **Attention**: [`Tensor::scaled_dot_product_attention`] (causal or not, a scale of one's
//!   own: [`AttentionOptions`]), fused as FlashAttention-2: no `[.., tq, tk]` matrix is made or
//!   kept for the backward.
//! - **Rotary position embeddings**: [`Scope::rope_tables`](crate::Scope::rope_tables) and
//!   [`Tensor::rope`], as Hugging Face's Llama.
//! - **Indexing** by `i64` ids: [`Tensor::embedding`], [`Tensor::index_select`],
//!   [`Tensor::gather`]; [`Tensor::one_hot`]. Every id is checked before anything is rented: one
//!   past the table is an [`Error::IndexOutOfRange`] naming it.
//! - **Accumulation** at `i64` positions: [`Tensor::index_add`], [`Tensor::scatter_add`] (the
//!   transposes of `index_select` and `gather`).
//! - **Masks** ([`mask`]): [`Tensor::eq`], [`ne`](Tensor::ne), [`lt`](Tensor::lt),
//!   [`le`](Tensor::le), [`gt`](Tensor::gt), [`ge`](Tensor::ge), and [`Tensor::cmp`] with a
//!   [`Cmp`] or [`Tensor::cmp_scalar`], give `u8` masks; [`Tensor::where_cond`],
//!   [`Tensor::masked_fill`], [`Tensor::tril`], [`Tensor::triu`].
//! - **Images**, `[n, c, h, w]`: [`Tensor::conv2d`] and [`Tensor::conv2d_with`] (dilation,
//!   groups: [`ConvOptions`]), [`Tensor::group_norm`], [`Tensor::upsample_nearest2d`],
//!   [`Tensor::max_pool2d`], [`Tensor::avg_pool2d`]; sequences, `[n, c, l]`: [`Tensor::conv1d`].
//! - **Dropout**: [`Tensor::dropout`], its mask replayed bit for bit under `#[checkpoint]`.
//! - **Sampling** for generation, seeded by a [`Generator`](crate::Generator):
//!   [`Tensor::multinomial`], [`Tensor::sample_logits`] (temperature, top-k, top-p).
//! - **Losses**: [`Tensor::mse`], [`Tensor::cross_entropy`] (labels as `&[usize]`) and
//!   [`Tensor::cross_entropy_ids`] (labels as an `i64` tensor).
//! - **Element types and kernels of your own**: [`Tensor::cast`]; [`TensorOps::map`],
//!   [`TensorOps::map_lanes`], [`Tensor::zip_map`] and
//!   [`Scope::rent_with`](crate::Scope::rent_with).
//!
//! ```
//! use tensorscope::Pool;
//! let pool = Pool::with_max_memory_mb(16);
//! pool.scope(|s| {
//!     let x = s.from_slice::<f32>(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
//!     let b = s.from_slice::<f32>(&[3], &[10., 20., 30.]);
//!     let y = &x + &b;                    // broadcast over the rows
//!     assert_eq!(y.to_vec(), vec![11., 22., 33., 14., 25., 36.]);
//!     let err = x.try_add(&s.zeros::<f32>(&[2])).unwrap_err();
//!     assert!(err.to_string().starts_with("add: incompatible shapes [2, 3] and [2]"));
//! });
//! ```

// The families are private: their ops are methods of `Tensor` and render on its page, so their
// own pages would be empty. `mask` is public for `Cmp`.
pub(crate) mod attention;
mod conv;
mod dropout;
mod elementwise;
mod gemm;
mod index;
mod integer;
mod lanes;
mod linalg;
mod loss;
pub mod mask;
mod moments;
mod pad;
mod pointwise;
mod pool2d;
mod reduce;
mod rope;
pub(crate) mod sample;
mod scan;
mod scatter;
mod shape;
pub(crate) mod simd;
mod sort;
mod tensor_ops;

pub use attention::AttentionOptions;
pub use conv::ConvOptions;
pub(crate) use dropout::check_probability;
pub use linalg::{autocast, Products};
pub use mask::Cmp;
pub use tensor_ops::TensorOps;
pub(crate) use tensor_ops::Unary;

use std::cell::RefCell;
use std::thread::LocalKey;

use crate::dims::Dims;

use crate::element::{DType, Element};
use crate::error::{Error, Result, Shape};
use crate::param::Param;
use crate::tensor::Tensor;
use crate::threads;

/// Kernel visits, counted in debug builds: the lanes, slices, matrices and images that kernels loop
/// over, counted before each loop starts. Every op returns before its loops when its output has no
/// elements, and loops only over non-empty inputs, so its visits never exceed the elements it reads
/// and writes; tests check that bound, which is what keeps an op on `[0, 2^60]` from looping over
/// 2^60 empty lanes. A test can also set a limit, past which the count panics at once instead of
/// letting a regression loop for hours.
pub(crate) mod work {
    #[cfg(debug_assertions)]
    thread_local! {
        static VISITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
        static LIMIT: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
    }

    /// Counts `n` visits about to be made (debug builds only); panics past the limit.
    #[inline]
    pub(crate) fn visit(n: usize) {
        #[cfg(debug_assertions)]
        {
            let total = VISITS.get().saturating_add(n as u64);
            VISITS.set(total);
            let limit = LIMIT.get();
            assert!(
                total <= limit,
                "kernel visits passed the limit a test set ({total} > {limit})"
            );
        }
        #[cfg(not(debug_assertions))]
        let _ = n;
    }

    /// Visits counted on this thread so far; always 0 in release builds.
    pub(crate) fn visits() -> u64 {
        #[cfg(debug_assertions)]
        return VISITS.get();
        #[cfg(not(debug_assertions))]
        0
    }

    /// Allows at most `more` visits from now on this thread (`None`: no limit). Debug builds only.
    pub(crate) fn limit(more: Option<u64>) {
        #[cfg(debug_assertions)]
        LIMIT.set(more.map_or(u64::MAX, |m| VISITS.get().saturating_add(m)));
        #[cfg(not(debug_assertions))]
        let _ = more;
    }
}

/// [`Error::DimensionOverflow`]: `operand = value` makes `op`'s output on `input` too large.
pub(crate) fn dimension_overflow(
    op: &'static str,
    operand: &'static str,
    value: usize,
    input: &[usize],
) -> Error {
    Error::DimensionOverflow {
        op,
        operand,
        value,
        shape: Shape::from(input),
    }
}

/// Checks that ndarray can address an output of `shape` (see `pool::element_count`), else fails
/// with `overflow()`, which names the operand to blame.
pub(crate) fn check_addressable<T: DType>(
    shape: &[usize],
    overflow: impl FnOnce() -> Error,
) -> Result<()> {
    crate::pool::element_count::<T>(shape)
        .map(|_| ())
        .map_err(|_| overflow())
}

/// The product of all axes but the last: the rows an ndarray `Zip` walks.
pub(crate) fn rows(shape: &[usize]) -> usize {
    shape
        .split_last()
        .map_or(1, |(_, rest)| rest.iter().product())
}

/// The second operand of an op: a tensor of this scope or an enclosing one, or a [`Param`], which the
/// op reads where it lies (no copy). The output rents in the scoped operand's scope.
///
/// ```
/// use tensorscope::{Param, Pool};
/// let pool = Pool::with_max_memory_mb(16);
/// let b = Param::from_slice(&pool, &[2], &[10.0f32, 20.0]);
/// pool.scope(|s| {
///     let x = s.ones::<f32>(&[2, 2]);
///     assert_eq!((&x + &b).to_vec(), vec![11.0, 21.0, 11.0, 21.0]);
///     assert_eq!(x.try_add(&x).unwrap().to_vec(), vec![2.0; 4]);
/// });
/// ```
pub trait Operand<'s, T: Element>: sealed::Bind<'s, T> {}

impl<'s, 't: 's, T: Element> Operand<'s, T> for Tensor<'t, T> {}
impl<'s, T: Element> Operand<'s, T> for Param<T> {}

pub(crate) mod sealed {
    use std::borrow::Cow;

    use crate::{Element, Param, Tensor};

    /// How an [`Operand`](super::Operand) takes part in an op. Sealed: only tensors and parameters.
    pub trait Bind<'s, T: Element> {
        /// The operand as a tensor: a tensor as it is, a parameter bound into `beside`'s scope.
        fn bind_beside(&self, beside: &Tensor<'s, T>) -> Cow<'_, Tensor<'s, T>>;
    }

    impl<'s, 't: 's, T: Element> Bind<'s, T> for Tensor<'t, T> {
        fn bind_beside(&self, _: &Tensor<'s, T>) -> Cow<'_, Tensor<'s, T>> {
            Cow::Borrowed(self)
        }
    }

    impl<'s, T: Element> Bind<'s, T> for Param<T> {
        fn bind_beside(&self, beside: &Tensor<'s, T>) -> Cow<'_, Tensor<'s, T>> {
            Cow::Owned(beside.bind(self))
        }
    }
}

/// [`threads::split_mut`] for the ops: the workers start with the products' packing buffers.
pub(crate) fn split_mut<T: Send>(
    data: &mut [T],
    granule: usize,
    min_granules: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    threads::on_worker_start(gemm::reserve_scratch);
    threads::split_mut(data, granule, min_granules, f)
}

/// [`threads::for_each_part`] for the ops: the workers start with the products' packing buffers.
pub(crate) fn for_each_part<P: Send, I: Iterator<Item = P>>(
    granules: usize,
    min_granules: usize,
    split: impl FnOnce(usize) -> I,
    f: impl Fn(P) + Sync,
) {
    threads::on_worker_start(gemm::reserve_scratch);
    threads::for_each_part(granules, min_granules, split, f)
}

/// `f` with `len` elements of this thread's scratch buffer, which only grows: a kernel's
/// temporaries (a lane copied out of a strided tensor, attention's tiles of scores) allocate
/// nothing once a thread has run the largest of them. See [`with_buffer`].
pub(crate) fn with_scratch<T: bytemuck::Pod, R>(len: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    thread_local! {
        // `u64`s: aligned for every element type.
        static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    }
    with_buffer(&SCRATCH, (len, 0), f)
}

/// `f` with `len` `T`s of this thread's buffer `key` (of `W`s, aligned for `T`), which only
/// grows: to at least `reserve` bytes on first use, and to what a call needs, so that a
/// steady-state call allocates nothing (the products' packing buffers are made at their full
/// size, so that no later product allocates whichever thread takes which part). A temporary
/// buffer if `key`'s is in use (a kernel called from inside another's).
pub(crate) fn with_buffer<W: bytemuck::Pod, T: bytemuck::Pod, R>(
    key: &'static LocalKey<RefCell<Vec<W>>>,
    (len, reserve): (usize, usize),
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let units = (len * size_of::<T>()).div_ceil(size_of::<W>());
    let want = units.max(reserve.div_ceil(size_of::<W>()));
    key.with(|cell| {
        let mut temporary = Vec::new();
        let mut kept = cell.try_borrow_mut();
        let buffer = match kept.as_deref_mut() {
            Ok(kept) => kept,
            Err(_) => &mut temporary,
        };
        if buffer.len() < want {
            buffer.resize(want, W::zeroed());
        }
        f(&mut bytemuck::cast_slice_mut(&mut buffer[..units])[..len])
    })
}

/// The NumPy broadcast of two shapes: axes aligned from the right, each pair equal or one of them 1.
pub(crate) fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| (i + s.len()).checked_sub(n).map_or(1, |j| s[j]);
    let mut shape = Dims::zeros(n);
    for i in 0..n {
        shape[i] = match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => x,
            (1, y) => y,
            (x, y) => {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: Shape::from(a),
                    rhs: Shape::from(b),
                    reason: format!(
                        "cannot broadcast: axis {i} of the result has lengths {x} and {y}, neither \
                         is 1"
                    ),
                })
            }
        };
    }
    Ok(shape)
}

/// Whether `x` replaces `best` as the extreme so far (the max if `max`, else the min), as PyTorch's
/// reductions and pooling choose: a NaN wins and stays (nothing beats it), and among equal values the
/// first is kept.
pub(crate) fn beats<T: PartialOrd>(x: T, best: T, max: bool) -> bool {
    let is_nan = |v: &T| v.partial_cmp(v).is_none();
    !is_nan(&best) && (is_nan(&x) || if max { x > best } else { x < best })
}

/// An axis argument: an index from the front (`0`, `1`, ...) or, negative, from the back (`-1` is
/// the last axis), as in PyTorch. Implemented for `usize`, `isize`, `i32` and `i64`, so both
/// `x.sum(1)` and `x.softmax(-1)` read as they do in Python.
pub trait Dim: Copy {
    /// The axis as a signed index.
    fn index(self) -> isize;
}

macro_rules! dim {
    ($($t:ty),*) => {$(
        impl Dim for $t {
            #[inline]
            fn index(self) -> isize {
                // Any real axis fits; an absurd one saturates and is then out of range.
                isize::try_from(self).unwrap_or(isize::MAX)
            }
        }
    )*};
}
dim!(usize, isize, i32, i64);

/// `axis` resolved against a rank of `ndim` (negative counts from the back), or
/// [`Error::AxisOutOfRange`].
pub(crate) fn resolve_axis(op: &'static str, axis: impl Dim, ndim: usize) -> Result<usize> {
    let i = axis.index();
    let resolved = if i < 0 {
        ndim.checked_sub(i.unsigned_abs())
    } else {
        Some(i as usize)
    };
    match resolved {
        Some(a) if a < ndim => Ok(a),
        _ => Err(Error::AxisOutOfRange { op, axis: i, ndim }),
    }
}

/// `axis` resolved as an axis of `t`; see [`resolve_axis`].
pub(crate) fn check_axis<T: DType>(
    op: &'static str,
    t: &Tensor<'_, T>,
    axis: impl Dim,
) -> Result<usize> {
    resolve_axis(op, axis, t.ndim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        let b = |a: &[usize], b: &[usize]| broadcast_shape("t", a, b).unwrap().slice().to_vec();
        assert_eq!(b(&[2, 3], &[3]), vec![2, 3]);
        assert_eq!(b(&[4, 1, 3], &[5, 1]), vec![4, 5, 3]);
        assert_eq!(b(&[], &[2]), vec![2]);
        assert_eq!(b(&[0, 3], &[1, 3]), vec![0, 3]);
        let err = broadcast_shape("add", &[2, 3], &[2]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "add: incompatible shapes [2, 3] and [2]: cannot broadcast: axis 1 of the result has \
             lengths 3 and 2, neither is 1"
        );
    }
}
