//! Optimizers: they update the parameters of a store from their gradients, in place.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::NnError;
use crate::autograd::Gradients;
use crate::element::{DType, Element};
use crate::error::{Error, Shape};
use crate::ops::simd;
use crate::param::{Param, ParamPath, Parameters};
use crate::recycle::RecycledVec;

use super::safetensors::write_named;
use super::safetensors::SafeTensorsFile;
use super::SaveOptions;

/// Updates parameters from their gradients.
pub trait Optimizer<T: Element> {
    /// One update of every parameter in `params` (a [`ParamStore`](super::ParamStore), a model
    /// struct: any [`Parameters`]) that has a gradient in `grads` (the others are left as they
    /// are), in place: a parameter no other handle shares is written without a copy. A parameter
    /// the set holds twice (tied fields, clones of one `Param`) is updated once and its handles
    /// keep sharing the result; two handles of one parameter holding different values are
    /// [`NnError::ParamListedTwice`].
    /// All or nothing: the memory an update needs (new state, a copy of a shared parameter) is
    /// taken before any parameter changes, so a budget error leaves every parameter and the
    /// optimizer's state as they were.
    fn step(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError>;

    /// The learning rate of the next step (before a group's [`Group::lr_scale`]).
    fn lr(&self) -> T;

    /// Sets the learning rate of the next steps, e.g. from a [`Schedule`](super::Schedule) before
    /// each step (PyTorch's `param_group["lr"] = ..`).
    fn set_lr(&mut self, lr: T);

    /// Writes the optimizer's state (every parameter's buffers and step count, keyed by the
    /// parameter's name in `params`, a tied parameter's by its first name, and the learning rate) to a safetensors file at `path`, bit for
    /// bit in the parameters' element type: with the model's own file, what resuming a run needs
    /// (PyTorch's `optimizer.state_dict()`, by name rather than by position).
    fn save_state(&self, params: &dyn Parameters<T>, path: &Path) -> Result<(), NnError>;

    /// Replaces the optimizer's state with the one [`Optimizer::save_state`] wrote for a model of
    /// these names and shapes. All or nothing: fails, changing nothing, with
    /// [`NnError::OptimizerState`] naming what does not fit (another optimizer's file, a state for a
    /// parameter `params` does not have, a shape that differs),
    /// [`NnError::OptimizerStateValue`] naming a value the next step would spread to every weight
    /// (a NaN or infinite moment, a negative second moment, a learning rate that is negative or
    /// not finite in `T`, a negative step count), or a file error.
    fn load_state(&mut self, params: &dyn Parameters<T>, path: &Path) -> Result<(), NnError>;
}

/// What a group of parameters is given by an optimizer's [`groups`](Adam::groups) function: a scale
/// of the learning rate and its own weight decay (PyTorch's parameter groups). The usual split:
/// no weight decay on biases and normalization scales.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Group {
    /// The learning rate of this group is the optimizer's times this.
    pub lr_scale: f64,
    /// The weight decay of this group, or `None` for the optimizer's.
    pub weight_decay: Option<f64>,
}

impl Group {
    /// The optimizer's settings.
    pub const DEFAULT: Group = Group {
        lr_scale: 1.0,
        weight_decay: None,
    };

    /// The optimizer's learning rate, no weight decay.
    pub const NO_DECAY: Group = Group {
        lr_scale: 1.0,
        weight_decay: Some(0.0),
    };
}

/// Which group a parameter belongs to, from its name.
type Grouping = Box<dyn Fn(&str) -> Group + Send + Sync>;

/// A parameter's per-parameter state: its buffers, each saved under `<name>.<slot>`, and its step
/// count if it keeps one.
trait State<T: Element>: Sized {
    /// The names of the buffers, as PyTorch's optimizers name them, and the values each may hold.
    const SLOTS: &'static [(&'static str, Values)];
    /// The buffers, in the order of [`State::SLOTS`].
    fn buffers(&self) -> Vec<&Param<T>>;
    /// The step count, if the state keeps one.
    fn steps(&self) -> Option<i32>;
    /// The state of these buffers (in the order of [`State::SLOTS`]) and step count.
    fn from_parts(buffers: Vec<Param<T>>, steps: i32) -> Self;
}

