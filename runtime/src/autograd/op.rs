//! The op core: an op is one record, [`Op`], holding its forward, what its backward saves, its
//! backward, and (since a checkpointed replay runs the forward again) how it replays. The graph, a
//! checkpoint's tape and the accounting walk all read that one record; the library's own ops and
//! an op written outside the crate are the same kind of thing.
//!
//! ```
//! use tensorscope_runtime::autograd::{Backward, Forward, Grads, Op, Saved};
//! use tensorscope_runtime::{Pool, Result, Tensor, TensorOps};
//!
//! /// `x^3`, with its derivative `3 x^2`.
//! #[derive(Clone)]
//! struct Cube;
//!
//! impl Op<f32> for Cube {
//!     type Saved = Saved<f32>; // the input
//!
//!     fn name(&self) -> &'static str {
//!         "cube"
//!     }
//!
//!     fn forward<'s>(&self, cx: &mut Forward<'s, f32>) -> Result<(Tensor<'s, f32>, Option<Saved<f32>>)> {
//!         let x = cx.input(0);
//!         let y = x.try_zip_map(x, |a, _| a * a * a)?;
//!         Ok((y, cx.saving().then(|| cx.save(x))))
//!     }
//!
//!     fn backward<'b>(&self, x: Saved<f32>, grad: Tensor<'b, f32>, cx: &Backward<'b>) -> Result<Grads<'b, f32>> {
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

use crate::element::DType;
use crate::error::{Error, Result};
use crate::recycle::{self, Few, Slot};
use crate::scope::{deeper, State};
use crate::tensor::Tensor;

use super::grads::Gradients;
use super::{with_mode, Mode, Node, PerInput, Recorder};
use sealed::Held as _;

/// An op that records its backward: declared once, beside its forward.
///
/// - [`Op::forward`] computes the output from the inputs, and when the output will be
///   differentiated ([`Forward::saving`]), also what the backward needs, as PyTorch's
///   `ctx.save_for_backward`: aliases of inputs and outputs ([`Forward::save`]), never copies.
/// - [`Op::backward`] gives the inputs' gradients from the output's and what was saved.
/// - Under `#[checkpoint]` a layer step keeps the op itself, not what it saved, and runs its
///   forward again when the backward needs the step: the same kernels on the same values, so the
///   same bits. An op's forward must therefore be deterministic in its inputs and its own fields.
///
/// The op's fields are its parameters (an axis, a scalar, ids or a mask as [`Saved`] tensors,
/// returned by [`Op::held`]); run it with [`Tensor::try_apply`].
pub trait Op<T: DType>: Clone + 'static {
    /// What the backward needs from the forward: [`Saved`] tensors, numbers, shapes, and tuples,
    /// arrays, `Vec`s and `Option`s of them.
    type Saved: Held;

    /// The op's name, as errors give it.
    fn name(&self) -> &'static str;

    /// The output of the op on `cx`'s inputs, and, if [`Forward::saving`], what
    /// [`Op::backward`] needs (`None` otherwise). The output must be rented through `cx`
    /// ([`Forward::rent`]) or computed by other ops on the inputs, so that it belongs to the
    /// deepest of the inputs' scopes. Errors are the op's (shapes, values, budget).
    #[allow(clippy::type_complexity)]
    fn forward<'s>(&self, cx: &mut Forward<'s, T>) -> Result<(Tensor<'s, T>, Option<Self::Saved>)>;

    /// The gradients of the inputs given `grad`, the gradient of the output: one per input, in
    /// order, `None` for an input that needs none ([`Backward::needs`]). Saved tensors come back
    /// with [`Saved::get`]; everything rents in `grad`'s scope.
    fn backward<'b>(
        &self,
        saved: Self::Saved,
        grad: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>>;

    /// The tensors the op holds as parameters (ids, a mask): the op's output belongs to the deepest
    /// of their scopes and its inputs', and an escape moves their accounting with the graph.
    fn held(&self) -> &dyn Held {
        &()
    }
}

/// A tensor kept for a backward: an alias (no copy) with no ops of its own, which
/// [`Saved::get`] hands back as a tensor of the backward's scope.
pub struct Saved<U: DType>(pub(crate) Tensor<'static, U>);

impl<U: DType> Saved<U> {
    /// The saved values as a tensor of the backward's scope (an alias, no copy).
    pub fn get<'b>(&self, cx: &Backward<'b>) -> Tensor<'b, U> {
        self.0.alias_in(&cx.at)
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        self.0.shape()
    }

    /// The elements in row-major order.
    pub fn as_slice(&self) -> &[U] {
        self.0.as_slice()
    }
}

