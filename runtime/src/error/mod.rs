//! The runtime's errors, in one place: [`Error`], the checkpointer's [`CheckpointError`] (each
//! wraps the other), and the panicking twins of the `try_` forms.
//!
//! Every fallible operation has a `try_` form returning [`Result`]; the panicking form panics with the
//! same message, so the words a user reads are the same either way.

pub(crate) mod checkpoint;

use std::fmt;

use checkpoint::CheckpointError;

/// A shape, printed as `[2, 3]`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<usize>);

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<&[usize]> for Shape {
    fn from(s: &[usize]) -> Self {
        Shape(s.to_vec())
    }
}

/// Errors of the pool, scopes and tensor ops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rent would need more memory than the budget allows even after evicting every idle buffer.
    #[error(
        "pool budget exceeded: requested {requested} bytes ({class_bytes} with size-class rounding) \
         while {in_use} bytes are in use and {cached} cached, limit {limit} bytes"
    )]
    BudgetExceeded {
        /// Bytes asked for.
        requested: usize,
        /// Bytes of the size class the request rounds up to.
        class_bytes: usize,
        /// Bytes rented out and not yet returned.
        in_use: usize,
        /// Bytes held idle in the pool.
        cached: usize,
        /// The configured budget.
        limit: usize,
    },
    /// A scope's own byte limit (see [`scope_with_budget`](crate::Scope::scope_with_budget)) would be passed.
    #[error(
        "scope budget exceeded: requested {requested} bytes (size class) while the scope and its \
         children hold {in_use}, scope limit {limit} bytes"
    )]
    ScopeBudgetExceeded {
        /// Bytes of the size class asked for.
        requested: usize,
        /// Bytes held by the budgeted scope and its descendants.
        in_use: usize,
        /// The scope's limit.
        limit: usize,
    },
    /// The system allocator could not provide a fresh buffer.
    #[error("the system allocator failed to provide {bytes} bytes")]
    AllocationFailed {
        /// Bytes asked of the allocator.
        bytes: usize,
    },
    /// The byte size of a shape does not fit in `usize`.
    #[error("shape {shape} of {elem_bytes}-byte elements overflows the addressable byte count")]
    SizeOverflow {
        /// The shape asked for.
        shape: Shape,
        /// Size of one element in bytes.
        elem_bytes: usize,
    },
    /// An op's output size, computed from an operand such as a padding or a scale factor, does not
    /// fit: the arithmetic overflows, or the output would pass ndarray's `isize::MAX`-byte limit.
    #[error(
        "{op}: {operand} {value} on an input of shape {shape} gives an output too large to address"
    )]
    DimensionOverflow {
        /// The operation, e.g. `"conv2d"`.
        op: &'static str,
        /// The operand that makes the output too large, e.g. `"padding"`.
        operand: &'static str,
        /// Its value.
        value: usize,
        /// The shape of the input.
        shape: Shape,
    },
    /// Two operands' shapes do not fit together for `op`.
    #[error("{op}: incompatible shapes {lhs} and {rhs}: {reason}")]
    ShapeMismatch {
        /// The operation, e.g. `"matmul"`.
        op: &'static str,
        /// Shape of the left operand.
        lhs: Shape,
        /// Shape of the right operand.
        rhs: Shape,
        /// What exactly does not fit.
        reason: String,
    },
    /// An op that joins tensors was given none.
    #[error("{op}: needs at least one tensor, got an empty list")]
    NoInputs {
        /// The operation.
        op: &'static str,
    },
    /// One operand's shape is not accepted by `op`.
    #[error("{op}: invalid shape {shape}: {reason}")]
    InvalidShape {
        /// The operation.
        op: &'static str,
        /// The offending shape.
        shape: Shape,
        /// What is wrong with it.
        reason: String,
    },
    /// An axis index past the tensor's rank (from the front, or from the back when negative).
    #[error("{op}: axis {axis} is out of range for a tensor of rank {ndim}")]
    AxisOutOfRange {
        /// The operation.
        op: &'static str,
        /// The axis asked for, as given (negative counts from the back).
        axis: isize,
        /// The tensor's rank.
        ndim: usize,
    },
    /// `backward` from a tensor that holds more than one element: its gradient is not implied.
    #[error(
        "backward: the tensor has shape {shape}; backward starts from a single value (a loss), or \
         use backward_with and give the gradient of the output"
    )]
    BackwardNeedsScalar {
        /// The tensor's shape.
        shape: Shape,
    },
    /// `backward` from a tensor computed from nothing that needs a gradient.
    #[error(
        "backward: the tensor carries no gradient graph; it depends on no parameter bound in a \
         training scope (`pool.train`, `scope.train`) and no tensor marked with `requires_grad`"
    )]
    NoGraph,
    /// `backward` through a part of a graph whose saved values an earlier backward already released.
    #[error(
        "backward: the graph was already used by a backward pass, which released what it saved; \
         run the forward again"
    )]
    GraphConsumed,
    /// `backward` through an op that has no derivative (`map`, `zip_map`, `map_lanes`, `cast`).
    /// Data brought in from a [`Param`](crate::Param) (a batch, labels) meets this when bound
    /// with [`Scope::bind`](crate::Scope::bind) in a training scope, where a bound parameter is a
    /// gradient leaf: `s.bind(&batch).without_grad()` brings it in as data.
    #[error(
        "backward: {op} has no derivative; use map_with_derivative for an elementwise function, or \
         keep it out of the differentiated path (without_grad); data bound from a Param in a \
         training scope is a gradient leaf unless bound as s.bind(&data).without_grad()"
    )]
    NotDifferentiable {
        /// The op.
        op: &'static str,
    },
    /// An op's backward returned a gradient whose shape is not its input's (PyTorch's "returned
    /// an invalid gradient"); nothing was added.
    #[error(
        "backward: {op} returned an invalid gradient for input {index}: got shape {got}, expected \
         the input's shape {expected}"
    )]
    InvalidGradient {
        /// The op, as it names itself.
        op: &'static str,
        /// The input the gradient is for.
        index: usize,
        /// The gradient's shape.
        got: Shape,
        /// The input's shape.
        expected: Shape,
    },
    /// An op's backward returned gradients for inputs it does not have; nothing was added.
    #[error("backward: {op} returned {got} gradients for {inputs} inputs")]
    TooManyGradients {
        /// The op, as it names itself.
        op: &'static str,
        /// How many gradients it returned (up to the last that is not `None`).
        got: usize,
        /// How many inputs it has.
        inputs: usize,
    },
    /// A write through `view_mut` into a tensor that carries a gradient graph.
    #[error(
        "{op}: the tensor carries a gradient graph, and a write would make its gradient wrong; write \
         into `without_grad()` of it, or use tensor ops"
    )]
    WriteToGraph {
        /// The op.
        op: &'static str,
    },
    /// The backward of a checkpointed region could not replay it (a recomputed activation of
    /// another shape, a checkpoint missing).
    #[error(transparent)]
    Checkpoint(Box<CheckpointError>),
    /// A backward whose graph reaches a tensor computed inside a layer step of a checkpointed
    /// region: the step's graph exists only when the region replays it. Either the backward was
    /// called on such a tensor, or the code after the region (the loss, or a step that records its
    /// graph) read a value of a taped step other than the region's output: a skip connection
    /// from inside the region that the chain was not told of (a `#[checkpoint]` sequence's skip
    /// reads carry their values out of a region).
    #[error(
        "backward: the graph reaches a tensor computed inside a layer step of a #[checkpoint] \
         region, whose graph is built only when the region's backward replays it. If backward was \
         called on such a tensor, call it on the region's output or on a loss computed from it; if \
         the loss or a later step read a value of a step other than through the activation (a skip \
         connection from inside the region), write the layers as a #[checkpoint] sequence of \
         `let`s, whose later `let`s may read earlier ones, or compute that value before the \
         checkpointed loop"
    )]
    BackwardInsideCheckpoint,
    /// One parameter's gradient would sum contributions computed from two different copies of its
    /// values: a clone written after cloning (copy on write) is still the same parameter.
    #[error(
        "backward: a parameter of shape {shape} was used with two different copies of its values (a \
         clone written after cloning is still the same parameter); use one handle, or make an \
         independent parameter with Param::duplicate"
    )]
    ParamUsedWithTwoValues {
        /// The parameter's shape.
        shape: Shape,
    },
    /// An optimizer was given a gradient computed from other values than the parameter holds now:
    /// the parameter was written after the forward (an earlier step with these gradients, an
    /// in-place write through `view_mut`, a load), or the forward used a clone of it that an
    /// earlier update (copy on write) left behind. PyTorch's "modified by an inplace operation".
    #[error(
        "optimizer: the gradient of parameter #{index} (shape {shape}) was computed from values it \
         no longer holds: it was written after the forward (an earlier step with these gradients, \
         an in-place write, a load), or the forward used a clone that an update left behind; \
         compute the gradients again from the parameters as they are"
    )]
    StaleGradient {
        /// The parameter's position in the set given to the optimizer.
        index: usize,
        /// Its shape.
        shape: Shape,
    },
    /// A class label past the number of classes.
    #[error("{op}: label {label} of row {row} is out of range for {classes} classes")]
    LabelOutOfRange {
        /// The operation.
        op: &'static str,
        /// The row of the batch.
        row: usize,
        /// The label given.
        label: usize,
        /// The number of classes (the logits' last axis).
        classes: usize,
    },
    /// An index (a token id, a gathered position) outside the axis it indexes.
    #[error("{op}: index {index} is out of range for axis {axis} of length {len}")]
    IndexOutOfRange {
        /// The operation.
        op: &'static str,
        /// The index given.
        index: i64,
        /// The axis it indexes.
        axis: usize,
        /// That axis's length.
        len: usize,
    },
    /// An argument outside the values an op accepts (a zero step, a kernel larger than the
    /// image), named with the reason.
    #[error("{op}: invalid {arg}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A data slice whose length does not match the shape's element count.
    #[error("{op}: shape {shape} holds {expected} elements but {got} were given")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// The shape asked for.
        shape: Shape,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },
}

