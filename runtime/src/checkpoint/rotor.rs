//! Checkpoints placed by a memory number: the fastest schedule of a heterogeneous chain of layer
//! steps whose whole training step holds at most a budget of pool bytes.
//!
//! This is the dynamic program of Beaumont, Eyraud-Dubois, Herrmann, Joly and Shilova (2019,
//! "Optimal checkpointing for heterogeneous chains: how to train deep neural networks with limited
//! memory", the `rotor` solver), with memory counted the way this runtime's executor holds it.
//!
//! **The operations.** A step `i` maps `a_i` to `a_{i+1}`. It can run
//! - *values only* (`F_∅`; in the forward pass, on a tape): it holds `forward_peak` beyond its
//!   input at most, then its output;
//! - *recording its graph* (`F_all`): it holds `record_peak` at most, then `graph_bytes` (the graph's
//!   saved tensors and its output) until its backward;
//! - *backward* (`B`, after `F_all`): `backward_peak` at most beyond what is held, then the graph and
//!   the output's gradient are gone and the input's gradient is held.
//!
//! **The forward pass** (`Top(s, m)`, `a_s` held, `m` bytes free) either records step `s`'s graph
//! (`All`) and goes on from `a_{s+1}`, or stores `a_s` and runs steps `s .. s'` on tapes (`Ck(s')`),
//! one checkpointed region whose backward comes after everything from `s'` on is done. After the
//! last step the code that follows the chain (the loss) holds `after_peak` at most and leaves
//! `after_held` (the output's gradient) when the chain's backward starts.
//!
//! **A region's backward** (`Solve(s, t, m)`: steps `s ..= t` to reverse, `a_s` and the gradient of
//! `a_{t+1}` held, `m` bytes free) either replays step `s` recording its graph (`All`), solves
//! `s + 1 ..= t` and runs `B(s)`; or advances values from `a_s` to `a_{s'}` (`Ck(s')`), solves
//! `s' ..= t` holding `a_{s'}`, drops it, and solves `s ..= s' - 1`. With `s == t` it is `All`.
//!
//! Both recursions minimise the sum of the operations' measured times; memory is in units of
//! `unit` bytes, every size rounded up and the budget down, so a schedule found fits the budget in
//! bytes. States are memoised as they are reached, which for chains of repeated layers is a small
//! part of the `n^2 M` table.

use std::cell::RefCell;

/// What one layer step costs: measured by the profiling step of [`Policy::Memory`], or stated.
///
/// Bytes are pool bytes (size classes), as the pool counts them; times are seconds.
///
/// [`Policy::Memory`]: super::Policy::Memory
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepCost {
    /// Seconds of the step's forward.
    pub forward_secs: f64,
    /// Seconds of the step's backward through its recorded graph.
    pub backward_secs: f64,
    /// Bytes of the step's input activation.
    pub input_bytes: usize,
    /// Most bytes held at once beyond the input while the step runs recording nothing, its output
    /// included.
    pub forward_peak: usize,
    /// Bytes held beyond the input after the step ran recording its graph: the graph's saved
    /// tensors and the output.
    pub graph_bytes: usize,
    /// Most bytes held at once beyond the input while the step runs recording its graph.
    pub record_peak: usize,
    /// Most bytes held at once by the step's backward beyond what is held when it starts.
    pub backward_peak: usize,
    /// Bytes the step's backward leaves in the gradients of its parameters (those it makes
    /// rather than adds to), held until the training step ends.
    pub gradient_bytes: usize,
}

/// The costs of a chain of layer steps and of the code after it, until its backward: what
/// [`Policy::Memory`](super::Policy::Memory) plans with.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChainCosts {
    /// The steps, in order.
    pub steps: Vec<StepCost>,
    /// Bytes of the chain's output.
    pub output_bytes: usize,
    /// Most bytes held at once by the code after the chain (the loss and its backward) beyond
    /// what is held when the chain's forward ends.
    pub after_peak: usize,
    /// Bytes held when the chain's backward starts beyond what was held when its forward ended
    /// (the output's gradient, mostly).
    pub after_held: usize,
    /// Most bytes held at once after the chain's backward (by the backward of what came before
    /// the chain, and until the next training forward) beyond what is held when it ends.
    pub before_peak: usize,
}

