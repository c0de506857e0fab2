//! Checkpointed training: a forward over layers that records layer steps on tapes instead of
//! keeping their graphs, stores the policy's boundaries, and gives the output of each run of taped
//! steps (a region) one graph node whose backward replays them.
//!
//! **Forward.** Each taped step starts from an input whose node opens a [`Tape`]: the step's ops
//! record what to run and on which values (see `autograd::tape`), and keep nothing of their own, so
//! the step's activations go back to the pool as the forward drops them. The policy's boundaries
//! are stored as in inference (full precision without a copy when the activation has no other
//! handle, or narrowed to `f16`/`bf16`), and the region's node takes them over from the
//! checkpointer: its backward releases each as it consumes it.
//!
//! **Backward.** The region's node runs nested backward passes, last step first. Under `Every`,
//! `Sqrt` and `Explicit` the last segment is not in the region: it records its graph as it runs,
//! since its backward comes first. The region replays one segment at a time from its stored
//! boundary with recording on (one extra forward of all segments but the last), backpropagates
//! through that segment's graph and drops it before the next. Under `Budget` the last step records
//! its graph; the binomial schedule of the reverse sweep recomputes the boundaries it did not store,
//! and each step is replayed with recording on once, when its turn comes. Under `Memory` each taped
//! run is a region of its own, whose backward follows the dynamic program's choices
//! ([`Region::rotor`]); the profiling step's one region recomputes every step from its input and
//! measures it ([`Region::profile`]). Parameters' gradients go straight into the backward's
//! `Gradients`; the gradients of the region's input and of values from before the region are
//! returned to the outer backward.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use super::memory::{Layout, Measuring, MemoryPlan};
use super::rotor::{Choice, Rotor};
use super::stored::ByLayer;
use super::sweep::{check_shape, ReverseReport, Sweep};
use super::{CheckpointError, Checkpointer, Result};
use crate::autograd::{
    self, Gradients, Keep, Mode, Node, NodeRef, PerInput, Recorded, Replayed, Rule, SharedTape,
    Tape, TapeArg,
};
use crate::dims::Dims;
use crate::element::{DType, Element};
use crate::error::Result as TensorResult;
use crate::recycle::{self, RecycledRc, RecycledVec, Slot};
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
    /// What the tapes do with the outputs of the ops the saving names.
    keep: Keep,
    /// The gradients of the region's values that later steps read, shared with the region's node.
    pending: RecycledRc<Pending<T>>,
}

impl<T: Element> Recording<T> {
    /// Starts recording a forward from `input`, taking its graph node (the steps see only values);
    /// its tapes do with the outputs of the ops the saving names what `keep` says.
    pub(super) fn start(input: &mut Tensor<'_, T>, keep: Keep) -> Self {
        Recording {
            input: input.node.take(),
            tapes: RecycledVec::new(),
            keep,
            pending: RecycledRc::new(Pending::default()),
        }
    }

    /// The gradients the region's backward adds to its steps' inputs that later steps read.
    pub(super) fn pending(&self) -> &RecycledRc<Pending<T>> {
        &self.pending
    }

    /// `value`, the input of the region's step `source` (its position in the region), read by
    /// the step being recorded: a value of that step's tape, which replays give the region's value.
    pub(super) fn read_skip<'s>(&mut self, value: &Saved<T>, at: &State) -> Tensor<'s, T> {
        let tape = self.tapes.last().expect("a step was opened");
        let index = tape
            .borrow_mut()
            .push_skip(value.node.clone(), value.saved());
        let mut v = value.alias_in(at);
        v.node = Some(Node::taped(tape, index, at));
        v
    }

