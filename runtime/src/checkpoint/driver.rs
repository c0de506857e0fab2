//! The forward over a list of layers that stores the policy's checkpoints, for both
//! `Checkpointer::checkpointed_forward` (every layer in the caller's scope) and `#[checkpoint]`
//! (each segment in a child scope). A recording forward records each step on a tape and gives the
//! output the region's node (see `region`).

use super::memory::{self, Layout, Measuring, StepKey};
use super::region::{self, Recording, SkipOut};
use super::{CheckpointConfig, CheckpointError, Checkpointer, Result};
use crate::autograd::Keep;
use crate::element::Element;
use crate::recycle::RecycledVec;
use crate::scope::{run_named, Scope, ScopeState, State};
use crate::tensor::Tensor;
use crate::trace::ScopeName;

/// The checkpointer a forward stores into.
enum Slot<'c, T: Element> {
    Given(&'c mut Checkpointer<T>),
    /// A recording forward without a checkpointer keeps its boundaries in one of its own.
    Own(Box<Checkpointer<T>>),
    /// Inference without a checkpointer: nothing is stored.
    None,
}

/// One forward over layers: the plan, the checkpointer, and the recording of the region being
/// run, if any.
struct Driver<'c, T: Element> {
    slot: Slot<'c, T>,
    /// Where segments start: the stored positions, and 0.
    plan: RecycledVec<usize>,
    /// Which steps run on tapes and where regions start (see `Layout`; none when the forward
    /// records no graph).
    layout: Layout,
    /// The region being run and the position of its first step.
    recording: Option<(Recording<T>, usize)>,
    /// The position of the step being run, and this thread's pool level when it started (while
    /// the forward is checked against its plan's key).
    pos: usize,
    entered: usize,
    /// Where a step first differed from the key of `Policy::Memory`'s plan: from there on every
    /// step runs on a tape in one region that reverses with the least memory.
    stale: Option<usize>,
    /// What the steps' tapes do with the outputs of the ops the config's `Saving` names.
    keep: Keep,
    /// The pool bytes the tapes of a profiling step keep, and those they would keep (counted,
    /// keeping nothing; see `finish`).
    kept_bytes: (usize, usize),
    /// The inputs of steps that later steps read (skip connections).
    skips: Skips<'c, T>,
    /// Whether the forward ran to its end (see `Drop`).
    finished: bool,
}

impl<T: Element> Drop for Driver<'_, T> {
    /// A forward that did not end (a step panicked, or failed) lets go of the boundaries it
    /// stored, which nothing will replay: the unwind gives the pool back what the step rented.
    fn drop(&mut self) {
        if !self.finished {
            if let Some(ckpt) = self.slot.get() {
                ckpt.clear();
            }
        }
    }
}

/// The inputs of steps that later steps read (skip connections), held from when their step starts
/// until their last reader has them.
struct Skips<'r, T: Element> {
    /// `reads[pos]`: the earlier positions whose inputs the step at `pos` reads; empty when no
    /// step reads one.
    reads: &'r [&'r [usize]],
    /// `(position, last reader, value)`.
    held: RecycledVec<(usize, usize, Option<Tensor<'static, T>>)>,
}

