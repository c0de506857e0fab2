//! `Policy::Memory`: the costs it plans with (measured by a profiling step or stated), and the plan
//! of a recording forward.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use super::rotor::{ChainCosts, Rotor, StepCost, TopPlan};
use super::{CheckpointError, Checkpointer, Precision, Result};
use crate::autograd;
use crate::dims::Dims;
use crate::element::Element;
use crate::pool::Pool;

/// What the checkpointer keeps for `Policy::Memory`.
#[derive(Default)]
pub(crate) struct Memory {
    /// The costs known, each with the key it was measured for, most recently used last.
    known: Vec<Known>,
    /// The measurements of the profiling step in progress, shared with its region's backward.
    pub(crate) measuring: Rc<RefCell<Measuring>>,
    /// The forward in progress under a plan: the key of its costs, which each step is checked
    /// against (`None` for stated costs and for a profiling step).
    pub(crate) checking: Option<Rc<[StepKey]>>,
    /// The time and the pool peak of the last training step, measured from its forward's start
    /// to the end of its backward.
    pub(crate) watch: Rc<Watch>,
    /// The layout of the last training forward under `Policy::Memory`, for its report.
    pub(crate) layout: Option<Layout>,
    /// Where that forward's steps first differed from its plan's key, if they did.
    pub(crate) stale_at: Option<usize>,
    /// Whether a profiling step has been kept.
    profiled: bool,
    /// The skip reads of the last forward planned (see [`skip_bytes`]).
    reads: &'static [&'static [usize]],
    /// Whether the taped steps of the forward in progress keep what the saving policy names:
    /// `Policy::Memory` offers the saving to its planner, which runs each plan with it or not.
    pub(crate) keeps: bool,
}

/// At most this many sets of costs are kept, one per key: a batch or a sequence length that comes
/// back (the last batch of every epoch) finds its plan without profiling again.
const KNOWN: usize = 4;

/// Costs and what they were measured for.
struct Known {
    costs: ChainCosts,
    /// The steps as the profiling step saw them; `None` for stated costs, which serve any input
    /// of their layer count.
    key: Option<Rc<[StepKey]>>,
    /// The plan of the last budget for these costs.
    plan: Option<Rc<MemoryPlan>>,
    /// Whether these are the first costs measured and their profiling step made parameters'
    /// gradients (the first step of a training loop does): a loop that keeps its gradients holds
    /// less from the next step on, so the next forward of this key profiles again rather than
    /// plan with costs it will not have (and refuse budgets that its steps fit).
    cold: bool,
    /// Bytes of the gradients of the values from before the chain that its steps read.
    shared_gradient_bytes: usize,
    /// The budget the last plan was for, if it was `Layout::Least`.
    least_for: Option<usize>,
    /// Pool bytes of the outputs of the ops a saving policy names, as the profiling step (which
    /// keeps nothing) counted them: what its tapes would have kept.
    would_keep: usize,
    /// Under a saving policy, the same steps measured keeping what it names (a second profiling
    /// step, run once the budget fits it), which the planner chooses from as well; `None` until
    /// measured, and for stated costs.
    kept: Option<Kept>,
}

/// The costs of a chain's steps measured keeping what a saving policy names, the key they were
/// measured for, and their fronts once built.
struct Kept {
    costs: ChainCosts,
    key: Rc<[StepKey]>,
    rotor: Option<Rc<Rotor>>,
}

/// What one set of costs makes of a budget.
enum Planned {
    Top(TopPlan),
    /// No schedule of the dynamic program fits, and the least-memory schedule, measured, does.
    Least,
    /// Nothing fits: the smallest budget that does.
    TooSmall(usize),
}