    /// `x`, the input of the next step, with a node that opens the step's tape.
    pub(super) fn open<'s>(&mut self, mut x: Tensor<'s, T>) -> Tensor<'s, T> {
        let tape = Tape::new(self.keep);
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

    /// The pool bytes the last step's tape keeps for replays (see `Saving`), and those it would
    /// keep (counted, keeping nothing).
    pub(super) fn kept_bytes(&self) -> (usize, usize) {
        self.tapes.last().map_or((0, 0), |tape| {
            let tape = tape.borrow();
            (tape.kept_bytes(), tape.counted_bytes())
        })
    }

    /// Moves the accounting of what the tapes keep from scopes that end to `target` (as an escape
    /// moves what a graph saved): a constant made in a segment stays alive with its tape.
    pub(super) fn settle(&self, target: &State) {
        for tape in &self.tapes {
            tape.borrow().move_accounting(target);
        }
    }

    /// The fingerprint of the last step's tape (see `Tape::fingerprint`).
    pub(super) fn fingerprint(&self) -> u64 {
        self.tapes
            .last()
            .map_or(0, |tape| tape.borrow().fingerprint())
    }

    /// `x`, the output of the steps `start .. end` (those recorded), with the node whose backward
    /// replays them from what `ckpt` stored, which it takes over; without a node if nothing in the
    /// steps needs a gradient. The backward follows `layout`, or holds the least memory it can if
    /// `least`. Fails with [`CheckpointError::CrossStepValue`] if a step read a value of an
    /// earlier step other than a step's input. `read_later` are the positions in the region whose
    /// inputs steps after it read (skip connections out of the region).
    pub(super) fn finish<'s>(
        self,
        ckpt: &mut Checkpointer<T>,
        layout: &Layout,
        least: bool,
        (start, end): (usize, usize),
        read_later: impl Iterator<Item = usize>,
        mut x: Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        // The region's graph inputs: its input, and the values from before it that its steps read
        // (not leaves: those get their gradients by key); and the steps whose inputs later steps
        // read (none but in a chain with skip connections: then no spare buffer is taken).
        let mut externals: RecycledVec<NodeRef<T>> = RecycledVec::new();
        let mut sources: RecycledVec<usize> = RecycledVec::empty();
        let (mut leaves, mut cross_step) = (false, false);
        for (reader, tape) in self.tapes.iter().enumerate() {
            tape.borrow().for_each_outside(&mut |(node, _)| match node {
                Some(node) if node.is_leaf() => leaves = true,
                Some(node) if node.tape_value().is_some() => match source_of(&self.tapes, node) {
                    Some(source) if source < reader => sources.push_spared(source),
                    _ => cross_step = true,
                },
                Some(node) if !externals.iter().any(|e| NodeRef::ptr_eq(e, node)) => {
                    externals.push(node.clone())
                }
                _ => {}
            });
        }
        if cross_step {
            return Err(CheckpointError::CrossStepValue);
        }
        read_later.for_each(|p| sources.push_spared(p));
        sources.sort_unstable();
        sources.dedup();
        if self.input.is_none() && externals.is_empty() && !leaves {
            // Nothing the steps read carries a gradient: neither does their output.
            return Ok(x);
        }
        let reverse = match layout {
            _ if least => Reverse::Least,
            Layout::Prefix(_) if ckpt.slots > 0 => Reverse::Binomial(ckpt.slots),
            Layout::Prefix(_) => Reverse::Segments,
            Layout::Profile => Reverse::Profile(ckpt.memory.measuring.clone()),
            Layout::Least => Reverse::Least,
            Layout::Rotor(plan) => Reverse::Rotor {
                plan: plan.clone(),
                offset: start,
                free: plan
                    .top
                    .regions
                    .iter()
                    .find(|r| r.start == start)
                    .expect("the plan has a region here")
                    .free,
            },
        };
        // The earliest region of the forward that reads a value returns its gradient; later ones
        // (whose backward runs first) leave theirs to it.
        let returns = ckpt.externals.first_readers(&externals);
        let inputs = std::iter::once(self.input)
            .chain(externals.iter().cloned().map(Some))
            .collect();
        let region = Region {
            ids: (0..self.tapes.len()).collect(),
            start,
            tapes: self.tapes,
            externals,
            returns,
            shared: ckpt.externals.clone(),
            sources,
            pending: self.pending,
            stored: ckpt.hand_over(start, end),
            shapes: ckpt.shapes.iter().skip(start).cloned().collect(),
            plan: ckpt
                .plan
                .iter()
                .filter(|&&p| (start..end).contains(&p))
                .map(|&p| p - start)
                .collect(),
            reverse,
            report: ckpt.last_backward.clone(),
            replayed: Cell::new(Replayed::default()),
        };
        let rule = Rule::new(recycle::slot(region));
        x.node = Some(Node::op(inputs, rule, &x.rents_in));
        Ok(x)
    }
}

