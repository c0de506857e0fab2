//! The op core: an op is one record, [`Op`], holding its forward, what its backward saves, its
//! backward, and (since a checkpointed replay runs the forward again) how it replays. The graph, a
//! checkpoint's tape and the accounting walk all read that one record; the library's own ops and
//! an op written outside the crate are the same kind of thing.
//!
//! ```
//! use tensorscope::autograd::{Backward, Forward, Grads, Op, Saved};
//! use tensorscope::{Pool, Result, Tensor, TensorOps};
//!
//! /// `x^3`, with its derivative `3 x^2`.
//! #[derive(Clone)]
//! struct Cube;
//!
//! impl Op<f32> for Cube {
//!     type Saved<'s> = Saved<'s, f32>; // the input
//!
//!     fn name(&self) -> &'static str {
//!         "cube"
//!     }
//!
//!     fn forward<'s>(&self, cx: &mut Forward<'_, 's, f32>) -> Result<(Tensor<'s, f32>, Option<Saved<'s, f32>>)> {
//!         let x = cx.input(0);
//!         let y = x.try_zip_map(x, |a, _| a * a * a)?;
//!         Ok((y, cx.saving().then(|| cx.save(x))))
//!     }
//!
//!     fn backward<'b>(&self, x: Saved<'b, f32>, grad: Tensor<'b, f32>, cx: &Backward<'b>) -> Result<Grads<'b, f32>> {
//!         let dx = grad.try_zip_map(&x.get(cx), |g, x| g * 3.0 * x * x)?;
//!         Ok(Grads::from([Some(dx)]))
//!     }
//! }
//!
//! let pool = Pool::with_max_memory_mb(16);
//! pool.scope(|s| {
//!     let x = s.from_slice::<f32>(&[2], &[1.0, 2.0]).requires_grad();
//!     let y = Tensor::try_apply(Cube, &[&x]).unwrap();
//!     assert_eq!(y.to_vec(), vec![1.0, 8.0]);
//!     let grads = y.sum_all().backward().unwrap();
//!     assert_eq!(grads.of(&x).unwrap().to_vec(), vec![3.0, 12.0]);
//! });
//! ```

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::dims::Dims;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::recycle::{self, Few, RecycledVec, Slot};
use crate::scope::{deeper, State};
use crate::tensor::Tensor;

use super::grads::Gradients;
use super::{with_mode, Mode, Node, PerInput, Recorder};
use sealed::{Held as _, Walk as _};

/// An op that records its backward: declared once, beside its forward.
///
/// - [`Op::forward`] computes the output from the inputs, and when the output will be
///   differentiated ([`Forward::saving`]), also what the backward needs, as PyTorch's
///   `ctx.save_for_backward`: aliases of inputs and outputs ([`Forward::save`]), never copies.
/// - [`Op::backward`] gives the inputs' gradients from the output's and what was saved. Each
///   gradient is checked against its input's shape before anything uses it
///   ([`Error::InvalidGradient`], [`Error::TooManyGradients`]).
/// - Under `#[checkpoint]` a layer step keeps the op itself, not what it saved, and runs its
///   forward again when the backward needs the step: the same kernels on the same values, so the
///   same bits. An op's forward must therefore be deterministic in its inputs and its own fields.
///   An op a [`Saving`](crate::checkpoint::Saving) policy names (by [`Op::name`]) runs its forward
///   saving on the tape instead: the tape keeps the output and what the forward saved, less the
///   saved aliases of its inputs, and a replay gives the backward the recomputed inputs in their
///   place and the kept output, without running the forward.
///
/// The op's fields are its parameters (an axis, a scalar); run it with [`Tensor::try_apply`].
///
/// # Lifetimes
///
/// What an op saves carries the brand of the scope it was saved in: [`Op::Saved`] is generic in
/// it (`type Saved<'s> = Saved<'s, f32>`), [`Forward::save`] gives a [`Saved<'s, _>`](Saved), and
/// the backward gets it back branded with the backward's scope. Since an op is `'static`, neither
/// its fields nor anything else that outlives the scope can keep a saved value: a stash in a
/// field, a `static` or a thread local is a compile error, as for any other tensor of a scope.
///
/// ```compile_fail
/// use std::cell::RefCell;
/// use tensorscope::autograd::{Backward, Forward, Grads, Op, Saved};
/// use tensorscope::{Result, Tensor};
///
/// #[derive(Clone, Default)]
/// struct Stash(std::rc::Rc<RefCell<Option<Saved<'static, f32>>>>);
///
/// impl Op<f32> for Stash {
///     type Saved<'s> = Saved<'s, f32>;
///     fn name(&self) -> &'static str { "stash" }
///     fn forward<'s>(&self, cx: &mut Forward<'_, 's, f32>) -> Result<(Tensor<'s, f32>, Option<Saved<'s, f32>>)> {
///         let x = cx.input(0);
///         *self.0.borrow_mut() = Some(cx.save(x)); // error: `'s` does not outlive `'static`
///         Ok((x.clone(), Some(cx.save(x))))
///     }
///     fn backward<'b>(&self, _: Saved<'b, f32>, g: Tensor<'b, f32>, _: &Backward<'b>) -> Result<Grads<'b, f32>> {
///         Ok(Grads::from([Some(g)]))
///     }
/// }
/// ```
pub trait Op<T: DType>: Clone + 'static {
    /// What the backward needs from the forward, branded with the scope it was saved in:
    /// [`Saved`] tensors, numbers, shapes, and tuples, arrays, `Vec`s and `Option`s of them
    /// (`type Saved<'s> = (Saved<'s, T>, usize)`).
    type Saved<'s>: for<'x> Held<At<'x> = Self::Saved<'x>>;

    /// The op's name, as errors give it.
    fn name(&self) -> &'static str;

    /// The output of the op on `cx`'s inputs, and, if [`Forward::saving`], what
    /// [`Op::backward`] needs (`None` otherwise). The output must be rented through `cx`
    /// ([`Forward::rent`]) or computed by other ops on the inputs, so that it belongs to the
    /// deepest of the inputs' scopes. Errors are the op's (shapes, values, budget).
    #[allow(clippy::type_complexity)]
    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)>;

    /// The gradients of the inputs given `grad`, the gradient of the output: one per input, in
    /// order, each of its input's shape, `None` for an input that needs none
    /// ([`Backward::needs`]). Saved tensors come back with [`Saved::get`]; everything rents in
    /// `grad`'s scope. A gradient of another shape than its input's, or one for an input the op
    /// does not have, fails the backward with [`Error::InvalidGradient`] or
    /// [`Error::TooManyGradients`] before any gradient is used.
    fn backward<'b>(
        &self,
        saved: Self::Saved<'b>,
        grad: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>>;

    /// Whether the op reads views (`t()`, `permute`, `narrow`, `expand`: a shape and steps on
    /// another tensor's buffer) where they lie, through [`Tensor::view`] or their steps. If not
    /// (the default), the core hands [`Op::forward`] its inputs and [`Op::backward`] its
    /// gradient contiguous ([`Tensor::as_slice`] is then `Some`), copying the views among them.
    fn reads_views(&self) -> bool {
        false
    }

    /// The tensors the op holds as parameters (the library's ops: ids, a mask): the op's output
    /// belongs to the deepest of their scopes and its inputs', and an escape moves their
    /// accounting with the graph. An op written outside the crate holds none.
    fn held(&self) -> &dyn Kept {
        &()
    }
}