impl<'r, T: Element> Skips<'r, T> {
    /// The skip reads `reads` of a chain of `n` steps, checked: each step reads only inputs of
    /// steps before it.
    fn new(reads: &'r [&'r [usize]], n: usize) -> Result<Self> {
        let mut held: RecycledVec<(usize, usize, Option<Tensor<'static, T>>)> = RecycledVec::new();
        if !reads.is_empty() && reads.len() != n {
            return Err(CheckpointError::BadSkip {
                step: reads.len().min(n),
                read: None,
                steps: n,
            });
        }
        for (step, sources) in reads.iter().enumerate() {
            for &source in sources.iter() {
                if source >= step {
                    return Err(CheckpointError::BadSkip {
                        step,
                        read: Some(source),
                        steps: n,
                    });
                }
                match held.iter_mut().find(|(p, ..)| *p == source) {
                    Some((_, last, _)) => *last = step,
                    None => held.push((source, step, None)),
                }
            }
        }
        Ok(Skips { reads, held })
    }

    /// `x`, the input of the step at `pos`, is held if a later step reads it.
    fn hold(&mut self, pos: usize, x: &Tensor<'_, T>) {
        if let Some((_, _, held)) = self.held.iter_mut().find(|(p, ..)| *p == pos) {
            *held = Some(x.alias_in(&x.rents_in));
        }
    }

    /// The inputs the step at `pos` reads, each as `give` hands it over; those it reads last are
    /// let go.
    fn read(
        &mut self,
        pos: usize,
        mut give: impl FnMut(&Tensor<'static, T>) -> Tensor<'static, T>,
    ) -> RecycledVec<Tensor<'static, T>> {
        // No spare buffer taken for a step that reads none (every step of most chains).
        let mut out = RecycledVec::empty();
        for &source in self.reads.get(pos).copied().unwrap_or(&[]) {
            let (_, last, held) = self
                .held
                .iter_mut()
                .find(|(p, ..)| *p == source)
                .expect("every position read is held");
            out.push_spared(give(held.as_ref().expect("held until its last reader")));
            if *last == pos {
                *held = None;
            }
        }
        out
    }

    /// Moves the held values' accounting to `target`, the scope a segment's output escapes to.
    fn settle(&mut self, target: &State) {
        for value in self.held.iter_mut().filter_map(|(.., held)| held.as_mut()) {
            value.move_accounting(target);
            *value = value.alias_in(target);
        }
    }
}

/// How a step compared with the key of the plan it ran under.
enum Verdict {
    Same,
    /// Recording its graph, it peaked at this many bytes, above its profile; the rest was as
    /// measured.
    Peak(usize),
    /// It read or held other than what the plan was made for.
    Other,
}