/// The values from before a forward's regions that several of them read, and the gradients the
/// later regions' backwards (which run first) leave to the earlier ones: one gradient per value
/// at a time, added into by each region, as one region's backward holds it (two regions each
/// returning their own held two, past the budget the profiling step's one region measured).
pub(crate) struct SharedExternals<T: DType> {
    /// The external values read by the forward's regions so far.
    seen: RefCell<RecycledVec<NodeRef<T>>>,
    /// Gradients left by a region's backward for an earlier region.
    left: RefCell<RecycledVec<(NodeRef<T>, Saved<T>)>>,
}

impl<T: DType> Default for SharedExternals<T> {
    fn default() -> Self {
        SharedExternals {
            seen: RefCell::new(RecycledVec::new()),
            left: RefCell::new(RecycledVec::new()),
        }
    }
}

impl<T: Element> SharedExternals<T> {
    /// Forgets the last forward's values and gradients (a new forward starts).
    pub(crate) fn clear(&self) {
        self.seen.borrow_mut().clear();
        self.left.borrow_mut().clear();
    }

    /// For each of a region's external values, whether it is the first region to read it.
    fn first_readers(&self, externals: &[NodeRef<T>]) -> RecycledVec<bool> {
        let mut seen = self.seen.borrow_mut();
        externals
            .iter()
            .map(|e| {
                let first = !seen.iter().any(|s| NodeRef::ptr_eq(s, e));
                if first {
                    seen.push(e.clone());
                }
                first
            })
            .collect()
    }

    /// The gradient of `e` a later region left, if any.
    fn take(&self, e: &NodeRef<T>) -> Option<Saved<T>> {
        let mut left = self.left.borrow_mut();
        let i = left.iter().position(|(n, _)| NodeRef::ptr_eq(n, e))?;
        Some(left.swap_remove(i).1)
    }

    /// Leaves `g`, the gradient of `e` so far, to an earlier region.
    fn leave(&self, e: &NodeRef<T>, g: Saved<T>) {
        self.left.borrow_mut().push((e.clone(), g));
    }
}

/// How a region's backward reverses its steps.
enum Reverse {
    /// Each segment of the plan replayed once, with recording on (`Every`, `Sqrt`, `Explicit`).
    Segments,
    /// The binomial schedule with this many slots (`Budget`).
    Binomial(usize),
    /// `Policy::Memory`'s schedule: the region is the steps from `offset` of the plan's chain, and
    /// its backward has `free` bytes.
    Rotor {
        plan: Rc<MemoryPlan>,
        offset: usize,
        free: u64,
    },
    /// The profiling step of `Policy::Memory`: every step recomputed from the input and replayed,
    /// its graph's and its backward's pool bytes measured.
    Profile(Rc<RefCell<Measuring>>),
    /// Every step recomputed from the input and replayed, as the profiling step does, measuring
    /// nothing: the least memory a backward can hold, for steps that differ from what the plan
    /// was made for.
    Least,
}

/// The backward of a checkpointed region: what its forward recorded and stored. It is the rule of
/// the region's graph node, which autograd runs through [`Recorded`] as any op's record; its lists
/// are recycled, as the graph's are.
pub(crate) struct Region<T: DType> {
    /// The steps' ids in the stored maps and errors: their positions.
    ids: RecycledVec<usize>,
    /// The position of the region's first step in its forward (a trace's segment tag).
    start: usize,
    /// One tape per layer step.
    tapes: RecycledVec<SharedTape<T>>,
    /// The graph nodes from before the region that its steps read, after its input in the node's
    /// inputs.
    externals: RecycledVec<NodeRef<T>>,
    /// Whether this is the earliest region of its forward to read each external value: the one
    /// whose backward returns its gradient.
    returns: RecycledVec<bool>,
    /// The gradients of external values that later regions of the forward left to earlier ones.
    shared: Rc<SharedExternals<T>>,
    /// The positions whose inputs later steps read, in the region or after it, sorted.
    sources: RecycledVec<usize>,
    /// The gradients of those inputs that their readers' backwards gave, until the backward
    /// reaches them.
    pending: RecycledRc<Pending<T>>,
    /// The stored boundaries, by position.
    stored: ByLayer<T>,
    /// The shapes of the steps' inputs, for [`CheckpointError::ShapeDrift`].
    shapes: RecycledVec<Dims>,
    /// The stored positions.
    plan: RecycledVec<usize>,
    reverse: Reverse,
    /// Where the report of the backward goes (the checkpointer's).
    report: Rc<Cell<Option<ReverseReport>>>,
    /// The ops the backward's replays ran and bound so far.
    replayed: Cell<Replayed>,
}

