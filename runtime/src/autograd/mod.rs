//! Reverse-mode automatic differentiation on scoped tensors.
//!
//! Ops record what their backward needs only when an input carries a gradient graph: a parameter
//! bound in a training scope ([`Pool::train`](crate::Pool::train), [`Scope::train`](crate::Scope::train)), or a tensor
//! marked with [`Tensor::requires_grad`]. A forward with no such input records nothing and costs
//! what it did before. [`Tensor::backward`] walks the graph from a loss and returns the
//! [`Gradients`] of every parameter and marked tensor it depends on, as tensors of the loss's scope.
//!
//! ```
//! use tensorscope::{Param, Pool, TensorOps};
//!
//! let pool = Pool::with_max_memory_mb(16);
//! let w = Param::from_slice(&pool, &[2, 1], &[0.5f64, -1.0]);
//! let grad = pool.train(|s| {
//!     let x = s.from_slice::<f64>(&[1, 2], &[3.0, 4.0]);
//!     let loss = x.matmul(&w).tanh().try_mse(&s.zeros(&[1, 1])).unwrap();
//!     let grads = loss.backward().unwrap();
//!     grads.get(&w).unwrap().to_vec()
//! });
//! // d/dw mean((tanh(x w))^2) = 2 tanh(x w) (1 - tanh(x w)^2) x
//! let y = (3.0f64 * 0.5 - 4.0).tanh();
//! let expected: Vec<f64> = [3.0, 4.0].iter().map(|x| 2.0 * y * (1.0 - y * y) * x).collect();
//! assert!(grad.iter().zip(&expected).all(|(g, e)| (g - e).abs() < 1e-12));
//! ```
//!
//! **Memory.** Saved tensors are aliases of the op's inputs or output, never copies; a node and what
//! it saved are freed when the last tensor that needs them drops, and `backward` releases each
//! node's saved tensors as soon as its rule has run. A tensor saved for backward has more than one
//! handle, so by-value ops never overwrite it (they rent instead): the graph's values cannot be
//! corrupted by in-place ops, and writing into a graph tensor through `view_mut` is an error.
//! Escaping a tensor that carries a graph moves the accounting of everything the graph keeps, as it
//! does for the tensor's own buffer.

mod check;
mod grads;
mod op;
mod tape;

use std::cell::{Cell, RefCell};

use crate::dims::Dims;

pub use check::{check_gradients, GradCheck};
pub use grads::Gradients;
pub(crate) use op::{args, opaque, run, run_opaque, Arg, Inputs, Recorded, Rule, RuleCell};
pub use op::{Backward, Forward, Grads, Held, Kept, Op, Saved};
pub(crate) use tape::{Arg as TapeArg, Keep, Outside, Replayed, SharedTape, Tape};

use crate::element::{DType, Element};
use crate::error::{Error, Result, Shape};
use crate::recycle::{Few, RecycledRc, RecycledVec};
use crate::scope::{deeper, State};
use crate::tensor::Tensor;

/// What ops record on this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The default: ops on tensors that carry a graph record; parameters are not leaves.
    Infer,
    /// Inside [`Pool::train`](crate::Pool::train) / [`Scope::train`]: parameters used by ops are
    /// leaves too.
    Train,
    /// Inside [`Scope::no_grad`](crate::Scope::no_grad) and backward passes: nothing records.
    Off,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Infer) };
    /// The number of the last backward walk started on this thread (see [`Node::walk`]).
    static WALKS: Cell<u64> = const { Cell::new(0) };
    /// What is told when the backward called on a tensor ends (see [`at_backward_end`]).
    static AT_END: std::cell::RefCell<Vec<std::rc::Rc<dyn BackwardEnd>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Something to tell when a backward ends (see [`at_backward_end`]).
pub(crate) trait BackwardEnd {
    /// The backward it waited for has ended, by success or failure.
    fn ended(&self);
}