impl ChainCosts {
    /// The same costs with the chain's output taken out of the last step's peaks and graph: the
    /// output is reserved out of the budget from the start (the caller holds it to the end of the
    /// step), so the step that makes it does not hold it again.
    fn output_reserved(&self) -> ChainCosts {
        let mut costs = self.clone();
        let out = costs.output_bytes;
        if let Some(last) = costs.steps.last_mut() {
            last.forward_peak = last.forward_peak.saturating_sub(out);
            last.graph_bytes = last.graph_bytes.saturating_sub(out);
            last.record_peak = last.record_peak.saturating_sub(out);
        }
        costs
    }
}

/// What a schedule does at a state: record the graph of the step (`All`), or advance values to
/// the step at the given position and store or hold its input (`Ck`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    All,
    Ck(usize),
}

const INF: f64 = f64::INFINITY;

/// A chain's costs in memory units, and the memoised optima of both recursions.
pub(crate) struct Rotor {
    n: usize,
    /// `x[i]`: bytes of `a_i`, `i <= n`.
    x: Vec<u64>,
    /// `d[i]`: bytes of the gradient of `a_i` (`d[n]` is `after_held`).
    d: Vec<u64>,
    pf: Vec<u64>,
    g: Vec<u64>,
    pr: Vec<u64>,
    pb: Vec<u64>,
    f: Vec<f64>,
    b: Vec<f64>,
    /// `k[i]`: the gradient bytes (not units) of steps `i ..`, which stay once their backward has
    /// run. Summed in bytes and rounded up as sums: a long chain would gain a unit a step.
    k: Vec<u64>,
    unit: u64,
    after_peak: u64,
    before_peak: u64,
    /// Units of the chain's output, reserved out of every budget.
    reserve: u64,
    /// The most units any state has free: the largest budget planned for.
    m_max: u64,
    /// `Solve`'s optima by `(s, t)` (`s * n + t`), each a table by free units, made when first
    /// reached; `Top`'s by `(s, fresh)`. `NaN` marks a state not yet solved.
    solve: RefCell<Vec<Vec<Memo>>>,
    top: RefCell<Vec<Vec<Memo>>>,
}

/// A state's least time and its first choice (`0` for `All`, `sp - s` for `Ck(sp)`), compact:
/// the tables hold one per memory unit.
#[derive(Clone, Copy)]
struct Memo(f32, u32);

impl Memo {
    const UNSOLVED: Memo = Memo(f32::NAN, 0);

    fn get(self, s: usize) -> Option<(f64, Choice)> {
        let choice = match self.1 {
            0 => Choice::All,
            d => Choice::Ck(s + d as usize),
        };
        (!self.0.is_nan()).then_some((f64::from(self.0), choice))
    }

    fn of(s: usize, (secs, choice): (f64, Choice)) -> Memo {
        let d = match choice {
            Choice::All => 0,
            Choice::Ck(sp) => (sp - s) as u32,
        };
        Memo(secs as f32, d)
    }
}

/// One checkpointed region of a planned forward: steps `start .. end` on tapes, `a_start` stored,
/// and the free memory its backward solves with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegionPlan {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) free: u64,
}

/// The forward pass of the optimal schedule: which steps record their graph, and the regions.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TopPlan {
    /// `true` for a step that records its graph in the forward pass.
    pub(crate) graph: Vec<bool>,
    pub(crate) regions: Vec<RegionPlan>,
    /// The schedule's time by the measured costs, in seconds.
    pub(crate) secs: f64,
}

