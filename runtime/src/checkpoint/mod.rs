//! Activation checkpointing: keep a few activations of a forward pass and recompute the others when
//! the backward pass needs them.
//!
//! A [`Checkpointer`] runs a forward over a list of layers ([`Checkpointer::checkpointed_forward`]),
//! stores the input activations of the layers its [`Policy`] picks (as [`Param`]s, outside every
//! scope, in `f32`, `f16` or `bf16`), and later either recomputes any one activation from the nearest checkpoint
//! ([`Checkpointer::recompute_from_checkpoint`]) or drives a whole reverse sweep
//! ([`Checkpointer::reverse`]), handing each layer's input to a backward callback in reverse order.
//!
//! The activation index convention: `a_0` is the input, `a_{i+1} = f(a_i, layers[i])`; "the checkpoint
//! of layer `L`" is the input of layer `L`.
//!
//! ```
//! use tensorscope_runtime::checkpoint::{CheckpointConfig, Checkpointer, Policy};
//! use tensorscope_runtime::{Pool, Tensor, TensorOps};
//!
//! /// One layer of the model: any function of the activation and the layer index.
//! fn step<'s>(x: &Tensor<'s>, i: usize) -> Tensor<'s> {
//!     (x * 1.01 + i as f32).tanh()
//! }
//!
//! let pool = Pool::with_max_memory_mb(64);
//! pool.scope(|s| {
//!     let layers: Vec<usize> = (0..16).collect();
//!     let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(4)));
//!     let out = ckpt.checkpointed_forward(&s.ones::<f32>(&[8]), &layers, step).unwrap();
//!     assert_eq!(ckpt.stored_layers(), vec![0, 4, 8, 12]); // the inputs of these layers
//!     let a9 = ckpt.recompute_from_checkpoint(s, 9, &layers, step).unwrap();
//!     let replayed = (9..16).fold(a9, |x, i| step(&x, i));
//!     assert_eq!(replayed.to_vec(), out.to_vec()); // bit for bit at full precision
//! });
//! ```

mod schedule;

use std::collections::BTreeMap;
use std::rc::Rc;

use half::{bf16, f16};

pub use schedule::{binomial_recompute_steps, revolve_forward_steps};

use crate::element::Element;
use crate::error::{Error, Shape};
use crate::param::Param;
use crate::scope::{run, Scope, ScopeState};
use crate::tensor::Tensor;

/// Which layers' input activations a forward pass stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    /// Every `k`-th layer, starting with the first: `n / k` checkpoints, segments of `k` layers.
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
    /// [`crate::Pool`]), so the stored checkpoints never take more pool memory than this.
    Budget(usize),
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
    fn bytes_per_element<T: Element>(self) -> usize {
        match self {
            Precision::Full => std::mem::size_of::<T>(),
            Precision::F16 | Precision::Bf16 => 2,
        }
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
}

impl CheckpointConfig {
    /// A config with `policy`, full precision and no limit.
    pub fn new(policy: Policy) -> Self {
        CheckpointConfig {
            policy,
            precision: Precision::Full,
            max_checkpoints: None,
        }
    }

    /// The same config storing activations in `precision`.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// The same config with at most `max` stored activations.
    pub fn with_max_checkpoints(mut self, max: usize) -> Self {
        self.max_checkpoints = Some(max);
        self
    }
}

/// Errors of the checkpointer; bad input is reported, never a panic.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
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
    /// [`Checkpointer::get`] of a layer that has no stored activation.
    #[error("no checkpoint is stored for layer {layer}; stored: {stored:?}")]
    NotStored {
        /// The layer asked for.
        layer: usize,
        /// The layers that have a checkpoint.
        stored: Vec<usize>,
    },
    /// [`Checkpointer::reverse`] with checkpoints saved by hand but no forward pass: there is no
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
    /// A save past [`CheckpointConfig::max_checkpoints`].
    #[error("saving layer {layer} would store {needed} checkpoints, past the limit of {limit}")]
    LimitExceeded {
        /// The layer being saved.
        layer: usize,
        /// Checkpoints that would be stored.
        needed: usize,
        /// The limit.
        limit: usize,
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
    /// A policy that cannot be followed (e.g. `Every(0)`, a budget too small for one activation).
    #[error("invalid checkpoint policy: {0}")]
    InvalidPolicy(String),
    /// An error of the pool or an op, e.g. an exhausted budget while storing.
    #[error(transparent)]
    Tensor(#[from] Error),
}

/// `Result` with [`CheckpointError`].
pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

/// What a reverse sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ReverseReport {
    /// Layer steps recomputed (forward evaluations beyond the original forward pass).
    pub recomputed_steps: usize,
    /// The most activations held at once: stored checkpoints plus recomputed ones.
    pub peak_activations: usize,
}