/// Tells `hook` once, when the backward called on a tensor (the outermost one, not a nested
/// backward a rule runs) ends on this thread, whether it succeeds or fails: how a checkpointed
/// region's backward learns that the training step's backward is done. A shared handle, so that
/// registering a clone allocates nothing.
pub(crate) fn at_backward_end(hook: std::rc::Rc<dyn BackwardEnd>) {
    AT_END.with_borrow_mut(|hooks| hooks.push(hook));
}

/// The recording mode on this thread.
pub(crate) fn mode() -> Mode {
    MODE.get()
}

/// Runs `f` with the recording mode `mode`, restoring the previous mode afterwards, also when `f`
/// panics.
pub(crate) fn with_mode<R>(mode: Mode, f: impl FnOnce() -> R) -> R {
    with_local(&MODE, mode, f)
}

/// Runs `f` with the thread-local setting `key` set to `value`, restoring the previous value
/// afterwards, also when `f` panics: how the recording mode and the products' precision
/// (`ops::autocast`) are set for a closure.
pub(crate) fn with_local<X: Copy + 'static, R>(
    key: &'static std::thread::LocalKey<Cell<X>>,
    value: X,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<X: Copy + 'static>(&'static std::thread::LocalKey<Cell<X>>, X);
    impl<X: Copy + 'static> Drop for Restore<X> {
        fn drop(&mut self) {
            self.0.set(self.1);
        }
    }
    let _restore = Restore(key, key.replace(value));
    f()
}

pub(crate) use crate::param::next_key;

/// A node of a gradient graph: a leaf (a parameter or a marked tensor, by key) or the op that made a
/// tensor, with the nodes of its inputs and the rule (and saved tensors) of its backward.
pub(crate) struct Node<T: DType> {
    /// The scope whose accounting holds what the rule saved: where the op ran, moved by escapes.
    owner: RefCell<State>,
    /// The backward walk that last reached the node, and the node's place in that walk's order:
    /// how a walk knows the nodes it has seen and finds where a node's gradient waits, with no map.
    walk: Cell<(u64, usize)>,
    kind: Kind<T>,
}

/// A handle on a graph node; its record is reused once the graph is freed (see `recycle`).
pub(crate) type NodeRef<T> = RecycledRc<Node<T>>;

/// The graph inputs of an op, `None` for inputs that need no gradient; and the gradients of an op's
/// inputs, `None` where none is needed. Held inline for ops of one or two inputs.
pub(crate) type PerInput<X> = Few<Option<X>>;

enum Kind<T: DType> {
    /// A parameter (with the identity of its values and its shape) or a marked tensor (`None`).
    Leaf {
        key: u64,
        version: Option<(u64, Dims)>,
    },
    Op {
        /// The inputs' nodes.
        inputs: PerInput<NodeRef<T>>,
        /// Taken (and so released) when backward runs it.
        rule: RuleCell<T>,
    },
    /// A value of a layer step of a checkpointed region, recorded on the step's tape: the step's
    /// input (0) or the output of the tape's op `value - 1`.
    Taped { tape: SharedTape<T>, value: usize },
}

impl<T: DType> Node<T> {
    /// A node of `kind` held by `owner`.
    fn new(kind: Kind<T>, owner: &State) -> NodeRef<T> {
        NodeRef::new(Node {
            owner: RefCell::new(owner.clone()),
            walk: Cell::new((0, 0)),
            kind,
        })
    }

    /// A leaf for `key` held by `owner`; `version` identifies the parameter values it was made
    /// from, with their shape (`None` for a marked tensor).
    pub(crate) fn leaf(key: u64, version: Option<(u64, Dims)>, owner: &State) -> NodeRef<T> {
        Node::new(Kind::Leaf { key, version }, owner)
    }

    /// The leaf key, if this is a leaf.
    pub(crate) fn key(&self) -> Option<u64> {
        match self.kind {
            Kind::Leaf { key, .. } => Some(key),
            Kind::Op { .. } | Kind::Taped { .. } => None,
        }
    }

