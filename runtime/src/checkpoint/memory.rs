//! `Policy::Memory`: the costs it plans with (measured by a profiling step or stated), and the plan
//! of a recording forward.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use super::rotor::{self, ChainCosts, Rotor, StepCost, TopPlan};
use super::{CheckpointError, Checkpointer, Precision, Result};
use crate::dims::Dims;
use crate::element::Element;
use crate::pool::Pool;

/// What the checkpointer keeps for `Policy::Memory`.
#[derive(Default)]
pub(crate) struct Memory {
    /// The costs plans use, and the layer count and input shape they were measured for (`None`
    /// for stated costs, which serve any input of their layer count).
    costs: Option<(ChainCosts, Option<Dims>)>,
    /// The measurements of the profiling step in progress, shared with its region's backward.
    pub(crate) measuring: Rc<RefCell<Measuring>>,
    /// The plan of the last budget, for its costs.
    plan: Option<Rc<MemoryPlan>>,
    /// Whether a training forward ran: the first one allocates the gradients and the optimizer's
    /// state, so the step after it is the one measured.
    warmed: bool,
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
    /// The input shape of the profiled forward.
    input: Option<Dims>,
    /// Bytes in use when the forward ended.
    pub(crate) forward_end: usize,
    /// The start of the step being measured: bytes in use and the clock.
    step_start: Option<(usize, Instant)>,
    /// Whether the backward has measured every step.
    pub(crate) done: bool,
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
}

/// How a recording forward runs its steps.
pub(crate) enum Layout {
    /// The steps before this position run on tapes in one region; the rest record their graphs.
    /// Under `Every`, `Sqrt` and `Explicit` the last segment records its graph, since its backward
    /// comes first (replaying it would cost a forward of it and save nothing: one segment's graph
    /// is alive at a time either way); under `Budget` the last step does, as revolve's does.
    Prefix(usize),
    /// Every step on a tape in one region, only the input stored, each step measured: the
    /// profiling step of `Policy::Memory`.
    Profile,
    /// `Policy::Memory`'s plan: regions and recorded steps as it places them.
    Rotor(Rc<MemoryPlan>),
}

impl Layout {
    /// Whether the step at `pos` runs on a tape.
    pub(crate) fn taped(&self, pos: usize) -> bool {
        match self {
            Layout::Prefix(taped) => pos < *taped,
            Layout::Profile => true,
            Layout::Rotor(plan) => !plan.top.graph[pos],
        }
    }

    /// Whether a new region starts at `pos` (a taped step).
    pub(crate) fn starts_region(&self, pos: usize) -> bool {
        match self {
            Layout::Prefix(_) | Layout::Profile => pos == 0,
            Layout::Rotor(plan) => plan.top.regions.iter().any(|r| r.start == pos),
        }
    }
}

impl Measuring {
    /// Starts measuring the forward of the step whose input holds `input_bytes` of data.
    pub(crate) fn enter(&mut self, pool: &Pool, input_bytes: usize) {
        self.costs.steps.push(StepCost {
            input_bytes: crate::pool::class_bytes_of(input_bytes),
            ..StepCost::default()
        });
        self.step_start = Some((pool.probe_start(), Instant::now()));
    }

    /// Ends measuring the forward of the last step entered.
    pub(crate) fn leave(&mut self, pool: &Pool) {
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
    /// the costs are read.
    pub(crate) fn backward_ended(&mut self, pool: &Pool) {
        self.done = true;
        self.backward_end = Some((pool.clone(), pool.probe_start()));
    }

    /// The measured costs, with what followed the chain's backward until now.
    fn measured(&self) -> ChainCosts {
        let mut costs = self.costs.clone();
        if let Some((pool, end)) = &self.backward_end {
            costs.before_peak = pool.probe().1.saturating_sub(*end);
        }
        costs
    }

    /// The chain's backward starts: what the code after the chain held is known.
    pub(crate) fn backward_started(&mut self, pool: &Pool) {
        let (now, peak) = pool.probe();
        self.costs.after_peak = peak.saturating_sub(self.forward_end);
        self.costs.after_held = now.saturating_sub(self.forward_end);
    }
}

impl<T: Element> Checkpointer<T> {
    /// The costs `Policy::Memory` plans with: measured by the last profiling step (once its
    /// backward has run), or stated; `None` before either.
    pub fn costs(&self) -> Option<ChainCosts> {
        let measuring = self.memory.measuring.borrow();
        if measuring.done {
            return Some(measuring.measured());
        }
        self.memory.costs.as_ref().map(|(costs, _)| costs.clone())
    }