impl<U: DType> Clone for Saved<U> {
    fn clone(&self) -> Self {
        Saved(self.0.clone())
    }
}

/// What an op may keep: [`Saved`] tensors, numbers and shapes, and tuples, arrays, `Vec`s and
/// `Option`s of them. Sealed: an op's record is made of these, so that the graph's accounting
/// finds every tensor it keeps.
pub trait Held: sealed::Held + 'static {}

impl<X: sealed::Held + 'static> Held for X {}

// The sealed traits name the crate's own scope type: they cannot be named or implemented outside
// the crate, so nothing outside ever sees it.
#[allow(private_interfaces)]
pub(crate) mod sealed {
    use crate::scope::State;

    /// How the graph's accounting walks what an op keeps.
    pub trait Held {
        /// Calls `f` with the scope and a mover of every tensor held.
        fn each(&self, f: &mut dyn FnMut(&dyn Tensorish));
    }

    /// A held tensor of any element type.
    pub trait Tensorish {
        /// The scope its ops rent in.
        fn scope(&self) -> &State;
        /// Moves its accounting to `target` if `target` outlives its owner.
        fn move_accounting(&self, target: &State);
    }
}

#[allow(private_interfaces)] // sealed: see `sealed`
impl<U: DType> sealed::Tensorish for Saved<U> {
    fn scope(&self) -> &State {
        &self.0.rents_in
    }
    fn move_accounting(&self, target: &State) {
        self.0.move_accounting(target);
    }
}

impl<U: DType> sealed::Held for Saved<U> {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        f(self)
    }
}

macro_rules! held_plain {
    ($($t:ty),*) => {$(
        impl sealed::Held for $t {
            fn each(&self, _: &mut dyn FnMut(&dyn sealed::Tensorish)) {}
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
    &'static str
);

impl<X: sealed::Held> sealed::Held for Option<X> {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        if let Some(x) = self {
            x.each(f)
        }
    }
}

impl<X: sealed::Held> sealed::Held for Vec<X> {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        self.iter().for_each(|x| x.each(f))
    }
}

impl<X: sealed::Held, const N: usize> sealed::Held for [X; N] {
    fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
        self.iter().for_each(|x| x.each(f))
    }
}

macro_rules! held_tuple {
    ($($x:ident $i:tt),*) => {
        impl<$($x: sealed::Held),*> sealed::Held for ($($x,)*) {
            fn each(&self, f: &mut dyn FnMut(&dyn sealed::Tensorish)) {
                $(self.$i.each(f);)*
            }
        }
    };
}
held_tuple!(A 0, B 1);
held_tuple!(A 0, B 1, C 2);
held_tuple!(A 0, B 1, C 2, D 3);

/// The gradients of an op's inputs, one per input in order (`None` where none is needed): what
/// [`Op::backward`] returns. Made from an array (`Grads::from([Some(dx), None])`) or an iterator.
pub struct Grads<'b, T: DType>(pub(crate) PerInput<Tensor<'static, T>>, PhantomData<&'b ()>);

impl<'b, T: DType, const N: usize> From<[Option<Tensor<'b, T>>; N]> for Grads<'b, T> {
    fn from(grads: [Option<Tensor<'b, T>>; N]) -> Self {
        grads.into_iter().collect()
    }
}

impl<'b, T: DType> FromIterator<Option<Tensor<'b, T>>> for Grads<'b, T> {
    fn from_iter<I: IntoIterator<Item = Option<Tensor<'b, T>>>>(iter: I) -> Self {
        // The brand is dropped inside the engine only: no `Grads` hands a tensor back out.
        let grads = iter.into_iter().map(|g| g.map(Tensor::into_unbranded));
        Grads(grads.collect(), PhantomData)
    }
}