/// A stored activation, in its storage precision, as a parameter (outside every scope).
enum Stored<T: Element> {
    Full(Param<T>),
    F16(Param<f16>),
    Bf16(Param<bf16>),
}

impl<T: Element> Stored<T> {
    fn data_bytes(&self) -> usize {
        match self {
            Stored::Full(p) => p.data_bytes(),
            Stored::F16(p) => p.data_bytes(),
            Stored::Bf16(p) => p.data_bytes(),
        }
    }

    /// The activation as `T`: the stored parameter at full precision, a converted copy otherwise.
    fn to_param(&self) -> Result<Param<T>> {
        Ok(match self {
            Stored::Full(p) => p.clone(),
            Stored::F16(p) => p.try_cast()?,
            Stored::Bf16(p) => p.try_cast()?,
        })
    }

    /// The activation as a tensor of `scope`: bound (no copy) at full precision, converted into a
    /// tensor rented there otherwise.
    fn restore<'s>(&self, scope: &Rc<ScopeState>) -> Result<Tensor<'s, T>> {
        Ok(match self {
            Stored::Full(p) => Tensor::bound(scope, p),
            Stored::F16(p) => Tensor::bound(scope, p).try_cast()?,
            Stored::Bf16(p) => Tensor::bound(scope, p).try_cast()?,
        })
    }
}

/// Stores checkpoints of a forward pass and recomputes activations from them; see the module docs.
pub struct Checkpointer<T: Element = f32> {
    config: CheckpointConfig,
    stored: BTreeMap<usize, Stored<T>>,
    /// The last forward's layer list, the shapes of its activations `a_0 .. a_{n-1}`, and the
    /// positions it stored.
    layers: Vec<usize>,
    shapes: Vec<Vec<usize>>,
    plan: Vec<usize>,
    /// Slots of the binomial schedule of the last forward (`Policy::Budget` only).
    slots: usize,
    saved_bytes: usize,
}