/// A tensor kept for a backward, branded with the scope it was saved in: an alias (no copy) with
/// no ops of its own, which [`Saved::get`] hands back as a tensor of the backward's scope.
pub struct Saved<'s, U: DType>(pub(crate) Tensor<'static, U>, PhantomData<&'s ()>);

impl<U: DType> Saved<'static, U> {
    /// `t` as an op's parameter (ids, a mask, labels): an alias, or for a view a contiguous copy
    /// in `t`'s scope, so that the op reads it as a slice. Fails only with a budget error. The
    /// brand is `'static` because an op is: only the library's ops hold one, and its accounting
    /// follows the graph through [`Op::held`].
    pub(crate) fn held(t: &Tensor<'_, U>) -> Result<Self> {
        let scope = t.rents_in.clone();
        Ok(Saved::new(
            t.clone().try_contiguous_in(&scope)?.into_saved(),
        ))
    }
}

impl<'s, U: DType> Saved<'s, U> {
    fn new(t: Tensor<'static, U>) -> Self {
        Saved(t, PhantomData)
    }

    /// The saved values as a tensor of the backward's scope (an alias, no copy).
    pub fn get(&self, cx: &Backward<'s>) -> Tensor<'s, U> {
        self.0.alias_in(cx.at)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    /// The elements in row-major order, if they lie so in one run of the buffer (see
    /// [`Tensor::as_slice`]; what an op that does not read views saves always does).
    pub fn as_slice(&self) -> Option<&[U]> {
        self.0.as_slice()
    }
}

impl<U: DType> Clone for Saved<'_, U> {
    fn clone(&self) -> Self {
        Saved::new(self.0.clone())
    }
}

/// What an op's backward may keep ([`Op::Saved`]): [`Saved`] tensors, numbers and shapes, and
/// tuples, arrays, `Vec`s and `Option`s of them, all branded with one scope (`At<'x>` is the same
/// value under the brand `'x`). Sealed: an op's record is made of these, so that the graph's
/// accounting finds every tensor it keeps, and only the engine moves a value to another brand.
pub trait Held: sealed::Held {}

impl<X: sealed::Held> Held for X {}

/// What an op holds as parameters ([`Op::held`]): the graph's accounting walks its tensors.
/// Sealed, as [`Held`] is.
pub trait Kept: sealed::Walk {}

impl<X: sealed::Walk + ?Sized> Kept for X {}

// The sealed traits name the crate's own scope type, and moving a value to another brand takes a
// token only the crate can make: they cannot be implemented, nor `rebrand` called, outside the
// crate, so nothing outside ever sees the scope type or widens a brand.
#[allow(private_interfaces)]
pub(crate) mod sealed {
    use crate::scope::State;

    /// The proof that the engine, not a user, moves a value to another brand.
    pub struct Token(pub(crate) ());

    /// How the graph's accounting walks what an op keeps.
    pub trait Walk {
        /// Calls `f` with the scope and a mover of every tensor held.
        fn each(&self, f: &mut dyn FnMut(&dyn Tensorish));
    }

    /// A value of an op's record, under any brand.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be kept for an op's backward",
        note = "an op's `Saved` is made of `Saved<'s, _>` tensors, numbers, shapes, and tuples, \
                arrays, `Vec`s and `Option`s of them"
    )]
    pub trait Held: Walk {
        /// The same value under the brand `'x`.
        type At<'x>: Held;
        /// Moves the value to the brand `'x`: the engine's alone (see `Token`).
        fn rebrand<'x>(self, token: Token) -> Self::At<'x>;
        /// Calls `f` on every tensor held (a `Tensor<'static, U>`), in the order `each` visits
        /// them, so that the engine can put another handle in its place.
        fn each_mut(&mut self, f: &mut dyn FnMut(&mut dyn std::any::Any));
    }

    /// A held tensor of any element type.
    pub trait Tensorish {
        /// The scope its ops rent in.
        fn scope(&self) -> &State;
        /// Moves its accounting to `target` if `target` outlives its owner.
        fn move_accounting(&self, target: &State);
        /// The pool bytes of its buffer, and the buffer's address (equal for aliases).
        fn buffer(&self) -> (usize, *const ());
    }
}

use sealed::Token;

#[allow(private_interfaces)] // sealed: see `sealed`
impl<U: DType> sealed::Tensorish for Saved<'_, U> {
    fn scope(&self) -> &State {
        &self.0.rents_in
    }
    fn move_accounting(&self, target: &State) {
        self.0.move_accounting(target);
    }
    fn buffer(&self) -> (usize, *const ()) {
        (self.0.allocated_bytes(), self.0.buffer_addr())
    }
}

impl<U: DType> sealed::Walk for Saved<'_, U> {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        f(self)
    }
}

impl<U: DType> sealed::Held for Saved<'_, U> {
    type At<'x> = Saved<'x, U>;
    fn rebrand<'x>(self, _: Token) -> Self::At<'x> {
        Saved::new(self.0)
    }
    fn each_mut(&mut self, f: &mut dyn FnMut(&mut dyn std::any::Any)) {
        f(&mut self.0)
    }
}