/// An op's input as a caller gives it: borrowed, or owned (a unique owned tensor can be written
/// in place).
pub(crate) enum Arg<'r, 's, T: DType> {
    Owned(Tensor<'s, T>),
    Borrowed(&'r Tensor<'s, T>),
}

/// The inputs of an op, as the core keeps them: handles without their brand (a borrowed input as
/// an alias, which is never the only handle, so never written in place), held inline for one or
/// two.
pub(crate) struct Inputs<T: DType>(Few<Option<Tensor<'static, T>>>);

impl<'r, 's, T: DType> FromIterator<Arg<'r, 's, T>> for Inputs<T> {
    fn from_iter<I: IntoIterator<Item = Arg<'r, 's, T>>>(iter: I) -> Self {
        let inputs = iter.into_iter().map(|arg| {
            Some(match arg {
                Arg::Owned(t) => t.into_unbranded(),
                Arg::Borrowed(t) => t.clone().into_unbranded(),
            })
        });
        Inputs(inputs.collect())
    }
}

/// An op's inputs as the core takes them.
pub(crate) fn args<'s, T: DType, const N: usize>(args: [Arg<'_, 's, T>; N]) -> Inputs<T> {
    args.into_iter().collect()
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
            Arg::Owned(t) if t.is_unique() && t.shape() == shape => Ok(t),
            other => Err(other),
        }
    }

    /// A tensor of `scope` to write the result into: the operand itself if it can be written in
    /// place, else a fresh rent of the same shape holding a copy.
    pub(crate) fn into_writable_copy(self, scope: &State) -> Result<Tensor<'s, T>> {
        let shape = ndarray::IxDyn(self.tensor().shape());
        match self.into_writable(ndarray::Dimension::slice(&shape)) {
            Ok(t) => Ok(t.with_scope(scope)),
            Err(src) => {
                let src = src.tensor();
                let mut out = Tensor::try_rent_in(scope, src.shape())?;
                out.unique_slice_mut().copy_from_slice(src.as_slice());
                Ok(out)
            }
        }
    }
}

/// The forward of one op: its inputs, the scope its output belongs to, and whether the backward
/// will run.
pub struct Forward<'s, T: DType> {
    inputs: Inputs<T>,
    /// How many inputs there are (`inputs` pads a single one).
    count: usize,
    scope: State,
    saving: bool,
    _brand: PhantomData<&'s ()>,
}

impl<'s, T: DType> Forward<'s, T> {
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
        self.inputs.0[i].as_ref().expect("an input taken")
    }

    /// Whether the output will be differentiated: only then must the forward return what the
    /// backward needs.
    pub fn saving(&self) -> bool {
        self.saving
    }

    /// `t` kept for the backward: an alias, no copy. A saved input is no longer the only handle on
    /// its buffer, so no op overwrites it in place.
    pub fn save<U: DType>(&self, t: &Tensor<'s, U>) -> Saved<U> {
        Saved(t.saved())
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

    /// Input `i`, taken: owned, and so written in place if it is the only handle on its buffer
    /// (which only an input the caller gave by value can be).
    pub(crate) fn take<'r>(&mut self, i: usize) -> Arg<'r, 's, T> {
        Arg::Owned(self.inputs.0[i].take().expect("an input taken twice"))
    }

    /// Every input, in order.
    pub(crate) fn inputs(&self) -> impl Iterator<Item = &Tensor<'s, T>> + Clone + '_ {
        self.inputs.0[..self.count]
            .iter()
            .map(|i| i.as_ref().expect("an input taken"))
    }
}

/// The backward of one op: which inputs need a gradient, and the scope everything rents in.
pub struct Backward<'b> {
    needs: Few<bool>,
    at: State,
    _brand: std::marker::PhantomData<&'b ()>,
}

impl<'b> Backward<'b> {
    /// Whether input `i` needs a gradient (an input that carries no graph does not).
    pub fn needs(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    /// Rents a tensor of zeros of `shape` in the backward's scope. Fails with a budget error.
    pub fn zeros<U: DType>(&self, shape: &[usize]) -> Result<Tensor<'b, U>> {
        Tensor::try_rent_zeroed_in(&self.at, shape)
    }