impl<'c, T: Element> Driver<'c, T> {
    /// Plans a forward over `ids` from `input`, whose step at `pos` reads the inputs of the
    /// earlier steps `reads[pos]` (no step reads any if `reads` is empty).
    fn start(
        mut config: CheckpointConfig,
        ckpt: Option<&'c mut Checkpointer<T>>,
        ids: impl ExactSizeIterator<Item = usize> + Clone,
        reads: &'static [&'static [usize]],
        input: &Tensor<'_, T>,
    ) -> Result<Self> {
        let n = ids.len();
        let skips = Skips::new(reads, n)?;
        let keep = Keep::Outputs(config.saving.names());
        let mut plan = RecycledVec::new();
        let records = region::records(input);
        let mut slot = match ckpt {
            Some(ckpt) => {
                ckpt.set_config(config);
                Slot::Given(ckpt)
            }
            None if records => {
                let site = config.site;
                let mut own = Checkpointer::for_element(config);
                if let Some(site) = site {
                    own.memory = memory::take_site(site);
                }
                Slot::Own(Box::new(own))
            }
            None => {
                // Nothing is stored, so there is no limit to respect: the plan only groups segments.
                config.max_checkpoints = None;
                config.plan::<T>(n, input.len(), &mut plan)?;
                return Ok(Driver {
                    slot: Slot::None,
                    plan,
                    layout: Layout::Prefix(0),
                    recording: None,
                    pos: 0,
                    entered: 0,
                    stale: None,
                    keep,
                    kept_bytes: (0, 0),
                    skips,
                    finished: false,
                });
            }
        };
        let ckpt = slot.get().expect("a checkpointer was given or made");
        let layout = ckpt.begin(ids, input, records, reads)?;
        // `Policy::Memory` runs each plan keeping what the saving names or nothing, as planned;
        // a profiling step that keeps nothing counts what it would keep.
        let keep = match (&layout, keep) {
            (Layout::Profile, Keep::Outputs(names)) if !ckpt.memory.keeps => Keep::Count(names),
            (Layout::Least | Layout::Rotor(_), _) if !ckpt.memory.keeps => Keep::Outputs(&[]),
            _ => keep,
        };
        // The segments start where checkpoints are stored, and at the first step.
        if ckpt.planned().first() != Some(&0) {
            plan.push(0);
        }
        plan.extend_from_slice(ckpt.planned());
        Ok(Driver {
            slot,
            plan,
            layout,
            recording: None,
            pos: 0,
            entered: 0,
            stale: None,
            keep,
            kept_bytes: (0, 0),
            skips,
            finished: false,
        })
    }

    /// Whether the step at `pos` runs on a tape.
    fn taped(&self, pos: usize) -> bool {
        self.layout.taped_when(pos, self.stale)
    }

    /// Whether a new region starts at `pos` (a taped step).
    fn starts_region(&self, pos: usize) -> bool {
        match self.stale {
            Some(p) if pos >= p => pos == p,
            _ => self.layout.starts_region(pos),
        }
    }

    /// `differs(key)` of the key of `Policy::Memory`'s plan at `pos`: `None` if the forward is not
    /// checked against one (another policy, a profiling step, stated costs) or has gone stale.
    fn check_key<R>(&mut self, pos: usize, differs: impl FnOnce(&StepKey) -> R) -> Option<R> {
        if self.stale.is_some() {
            return None;
        }
        let ckpt = self.slot.get()?;
        Some(differs(ckpt.memory.checking.as_ref()?.get(pos)?))
    }

    /// The step at `pos` is not the one the plan was made for: the plan's costs are forgotten (the
    /// next forward measures these steps), the regions already run reverse with the least memory,
    /// and the steps from `pos` on run on tapes in one region that does too.
    ///
    /// With `peak`, the step before `pos` did what the plan was made for but, recording its
    /// graph, held `peak` at most, above what its profile measured: the costs are kept with that
    /// peak, and the next forward plans anew with them.
    fn go_stale(&mut self, pos: usize, peak: Option<usize>) {
        self.stale = Some(pos);
        if let Layout::Rotor(plan) = &self.layout {
            plan.stale.set(true);
        }
        if let Some(ckpt) = self.slot.get() {
            match peak {
                Some(peak) => ckpt.raise_record_peak(pos - 1, peak),
                None => ckpt.forget_checked(),
            }
            ckpt.store_at(pos);
            ckpt.memory.stale_at = Some(pos);
        }
    }

    /// The input of the step at `pos`: stored if the plan says so and, for a step on a tape,
    /// opening it (and a region, if one starts here). A step that keeps its graph gets the
    /// previous region's output, with the region's node.
    fn enter<'s>(&mut self, pos: usize, x: Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        self.pos = pos;
        if self.check_key(pos, |key| key.input.slice() != x.shape()) == Some(true) {
            self.go_stale(pos, None);
        }
        let taped = self.taped(pos);
        let mut x = if !taped || self.starts_region(pos) {
            self.close_region(pos, x)?
        } else {
            x
        };
        if taped && self.recording.is_none() {
            self.recording = Some((Recording::start(&mut x, self.keep), pos));
        }
        // A trace tags what the step rents with where its segment starts, its own position and
        // whether it runs on a tape.
        crate::trace::set_segment(|| Some((self.segment_start(pos), pos, taped)));
        if let Some(ckpt) = self.slot.get() {
            x = ckpt.record(pos, x)?;
        }
        if let Some(mut measuring) = self.measuring() {
            measuring.enter(x.rents_in.pool(), x.shape(), x.data_bytes());
        }
        if self.check_key(pos, |_| false).is_some() {
            self.entered = x.rents_in.pool().probe_start();
        }
        let x = match &mut self.recording {
            Some((recording, _)) if taped => recording.open(x),
            _ => x,
        };
        self.skips.hold(pos, &x);
        Ok(x)
    }

    /// The inputs of earlier steps that the step at `pos` reads, as tensors of `at`: values of
    /// its tape if it runs on one (which its region's backward gives them), else with their own
    /// nodes.
    fn skips_for(&mut self, pos: usize, at: &State) -> RecycledVec<Tensor<'static, T>> {
        let taped = self.taped(pos);
        let recording = self.recording.as_mut().filter(|_| taped);
        match recording {
            Some((recording, _)) => self.skips.read(pos, |v| recording.read_skip(v, at)),
            None => self.skips.read(pos, |v| v.alias_in(at)),
        }
    }

    /// Where the segment of the step at `pos` starts: its region's first step if it runs on a
    /// tape, else the plan's last segment start at or before it.
    fn segment_start(&self, pos: usize) -> usize {
        match &self.recording {
            Some((_, start)) => *start,
            None => {
                let starts = &self.plan[..self.plan.partition_point(|&p| p <= pos)];
                starts.last().copied().unwrap_or(0)
            }
        }
    }

    /// The measurements of this forward, if it is the profiling step of `Policy::Memory`.
    fn measuring(&mut self) -> Option<std::cell::RefMut<'_, Measuring>> {
        match (&self.layout, self.slot.get()) {
            (Layout::Profile, Some(ckpt)) => Some(ckpt.memory.measuring.borrow_mut()),
            _ => None,
        }
    }

    /// What the step returned, as the next step's input.
    fn leave<'s>(&mut self, y: Tensor<'s, T>) -> Tensor<'s, T> {
        let (y, reads) = match &mut self.recording {
            Some((recording, _)) => {
                let y = recording.close(y);
                if matches!(self.layout, Layout::Profile) {
                    let (kept, counted) = recording.kept_bytes();
                    self.kept_bytes.0 += kept;
                    self.kept_bytes.1 += counted;
                }
                (y, Some(recording.fingerprint()))
            }
            None => (y, None),
        };
        if let Some(mut measuring) = self.measuring() {
            measuring.leave(y.rents_in.pool(), reads);
        }
        let (pool, entered) = (y.rents_in.pool(), self.entered);
        let verdict = self.check_key(self.pos, |key| {
            let (level, peak) = pool.probe();
            let (held, peak) = (level.wrapping_sub(entered), peak.saturating_sub(entered));
            let read_other = matches!((key.reads, reads), (Some(was), Some(now)) if was != now);
            match key.exceeded(reads.is_some(), held, peak) {
                false if !read_other => Verdict::Same,
                // A step's own code may keep values alive longer than its replay, which drops
                // each after its last reader (a local bound until the step returns): recording
                // in the forward, it peaks above what the profile's replay measured.
                true if !read_other && reads.is_none() && held <= key.graph_bytes => {
                    Verdict::Peak(peak)
                }
                _ => Verdict::Other,
            }
        });
        match verdict {
            Some(Verdict::Other) => self.go_stale(self.pos + 1, None),
            Some(Verdict::Peak(peak)) => self.go_stale(self.pos + 1, Some(peak)),
            _ => {}
        }
        y
    }

    /// `x`, the output of the region being run (steps before `end`), with the region's node; `x`
    /// as it is if no region is open.
    fn close_region<'s>(&mut self, end: usize, x: Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        let (Some((recording, start)), Some(ckpt)) = (self.recording.take(), self.slot.get())
        else {
            return Ok(x);
        };
        let least = self.stale.is_some_and(|p| start >= p);
        // Inputs of the region's steps that steps after it read: their gradients come to the
        // region through nodes whose backward runs before the region's.
        let later = |&&(p, last, _): &&(usize, usize, _)| (start..end).contains(&p) && last >= end;
        let read_later = self
            .skips
            .held
            .iter()
            .filter(later)
            .map(|&(p, ..)| p - start);
        let pending = recording.pending().clone();
        let x = recording.finish(ckpt, &self.layout, least, (start, end), read_later, x)?;
        let inside = |(p, ..): &&mut (usize, usize, _)| (start..end).contains(p);
        for (p, _, held) in self.skips.held.iter_mut().filter(inside) {
            if let Some(value) = held {
                value.node = (x.node.as_ref())
                    .map(|region| SkipOut::node(region, &pending, *p - start, &x.rents_in));
            }
        }
        Ok(x)
    }

    /// Moves the accounting of what the tapes keep to `target`, the scope a segment's output
    /// escapes to.
    fn settle(&mut self, target: &State) {
        if let Some((recording, _)) = &self.recording {
            recording.settle(target);
        }
        self.skips.settle(target);
    }

    /// The forward's output: `x`, with the node of the region that ends it, if one does.
    fn finish<'s>(mut self, n: usize, x: Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        crate::trace::set_segment(|| None);
        let x = self.close_region(n, x)?;
        self.finished = true;
        let kept_bytes = self.kept_bytes;
        if let Some(mut measuring) = self.measuring() {
            measuring.forward_ended(x.rents_in.pool(), x.data_bytes());
            // The planner does not know that a taped step keeps outputs (`Saving`) until its
            // backward: the kept bytes of every step are counted as held for the whole step, as
            // the chain's output is, so that every plan still holds its budget.
            measuring.costs.output_bytes += kept_bytes.0;
            measuring.would_keep = kept_bytes.1;
        }
        if let (Layout::Profile | Layout::Least | Layout::Rotor(_), Some(ckpt)) =
            (&self.layout, self.slot.get())
        {
            memory::Watch::wait(&ckpt.memory.watch);
        }
        if let Slot::Own(own) = &mut self.slot {
            if let Some(site) = own.config.site {
                memory::keep_site(site, std::mem::take(&mut own.memory));
            }
        }
        Ok(x)
    }
}