macro_rules! held_plain {
    ($($t:ty),*) => {$(
        impl sealed::Walk for $t {
            fn each(&self, _: &mut dyn FnMut(&dyn sealed::Tensorish)) {}
        }
        impl sealed::Held for $t {
            type At<'x> = $t;
            fn rebrand<'x>(self, _: Token) -> Self::At<'x> {
                self
            }
            fn each_mut(&mut self, _: &mut dyn FnMut(&mut dyn std::any::Any)) {}
        }
    )*};
}
held_plain!(
    (),
    bool,
    usize,
    isize,
    u8,
    i32,
    i64,
    u64,
    f32,
    f64,
    half::f16,
    half::bf16,
    ndarray::IxDyn,
    crate::dims::Dims,
    &'static str
);

impl<X: sealed::Walk> sealed::Walk for Option<X> {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        if let Some(x) = self {
            x.each(f)
        }
    }
}

impl<X: sealed::Held> sealed::Held for Option<X> {
    type At<'x> = Option<X::At<'x>>;
    fn rebrand<'x>(self, _: Token) -> Self::At<'x> {
        self.map(|x| x.rebrand(Token(())))
    }
    fn each_mut(&mut self, f: &mut dyn FnMut(&mut dyn std::any::Any)) {
        if let Some(x) = self {
            x.each_mut(f)
        }
    }
}

impl<X: sealed::Walk> sealed::Walk for Vec<X> {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        self.iter().for_each(|x| x.each(f))
    }
}

impl<X: sealed::Held> sealed::Held for Vec<X> {
    type At<'x> = Vec<X::At<'x>>;
    fn rebrand<'x>(self, _: Token) -> Self::At<'x> {
        self.into_iter().map(|x| x.rebrand(Token(()))).collect()
    }
    fn each_mut(&mut self, f: &mut dyn FnMut(&mut dyn std::any::Any)) {
        self.iter_mut().for_each(|x| x.each_mut(f))
    }
}

impl<X: sealed::Walk, const N: usize> sealed::Walk for [X; N] {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        self.iter().for_each(|x| x.each(f))
    }
}

impl<X: sealed::Held, const N: usize> sealed::Held for [X; N] {
    type At<'x> = [X::At<'x>; N];
    fn rebrand<'x>(self, _: Token) -> Self::At<'x> {
        self.map(|x| x.rebrand(Token(())))
    }
    fn each_mut(&mut self, f: &mut dyn FnMut(&mut dyn std::any::Any)) {
        self.iter_mut().for_each(|x| x.each_mut(f))
    }
}

macro_rules! held_tuple {
    ($($x:ident $i:tt),*) => {
        impl<$($x: sealed::Walk),*> sealed::Walk for ($($x,)*) {
            fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
                $(self.$i.each(f);)*
            }
        }
        impl<$($x: sealed::Held),*> sealed::Held for ($($x,)*) {
            type At<'x> = ($($x::At<'x>,)*);
            fn rebrand<'x>(self, _: Token) -> Self::At<'x> {
                ($(self.$i.rebrand(Token(())),)*)
            }
            fn each_mut(&mut self, f: &mut dyn FnMut(&mut dyn std::any::Any)) {
                $(self.$i.each_mut(f);)*
            }
        }
    };
}
held_tuple!(A 0, B 1);
held_tuple!(A 0, B 1, C 2);
held_tuple!(A 0, B 1, C 2, D 3);

/// The gradients of an op's inputs, one per input in order (`None` where none is needed): what
/// [`Op::backward`] returns. Made from an array of one or two (`Grads::from([Some(dx), None])`) or
/// from an iterator.
pub struct Grads<'b, T: DType>(pub(crate) PerInput<Tensor<'static, T>>, PhantomData<&'b ()>);

impl<'b, T: DType> From<[Option<Tensor<'b, T>>; 1]> for Grads<'b, T> {
    fn from([grad]: [Option<Tensor<'b, T>>; 1]) -> Self {
        Grads::from([grad, None])
    }
}

impl<'b, T: DType> From<[Option<Tensor<'b, T>>; 2]> for Grads<'b, T> {
    fn from(grads: [Option<Tensor<'b, T>>; 2]) -> Self {
        // The brand is dropped inside the engine only: no `Grads` hands a tensor back out.
        Grads(
            Few::Two(grads.map(|g| g.map(Tensor::into_unbranded))),
            PhantomData,
        )
    }
}

impl<'b, T: DType> FromIterator<Option<Tensor<'b, T>>> for Grads<'b, T> {
    fn from_iter<I: IntoIterator<Item = Option<Tensor<'b, T>>>>(iter: I) -> Self {
        // The brand is dropped inside the engine only: no `Grads` hands a tensor back out.
        let grads = iter.into_iter().map(|g| g.map(Tensor::into_unbranded));
        Grads(grads.collect(), PhantomData)
    }
}

/// Fails unless every gradient in `grads` is for an input in `shapes` and has its shape (as
/// PyTorch, the count first): what an op's backward returns is checked before anything adds it,
/// so a wrong one is the op's error, not a wrong weight or a panic downstream.
fn check_grads<T: DType>(
    op: &'static str,
    grads: &PerInput<Tensor<'static, T>>,
    shapes: &PerInput<Dims>,
) -> Result<()> {
    let inputs = shapes.iter().flatten().count();
    let got = grads.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    if got > inputs {
        return Err(Error::TooManyGradients { op, got, inputs });
    }
    for (index, (grad, expected)) in grads.iter().zip(shapes.iter()).enumerate() {
        if let (Some(grad), Some(expected)) = (grad, expected) {
            if grad.shape() != expected.slice() {
                return Err(Error::InvalidGradient {
                    op,
                    index,
                    got: grad.shape().into(),
                    expected: expected.slice().into(),
                });
            }
        }
    }
    Ok(())
}

