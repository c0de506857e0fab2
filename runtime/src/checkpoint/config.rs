//! What a checkpointer stores: which layers' inputs, in which precision, and how many at most.

#[cfg(doc)]
use super::{binomial_recompute_steps, CheckpointError, Checkpointer};
use crate::element::Element;

/// Which layers' input activations a forward pass stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Every `k`-th layer, starting with the first: segments of `k` layers, `ceil(n / k)`
    /// checkpoints in inference. In training the last segment keeps its graph instead, so
    /// `ceil(n / k) - 1` are stored.
    Every(usize),
    /// Every `ceil(sqrt(n))`-th layer (Chen et al. 2016): about `2 sqrt(n)` activations live at the
    /// peak of the backward pass, for about one extra forward.
    Sqrt,
    /// These positions (0-based indices into the forward's layer list); the first layer is added
    /// if missing, since every recompute starts from a checkpoint.
    Explicit(Vec<usize>),
    /// As many stored activations as fit in this many bytes of pool budget, placed by binomial
    /// checkpointing (revolve) so that the reverse sweep recomputes the fewest layer steps; see
    /// [`binomial_recompute_steps`]. An activation counts what the pool holds for it: its bytes in
    /// the storage precision rounded up to the pool's size class (at most 25% more, see
    /// [`Pool`](crate::Pool)), so the stored checkpoints never take more pool memory than this.
    Budget(usize),
    /// The fastest schedule whose training step holds at most this many pool bytes: the stored
    /// checkpoints, the graphs and temporaries of the steps being run or replayed, and what the
    /// code after the layers (the loss) holds until their backward, above what is in use when the
    /// checkpointed forward starts, until the backward called on the loss ends (the optimizer's
    /// step after it is not counted). The chain's output counts from the start.
    ///
    /// The schedule is the optimum of the dynamic program for heterogeneous chains (Beaumont et
    /// al. 2019) on each step's measured costs: its forward and backward time, its input's bytes,
    /// and the pool bytes its forward, its recorded graph and its backward hold. They are measured
    /// by a *profiling step* (only the input is stored, every step is recomputed from it, and
    /// each step's peak is read off this thread's use of the pool), or stated with
    /// [`Checkpointer::set_costs`]. The first profiling step of a checkpointer that makes the
    /// parameters' gradients is followed by a second (a loop that keeps its gradients holds less
    /// from then on). The profiling step holds the least memory a schedule can, so
    /// it keeps every budget a schedule fits; a budget below the smallest feasible one then fails
    /// with [`CheckpointError::MemoryBudgetTooSmall`], which names that smallest budget, before
    /// the next step runs. With skip connections (a layer reading an earlier layer's value) this
    /// holds up to the skip values: a schedule that records more can hold less than the
    /// profiling step, which keeps every skip value as any schedule does and replays around it,
    /// so a fresh checkpointer's profiling steps can run above the smallest budget (by one
    /// activation, 4.8-5.5%, on the hostile review's chains); stated costs hold it from the first step.
    ///
    /// The costs are kept by what determines them: the input's shape, and for each step its
    /// input's shape, what its ops read (how many, of which shapes) and the bytes it was measured
    /// to hold (the last four kept: a last batch of another size each epoch is measured once). A
    /// forward of an input of another shape profiles; a step that differs from the plan's as the
    /// forward runs (another weight shape, a layer grown) makes the rest of that step hold the
    /// least memory and the next one profile ([`Checkpointer::plan_report`] says which ran).
    ///
    /// The plan is exact in bytes: no schedule the program considers that fits the budget is
    /// faster, and recording every layer's graph (no checkpoint) is chosen whenever it fits. Up to
    /// 100 layers, it considers every schedule of the paper's: each layer stored, recorded or
    /// replayed on its own. A longer chain is planned on 100 runs of consecutive layers (of equal
    /// length, to one layer), each stored, recorded or replayed as a whole; planning takes about
    /// as long as for 100 layers.
    ///
    /// A saving policy ([`CheckpointConfig::with_saving`]) is offered to the planner, not
    /// imposed: the profiling step keeps nothing and counts the bytes the saving would keep; if
    /// the least-memory schedule fits the budget with them, one more profiling step measures the
    /// steps keeping what the saving names (their kept bytes counted as held for the whole step,
    /// the dynamic program not placing them). Each budget then runs the faster of the two
    /// fastest schedules that fit, keeping nothing when they tie, so a saving never makes a
    /// budget fail that keeping nothing fits. Stated costs are those of steps keeping nothing.
    ///
    /// Storage is at full precision. A forward that records no graph has no backward to plan
    /// for: it stores the checkpoints of [`Policy::Sqrt`].
    Memory(usize),
}

/// How stored activations are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// As the activation's own element type: exact (`f32` for an `f32` model).
    #[default]
    Full,
    /// IEEE half precision: half the bytes of `f32`, about 3 significant digits, range +-65504.
    F16,
    /// bfloat16: half the bytes of `f32`, about 2 significant digits, `f32`'s range.
    Bf16,
}

impl Precision {
    pub(crate) fn bytes_per_element<T: Element>(self) -> usize {
        match self {
            Precision::Full => std::mem::size_of::<T>(),
            Precision::F16 | Precision::Bf16 => 2,
        }
    }
}