/// The state an optimizer keeps per parameter (by its key), made on the parameter's first update.
/// A parameter replaced by another (a new key) starts afresh.
struct States<S> {
    /// The state and the group of each parameter.
    by_key: HashMap<u64, (S, Group)>,
    /// Which group a parameter belongs to (all to [`Group::DEFAULT`] without one).
    grouping: Option<Grouping>,
    /// Of each key met in the current step: its first handle's place in `walked`, its position in
    /// the set and its version (kept to reuse its memory).
    seen: HashMap<u64, (usize, usize, u64)>,
    /// Each handle with a gradient, in the order the step's first walk met them: the later walks
    /// must meet the same, or the step stops (kept to reuse its memory).
    walked: Vec<Walked>,
}

/// A handle with a gradient as the first walk of a step met it.
#[derive(Clone, Copy, PartialEq)]
struct Walked {
    key: u64,
    version: u64,
    /// The parameter has other handles later in the set (fields tied to this one).
    tied: bool,
    /// A later handle of a parameter met before: it is given the updated data of the first.
    later: bool,
}

impl<S> States<S> {
    fn new() -> Self {
        States {
            by_key: HashMap::new(),
            grouping: None,
            seen: HashMap::new(),
            walked: Vec::new(),
        }
    }

    /// Calls `update(parameter, its state, its gradient)` once for every parameter of `params`
    /// that has a gradient, all or nothing: first every check, changing nothing; then every rent
    /// (states made with `make`, copies of parameters another handle shares), kept aside until all
    /// have succeeded; then the updates, which cannot fail. A parameter the set holds several
    /// times (tied fields) is updated at its first handle, and the later ones are given the
    /// updated data. Each walk over `params` must meet the parameters the first met, with the
    /// same values ([`Parameters`] promises the same order on every call); one that does not is
    /// [`NnError::ParametersChanged`], before anything is written if the second walk notices it.
    fn update_all<T: Element>(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
        make: impl Fn(&Param<T>) -> Result<S, NnError>,
        mut update: impl FnMut(&mut [T], &mut S, Group, &[T]),
    ) -> Result<(), NnError> {
        self.check(params, grads)?;
        // Empty in a steady-state step, when every state exists: no heap allocation.
        let mut states = Vec::new();
        // Not empty at every step when a parameter's handles share its data (tied fields, or a
        // graph still holding it): a recycled list.
        let mut copies = RecycledVec::new();
        let mut failure = None;
        let (mut index, mut met) = (0, 0);
        params.visit_params_mut(&ParamPath::ROOT, &mut |path, p| {
            index += 1;
            if failure.is_some() || grads.get(p).is_none() {
                return;
            }
            met += 1;
            let rented = (|| {
                self.same(met - 1, index - 1, p, 0)?;
                if self.walked[met - 1].later {
                    return Ok(());
                }
                if !self.by_key.contains_key(&p.key()) {
                    let group = self
                        .grouping
                        .as_ref()
                        .map_or(Group::DEFAULT, |g| g(&path.to_string()));
                    states.push((p.key(), (make(p)?, group)));
                }
                if let Some(copy) = p.copy_for_write()? {
                    copies.push((index - 1, copy));
                }
                Ok(())
            })();
            if let Err(e) = rented {
                failure = Some(e);
            }
        });
        let missing = self.walked.len().saturating_sub(met);
        if let Some(e) = failure
            .take()
            .or_else(|| (missing > 0).then(|| self.changed(met, 0)))
        {
            return Err(e);
        }
        self.by_key.extend(states);
        let mut copies = copies.drain(..).peekable();
        // The updated first handles of tied parameters, for their later handles.
        let mut tied = RecycledVec::<Param<T>>::new();
        let (mut index, mut met, mut updated) = (0, 0, 0);
        params.visit_params_mut(&ParamPath::ROOT, &mut |_, p| {
            index += 1;
            let Some(g) = grads.get(p) else {
                return;
            };
            met += 1;
            if failure.is_some() {
                return;
            }
            if let Err(e) = self.same(met - 1, index - 1, p, updated) {
                failure = Some(e);
                return;
            }
            let walked = self.walked[met - 1];
            if walked.later {
                *p = tied
                    .iter()
                    .find(|t| t.key() == walked.key)
                    .expect("a later handle's first was updated before")
                    .clone();
                return;
            }
            if let Some((_, copy)) = copies.next_if(|(i, _)| *i == index - 1) {
                p.take_copy(copy);
            }
            let (state, group) = self
                .by_key
                .get_mut(&p.key())
                .expect("made for every key walked");
            update(p.unique_slice_mut(), state, *group, g.slice());
            updated += 1;
            if walked.tied {
                tied.push(p.clone());
            }
        });
        let missing = self.walked.len().saturating_sub(met);
        failure
            .or_else(|| (missing > 0).then(|| self.changed(met, updated)))
            .map_or(Ok(()), Err)
    }