impl Rotor {
    /// The chain `costs` in units of `unit` bytes, for budgets up to `m_max` units.
    pub(crate) fn new(costs: &ChainCosts, unit: usize, m_max: u64) -> Self {
        let unit = unit.max(1) as u64;
        let up = |b: usize| (b as u64).div_ceil(unit);
        let costs = &costs.output_reserved();
        let steps = &costs.steps;
        let n = steps.len();
        let mut x: Vec<u64> = steps.iter().map(|c| up(c.input_bytes)).collect();
        // The chain's output is held by the caller until the step ends: it is reserved out of the
        // budget from the start, so no step holds it again.
        x.push(0);
        let mut d = x.clone();
        d[n] = up(costs.after_held);
        Rotor {
            n,
            x,
            d,
            pf: steps.iter().map(|c| up(c.forward_peak)).collect(),
            g: steps.iter().map(|c| up(c.graph_bytes)).collect(),
            pr: steps
                .iter()
                .map(|c| up(c.record_peak.max(c.graph_bytes)))
                .collect(),
            pb: steps.iter().map(|c| up(c.backward_peak)).collect(),
            f: steps.iter().map(|c| c.forward_secs).collect(),
            b: steps.iter().map(|c| c.backward_secs).collect(),
            k: {
                let mut k = vec![0; n + 1];
                for i in (0..n).rev() {
                    k[i] = k[i + 1] + steps[i].gradient_bytes as u64;
                }
                k
            },
            unit,
            after_peak: up(costs.after_peak),
            before_peak: up(costs.before_peak),
            reserve: up(costs.output_bytes),
            m_max,
            solve: RefCell::new(vec![Vec::new(); n * n]),
            top: RefCell::new(vec![Vec::new(); 2 * n]),
        }
    }

    /// The memo of a state, if solved.
    fn memo(table: &RefCell<Vec<Vec<Memo>>>, at: usize, m: u64, s: usize) -> Option<(f64, Choice)> {
        table.borrow()[at]
            .get(m as usize)
            .and_then(|memo| memo.get(s))
    }

    /// Keeps the optimum of a state.
    fn keep(
        &self,
        table: &RefCell<Vec<Vec<Memo>>>,
        at: usize,
        m: u64,
        s: usize,
        best: (f64, Choice),
    ) {
        let mut table = table.borrow_mut();
        let row = &mut table[at];
        if row.is_empty() {
            row.resize(self.m_max as usize + 1, Memo::UNSOLVED);
        }
        row[m as usize] = Memo::of(s, best);
    }

    /// The fastest reversal of steps `s ..= t` with `m` units free beyond `a_s` and the gradient of
    /// `a_{t+1}`, and its first choice; infinite time if nothing fits.
    pub(crate) fn solve(&self, s: usize, t: usize, m: u64) -> (f64, Choice) {
        // Free memory never grows past the budget; a state given more is given the budget.
        let m = m.min(self.m_max);
        let at = s * self.n + t;
        if let Some(hit) = Self::memo(&self.solve, at, m, s) {
            return hit;
        }
        let mut best = (INF, Choice::All);
        // It ends holding the gradient of a_s instead of a_{t+1}'s, and its steps' gradients.
        if self.d[s] + self.kept(s, t + 1) > m + self.d[t + 1] {
            self.keep(&self.solve, at, m, s, best);
            return best;
        }
        if let Some(cost) = self.solve_all(s, t, m) {
            best = (cost, Choice::All);
        }
        for (sp, advance) in self.advances(s, t, m) {
            let Some((right, left)) = self.solve_ck_free(t, sp, m) else {
                continue;
            };
            let cost = advance + self.solve(sp, t, right).0 + self.solve(s, sp - 1, left).0;
            if cost < best.0 {
                best = (cost, Choice::Ck(sp));
            }
        }
        self.keep(&self.solve, at, m, s, best);
        best
    }

    /// `All` at `s` in a region's backward: its time, if it fits.
    fn solve_all(&self, s: usize, t: usize, m: u64) -> Option<f64> {
        let rest = self.all_free(s, m)?;
        let sub = if s < t {
            self.solve(s + 1, t, rest).0
        } else {
            0.0
        };
        // The sub-problem swapped the gradient of a_{t+1} for that of a_{s+1}, and left its
        // steps' gradients.
        let held = (rest + self.d[t + 1]).checked_sub(self.d[s + 1] + self.kept(s + 1, t + 1))?;
        (sub < INF && self.pb[s] <= held).then(|| self.f[s] + sub + self.b[s])
    }