/// An op's input as a caller gives it: borrowed, or owned (a unique owned tensor can be written
/// in place).
pub(crate) enum Arg<'r, 's, T: DType> {
    Owned(Tensor<'s, T>),
    Borrowed(&'r Tensor<'s, T>),
}

/// The inputs of an op: one or two given owned or borrowed (held in place), any number borrowed
/// (`concat`'s list), or any number owned (a checkpoint's replay of such an op, in a recycled list).
pub(crate) enum Inputs<'r, 's, T: DType> {
    Few([Option<Arg<'r, 's, T>>; 2]),
    Slice(&'r [&'r Tensor<'s, T>]),
    Owned(RecycledVec<Option<Tensor<'static, T>>>),
}

impl<'r, 's, T: DType> Inputs<'r, 's, T> {
    /// The number of inputs.
    #[inline]
    fn len(&self) -> usize {
        match self {
            Inputs::Few([_, Some(_)]) => 2,
            Inputs::Few([first, None]) => usize::from(first.is_some()),
            Inputs::Slice(all) => all.len(),
            Inputs::Owned(all) => all.len(),
        }
    }

    /// Input `i`, unless taken.
    #[inline]
    fn get(&self, i: usize) -> Option<&Tensor<'s, T>> {
        match self {
            Inputs::Few(few) => few.get(i)?.as_ref().map(Arg::tensor),
            Inputs::Slice(all) => all.get(i).copied(),
            Inputs::Owned(all) => all.get(i)?.as_ref(),
        }
    }

    /// Input `i`, taken (a borrowed one stays borrowed).
    #[inline]
    pub(super) fn take(&mut self, i: usize) -> Option<Arg<'r, 's, T>> {
        match self {
            Inputs::Few(few) => few.get_mut(i)?.take(),
            Inputs::Slice(all) => all.get(i).map(|&t| Arg::Borrowed(t)),
            Inputs::Owned(all) => all.get_mut(i)?.take().map(Arg::Owned),
        }
    }

    /// Replaces the views among the inputs by contiguous copies rented in `scope` (on the same
    /// graphs). Out of line: only an op on a view that it does not read in place gets here.
    #[inline(never)]
    fn make_contiguous(&mut self, scope: &State) -> Result<()> {
        let copy = |t: &Tensor<'s, T>| t.clone().try_contiguous_in(scope);
        match self {
            Inputs::Few(few) => {
                for slot in few.iter_mut() {
                    if let Some(arg) = slot.as_ref().filter(|a| !a.tensor().is_contiguous()) {
                        *slot = Some(Arg::Owned(copy(arg.tensor())?));
                    }
                }
            }
            Inputs::Slice(all) => {
                let owned = all
                    .iter()
                    .map(|&t| Ok(Some(copy(t)?.into_unbranded())))
                    .collect::<Result<RecycledVec<_>>>()?;
                *self = Inputs::Owned(owned);
            }
            Inputs::Owned(all) => {
                for t in all.iter_mut().flatten().filter(|t| !t.is_contiguous()) {
                    *t = t.clone().try_contiguous_in(scope)?;
                }
            }
        }
        Ok(())
    }

    /// Owned inputs, in a recycled list when there are more than two: a replay's.
    pub(crate) fn owned(inputs: impl ExactSizeIterator<Item = Tensor<'static, T>>) -> Self {
        if inputs.len() <= 2 {
            let mut few = [None, None];
            for (slot, t) in few.iter_mut().zip(inputs) {
                *slot = Some(Arg::Owned(t));
            }
            Inputs::Few(few)
        } else {
            Inputs::Owned(inputs.map(Some).collect())
        }
    }
}

/// An op's inputs as the core takes them: one or two, owned or borrowed.
#[inline(always)]
pub(crate) fn args<'r, 's, T: DType, const N: usize>(
    args: [Arg<'r, 's, T>; N],
) -> Inputs<'r, 's, T> {
    let mut few = [None, None];
    for (slot, a) in few.iter_mut().zip(args) {
        *slot = Some(a);
    }
    Inputs::Few(few)
}

impl<'s, T: DType> Arg<'_, 's, T> {
    pub(crate) fn tensor(&self) -> &Tensor<'s, T> {
        match self {
            Arg::Owned(t) => t,
            Arg::Borrowed(t) => t,
        }
    }

    /// The tensor itself if it is owned, unique and of `shape`, so its buffer can be the output.
    pub(crate) fn into_writable(self, shape: &[usize]) -> std::result::Result<Tensor<'s, T>, Self> {
        match self {
            Arg::Owned(t) if t.is_writable() && t.shape() == shape => Ok(t),
            other => Err(other),
        }
    }

    /// A tensor of `scope` to write the result into: the operand itself if it can be written in
    /// place, else a fresh rent of the same shape holding a copy.
    pub(crate) fn into_writable_copy(self, scope: &State) -> Result<Tensor<'s, T>> {
        let shape = crate::dims::Dims::from_slice(self.tensor().shape());
        match self.into_writable(&shape) {
            Ok(t) => Ok(t.with_scope(scope)),
            Err(src) => {
                let src = src.tensor();
                let mut out = Tensor::try_rent_in(scope, src.shape())?;
                out.copy_from(src);
                Ok(out)
            }
        }
    }
}

/// The forward of one op: its inputs, the scope its output belongs to, and whether the backward
/// will run.
pub struct Forward<'r, 's, T: DType> {
    inputs: &'r mut Inputs<'r, 's, T>,
    count: usize,
    scope: State,
    saving: bool,
}

