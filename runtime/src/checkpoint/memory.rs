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
    /// The measured peak of the least-memory schedule of the costs planned with last (0 if not
    /// measured).
    pub(crate) fn least_peak(&self) -> usize {
        self.known.last().map_or(0, |k| k.costs.least_peak)
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
    pub fn costs(&self) -> Option<ChainCosts> {
        let measuring = self.memory.measuring.borrow();
        if measuring.done {
            return Some(ChainCosts {
                least_peak: self.memory.watch.peak(),
                ..measuring.costs.clone()
            });
        }
        self.memory.known.last().map(|known| known.costs.clone())
    }

    /// The smallest budget in bytes `Policy::Memory` finds a schedule for with
    /// [`Checkpointer::costs`], exactly (see [`Policy::Memory`] for the schedules it plans
    /// among); `None` before costs are known.
    ///
    /// [`Policy::Memory`]: super::Policy::Memory
    pub fn smallest_budget(&self) -> Option<usize> {
        // The last plan's fronts are those of the costs, unless a profiling step measured anew.
        // The skip reads are those of the last forward planned.
        let smallest = |rotor: &Rotor, costs: &ChainCosts| {
            let skips = skip_bytes(&costs.steps, self.memory.reads);
            smallest_with_skips(rotor, skips, costs.least_peak)
        };
        let last = self.memory.known.last();
        if let Some((plan, known)) = last.and_then(|k| Some((k.plan.as_ref()?, k))) {
            if !self.memory.measuring.borrow().done {
                return Some(smallest(&plan.rotor, &known.costs));
            }
        }
        self.costs()
            .map(|costs| smallest(&Rotor::new(&costs), &costs))
    }

    /// States the costs `Policy::Memory` plans with, instead of measuring them in a profiling
    /// step: one [`StepCost`] per layer of the forwards it will run, whatever their input shape
    /// (they replace every measured cost). Costs measured by a profiling step can be kept (see
    /// [`Checkpointer::costs`]) and stated to a checkpointer of a later run.
    pub fn set_costs(&mut self, costs: ChainCosts) {
        self.memory.known.clear();
        self.memory.known.push(Known {
            costs,
            key: None,
            plan: None,
            cold: false,
            shared_gradient_bytes: 0,
            least_for: None,
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
            // Nothing known of these steps: this one measures them.
            *memory.measuring.borrow_mut() = Measuring::default();
            memory.checking = None;
            plan.clear();
            plan.push(0);
            return Ok(Layout::Profile);
        };
        // The most recently used last; moved within the list, which keeps its buffer.
        let last = memory.known.len() - 1;
        memory.known[found..].rotate_left(1);
        let known = &mut memory.known[last];
        memory.checking = known.key.clone();
        plan.clear();
        if known.least_for == Some(budget) {
            plan.push(0);
            return Ok(Layout::Least);
        }
        let current = known
            .plan
            .as_ref()
            .filter(|p| p.budget == budget && !p.stale.get());
        let memory_plan = match current {
            Some(p) => p.clone(),
            None => {
                let skips = skip_bytes(&known.costs.steps, reads);
                // The fronts depend on the costs alone: a plan of another budget lends its own.
                let rotor = match &known.plan {
                    Some(p) => p.rotor.clone(),
                    None => Rc::new(Rotor::new(&known.costs)),
                };
                let Some(mut top) = plan_with_skips(&rotor, budget, skips) else {
                    // The schedule of the profiling step, which held the least and was measured,
                    // fits where the planner's count with skip reads' reserve does not.
                    if (1..=budget).contains(&known.costs.least_peak) {
                        known.least_for = Some(budget);
                        plan.push(0);
                        return Ok(Layout::Least);
                    }
                    return Err(CheckpointError::MemoryBudgetTooSmall {
                        budget,
                        smallest: smallest_with_skips(&rotor, skips, known.costs.least_peak),
                        layers: n,
                    });
                };
                // A step recording its graph after a region, reading a value from before the
                // chain, makes its gradient in the outer backward before the region makes its
                // own: two at once, where the profiling step's one region held one. Such a
                // schedule is planned with them reserved.
                let first_region = top.regions.first().map_or(usize::MAX, |r| r.start);
                let mixed = top.graph.iter().skip(first_region).any(|&g| g);
                if mixed && known.shared_gradient_bytes > 0 {
                    let reserve = known.shared_gradient_bytes + skips;
                    let Some(reserved_top) = plan_reserving(&rotor, budget, reserve) else {
                        // Every step on a tape in one region holds them once, as the profiling
                        // step did, which the budget fits (the plan did without them).
                        known.least_for = Some(budget);
                        plan.push(0);
                        return Ok(Layout::Least);
                    };
                    top = reserved_top;
                }
                let p = Rc::new(MemoryPlan {
                    rotor,
                    top,
                    budget,
                    stale: std::cell::Cell::new(false),
                });
                known.plan = Some(p.clone());
                p
            }
        };
        plan.extend(memory_plan.top.regions.iter().map(|r| r.start));
        Ok(Layout::Rotor(memory_plan))
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
        let mut steps = key.to_vec();
        if let (Some(step), Some(cost)) = (steps.get_mut(pos), known.costs.steps.get_mut(pos)) {
            step.record_peak = step.record_peak.max(peak);
            cost.record_peak = step.record_peak;
        }
        known.key = Some(steps.into());
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
            });
        }
    }
}