/// A replay's gradient bookkeeping: the keys of the leaves standing for the region's input and
/// for its external values.
struct Keys<T: Element> {
    /// The position of the replay's first step, and the key and node of the leaf standing for
    /// its input.
    start: usize,
    input: (u64, NodeRef<T>),
    externals: RecycledVec<(NodeRef<T>, u64)>,
    /// The leaves standing for inputs of steps before the replay that its steps read: position,
    /// key and node, one node per position, so that every read of it adds into one node.
    skips: RecycledVec<(usize, u64, NodeRef<T>)>,
    /// Where the replay's graph is cut, at the inputs of its steps (after its first) that steps
    /// after the replay read.
    cuts: RecycledVec<Cut<T>>,
}

/// A replay's graph cut at the input of the step at `pos`: the leaf standing for the input after
/// the cut (its key and node), and the input's node before it.
struct Cut<T: DType> {
    pos: usize,
    key: u64,
    leaf: NodeRef<T>,
    before: Option<NodeRef<T>>,
}

/// A leaf of a replay's own (no parameter's, no marked tensor's): its new key and its node.
fn fresh_leaf<T: DType>(at: &State) -> (u64, NodeRef<T>) {
    let key = autograd::next_key();
    (key, Node::leaf(key, None, at))
}

impl<T: Element> Keys<T> {
    /// The keys of a replay from the input of step `start`.
    fn new(start: usize, at: &State) -> Self {
        Keys {
            start,
            input: fresh_leaf(at),
            externals: RecycledVec::new(),
            skips: RecycledVec::new(),
            cuts: RecycledVec::new(),
        }
    }

    /// The leaves of the replay's own that later gradients may reach: its input's, its skip
    /// reads' and its cuts'.
    fn leaves(&self) -> impl Iterator<Item = (u64, &NodeRef<T>)> {
        let skips = self.skips.iter().map(|(_, key, node)| (*key, node));
        let cuts = self.cuts.iter().map(|c| (c.key, &c.leaf));
        std::iter::once((self.input.0, &self.input.1))
            .chain(skips)
            .chain(cuts)
    }

    /// `value`, the input of the region's step `source` as the tape kept it (the value the
    /// replay recomputes, bit for bit), as a replay that records reads it: with the leaf standing
    /// for that input, the replay's own if it starts there or is cut there (see `Cut`), else one
    /// for its gradient.
    fn skip(&mut self, source: usize, value: &Saved<T>, at: &State) -> Saved<T> {
        let node = if source == self.start {
            self.input.1.clone()
        } else if let Some(cut) = self.cuts.iter().find(|c| c.pos == source) {
            cut.leaf.clone()
        } else if let Some((.., node)) = self.skips.iter().find(|(p, ..)| *p == source) {
            node.clone()
        } else {
            let (key, node) = fresh_leaf(at);
            self.skips.push((source, key, node.clone()));
            node
        };
        let mut v = value.alias_in(at);
        v.node = Some(node);
        v
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
        // A trace tags what the replay rents with the step's segment, as the forward's were.
        crate::trace::set_segment(|| Some((self.start, self.start + pos, true)));
        let tape = self.tapes[pos].borrow();
        let mut replayed = self.replayed.get();
        let y = match keys {
            None => autograd::with_mode(Mode::Off, || {
                tape.replay(x, at, &mut |(_, value)| value.alias_in(at), &mut replayed)
            }),
            Some(keys) => autograd::with_mode(Mode::Infer, || {
                let outside = |(node, value): autograd::Outside<'_, T>| match node
                    .and_then(|n| source_of(&self.tapes, n))
                {
                    Some(source) => keys.skip(source, value, at),
                    None => keys.outside(node, value, at),
                };
                tape.replay(x, at, &mut { outside }, &mut replayed)
            }),
        };
        self.replayed.set(replayed);
        y
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
        if flow.grad.is_none() && !self.pending.any_in(start..end) {
            self.release(start, end);
            return Ok(());
        }
        let (_, graph) = self.record(start, end, x, at, flow)?;
        self.settle(graph, at, grads, flow)
    }

