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
//! use tensorscope::checkpoint::{CheckpointConfig, Checkpointer, Policy};
//! use tensorscope::{Pool, Tensor, TensorOps};
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

mod config;
mod driver;
mod front;
mod install;
mod memory;
mod plan;
mod region;
mod report;
mod rotor;
mod schedule;
mod stored;
mod sweep;

use std::cell::Cell;
use std::rc::Rc;

use crate::dims::Dims;

pub use crate::error::checkpoint::{CheckpointError, Result};
pub use config::{CheckpointConfig, Policy, Precision, Saving};
pub(crate) use driver::run_layers;
pub(crate) use install::with_active;
pub use report::{PlanKind, PlanReport, StepRun};
pub use rotor::{ChainCosts, StepCost};
pub use schedule::{binomial_recompute_steps, revolve_forward_steps};
pub use sweep::ReverseReport;

use memory::Layout;
use stored::{narrowed, ByLayer, Stored};

use crate::element::Element;
use crate::param::Param;
use crate::recycle::RecycledVec;
use crate::tensor::Tensor;

/// Stores checkpoints of a forward pass and recomputes activations from them; see the module docs.
pub struct Checkpointer<T: Element = f32> {
    config: CheckpointConfig,
    stored: ByLayer<T>,
    /// The last forward's layer list, the shapes of its activations `a_0 .. a_{n-1}`, and the
    /// positions it stored.
    layers: Vec<usize>,
    shapes: Vec<Dims>,
    plan: Vec<usize>,
    /// Slots of the binomial schedule of the last forward (`Policy::Budget` only).
    slots: usize,
    saved_bytes: usize,
    /// What the backward of the last recording forward did, once it has run.
    last_backward: Rc<Cell<Option<ReverseReport>>>,
    /// The layers and bytes of the checkpoints the last forward handed to its backward, which
    /// releases each as it consumes it.
    handed: RecycledVec<(usize, usize)>,
    /// Whether `reverse` has consumed the last forward's checkpoints.
    swept: bool,
    /// What `Policy::Memory` plans with.
    memory: memory::Memory,
    /// Pool bytes in use when the last forward started.
    forward_start: usize,
    /// What the regions of the last recording forward share of the values from before them.
    externals: Rc<region::SharedExternals<T>>,
}

impl Checkpointer<f32> {
    /// A checkpointer of `f32` activations with `config` and nothing stored (as `HashMap::new` is
    /// for its default hasher, so that a checkpointer used only through
    /// [`install`](Checkpointer::install) needs no type annotation). The policy is checked when a
    /// forward plans with it. [`Checkpointer::for_element`] makes one of another element type.
    ///
    /// ```
    /// use tensorscope::prelude::*;
    /// use tensorscope::{CheckpointConfig, Checkpointer, Policy};
    ///
    /// #[checkpoint]
    /// fn forward<'a>(x: Tensor<'a>, weights: &[Param]) -> Tensor<'a> {
    ///     let mut x = x;
    ///     for w in weights {
    ///         x = x.matmul(w).tanh();
    ///     }
    ///     x
    /// }
    ///
    /// let pool = Pool::with_max_memory_mb(16);
    /// let weights: Vec<Param> = (0..4).map(|_| Param::zeros(&pool, &[2, 2])).collect();
    /// let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(2)));
    /// ckpt.install(|| pool.scope(|s| drop(forward(s.ones(&[1, 2]), &weights))));
    /// assert_eq!(ckpt.stored_layers(), vec![0, 2]);
    /// ```
    pub fn new(config: CheckpointConfig) -> Self {
        Checkpointer::for_element(config)
    }
}

impl<T: Element> Checkpointer<T> {
    /// A checkpointer of activations of element type `T` (`Checkpointer::<f64>::for_element(..)`),
    /// with `config` and nothing stored.
    pub fn for_element(config: CheckpointConfig) -> Self {
        Checkpointer {
            config,
            stored: ByLayer::default(),
            layers: Vec::new(),
            shapes: Vec::new(),
            plan: Vec::new(),
            slots: 0,
            saved_bytes: 0,
            last_backward: Rc::new(Cell::new(None)),
            handed: RecycledVec::new(),
            swept: false,
            memory: memory::Memory::default(),
            forward_start: 0,
            externals: Rc::default(),
        }
    }