/// Which ops of a replayed layer step keep their outputs instead of running again: selective
/// saving, as JAX's `checkpoint_policies.dots_saveable` / `save_only_these_names` and PyTorch's
/// selective activation checkpointing (`policy_fn`) choose.
///
/// In a recording forward, a layer step on a tape keeps nothing by default, and its backward runs
/// every op of the step again. With a saving policy, the tape keeps the outputs of the ops it names
/// (pool buffers, counted in the pool's stats like any tensor, and held until the region's backward
/// has replayed that step with recording on); the replay binds each kept output instead of running
/// its op, and gives it the op's own graph node, whose backward reads the op's inputs as the
/// replay recomputed them. The gradients are those of the plain forward, bit for bit: the kept
/// output is the value the op computed, and its backward runs the same kernels on the same values.
///
/// What an op's backward saved beyond its inputs and its output (attention's log-sum-exp of each
/// query) is kept with the output. The ops upstream of a kept output still run in a replay that
/// records (the kept op's backward reads its inputs); a values-only replay (`Budget` and `Memory`
/// recomputing a boundary) skips whatever only a kept output depended on.
///
/// The bytes kept are on top of what a policy counts: [`Policy::Budget`] counts stored
/// activations only. [`Policy::Memory`] takes a saving as a choice of its planner: it measures
/// the steps keeping nothing and keeping, and runs whichever plan that fits is faster (see
/// [`Policy::Memory`]).
///
/// [`ReverseReport::replayed_ops`](super::ReverseReport::replayed_ops) and
/// [`ReverseReport::kept_ops`](super::ReverseReport::kept_ops) count what a backward ran again
/// and what it bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Saving {
    /// Keep nothing: a replay runs every op again (the least memory).
    #[default]
    Nothing,
    /// Keep the outputs of the matrix products, convolutions and fused attention
    /// ([`Saving::PRODUCTS`]): the expensive ops, whose outputs are few bytes for their work.
    /// Elementwise ops, norms and softmaxes run again.
    Products,
    /// Keep the outputs of the ops of these names (an op's [`Op::name`](crate::autograd::Op::name),
    /// the names errors give: `"matmul"`, `"softmax"`, `"gelu"`, a user's op's own). A name no op
    /// has keeps nothing. Ops without a derivative (`map`) keep their outputs whatever the policy.
    Ops(&'static [&'static str]),
}

impl Saving {
    /// The ops [`Saving::Products`] keeps: the matrix product (`Tensor::matmul`, which
    /// [`Linear`](crate::nn::Linear) and every batched product use), the convolutions and fused
    /// attention.
    pub const PRODUCTS: &'static [&'static str] =
        &["matmul", "conv1d", "conv2d", "scaled_dot_product_attention"];

    /// The names of the ops whose outputs a tape keeps under this policy.
    pub fn names(&self) -> &'static [&'static str] {
        match self {
            Saving::Nothing => &[],
            Saving::Products => Saving::PRODUCTS,
            Saving::Ops(names) => names,
        }
    }

    /// Whether an op named `op` keeps its output under this policy.
    pub fn keeps(&self, op: &str) -> bool {
        self.names().contains(&op)
    }
}

/// Settings of a [`Checkpointer`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckpointConfig {
    /// Which layers' inputs are stored.
    pub policy: Policy,
    /// How they are stored.
    pub precision: Precision,
    /// At most this many stored activations; a save past it fails with
    /// [`CheckpointError::LimitExceeded`].
    pub max_checkpoints: Option<usize>,
    /// Which ops of a replayed step keep their outputs ([`Saving::Nothing`] by default).
    pub saving: Saving,
    /// The `#[checkpoint]` function this config is of, if any: where a forward without a
    /// checkpointer keeps what `Policy::Memory` measured.
    pub(crate) site: Option<&'static str>,
}

impl CheckpointConfig {
    /// A config with `policy`, full precision and no limit.
    pub fn new(policy: Policy) -> Self {
        CheckpointConfig {
            policy,
            precision: Precision::Full,
            max_checkpoints: None,
            saving: Saving::Nothing,
            site: None,
        }
    }

    /// The same config for the `#[checkpoint]` function at `site` (its module, line and column):
    /// a forward of it without a checkpointer keeps the costs `Policy::Memory` measured for the
    /// next one, on this thread. Used by the attribute's expansion.
    #[doc(hidden)]
    pub fn at_site(mut self, site: &'static str) -> Self {
        self.site = Some(site);
        self
    }

    /// The same config storing activations in `precision`.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The same config keeping the outputs `saving` names in the layer steps a backward replays
    /// (see [`Saving`]).
    ///
    /// ```
    /// use tensorscope::checkpoint::Saving;
    /// use tensorscope::{CheckpointConfig, Policy};
    ///
    /// let config = CheckpointConfig::new(Policy::Sqrt).with_saving(Saving::Products);
    /// assert!(config.saving.keeps("matmul") && !config.saving.keeps("gelu"));
    /// let named = config.with_saving(Saving::Ops(&["matmul", "softmax"]));
    /// assert!(named.saving.keeps("softmax"));
    /// ```
    pub fn with_saving(mut self, saving: Saving) -> Self {
        self.saving = saving;
        self
    }

    /// The same config with at most `max` stored activations.
    pub fn with_max_checkpoints(mut self, max: usize) -> Self {
        self.max_checkpoints = Some(max);
        self
    }
}