    /// Units free after recording step `s`'s graph with `m` free, if the recording fits.
    pub(crate) fn all_free(&self, s: usize, m: u64) -> Option<u64> {
        (self.pr[s] <= m).then(|| m - self.g[s])
    }

    /// The free units of the two sub-problems of `Ck(sp)` at `(s, t, m)`: the right part (holding
    /// `a_sp`) and the left part (holding the gradient of `a_sp` instead of `a_{t+1}`'s).
    pub(crate) fn solve_ck_free(&self, t: usize, sp: usize, m: u64) -> Option<(u64, u64)> {
        let right = m.checked_sub(self.x[sp])?;
        let left = (m + self.d[t + 1]).checked_sub(self.d[sp] + self.kept(sp, t + 1))?;
        Some((right, left))
    }

    /// The positions `sp` in `s + 1 ..= last` that advancing values from `a_s` reaches with `m`
    /// units free (each step's forward peak on top of its input, held but for the first step's,
    /// whose holder is the caller), each with the time of the steps to it.
    fn advances(&self, s: usize, last: usize, m: u64) -> impl Iterator<Item = (usize, f64)> + '_ {
        let first_fits = self.pf[s] <= m;
        (s + 1..=last)
            .take_while(move |&sp| {
                first_fits && (sp - 1 == s || self.x[sp - 1] + self.pf[sp - 1] <= m)
            })
            .scan(0.0, move |time, sp| {
                *time += self.f[sp - 1];
                Some((sp, *time))
            })
    }

    /// The gradient units steps `from .. to` leave, rounded up.
    fn kept(&self, from: usize, to: usize) -> u64 {
        (self.k[from] - self.k[to]).div_ceil(self.unit)
    }

    /// The fastest forward and backward of steps `s ..` from `a_s` with `m` units free beyond what
    /// is held; `fresh` when `a_s` has no other handle (storing it copies nothing).
    fn top(&self, s: usize, m: u64, fresh: bool) -> (f64, Choice) {
        if s == self.n {
            let fits = self.after_peak <= m && self.d[s] <= m;
            return (if fits { 0.0 } else { INF }, Choice::All);
        }
        let m = m.min(self.m_max);
        let at = 2 * s + usize::from(fresh);
        if let Some(hit) = Self::memo(&self.top, at, m, s) {
            return hit;
        }
        let mut best = (INF, Choice::All);
        if self.d[s] + self.kept(s, self.n) > m {
            // It ends holding the gradient of a_s and the steps' gradients.
            self.keep(&self.top, at, m, s, best);
            return best;
        }
        if let Some(rest) = self.all_free(s, m) {
            let sub = self.top(s + 1, rest, false).0;
            let held = self.d[s + 1] + self.kept(s + 1, self.n);
            if sub < INF && rest.checked_sub(held).is_some_and(|h| self.pb[s] <= h) {
                best = (self.f[s] + sub + self.b[s], Choice::All);
            }
        }
        if let Some(m0) = m.checked_sub(if fresh { 0 } else { self.x[s] }) {
            for (sp, advance) in self.advances(s, self.n, m0) {
                let Some((right, left)) = self.top_ck_free(sp, m0) else {
                    continue;
                };
                let cost = advance + self.top(sp, right, true).0 + self.solve(s, sp - 1, left).0;
                if cost < best.0 {
                    best = (cost, Choice::Ck(sp));
                }
            }
        }
        self.keep(&self.top, at, m, s, best);
        best
    }

    /// The free units of `Ck(sp)` in the forward pass with `m0` free once `a_s` is stored: the rest
    /// of the forward (holding `a_sp`), and the region's backward (holding the gradient of `a_sp`).
    fn top_ck_free(&self, sp: usize, m0: u64) -> Option<(u64, u64)> {
        Some((
            m0.checked_sub(self.x[sp])?,
            m0.checked_sub(self.d[sp] + self.kept(sp, self.n))?,
        ))
    }

    /// The optimal schedule with `budget` units, if one fits.
    pub(crate) fn plan(&self, budget: u64) -> Option<TopPlan> {
        let budget = budget.checked_sub(self.reserve)?;
        // After the chain's backward: the input's gradient, every step's gradients, and what the
        // backward of the code before the chain holds.
        if self.d[0] + self.kept(0, self.n) + self.before_peak > budget {
            return None;
        }
        let (secs, _) = self.top(0, budget, false);
        if secs == INF {
            return None;
        }
        let mut plan = TopPlan {
            graph: vec![false; self.n],
            regions: Vec::new(),
            secs,
        };
        let (mut s, mut m, mut fresh) = (0, budget, false);
        while s < self.n {
            match self.top(s, m, fresh).1 {
                Choice::All => {
                    plan.graph[s] = true;
                    m = self.all_free(s, m).expect("the optimum fits");
                    fresh = false;
                    s += 1;
                }
                Choice::Ck(sp) => {
                    let m0 = m - if fresh { 0 } else { self.x[s] };
                    let (right, left) = self.top_ck_free(sp, m0).expect("the optimum fits");
                    plan.regions.push(RegionPlan {
                        start: s,
                        end: sp,
                        free: left,
                    });
                    (s, m, fresh) = (sp, right, true);
                }
            }
        }
        Some(plan)
    }
}

