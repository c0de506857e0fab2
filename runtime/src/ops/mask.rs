//! Masks: comparisons giving `u8` masks (1 where true, 0 where false), selection by a mask
//! (`where_cond`, `masked_fill`), and triangles (`tril`, `triu`), which make causal masks.
//!
//! ```
//! use tensorscope::Pool;
//! let pool = Pool::with_max_memory_mb(16);
//! pool.scope(|s| {
//!     // A causal attention mask: scores above the diagonal become -inf before the softmax.
//!     let scores = s.zeros::<f32>(&[3, 3]);
//!     let future = s.ones::<u8>(&[3, 3]).triu(1);
//!     let masked = scores.masked_fill(&future, f32::NEG_INFINITY);
//!     assert_eq!(masked.to_vec()[..3], [0.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
//!     // Comparisons broadcast, and give masks.
//!     let x = s.from_slice::<f32>(&[4], &[-1.0, 0.0, 2.0, f32::NAN]);
//!     assert_eq!(x.gt(&s.zeros::<f32>(&[1])).to_vec(), vec![0, 0, 1, 0]);
//! });
//! ```

use ndarray::{Dimension, IxDyn, Zip};

use super::reduce::reduce_to;
use super::{broadcast_shape, rows, work};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Kept, Op, Saved};
use crate::element::{DType, Element};
use crate::error::{or_panic, panicking, Error, Result, Shape};
use crate::scope::{deeper, State};
use crate::tensor::Tensor;

/// `tril(k)` (`upper: false`) or `triu(k)` of the last two axes.
#[derive(Debug, Clone, Copy)]
struct Triangle {
    k: i64,
    upper: bool,
}

impl<T: DType> Op<T> for Triangle {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        if self.upper {
            "triu"
        } else {
            "tril"
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let out = triangle(cx.input(0), cx.scope(), self.k, self.upper)?;
        Ok((out, cx.saving().then_some(())))
    }

    /// The same triangle of the gradient.
    fn backward<'b>(&self, (): (), g: Tensor<'b, T>, cx: &Backward<'b>) -> Result<Grads<'b, T>> {
        Ok(Grads::from([Some(triangle(
            &g,
            cx.at(),
            self.k,
            self.upper,
        )?)]))
    }
}

/// The triangle of `x` (its rank checked by the caller), in `scope`.
fn triangle<'s, T: DType>(
    x: &Tensor<'s, T>,
    scope: &State,
    k: i64,
    upper: bool,
) -> Result<Tensor<'s, T>> {
    let [.., m, n] = *x.shape() else {
        unreachable!("the rank is checked before the op runs")
    };
    let mut out = Tensor::try_rent_in(scope, x.shape())?;
    if !out.is_empty() {
        work::visit(x.len() / (m * n));
        let keep = |i: usize, j: usize| {
            let d = j as i64 - i as i64;
            if upper {
                d >= k
            } else {
                d <= k
            }
        };
        let src = x.slice().chunks_exact(n);
        for (r, (o, x)) in out
            .unique_slice_mut()
            .chunks_exact_mut(n)
            .zip(src)
            .enumerate()
        {
            let i = r % m;
            for (j, (o, &x)) in o.iter_mut().zip(x).enumerate() {
                *o = if keep(i, j) { x } else { T::zeroed() };
            }
        }
    }
    Ok(out)
}

/// `where_cond` by a mask (held).
#[derive(Clone)]
struct Where {
    mask: Saved<'static, u8>,
}

impl<T: Element> Op<T> for Where {
    /// The two operands' shapes (to reduce a broadcast gradient to).
    type Saved<'s> = (IxDyn, IxDyn);

    fn name(&self) -> &'static str {
        "where_cond"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (mask, on_true, on_false) = (&self.mask.0, cx.input(0), cx.input(1));
        let shape = broadcast_shape("where_cond", on_true.shape(), on_false.shape())?;
        let shape = broadcast_shape("where_cond", mask.shape(), shape.slice())?;
        let shape = shape.slice();
        let mut out = cx.rent(shape)?;
        if !out.is_empty() {
            work::visit(rows(shape));
            Zip::from(out.unique_view_mut())
                .and_broadcast(&mask.view())
                .and_broadcast(&on_true.view())
                .and_broadcast(&on_false.view())
                .for_each(|o, &m, &a, &b| *o = if m != 0 { a } else { b });
        }
        let saved = cx
            .saving()
            .then(|| (IxDyn(on_true.shape()), IxDyn(on_false.shape())));
        Ok((out, saved))
    }

    /// The gradient to the operand each element came from.
    fn backward<'b>(
        &self,
        (a, b): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let mask = self.mask.get(cx);
        let da = cx
            .needs(0)
            .then(|| reduce_to(select_grad(&g, &mask, true)?, a.slice()));
        let db = cx
            .needs(1)
            .then(|| reduce_to(select_grad(&g, &mask, false)?, b.slice()));
        Ok(Grads::from([da.transpose()?, db.transpose()?]))
    }

    fn held(&self) -> &dyn Kept {
        &self.mask
    }
}