    /// The value `value` of `tape`, held by `owner`: the step's input is value 0.
    pub(crate) fn taped(tape: &SharedTape<T>, value: usize, owner: &State) -> NodeRef<T> {
        let tape = tape.clone();
        Node::new(Kind::Taped { tape, value }, owner)
    }

    /// `(tape, value)` if this is a value of a layer step's tape.
    pub(crate) fn tape_value(&self) -> Option<(&SharedTape<T>, usize)> {
        match &self.kind {
            Kind::Taped { tape, value } => Some((tape, *value)),
            _ => None,
        }
    }

    /// A node of an op: its graph inputs and its record.
    pub(crate) fn op(inputs: PerInput<NodeRef<T>>, rule: Rule<T>, owner: &State) -> NodeRef<T> {
        let rule = RefCell::new(Some(rule));
        Node::new(Kind::Op { inputs, rule }, owner)
    }

    /// Whether this is a leaf (a parameter or a marked tensor).
    pub(crate) fn is_leaf(&self) -> bool {
        matches!(self.kind, Kind::Leaf { .. })
    }

    /// The leaf's key and version, if this is a leaf.
    pub(crate) fn leaf_parts(&self) -> Option<(u64, Option<(u64, Dims)>)> {
        match &self.kind {
            Kind::Leaf { key, version } => Some((*key, version.clone())),
            _ => None,
        }
    }
}

impl<T: DType> Drop for Node<T> {
    /// Frees a chain of nodes with a loop instead of recursion, so that a graph of a million ops
    /// does not overflow the stack when its last tensor drops.
    fn drop(&mut self) {
        let Kind::Op { inputs, .. } = &mut self.kind else {
            return;
        };
        /// Moves the inputs that only this node holds to `pending` (made only then).
        fn unwrap<T: DType>(
            inputs: &mut [Option<NodeRef<T>>],
            pending: &mut Option<RecycledVec<Node<T>>>,
        ) {
            for input in inputs.iter_mut().filter_map(Option::take) {
                if let Ok(node) = input.into_unique() {
                    pending.get_or_insert_with(RecycledVec::new).push(node);
                }
            }
        }
        let mut pending = None;
        unwrap(inputs, &mut pending);
        while let Some(mut node) = pending.as_mut().and_then(|p| p.pop()) {
            if let Kind::Op { inputs, .. } = &mut node.kind {
                unwrap(inputs, &mut pending);
            }
        }
    }
}

/// The graph inputs of an op about to run: made only when the output must record a node.
pub(crate) struct Recorder<T: DType> {
    inputs: PerInput<NodeRef<T>>,
    /// For an op on a value of a layer step's tape: the tape and what the op reads.
    tape: Option<(SharedTape<T>, RecycledVec<tape::Arg<T>>)>,
}

impl<T: DType> Recorder<T> {
    /// A recorder if recording is on and any of `inputs` carries a graph.
    pub(crate) fn of<'a, 's: 'a>(
        inputs: impl Iterator<Item = &'a Tensor<'s, T>> + Clone,
    ) -> Option<Self> {
        if mode() == Mode::Off || inputs.clone().all(|t| t.node.is_none()) {
            return None;
        }
        // The latest open tape among the inputs': the step being recorded (a value of an earlier
        // step is an outside value, which its region gives; on a closed tape only, the op records
        // a graph node, whose backward fails as one reaching into a region does).
        let tape = inputs
            .clone()
            .filter_map(|t| t.node.as_ref()?.tape_value().map(|(tape, _)| tape))
            .filter(|tape| tape.borrow().is_open())
            .max_by_key(|tape| tape.borrow().seq())
            .cloned();
        Some(match tape {
            Some(tape) => {
                let args = inputs
                    .map(|t| match t.node.as_ref().and_then(|n| n.tape_value()) {
                        Some((on, value)) if SharedTape::ptr_eq(on, &tape) => {
                            tape::Arg::Value(value)
                        }
                        _ => tape::Arg::Outside {
                            node: t.node.clone(),
                            value: t.saved(),
                        },
                    })
                    .collect();
                Recorder {
                    inputs: PerInput::default(),
                    tape: Some((tape, args)),
                }
            }
            None => Recorder {
                inputs: inputs.map(|t| t.node.clone()).collect(),
                tape: None,
            },
        })
    }
}