impl<T: Element> Slot<'_, T> {
    fn get(&mut self) -> Option<&mut Checkpointer<T>> {
        match self {
            Slot::Given(ckpt) => Some(ckpt),
            Slot::Own(ckpt) => Some(ckpt),
            Slot::None => None,
        }
    }
}

impl<T: Element> Checkpointer<T> {
    /// Runs `forward(activation, layer)` for each of `layers` in order from `input`, storing the inputs
    /// of the layers the policy picks (earlier checkpoints are dropped first), and returns the last
    /// output. Layer ids must be distinct.
    ///
    /// In a forward that records a gradient graph (a training scope, or an input that carries a
    /// graph), the layers record nothing but what it takes to run them again, and the output's
    /// [`backward`](Tensor::backward) replays them from the checkpoints (see `#[checkpoint]`).
    pub fn checkpointed_forward<'s>(
        &mut self,
        input: &Tensor<'s, T>,
        layers: &[usize],
        mut forward: impl FnMut(&Tensor<'s, T>, usize) -> Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        // Sorted in a recycled list, repeats are neighbours: no set to allocate.
        let mut sorted: RecycledVec<usize> = layers.iter().copied().collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            // Name the first id, in the caller's order, that is seen again.
            let layer = (1..layers.len())
                .find(|&i| layers[..i].contains(&layers[i]))
                .map_or(0, |i| layers[i]);
            return Err(CheckpointError::BadLayer {
                layer,
                problem: "appears twice in",
                count: layers.len(),
            });
        }
        let mut x = input.clone();
        let config = self.config.clone();
        let ids = layers.iter().copied();
        let mut driver = Driver::start(config, Some(self), ids, &[], &x)?;
        for (pos, &layer) in layers.iter().enumerate() {
            x = driver.enter(pos, x)?;
            x = driver.leave(forward(&x, layer));
        }
        driver.finish(layers.len(), x)
    }
}