impl<T: Element> Checkpointer<T> {
    /// A checkpointer with `config` and nothing stored. The policy is checked when a forward plans
    /// with it.
    pub fn new(config: CheckpointConfig) -> Self {
        Checkpointer {
            config,
            stored: BTreeMap::new(),
            layers: Vec::new(),
            shapes: Vec::new(),
            plan: Vec::new(),
            slots: 0,
            saved_bytes: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// Stored activations.
    pub fn num_checkpoints(&self) -> usize {
        self.stored.len()
    }

    /// Bytes of the stored activations, in their storage precision.
    pub fn memory_stored_bytes(&self) -> usize {
        self.stored.values().map(Stored::data_bytes).sum()
    }

    /// Bytes of the activations the last forward pass computed but did not store.
    pub fn memory_saved_bytes(&self) -> usize {
        self.saved_bytes
    }

    /// The layers that have a checkpoint, in order.
    pub fn stored_layers(&self) -> Vec<usize> {
        self.stored.keys().copied().collect()
    }

    /// Whether the policy stores the input of `layer`.
    ///
    /// After a forward pass: whether that forward's plan stored it (`false` for an id that was not
    /// in its layer list). Before any forward, the id is taken as a position: `Every(k)` and
    /// `Explicit` answer from the policy alone, and every policy stores position 0; `Sqrt` and
    /// `Budget` place the rest by the layer count, unknown until a forward, so they answer `false`
    /// for every other position.
    pub fn is_checkpoint_layer(&self, layer: usize) -> bool {
        if !self.layers.is_empty() {
            return self
                .layers
                .iter()
                .position(|&l| l == layer)
                .is_some_and(|pos| self.plan.binary_search(&pos).is_ok());
        }
        match &self.config.policy {
            _ if layer == 0 => true,
            Policy::Every(k) => layer.is_multiple_of(*k),
            Policy::Explicit(positions) => positions.contains(&layer),
            Policy::Sqrt | Policy::Budget(_) => false,
        }
    }

    /// Drops every stored activation (their buffers go back to the pool).
    pub fn clear(&mut self) {
        self.stored.clear();
        self.plan.clear();
        self.slots = 0;
        self.saved_bytes = 0;
    }

    /// Stores `activation` as the input of `layer`, in the configured precision, replacing an earlier
    /// one. Fails with [`CheckpointError::LimitExceeded`] past the limit, with
    /// [`CheckpointError::BadValue`] for a NaN or infinity (or a value beyond `f16`'s range when
    /// storing as `f16`), and with a budget error if the pool cannot hold the copy.
    pub fn save(&mut self, layer: usize, activation: &Tensor<'_, T>) -> Result<()> {
        self.store(layer, activation.clone()).map(drop)
    }

    /// Stores `activation` as the input of `layer` (see [`Checkpointer::save`]) and returns the
    /// tensor to go on with. At full precision the activation's buffer becomes the stored parameter
    /// without a copy when `activation` is its only handle and carries no gradient graph, and the
    /// forward goes on with that parameter bound into the activation's scope; otherwise the values
    /// are copied and the forward goes on with `activation`.
    fn store<'s>(&mut self, layer: usize, activation: Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        if let Some(limit) = self.config.max_checkpoints {
            let needed = self.stored.len() + usize::from(!self.stored.contains_key(&layer));
            if needed > limit {
                return Err(CheckpointError::LimitExceeded {
                    layer,
                    needed,
                    limit,
                });
            }
        }
        if let Some(v) = activation.as_slice().iter().find(|v| !v.is_finite()) {
            return Err(CheckpointError::BadValue {
                layer,
                problem: format!("it holds {v}"),
            });
        }
        let (stored, next) = match self.config.precision {
            // A gradient graph runs through the activation: the forward goes on with it, so that a
            // backward reaches the layers before, and the checkpoint is a copy.
            Precision::Full if activation.has_graph() => {
                (Stored::Full(activation.saved().try_detach()?), activation)
            }
            Precision::Full => {
                let scope = Rc::clone(&activation.scope);
                let param = activation.try_detach()?;
                // The stored values, not a parameter to train: no leaf, also in a training scope.
                let next = Tensor::bound(&scope, &param).without_grad();
                (Stored::Full(param), next)
            }
            Precision::F16 => (Stored::F16(narrowed(layer, &activation)?), activation),
            Precision::Bf16 => (Stored::Bf16(narrowed(layer, &activation)?), activation),
        };
        self.stored.insert(layer, stored);
        Ok(next)
    }

    /// The stored input of `layer`: the stored parameter itself at full precision, a converted copy
    /// at `f16`/`bf16`. Fails with [`CheckpointError::NotStored`].
    pub fn get(&self, layer: usize) -> Result<Param<T>> {
        match self.stored.get(&layer) {
            Some(stored) => stored.to_param(),
            None => Err(CheckpointError::NotStored {
                layer,
                stored: self.stored_layers(),
            }),
        }
    }

    /// Positions to store for `n` layers whose activations hold `activation_bytes` each (as `T`).
    pub(crate) fn plan(&self, n: usize, activation_elems: usize) -> Result<(Vec<usize>, usize)> {
        if n == 0 {
            return Ok((Vec::new(), 0));
        }
        let every = |k: usize| (0..n).step_by(k).collect::<Vec<_>>();
        let (plan, slots) = match &self.config.policy {
            Policy::Every(0) => {
                return Err(CheckpointError::InvalidPolicy(
                    "Every(0) has no step; use Every(k) with k >= 1".into(),
                ))
            }
            Policy::Every(k) => (every(*k), 0),
            Policy::Sqrt => (every(((n as f64).sqrt().ceil() as usize).max(1)), 0),
            Policy::Explicit(positions) => {
                if let Some(&p) = positions.iter().find(|&&p| p >= n) {
                    return Err(CheckpointError::InvalidPolicy(format!(
                        "explicit checkpoint position {p} is past the last of {n} layers"
                    )));
                }
                let mut plan = positions.clone();
                plan.push(0);
                plan.sort_unstable();
                plan.dedup();
                (plan, 0)
            }
            Policy::Budget(bytes) => {
                let data =
                    activation_elems.saturating_mul(self.config.precision.bytes_per_element::<T>());
                let per = crate::pool::class_bytes_of(data);
                let slots = bytes.checked_div(per).unwrap_or(n);
                if slots == 0 {
                    return Err(CheckpointError::InvalidPolicy(format!(
                        "a budget of {bytes} bytes holds no stored activation of {per} bytes \
                         ({data} bytes of data in the pool's size class)"
                    )));
                }
                let slots = slots.min(n.max(1));
                (schedule::binomial_chain(n, slots), slots)
            }
        };
        Ok((plan, slots))
    }