    /// Rents a tensor of `shape` with unspecified contents in the backward's scope. Fails with a
    /// budget error.
    pub fn rent<U: DType>(&self, shape: &[usize]) -> Result<Tensor<'b, U>> {
        Tensor::try_rent_in(&self.at, shape)
    }

    /// The scope the backward runs in.
    pub(crate) fn at(&self) -> &State {
        &self.at
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

/// What a checkpoint's tape keeps of an op: how to run it again, without what it saved.
pub(crate) trait Replayable<T: DType> {
    /// Runs the op again on `args` (recording if they carry graphs).
    fn replay(&self, args: Inputs<T>) -> Result<Tensor<'static, T>>;

    /// The output kept by an op that cannot run again (no derivative), with its name.
    fn kept(&self) -> Option<(&'static str, &Tensor<'static, T>)> {
        None
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

/// An op and what its forward saved (nothing on a tape).
struct Record<O: Op<T>, T: DType> {
    op: O,
    saved: Option<O::Saved>,
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
        let saved = record.saved.take().ok_or(Error::GraphConsumed)?;
        let cx = Backward {
            needs: needs.iter().copied().collect(),
            at: at.clone(),
            _brand: std::marker::PhantomData,
        };
        Ok(record.op.backward(saved, grad, &cx)?.0)
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
    fn replay(&self, args: Inputs<T>) -> Result<Tensor<'static, T>> {
        run(self.get().op.clone(), args)
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
    fn replay(&self, args: Inputs<T>) -> Result<Tensor<'static, T>> {
        let opaque = self.get();
        let kept = opaque
            .kept
            .as_ref()
            .expect("an opaque op on a tape keeps its output");
        let at = &args.0[0].as_ref().expect("the step's input").rents_in;
        Ok(super::barrier(kept.alias_in(at), opaque.name))
    }

    fn kept(&self) -> Option<(&'static str, &Tensor<'static, T>)> {
        let opaque = self.get();
        Some((opaque.name, opaque.kept.as_ref()?))
    }

    fn move_accounting(&self, target: &State) {
        Recorded::move_accounting(self, target)
    }

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
    }
}

impl<'s, T: DType> Tensor<'s, T> {
    /// Runs `op` on `inputs` (see [`Op`]): recorded, when an input carries a gradient graph, so
    /// that a backward differentiates through it and a `#[checkpoint]` replays it. The output
    /// belongs to the deepest of the inputs' scopes. Fails with the op's error.
    pub fn try_apply<O: Op<T>>(op: O, inputs: &[&Tensor<'s, T>]) -> Result<Tensor<'s, T>> {
        run(op, inputs.iter().map(|&t| Arg::Borrowed(t)).collect())
    }

    crate::error::panicking! {
        /// Runs `op` on `inputs`.
        pub fn apply<O: Op<T>>(op: O, inputs: &[&Tensor<'s, T>]) -> Tensor<'s, T> = Self::try_apply;
    }
}

/// Runs `op` on `inputs`, recording it if one of them carries a graph: the one way every op with a
/// derivative runs.
pub(crate) fn run<'s, T: DType, O: Op<T>>(op: O, inputs: Inputs<T>) -> Result<Tensor<'s, T>> {
    let (recorder, mut cx) = prepare(inputs, op.held());
    let (out, saved) = with_mode(Mode::Off, || op.forward(&mut cx))?;
    let out = out.with_scope(&cx.scope);
    Ok(finish(recorder, out, op, saved))
}

/// Runs `kernel` on `inputs` as an op without a derivative (`map`, `zip_map`, `map_lanes`):
/// recorded as such when an input carries a graph, so that a backward through its output fails
/// naming `name` (and a tape keeps the output, since the kernel cannot run again).
pub(crate) fn run_opaque<'s, T: DType>(
    name: &'static str,
    inputs: Inputs<T>,
    kernel: impl FnOnce(&mut Forward<'s, T>) -> Result<Tensor<'s, T>>,
) -> Result<Tensor<'s, T>> {
    let (recorder, mut cx) = prepare(inputs, &());
    let out = with_mode(Mode::Off, || kernel(&mut cx))?.with_scope(&cx.scope);
    Ok(opaque(recorder, out, name))
}

/// The recorder of an op on `inputs` (if it records) and its forward's context: the output's
/// scope is the deepest of the inputs' and of `held`'s tensors' scopes, whatever their element
/// types (the one rule for where a result of several tensors rents).
fn prepare<'s, T: DType>(
    inputs: Inputs<T>,
    held: &dyn Held,
) -> (Option<Recorder<T>>, Forward<'s, T>) {
    let tensors = || inputs.0.iter().flatten();
    let recorder = Recorder::of(tensors());
    let mut scope = tensors()
        .map(|t| &t.rents_in)
        .reduce(deeper)
        .expect("an op has an input")
        .clone();
    held.each(&mut |t| scope = deeper(&scope, t.scope()).clone());
    let saving = recorder.as_ref().is_some_and(Recorder::saves);
    let count = tensors().count();
    (
        recorder,
        Forward {
            inputs,
            count,
            scope,
            saving,
            _brand: PhantomData,
        },
    )
}

/// Sets `out`'s node: `op`'s, when `recorder` is given; none otherwise (an output written into an
/// input's buffer must not keep that input's node).
fn finish<'s, T: DType, O: Op<T>>(
    recorder: Option<Recorder<T>>,
    mut out: Tensor<'s, T>,
    op: O,
    saved: Option<O::Saved>,
) -> Tensor<'s, T> {
    out.node = recorder.map(|r| {
        let record = recycle::slot(Record {
            op,
            saved,
            _element: std::marker::PhantomData,
        });
        r.node(record, &out)
    });
    out
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
            Some((tape, mut args)) => {
                let value = tape.borrow_mut().push(Step(Some(record)), &mut args);
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
}

/// The cell a node keeps its record in, taken (and so released) when the backward runs it.
pub(crate) type RuleCell<T> = RefCell<Option<Rule<T>>>;