/// The fastest schedule of `rotor` (the fronts of `costs`) within `budget`, whose steps' skip
/// reads hold `skips` bytes beyond the planner's count and whose values from before the chain
/// have gradients of `shared` bytes.
fn plan_costs(
    rotor: &Rotor,
    costs: &ChainCosts,
    budget: usize,
    skips: usize,
    shared: usize,
) -> Planned {
    let Some(top) = plan_with_skips(rotor, budget, skips) else {
        // The schedule of the profiling step, which held the least and was measured, fits where
        // the planner's count with skip reads' reserve does not.
        let least = costs.credible_least_peak();
        return match (1..=budget).contains(&least) {
            true => Planned::Least,
            false => Planned::TooSmall(smallest_with_skips(rotor, skips, least)),
        };
    };
    // A step recording its graph after a region, reading a value from before the chain, makes
    // its gradient in the outer backward before the region makes its own: two at once, where the
    // profiling step's one region held one. Such a schedule is planned with them reserved.
    let first_region = top.regions.first().map_or(usize::MAX, |r| r.start);
    let mixed = top.graph.iter().skip(first_region).any(|&g| g);
    if !mixed || shared == 0 {
        return Planned::Top(top);
    }
    match plan_reserving(rotor, budget, shared + skips) {
        Some(top) => Planned::Top(top),
        // Every step on a tape in one region holds them once, as the profiling step did, which
        // the budget fits (the plan did without them).
        None => Planned::Least,
    }
}

/// The fastest schedule of `rotor` within `budget` for steps whose skip reads hold `skips` bytes
/// beyond the planner's count (see [`skip_bytes`]): a schedule that records every step holds
/// them in its graphs, as the planner counts them, and needs no reserve; any other is planned
/// for the budget less the reserve.
fn plan_with_skips(rotor: &Rotor, budget: usize, skips: usize) -> Option<TopPlan> {
    match rotor.plan(budget as u64) {
        Some(top) if skips == 0 || top.regions.is_empty() => Some(top),
        _ => plan_reserving(rotor, budget, skips),
    }
}

/// The fastest schedule of `rotor` within `budget` less `reserve` bytes, its peak counting them.
fn plan_reserving(rotor: &Rotor, budget: usize, reserve: usize) -> Option<TopPlan> {
    let mut top = rotor.plan(budget.checked_sub(reserve)? as u64)?;
    top.peak += reserve;
    Some(top)
}

/// The smallest budget a schedule of `rotor` fits with `skips` bytes of skip reads: the planner's
/// with the reserve, the fastest schedule's if it records every step, or the measured peak of
/// the least-memory schedule (`least`, 0 if not measured), whichever is least.
fn smallest_with_skips(rotor: &Rotor, skips: usize, least: usize) -> usize {
    let mut smallest = rotor.smallest_budget() + skips;
    let fastest = rotor.fastest_budget();
    if skips > 0 && plan_with_skips(rotor, fastest, 0).is_some_and(|t| t.regions.is_empty()) {
        smallest = smallest.min(fastest);
    }
    match least {
        0 => smallest,
        least => least.min(smallest),
    }
}

/// Bytes a schedule of `steps` may hold beyond what the planner counts when the step at `pos`
/// reads the inputs of the earlier steps `reads[pos]` (skip connections): each such input is held
/// from its step's forward until its last reader's backward, and its gradient from then until the
/// backward reaches it, so one of the two at any time, and both for the inputs the step being
/// reversed reads. The chain's input is in use when the step starts (the budget counts above
/// that): holding it longer holds nothing more, so only its gradient counts.
fn skip_bytes(steps: &[StepCost], reads: &[&[usize]]) -> usize {
    let bytes = |p: usize| steps.get(p).map_or(0, |c| c.input_bytes);
    let mut sources: Vec<usize> = reads.iter().flat_map(|r| r.iter().copied()).collect();
    sources.sort_unstable();
    sources.dedup();
    let both = reads.iter().map(|r| {
        r.iter()
            .filter(|&&p| p > 0)
            .map(|&p| bytes(p))
            .sum::<usize>()
    });
    sources.into_iter().map(bytes).sum::<usize>() + both.max().unwrap_or(0)
}