impl<'r, 's, T: DType> Forward<'r, 's, T> {
    /// The number of inputs.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the op has no inputs.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Input `i`.
    ///
    /// # Panics
    /// If there is no input `i`, or the op took it.
    pub fn input(&self, i: usize) -> &Tensor<'s, T> {
        self.inputs.get(i).expect("an input of the op, not taken")
    }

    /// Whether the output will be differentiated: only then must the forward return what the
    /// backward needs.
    pub fn saving(&self) -> bool {
        self.saving
    }

    /// `t` kept for the backward: an alias, no copy. A saved input is no longer the only handle on
    /// its buffer, so no op overwrites it in place.
    pub fn save<U: DType>(&self, t: &Tensor<'s, U>) -> Saved<'s, U> {
        Saved::new(t.saved())
    }

    /// Rents a tensor of `shape` with unspecified contents in the output's scope. Fails with a
    /// budget error.
    pub fn rent<U: DType>(&self, shape: &[usize]) -> Result<Tensor<'s, U>> {
        Tensor::try_rent_in(&self.scope, shape)
    }

    /// Rents a tensor of zeros of `shape` in the output's scope. Fails with a budget error.
    pub fn rent_zeroed<U: DType>(&self, shape: &[usize]) -> Result<Tensor<'s, U>> {
        Tensor::try_rent_zeroed_in(&self.scope, shape)
    }

    /// The scope the output belongs to: the deepest of the inputs' and the held tensors'.
    pub(crate) fn scope(&self) -> &State {
        &self.scope
    }

    /// Input `i`, taken: as the caller gave it, owned (and so written in place if it is the only
    /// handle on its buffer) or borrowed.
    pub(crate) fn take(&mut self, i: usize) -> Arg<'r, 's, T> {
        self.inputs.take(i).expect("an input of the op, not taken")
    }

    /// Every input, in order.
    pub(crate) fn inputs<'a>(
        &'a self,
    ) -> impl Iterator<Item = &'a Tensor<'s, T>> + Clone + use<'a, 'r, 's, T> {
        (0..self.count).map(|i| self.input(i))
    }
}

/// The backward of one op: which inputs need a gradient, and the scope everything rents in.
pub struct Backward<'b> {
    needs: &'b [bool],
    /// Borrowed for `'b`, which also brands the backward's tensors: none outlives the call.
    at: &'b State,
}

impl<'b> Backward<'b> {
    /// Whether input `i` needs a gradient (an input that carries no graph does not).
    pub fn needs(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    /// Rents a tensor of zeros of `shape` in the backward's scope. Fails with a budget error.
    pub fn zeros<U: DType>(&self, shape: &[usize]) -> Result<Tensor<'b, U>> {
        Tensor::try_rent_zeroed_in(self.at, shape)
    }

    /// Rents a tensor of `shape` with unspecified contents in the backward's scope. Fails with a
    /// budget error.
    pub fn rent<U: DType>(&self, shape: &[usize]) -> Result<Tensor<'b, U>> {
        Tensor::try_rent_in(self.at, shape)
    }

    /// The scope the backward runs in.
    pub(crate) fn at(&self) -> &State {
        self.at
    }
}

/// What a graph node keeps of the op that made it: the op record and what it saved, or a
/// checkpointed region, or an op without a derivative. The graph, the backward walk and the
/// accounting walk read only this.
pub(crate) trait Recorded<T: DType> {
    /// Fails as the backward would, before anything runs (an op without a derivative, a region
    /// whose steps cannot be differentiated).
    fn check(&self, _grads: &Gradients<'_, T>) -> Result<()> {
        Ok(())
    }

    /// The gradients of the op's inputs given `grad`, in `at`; consumes what was saved.
    fn backward(
        &mut self,
        grad: Tensor<'static, T>,
        needs: &[bool],
        at: &State,
        grads: &mut Gradients<'_, T>,
    ) -> Result<PerInput<Tensor<'static, T>>>;

    /// Moves the accounting of what is kept to `target` (see `Tensor::move_accounting`).
    fn move_accounting(&self, target: &State);

    /// Gives the record's allocation back for reuse (see `recycle`).
    fn recycle(self: Box<Self>);
}

/// What a checkpoint's tape keeps of an op: how to run it again, without what it saved (or,
/// for an op whose output the tape keeps, that output).
pub(crate) trait Replayable<T: DType> {
    /// Runs the op again on `args` in `at` (recording if they carry graphs), or binds the output
    /// the tape kept. `args` is empty when [`Replayable::reads_args`] said so.
    fn replay(&self, args: Inputs<'_, 'static, T>, at: &State) -> Result<Tensor<'static, T>>;

    /// The output kept by an op that cannot run again (no derivative), with its name.
    fn kept(&self) -> Option<(&'static str, &Tensor<'static, T>)> {
        None
    }

    /// Whether a replay needs the op's arguments (`recording`: it builds a graph). An op whose
    /// output the tape keeps needs them only to record its node, whose backward reads them.
    fn reads_args(&self, _recording: bool) -> bool {
        true
    }

    /// Whether a replay runs the op's kernel again, rather than binding a kept output.
    fn reruns(&self) -> bool {
        true
    }

    /// Whether the entry is an op, counted in what replays did (not a value of an earlier step
    /// that the step reads).
    fn is_op(&self) -> bool {
        true
    }

    /// The pool bytes the entry keeps for replays (a kept output, and what the op's backward
    /// saved beyond its inputs and output), until a replay that records takes them.
    fn kept_bytes(&self) -> usize {
        0
    }

    /// Moves the accounting of what is kept (held tensors, a kept output) to `target`.
    fn move_accounting(&self, target: &State);

    /// Gives the allocation back for reuse.
    fn recycle(self: Box<Self>);
}

/// A node's record, in a reused allocation.
pub(crate) struct Rule<T: DType>(Option<Box<dyn Recorded<T>>>);

impl<T: DType> Rule<T> {
    pub(crate) fn new(record: Box<dyn Recorded<T>>) -> Self {
        Rule(Some(record))
    }

    pub(crate) fn get(&self) -> &dyn Recorded<T> {
        self.0
            .as_deref()
            .expect("a rule is emptied only when dropped")
    }

    pub(crate) fn get_mut(&mut self) -> &mut dyn Recorded<T> {
        self.0
            .as_deref_mut()
            .expect("a rule is emptied only when dropped")
    }
}

impl<T: DType> Drop for Rule<T> {
    fn drop(&mut self) {
        if let Some(record) = self.0.take() {
            record.recycle();
        }
    }
}

/// A tape's entry, in a reused allocation.
pub(crate) struct Step<T: DType>(pub(crate) Option<Box<dyn Replayable<T>>>);

impl<T: DType> Step<T> {
    pub(crate) fn get(&self) -> &dyn Replayable<T> {
        self.0
            .as_deref()
            .expect("a step is emptied only when dropped")
    }
}

impl<T: DType> Drop for Step<T> {
    fn drop(&mut self) {
        if let Some(step) = self.0.take() {
            step.recycle();
        }
    }
}