    /// Steps `start..end` replayed from `x` with recording on: their output's values, and their
    /// graph for [`Region::settle`].
    fn record(
        &self,
        start: usize,
        end: usize,
        x: Saved<T>,
        at: &State,
        flow: &mut Flow<T>,
    ) -> Result<(Saved<T>, Graph<T>)> {
        let mut keys = Keys::new(start, at);
        let mut y = x;
        y.node = Some(keys.input.1.clone());
        for pos in start..end {
            if pos > start && self.sources.binary_search(&pos).is_ok() {
                // The graph is cut at an input that later steps read: its leaf starts with the
                // gradient steps after the replay gave it (see `settle`); steps of the replay
                // read it with the leaf.
                let (key, leaf) = fresh_leaf(at);
                let before = y.node.replace(leaf.clone());
                keys.cuts.push(Cut {
                    pos,
                    key,
                    leaf,
                    before,
                });
            }
            y = self.replay(pos, y, at, Some(&mut keys))?;
            check_shape(&self.shapes, &self.ids, pos + 1, &y)?;
        }
        flow.report.replayed_steps += end - start;
        let root = y.node.take();
        Ok((
            y,
            Graph {
                root,
                keys,
                steps: (start, end),
            },
        ))
    }

    /// Backpropagates `flow.grad` through `graph`: the gradient of the graph's input becomes
    /// `flow.grad`, those of external values are added to `flow.externals`.
    fn settle(
        &self,
        graph: Graph<T>,
        at: &State,
        grads: &mut Gradients<'_, T>,
        flow: &mut Flow<T>,
    ) -> Result<()> {
        let Graph {
            root,
            mut keys,
            steps: (start, end),
        } = graph;
        // The replay's leaves start with what steps after it gave their inputs, so that each
        // input's gradients add in the order the plain graph's backward adds them: the latest
        // reader's first.
        let mut seeds = RecycledVec::new();
        let mut seed_from = |pos: usize, node: &NodeRef<T>| {
            if let Some(p) = self.pending.take(pos) {
                seeds.push((node.clone(), p));
            }
        };
        seed_from(start, &keys.input.1);
        for (source, _, node) in keys.skips.iter() {
            seed_from(*source, node);
        }
        for cut in keys.cuts.iter() {
            seed_from(cut.pos, &cut.leaf);
        }
        // Part by part, the last first: a cut's leaf has its whole gradient from the parts after
        // it, which the part before it goes on from; a leaf's gradient so far starts its walk.
        let (mut from, mut seed) = (root, flow.grad.take());
        loop {
            if let Some(node) = &from {
                for (key, leaf) in keys.leaves() {
                    if let Some(g) = grads.take(key) {
                        seeds.push((leaf.clone(), g));
                    }
                }
                autograd::backward_seeded(node, seed.take(), &mut seeds, at, grads)?;
            }
            let Some(cut) = keys.cuts.pop() else {
                break;
            };
            seed = grads
                .take(cut.key)
                .or_else(|| take_seed(&mut seeds, &cut.leaf));
            from = cut.before;
        }
        flow.grad = grads
            .take(keys.input.0)
            .or_else(|| take_seed(&mut seeds, &keys.input.1));
        for (source, key, node) in keys.skips.iter() {
            let g = grads.take(*key).or_else(|| take_seed(&mut seeds, node));
            if let Some(g) = g {
                self.pending.add(*source, g)?;
            }
        }
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
        self.release(start, end);
        Ok(())
    }

    /// The backward of steps `start..end` has run: their tapes let go of the values of earlier
    /// steps they read.
    fn release(&self, start: usize, end: usize) {
        for tape in &self.tapes[start..end] {
            tape.borrow_mut().release_skips();
        }
    }