/// `masked_fill` by a mask (held) with a value.
#[derive(Clone)]
struct MaskedFill<T> {
    mask: Saved<'static, u8>,
    value: T,
}

impl<T: Element> Op<T> for MaskedFill<T> {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        "masked_fill"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (x, mask, value) = (cx.input(0), &self.mask.0, self.value);
        let mut out = cx.rent(x.shape())?;
        if !out.is_empty() {
            work::visit(rows(x.shape()));
            Zip::from(out.unique_view_mut())
                .and(&x.view())
                .and_broadcast(&mask.view())
                .for_each(|o, &x, &m| *o = if m != 0 { value } else { x });
        }
        Ok((out, cx.saving().then_some(())))
    }

    /// The gradient where the mask kept the input, 0 where it filled.
    fn backward<'b>(&self, (): (), g: Tensor<'b, T>, cx: &Backward<'b>) -> Result<Grads<'b, T>> {
        Ok(Grads::from([Some(select_grad(
            &g,
            &self.mask.get(cx),
            false,
        )?)]))
    }

    fn held(&self) -> &dyn Kept {
        &self.mask
    }
}

/// A comparison, for [`Tensor::cmp`] and [`Tensor::cmp_scalar`]. As in IEEE 754 and PyTorch, every
/// comparison with NaN is false except `Ne`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl Cmp {
    fn holds<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            Cmp::Eq => a == b,
            Cmp::Ne => a != b,
            Cmp::Lt => a < b,
            Cmp::Le => a <= b,
            Cmp::Gt => a > b,
            Cmp::Ge => a >= b,
        }
    }
}

macro_rules! comparisons {
    ($($name:ident $cmp:ident $sym:literal),*) => {$(
        #[doc = concat!("The mask of `self ", $sym, " other` with broadcasting; see [`Tensor::try_cmp`].")]
        ///
        /// # Panics
        /// If the shapes do not broadcast or the budget is exhausted, with the error's message.
        #[track_caller]
        pub fn $name(&self, other: &Tensor<'s, T>) -> Tensor<'s, u8> {
            or_panic(self.try_cmp(other, Cmp::$cmp))
        }
    )*};
}

impl<'s, T: DType> Tensor<'s, T> {
    /// The mask of `self <cmp> other`, elementwise with NumPy broadcasting: a `u8` tensor holding 1
    /// where the comparison holds and 0 elsewhere, in the deeper of the operands' scopes. Masks
    /// carry no gradient. Fails with [`Error::ShapeMismatch`] if the shapes do not broadcast.
    pub fn try_cmp(&self, other: &Tensor<'s, T>, cmp: Cmp) -> Result<Tensor<'s, u8>> {
        zip_broadcast("cmp", self, other, |a, b| u8::from(cmp.holds(a, b)))
    }

    panicking! {
        /// The mask of `self <cmp> other`.
        pub fn cmp(&self, other: &Tensor<'s, T>, cmp: Cmp) -> Tensor<'s, u8> = try_cmp;
    }

    /// The mask of `self <cmp> value`. Fails only with a budget error.
    pub fn try_cmp_scalar(&self, cmp: Cmp, value: T) -> Result<Tensor<'s, u8>> {
        let mut out = Tensor::<u8>::try_rent_in(&self.rents_in, self.shape())?;
        out.unique_slice_mut()
            .iter_mut()
            .zip(self.view().iter())
            .for_each(|(o, &a)| *o = u8::from(cmp.holds(a, value)));
        Ok(out)
    }

    panicking! {
        /// The mask of `self <cmp> value`.
        pub fn cmp_scalar(&self, cmp: Cmp, value: T) -> Tensor<'s, u8> = try_cmp_scalar;
    }

    comparisons!(eq Eq "==", ne Ne "!=", lt Lt "<", le Le "<=", gt Gt ">", ge Ge ">=");

    /// The lower triangle of the last two axes (PyTorch's `tril`): element `(i, j)` is kept where
    /// `j - i <= k` and zeroed elsewhere; `k = 0` keeps the diagonal, `k = -1` drops it. Fails with
    /// [`Error::InvalidShape`] for a rank below 2.
    pub fn try_tril(&self, k: i64) -> Result<Tensor<'s, T>> {
        self.try_triangle(k, false)
    }

    panicking! {
        /// The lower triangle.
        pub fn tril(&self, k: i64) -> Tensor<'s, T> = try_tril;
    }

    /// The upper triangle of the last two axes (PyTorch's `triu`): element `(i, j)` is kept where
    /// `j - i >= k`; `ones.triu(1)` marks the future positions of a causal mask. Fails with
    /// [`Error::InvalidShape`] for a rank below 2.
    pub fn try_triu(&self, k: i64) -> Result<Tensor<'s, T>> {
        self.try_triangle(k, true)
    }

    panicking! {
        /// The upper triangle.
        pub fn triu(&self, k: i64) -> Tensor<'s, T> = try_triu;
    }

    fn try_triangle(&self, k: i64, upper: bool) -> Result<Tensor<'s, T>> {
        if self.ndim() < 2 {
            return Err(Error::InvalidShape {
                op: if upper { "triu" } else { "tril" },
                shape: Shape::from(self.shape()),
                reason: "needs at least two axes".into(),
            });
        }
        autograd::run(Triangle { k, upper }, &mut args([Arg::Borrowed(self)]))
    }
}

