//! The checkpointer's errors, beside the runtime's own: each wraps the other.

use super::{Error, Shape};

/// Errors of the checkpointer; bad input is reported, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// No checkpoint at or before the layer asked for.
    #[error("no checkpoint for layer {layer} or any layer before it; stored: {stored:?}")]
    UnknownLayer {
        /// The layer asked for.
        layer: usize,
        /// The layers that have a checkpoint.
        stored: Vec<usize>,
    },
    /// [`Checkpointer::get`](crate::Checkpointer::get) of a layer that has no stored activation.
    #[error("no checkpoint is stored for layer {layer}; stored: {stored:?}")]
    NotStored {
        /// The layer asked for.
        layer: usize,
        /// The layers that have a checkpoint.
        stored: Vec<usize>,
    },
    /// [`Checkpointer::reverse`](crate::Checkpointer::reverse) with checkpoints saved by hand but no forward pass: there is no
    /// layer list to replay.
    #[error(
        "reverse needs the layer list of a checkpointed_forward, but none ran; {stored} \
         checkpoints were saved by hand and are kept"
    )]
    NoForward {
        /// How many checkpoints are stored.
        stored: usize,
    },
    /// A layer id that is not in the forward's layer list (or appears in it twice).
    #[error("layer {layer} {problem} the layer list of the forward pass ({count} layers)")]
    BadLayer {
        /// The layer.
        layer: usize,
        /// `"is not in"` or `"appears twice in"`.
        problem: &'static str,
        /// How many layers the list has.
        count: usize,
    },
    /// A save past [`CheckpointConfig::max_checkpoints`](crate::CheckpointConfig::max_checkpoints).
    #[error("saving layer {layer} would store {needed} checkpoints, past the limit of {limit}")]
    LimitExceeded {
        /// The layer being saved.
        layer: usize,
        /// Checkpoints that would be stored.
        needed: usize,
        /// The limit.
        limit: usize,
    },
    /// [`Policy::Memory`](crate::Policy::Memory) with a budget no schedule of the measured (or
    /// stated) costs fits in.
    #[error(
        "no schedule of these {layers} layers fits in {budget} bytes; the smallest budget that \
         fits is {smallest} bytes"
    )]
    MemoryBudgetTooSmall {
        /// The budget given.
        budget: usize,
        /// The smallest budget in bytes a schedule of the plan's class fits in, exactly.
        smallest: usize,
        /// The layers of the forward.
        layers: usize,
    },
    /// A recomputed activation whose shape differs from the one the forward pass produced.
    #[error(
        "recomputing the input of layer {layer} gave shape {got}, but the forward pass gave {expected}"
    )]
    ShapeDrift {
        /// The layer whose input drifted.
        layer: usize,
        /// Shape seen in the forward pass.
        expected: Shape,
        /// Shape seen on recompute.
        got: Shape,
    },
    /// A NaN or infinity in an activation being saved, or a value out of the storage type's range.
    #[error("the input of layer {layer} cannot be stored: {problem}")]
    BadValue {
        /// The layer being saved.
        layer: usize,
        /// What is wrong, with the first offending value.
        problem: String,
    },
    /// Storing an activation would hold more pool bytes than [`Policy::Budget`](crate::Policy::Budget) allows: the plan
    /// counted slots of the input's size, and this activation is larger.
    #[error(
        "storing the input of layer {layer} ({bytes} bytes in the pool) would hold {needed} bytes \
         of checkpoints, past the budget of {budget}: the plan counted slots of the input's size, \
         and this activation is larger; give a budget for the largest activation"
    )]
    BudgetExceeded {
        /// The layer whose input was being stored.
        layer: usize,
        /// What its checkpoint takes in the pool.
        bytes: usize,
        /// What every stored checkpoint would take with it.
        needed: usize,
        /// The budget.
        budget: usize,
    },
    /// A layer step of a recording checkpointed forward read a value of an earlier step other than
    /// its own input: replaying the steps one at a time cannot give that value its gradient.
    #[error(
        "a layer step of a checkpointed forward that records a gradient graph read a value computed \
         inside an earlier step, or by a step of an earlier region; a step may read the input or \
         output of an earlier step of its chain (a skip connection: a `let` of a `#[checkpoint]` \
         sequence naming an earlier `let`), else compute the value before the checkpointed chain"
    )]
    CrossStepValue,
    /// A `#[checkpoint]` chain's step reads the input of a step that is not before it, or the
    /// list of reads does not have one entry per step (`source` is `None`).
    #[error(
        "the checkpointed chain's step {step} of {steps} {}",
        match read {
            Some(read) => format!("reads the input of step {read}, which is not before it"),
            None => "has no list of the earlier steps it reads: give one per step".to_string(),
        }
    )]
    BadSkip {
        /// The step's position in the chain.
        step: usize,
        /// The position of the step whose input it reads.
        read: Option<usize>,
        /// The chain's number of steps.
        steps: usize,
    },
    /// A policy that cannot be followed (e.g. `Every(0)`, a budget too small for one activation).
    #[error("invalid checkpoint policy: {0}")]
    InvalidPolicy(String),
    /// An error of the pool or an op, e.g. an exhausted budget while storing.
    #[error(transparent)]
    Tensor(#[from] Error),
}

/// `Result` with [`CheckpointError`].
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;
