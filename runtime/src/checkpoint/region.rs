//! Checkpointed training: a forward over layers that records each layer step on a tape instead of
//! keeping a graph, stores the policy's boundaries, and gives its output one graph node whose
//! backward replays the steps.
//!
//! **Forward.** Each layer step starts from an input whose node opens a [`Tape`]: the step's ops
//! record what to run and on which values (see `autograd::tape`), and keep nothing of their own, so
//! the step's activations go back to the pool as the forward drops them. The policy's boundaries
//! are stored as in inference (full precision without a copy when the activation has no other
//! handle, or narrowed to `f16`/`bf16`).
//!
//! **Backward.** The region's node runs nested backward passes, last step first. Under `Every`,
//! `Sqrt` and `Explicit` the last segment is not in the region: it records its graph as it runs,
//! since its backward comes first. The region replays one segment at a time from its stored
//! boundary with recording on (one extra forward of all segments but the last), backpropagates
//! through that segment's graph and drops it before the next. Under `Budget` the binomial schedule of the reverse sweep recomputes the boundaries it
//! did not store, and each step is replayed with recording on once, when its turn comes. Parameters'
//! gradients go straight into the backward's `Gradients`; the gradients of the region's input and
//! of values from before the region are returned to the outer backward.

use std::cell::Cell;
use std::rc::Rc;

use super::stored::ByLayer;
use super::sweep::{check_shape, ReverseReport, Sweep};
use super::{CheckpointError, Checkpointer, Result};
use crate::autograd::{
    self, Gradients, Mode, Node, NodeRef, PerInput, Recorded, Rule, SharedTape, Tape, TapeArg,
};
use crate::dims::Dims;
use crate::element::{DType, Element};
use crate::error::Result as TensorResult;
use crate::recycle::{self, RecycledVec, Slot};
use crate::scope::State;
use crate::tensor::Tensor;

/// Whether a forward from `input` records a graph: recording is on, and the input carries one or
/// parameters become leaves (a training scope).
///
/// A forward whose input is on a tape already (a `#[checkpoint]` forward called inside a layer step
/// of another) records on that tape as any ops do: the outer region replays it.
pub(crate) fn records<T: Element>(input: &Tensor<'_, T>) -> bool {
    if input
        .node
        .as_ref()
        .is_some_and(|n| n.tape_value().is_some())
    {
        return false;
    }
    match autograd::mode() {
        Mode::Off => false,
        Mode::Train => true,
        Mode::Infer => input.has_graph(),
    }
}

/// What a recording forward keeps of its steps until the region's node is made.
pub(super) struct Recording<T: Element> {
    /// The graph node of the region's input.
    input: Option<NodeRef<T>>,
    tapes: RecycledVec<SharedTape<T>>,
}

impl<T: Element> Recording<T> {
    /// Starts recording a forward from `input`, taking its graph node (the steps see only values).
    pub(super) fn start(input: &mut Tensor<'_, T>) -> Self {
        Recording {
            input: input.node.take(),
            tapes: RecycledVec::new(),
        }
    }