/// Runs the layer loop of a `#[checkpoint]` function: `step(segment_scope, activation, skips,
/// layer)` for each of `layers` in order, `skips` being the inputs of the earlier steps that
/// `reads[pos]` names for the step at `pos` (skip connections; `reads` is empty when no step
/// reads one), the layers grouped into segments by the policy's plan and each segment
/// run in its own child scope of the activation's (so its temporaries are that scope's to release).
/// The input of each segment's first layer is saved into `ckpt` if there is one; with none, nothing
/// is stored in inference, and a recording forward keeps its boundaries in a checkpointer of its
/// own.
///
/// `config` is the attribute's; without one, `ckpt`'s own configuration applies, and without a
/// checkpointer either the layers run as written, in one child scope, checkpointing nothing.
///
/// The layers are taken as they come when the iterator knows its length (a slice's, a range's), and
/// collected first otherwise: the plan needs their count before the first one runs.
///
/// # Panics
/// If `layers` yields another number of layers than its exact size hint said.
pub(crate) fn run_layers<'s, T: Element, L>(
    config: Option<CheckpointConfig>,
    ckpt: Option<&mut Checkpointer<T>>,
    input: Tensor<'s, T>,
    layers: impl IntoIterator<Item = L>,
    reads: &'static [&'static [usize]],
    step: impl for<'b> FnMut(&Scope<'b, 's>, Tensor<'b, T>, &[Tensor<'b, T>], L) -> Tensor<'b, T>,
) -> Result<Tensor<'s, T>> {
    let layers = layers.into_iter();
    let chain = (config, ckpt, input, reads);
    match layers.size_hint() {
        (low, Some(high)) if low == high => run_counted(chain, layers, low, step),
        _ => {
            let layers: Vec<L> = layers.collect();
            let n = layers.len();
            run_counted(chain, layers.into_iter(), n, step)
        }
    }
}