    /// Fails unless `p`, the `n`-th handle with a gradient of this walk (at `index` in the set),
    /// is the one the first walk met there, with the same values.
    fn same<T: Element>(
        &self,
        n: usize,
        index: usize,
        p: &Param<T>,
        updated: usize,
    ) -> Result<(), NnError> {
        match self.walked.get(n) {
            Some(walked) if (walked.key, walked.version) == (p.key(), p.version()) => Ok(()),
            _ => Err(NnError::ParametersChanged { index, updated }),
        }
    }

    /// The error of a later walk that met fewer parameters with a gradient than the first: `met`.
    fn changed(&self, met: usize, updated: usize) -> NnError {
        NnError::ParametersChanged {
            index: met,
            updated,
        }
    }

    /// Records the handles of `params` with a gradient in `walked`, and fails with
    /// [`NnError::ParamListedTwice`] or [`Error::StaleGradient`] for the first that holds other
    /// values than an earlier handle of the same parameter, or whose gradient was computed from
    /// other values than it holds.
    fn check<T: Element>(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError> {
        self.seen.clear();
        self.walked.clear();
        let mut failure = None;
        let mut index = 0;
        params.visit_params_mut(&ParamPath::ROOT, &mut |_, p| {
            index += 1;
            if failure.is_some() || grads.get(p).is_none() {
                return;
            }
            let (index, shape) = (index - 1, || Shape::from(p.shape()));
            let mut walked = Walked {
                key: p.key(),
                version: p.version(),
                tied: false,
                later: false,
            };
            match self.seen.entry(p.key()) {
                Entry::Occupied(first) => {
                    let (n, first, version) = *first.get();
                    self.walked[n].tied = true;
                    walked.later = true;
                    if version != p.version() {
                        let shape = shape();
                        failure = Some(NnError::ParamListedTwice {
                            index,
                            first,
                            shape,
                        });
                    }
                }
                Entry::Vacant(first) => {
                    first.insert((self.walked.len(), index, p.version()));
                    if !grads.is_of_current_values(p) {
                        failure = Some(
                            Error::StaleGradient {
                                index,
                                shape: shape(),
                            }
                            .into(),
                        );
                    }
                }
            }
            self.walked.push(walked);
        });
        failure.map_or(Ok(()), Err)
    }
}

impl<S> States<S> {
    /// Writes every state of a parameter of `params` under its name (see
    /// [`Optimizer::save_state`]), with the optimizer's `kind` and learning rate in the metadata.
    fn save<T: Element>(
        &self,
        kind: &str,
        lr: T,
        params: &dyn Parameters<T>,
        path: &Path,
    ) -> Result<(), NnError>
    where
        S: State<T>,
    {
        let mut named = Vec::new();
        let mut options = SaveOptions::new()
            .dtype::<T>()
            .metadata(OPTIMIZER_KEY, kind)
            .metadata(LR_KEY, format!("{:?}", lr.to_f64()));
        let mut steps = Vec::new();
        // A tied parameter's state once, under its first name, as the optimizer keeps it.
        let mut saved = HashSet::new();
        params.visit_params(&ParamPath::ROOT, &mut |path, p| {
            let Some((state, _)) = self.by_key.get(&p.key()) else {
                return;
            };
            if !saved.insert(p.key()) {
                return;
            }
            let name = path.to_string();
            for ((slot, _), buffer) in S::SLOTS.iter().zip(state.buffers()) {
                named.push((format!("{name}.{slot}"), buffer.clone()));
            }
            if let Some(count) = state.steps() {
                steps.push((format!("{name}.{STEP_SLOT}"), count.to_string()));
            }
        });
        for (key, value) in steps {
            options = options.metadata(key, value);
        }
        write_named(&named, path, &options)
    }

