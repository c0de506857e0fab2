//! Lean recording, for checkpointed regions: the ops of one layer step recorded as a program (which
//! op, on which values) rather than as a graph that keeps what each op saved, and replayed from the
//! step's input when a backward needs the step.
//!
//! A region driver (`checkpoint::run_layers` in a recording forward) gives each layer step an input
//! whose node starts a [`Tape`]. An op with an input on a tape records its step there (the op without what it saved): its
//! inputs are values of the tape (the step's input, or an earlier op's output) or values from
//! outside (a parameter, a constant, a tensor computed before the region), kept as aliases. Nothing
//! else is kept, so the step's temporaries go back to the pool as the forward drops them. Replaying
//! the tape from the same input runs the same kernels on the same values: with recording on, it
//! builds the graph the plain forward would have built, bit for bit.
//!
//! A tape may keep the outputs of some ops (selective saving: the names in [`Tape::new`]'s
//! `keep`, matrix products under `checkpoint::Saving::Products`). A replay binds such an output
//! instead of running the op, and when it records, gives it the op's own node, whose backward
//! reads the op's inputs as the replay recomputed them.

use std::cell::RefCell;
use std::ops::Range;

use super::op::{Arg as OpArg, Inputs, Replayable, Step};
use super::NodeRef;
use crate::element::DType;
use crate::error::Result;
use crate::recycle::{RecycledRc, RecycledVec};
use crate::scope::State;
use crate::tensor::Tensor;

/// A value an op read, as the tape keeps it.
pub(crate) enum Arg<T: DType> {
    /// The step's input (0) or the output of the tape's op `i - 1` (`i`).
    Value(usize),
    /// A value from outside the step, and its graph node if it has one.
    Outside {
        node: Option<NodeRef<T>>,
        value: Tensor<'static, T>,
    },
}

/// One recorded op: how to run it (the op's record without what it saved), and where its
/// arguments are in the tape's list.
struct Op<T: DType> {
    step: Step<T>,
    args: Range<usize>,
}

/// The program of one layer step.
pub(crate) struct Tape<T: DType> {
    /// Tapes opened later have higher numbers: an op on values of two tapes belongs to the later.
    seq: u64,
    ops: RecycledVec<Op<T>>,
    /// The arguments of every op, one op's after another's (one list for the step, not one each).
    args: RecycledVec<Arg<T>>,
    /// What the step returned; `None` until the driver closes the tape.
    output: Option<Arg<T>>,
    /// What the tape does with the outputs of the ops a saving policy names.
    keep: Keep,
    /// Pool bytes of the outputs of the ops `Keep::Count` names.
    counted: usize,
}

/// What a tape does with the outputs of the ops a saving policy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Keeps them for replays (selective saving).
    Outputs(&'static [&'static str]),
    /// Keeps nothing and counts their pool bytes: what `Outputs` would keep.
    Count(&'static [&'static str]),
}

/// A tape's entry for a value of an earlier step that the step reads (a skip connection): its
/// one argument is that value, as the tape keeps it, and a replay passes on what the region's
/// backward gives for it (the value kept, the value recomputed, or a leaf for its gradient).
struct SkipRead;

impl<T: DType> Replayable<T> for SkipRead {
    fn replay(&self, mut args: Inputs<'_, 'static, T>, _: &State) -> Result<Tensor<'static, T>> {
        Ok(match args.take(0).expect("a skip read has its value") {
            OpArg::Owned(t) => t,
            OpArg::Borrowed(t) => t.clone(),
        })
    }

    fn is_op(&self) -> bool {
        false
    }

    fn move_accounting(&self, _: &State) {}

    fn recycle(self: Box<Self>) {}
}

/// What replays did: the ops they ran again, and those whose kept output they bound instead.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Replayed {
    pub(crate) ran: usize,
    pub(crate) kept: usize,
}

/// A tape shared by the nodes of the step's tensors.
pub(crate) type SharedTape<T> = RecycledRc<RefCell<Tape<T>>>;

/// A value from outside a step: its graph node, if any, and the value.
pub(crate) type Outside<'a, T> = (Option<&'a NodeRef<T>>, &'a Tensor<'static, T>);