    /// Takes the stored input of the region's step `pos` out of the region, as a tensor of `at`.
    fn restore(&mut self, pos: usize, at: &State) -> Result<Saved<T>> {
        let stored = self
            .stored
            .remove(pos)
            .ok_or_else(|| CheckpointError::UnknownLayer {
                layer: pos,
                stored: self.stored.layers(),
            })?;
        Ok(stored.restore(at)?.without_grad())
    }

    /// Values only: `x` advanced from step `from` to the input of step `to`.
    fn advance(
        &self,
        from: usize,
        to: usize,
        x: &Saved<T>,
        at: &State,
        flow: &mut Flow<T>,
    ) -> Result<Saved<T>> {
        let mut a = x.saved();
        for pos in from..to {
            a = self.replay(pos, a, at, None)?;
            check_shape(&self.shapes, &self.ids, pos + 1, &a)?;
        }
        flow.report.recomputed_steps += to - from;
        Ok(a)
    }

    /// `Policy::Memory`'s schedule for steps `s ..= t` of the region from `x`, their input, with
    /// `m` bytes free: the choices of the dynamic program, whose memory they keep to.
    #[allow(clippy::too_many_arguments)]
    fn rotor(
        &self,
        rotor: &Rotor,
        offset: usize,
        (s, t, m): (usize, usize, u64),
        x: Saved<T>,
        at: &State,
        grads: &mut Gradients<'_, T>,
        flow: &mut Flow<T>,
    ) -> Result<()> {
        match rotor.solve(offset + s, offset + t, m).1 {
            Choice::All => {
                let rest = rotor.all_free(offset + s, m).expect("the plan fits");
                // A super-step of a long chain records its steps one after another, and runs
                // their backward last first, as the plan counts them.
                let end = rotor.all_end(offset + s) - offset;
                let mut graphs = RecycledVec::new();
                let mut y = x;
                for pos in s..end {
                    let (out, graph) = self.record(pos, pos + 1, y, at, flow)?;
                    graphs.push(graph);
                    y = out;
                }
                if end <= t {
                    self.rotor(rotor, offset, (end, t, rest), y, at, grads, flow)?;
                }
                while let Some(graph) = graphs.pop() {
                    self.settle(graph, at, grads, flow)?;
                }
                Ok(())
            }
            Choice::Ck(to) => {
                let (right, left) = rotor
                    .solve_ck_free(offset + t, to, m)
                    .expect("the plan fits");
                // The dynamic program counts steps along the whole chain; the region from its start.
                let sp = to - offset;
                let a = self.advance(s, sp, &x, at, flow)?;
                self.rotor(rotor, offset, (sp, t, right), a, at, grads, flow)?;
                self.rotor(rotor, offset, (s, sp - 1, left), x, at, grads, flow)
            }
        }
    }

    /// Each step, last first, recomputed from the region's input, replayed with recording on and
    /// backpropagated: the least a backward can hold (the input, one activation, one step's graph).
    /// The profiling step's backward, which measures the pool bytes of each step's graph and
    /// backward into `measuring`.
    fn least(
        &mut self,
        measuring: Option<&Rc<RefCell<Measuring>>>,
        at: &State,
        grads: &mut Gradients<'_, T>,
        flow: &mut Flow<T>,
    ) -> Result<()> {
        let pool = at.pool();
        if let Some(measuring) = measuring {
            measuring.borrow_mut().backward_started(pool);
        }
        let input = self.restore(0, at)?;
        for t in (0..self.tapes.len()).rev() {
            let a = self.advance(0, t, &input, at, flow)?;
            // What the tape keeps, held before the record starts, may be released by it: the
            // graph of a step that recorded as it ran would hold it anew.
            let kept = self.tapes[t].borrow().kept_bytes();
            let before = pool.probe_start();
            // The input is held while the step records, as a forward that records the step after
            // one that saved its output holds it: a step whose first op saves nothing (a sum with
            // a skip) is measured holding what it holds there.
            let input = a.clone();
            let (y, graph) = self.record(t, t + 1, a, at, flow)?;
            let (held, peak) = pool.probe();
            drop(input);
            let (held, peak) = (held + kept, peak + kept);
            let (started, gradients) = (pool.probe_start(), gradient_bytes(grads, flow));
            let clock = Instant::now();
            self.settle(graph, at, grads, flow)?;
            let secs = clock.elapsed().as_secs_f64();
            drop(y);
            if let Some(measuring) = measuring {
                let mut measuring = measuring.borrow_mut();
                let step = &mut measuring.costs.steps[t];
                step.graph_bytes = held.saturating_sub(before);
                step.record_peak = peak.saturating_sub(before);
                step.backward_secs = secs;
                step.backward_peak = pool.probe().1.saturating_sub(started);
                step.gradient_bytes = gradient_bytes(grads, flow).saturating_sub(gradients);
            }
        }
        if let Some(measuring) = measuring {
            let shared = flow.externals.iter().flatten().map(Tensor::allocated_bytes);
            measuring.borrow_mut().shared_gradient_bytes = shared.sum();
            Measuring::backward_ended(measuring, pool);
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
            let x = self.restore(start, at)?;
            flow.report.peak_activations = flow.report.peak_activations.max(self.stored.len() + 1);
            self.backpropagate(start, end, x, at, grads, flow)?;
        }
        Ok(())
    }

