//! Lean recording, for checkpointed regions: the ops of one layer step recorded as a program (which
//! op, on which values) rather than as a graph that keeps what each op saved, and replayed from the
//! step's input when a backward needs the step.
//!
//! A region driver (`checkpoint::run_layers` in a recording forward) gives each layer step an input
//! whose node starts a [`Tape`]. An op with an input on a tape records its [`Replay`] there: its
//! inputs are values of the tape (the step's input, or an earlier op's output) or values from
//! outside (a parameter, a constant, a tensor computed before the region), kept as aliases. Nothing
//! else is kept, so the step's temporaries go back to the pool as the forward drops them. Replaying
//! the tape from the same input runs the same kernels on the same values: with recording on, it
//! builds the graph the plain forward would have built, bit for bit.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use ndarray::{Dimension, IxDyn};

use super::rules::Function;
use super::{NodeRef, Rule, Scalar, Unary};
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::Binary;
use crate::recycle::{RecycledRc, RecycledVec};
use crate::scope::State;
use crate::tensor::Tensor;
use crate::TensorOps;

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

/// How to run an op again: the op and its arguments other than the input tensors.
pub(crate) enum Replay<T: DType> {
    Binary(Binary),
    Scalar(Scalar, T),
    Unary(Unary),
    Map(Function<T>, Function<T>),
    Clamp(T, T),
    Softmax(usize),
    LogSoftmax(usize),
    LayerNorm(T),
    RmsNorm(T),
    GroupNorm(usize, T),
    Sum(usize),
    Mean(usize),
    Matmul,
    Permute(IxDyn),
    Narrow(usize, usize, usize),
    Reshape(IxDyn),
    Concat(usize),
    Conv2d(usize, usize),
    Upsample(usize),
    Mse,
    CrossEntropy(Tensor<'static, i64>),
    IndexSelect(usize, Tensor<'static, i64>),
    Gather(usize, Tensor<'static, i64>),
    Triangle(i64, bool),
    /// `where_cond` with this mask, on the op's two inputs.
    Where(Tensor<'static, u8>),
    MaskedFill(Tensor<'static, u8>, T),
    Pool2d(crate::ops::Pooling, usize, usize),
    /// An op without a derivative (`map`, `map_lanes`, `zip_map`): it cannot be run again, so its
    /// output is kept, and a backward that reaches it fails naming it, as without the tape.
    Kept(&'static str, Tensor<'static, T>),
}

impl<T: Element> Replay<T> {
    /// The op that made `rule` (whose output is `out`), without what the rule saved.
    pub(crate) fn of(rule: &Rule<T>, out: &Tensor<'_, T>) -> Self {
        let shape = out.shape();
        match rule {
            Rule::Add(..) => Replay::Binary(Binary::Add),
            Rule::Sub(..) => Replay::Binary(Binary::Sub),
            Rule::Mul(..) => Replay::Binary(Binary::Mul),
            Rule::Div(..) => Replay::Binary(Binary::Div),
            Rule::Scalar(kind, c, _) => Replay::Scalar(*kind, *c),
            Rule::Unary(kind, _) => Replay::Unary(*kind),
            Rule::Map(_, f, df) => Replay::Map(Arc::clone(f), Arc::clone(df)),
            Rule::Clamp(_, min, max) => Replay::Clamp(*min, *max),
            Rule::NotDifferentiable(op) => Replay::Kept(op, out.saved()),
            Rule::Softmax(_, axis) => Replay::Softmax(*axis),
            Rule::LogSoftmax(_, axis) => Replay::LogSoftmax(*axis),
            Rule::LayerNorm(_, _, eps) => Replay::LayerNorm(*eps),
            Rule::RmsNorm(_, eps) => Replay::RmsNorm(*eps),
            Rule::GroupNorm(_, _, groups, eps) => Replay::GroupNorm(*groups, *eps),
            Rule::Sum(axis, _) => Replay::Sum(*axis),
            Rule::Mean(axis, _) => Replay::Mean(*axis),
            Rule::Matmul(..) => Replay::Matmul,
            Rule::Permute(axes) => Replay::Permute(axes.clone()),
            Rule::Narrow(axis, start, _) => Replay::Narrow(*axis, *start, shape[*axis]),
            Rule::Reshape(_) => Replay::Reshape(IxDyn(shape)),
            Rule::Concat(axis, _) => Replay::Concat(*axis),
            Rule::Conv2d(_, _, stride, padding) => Replay::Conv2d(*stride, *padding),
            Rule::Upsample(scale) => Replay::Upsample(*scale),
            Rule::Mse(..) => Replay::Mse,
            Rule::CrossEntropy(_, labels) => Replay::CrossEntropy(labels.saved()),
            Rule::IndexSelect(axis, ids, _) => Replay::IndexSelect(*axis, ids.saved()),
            Rule::Gather(axis, index, _) => Replay::Gather(*axis, index.saved()),
            Rule::Triangle(k, upper) => Replay::Triangle(*k, *upper),
            Rule::Where(mask, ..) => Replay::Where(mask.saved()),
            Rule::MaskedFill(mask, value) => Replay::MaskedFill(mask.saved(), *value),
            Rule::Pool2d {
                kind,
                kernel,
                stride,
                ..
            } => Replay::Pool2d(*kind, *kernel, *stride),
            Rule::Region(_) => unreachable!("a region's output is never an op of a step"),
        }
    }

    /// Runs the op on `args`; it records (and so builds a graph) if they carry nodes.
    fn run(&self, args: &[Tensor<'static, T>]) -> Result<Tensor<'static, T>> {
        let a = &args[0];
        let b = || &args[1];
        match self {
            Replay::Binary(Binary::Add) => a.try_add(b()),
            Replay::Binary(Binary::Sub) => a.try_sub(b()),
            Replay::Binary(Binary::Mul) => a.try_mul(b()),
            Replay::Binary(Binary::Div) => a.try_div(b()),
            Replay::Binary(Binary::ZipMap) => Err(Error::NotDifferentiable { op: "zip_map" }),
            // With recording on, a node whose backward fails naming the op.
            Replay::Kept(op, value) => Ok(super::barrier(value.alias_in(&a.rents_in), op)),
            Replay::Scalar(kind, c) => crate::ops::scalar_op(a, *kind, *c),
            Replay::Unary(kind) => crate::ops::unary_op(a, *kind),
            Replay::Map(f, df) => {
                let (f, df) = (Arc::clone(f), Arc::clone(df));
                a.try_map_with_derivative(move |x| f(x), move |x| df(x))
            }
            Replay::Clamp(min, max) => a.try_clamp(*min, *max),
            Replay::Softmax(axis) => a.try_softmax(*axis),
            Replay::LogSoftmax(axis) => a.try_log_softmax(*axis),
            Replay::LayerNorm(eps) => a.try_layer_norm(*eps),
            Replay::RmsNorm(eps) => a.try_rms_norm(*eps),
            Replay::GroupNorm(groups, eps) => a.try_group_norm(*groups, *eps),
            Replay::Sum(axis) => a.try_sum(*axis),
            Replay::Mean(axis) => a.try_mean(*axis),
            Replay::Matmul => a.try_matmul(b()),
            Replay::Permute(axes) => a.try_permute(axes.slice()),
            Replay::Narrow(axis, start, len) => a.try_narrow(*axis, *start, *len),
            Replay::Reshape(shape) => a.try_reshape(shape.slice()),
            Replay::Concat(axis) => Tensor::try_concat(&args.iter().collect::<Vec<_>>(), *axis),
            Replay::Conv2d(stride, padding) => a.try_conv2d(b(), *stride, *padding),
            Replay::Upsample(scale) => a.try_upsample_nearest2d(*scale),
            Replay::Mse => a.try_mse(b()),
            Replay::CrossEntropy(labels) => a.try_cross_entropy_ids(labels),
            Replay::IndexSelect(axis, ids) => a.try_index_select(*axis, ids),
            Replay::Gather(axis, index) => a.try_gather(*axis, index),
            Replay::Triangle(k, upper) => a.triangle(*k, *upper),
            Replay::Where(mask) => mask.try_where_cond(a, b()),
            Replay::MaskedFill(mask, value) => a.try_masked_fill(mask, *value),
            Replay::Pool2d(kind, kernel, stride) => a.pool2d(*kind, *kernel, *stride),
        }
    }
}

/// One recorded op: how to run it, and where its arguments are in the tape's list.
struct Op<T: DType> {
    replay: Replay<T>,
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
    /// [`Replay::of`] for `T`: ops generic over every [`DType`] record through it, and only a float
    /// tape is ever made.
    replay_of: fn(&Rule<T>, &Tensor<'_, T>) -> Replay<T>,
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

    /// Appends the op that made `out` by `rule`, reading `args` (taken out of the list); returns the
    /// value index of its output.
    pub(crate) fn push(
        &mut self,
        rule: &Rule<T>,
        out: &Tensor<'_, T>,
        args: &mut [Option<Arg<T>>],
    ) -> usize {
        let replay = (self.replay_of)(rule, out);
        let start = self.args.len();
        self.args.extend(args.iter_mut().filter_map(Option::take));
        let args = start..self.args.len();
        self.ops.push(Op { replay, args });
        self.ops.len()
    }

    /// The arguments of `op`.
    fn args_of(&self, op: &Op<T>) -> &[Arg<T>] {
        &self.args[op.args.clone()]
    }

    /// Records what the step returned.
    pub(crate) fn close(&mut self, output: Arg<T>) {
        self.output = Some(output);
    }

    /// Moves the accounting of every value the tape keeps (from outside the step, kept outputs,
    /// and the ids and masks its ops read) to `target`, if `target` outlives their owners.
    pub(crate) fn move_accounting(&self, target: &State) {
        self.for_each_outside(&mut |(_, value)| value.move_accounting(target));
        for op in &self.ops {
            match &op.replay {
                Replay::IndexSelect(_, ids) | Replay::Gather(_, ids) => ids.move_accounting(target),
                Replay::Where(mask) | Replay::MaskedFill(mask, _) => mask.move_accounting(target),
                _ => {}
            }
        }
    }

    /// Calls `f` on every value from outside the step, and on every kept output (for moving their
    /// accounting, and for finding the graph nodes the step reads).
    pub(crate) fn for_each_outside(&self, f: &mut dyn FnMut(Outside<'_, T>)) {
        let args = self.args.iter().chain(&self.output);
        for arg in args {
            if let Arg::Outside { node, value } = arg {
                f((node.as_ref(), value));
            }
        }
        for op in &self.ops {
            if let Replay::Kept(_, value) = &op.replay {
                f((None, value));
            }
        }
    }
}

impl<T: Element> Tape<T> {
    /// An empty tape, for a step whose input is value 0.
    pub(crate) fn new() -> SharedTape<T> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        RecycledRc::new(RefCell::new(Tape {
            seq: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ops: RecycledVec::new(),
            args: RecycledVec::new(),
            output: None,
            replay_of: Replay::of,
        }))
    }

    /// Which ops the step's output depends on: the others need not run again.
    fn needed(&self) -> RecycledVec<bool> {
        let mut needed: RecycledVec<bool> = (0..=self.ops.len()).map(|_| false).collect();
        if let Some(Arg::Value(v)) = &self.output {
            needed[*v] = true;
        }
        for i in (0..self.ops.len()).rev() {
            // A kept output is not computed from its arguments.
            if needed[i + 1] && !matches!(self.ops[i].replay, Replay::Kept(..)) {
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
        let needed = self.needed();
        self.ops
            .iter()
            .enumerate()
            .filter(|&(i, _)| needed[i + 1])
            .find_map(|(_, op)| match &op.replay {
                Replay::Kept(name, _) => Some(*name),
                _ => None,
            })
    }

    /// Runs the step again from `input`, in `at`: the ops its output depends on, no others. Values
    /// from outside take `outside(node, value)`: the value itself for a values-only replay, or the
    /// value with a node for a replay that builds a graph. Every intermediate value is dropped as
    /// soon as no later op reads it.
    pub(crate) fn replay(
        &self,
        input: Tensor<'static, T>,
        at: &State,
        outside: &mut dyn FnMut(Outside<'_, T>) -> Tensor<'static, T>,
    ) -> Result<Tensor<'static, T>> {
        let needed = self.needed();
        let mut last_read: RecycledVec<usize> = (0..=self.ops.len()).map(|_| 0).collect();
        for (i, op) in self.ops.iter().enumerate().filter(|&(i, _)| needed[i + 1]) {
            for arg in self.args_of(op) {
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
            let args = self
                .args_of(op)
                .iter()
                .map(|arg| match arg {
                    Arg::Value(v) => values[*v].clone().expect("read before its last reader"),
                    Arg::Outside { node, value } => outside((node.as_ref(), value)).alias_in(at),
                })
                .collect::<RecycledVec<_>>();
            values.push(Some(op.replay.run(&args)?));
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