    /// `x`, the input of the next step, with a node that opens the step's tape.
    pub(super) fn open<'s>(&mut self, mut x: Tensor<'s, T>) -> Tensor<'s, T> {
        let tape = Tape::new();
        x.node = Some(Node::taped(&tape, 0, &x.rents_in));
        self.tapes.push(tape);
        x
    }

    /// Closes the step's tape with what it returned, `y`; returns `y`'s values without a node.
    pub(super) fn close<'s>(&mut self, y: Tensor<'s, T>) -> Tensor<'s, T> {
        let tape = self.tapes.last().expect("a step was opened");
        let output = match y.node.as_ref().and_then(|n| n.tape_value()) {
            Some((on, value)) if SharedTape::ptr_eq(on, tape) => TapeArg::Value(value),
            _ => TapeArg::Outside {
                node: y.node.clone(),
                value: y.saved(),
            },
        };
        tape.borrow_mut().close(output);
        y.without_grad()
    }

    /// Moves the accounting of what the tapes keep from scopes that end to `target` (as an escape
    /// moves what a graph saved): a constant made in a segment stays alive with its tape.
    pub(super) fn settle(&self, target: &State) {
        for tape in &self.tapes {
            tape.borrow().move_accounting(target);
        }
    }

    /// `x`, the output of the `taped` steps, with the node whose backward replays them from what
    /// `ckpt` stored; without a node if nothing in the steps needs a gradient. Fails with
    /// [`CheckpointError::CrossStepValue`] if a step read a value of an earlier step.
    pub(super) fn finish<'s>(
        self,
        ckpt: &Checkpointer<T>,
        taped: usize,
        mut x: Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        // The region's graph inputs: its input, and the values from before it that its steps read
        // (not leaves: those get their gradients by key).
        let mut externals: RecycledVec<NodeRef<T>> = RecycledVec::new();
        let (mut leaves, mut cross_step) = (false, false);
        for tape in &self.tapes {
            tape.borrow().for_each_outside(&mut |(node, _)| match node {
                Some(node) if node.is_leaf() => leaves = true,
                Some(node) if node.tape_value().is_some() => cross_step = true,
                Some(node) if !externals.iter().any(|e| NodeRef::ptr_eq(e, node)) => {
                    externals.push(node.clone())
                }
                _ => {}
            });
        }
        if cross_step {
            return Err(CheckpointError::CrossStepValue);
        }
        if self.input.is_none() && externals.is_empty() && !leaves {
            // Nothing the steps read carries a gradient: neither does their output.
            return Ok(x);
        }
        let inputs = std::iter::once(self.input)
            .chain(externals.iter().cloned().map(Some))
            .collect();
        let region = Region {
            ids: (0..self.tapes.len()).collect(),
            tapes: self.tapes,
            externals,
            stored: ckpt.stored_by_position(),
            shapes: ckpt.shapes.iter().cloned().collect(),
            plan: ckpt.plan.iter().copied().filter(|&p| p < taped).collect(),
            slots: ckpt.slots,
            report: ckpt.last_backward.clone(),
        };
        let rule = Rule::new(recycle::slot(region));
        x.node = Some(Node::op(inputs, rule, &x.rents_in));
        Ok(x)
    }
}

/// The backward of a checkpointed region: what its forward recorded and stored. It is the rule of
/// the region's graph node, which autograd runs through [`Recorded`] as any op's record; its lists
/// are recycled, as the graph's are.
pub(crate) struct Region<T: DType> {
    /// The steps' ids in the stored maps and errors: their positions.
    ids: RecycledVec<usize>,
    /// One tape per layer step.
    tapes: RecycledVec<SharedTape<T>>,
    /// The graph nodes from before the region that its steps read, after its input in the node's
    /// inputs.
    externals: RecycledVec<NodeRef<T>>,
    /// The stored boundaries, by position.
    stored: ByLayer<T>,
    /// The shapes of the steps' inputs, for [`CheckpointError::ShapeDrift`].
    shapes: RecycledVec<Dims>,
    plan: RecycledVec<usize>,
    /// Slots of the binomial schedule (`Budget`), 0 otherwise.
    slots: usize,
    /// Where the report of the backward goes (the checkpointer's).
    report: Rc<Cell<Option<ReverseReport>>>,
}

/// A replay's gradient bookkeeping: the keys of the leaves standing for the region's input and
/// for its external values.
struct Keys<T: Element> {
    input: u64,
    externals: RecycledVec<(NodeRef<T>, u64)>,
}

impl<T: Element> Keys<T> {
    fn new() -> Self {
        Keys {
            input: autograd::next_key(),
            externals: RecycledVec::new(),
        }
    }