/// `out` marked as made by an op without a derivative, from inputs that carry a graph: a backward
/// that reaches it fails naming `op`, rather than giving a zero gradient.
pub(crate) fn barrier<'s, U: DType>(out: Tensor<'s, U>, op: &'static str) -> Tensor<'s, U> {
    let recorder = (mode() != Mode::Off).then(|| Recorder {
        inputs: PerInput::default(),
        tape: None,
    });
    opaque(recorder, out, op)
}

/// Moves the accounting of what the graph under `node` saved to `target`, for the nodes held by
/// scopes that `target` outlives. A node's inputs are held by scopes that outlive its own (they
/// were made earlier, in the op's scope or around it), so the walk stops at the first node whose
/// scope outlives `target`: an escape costs the nodes made inside the escaping scope, not the graph.
pub(crate) fn move_graph<T: DType>(node: &NodeRef<T>, target: &State) {
    let mut pending = RecycledVec::new();
    pending.push(node.clone());
    while let Some(node) = pending.pop() {
        {
            let mut owner = node.owner.borrow_mut();
            if !owner.hands_over_to(target) {
                continue;
            }
            *owner = target.clone();
        }
        match &node.kind {
            Kind::Op { inputs, rule } => {
                if let Some(rule) = rule.borrow().as_ref() {
                    rule.get().move_accounting(target);
                }
                pending.extend(inputs.iter().flatten().cloned());
            }
            Kind::Taped { tape, .. } => {
                let tape = tape.borrow();
                tape.move_accounting(target);
                tape.for_each_outside(&mut |(node, _)| pending.extend(node.cloned()));
            }
            Kind::Leaf { .. } => {}
        }
    }
}

/// Runs backward from `root` (its node) with `seed` as its gradient, adding the gradients of the
/// leaves into `grads`. Everything is computed in `at`, the root's scope, with recording off.
///
/// What can be known before running a rule is checked first (a rule already run, an op without a
/// derivative, a parameter used with two copies of its values), so such a pass changes neither
/// `grads` nor the graph. Each leaf's gradient is then added as soon as it is complete, so that no
/// more than one of them waits in memory: a budget error halfway leaves the gradients added so far,
/// and the rules run so far consumed.
pub(crate) fn backward<T: Element>(
    root: &NodeRef<T>,
    seed: Tensor<'static, T>,
    at: &State,
    grads: &mut Gradients<'_, T>,
) -> Result<()> {
    backward_seeded(root, Some(seed), &mut RecycledVec::new(), at, grads)
}