    /// Runs `forward(activation, layer)` for each of `layers` in order from `input`, storing the inputs
    /// of the layers the policy picks (earlier checkpoints are dropped first), and returns the last
    /// output. Layer ids must be distinct.
    pub fn checkpointed_forward<'s>(
        &mut self,
        input: &Tensor<'s, T>,
        layers: &[usize],
        mut forward: impl FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        let mut seen = std::collections::HashSet::with_capacity(layers.len());
        if let Some(&layer) = layers.iter().find(|&&l| !seen.insert(l)) {
            return Err(CheckpointError::BadLayer {
                layer,
                problem: "appears twice in",
                count: layers.len(),
            });
        }
        self.begin(layers, input)?;
        let mut x = input.clone();
        for (pos, &layer) in layers.iter().enumerate() {
            x = self.record(pos, x)?;
            x = forward(&x, layer);
        }
        Ok(x)
    }

    /// Starts a forward over `layers` from `input`: plans, and drops earlier checkpoints.
    pub(crate) fn begin(&mut self, layers: &[usize], input: &Tensor<'_, T>) -> Result<()> {
        let (plan, slots) = self.plan(layers.len(), input.len())?;
        if let Some(limit) = self.config.max_checkpoints {
            if plan.len() > limit {
                return Err(CheckpointError::LimitExceeded {
                    layer: layers[plan[limit]],
                    needed: plan.len(),
                    limit,
                });
            }
        }
        self.clear();
        self.layers = layers.to_vec();
        self.shapes.clear();
        self.plan = plan;
        self.slots = slots;
        Ok(())
    }

    /// Records `x`, the input of the layer at `pos`: stored if the plan says so, else counted saved.
    /// Returns the tensor to go on with (the stored values, bound, when they were stored without a
    /// copy).
    pub(crate) fn record<'s>(&mut self, pos: usize, x: Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        self.shapes.push(x.shape().to_vec());
        if self.plan.binary_search(&pos).is_ok() {
            self.store(self.layers[pos], x)
        } else {
            self.saved_bytes += x.data_bytes();
            Ok(x)
        }
    }

    /// The positions the last forward stored (its plan).
    pub(crate) fn planned(&self) -> &[usize] {
        &self.plan
    }

    /// Replaces the configuration; the next forward plans with it. `#[checkpoint]` uses this to apply
    /// its options to the active checkpointer.
    pub fn set_config(&mut self, config: CheckpointConfig) {
        self.config = config;
    }

    /// Makes this checkpointer the active one on this thread while `f` runs: `#[checkpoint]`
    /// functions without a `&mut Checkpointer` parameter save into it. Nested calls stack; the
    /// checkpointer is back in `self` when `install` returns, also if `f` panics.
    pub fn install<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let empty = Checkpointer::new(self.config.clone());
        let taken = std::mem::replace(self, empty);
        ACTIVE.with_borrow_mut(|stack| stack.push(Box::new(taken)));
        let _restore = Restore(self);
        f()
        // `restore` drops here (or while unwinding) and puts the checkpointer back.
    }
}

thread_local! {
    /// Installed checkpointers, innermost last (see [`Checkpointer::install`]).
    static ACTIVE: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Puts an installed checkpointer back where it came from.
struct Restore<'c, T: Element>(&'c mut Checkpointer<T>);

impl<T: Element> Drop for Restore<'_, T> {
    fn drop(&mut self) {
        let top = ACTIVE.with_borrow_mut(Vec::pop);
        if let Some(Ok(ckpt)) = top.map(|b| b.downcast::<Checkpointer<T>>()) {
            *self.0 = *ckpt;
        }
    }
}

/// Stands in the thread's stack for a checkpointer a `#[checkpoint]` forward is using.
struct Busy;