    /// `value` with a graph node for a replay that records: a parameter's or a marked tensor's
    /// own leaf (so its gradient is added under its key), a leaf of this replay's for a value from
    /// before the region, none for a constant.
    fn outside(&mut self, node: Option<&NodeRef<T>>, value: &Saved<T>, at: &State) -> Saved<T> {
        let mut v = value.alias_in(at);
        v.node = node.map(|node| match node.leaf_parts() {
            Some((key, version)) => Node::leaf(key, version, at),
            None => {
                let key = match self
                    .externals
                    .iter()
                    .find(|(e, _)| NodeRef::ptr_eq(e, node))
                {
                    Some((_, key)) => *key,
                    None => {
                        let key = autograd::next_key();
                        self.externals.push((node.clone(), key));
                        key
                    }
                };
                Node::leaf(key, None, at)
            }
        });
        v
    }
}

/// What a backward through the region has gathered so far.
struct Flow<T: Element> {
    /// The gradient of the next step's input (of the region's output, at first); `None` once
    /// nothing flows further back.
    grad: Option<Saved<T>>,
    /// The gradients of the region's external values, in the order of `Region::externals`.
    externals: RecycledVec<Option<Saved<T>>>,
    report: ReverseReport,
}

impl<T: Element> Region<T> {
    /// Step `pos` run again from `x`: with recording off (values only), or building its graph, with
    /// the leaves `keys` hands out.
    fn replay(
        &self,
        pos: usize,
        x: Saved<T>,
        at: &State,
        keys: Option<&mut Keys<T>>,
    ) -> TensorResult<Saved<T>> {
        let tape = self.tapes[pos].borrow();
        match keys {
            None => autograd::with_mode(Mode::Off, || {
                tape.replay(x, at, &mut |(_, value)| value.alias_in(at))
            }),
            Some(keys) => autograd::with_mode(Mode::Infer, || {
                tape.replay(x, at, &mut |(node, value)| keys.outside(node, value, at))
            }),
        }
    }

    /// Steps `start..end` replayed from `x` with recording on, backpropagated from `flow.grad`.
    fn backpropagate(
        &self,
        start: usize,
        end: usize,
        x: Saved<T>,
        at: &State,
        grads: &mut Gradients<'_, T>,
        flow: &mut Flow<T>,
    ) -> Result<()> {
        let Some(seed) = flow.grad.take() else {
            return Ok(());
        };
        let mut keys = Keys::new();
        let mut y = x;
        y.node = Some(Node::leaf(keys.input, None, at));
        for pos in start..end {
            y = self.replay(pos, y, at, Some(&mut keys))?;
            check_shape(&self.shapes, &self.ids, pos + 1, &y)?;
        }
        flow.report.replayed_steps += end - start;
        if let Some(root) = y.node.take() {
            autograd::backward(&root, seed, at, grads)?;
        }
        flow.grad = grads.take(keys.input);
        for (node, key) in keys.externals.iter() {
            if let Some(g) = grads.take(*key) {
                let i = self
                    .externals
                    .iter()
                    .position(|e| NodeRef::ptr_eq(e, node))
                    .expect("every external value is an input of the region");
                flow.externals[i] = Some(match flow.externals[i].take() {
                    Some(earlier) => earlier.try_add_owned(&g)?,
                    None => g,
                });
            }
        }
        Ok(())
    }

    /// Segment by segment, last first: each replayed once from its boundary, with recording on.
    fn segments(
        &mut self,
        at: &State,
        grads: &mut Gradients<'_, T>,
        flow: &mut Flow<T>,
    ) -> Result<()> {
        let n = self.tapes.len();
        let plan = std::mem::take(&mut self.plan);
        for (j, &start) in plan.iter().enumerate().rev() {
            let end = plan.get(j + 1).copied().unwrap_or(n);
            let stored =
                self.stored
                    .remove(start)
                    .ok_or_else(|| CheckpointError::UnknownLayer {
                        layer: start,
                        stored: self.stored.layers(),
                    })?;
            let x = stored.restore(at)?.without_grad();
            drop(stored);
            flow.report.peak_activations = flow.report.peak_activations.max(self.stored.len() + 1);
            self.backpropagate(start, end, x, at, grads, flow)?;
        }
        Ok(())
    }