/// [`backward`] from `root` with `seed` (none: nothing flows from the root), where the nodes of
/// `seeds` under `root` start with their gradient so far (`seeds` keeps those not under it): a
/// node's gradients add in the order the walk reaches its consumers, after what it started with,
/// as one walk over the graph these seeds were cut from would add them.
pub(crate) fn backward_seeded<T: Element>(
    root: &NodeRef<T>,
    seed: Option<Tensor<'static, T>>,
    seeds: &mut RecycledVec<(NodeRef<T>, Tensor<'static, T>)>,
    at: &State,
    grads: &mut Gradients<'_, T>,
) -> Result<()> {
    with_mode(Mode::Off, || {
        let order = topological(root);
        check(&order, grads)?;
        // The gradient waiting for each node, by its place in `order`.
        let mut pending: RecycledVec<Option<Tensor<'static, T>>> =
            order.iter().map(|_| None).collect();
        if let Some(last) = pending.last_mut() {
            *last = seed;
        }
        let walk = WALKS.get();
        let mut i = 0;
        while i < seeds.len() {
            match seeds[i].0.walk.get() {
                (w, place) if w == walk && place < pending.len() => {
                    pending[place] = Some(seeds.swap_remove(i).1);
                }
                _ => i += 1,
            }
        }
        // Consumers come after their inputs in `order`: walking it backwards, a node's gradient is
        // complete when its turn comes.
        for (place, node) in order.iter().enumerate().rev() {
            let Some(grad) = pending[place].take() else {
                continue;
            };
            match &node.kind {
                Kind::Leaf { key, version } => {
                    grads.add(*key, version.as_ref().map(|(s, _)| *s), grad)?
                }
                Kind::Taped { .. } => unreachable!("refused by the check"),
                Kind::Op { inputs, rule } => {
                    // Not `ok_or`: an eager `Error` would be built and dropped for every node.
                    let Some(mut rule) = rule.borrow_mut().take() else {
                        return Err(Error::GraphConsumed);
                    };
                    let needs: Few<bool> = inputs.iter().map(Option::is_some).collect();
                    let mut input_grads = rule.get_mut().backward(grad, &needs, at, grads)?;
                    for (input, g) in inputs.iter().zip(input_grads.iter_mut().map(Option::take)) {
                        if let (Some(input), Some(g)) = (input, g) {
                            let (_, slot) = input.walk.get();
                            let total = match pending[slot].take() {
                                Some(earlier) => earlier.try_add_owned(&g)?,
                                None => g,
                            };
                            pending[slot] = Some(total);
                        }
                    }
                }
            }
        }
        Ok(())
    })
}

/// Fails as backward would, before anything runs: with [`Error::GraphConsumed`] for a rule already
/// run, [`Error::NotDifferentiable`] for an op without a derivative, and
/// [`Error::ParamUsedWithTwoValues`].
fn check<T: Element>(order: &[NodeRef<T>], grads: &Gradients<'_, T>) -> Result<()> {
    for node in order {
        match &node.kind {
            Kind::Op { rule, .. } => match rule.borrow().as_ref() {
                None => return Err(Error::GraphConsumed),
                Some(rule) => rule.get().check(grads)?,
            },
            Kind::Taped { .. } => return Err(Error::BackwardInsideCheckpoint),
            Kind::Leaf { .. } => {}
        }
    }
    grads.check_versions(order.iter().filter_map(|node| match &node.kind {
        Kind::Leaf {
            key,
            version: Some((version, shape)),
        } => Some((*key, *version, shape.slice())),
        _ => None,
    }))
}

/// The nodes under `root`, each after all of its inputs (post-order, iteratively). Each node's
/// `walk` holds the number of this walk and the node's place in the order.
///
/// A walk marks only the nodes of its own graph. Backward passes nest (a checkpointed region's
/// backward walks the graphs of its replays), but a replay's graph is made of nodes of its own, so
/// no node is marked by two walks that are both under way.
fn topological<T: Element>(root: &NodeRef<T>) -> RecycledVec<NodeRef<T>> {
    let walk = WALKS.get() + 1;
    WALKS.set(walk);
    let mut order = RecycledVec::new();
    let mut stack: RecycledVec<(NodeRef<T>, bool)> = RecycledVec::new();
    stack.push((root.clone(), false));
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            node.walk.set((walk, order.len()));
            order.push(node);
            continue;
        }
        if node.walk.get().0 == walk {
            continue;
        }
        // Seen (its place is set once its inputs are placed).
        node.walk.set((walk, usize::MAX));
        stack.push((node.clone(), true));
        if let Kind::Op { inputs, .. } = &node.kind {
            // Leaves are pushed first, so popped (and placed) last: right before the op, where
            // the backward reaches them as soon as their gradient is complete. Placed before the
            // op's other inputs, a parameter's gradient would wait in memory until the backward
            // of everything those inputs came from had run.
            let unseen = || inputs.iter().flatten().filter(|n| n.walk.get().0 != walk);
            stack.extend(unseen().filter(|n| n.is_leaf()).map(|n| (n.clone(), false)));
            stack.extend(
                unseen()
                    .filter(|n| !n.is_leaf())
                    .map(|n| (n.clone(), false)),
            );
        }
    }
    order
}