    /// The smallest budget in bytes `Policy::Memory` finds a schedule for with
    /// [`Checkpointer::costs`], exactly (see [`Policy::Memory`] for the schedules it plans
    /// among); `None` before costs are known.
    ///
    /// [`Policy::Memory`]: super::Policy::Memory
    pub fn smallest_budget(&self) -> Option<usize> {
        // The last plan's fronts are those of the costs, unless a profiling step measured anew.
        if let Some(plan) = self.memory.plan.as_ref() {
            if !self.memory.measuring.borrow().done {
                return Some(plan.rotor.smallest_budget());
            }
        }
        self.costs().map(|costs| rotor::smallest_budget(&costs))
    }

    /// States the costs `Policy::Memory` plans with, instead of measuring them in a profiling
    /// step: one [`StepCost`] per layer of the forwards it will run, whatever their input shape.
    /// Costs measured by a profiling step can be kept (see [`Checkpointer::costs`]) and stated to
    /// a checkpointer of a later run.
    pub fn set_costs(&mut self, costs: ChainCosts) {
        self.memory.costs = Some((costs, None));
        self.memory.plan = None;
    }

    /// The layout of a recording forward over `n` layers from an input of `shape` under
    /// `Policy::Memory(budget)`, with the positions it stores written into `plan`; `None` for the
    /// first training forward, which runs as `Policy::Sqrt` does (see [`Policy::Memory`]).
    pub(crate) fn plan_memory(
        &mut self,
        budget: usize,
        n: usize,
        shape: &[usize],
        plan: &mut Vec<usize>,
    ) -> Result<Option<Layout>> {
        if self.config.precision != Precision::Full {
            return Err(CheckpointError::InvalidPolicy(
                "Policy::Memory stores at full precision; its plan counts every byte it holds"
                    .into(),
            ));
        }
        self.take_measured();
        let fits = |costs: &ChainCosts, input: &Option<Dims>| {
            costs.steps.len() == n && input.as_ref().is_none_or(|d| d.slice() == shape)
        };
        let Some((costs, _)) = self.memory.costs.as_ref().filter(|(c, i)| fits(c, i)) else {
            if !std::mem::replace(&mut self.memory.warmed, true) {
                return Ok(None);
            }
            // Nothing known of these layers: this step measures them.
            let mut measuring = self.memory.measuring.borrow_mut();
            *measuring = Measuring {
                input: Some(Dims::from_slice(shape)),
                ..Measuring::default()
            };
            plan.clear();
            plan.push(0);
            return Ok(Some(Layout::Profile));
        };
        let current = self.memory.plan.as_ref().filter(|p| p.budget == budget);
        let memory_plan = match current {
            Some(p) => p.clone(),
            None => {
                // The fronts depend on the costs alone: a plan of another budget lends its own.
                let rotor = match &self.memory.plan {
                    Some(p) => p.rotor.clone(),
                    None => Rc::new(Rotor::new(costs)),
                };
                let top = rotor.plan(budget as u64).ok_or_else(|| {
                    CheckpointError::MemoryBudgetTooSmall {
                        budget,
                        smallest: rotor.smallest_budget(),
                        layers: n,
                    }
                })?;
                let p = Rc::new(MemoryPlan { rotor, top, budget });
                self.memory.plan = Some(p.clone());
                p
            }
        };
        plan.clear();
        plan.extend(memory_plan.top.regions.iter().map(|r| r.start));
        Ok(Some(Layout::Rotor(memory_plan)))
    }

    /// Keeps the costs a finished profiling step measured.
    fn take_measured(&mut self) {
        let mut measuring = self.memory.measuring.borrow_mut();
        if measuring.done {
            let measured = std::mem::take(&mut *measuring);
            self.memory.costs = Some((measured.measured(), measured.input));
            self.memory.plan = None;
        }
    }
}