    /// The binomial schedule: boundaries it did not store are recomputed (values only), and each
    /// step is replayed with recording on when its turn comes.
    fn binomial(
        &mut self,
        at: &State,
        grads: &mut Gradients<'_, T>,
        flow: &mut Flow<T>,
    ) -> Result<()> {
        let stored = std::mem::take(&mut self.stored);
        let this = &*self;
        let mut forward = |x: &Saved<T>, pos: usize| Ok(this.replay(pos, x.saved(), at, None)?);
        let mut backward =
            |pos: usize, x: &Saved<T>| this.backpropagate(pos, pos + 1, x.saved(), at, grads, flow);
        let mut sweep = Sweep {
            scope: at,
            stored,
            layers: &this.ids,
            shapes: &this.shapes,
            forward: &mut forward,
            backward: &mut backward,
            report: ReverseReport::default(),
            held: 0,
        };
        let result = sweep.binomial(&this.plan, this.slots);
        let report = sweep.report;
        drop(sweep);
        result?;
        flow.report.recomputed_steps += report.recomputed_steps;
        flow.report.peak_activations = report.peak_activations;
        Ok(())
    }
}

/// A value the region keeps, or a gradient it passes: an alias without a brand.
type Saved<T> = Tensor<'static, T>;

impl<T: Element> Recorded<T> for Slot<Region<T>> {
    fn check(&self, grads: &Gradients<'_, T>) -> TensorResult<()> {
        self.get().check(grads)
    }

    fn backward(
        &mut self,
        grad: Saved<T>,
        needs: &[bool],
        at: &State,
        grads: &mut Gradients<'_, T>,
    ) -> TensorResult<PerInput<Saved<T>>> {
        self.get_mut().backward(grad, needs, at, grads)
    }

    /// Moves the accounting of every tensor the region keeps to `target` (on escape).
    fn move_accounting(&self, target: &State) {
        for tape in &self.get().tapes {
            tape.borrow().move_accounting(target);
        }
    }

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
    }
}

impl<T: Element> Region<T> {
    /// The gradients of the region's graph inputs given `g`, the gradient of its output. It runs
    /// nested backward passes, so it adds the gradients of the parameters it reaches into `grads`
    /// itself.
    fn backward(
        &mut self,
        g: Saved<T>,
        needs: &[bool],
        at: &State,
        grads: &mut Gradients<'_, T>,
    ) -> TensorResult<PerInput<Saved<T>>> {
        let mut flow = Flow {
            grad: Some(g),
            externals: self.externals.iter().map(|_| None).collect(),
            report: ReverseReport::default(),
        };
        let result = if self.slots > 0 {
            self.binomial(at, grads, &mut flow)
        } else {
            self.segments(at, grads, &mut flow)
        };
        result.map_err(|e| match e {
            CheckpointError::Tensor(e) => e,
            e => crate::error::Error::Checkpoint(Box::new(e)),
        })?;
        self.report.set(Some(flow.report));
        let input = flow
            .grad
            .filter(|_| needs.first().copied().unwrap_or(false));
        let externals = flow.externals.iter_mut().map(Option::take);
        Ok(std::iter::once(input).chain(externals).collect())
    }

    /// Fails as the region's backward would, before any backward runs: with
    /// [`Error::NotDifferentiable`](crate::Error::NotDifferentiable) for an op without a derivative
    /// its output depends on, and as [`Gradients::check_versions`] does for the parameters its steps
    /// read.
    fn check(&self, grads: &Gradients<'_, T>) -> TensorResult<()> {
        if let Some(op) = self
            .tapes
            .iter()
            .find_map(|t| t.borrow().opaque_dependency())
        {
            return Err(crate::error::Error::NotDifferentiable { op });
        }
        let mut leaves = RecycledVec::new();
        for tape in &self.tapes {
            tape.borrow().for_each_outside(&mut |(node, _)| {
                if let Some((key, Some((version, shape)))) = node.and_then(|n| n.leaf_parts()) {
                    leaves.push((key, version, shape));
                }
            });
        }
        grads.check_versions(leaves.iter().map(|(k, s, shape)| (*k, *s, shape.slice())))
    }
}