impl<'s> Tensor<'s, u8> {
    /// `on_true` where this mask is non-zero and `on_false` elsewhere (PyTorch's
    /// `torch.where(mask, a, b)`), all three broadcast together. The gradient goes to the operand
    /// each element came from. Fails with [`Error::ShapeMismatch`] if the shapes do not broadcast.
    pub fn try_where_cond<T: Element>(
        &self,
        on_true: &Tensor<'s, T>,
        on_false: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        let mask = Saved::held(self)?;
        let inputs = &mut args([Arg::Borrowed(on_true), Arg::Borrowed(on_false)]);
        autograd::run(Where { mask }, inputs)
    }

    panicking! {
        /// `on_true` where this mask is non-zero and `on_false` elsewhere; see
        pub fn where_cond<T: Element>(&self, on_true: &Tensor<'s, T>, on_false: &Tensor<'s, T>,) -> Tensor<'s, T> = try_where_cond;
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// A copy with `value` where `mask` is non-zero (PyTorch's `masked_fill`); the mask broadcasts
    /// to this tensor's shape. The gradient flows to the elements kept. Fails with
    /// [`Error::ShapeMismatch`] if the mask does not broadcast to this shape.
    pub fn try_masked_fill(&self, mask: &Tensor<'s, u8>, value: T) -> Result<Tensor<'s, T>> {
        let fits = broadcast_shape("masked_fill", self.shape(), mask.shape())?;
        if fits.slice() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "masked_fill",
                lhs: Shape::from(self.shape()),
                rhs: Shape::from(mask.shape()),
                reason: "the mask must broadcast to the tensor's shape".into(),
            });
        }
        let mask = Saved::held(mask)?;
        autograd::run(MaskedFill { mask, value }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// A copy with `value` where `mask` is non-zero.
        pub fn masked_fill(&self, mask: &Tensor<'s, u8>, value: T) -> Tensor<'s, T> = try_masked_fill;
    }
}

/// `f(a, b)` for every pair of elements of `a` and `b` broadcast together, in the deeper of their
/// scopes. Records nothing: for results that carry no gradient (masks, integers). Fails with
/// [`Error::ShapeMismatch`] naming `op` if the shapes do not broadcast.
pub(crate) fn zip_broadcast<'s, T: DType, U: DType>(
    op: &'static str,
    a: &Tensor<'s, T>,
    b: &Tensor<'s, T>,
    f: impl Fn(T, T) -> U,
) -> Result<Tensor<'s, U>> {
    let shape = broadcast_shape(op, a.shape(), b.shape())?;
    let shape = shape.slice();
    let mut out = Tensor::<U>::try_rent_in(deeper(&a.rents_in, &b.rents_in), shape)?;
    if !out.is_empty() {
        work::visit(rows(shape));
        Zip::from(out.unique_view_mut())
            .and_broadcast(&a.view())
            .and_broadcast(&b.view())
            .for_each(|o, &a, &b| *o = f(a, b));
    }
    Ok(out)
}

/// `g` where `mask` (broadcast to `g`'s shape) is non-zero if `keep_set`, or zero if not; zero
/// elsewhere: the gradient that reaches the operand an element was taken from.
fn select_grad<'b, T: Element>(
    g: &Tensor<'b, T>,
    mask: &Tensor<'b, u8>,
    keep_set: bool,
) -> Result<Tensor<'b, T>> {
    let mut out = Tensor::try_rent_in(&g.rents_in, g.shape())?;
    if !out.is_empty() {
        Zip::from(out.unique_view_mut())
            .and(&g.view())
            .and_broadcast(&mask.view())
            .for_each(|o, &g, &m| *o = if (m != 0) == keep_set { g } else { T::zero() });
    }
    Ok(out)
}