impl<T: DType> Tape<T> {
    /// The tape's number in the order tapes were opened.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// Appends an op, `step`, reading `args` (taken out of the list); returns the value index of
    /// its output.
    pub(crate) fn push(&mut self, step: Step<T>, args: RecycledVec<Arg<T>>) -> usize {
        let start = self.args.len();
        let mut args = args;
        self.args.extend(args.drain(..));
        let args = start..self.args.len();
        self.ops.push(Op { step, args });
        self.ops.len()
    }

    /// The arguments of `op`.
    fn args_of(&self, op: &Op<T>) -> &[Arg<T>] {
        &self.args[op.args.clone()]
    }

    /// Appends a read of `value`, a value of an earlier step with its node `node` (a skip
    /// connection); returns the value index the step reads it at.
    pub(crate) fn push_skip(
        &mut self,
        node: Option<NodeRef<T>>,
        value: Tensor<'static, T>,
    ) -> usize {
        let mut args = RecycledVec::new();
        args.push(Arg::Outside { node, value });
        // A unit struct: the box allocates nothing.
        self.push(Step(Some(Box::new(SkipRead))), args)
    }

    /// Lets go of the values of earlier steps the step reads, once its backward has run (no
    /// replay runs it again).
    pub(crate) fn release_skips(&mut self) {
        for op in self.ops.iter().filter(|op| !op.step.get().is_op()) {
            for arg in &mut self.args[op.args.clone()] {
                *arg = Arg::Value(0);
            }
        }
    }

    /// Whether the tape keeps the outputs of ops named `name`.
    pub(crate) fn keeps(&self, name: &str) -> bool {
        matches!(self.keep, Keep::Outputs(names) if names.contains(&name))
    }

    /// Counts `bytes`, the output of an op named `name`, if the tape counts those.
    pub(crate) fn count(&mut self, name: &str, bytes: usize) {
        if matches!(self.keep, Keep::Count(names) if names.contains(&name)) {
            self.counted += crate::pool::class_bytes_of(bytes);
        }
    }

    /// Pool bytes of the outputs of the ops `Keep::Count` names (0 for a tape that keeps them).
    pub(crate) fn counted_bytes(&self) -> usize {
        self.counted
    }

    /// Whether the step is still running (its tape not closed).
    pub(crate) fn is_open(&self) -> bool {
        self.output.is_none()
    }

    /// Records what the step returned.
    pub(crate) fn close(&mut self, output: Arg<T>) {
        self.output = Some(output);
    }

    /// Moves the accounting of every value the tape keeps (from outside the step, and what its ops
    /// hold: ids, masks, kept outputs) to `target`, if `target` outlives their owners.
    pub(crate) fn move_accounting(&self, target: &State) {
        self.for_each_outside(&mut |(_, value)| value.move_accounting(target));
        for op in &self.ops {
            op.step.get().move_accounting(target);
        }
    }

    /// A hash of what determines the step's costs beyond its input: how many ops it ran, and the
    /// shapes of the values from outside it that they read (parameters, constants). Two runs of a
    /// step with equal fingerprints and inputs of one shape did the same work on the same shapes,
    /// unless an op's work depends on values.
    pub(crate) fn fingerprint(&self) -> u64 {
        // FNV-1a over the words, with a separator after each shape.
        let mix = |h: u64, word: u64| (h ^ word).wrapping_mul(0x0100_0000_01b3);
        let mut h = mix(0xcbf2_9ce4_8422_2325, self.ops.len() as u64);
        self.for_each_outside(&mut |(_, value)| {
            h = value.shape().iter().fold(h, |h, &d| mix(h, d as u64));
            h = mix(h, u64::MAX);
        });
        h
    }

    /// The pool bytes the tape keeps for replays: outputs of ops it keeps (and of ops without a
    /// derivative), until a replay that records takes them.
    pub(crate) fn kept_bytes(&self) -> usize {
        self.ops.iter().map(|op| op.step.get().kept_bytes()).sum()
    }