    /// The binomial schedule: boundaries it did not store are recomputed (values only), and each
    /// step is replayed with recording on when its turn comes.
    fn binomial(
        &mut self,
        slots: usize,
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
        let result = sweep.binomial(&this.plan, slots);
        let report = sweep.report;
        drop(sweep);
        result?;
        flow.report.recomputed_steps += report.recomputed_steps;
        flow.report.peak_activations = report.peak_activations;
        Ok(())
    }
}

/// Pool bytes the gradients of a backward hold until it ends: the parameters' and those of the
/// region's external values.
fn gradient_bytes<T: Element>(grads: &Gradients<'_, T>, flow: &Flow<T>) -> usize {
    let externals = flow.externals.iter().flatten().map(Tensor::allocated_bytes);
    grads.held_bytes() + externals.sum::<usize>()
}

/// A replayed step's graph, until its backward: its root, the leaves standing for its inputs and
/// the steps it replayed.
struct Graph<T: Element> {
    root: Option<NodeRef<T>>,
    keys: Keys<T>,
    steps: (usize, usize),
}

/// The gradient `seeds` holds for `node`, taken out.
fn take_seed<T: DType>(
    seeds: &mut RecycledVec<(NodeRef<T>, Saved<T>)>,
    node: &NodeRef<T>,
) -> Option<Saved<T>> {
    let i = seeds.iter().position(|(n, _)| NodeRef::ptr_eq(n, node))?;
    Some(seeds.swap_remove(i).1)
}

/// The position in the region of the step whose input `node` is (value 0 of its tape), if it is
/// a value of one of `tapes`.
fn source_of<T: DType>(tapes: &[SharedTape<T>], node: &NodeRef<T>) -> Option<usize> {
    let (tape, value) = node.tape_value()?;
    (value == 0)
        .then(|| tapes.iter().position(|t| SharedTape::ptr_eq(t, tape)))
        .flatten()
}

/// The gradients of a region's step inputs that later steps read (skip connections), by position
/// in the region, from the readers' backwards until the region's backward reaches the input.
pub(crate) struct Pending<T: DType>(RefCell<RecycledVec<(usize, Saved<T>)>>);

impl<T: DType> Default for Pending<T> {
    fn default() -> Self {
        Pending(RefCell::new(RecycledVec::new()))
    }
}

impl<T: Element> Pending<T> {
    /// Adds `g` to the gradient of the input of step `pos`.
    fn add(&self, pos: usize, g: Saved<T>) -> TensorResult<()> {
        let earlier = {
            let mut list = self.0.borrow_mut();
            let i = list.iter().position(|(p, _)| *p == pos);
            i.map(|i| list.swap_remove(i).1)
        };
        let g = match earlier {
            Some(earlier) => earlier.try_add_owned(&g)?,
            None => g,
        };
        self.0.borrow_mut().push((pos, g));
        Ok(())
    }

    /// The gradient given to the input of step `pos`, if any.
    fn take(&self, pos: usize) -> Option<Saved<T>> {
        let mut list = self.0.borrow_mut();
        let i = list.iter().position(|(p, _)| *p == pos)?;
        Some(list.swap_remove(i).1)
    }