    /// Pool bytes in use when the last checkpointed forward started (0 before any): what
    /// [`Policy::Memory`]'s budget is counted above.
    pub fn forward_start_bytes(&self) -> usize {
        self.forward_start
    }

    /// The configuration.
    pub fn config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// Stored activations: those this checkpointer holds, and those the last forward that
    /// recorded a graph handed to its backward, until that backward has consumed them.
    pub fn num_checkpoints(&self) -> usize {
        self.stored.len() + self.handed.len()
    }

    /// Bytes of the stored activations (see [`Checkpointer::num_checkpoints`]), in their storage
    /// precision.
    pub fn memory_stored_bytes(&self) -> usize {
        let held: usize = self.stored.iter().map(|(_, s)| s.data_bytes()).sum();
        held + self.handed.iter().map(|&(_, bytes)| bytes).sum::<usize>()
    }

    /// Bytes of the activations the last forward pass computed but did not store.
    pub fn memory_saved_bytes(&self) -> usize {
        self.saved_bytes
    }

    /// What the backward of the last checkpointed forward that recorded a graph did (layer steps
    /// recomputed and replayed, activations held at most), once that backward has run; `None` if
    /// it had nothing to replay (a forward of one segment keeps its graph).
    pub fn last_backward(&self) -> Option<ReverseReport> {
        self.last_backward.get()
    }

    /// Takes the stored activations of positions `start .. end` of the last forward out of this
    /// checkpointer, keyed by position from `start`: the backward that gets them releases each as
    /// it consumes it. What they were stays countable ([`Checkpointer::num_checkpoints`]).
    pub(crate) fn hand_over(&mut self, start: usize, end: usize) -> ByLayer<T> {
        let mut by_position = ByLayer::default();
        for pos in start..end {
            let id = self.layers[pos];
            if let Some(stored) = self.stored.remove(id) {
                self.handed.push((id, stored.data_bytes()));
                by_position.insert(pos - start, stored);
            }
        }
        by_position
    }

    /// The layers that have a checkpoint (see [`Checkpointer::num_checkpoints`]), in order.
    pub fn stored_layers(&self) -> Vec<usize> {
        let mut layers = self.stored.layers();
        layers.extend(self.handed.iter().map(|&(id, _)| id));
        layers.sort_unstable();
        layers
    }