    /// Reads the states [`States::save`] wrote for `params`, replacing every state here, and returns
    /// the learning rate saved with them. All or nothing.
    fn load<T: Element>(
        &mut self,
        kind: &str,
        params: &dyn Parameters<T>,
        path: &Path,
    ) -> Result<T, NnError>
    where
        S: State<T>,
    {
        let file = SafeTensorsFile::open(path)?;
        let invalid = |reason: String| NnError::OptimizerState {
            path: path.to_path_buf(),
            reason,
        };
        let saved_kind = file.metadata().get(OPTIMIZER_KEY).map(String::as_str);
        if saved_kind != Some(kind) {
            return Err(invalid(format!(
                "it holds the state of {}, not of {kind}",
                saved_kind.map_or("no optimizer".to_string(), |k| format!("`{k}`"))
            )));
        }
        let lr = file
            .metadata()
            .get(LR_KEY)
            .and_then(|lr| lr.parse::<f64>().ok())
            .ok_or_else(|| invalid(format!("its `{LR_KEY}` is missing or not a number")))?;
        let bad = |key: &str, index: Option<usize>, value: f64, rule: &'static str| {
            NnError::OptimizerStateValue {
                path: path.to_path_buf(),
                key: key.to_string(),
                index,
                value,
                rule,
            }
        };
        // A rate that is not a finite number of `T` (1e300 in f32) or is negative would make every
        // weight infinite or NaN, or climb the loss, at the next step.
        if !(lr >= 0.0 && DType::to_f64(T::from_f64(lr)).is_finite()) {
            return Err(bad(LR_KEY, None, lr, NON_NEGATIVE_RATE));
        }
        let mut by_key = HashMap::new();
        let mut taken = HashSet::new();
        let mut failure = None;
        params.visit_params(&ParamPath::ROOT, &mut |path, p| {
            let name = path.to_string();
            let slots: Vec<String> = S::SLOTS
                .iter()
                .map(|(s, _)| format!("{name}.{s}"))
                .collect();
            // A tied parameter's later names hold no state of their own.
            if failure.is_some() || by_key.contains_key(&p.key()) || !file.contains(&slots[0]) {
                return;
            }
            let read = || -> Result<(S, Group), NnError> {
                let mut buffers = Vec::new();
                for (slot, (_, values)) in slots.iter().zip(S::SLOTS) {
                    let buffer = file.param::<T>(p.pool(), slot)?;
                    if buffer.shape() != p.shape() {
                        return Err(invalid(format!(
                            "\"{slot}\" has shape {:?}, but the parameter \"{name}\" has shape \
                             {:?}",
                            buffer.shape(),
                            p.shape()
                        )));
                    }
                    let misfit = buffer
                        .as_slice()
                        .iter()
                        .map(|&x| DType::to_f64(x))
                        .enumerate()
                        .find(|&(_, x)| !values.holds(x));
                    if let Some((i, x)) = misfit {
                        return Err(bad(slot, Some(i), x, values.rule()));
                    }
                    buffers.push(buffer);
                }
                let step_key = format!("{name}.{STEP_SLOT}");
                let steps = match file.metadata().get(&step_key) {
                    Some(count) => count.parse().map_err(|_| {
                        invalid(format!("the step count \"{step_key}\" is not a number"))
                    })?,
                    None => 0,
                };
                if steps < 0 {
                    return Err(bad(&step_key, None, f64::from(steps), NON_NEGATIVE_STEPS));
                }
                Ok((S::from_parts(buffers, steps), self.group_of(&name)))
            };
            match read() {
                Ok(state) => {
                    by_key.insert(p.key(), state);
                    taken.extend(slots);
                }
                Err(e) => failure = Some(e),
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        if let Some(stray) = file.names().iter().find(|n| !taken.contains(*n)) {
            return Err(invalid(format!(
                "\"{stray}\" is the state of no parameter of the model (a parameter renamed or \
                 removed since the save?)"
            )));
        }
        self.by_key = by_key;
        Ok(T::from_f64(lr))
    }

    /// The group of the parameter named `name`.
    fn group_of(&self, name: &str) -> Group {
        self.grouping.as_ref().map_or(Group::DEFAULT, |g| g(name))
    }
}

/// The metadata key of the optimizer's kind in a state file.
const OPTIMIZER_KEY: &str = "optimizer";
/// The metadata key of the learning rate in a state file.
const LR_KEY: &str = "lr";
/// The suffix of a parameter's step count among a state file's metadata keys.
const STEP_SLOT: &str = "step";
/// What a loaded learning rate must be.
const NON_NEGATIVE_RATE: &str = "a learning rate must be a finite number, 0 or more, in the \
                                 parameters' element type";
/// What a loaded step count must be.
const NON_NEGATIVE_STEPS: &str = "a step count must be 0 or more";

/// The values a state buffer may hold: a loaded one that holds others is refused, since the next
/// step would spread them to every weight.
#[derive(Clone, Copy)]
enum Values {
    /// Finite numbers (a momentum, a first moment).
    Finite,
    /// Finite numbers, 0 or more (a second moment, whose square root the step takes).
    FiniteNonNegative,
}

impl Values {
    fn holds(self, x: f64) -> bool {
        match self {
            Values::Finite => x.is_finite(),
            Values::FiniteNonNegative => x.is_finite() && x >= 0.0,
        }
    }

    /// The rule, for the error of a value that breaks it.
    fn rule(self) -> &'static str {
        match self {
            Values::Finite => "the state must be finite",
            Values::FiniteNonNegative => "a second moment must be finite and 0 or more",
        }
    }
}

impl<T: Element> State<T> for Param<T> {
    const SLOTS: &'static [(&'static str, Values)] = &[("momentum_buffer", Values::Finite)];