/// Runs `f` with the innermost installed checkpointer if it holds element type `T`, or with `None`
/// (no checkpointer installed, one of another type, or one already in use by an enclosing
/// `#[checkpoint]` forward: nested forwards store nothing rather than replan the outer one's).
pub(crate) fn with_active<T: Element, R>(f: impl FnOnce(Option<&mut Checkpointer<T>>) -> R) -> R {
    let top = ACTIVE.with_borrow_mut(|stack| {
        if stack.last().is_some_and(|b| b.is::<Checkpointer<T>>()) {
            let ckpt = stack.pop();
            stack.push(Box::new(Busy));
            ckpt
        } else {
            None
        }
    });
    let Some(boxed) = top else {
        return f(None);
    };
    /// Puts the checkpointer back in place of the marker when `f` ends, by return or unwinding.
    struct PutBack(Option<Box<dyn std::any::Any>>);
    impl Drop for PutBack {
        fn drop(&mut self) {
            if let Some(b) = self.0.take() {
                ACTIVE.with_borrow_mut(|stack| {
                    stack.pop();
                    stack.push(b);
                });
            }
        }
    }
    let mut guard = PutBack(Some(boxed));
    f(guard
        .0
        .as_mut()
        .and_then(|b| b.downcast_mut::<Checkpointer<T>>()))
}

/// Runs the layer loop of a `#[checkpoint]` function: `step(segment_scope, activation, layer)` for
/// each of `layers` in order, the layers grouped into segments by the policy's plan and each segment
/// run in its own child scope of the activation's (so its temporaries are that scope's to release).
/// The input of each segment's first layer is saved into `ckpt` if there is one; with none, nothing
/// is stored (inference).
pub(crate) fn run_layers<'s, T: Element, L>(
    mut config: CheckpointConfig,
    mut ckpt: Option<&mut Checkpointer<T>>,
    input: Tensor<'s, T>,
    layers: Vec<L>,
    mut step: impl for<'b> FnMut(&Scope<'b, 's>, Tensor<'b, T>, L) -> Tensor<'b, T>,
) -> Result<Tensor<'s, T>> {
    let n = layers.len();
    let ids: Vec<usize> = (0..n).collect();
    let plan = match ckpt.as_deref_mut() {
        Some(ckpt) => {
            ckpt.set_config(config);
            ckpt.begin(&ids, &input)?;
            ckpt.planned().to_vec()
        }
        None => {
            // Nothing is stored, so there is no limit to respect: the plan only groups segments.
            config.max_checkpoints = None;
            Checkpointer::<T>::new(config).plan(n, input.len())?.0
        }
    };
    let mut x = input;
    let mut layers = layers.into_iter().enumerate();
    for (j, &start) in plan.iter().enumerate() {
        let end = plan.get(j + 1).copied().unwrap_or(n);
        let state = ScopeState::child(&x.scope, None);
        x = run(state, |segment: &Scope<'_, 's>| {
            let mut a = segment.rebind_owned(x);
            for (pos, layer) in layers.by_ref().take(end - start) {
                if let Some(ckpt) = ckpt.as_deref_mut() {
                    a = ckpt.record(pos, a)?;
                }
                a = step(segment, a, layer);
            }
            Ok::<_, CheckpointError>(segment.escape(a))
        })
        .0?;
    }
    Ok(x)
}

impl<T: Element> Checkpointer<T> {
    fn position(&self, layer: usize, layers: &[usize]) -> Result<usize> {
        layers
            .iter()
            .position(|&l| l == layer)
            .ok_or(CheckpointError::BadLayer {
                layer,
                problem: "is not in",
                count: layers.len(),
            })
    }