    /// Calls `f` on every value from outside the step (for moving their accounting, and for
    /// finding the graph nodes the step reads).
    pub(crate) fn for_each_outside(&self, f: &mut dyn FnMut(Outside<'_, T>)) {
        let args = self.args.iter().chain(&self.output);
        for arg in args {
            if let Arg::Outside { node, value } = arg {
                f((node.as_ref(), value));
            }
        }
    }

    /// An empty tape, for a step whose input is value 0, doing with the outputs of the ops a
    /// saving policy names what `keep` says.
    pub(crate) fn new(keep: Keep) -> SharedTape<T> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        RecycledRc::new(RefCell::new(Tape {
            seq: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ops: RecycledVec::new(),
            args: RecycledVec::new(),
            output: None,
            keep,
            counted: 0,
        }))
    }

    /// Which ops the step's output depends on, in a replay that records or not: the others need
    /// not run again.
    fn needed(&self, recording: bool) -> RecycledVec<bool> {
        let mut needed: RecycledVec<bool> = (0..=self.ops.len()).map(|_| false).collect();
        if let Some(Arg::Value(v)) = &self.output {
            needed[*v] = true;
        }
        for i in (0..self.ops.len()).rev() {
            // A kept output is not computed from its arguments.
            if needed[i + 1] && self.ops[i].step.get().reads_args(recording) {
                for arg in self.args_of(&self.ops[i]) {
                    if let Arg::Value(v) = arg {
                        needed[*v] = true;
                    }
                }
            }
        }
        needed
    }

    /// The op without a derivative that the step's output depends on, if any: a backward through
    /// the step fails naming it, as one through the same ops without a tape would.
    pub(crate) fn opaque_dependency(&self) -> Option<&'static str> {
        let needed = self.needed(true);
        self.ops
            .iter()
            .enumerate()
            .filter(|&(i, _)| needed[i + 1])
            .find_map(|(_, op)| op.step.get().kept().map(|(name, _)| name))
    }

    /// Runs the step again from `input`, in `at`: the ops its output depends on, no others, a kept
    /// output bound rather than computed; what ran and what was bound is added to `replayed`.
    /// Values from outside take `outside(node, value)`: the value itself for a values-only
    /// replay, or the value with a node for a replay that builds a graph (recording on). Every
    /// intermediate value is dropped as soon as no later op reads it.
    pub(crate) fn replay(
        &self,
        input: Tensor<'static, T>,
        at: &State,
        outside: &mut dyn FnMut(Outside<'_, T>) -> Tensor<'static, T>,
        replayed: &mut Replayed,
    ) -> Result<Tensor<'static, T>> {
        let recording = super::mode() != super::Mode::Off;
        let needed = self.needed(recording);
        let reads = |op: &Op<T>| op.step.get().reads_args(recording);
        let mut last_read: RecycledVec<usize> = (0..=self.ops.len()).map(|_| 0).collect();
        for (i, op) in self.ops.iter().enumerate().filter(|&(i, _)| needed[i + 1]) {
            for arg in self.args_of(op).iter().filter(|_| reads(op)) {
                if let Arg::Value(v) = arg {
                    last_read[*v] = i + 1;
                }
            }
        }
        let output = self.output.as_ref().expect("a replayed tape was closed");
        if let Arg::Value(v) = output {
            last_read[*v] = usize::MAX;
        }
        let mut values: RecycledVec<Option<Tensor<'static, T>>> = RecycledVec::new();
        values.push(Some(input.alias_in(at)));
        for (i, op) in self.ops.iter().enumerate() {
            if !needed[i + 1] {
                // Nothing the output depends on: not run again.
                values.push(None);
                continue;
            }
            let step = op.step.get();
            match (step.is_op(), step.reruns()) {
                (false, _) => {}
                (true, true) => replayed.ran += 1,
                (true, false) => replayed.kept += 1,
            }
            let args = self.args_of(op);
            let args = args[..if reads(op) { args.len() } else { 0 }].iter();
            let args = Inputs::owned(args.map(|arg| match arg {
                Arg::Value(v) => values[*v].clone().expect("read before its last reader"),
                Arg::Outside { node, value } => outside((node.as_ref(), value)).alias_in(at),
            }));
            values.push(Some(step.replay(args, at)?));
            for arg in self.args_of(op) {
                if let Arg::Value(v) = arg {
                    if last_read[*v] == i + 1 {
                        values[*v] = None;
                    }
                }
            }
        }
        Ok(match output {
            Arg::Value(v) => values[*v].take().expect("the output is kept"),
            Arg::Outside { node, value } => outside((node.as_ref(), value)),
        })
    }
}