/// An op, what its forward saved (nothing on a tape, which keeps no brand of its own: stored
/// under `'static`, handed to the backward under its scope's) and its inputs' shapes, which the
/// gradients the backward returns must have.
struct Record<O: Op<T>, T: DType> {
    op: O,
    saved: Option<O::Saved<'static>>,
    shapes: PerInput<Dims>,
    _element: std::marker::PhantomData<fn() -> T>,
}

impl<T: DType, O: Op<T>> Recorded<T> for Slot<Record<O, T>> {
    fn backward(
        &mut self,
        grad: Tensor<'static, T>,
        needs: &[bool],
        at: &State,
        _: &mut Gradients<'_, T>,
    ) -> Result<PerInput<Tensor<'static, T>>> {
        let record = self.get_mut();
        let _op = crate::trace::op(|| record.op.name());
        // Not `ok_or`: an eager `Error` would be built and dropped on every backward.
        let Some(saved) = record.saved.take() else {
            return Err(Error::GraphConsumed);
        };
        let grad = match record.op.reads_views() {
            true => grad,
            false => grad.try_contiguous_in(at)?,
        };
        let cx = Backward { needs, at };
        let grads = record.op.backward(saved.rebrand(Token(())), grad, &cx)?.0;
        check_grads(record.op.name(), &grads, &record.shapes)?;
        Ok(grads)
    }

    fn move_accounting(&self, target: &State) {
        let record = self.get();
        let mut each = |t: &dyn sealed::Tensorish| t.move_accounting(target);
        record.op.held().each(&mut each);
        if let Some(saved) = &record.saved {
            saved.each(&mut each);
        }
    }

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
    }
}

impl<T: DType, O: Op<T>> Replayable<T> for Slot<Record<O, T>> {
    fn replay(&self, args: Inputs<'_, 'static, T>, _: &State) -> Result<Tensor<'static, T>> {
        run(self.get().op.clone(), &mut { args })
    }

    fn move_accounting(&self, target: &State) {
        self.get()
            .op
            .held()
            .each(&mut |t| t.move_accounting(target));
    }

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
    }
}

/// The record of an op without a derivative: a backward that reaches it fails naming it. On a
/// tape it keeps its output, since it cannot run again.
pub(crate) struct Opaque<T: DType> {
    pub(crate) name: &'static str,
    pub(crate) kept: Option<Tensor<'static, T>>,
}

impl<T: DType> Recorded<T> for Slot<Opaque<T>> {
    fn check(&self, _: &Gradients<'_, T>) -> Result<()> {
        Err(Error::NotDifferentiable {
            op: self.get().name,
        })
    }

    fn backward(
        &mut self,
        _: Tensor<'static, T>,
        _: &[bool],
        _: &State,
        _: &mut Gradients<'_, T>,
    ) -> Result<PerInput<Tensor<'static, T>>> {
        Err(Error::NotDifferentiable {
            op: self.get().name,
        })
    }

    fn move_accounting(&self, target: &State) {
        if let Some(kept) = &self.get().kept {
            kept.move_accounting(target);
        }
    }

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
    }
}

impl<T: DType> Replayable<T> for Slot<Opaque<T>> {
    fn replay(&self, _: Inputs<'_, 'static, T>, at: &State) -> Result<Tensor<'static, T>> {
        let opaque = self.get();
        let kept = opaque
            .kept
            .as_ref()
            .expect("an opaque op on a tape keeps its output");
        Ok(super::barrier(kept.alias_in(at), opaque.name))
    }

    fn kept(&self) -> Option<(&'static str, &Tensor<'static, T>)> {
        let opaque = self.get();
        Some((opaque.name, opaque.kept.as_ref()?))
    }

    fn reads_args(&self, _: bool) -> bool {
        false
    }

    fn reruns(&self) -> bool {
        false
    }

    fn kept_bytes(&self) -> usize {
        self.get().kept.as_ref().map_or(0, Tensor::allocated_bytes)
    }

    fn move_accounting(&self, target: &State) {
        Recorded::move_accounting(self, target)
    }

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
    }
}

/// An op on a tape whose output the tape keeps (selective saving, `checkpoint::Saving`): the op,
/// and until a replay that records takes them, its output and what its forward saved, with the
/// saved handles on its inputs taken out (the replay puts the recomputed inputs back).
struct Keeping<O: Op<T>, T: DType> {
    op: O,
    kept: RefCell<Option<KeptRun<O, T>>>,
}

/// What [`Keeping`] holds of the op's run in the forward.
struct KeptRun<O: Op<T>, T: DType> {
    output: Tensor<'static, T>,
    /// What the forward saved, a handle on the output in the place of each saved input.
    saved: O::Saved<'static>,
    /// Which of the saved tensors (by their place in the walk of `saved`) is which input.
    inputs: RecycledVec<(usize, usize)>,
}

impl<T: DType, O: Op<T>> Keeping<O, T> {
    /// The kept output, as a tensor of `at` (the tape still keeps it).
    fn kept_output(&self, at: &State) -> Tensor<'static, T> {
        let kept = self.kept.borrow();
        kept.as_ref().expect("kept until taken").output.alias_in(at)
    }
}

impl<T: DType, O: Op<T>> Replayable<T> for Slot<Keeping<O, T>> {
    fn replay(&self, args: Inputs<'_, 'static, T>, at: &State) -> Result<Tensor<'static, T>> {
        let keeping = self.get();
        if keeping.kept.borrow().is_none() {
            // Taken by an earlier replay that recorded: the op runs again.
            return run(keeping.op.clone(), &mut { args });
        }
        let mut args = args;
        if args.len() == 0 {
            // A values-only replay: the kept output, without running the op or its inputs.
            return Ok(keeping.kept_output(at));
        }
        let (recorder, cx) = prepare(&mut args, keeping.op.held(), keeping.op.reads_views())?;
        match recorder {
            Some(recorder) if !recorder.on_tape() => {
                let run = keeping.kept.borrow_mut().take().expect("checked above");
                Ok(bind_kept(keeping.op.clone(), recorder, &cx, run))
            }
            Some(recorder) => run_prepared(keeping.op.clone(), Some(recorder), cx),
            // Nothing it read carries a graph: the values are all a replay needs.
            None => Ok(keeping.kept_output(cx.scope())),
        }
    }

    fn reads_args(&self, recording: bool) -> bool {
        recording || self.get().kept.borrow().is_none()
    }

    fn reruns(&self) -> bool {
        self.get().kept.borrow().is_none()
    }

    fn kept_bytes(&self) -> usize {
        let Some(run) = &*self.get().kept.borrow() else {
            return 0;
        };
        let output = run.output.buffer_addr();
        let mut bytes = run.output.allocated_bytes();
        run.saved.each(&mut |t| {
            let (size, addr) = t.buffer();
            if addr != output {
                bytes += size;
            }
        });
        bytes
    }

    fn move_accounting(&self, target: &State) {
        let keeping = self.get();
        let mut each = |t: &dyn sealed::Tensorish| t.move_accounting(target);
        keeping.op.held().each(&mut each);
        if let Some(run) = &*keeping.kept.borrow() {
            run.output.move_accounting(target);
            run.saved.each(&mut each);
        }
    }

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
    }
}