    fn buffers(&self) -> Vec<&Param<T>> {
        vec![self]
    }

    fn steps(&self) -> Option<i32> {
        None
    }

    fn from_parts(mut buffers: Vec<Param<T>>, _: i32) -> Self {
        buffers.remove(0)
    }
}

impl<T: Element> State<T> for (Param<T>, Param<T>, i32) {
    const SLOTS: &'static [(&'static str, Values)] = &[
        ("exp_avg", Values::Finite),
        ("exp_avg_sq", Values::FiniteNonNegative),
    ];

    fn buffers(&self) -> Vec<&Param<T>> {
        vec![&self.0, &self.1]
    }

    fn steps(&self) -> Option<i32> {
        Some(self.2)
    }

    fn from_parts(buffers: Vec<Param<T>>, steps: i32) -> Self {
        let [m, v]: [Param<T>; 2] = buffers.try_into().expect("two slots");
        (m, v, steps)
    }
}

/// The `groups` builder both optimizers share.
macro_rules! groups_builder {
    ($states:ident) => {
        /// Gives each parameter the settings of its group, from its name: `|name| if
        /// name.ends_with("bias") { Group::NO_DECAY } else { Group::DEFAULT }`. A parameter's group
        /// is fixed at its first update (or when its state is loaded); a tied parameter's is
        /// that of its first name.
        pub fn groups(mut self, group_of: impl Fn(&str) -> Group + Send + Sync + 'static) -> Self {
            self.$states.grouping = Some(Box::new(group_of));
            self
        }
    };
}

/// The learning rate and the state file of an optimizer whose rate is its `lr` field and whose
/// per-parameter state is `$states`, saved as the optimizer `$kind`.
macro_rules! rate_and_state {
    ($states:ident, $kind:literal) => {
        fn lr(&self) -> T {
            self.lr
        }

        fn set_lr(&mut self, lr: T) {
            self.lr = lr;
        }

        fn save_state(&self, params: &dyn Parameters<T>, path: &Path) -> Result<(), NnError> {
            self.$states.save($kind, self.lr, params, path)
        }

        fn load_state(&mut self, params: &dyn Parameters<T>, path: &Path) -> Result<(), NnError> {
            self.lr = self.$states.load($kind, params, path)?;
            Ok(())
        }
    };
}

/// Stochastic gradient descent with momentum and L2 weight decay (PyTorch's form):
/// `g = g + weight_decay p; v = momentum v + g; p = p - lr v` (plain SGD for `momentum = 0`).
pub struct Sgd<T: Element = f32> {
    lr: T,
    momentum: T,
    weight_decay: T,
    velocity: States<Param<T>>,
}