impl<'s, T: Element> Tensor<'s, T> {
    /// The same values marked as needing a gradient: ops on it record, and [`Tensor::backward`]
    /// reports its gradient ([`Gradients::of`]). No data is copied. A tensor that already carried a
    /// graph starts a new one here (its history is not differentiated through).
    pub fn requires_grad(mut self) -> Tensor<'s, T> {
        self.node = Some(Node::leaf(next_key(), None, &self.rents_in));
        self
    }

    /// The same values without a gradient graph: a zero-copy alias that ops do not record through,
    /// for values kept for their own sake (a loss to print, an activation to log) rather than
    /// differentiated.
    pub fn without_grad(mut self) -> Tensor<'s, T> {
        self.node = None;
        self
    }

    /// Whether the tensor carries a gradient graph (it was computed from a trained parameter or a
    /// tensor marked with [`Tensor::requires_grad`], while recording).
    pub fn has_graph(&self) -> bool {
        self.node.is_some()
    }

    /// The gradients of everything this tensor depends on (parameters bound in a training scope,
    /// tensors marked with [`Tensor::requires_grad`]), keyed by parameter, as tensors of this
    /// tensor's scope. The tensor must hold one value (a loss); its gradient is 1.
    ///
    /// Each node's saved tensors are released as soon as its rule has run, so a graph can be
    /// differentiated once: a second backward through it fails with [`Error::GraphConsumed`].
    /// Fails with [`Error::BackwardNeedsScalar`], [`Error::NoGraph`],
    /// [`Error::NotDifferentiable`] (a `map` or `cast` on the path) or a budget error.
    pub fn backward(&self) -> Result<Gradients<'s, T>> {
        let mut grads = Gradients::in_scope(&self.rents_in);
        self.backward_into(&mut grads)?;
        Ok(grads)
    }

    /// Like [`Tensor::backward`], adding the gradients into `grads` (which may belong to an
    /// enclosing scope): gradient accumulation over several backward passes.
    pub fn backward_into(&self, grads: &mut Gradients<'_, T>) -> Result<()> {
        if self.node.is_none() {
            return Err(Error::NoGraph);
        }
        if self.len() != 1 {
            return Err(Error::BackwardNeedsScalar {
                shape: Shape::from(self.shape()),
            });
        }
        let mut seed = Tensor::try_rent_in(&self.rents_in, self.shape())?;
        seed.unique_slice_mut().fill(T::one());
        self.backward_with_seed(seed, &self.rents_in, grads)
    }

    /// Like [`Tensor::backward`] for an output of any shape, given the gradient of some scalar with
    /// respect to it (`grad`, of this tensor's shape). The gradients belong to the deeper of the
    /// two tensors' scopes, and everything the backward rents is counted there, as an op's output
    /// of two tensors is.
    pub fn backward_with(&self, grad: &Tensor<'s, T>) -> Result<Gradients<'s, T>> {
        if grad.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "backward_with",
                lhs: Shape::from(self.shape()),
                rhs: Shape::from(grad.shape()),
                reason: "the gradient must have the output's shape".into(),
            });
        }
        let at = deeper(&self.rents_in, &grad.rents_in);
        let mut grads = Gradients::in_scope(at);
        self.backward_with_seed(grad.saved().alias_in(at), at, &mut grads)?;
        Ok(grads)
    }

    /// Runs the backward from this tensor with `seed` as its gradient, in `at`.
    fn backward_with_seed(
        &self,
        seed: Tensor<'static, T>,
        at: &State,
        grads: &mut Gradients<'_, T>,
    ) -> Result<()> {
        let node = self.node.as_ref().ok_or(Error::NoGraph)?;
        let result = {
            let _pass = crate::trace::backward();
            backward(node, seed, at, grads)
        };
        // Those registered by now, each taken out before it is told (it may register again, for
        // the next backward); popped, so that the list keeps its capacity.
        for _ in 0..AT_END.with_borrow(Vec::len) {
            if let Some(hook) = AT_END.with_borrow_mut(Vec::pop) {
                hook.ended();
            }
        }
        result
    }
}