/// The node of the kept output of `run` in a replay that records: the op's record, with the
/// inputs of this replay (`cx`'s) in the places the forward saved its own, so that the backward
/// reads the recomputed inputs and the kept output, and gives the plain backward's gradients.
fn bind_kept<T: DType, O: Op<T>>(
    op: O,
    recorder: Recorder<T>,
    cx: &Forward<'_, 'static, T>,
    run: KeptRun<O, T>,
) -> Tensor<'static, T> {
    let KeptRun {
        output,
        mut saved,
        inputs,
    } = run;
    let mut visit = 0;
    saved.each_mut(&mut |slot| {
        if let Some(&(_, i)) = inputs.iter().find(|&&(v, _)| v == visit) {
            if let Some(t) = slot.downcast_mut::<Tensor<'static, T>>() {
                *t = cx.input(i).saved();
            }
        }
        visit += 1;
    });
    let shapes = cx
        .inputs()
        .map(|t| Some(Dims::from_slice(t.shape())))
        .collect();
    let mut out = output.alias_in(cx.scope());
    drop(output);
    finish(recorder, &mut out, op, Some(saved), shapes);
    out
}

/// Runs `op` on a tape that keeps its output: its forward saves what its backward needs, and the
/// tape keeps the output and that, less the handles on the op's inputs (which a replay
/// recomputes), so the inputs go back to the pool as in a tape's other ops.
#[inline(never)]
fn run_keeping<'s, T: DType, O: Op<T>>(
    op: O,
    recorder: Recorder<T>,
    mut cx: Forward<'_, 's, T>,
) -> Result<Tensor<'s, T>> {
    // The inputs as the forward reads them, to find them among what it saves.
    let inputs: RecycledVec<Tensor<'static, T>> = cx.inputs().map(Tensor::saved).collect();
    cx.saving = true;
    let (mut out, saved) = with_mode(Mode::Off, || op.forward(&mut cx))?;
    out.set_scope(cx.scope);
    let Some(saved) = saved else {
        // An op that saves nothing for its backward cannot be bound: it runs again.
        let step = recycle::slot(Record {
            op,
            saved: None,
            shapes: PerInput::default(),
            _element: std::marker::PhantomData,
        });
        out.node = Some(recorder.node(step, &out));
        return Ok(out);
    };
    let output = out.saved();
    let mut saved = saved.rebrand(Token(()));
    let mut at_inputs = RecycledVec::new();
    let mut visit = 0;
    saved.each_mut(&mut |slot| {
        if let Some(t) = slot.downcast_mut::<Tensor<'static, T>>() {
            if !t.same_view(&output) {
                if let Some(i) = inputs.iter().position(|x| t.same_view(x)) {
                    at_inputs.push((visit, i));
                    // Until a replay gives the input back: a handle on the output, which the
                    // tape keeps anyway.
                    *t = output.saved();
                }
            }
        }
        visit += 1;
    });
    drop(inputs);
    let step = recycle::slot(Keeping {
        op,
        kept: RefCell::new(Some(KeptRun {
            output,
            saved,
            inputs: at_inputs,
        })),
    });
    let (tape, args) = recorder.tape.expect("only a tape keeps outputs");
    let value = tape.borrow_mut().push(Step(Some(step)), args);
    out.node = Some(Node::taped(&tape, value, &out.rents_in));
    Ok(out)
}

impl<'s, T: DType> Tensor<'s, T> {
    /// Runs `op` on `inputs` (see [`Op`]): recorded, when an input carries a gradient graph, so
    /// that a backward differentiates through it and a `#[checkpoint]` replays it. The output
    /// belongs to the deepest of the inputs' scopes. Fails with the op's error, or with
    /// [`Error::NoInputs`] for an empty list of inputs (the output would belong to no scope).
    pub fn try_apply<O: Op<T>>(op: O, inputs: &[&Tensor<'s, T>]) -> Result<Tensor<'s, T>> {
        // The output's scope is the deepest of the inputs': an op needs one.
        if inputs.is_empty() {
            return Err(Error::NoInputs { op: op.name() });
        }
        run(op, &mut Inputs::Slice(inputs))
    }

    crate::error::panicking! {
        /// Runs `op` on `inputs`.
        pub fn apply<O: Op<T>>(op: O, inputs: &[&Tensor<'s, T>]) -> Tensor<'s, T> = Self::try_apply;
    }
}

/// Runs `op` on `inputs`, recording it if one of them carries a graph: the one way every op with a
/// derivative runs.
pub(crate) fn run<'r, 's, T: DType, O: Op<T>>(
    op: O,
    inputs: &'r mut Inputs<'r, 's, T>,
) -> Result<Tensor<'s, T>> {
    // A trace tags what the op rents (its output, copies of views among its inputs) with its name.
    let _op = crate::trace::op(|| op.name());
    let (recorder, cx) = prepare(inputs, op.held(), op.reads_views())?;
    run_prepared(op, recorder, cx)
}

/// [`run`] after [`prepare`].
#[inline(always)]
fn run_prepared<'s, T: DType, O: Op<T>>(
    op: O,
    recorder: Option<Recorder<T>>,
    mut cx: Forward<'_, 's, T>,
) -> Result<Tensor<'s, T>> {
    let keeps = recorder.as_ref().is_some_and(|r| r.keeps(op.name()));
    if keeps {
        let recorder = recorder.expect("a recorder keeps");
        return run_keeping(op, recorder, cx);
    }
    // Read before the forward, which may take its inputs; only a graph's record checks them (a
    // tape's runs the op again, with a record of its own, when the backward needs it).
    let shapes = match cx.saving {
        true => cx
            .inputs()
            .map(|t| Some(Dims::from_slice(t.shape())))
            .collect(),
        false => PerInput::default(),
    };
    // The op's own record is what counts: the ops its forward calls record nothing (they could
    // only record when this op does).
    let (mut out, saved) = match recorder {
        Some(_) => with_mode(Mode::Off, || op.forward(&mut cx)),
        None => op.forward(&mut cx),
    }?;
    out.set_scope(cx.scope);
    match recorder {
        Some(recorder) => {
            if let Some((tape, _)) = &recorder.tape {
                tape.borrow_mut().count(op.name(), out.data_bytes());
            }
            finish(recorder, &mut out, op, saved, shapes)
        }
        // An output written into an input's buffer, or aliasing it, must not keep that input's
        // node when nothing records (inside a backward).
        None => out.node = None,
    }
    Ok(out)
}

/// Runs `kernel` on `inputs` as an op without a derivative (`map`, `zip_map`, `map_lanes`):
/// recorded as such when an input carries a graph, so that a backward through its output fails
/// naming `name` (and a tape keeps the output, since the kernel cannot run again).
pub(crate) fn run_opaque<'r, 's, T: DType>(
    name: &'static str,
    inputs: &'r mut Inputs<'r, 's, T>,
    kernel: impl FnOnce(&mut Forward<'r, 's, T>) -> Result<Tensor<'s, T>>,
) -> Result<Tensor<'s, T>> {
    let _op = crate::trace::op(|| name);
    let (recorder, mut cx) = prepare(inputs, &(), false)?;
    let mut out = match recorder {
        Some(_) => with_mode(Mode::Off, || kernel(&mut cx)),
        None => kernel(&mut cx),
    }?;
    out.set_scope(cx.scope);
    Ok(opaque(recorder, out, name))
}