    /// The input of `target_layer`, recomputed by replaying `forward` from the nearest checkpoint at or
    /// before it. With full precision it equals the forward pass's value bit for bit; with `f16`/`bf16`
    /// storage it carries their rounding. Fails with [`CheckpointError::BadLayer`],
    /// [`CheckpointError::UnknownLayer`] (no checkpoint at or before it) or
    /// [`CheckpointError::ShapeDrift`] (a replayed layer gave another shape than in the forward).
    /// The replay runs in `s`: the stored activation is bound there and `forward`'s outputs rent there.
    pub fn recompute_from_checkpoint<'s>(
        &self,
        s: &Scope<'s, '_>,
        target_layer: usize,
        layers: &[usize],
        mut forward: impl FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        let target = self.position(target_layer, layers)?;
        let start = (0..=target)
            .rev()
            .find(|&p| self.stored.contains_key(&layers[p]))
            .ok_or_else(|| CheckpointError::UnknownLayer {
                layer: target_layer,
                stored: self.stored_layers(),
            })?;
        let mut x: Tensor<'s, T> = self.stored[&layers[start]].restore(s.state())?;
        // Shapes are only comparable when replaying the forward's own layer list.
        let shapes: &[Vec<usize>] = if layers == self.layers {
            &self.shapes
        } else {
            &[]
        };
        for pos in start..target {
            x = forward(&x, layers[pos]);
            check_shape(shapes, layers, pos + 1, &x)?;
        }
        Ok(x)
    }

    /// The reverse sweep after [`Checkpointer::checkpointed_forward`]: calls `backward(layer, input)`
    /// for every layer of that forward, last first, with the layer's input activation, recomputing
    /// activations from the checkpoints with `forward` (which must be the forward's function). Under
    /// `Every`, `Sqrt` and `Explicit` each segment is recomputed once and held while its layers run
    /// backward; under `Budget` the binomial schedule reuses the slots and recomputes
    /// [`binomial_recompute_steps`] steps. The checkpoints are consumed (dropped as their segments
    /// finish). The sweep runs in `s`: checkpoints are bound there and recomputed activations rent
    /// there.
    pub fn reverse<'s>(
        &mut self,
        s: &Scope<'s, '_>,
        forward: impl FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
        backward: impl FnMut(usize, &Tensor<'s, T>),
    ) -> Result<ReverseReport> {
        self.reverse_in(s.state(), forward, backward)
    }

    /// [`Checkpointer::reverse`] in the scope with `state`.
    pub(crate) fn reverse_in<'s>(
        &mut self,
        state: &Rc<ScopeState>,
        mut forward: impl FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
        mut backward: impl FnMut(usize, &Tensor<'s, T>),
    ) -> Result<ReverseReport> {
        if self.plan.is_empty() && !self.layers.is_empty() {
            // Already swept (or cleared): the checkpoints are gone.
            return Err(CheckpointError::UnknownLayer {
                layer: self.layers[0],
                stored: Vec::new(),
            });
        }
        if self.layers.is_empty() && !self.stored.is_empty() {
            return Err(CheckpointError::NoForward {
                stored: self.stored.len(),
            });
        }
        let mut sweep = Sweep {
            scope: state,
            stored: std::mem::take(&mut self.stored),
            layers: &self.layers,
            shapes: &self.shapes,
            forward: &mut forward,
            backward: &mut backward,
            report: ReverseReport::default(),
            held: 0,
        };
        // The schedule the forward planned, whatever the config says now.
        let result = if self.slots > 0 {
            sweep.binomial(&self.plan, self.slots)
        } else {
            sweep.segments(&self.plan)
        };
        let report = sweep.report;
        self.clear();
        result.map(|()| report)
    }
}

/// `activation` converted to the narrower storage type `S`, detached. Fails with
/// [`CheckpointError::BadValue`] naming the first finite value that the conversion rounds to an
/// infinity (65520 in `f16`, say, whatever the source type: checking the converted values, not a
/// bound converted to the source type, which rounds too).
fn narrowed<T: Element, S: Element>(layer: usize, activation: &Tensor<'_, T>) -> Result<Param<S>> {
    let converted = activation.try_cast::<S>()?.try_detach()?;
    let overflow = activation
        .as_slice()
        .iter()
        .zip(converted.as_slice())
        .find(|(_, c)| !c.is_finite());
    match overflow {
        Some((v, _)) => Err(CheckpointError::BadValue {
            layer,
            problem: format!("{v} is beyond the {} range (+-{})", S::NAME, S::max_value()),
        }),
        None => Ok(converted),
    }
}

/// Fails with [`CheckpointError::ShapeDrift`] if `x`, the recomputed activation at `pos`, differs in
/// shape from the forward's (`shapes`, empty when not comparable).
fn check_shape<T: Element>(
    shapes: &[Vec<usize>],
    layers: &[usize],
    pos: usize,
    x: &Tensor<'_, T>,
) -> Result<()> {
    match shapes.get(pos) {
        Some(expected) if expected.as_slice() != x.shape() => Err(CheckpointError::ShapeDrift {
            layer: layers[pos],
            expected: Shape(expected.clone()),
            got: Shape::from(x.shape()),
        }),
        _ => Ok(()),
    }
}