/// Memory units of a plan: its budget is split into at least `UNITS` and at most `MAX_UNITS`.
const UNITS: usize = 512;
const MAX_UNITS: usize = 4096;

impl Rotor {
    /// The chain `costs` for a budget of `budget` bytes, and the budget in its units. A unit is a
    /// 16th of the smallest activation (every size is rounded up to units, and a schedule holds
    /// many activations at once), but no less than a 4096th of the budget and no more than a 512th:
    /// the time of the dynamic program grows with the units.
    pub(crate) fn for_budget(costs: &ChainCosts, budget: usize) -> (Rotor, u64) {
        let smallest = costs
            .steps
            .iter()
            .map(|c| c.input_bytes)
            .filter(|&b| b > 0)
            .min();
        let fine = smallest.map_or(usize::MAX, |b| b / 16);
        let unit = fine
            .min(budget.div_ceil(UNITS))
            .max(budget.div_ceil(MAX_UNITS))
            .max(1);
        let units = (budget / unit) as u64;
        (Rotor::new(costs, unit, units), units)
    }
}

/// The smallest budget in bytes for which a plan of `costs` fits, as [`Rotor::for_budget`] plans it
/// (to within its unit, about a 512th). Bisection over a coarse grid, then over a fine one near
/// the result; the states of each grid are solved once for all its probes.
pub(crate) fn smallest_budget(costs: &ChainCosts) -> usize {
    let fits_at = |budget: usize| {
        let (rotor, units) = Rotor::for_budget(costs, budget);
        rotor.plan(units).is_some()
    };
    let steps = &costs.steps;
    let mut hi = costs.output_bytes
        + costs.before_peak
        + costs.after_peak
        + costs.after_held
        + steps
            .iter()
            .map(|c| {
                2 * c.input_bytes
                    + c.forward_peak
                    + c.graph_bytes
                    + c.record_peak
                    + c.backward_peak
                    + c.gradient_bytes
            })
            .sum::<usize>();
    while !fits_at(hi) {
        hi = hi.saturating_mul(2);
    }
    // On the grid of `hi`, then on the grid of the coarse result.
    let least_units = |rotor: &Rotor, lo: u64, hi: u64| {
        let (mut lo, mut hi) = (lo, hi);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if rotor.plan(mid).is_some() {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        hi
    };
    let (coarse, units) = Rotor::for_budget(costs, hi);
    let unit = coarse.unit as usize;
    let found = least_units(&coarse, 0, units) as usize * unit;
    let (fine, units) = Rotor::for_budget(costs, found);
    let below = (found.saturating_sub(unit) as u64) / fine.unit;
    let mut least = least_units(&fine, below.min(units), units) as usize * fine.unit as usize;
    // Planned in its own units, the least budget must fit too.
    while !fits_at(least) {
        least += least.div_ceil(MAX_UNITS);
    }
    least
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A small xorshift generator: the chains are random but the same at every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        fn between(&mut self, lo: usize, hi: usize) -> usize {
            lo + self.below((hi - lo + 1) as u64) as usize
        }
    }

    /// A chain of `n` steps with sizes of 1 to 12 bytes and whole-second times, consistent as a
    /// measured chain is: a step's peaks hold at least its output (or its graph).
    fn random_chain(rng: &mut Rng, n: usize) -> ChainCosts {
        let sizes: Vec<usize> = (0..=n).map(|_| rng.between(1, 12)).collect();
        let steps = (0..n)
            .map(|i| {
                let graph = sizes[i + 1] + rng.between(0, 14);
                StepCost {
                    forward_secs: rng.between(1, 9) as f64,
                    backward_secs: rng.between(1, 9) as f64,
                    input_bytes: sizes[i],
                    forward_peak: sizes[i + 1] + rng.between(0, 6),
                    graph_bytes: graph,
                    record_peak: graph + rng.between(0, 6),
                    backward_peak: sizes[i] + rng.between(0, 10),
                    gradient_bytes: rng.between(0, 4),
                }
            })
            .collect();
        ChainCosts {
            steps,
            output_bytes: sizes[n],
            after_peak: rng.between(0, 10),
            after_held: sizes[n] + rng.between(0, 3),
            before_peak: rng.between(0, 20),
        }
    }

    /// Every schedule of the chain, simulated on what each operation holds in bytes (not on the
    /// dynamic program's free memory): the (time, peak) pairs that no other pair beats in both,
    /// peaks above what is held on entry. The chain's output is held from the start, as the
    /// runtime counts it.
    struct Exhaustive<'c> {
        c: &'c ChainCosts,
        d: Vec<i64>,
        /// `k[i]`: gradient bytes steps `i ..` leave.
        k: Vec<i64>,
        /// The fronts found so far (a front does not depend on the memory left).
        fronts: RefCell<HashMap<(usize, usize, bool), Front>>,
    }

    type Front = Vec<(u64, i64)>;

    fn prune(mut all: Front) -> Front {
        all.sort_unstable();
        let mut front: Front = Vec::new();
        for (cost, peak) in all {
            if front.last().is_none_or(|&(_, p)| peak < p) {
                front.push((cost, peak));
            }
        }
        front
    }

    impl Exhaustive<'_> {
        fn x(&self, i: usize) -> i64 {
            if i == self.c.steps.len() {
                0
            } else {
                self.c.steps[i].input_bytes as i64
            }
        }

        fn step(&self, i: usize) -> (i64, i64, i64, i64, u64) {
            let c = &self.c.steps[i];
            (
                c.forward_peak as i64,
                c.graph_bytes as i64,
                c.record_peak.max(c.graph_bytes) as i64,
                c.backward_peak as i64,
                (c.forward_secs + c.backward_secs) as u64,
            )
        }

        /// Peak and time of advancing values from `a_s` to `a_sp`.
        fn advance(&self, s: usize, sp: usize) -> (i64, u64) {
            let peak = (s..sp)
                .map(|j| self.step(j).0 + if j > s { self.x(j) } else { 0 })
                .max()
                .unwrap_or(0);
            let secs = (s..sp).map(|j| self.c.steps[j].forward_secs as u64).sum();
            (peak, secs)
        }

        fn solve(&self, s: usize, t: usize) -> Front {
            self.memo((s, t, false), || self.solve_all_ways(s, t))
        }

        fn top(&self, s: usize, fresh: bool) -> Front {
            self.memo((s, usize::MAX, fresh), || self.top_all_ways(s, fresh))
        }

        fn memo(&self, key: (usize, usize, bool), f: impl FnOnce() -> Front) -> Front {
            if let Some(front) = self.fronts.borrow().get(&key) {
                return front.clone();
            }
            let front = f();
            self.fronts.borrow_mut().insert(key, front.clone());
            front
        }

        fn solve_all_ways(&self, s: usize, t: usize) -> Front {
            let end = self.d[s] - self.d[t + 1] + self.k[s] - self.k[t + 1];
            let (_, g, pr, pb, fb) = self.step(s);
            let mut all = Vec::new();
            let (subs, e1) = if s < t {
                let e1 = self.d[s + 1] - self.d[t + 1] + self.k[s + 1] - self.k[t + 1];
                (self.solve(s + 1, t), e1)
            } else {
                (vec![(0, 0)], 0)
            };
            for (c1, p1) in subs {
                let peak = pr.max(g + p1).max(g + e1 + pb).max(end);
                all.push((fb + c1, peak));
            }
            for sp in s + 1..=t {
                let (adv_peak, adv) = self.advance(s, sp);
                let moved = self.d[sp] - self.d[t + 1] + self.k[sp] - self.k[t + 1];
                for &(cr, pr_) in &self.solve(sp, t) {
                    for &(cl, pl) in &self.solve(s, sp - 1) {
                        let peak = adv_peak.max(self.x(sp) + pr_).max(moved + pl).max(end);
                        all.push((adv + cr + cl, peak));
                    }
                }
            }
            prune(all)
        }

        fn top_all_ways(&self, s: usize, fresh: bool) -> Front {
            let n = self.c.steps.len();
            if s == n {
                return vec![(0, (self.c.after_peak as i64).max(self.d[n]))];
            }
            let (_, g, pr, pb, fb) = self.step(s);
            let mut all = Vec::new();
            let end = self.d[s] + self.k[s];
            for (c1, p1) in self.top(s + 1, false) {
                let e1 = self.d[s + 1] + self.k[s + 1];
                let peak = pr.max(g + p1).max(g + e1 + pb).max(end);
                all.push((fb + c1, peak));
            }
            let stored = if fresh { 0 } else { self.x(s) };
            for sp in s + 1..=n {
                let (adv_peak, adv) = self.advance(s, sp);
                for &(cr, pr_) in &self.top(sp, true) {
                    for &(cl, pl) in &self.solve(s, sp - 1) {
                        let peak = (stored + adv_peak)
                            .max(stored + self.x(sp) + pr_)
                            .max(stored + self.d[sp] + self.k[sp] + pl)
                            .max(end);
                        all.push((adv + cr + cl, peak));
                    }
                }
            }
            prune(all)
        }

        /// The least time of a schedule within `budget` bytes, if any fits.
        fn best(&self, budget: i64) -> Option<u64> {
            let reserve = self.c.output_bytes as i64;
            let after = self.d[0] + self.k[0] + self.c.before_peak as i64;
            self.top(0, false)
                .into_iter()
                .filter(|&(_, peak)| reserve + peak.max(after) <= budget)
                .map(|(cost, _)| cost)
                .min()
        }
    }

    fn exhaustive(c: &ChainCosts) -> Exhaustive<'_> {
        let n = c.steps.len();
        let mut d: Vec<i64> = c.steps.iter().map(|s| s.input_bytes as i64).collect();
        d.push(c.after_held as i64);
        let mut k = vec![0; n + 1];
        for i in (0..n).rev() {
            k[i] = k[i + 1] + c.steps[i].gradient_bytes as i64;
        }
        Exhaustive {
            c,
            d,
            k,
            fronts: RefCell::default(),
        }
    }

    /// The peak in bytes of the plan's schedule, simulated as [`Exhaustive`] does, with the time.
    fn follow(r: &Rotor, e: &Exhaustive<'_>, budget: u64) -> (u64, i64) {
        fn solve(r: &Rotor, e: &Exhaustive<'_>, s: usize, t: usize, m: u64) -> (u64, i64) {
            let end = e.d[s] - e.d[t + 1] + e.k[s] - e.k[t + 1];
            let (_, g, pr, pb, fb) = e.step(s);
            match r.solve(s, t, m).1 {
                Choice::All => {
                    let rest = r.all_free(s, m).unwrap();
                    let ((c1, p1), e1) = if s < t {
                        let e1 = e.d[s + 1] - e.d[t + 1] + e.k[s + 1] - e.k[t + 1];
                        (solve(r, e, s + 1, t, rest), e1)
                    } else {
                        ((0, 0), 0)
                    };
                    (fb + c1, pr.max(g + p1).max(g + e1 + pb).max(end))
                }
                Choice::Ck(sp) => {
                    let (right, left) = r.solve_ck_free(t, sp, m).unwrap();
                    let (adv_peak, adv) = e.advance(s, sp);
                    let (cr, pr_) = solve(r, e, sp, t, right);
                    let (cl, pl) = solve(r, e, s, sp - 1, left);
                    let moved = e.d[sp] - e.d[t + 1] + e.k[sp] - e.k[t + 1];
                    (
                        adv + cr + cl,
                        adv_peak.max(e.x(sp) + pr_).max(moved + pl).max(end),
                    )
                }
            }
        }
        let plan = r.plan(budget).expect("a plan");
        // The forward as the plan gives it: recorded steps and regions, in order, and the regions'
        // backward by the tables.
        let n = e.c.steps.len();
        let (mut held, mut peak, mut secs) = (e.c.output_bytes as i64, 0i64, 0u64);
        let mut pending: Vec<(usize, i64)> = Vec::new(); // what a region or a graph holds until its backward
        let mut s = 0;
        let mut fresh = false;
        let mut regions = plan.regions.iter().peekable();
        while s < n {
            if plan.graph[s] {
                let (_, g, pr, _, fb) = e.step(s);
                peak = peak.max(held + pr);
                held += g;
                pending.push((s, g));
                secs += fb;
                fresh = false;
                s += 1;
            } else {
                let region = regions.next().expect("a region starts here");
                assert_eq!(region.start, s);
                let stored = if fresh { 0 } else { e.x(s) };
                let (adv_peak, adv) = e.advance(s, region.end);
                peak = peak.max(held + stored + adv_peak);
                held += stored;
                pending.push((usize::MAX - s, stored));
                secs += adv;
                held += e.x(region.end);
                fresh = true;
                s = region.end;
            }
        }
        peak = peak.max(held + e.c.after_peak as i64);
        held += e.d[n];
        // The backward, last first: a recorded step's B, or a region's schedule.
        let mut regions = plan.regions.iter().rev();
        while let Some((key, bytes)) = pending.pop() {
            if key < n {
                let (_, _, _, pb, _) = e.step(key);
                peak = peak.max(held + pb);
                held += e.d[key] - e.d[key + 1] - bytes + e.k[key] - e.k[key + 1];
            } else {
                let region = regions.next().unwrap();
                // The region's end activation went with what came after it.
                held -= if region.end < n { e.x(region.end) } else { 0 };
                let (c, p) = solve(r, e, region.start, region.end - 1, region.free);
                peak = peak.max(held + p);
                secs += c;
                held += e.d[region.start] - e.d[region.end] - bytes;
                held += e.k[region.start] - e.k[region.end];
            }
        }
        let after = e.d[0] + e.k[0] + e.c.before_peak as i64;
        (secs, peak.max(e.c.output_bytes as i64 + after))
    }

    #[test]
    fn the_plan_is_the_least_time_of_every_schedule_within_the_budget() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut compared = 0;
        for round in 0..60 {
            let n = if round < 6 { 10 } else { rng.between(1, 8) };
            let chain = random_chain(&mut rng, n);
            // Simulated as the runtime holds it: the output reserved from the start.
            let reserved = chain.output_reserved();
            let e = exhaustive(&reserved);
            let after = e.d[0] + e.k[0] + chain.before_peak as i64;
            let least = e
                .top(0, false)
                .iter()
                .map(|&(_, p)| p.max(after))
                .min()
                .unwrap()
                + chain.output_bytes as i64;
            for budget in least - 2..least + 40 {
                let rotor = Rotor::new(&chain, 1, budget as u64);
                let plan = rotor.plan(budget as u64);
                let best = e.best(budget);
                assert_eq!(
                    plan.as_ref().map(|p| p.secs as u64),
                    best,
                    "n={n} budget={budget}: {chain:?}"
                );
                if plan.is_some() {
                    let (secs, peak) = follow(&rotor, &e, budget as u64);
                    assert_eq!(Some(secs), best, "the plan's schedule takes its time");
                    assert!(peak <= budget, "peak {peak} > budget {budget}");
                    compared += 1;
                }
            }
        }
        assert!(compared > 1000, "{compared}");
    }
}
