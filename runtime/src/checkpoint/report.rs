//! What a training forward under `Policy::Memory` did with its steps, and what it cost: the plan
//! report, as JAX's `print_saved_residuals` lists what a checkpointed function saves.

use std::fmt;

use super::memory::Layout;
use super::{Checkpointer, Policy, Saving};
use crate::element::Element;

/// How a training forward under [`Policy::Memory`] ran its steps and what the step measured
/// ([`Checkpointer::plan_report`]). Its `Display` is a table of the steps, runs of the same kind
/// grouped.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanReport {
    /// Where the schedule came from.
    pub kind: PlanKind,
    /// The budget, in pool bytes.
    pub budget: usize,
    /// How each step ran in the forward, by position.
    pub steps: Vec<StepRun>,
    /// The schedule's time by the costs it was planned with, in seconds (`None` for a profiling
    /// step, which has no plan).
    pub predicted_secs: Option<f64>,
    /// The schedule's pool peak in bytes above the forward's start by the costs it was planned
    /// with: the planner's count, plus what it reserved for skip reads and for gradients of values
    /// from before the chain (an upper bound, so the measured peak is at most this); for
    /// [`PlanKind::Least`], the least-memory schedule's peak as measured, or as stated in
    /// [`ChainCosts::least_peak`](super::ChainCosts::least_peak). `None` for a profiling or a
    /// replanned step. Stated costs are trusted: a step that holds more than stated holds more
    /// than predicted.
    pub predicted_peak: Option<usize>,
    /// What the taped steps kept for their replays: the outputs of the ops it names.
    pub saving: Saving,
    /// The step's seconds and its pool peak in bytes above what was in use when the forward
    /// started, both from the forward's start to the end of the backward it was part of, on the
    /// thread that ran it; `None` until that backward has ended.
    pub measured: Option<(f64, usize)>,
}

/// Where the schedule of a [`PlanReport`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanKind {
    /// No costs were known for these steps (the first forward, or a changed input or layer):
    /// every step ran on a tape with only the input stored, and the backward held the least
    /// memory a schedule can while it measured each step.
    Profiled,
    /// The optimal schedule for the costs measured for these steps.
    Planned,
    /// Every step on a tape, only the input stored, reversed with the least memory a schedule
    /// holds: the schedules of the dynamic program that fit the budget all record a step after a
    /// region that reads a value from before the chain, which then holds two gradients of that
    /// value at once, and none fits with them reserved.
    Least,
    /// A step differed from those the plan was made for (its input's shape, or what its ops
    /// read): from this position on every step ran on a tape, and every region reversed with the
    /// least memory; the next forward measures the steps again.
    Replanned {
        /// The first step that differed.
        at: usize,
    },
}

/// How one step of a [`PlanReport`] ran in the forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepRun {
    /// Recorded its graph, kept until its backward.
    Recorded,
    /// Ran on a tape, its values released; replayed by its region's backward. `stored` if its
    /// input was stored (the region's start).
    Taped {
        /// Whether the step's input was stored.
        stored: bool,
    },
}

impl<T: Element> Checkpointer<T> {
    /// How the last training forward under [`Policy::Memory`] ran its steps, what its plan
    /// predicted and what the step measured; `None` if the last forward was of another policy or
    /// recorded no graph.
    pub fn plan_report(&self) -> Option<PlanReport> {
        let Policy::Memory(budget) = self.config.policy else {
            return None;
        };
        let (kind, predicted_secs, predicted_peak) =
            match (&self.memory.layout, self.memory.stale_at) {
                (None, _) => return None,
                (Some(_), Some(at)) => (PlanKind::Replanned { at }, None, None),
                (Some(Layout::Rotor(plan)), None) => {
                    (PlanKind::Planned, Some(plan.top.secs), Some(plan.top.peak))
                }
                (Some(Layout::Least), None) => (
                    PlanKind::Least,
                    None,
                    Some(self.memory.least_peak()).filter(|&p| p > 0),
                ),
                (Some(_), None) => (PlanKind::Profiled, None, None),
            };
        let layout = self.memory.layout.as_ref()?;
        let steps = (0..self.layers.len())
            .map(|pos| {
                let taped = layout.taped_when(pos, self.memory.stale_at);
                if taped {
                    StepRun::Taped {
                        stored: self.plan.binary_search(&pos).is_ok(),
                    }
                } else {
                    StepRun::Recorded
                }
            })
            .collect();
        Some(PlanReport {
            kind,
            budget,
            steps,
            predicted_secs,
            predicted_peak,
            saving: match self.memory.keeps {
                true => self.config.saving,
                false => Saving::Nothing,
            },
            measured: self.memory.watch.measured.get(),
        })
    }
}

impl fmt::Display for PlanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            PlanKind::Profiled => "profiled (no costs known: least memory, every step measured)",
            PlanKind::Planned => "planned",
            PlanKind::Least => "least memory (no planned schedule fits)",
            PlanKind::Replanned { .. } => "replanned (a step differed from the plan's)",
        };
        writeln!(f, "Policy::Memory({} B), {kind}", self.budget)?;
        if let PlanKind::Replanned { at } = self.kind {
            writeln!(f, "  step {at} differed: least memory from there on")?;
        }
        let ms = |secs: Option<f64>| secs.map_or("-".to_owned(), |s| format!("{:.3} ms", s * 1e3));
        let bytes = |b: Option<usize>| b.map_or("-".to_owned(), |b| format!("{b} B"));
        writeln!(
            f,
            "  predicted  {}, peak {}",
            ms(self.predicted_secs),
            bytes(self.predicted_peak)
        )?;
        match self.measured {
            Some((secs, peak)) => writeln!(
                f,
                "  measured   {}, peak {peak} B ({:.1}% of the budget)",
                ms(Some(secs)),
                peak as f64 * 100.0 / self.budget.max(1) as f64
            )?,
            None => writeln!(f, "  measured   - (its backward has not ended)")?,
        }
        writeln!(f, "  steps      run")?;
        let mut start = 0;
        while start < self.steps.len() {
            let run = self.steps[start];
            // A run of steps of one kind: recorded ones, or one region (a stored start, then
            // taped steps).
            let end = (start + 1..self.steps.len())
                .find(|&p| match (run, self.steps[p]) {
                    (StepRun::Recorded, StepRun::Recorded) => false,
                    (StepRun::Taped { .. }, StepRun::Taped { stored }) => stored,
                    _ => true,
                })
                .unwrap_or(self.steps.len());
            let what = match run {
                StepRun::Recorded => "recorded (graph kept)".to_owned(),
                StepRun::Taped { .. } if self.saving.names().is_empty() => {
                    "on tapes, input stored, replayed in the backward".to_owned()
                }
                StepRun::Taped { .. } => format!(
                    "on tapes, input stored, outputs of {} kept, the rest replayed",
                    self.saving.names().join(", ")
                ),
            };
            let steps = if end - start == 1 {
                format!("{start}")
            } else {
                format!("{start}..{end}")
            };
            writeln!(f, "  {steps:<10} {what}")?;
            start = end;
        }
        Ok(())
    }
}