/// `Result` with the runtime's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Unwraps a `try_` result for the panicking form of an API, with the error's own message.
#[track_caller]
pub(crate) fn or_panic<T>(r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// The panicking twins of `try_` methods, one line each: `fn name(args) -> Out = try_name;` makes
/// a `#[track_caller]` method that calls `try_name` with the same arguments and panics with the
/// error's message, documented as such. Receivers `&self`, `&mut self` and `self`, and associated functions
/// (`fn concat(..) -> Out = Self::try_concat;`), with simple generics (`<U: DType>`).
macro_rules! panicking {
    () => {};
    ($(#[doc = $doc:literal])* $vis:vis fn $name:ident $(<$($lt:lifetime,)* $($g:ident: $b:path),+>)?
        (&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty = $try:ident; $($rest:tt)*) => {
        $(#[doc = $doc])*
        #[doc = $crate::error::panicking!(@doc $try)]
        ///
        /// # Panics
        /// Where that returns an error, with the error's message.
        #[track_caller]
        $vis fn $name $(<$($lt,)* $($g: $b),+>)? (&self $(, $arg: $ty)*) -> $ret {
            $crate::error::or_panic(self.$try($($arg),*))
        }
        $crate::error::panicking!($($rest)*);
    };
    ($(#[doc = $doc:literal])* $vis:vis fn $name:ident $(<$($lt:lifetime,)* $($g:ident: $b:path),+>)?
        (&mut self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty = $try:ident; $($rest:tt)*) => {
        $(#[doc = $doc])*
        #[doc = $crate::error::panicking!(@doc $try)]
        ///
        /// # Panics
        /// Where that returns an error, with the error's message.
        #[track_caller]
        $vis fn $name $(<$($lt,)* $($g: $b),+>)? (&mut self $(, $arg: $ty)*) -> $ret {
            $crate::error::or_panic(self.$try($($arg),*))
        }
        $crate::error::panicking!($($rest)*);
    };
    ($(#[doc = $doc:literal])* $vis:vis fn $name:ident $(<$($lt:lifetime,)* $($g:ident: $b:path),+>)?
        (self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty = $try:ident; $($rest:tt)*) => {
        $(#[doc = $doc])*
        #[doc = $crate::error::panicking!(@doc $try)]
        ///
        /// # Panics
        /// Where that returns an error, with the error's message.
        #[track_caller]
        $vis fn $name $(<$($lt,)* $($g: $b),+>)? (self $(, $arg: $ty)*) -> $ret {
            $crate::error::or_panic(self.$try($($arg),*))
        }
        $crate::error::panicking!($($rest)*);
    };
    ($(#[doc = $doc:literal])* $vis:vis fn $name:ident $(<$($lt:lifetime,)* $($g:ident: $b:path),+>)?
        ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = Self::$try:ident; $($rest:tt)*) => {
        $(#[doc = $doc])*
        #[doc = $crate::error::panicking!(@doc $try)]
        ///
        /// # Panics
        /// Where that returns an error, with the error's message.
        #[track_caller]
        $vis fn $name $(<$($lt,)* $($g: $b),+>)? ($($arg: $ty),*) -> $ret {
            $crate::error::or_panic(Self::$try($($arg),*))
        }
        $crate::error::panicking!($($rest)*);
    };
    (@doc $try:ident) => {
        concat!(
            "The panicking form of [`", stringify!($try), "`](Self::", stringify!($try),
            "), which says what it does and what fails."
        )
    };
}
pub(crate) use panicking;