    /// Whether a gradient waits for the input of a step in `range`.
    fn any_in(&self, range: std::ops::Range<usize>) -> bool {
        self.0.borrow().iter().any(|(p, _)| range.contains(p))
    }
}

/// The record of a region step's input read after the region (a skip connection out of it),
/// whose node's input is the region's node: its backward, which runs before the region's, gives
/// the gradient to the region (`pending`).
pub(crate) struct SkipOut<T: DType> {
    pending: RecycledRc<Pending<T>>,
    pos: usize,
}

impl<T: Element> SkipOut<T> {
    /// The node of the input of the step at `pos` of the region whose node is `region` and whose
    /// gradients wait in `pending`, made in `at`.
    pub(crate) fn node(
        region: &NodeRef<T>,
        pending: &RecycledRc<Pending<T>>,
        pos: usize,
        at: &State,
    ) -> NodeRef<T> {
        let record = SkipOut {
            pending: pending.clone(),
            pos,
        };
        let inputs = std::iter::once(Some(region.clone())).collect();
        Node::op(inputs, Rule::new(recycle::slot(record)), at)
    }
}

impl<T: Element> Recorded<T> for Slot<SkipOut<T>> {
    fn backward(
        &mut self,
        grad: Saved<T>,
        _: &[bool],
        _: &State,
        _: &mut Gradients<'_, T>,
    ) -> TensorResult<PerInput<Saved<T>>> {
        let out = self.get();
        out.pending.add(out.pos, grad)?;
        Ok(std::iter::once(None).collect())
    }

    fn move_accounting(&self, _: &State) {}

    fn recycle(self: Box<Self>) {
        recycle::recycle_slot(self)
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
            externals: self.externals.iter().map(|e| self.shared.take(e)).collect(),
            report: ReverseReport::default(),
        };
        let result = match &self.reverse {
            Reverse::Segments => self.segments(at, grads, &mut flow),
            &Reverse::Binomial(slots) => self.binomial(slots, at, grads, &mut flow),
            Reverse::Least => self.least(None, at, grads, &mut flow),
            Reverse::Rotor { plan, .. } if plan.stale.get() => {
                self.least(None, at, grads, &mut flow)
            }
            Reverse::Rotor { plan, offset, free } => {
                let (plan, offset, free) = (plan.clone(), *offset, *free);
                let last = self.tapes.len() - 1;
                self.restore(0, at).and_then(|x| {
                    self.rotor(
                        &plan.rotor,
                        offset,
                        (0, last, free),
                        x,
                        at,
                        grads,
                        &mut flow,
                    )
                })
            }
            Reverse::Profile(measuring) => {
                let measuring = measuring.clone();
                self.least(Some(&measuring), at, grads, &mut flow)
            }
        };
        crate::trace::set_segment(|| None);
        result.map_err(|e| match e {
            CheckpointError::Tensor(e) => e,
            e => crate::error::Error::Checkpoint(Box::new(e)),
        })?;
        // A forward of several regions reports them together (its start cleared the report).
        let replayed = self.replayed.take();
        flow.report.replayed_ops = replayed.ran;
        flow.report.kept_ops = replayed.kept;
        let report = match self.report.get() {
            Some(earlier) => ReverseReport {
                recomputed_steps: earlier.recomputed_steps + flow.report.recomputed_steps,
                replayed_steps: earlier.replayed_steps + flow.report.replayed_steps,
                peak_activations: earlier.peak_activations.max(flow.report.peak_activations),
                replayed_ops: earlier.replayed_ops + flow.report.replayed_ops,
                kept_ops: earlier.kept_ops + flow.report.kept_ops,
            },
            None => flow.report,
        };
        self.report.set(Some(report));
        let input = flow
            .grad
            .filter(|_| needs.first().copied().unwrap_or(false));
        for ((e, &returns), g) in self
            .externals
            .iter()
            .zip(&self.returns)
            .zip(flow.externals.iter_mut())
        {
            if !returns {
                if let Some(g) = g.take() {
                    self.shared.leave(e, g);
                }
            }
        }
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