/// The state of a reverse sweep. It owns the checkpoints and drops each once consumed.
struct Sweep<'c, 'f, 's, T: Element> {
    /// Where restored checkpoints are bound.
    scope: &'c Rc<ScopeState>,
    stored: BTreeMap<usize, Stored<T>>,
    layers: &'c [usize],
    shapes: &'c [Vec<usize>],
    forward: &'f mut dyn FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
    backward: &'f mut dyn FnMut(usize, &Tensor<'s, T>),
    report: ReverseReport,
    /// Activations alive now besides the stored checkpoints.
    held: usize,
}

impl<'s, T: Element> Sweep<'_, '_, 's, T> {
    fn note_peak(&mut self) {
        let now = self.held + self.stored.len();
        self.report.peak_activations = self.report.peak_activations.max(now);
    }

    /// `steps` layer steps from `x` at position `pos`, counted as recomputation.
    fn advance(&mut self, x: &Tensor<'s, T>, pos: usize, steps: usize) -> Result<Tensor<'s, T>> {
        let mut x = x.clone();
        for p in pos..pos + steps {
            x = (self.forward)(&x, self.layers[p]);
            check_shape(self.shapes, self.layers, p + 1, &x)?;
        }
        self.report.recomputed_steps += steps;
        Ok(x)
    }

    /// Takes the checkpoint at `pos` out of the store: from here on it is an ordinary activation.
    fn checkpoint(&mut self, pos: usize) -> Result<Tensor<'s, T>> {
        let layer = self.layers[pos];
        match self.stored.remove(&layer) {
            Some(stored) => stored.restore(self.scope),
            None => Err(CheckpointError::UnknownLayer {
                layer,
                stored: self.stored.keys().copied().collect(),
            }),
        }
    }

    /// Segment by segment, last first: recompute the segment from its checkpoint, run its layers
    /// backward, drop it.
    fn segments(&mut self, plan: &[usize]) -> Result<()> {
        let n = self.layers.len();
        for (j, &start) in plan.iter().enumerate().rev() {
            let end = plan.get(j + 1).copied().unwrap_or(n);
            let mut acts = vec![self.checkpoint(start)?];
            for pos in start + 1..end {
                let next = self.advance(&acts[acts.len() - 1], pos - 1, 1)?;
                acts.push(next);
            }
            self.held = acts.len();
            self.note_peak();
            for pos in (start..end).rev() {
                (self.backward)(self.layers[pos], &acts[pos - start]);
            }
            self.held = 0;
        }
        Ok(())
    }

    /// The binomial schedule: the forward stored a chain; reverse its last link with the slots left,
    /// then each earlier link with one slot more.
    fn binomial(&mut self, chain: &[usize], slots: usize) -> Result<()> {
        let n = self.layers.len();
        self.note_peak();
        for (j, &start) in chain.iter().enumerate().rev() {
            let end = chain.get(j + 1).copied().unwrap_or(n);
            // The link's own checkpoint is one of its slots.
            let x = self.checkpoint(start)?;
            self.held += 1;
            self.reverse_paid(start, x, end - start, slots - j)?;
            self.held -= 1;
        }
        Ok(())
    }

    /// Reverses `len` steps from `x` (the activation at `pos`, holding one slot) with `slots` slots,
    /// paying for every advance: Griewank and Walther's recursion.
    fn reverse_paid(
        &mut self,
        pos: usize,
        x: Tensor<'s, T>,
        len: usize,
        slots: usize,
    ) -> Result<()> {
        if len == 1 {
            (self.backward)(self.layers[pos], &x);
            return Ok(());
        }
        if slots == 1 {
            for j in (0..len).rev() {
                let a = self.advance(&x, pos, j)?;
                self.held += 1;
                self.note_peak();
                (self.backward)(self.layers[pos + j], &a);
                self.held -= 1;
            }
            return Ok(());
        }
        let m = schedule::paid_split(len as u64, slots as u64) as usize;
        let right = self.advance(&x, pos, m)?;
        self.held += 1;
        self.note_peak();
        self.reverse_paid(pos + m, right, len - m, slots - 1)?;
        self.held -= 1;
        self.reverse_paid(pos, x, m, slots)
    }
}