    /// Whether the policy stores the input of `layer`.
    ///
    /// After a forward pass: whether that forward's plan stored it (`false` for an id that was not
    /// in its layer list). Before any forward, the id is taken as a position: `Every(k)` and
    /// `Explicit` answer from the policy alone, and every policy stores position 0; `Sqrt` and
    /// `Budget` and `Memory` place the rest by the layer count (and the layers' costs), unknown
    /// until a forward, so they answer `false` for every other position. A reverse sweep that
    /// consumed the checkpoints leaves the answers as they were; [`Checkpointer::clear`] makes
    /// them `false`.
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
            Policy::Sqrt | Policy::Budget(_) | Policy::Memory(_) => false,
        }
    }

    /// Drops every stored activation (their buffers go back to the pool).
    pub fn clear(&mut self) {
        self.stored.clear();
        self.handed.clear();
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
            let needed = self.stored.len() + usize::from(!self.stored.contains(layer));
            if needed > limit {
                return Err(CheckpointError::LimitExceeded {
                    layer,
                    needed,
                    limit,
                });
            }
        }
        if let Policy::Budget(budget) = self.config.policy {
            let class = |data: usize| crate::pool::class_bytes_of(data);
            let bytes = class(
                activation
                    .len()
                    .saturating_mul(self.config.precision.bytes_per_element::<T>()),
            );
            let held: usize = self
                .stored
                .iter()
                .filter(|&(l, _)| l != layer)
                .map(|(_, s)| class(s.data_bytes()))
                .sum();
            let needed = held.saturating_add(bytes);
            if needed > budget {
                return Err(CheckpointError::BudgetExceeded {
                    layer,
                    bytes,
                    needed,
                    budget,
                });
            }
        }
        if let Some(v) = activation.view().iter().find(|v| !v.is_finite()) {
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
                let scope = activation.rents_in.clone();
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
        match self.stored.get(layer) {
            Some(stored) => stored.to_param(),
            None => Err(CheckpointError::NotStored {
                layer,
                stored: self.stored_layers(),
            }),
        }
    }

    /// Starts a forward over `layers` from `input`: plans, and drops earlier checkpoints. `records`
    /// when the forward records a gradient graph; the layout says how its steps run then.
    pub(crate) fn begin(
        &mut self,
        layers: impl ExactSizeIterator<Item = usize> + Clone,
        input: &Tensor<'_, T>,
        records: bool,
        reads: &'static [&'static [usize]],
    ) -> Result<Layout> {
        let n = layers.len();
        let mut plan = RecycledVec::new();
        let memory = match self.config.policy {
            Policy::Memory(budget) if records => {
                Some(self.plan_memory(budget, n, input.shape(), reads, &mut plan)?)
            }
            _ => None,
        };
        let (slots, layout) = match (memory, &self.config.policy) {
            (Some(layout), _) => (0, layout),
            // The last step keeps its graph, as revolve reverses its last step at once: the
            // binomial chain is of the steps before it.
            (None, Policy::Budget(_)) if records && n >= 2 => {
                let slots = self.config.plan::<T>(n - 1, input.len(), &mut plan)?;
                (slots, Layout::Prefix(n - 1))
            }
            (None, _) => {
                let slots = self.config.plan::<T>(n, input.len(), &mut plan)?;
                let taped = match (records, slots, plan.last()) {
                    (false, ..) => 0,
                    (true, 0, Some(&last)) => last,
                    (true, ..) => n,
                };
                (slots, Layout::Prefix(taped))
            }
        };
        if records {
            // A step that keeps its graph needs no checkpoint.
            plan.retain(|&p| layout.taped(p));
        }
        if let Some(limit) = self.config.max_checkpoints {
            if plan.len() > limit {
                return Err(CheckpointError::LimitExceeded {
                    layer: layers.clone().nth(plan[limit]).unwrap_or(plan[limit]),
                    needed: plan.len(),
                    limit,
                });
            }
        }
        self.clear();
        self.externals.clear();
        self.swept = false;
        self.last_backward.set(None);
        let pool = input.rents_in.pool();
        self.forward_start = pool.stats().bytes_in_use;
        let memory = matches!(layout, Layout::Profile | Layout::Least | Layout::Rotor(_));
        if memory {
            self.memory.watch.start(pool);
        }
        self.memory.layout = memory.then(|| layout.clone());
        self.memory.stale_at = None;
        // Refilled rather than replaced, so that their buffers serve every forward.
        self.layers.clear();
        self.layers.extend(layers);
        self.shapes.clear();
        self.plan.extend_from_slice(&plan);
        self.slots = slots;
        Ok(layout)
    }

    /// Records `x`, the input of the layer at `pos`: stored if the plan says so, else counted saved.
    /// Returns the tensor to go on with (the stored values, bound, when they were stored without a
    /// copy).
    pub(crate) fn record<'s>(&mut self, pos: usize, x: Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        self.shapes.push(Dims::from_slice(x.shape()));
        if self.plan.binary_search(&pos).is_ok() {
            self.store(self.layers[pos], x)
        } else {
            self.saved_bytes += x.data_bytes();
            Ok(x)
        }
    }

    /// Adds `pos` to the positions the forward in progress stores (a step after it has not run).
    pub(crate) fn store_at(&mut self, pos: usize) {
        if let Err(at) = self.plan.binary_search(&pos) {
            self.plan.insert(at, pos);
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
}