/// What determines a step's costs, as a forward sees it: the shape of its input, the fingerprint
/// of its tape (how many ops, on values from outside of which shapes; see `Tape::fingerprint`),
/// and the pool bytes it was measured to hold. A planned forward whose step differs from its key
/// replans.
impl Memory {
    /// Starts a profiling step (`kept`: keeping what a saving policy names; else keeping
    /// nothing and counting what it would keep), the one position it stores in `plan`.
    fn profile(&mut self, plan: &mut Vec<usize>, kept: bool) -> Layout {
        *self.measuring.borrow_mut() = Measuring {
            kept,
            ..Measuring::default()
        };
        self.checking = None;
        self.keeps = kept;
        plan.clear();
        plan.push(0);
        Layout::Profile
    }

    /// The measured peak of the least-memory schedule of the costs planned with last (0 if not
    /// measured).
    pub(crate) fn least_peak(&self) -> usize {
        self.known
            .last()
            .map_or(0, |k| k.costs.credible_least_peak())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepKey {
    pub(crate) input: Dims,
    /// `None` until the step's tape closes.
    pub(crate) reads: Option<u64>,
    /// The step's measured bytes: held at most beyond its input on a tape (`forward_peak`), and
    /// held after recording its graph and at most while recording it (`graph_bytes`,
    /// `record_peak`).
    pub(crate) forward_peak: usize,
    pub(crate) graph_bytes: usize,
    pub(crate) record_peak: usize,
}

impl StepKey {
    /// Whether a run of the step that held `held` bytes at its end and `peak` at most, beyond its
    /// input, on a tape or recording its graph, holds more than it was measured to.
    pub(crate) fn exceeded(&self, taped: bool, held: usize, peak: usize) -> bool {
        if taped {
            peak > self.forward_peak
        } else {
            held > self.graph_bytes || peak > self.record_peak.max(self.graph_bytes)
        }
    }
}

impl Known {
    /// Whether these are the costs measured for `key`.
    fn keyed_by(&self, key: &Rc<[StepKey]>) -> bool {
        self.key.as_ref().is_some_and(|k| Rc::ptr_eq(k, key))
            || self.kept.as_ref().is_some_and(|k| Rc::ptr_eq(&k.key, key))
    }
}

/// A training step's time and pool peak, from its forward's start to the end of its backward.
#[derive(Default)]
pub(crate) struct Watch {
    /// The pool, the level and the clock at the forward's start, until the backward ends.
    started: RefCell<Option<(Pool, usize, Instant)>>,
    /// Seconds and peak bytes above the start, once the backward has ended.
    pub(crate) measured: std::cell::Cell<Option<(f64, usize)>>,
    /// Whether it waits for a backward to end: registered once, however many forwards start
    /// before one does.
    waiting: std::cell::Cell<bool>,
}

impl Watch {
    /// A training forward starts.
    pub(crate) fn start(&self, pool: &Pool) {
        *self.started.borrow_mut() = Some((pool.clone(), pool.probe_step_start(), Instant::now()));
        self.measured.set(None);
    }

    /// The pool peak of the last training step measured, 0 before one was.
    pub(crate) fn peak(&self) -> usize {
        self.measured.get().map_or(0, |(_, peak)| peak)
    }

    /// The forward has ended: `watch` is told when the next backward ends.
    pub(crate) fn wait(watch: &Rc<Watch>) {
        if !watch.waiting.replace(true) {
            autograd::at_backward_end(watch.clone());
        }
    }
}

impl autograd::BackwardEnd for Watch {
    fn ended(&self) {
        self.waiting.set(false);
        if let Some((pool, level, clock)) = self.started.borrow_mut().take() {
            let peak = pool.probe_step().saturating_sub(level);
            self.measured
                .set(Some((clock.elapsed().as_secs_f64(), peak)));
        }
    }
}

thread_local! {
    /// What `Policy::Memory` knows of each `#[checkpoint]` function run without a checkpointer,
    /// by site.
    static SITES: RefCell<Vec<(&'static str, Memory)>> = const { RefCell::new(Vec::new()) };
}

/// Takes what `Policy::Memory` knows of `site` on this thread (nothing, the first time).
pub(crate) fn take_site(site: &'static str) -> Memory {
    SITES.with_borrow_mut(|sites| match sites.iter().position(|(s, _)| *s == site) {
        Some(i) => sites.swap_remove(i).1,
        None => Memory::default(),
    })
}

/// Keeps `memory` for the next forward of `site` on this thread.
pub(crate) fn keep_site(site: &'static str, memory: Memory) {
    SITES.with_borrow_mut(|sites| sites.push((site, memory)));
}

/// A profiling step's measurements, filled by its forward and then by its backward.
#[derive(Default)]
pub(crate) struct Measuring {
    pub(crate) costs: ChainCosts,
    /// The steps as the profiled forward saw them.
    key: Vec<StepKey>,
    /// Bytes in use when the forward ended.
    pub(crate) forward_end: usize,
    /// The start of the step being measured: bytes in use and the clock.
    step_start: Option<(usize, Instant)>,
    /// Whether every step and what followed the chain's backward are measured.
    pub(crate) done: bool,
    /// Whether the steps run keeping what a saving policy names: its second profile.
    pub(crate) kept: bool,
    /// Pool bytes of the outputs of the ops a saving policy names, counted by a profile that
    /// keeps nothing.
    pub(crate) would_keep: usize,
    /// Bytes of the gradients of the values from before the chain, once the chain's backward
    /// has made them.
    pub(crate) shared_gradient_bytes: usize,
    /// The pool, and the bytes in use when the chain's backward ended: what follows is measured
    /// until the costs are read.
    backward_end: Option<(Pool, usize)>,
}

/// The optimal schedule for one budget: the dynamic program's fronts (shared by the plans of
/// other budgets of the same costs) and its forward pass.
pub(crate) struct MemoryPlan {
    pub(crate) rotor: Rc<Rotor>,
    pub(crate) top: TopPlan,
    budget: usize,
    /// Whether its taped steps keep what the saving policy names (the costs it was planned with
    /// were measured so).
    keeps: bool,
    /// Set when a forward under this plan met a step that differs from the plan's key: the
    /// regions run under it reverse with the least memory instead of the plan's schedule.
    pub(crate) stale: std::cell::Cell<bool>,
}

/// How a recording forward runs its steps.
#[derive(Clone)]
pub(crate) enum Layout {
    /// The steps before this position run on tapes in one region; the rest record their graphs.
    /// Under `Every`, `Sqrt` and `Explicit` the last segment records its graph, since its backward
    /// comes first (replaying it would cost a forward of it and save nothing: one segment's graph
    /// is alive at a time either way); under `Budget` the last step does, as revolve's does.
    Prefix(usize),
    /// Every step on a tape in one region, only the input stored, each step measured: the
    /// profiling step of `Policy::Memory`.
    Profile,
    /// As `Profile`, measuring nothing: the least memory a schedule holds, where no schedule of
    /// the dynamic program's fits (see `plan_memory`).
    Least,
    /// `Policy::Memory`'s plan: regions and recorded steps as it places them.
    Rotor(Rc<MemoryPlan>),
}

impl Layout {
    /// Whether the step at `pos` runs on a tape.
    pub(crate) fn taped(&self, pos: usize) -> bool {
        match self {
            Layout::Prefix(taped) => pos < *taped,
            Layout::Profile | Layout::Least => true,
            Layout::Rotor(plan) => !plan.top.graph[pos],
        }
    }

    /// Whether the step at `pos` runs on a tape in a forward that went stale at `stale` (from
    /// there on every step does).
    pub(crate) fn taped_when(&self, pos: usize, stale: Option<usize>) -> bool {
        stale.is_some_and(|p| pos >= p) || self.taped(pos)
    }

    /// Whether a new region starts at `pos` (a taped step).
    pub(crate) fn starts_region(&self, pos: usize) -> bool {
        match self {
            Layout::Prefix(_) | Layout::Profile | Layout::Least => pos == 0,
            Layout::Rotor(plan) => plan.top.regions.iter().any(|r| r.start == pos),
        }
    }
}

impl Measuring {
    /// Starts measuring the forward of the step whose input has `shape` and holds `input_bytes`
    /// of data.
    pub(crate) fn enter(&mut self, pool: &Pool, shape: &[usize], input_bytes: usize) {
        self.costs.steps.push(StepCost {
            input_bytes: crate::pool::class_bytes_of(input_bytes),
            ..StepCost::default()
        });
        self.key.push(StepKey {
            input: Dims::from_slice(shape),
            reads: None,
            forward_peak: 0,
            graph_bytes: 0,
            record_peak: 0,
        });
        self.step_start = Some((pool.probe_start(), Instant::now()));
    }

    /// Ends measuring the forward of the last step entered, whose tape has the fingerprint
    /// `reads`.
    pub(crate) fn leave(&mut self, pool: &Pool, reads: Option<u64>) {
        if let Some(key) = self.key.last_mut() {
            key.reads = reads;
        }
        let (Some((before, clock)), Some(step)) =
            (self.step_start.take(), self.costs.steps.last_mut())
        else {
            return;
        };
        step.forward_secs = clock.elapsed().as_secs_f64();
        step.forward_peak = pool.probe().1.saturating_sub(before);
    }

    /// The forward ended with an output of `output_bytes` of data: what follows is measured up
    /// to the chain's backward.
    pub(crate) fn forward_ended(&mut self, pool: &Pool, output_bytes: usize) {
        self.costs.output_bytes = crate::pool::class_bytes_of(output_bytes);
        self.forward_end = pool.probe_start();
    }

    /// The chain's backward ended: every step is measured, and what follows is measured until
    /// the backward it is part of ends (`measuring` is told then).
    pub(crate) fn backward_ended(measuring: &Rc<RefCell<Measuring>>, pool: &Pool) {
        measuring.borrow_mut().backward_end = Some((pool.clone(), pool.probe_start()));
        autograd::at_backward_end(measuring.clone());
    }

    /// The chain's backward starts: what the code after the chain held is known.
    pub(crate) fn backward_started(&mut self, pool: &Pool) {
        let (now, peak) = pool.probe();
        self.costs.after_peak = peak.saturating_sub(self.forward_end);
        self.costs.after_held = now.saturating_sub(self.forward_end);
    }
}

impl autograd::BackwardEnd for RefCell<Measuring> {
    /// The training step's backward ended: what the backward of the code before the chain held
    /// is known, and with it every cost.
    fn ended(&self) {
        let mut measuring = self.borrow_mut();
        if let Some((pool, end)) = measuring.backward_end.take() {
            measuring.costs.before_peak = pool.probe().1.saturating_sub(end);
            measuring.done = true;
        }
    }
}

impl<T: Element> Checkpointer<T> {
    /// The costs `Policy::Memory` plans with: measured by the last profiling step (once its
    /// backward has run), or those of the last planned forward, or stated; `None` before any.
    /// Under a saving policy, these are the costs measured keeping nothing (see
    /// [`Policy::Memory`](super::Policy::Memory)).
    pub fn costs(&self) -> Option<ChainCosts> {
        match self.fresh_costs() {
            Some((costs, false)) => Some(costs),
            _ => self.memory.known.last().map(|known| known.costs.clone()),
        }
    }

    /// The costs a finished profiling step measured and not yet kept, and whether its steps kept
    /// what a saving policy names.
    fn fresh_costs(&self) -> Option<(ChainCosts, bool)> {
        let measuring = self.memory.measuring.borrow();
        measuring.done.then(|| {
            let costs = ChainCosts {
                least_peak: self.memory.watch.peak(),
                ..measuring.costs.clone()
            };
            (costs, measuring.kept)
        })
    }

    /// The smallest budget in bytes `Policy::Memory` finds a schedule for with
    /// [`Checkpointer::costs`], exactly (see [`Policy::Memory`] for the schedules it plans
    /// among), or with the same steps measured keeping what a saving policy names, which the
    /// planner chooses from too; `None` before costs are known. The skip reads counted are those
    /// of the last forward run: costs stated before any forward are counted as a chain without
    /// skip connections, and the first forward with them may fail naming a larger one.
    ///
    /// [`Policy::Memory`]: super::Policy::Memory
    pub fn smallest_budget(&self) -> Option<usize> {
        // The skip reads are those of the last forward planned; built fronts serve as they are.
        let smallest = |costs: &ChainCosts, rotor: Option<&Rc<Rotor>>| {
            let skips = skip_bytes(&costs.steps, self.memory.reads);
            match rotor {
                Some(rotor) => smallest_with_skips(rotor, skips, costs.credible_least_peak()),
                None => smallest_with_skips(&Rotor::new(costs), skips, costs.credible_least_peak()),
            }
        };
        let last = self.memory.known.last();
        let base = || {
            last.map(|k| {
                let rotor = k.plan.as_ref().filter(|p| !p.keeps).map(|p| &p.rotor);
                smallest(&k.costs, rotor)
            })
        };
        let (base, kept) = match self.fresh_costs() {
            // A measured key replaces what was known of it.
            Some((costs, false)) => (Some(smallest(&costs, None)), None),
            Some((costs, true)) => (base(), Some(smallest(&costs, None))),
            None => {
                let kept = last.and_then(|k| k.kept.as_ref());
                (base(), kept.map(|k| smallest(&k.costs, k.rotor.as_ref())))
            }
        };
        match (base, kept) {
            (Some(b), Some(k)) => Some(b.min(k)),
            (b, k) => b.or(k),
        }
    }

    /// States the costs `Policy::Memory` plans with, instead of measuring them in a profiling
    /// step: one [`StepCost`] per layer of the forwards it will run, whatever their input shape
    /// (they replace every measured cost). Costs measured by a profiling step can be kept (see
    /// [`Checkpointer::costs`]) and stated to a checkpointer of a later run. They are the costs
    /// of steps keeping nothing: under a saving policy, plans of stated costs keep nothing.
    /// Stated costs are trusted as if measured (a step that holds more than stated can take its
    /// step over the budget), except a [`ChainCosts::least_peak`] below what every schedule
    /// holds by the other costs, which is ignored.
    pub fn set_costs(&mut self, costs: ChainCosts) {
        self.memory.known.clear();
        self.memory.known.push(Known {
            costs,
            key: None,
            plan: None,
            cold: false,
            shared_gradient_bytes: 0,
            least_for: None,
            would_keep: 0,
            kept: None,
        });
    }

    /// The layout of a recording forward over `n` layers from an input of `shape` under
    /// `Policy::Memory(budget)`, with the positions it stores written into `plan`: the plan of the
    /// costs known for this input (the most recent first), or else a profiling step, which
    /// measures them holding the least memory a schedule can. The step at `pos` reads the inputs
    /// of the earlier steps `reads[pos]`: the plan is made for the budget less what they hold
    /// (see [`skip_bytes`]).
    pub(crate) fn plan_memory(
        &mut self,
        budget: usize,
        n: usize,
        shape: &[usize],
        reads: &'static [&'static [usize]],
        plan: &mut Vec<usize>,
    ) -> Result<Layout> {
        if self.config.precision != Precision::Full {
            return Err(CheckpointError::InvalidPolicy(
                "Policy::Memory stores at full precision; its plan counts every byte it holds"
                    .into(),
            ));
        }
        self.memory.reads = reads;
        self.take_measured();
        let memory = &mut self.memory;
        let found = memory.known.iter().rposition(|known| {
            !known.cold
                && known.costs.steps.len() == n
                && known
                    .key
                    .as_ref()
                    .is_none_or(|key| key.first().is_none_or(|first| first.input.slice() == shape))
        });
        let Some(found) = found else {
            // Nothing known of these steps: this one measures them, keeping nothing.
            return Ok(memory.profile(plan, false));
        };
        // The most recently used last; moved within the list, which keeps its buffer.
        let last = memory.known.len() - 1;
        memory.known[found..].rotate_left(1);
        let known = &mut memory.known[last];
        let offered = !self.config.saving.names().is_empty();
        // Measured keeping nothing, with the bytes the saving would keep counted: if the least
        // schedule fits them too, this one measures the steps keeping them.
        let kept_fits = known.costs.least_peak + known.would_keep <= budget;
        if offered && known.key.is_some() && known.kept.is_none() && kept_fits {
            return Ok(memory.profile(plan, true));
        }
        memory.checking = known.key.clone();
        memory.keeps = false;
        plan.clear();
        if known.least_for == Some(budget) {
            plan.push(0);
            return Ok(Layout::Least);
        }
        if let Some(p) = known
            .plan
            .as_ref()
            .filter(|p| p.budget == budget && !p.stale.get())
        {
            if p.keeps {
                memory.keeps = true;
                memory.checking = known.kept.as_ref().map(|k| k.key.clone());
            }
            plan.extend(p.top.regions.iter().map(|r| r.start));
            return Ok(Layout::Rotor(p.clone()));
        }
        let (skips, shared) = (
            skip_bytes(&known.costs.steps, reads),
            known.shared_gradient_bytes,
        );
        // The fronts depend on the costs alone: a plan of another budget lends its own.
        let rotor = match &known.plan {
            Some(p) if !p.keeps => p.rotor.clone(),
            _ => Rc::new(Rotor::new(&known.costs)),
        };
        let planned = plan_costs(&rotor, &known.costs, budget, skips, shared);
        // With the steps measured keeping what the saving names too, the faster of the two
        // plans that fit (the one keeping nothing if as fast); the least schedule keeps nothing.
        let kept = known.kept.as_mut().filter(|_| offered).map(|k| {
            let rotor = k.rotor.get_or_insert_with(|| Rc::new(Rotor::new(&k.costs)));
            let planned = plan_costs(rotor, &k.costs, budget, skips, shared);
            (rotor.clone(), planned, k.key.clone())
        });
        let (rotor, planned) = match (planned, kept) {
            (Planned::Top(a), Some((rotor, Planned::Top(b), key))) if b.secs < a.secs => {
                memory.keeps = true;
                memory.checking = Some(key);
                (rotor, Planned::Top(b))
            }
            (Planned::TooSmall(a), Some((_, Planned::TooSmall(b), _))) => {
                (rotor, Planned::TooSmall(a.min(b)))
            }
            (planned, _) => (rotor, planned),
        };
        let top = match planned {
            Planned::Top(top) => top,
            Planned::Least => {
                known.least_for = Some(budget);
                plan.push(0);
                return Ok(Layout::Least);
            }
            Planned::TooSmall(smallest) => {
                return Err(CheckpointError::MemoryBudgetTooSmall {
                    budget,
                    smallest,
                    layers: n,
                })
            }
        };
        let p = Rc::new(MemoryPlan {
            rotor,
            top,
            budget,
            keeps: memory.keeps,
            stale: std::cell::Cell::new(false),
        });
        known.plan = Some(p.clone());
        plan.extend(p.top.regions.iter().map(|r| r.start));
        Ok(Layout::Rotor(p))
    }

    /// Raises to `peak` the recording peak of the step at `pos` in the costs the forward in
    /// progress planned with (a step whose own code holds values longer than its replay does):
    /// the next forward of these steps plans with them anew.
    pub(crate) fn raise_record_peak(&mut self, pos: usize, peak: usize) {
        let Some(key) = self.memory.checking.take() else {
            return;
        };
        let Some(known) = self.memory.known.iter_mut().find(|k| k.keyed_by(&key)) else {
            return;
        };
        // A recorded step keeps nothing: its peak is the same whichever costs planned it.
        let raise = |key: &mut Rc<[StepKey]>, costs: &mut ChainCosts| {
            let mut steps = key.to_vec();
            if let (Some(step), Some(cost)) = (steps.get_mut(pos), costs.steps.get_mut(pos)) {
                step.record_peak = step.record_peak.max(peak);
                cost.record_peak = step.record_peak;
            }
            *key = steps.into();
        };
        if let Some(key) = &mut known.key {
            raise(key, &mut known.costs);
        }
        if let Some(kept) = &mut known.kept {
            raise(&mut kept.key, &mut kept.costs);
            kept.rotor = None;
        }
        known.plan = None;
        known.least_for = None;
    }

    /// Forgets the costs the forward in progress planned with, which one of its steps does not
    /// match: the next forward of these steps measures them again.
    pub(crate) fn forget_checked(&mut self) {
        if let Some(key) = self.memory.checking.take() {
            self.memory.known.retain(|known| !known.keyed_by(&key));
        }
    }

    /// Keeps the costs a finished profiling step measured, with the key they were measured for.
    fn take_measured(&mut self) {
        let mut measuring = self.memory.measuring.borrow_mut();
        if measuring.done {
            let mut measured = std::mem::take(&mut *measuring);
            measured.costs.least_peak = self.memory.watch.peak();
            for (key, cost) in measured.key.iter_mut().zip(&measured.costs.steps) {
                key.forward_peak = cost.forward_peak;
                key.graph_bytes = cost.graph_bytes;
                key.record_peak = cost.record_peak;
            }
            let key: Rc<[StepKey]> = measured.key.into();
            let known = &mut self.memory.known;
            // Stated costs give way to measured ones, and a key measured again replaces itself,
            // warm once measured twice.
            let same_steps = |k: &[StepKey]| {
                k.len() == key.len()
                    && k.iter()
                        .zip(key.iter())
                        .all(|(a, b)| a.input == b.input && a.reads == b.reads)
            };
            if measured.kept {
                // The second profile of a saving policy: the same steps keeping what it names,
                // beside their costs keeping nothing (the last used). Steps that differ from
                // those measure again.
                match known.last_mut() {
                    Some(k) if k.key.as_ref().is_some_and(|k| same_steps(k)) => {
                        k.kept = Some(Kept {
                            costs: measured.costs,
                            key,
                            rotor: None,
                        });
                        k.plan = None;
                        k.least_for = None;
                    }
                    _ => known.retain(|k| k.key.as_ref().is_some_and(|k| !same_steps(k))),
                }
                return;
            }
            let again = known
                .iter()
                .any(|k| k.key.as_ref().is_some_and(|k| same_steps(k)));
            known.retain(|k| k.key.as_ref().is_some_and(|k| !same_steps(k)));
            if known.len() == KNOWN {
                known.remove(0);
            }
            let made_gradients = measured.costs.steps.iter().any(|s| s.gradient_bytes > 0);
            let first = !std::mem::replace(&mut self.memory.profiled, true);
            known.push(Known {
                costs: measured.costs,
                key: Some(key),
                plan: None,
                cold: made_gradients && first && !again,
                shared_gradient_bytes: measured.shared_gradient_bytes,
                least_for: None,
                would_keep: measured.would_keep,
                kept: None,
            });
        }
    }
}