/// What [`run_layers`] runs: the configuration, the checkpointer, the input and the skip reads.
type Chain<'c, 's, T> = (
    Option<CheckpointConfig>,
    Option<&'c mut Checkpointer<T>>,
    Tensor<'s, T>,
    &'static [&'static [usize]],
);

/// [`run_layers`] over `n` layers.
fn run_counted<'s, T: Element, L>(
    (config, ckpt, input, reads): Chain<'_, 's, T>,
    mut layers: impl Iterator<Item = L>,
    n: usize,
    mut step: impl for<'b> FnMut(&Scope<'b, 's>, Tensor<'b, T>, &[Tensor<'b, T>], L) -> Tensor<'b, T>,
) -> Result<Tensor<'s, T>> {
    let config = match (config, &ckpt) {
        (Some(config), _) => config,
        (None, Some(ckpt)) => ckpt.config().clone(),
        (None, None) => {
            let state = ScopeState::child(&input.rents_in, None);
            let name = || ScopeName::Named("checkpointed layers");
            let mut skips = Skips::new(reads, n)?;
            return Ok(run_named(state, name, |scope: &Scope<'_, 's>| {
                let mut x = scope.rebind_owned(input);
                for (pos, layer) in layers.enumerate() {
                    skips.hold(pos, &x);
                    let read = skips.read(pos, |v| v.alias_in(&x.rents_in));
                    x = step(scope, x, &read, layer);
                }
                scope.escape(x)
            })
            .0);
        }
    };
    let mut driver = Driver::start(config, ckpt, 0..n, reads, &input)?;
    let mut x = input;
    let mut taken = 0;
    for j in 0..driver.plan.len() {
        let (start, end) = (driver.plan[j], driver.plan.get(j + 1).copied().unwrap_or(n));
        let parent = x.rents_in.clone();
        let state = ScopeState::child(&parent, None);
        let name = || ScopeName::Named("checkpoint segment");
        x = run_named(state, name, |segment: &Scope<'_, 's>| {
            let mut a = segment.rebind_owned(x);
            for (pos, layer) in (start..end).zip(layers.by_ref()) {
                taken += 1;
                a = driver.enter(pos, a)?;
                let skips = driver.skips_for(pos, &a.rents_in);
                a = driver.leave(step(segment, a, &skips, layer));
            }
            driver.settle(&parent);
            Ok::<_, CheckpointError>(segment.escape(a))
        })
        .0?;
    }
    assert!(
        taken == n && layers.next().is_none(),
        "the layer iterator of a #[checkpoint] loop gave another number of layers than its exact \
         size hint ({n})"
    );
    driver.finish(n, x)
}