/// The recorder of an op on `inputs` (if it records) and its forward's context: the output's
/// scope is the deepest of the inputs' and of `held`'s tensors' scopes, whatever their element
/// types (the one rule for where a result of several tensors rents). Views among the inputs are
/// copied contiguous into that scope unless the op `reads_views`.
#[inline(always)]
fn prepare<'r, 's, T: DType>(
    inputs: &'r mut Inputs<'r, 's, T>,
    held: &dyn Kept,
    reads_views: bool,
) -> Result<(Option<Recorder<T>>, Forward<'r, 's, T>)> {
    let count = inputs.len();
    // One pass for the deepest scope, whether any input carries a graph and whether any is a
    // view (the common case of an op that records nothing on contiguous inputs looks no
    // further).
    let (mut scope, mut graph, mut views) = (None, false, false);
    for t in (0..count).filter_map(|i| inputs.get(i)) {
        scope = Some(scope.map_or(&t.rents_in, |s| deeper(s, &t.rents_in)));
        graph |= t.node.is_some();
        views |= !t.is_contiguous();
    }
    let mut scope = scope.expect("an op has an input").clone();
    held.each(&mut |t| scope = deeper(&scope, t.scope()).clone());
    if views && !reads_views {
        inputs.make_contiguous(&scope)?;
    }
    let recorder = graph
        .then(|| Recorder::of((0..count).filter_map(|i| inputs.get(i))))
        .flatten();
    let saving = recorder.as_ref().is_some_and(Recorder::saves);
    Ok((
        recorder,
        Forward {
            inputs,
            count,
            scope,
            saving,
        },
    ))
}

/// Sets `out`'s node to `op`'s, recorded by `recorder`. Out of line: an op that records nothing
/// (inference, the ops a backward runs) never reaches it, and `run` stays small where it inlines.
#[inline(never)]
fn finish<'s, T: DType, O: Op<T>>(
    recorder: Recorder<T>,
    out: &mut Tensor<'s, T>,
    op: O,
    saved: Option<O::Saved<'s>>,
    shapes: PerInput<Dims>,
) {
    let record = recycle::slot(Record {
        op,
        saved: saved.map(|saved| saved.rebrand(Token(()))),
        shapes,
        _element: std::marker::PhantomData,
    });
    out.node = Some(recorder.node(record, out));
}

/// A record of an op on a tape, or in a graph, made from `record`.
pub(crate) trait IntoRule<T: DType>: Recorded<T> + Replayable<T> + 'static {}

impl<T: DType, X: Recorded<T> + Replayable<T> + 'static> IntoRule<T> for X {}

/// Marks `out` as made by an op without a derivative, when recording.
pub(crate) fn opaque<'s, T: DType>(
    recorder: Option<Recorder<T>>,
    mut out: Tensor<'s, T>,
    name: &'static str,
) -> Tensor<'s, T> {
    out.node = recorder.map(|r| {
        let kept = r.on_tape().then(|| out.saved());
        r.node(recycle::slot(Opaque { name, kept }), &out)
    });
    out
}

impl<T: DType> Recorder<T> {
    /// The node of `out`, made by the op `record`: on a tape, the op alone; else the op and what it
    /// saved.
    fn node<X: IntoRule<T>>(self, record: Box<X>, out: &Tensor<'_, T>) -> super::NodeRef<T> {
        match self.tape {
            Some((tape, args)) => {
                let value = tape.borrow_mut().push(Step(Some(record)), args);
                Node::taped(&tape, value, &out.rents_in)
            }
            None => Node::op(self.inputs, Rule::new(record), &out.rents_in),
        }
    }

    /// Whether the op's forward must save what its backward needs: not on a tape, which keeps
    /// only how to run the op again.
    fn saves(&self) -> bool {
        self.tape.is_none()
    }

    fn on_tape(&self) -> bool {
        self.tape.is_some()
    }

    /// Whether the op `name` is on a tape that keeps its output (selective saving).
    fn keeps(&self, name: &str) -> bool {
        self.tape
            .as_ref()
            .is_some_and(|(tape, _)| tape.borrow().keeps(name))
    }
}

/// The cell a node keeps its record in, taken (and so released) when the backward runs it.
pub(crate) type RuleCell<T> = RefCell<Option<Rule<T>>>;