impl<T: Element> Sgd<T> {
    /// SGD with learning rate `lr` and `momentum` in `[0, 1)`.
    pub fn new(lr: T, momentum: T) -> Self {
        Sgd {
            lr,
            momentum,
            weight_decay: T::zero(),
            velocity: States::new(),
        }
    }

    /// The same optimizer with L2 weight decay `weight_decay` (added to each gradient).
    pub fn weight_decay(mut self, weight_decay: T) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    groups_builder!(velocity);
}

impl<T: Element> Optimizer<T> for Sgd<T> {
    fn step(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError> {
        let (base_lr, momentum, base_decay) = (self.lr, self.momentum, self.weight_decay);
        self.velocity.update_all(
            params,
            grads,
            |p| Ok(Param::try_zeros(p.pool(), p.shape())?),
            |w, v, group, g| {
                let lr = base_lr * T::from_f64(group.lr_scale);
                let decay = group.weight_decay.map_or(base_decay, T::from_f64);
                simd::update(
                    w,
                    v.unique_slice_mut(),
                    g,
                    #[inline(always)]
                    move |w, v, g| {
                        let v = momentum * v + (g + decay * w);
                        (w - lr * v, v)
                    },
                );
            },
        )
    }

    rate_and_state!(velocity, "sgd");
}

/// Adam (Kingma and Ba 2015) with bias correction, and AdamW (Loshchilov and Hutter 2019): with a
/// `weight_decay`, each step first shrinks the parameter, `p = p - lr weight_decay p`, decoupled
/// from the gradient (PyTorch's `AdamW`).
pub struct Adam<T: Element = f32> {
    lr: T,
    beta1: T,
    beta2: T,
    eps: T,
    weight_decay: T,
    /// Per parameter: the moments and the number of updates it has had (its bias correction, as in
    /// PyTorch, counts the parameter's own steps).
    moments: States<(Param<T>, Param<T>, i32)>,
}

impl<T: Element> Adam<T> {
    /// Adam with learning rate `lr` and the usual `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-8`.
    pub fn new(lr: T) -> Self {
        Adam::with_betas(lr, T::from_f64(0.9), T::from_f64(0.999), T::from_f64(1e-8))
    }

    /// Adam with every coefficient given.
    pub fn with_betas(lr: T, beta1: T, beta2: T, eps: T) -> Self {
        Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay: T::zero(),
            moments: States::new(),
        }
    }

    /// AdamW: Adam with decoupled weight decay `weight_decay` (PyTorch's default is 0.01).
    pub fn adamw(lr: T, weight_decay: T) -> Self {
        Adam {
            weight_decay,
            ..Adam::new(lr)
        }
    }

    groups_builder!(moments);
}

impl<T: Element> Optimizer<T> for Adam<T> {
    fn step(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError> {
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        let (base_lr, base_decay) = (self.lr, self.weight_decay);
        self.moments.update_all(
            params,
            grads,
            |p| {
                Ok((
                    Param::try_zeros(p.pool(), p.shape())?,
                    Param::try_zeros(p.pool(), p.shape())?,
                    0,
                ))
            },
            |w, (m, v, t), group, g| {
                let lr = base_lr * T::from_f64(group.lr_scale);
                let weight_decay = group.weight_decay.map_or(base_decay, T::from_f64);
                let decay = T::one() - lr * weight_decay;
                let decoupled = weight_decay != T::zero();
                *t = t.saturating_add(1);
                let correction1 = T::one() - b1.powi(*t);
                let correction2 = T::one() - b2.powi(*t);
                let states = (m.unique_slice_mut(), v.unique_slice_mut());
                simd::update(
                    w,
                    states,
                    g,
                    #[inline(always)]
                    move |w, (m, v), g| {
                        let w = if decoupled { w * decay } else { w };
                        let m = b1 * m + (T::one() - b1) * g;
                        let v = b2 * v + (T::one() - b2) * g * g;
                        let (m_hat, v_hat) = (m / correction1, v / correction2);
                        (w - lr * m_hat / (v_hat.sqrt() + eps), (m, v))
                    },
                );
            },
        )
    }

    rate_and_state!(moments, "adam");
}
