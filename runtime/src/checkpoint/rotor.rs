//! Checkpoints placed by a memory number: the fastest schedule of a heterogeneous chain of layer
//! steps whose whole training step holds at most a budget of pool bytes.
//!
//! This is the dynamic program of Beaumont, Eyraud-Dubois, Herrmann, Joly and Shilova (2019,
//! "Optimal checkpointing for heterogeneous chains: how to train deep neural networks with limited
//! memory", the `rotor` solver), with memory counted the way this runtime's executor holds it, in
//! bytes.
//!
//! **The operations.** A step `i` maps `a_i` to `a_{i+1}`. It can run
//! - *values only* (`F_∅`; in the forward pass, on a tape): it holds `forward_peak` beyond its
//!   input at most, then its output;
//! - *recording its graph* (`F_all`): it holds `record_peak` at most, then `graph_bytes` (the graph's
//!   saved tensors and its output) until its backward;
//! - *backward* (`B`, after `F_all`): `backward_peak` at most beyond what is held, then the graph and
//!   the output's gradient are gone and the input's gradient is held.
//!
//! **The forward pass** (`Top(s)`, `a_s` held) either records step `s`'s graph (`All`) and goes on
//! from `a_{s+1}`, or stores `a_s` and runs steps `s .. s'` on tapes (`Ck(s')`), one checkpointed
//! region whose backward comes after everything from `s'` on is done. After the last step the code
//! that follows the chain (the loss) holds `after_peak` at most and leaves `after_held` when the
//! chain's backward starts: the output's gradient, which the last step's backward frees, and what
//! it keeps to the end of the step (the loss itself).
//!
//! **A region's backward** (`Solve(s, t)`: steps `s ..= t` to reverse, `a_s` and the gradient of
//! `a_{t+1}` held) either replays step `s` recording its graph (`All`), solves `s + 1 ..= t` and
//! runs `B(s)`; or advances values from `a_s` to `a_{s'}` (`Ck(s')`), solves `s' ..= t` holding
//! `a_{s'}`, drops it, and solves `s ..= s' - 1`. With `s == t` it is `All`.
//!
//! **Exact in bytes.** Each state keeps its Pareto front (see [`front`](super::front)): for each
//! amount of free memory, the least time of its schedules that fit, as the points where it drops.
//! A choice needs the most of what it holds and of what its sub-states need on top of what it
//! holds while they run, so fronts compose by max and plus, with no budget and no rounding: a plan
//! at a budget is the fastest schedule that holds at most that many bytes, and the smallest budget
//! is the least need of the whole chain's front. The times are the sums of the measured times
//! (points faster by less than a part in 10^12 are not kept).
//!
//! **The class of schedules.** A chain of at most [`MAX_STEPS`] steps is planned step by step:
//! the plan is the fastest of all the schedules above. A longer chain is planned on
//! [`MAX_STEPS`] *super-steps*, runs of consecutive steps of equal length (to one step), each
//! recorded, replayed or advanced as a whole: its costs are those of its steps run one after
//! another (summed times; the peaks and bytes those runs hold, exactly), so the plan is the
//! fastest schedule that fits the budget among those that store, record and start regions only at
//! the super-steps' boundaries. Recording every step (the plain step) is among them.
//!
//! **Cost.** With `n` (super-)steps and fronts of at most `F` points, building the fronts takes
//! `O(n^3 F)` time (`n^2 / 2` states, each trying up to `n` splits, each joined and merged into
//! the state's front in `O(F)`, or skipped when the front beats it at each point) and `O(n^2 F)`
//! memory, once per chain: every budget then plans in `O(n log F)`. Fronts grow about linearly
//! with `n` (at most 114 points at 100 steps, 23 on average), so about `O(n^4)` up to
//! [`MAX_STEPS`], and the same beyond.

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
    /// Bytes held when the chain's backward starts beyond what was held when its forward ended:
    /// the output's gradient, which the last step's backward frees, and what else the code after
    /// the chain keeps (the loss, say), counted as held until the step ends: the part beyond
    /// `output_bytes`.
    pub after_held: usize,
    /// Most bytes held at once after the chain's backward (by the backward of what came before
    /// the chain, and until the next training forward) beyond what is held when it ends.
    pub before_peak: usize,
    /// The pool peak of the profiling step that measured these costs, from its forward's start
    /// to the end of its backward: what the schedule of least memory (every step on a tape,
    /// recomputed from the chain's input) holds, as measured; 0 when not measured (costs stated
    /// by hand), which leaves the planner's count alone. A stated value below what every
    /// schedule holds by the other costs (a step's input and forward peak, the output and what
    /// follows it) is ignored as 0.
    pub least_peak: usize,
}

impl ChainCosts {
    /// [`least_peak`](Self::least_peak), or 0 if it is below what every schedule holds: each
    /// step runs its forward once at least, holding its input (the chain's own is in use before
    /// the step starts) and its forward's peak, and the code after the chain holds the output
    /// and its own peak.
    pub(crate) fn credible_least_peak(&self) -> usize {
        let steps = self.steps.iter().enumerate();
        let forward = steps.map(|(i, c)| c.forward_peak + if i > 0 { c.input_bytes } else { 0 });
        let floor = forward
            .max()
            .unwrap_or(0)
            .max(self.output_bytes + self.after_peak);
        match self.least_peak >= floor {
            true => self.least_peak,
            false => 0,
        }
    }

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

pub(crate) use super::front::Choice;
use super::front::{self, Point};

/// The most steps planned one by one; a longer chain is planned on this many super-steps.
pub(crate) const MAX_STEPS: usize = 100;

/// Free bytes as the fronts count them: bytes of real budgets are far below this, and sums of a
/// few of them stay within `i64`.
fn free(m: u64) -> i64 {
    m.min(1 << 60) as i64
}

/// A chain's (super-)steps, their costs in bytes, and the fronts of every state.
pub(crate) struct Rotor {
    /// The (super-)steps planned on.
    n: usize,
    /// `at[i]`: the position in the chain of the first step of super-step `i`; `at[n]` is the
    /// chain's length.
    at: Vec<usize>,
    /// `x[i]`: bytes of `a_i`, `i <= n` (`x[n]` is 0: the output is reserved).
    x: Vec<i64>,
    /// `d[i]`: bytes of the gradient of `a_i` (`d[n]`: of `after_held`, at most the output's).
    d: Vec<i64>,
    /// Values only, as the first step of an advance (its input held by the caller): the most
    /// bytes held beyond the input.
    first: Vec<i64>,
    /// Values only, within an advance (each step's input dropped once its output is made): the
    /// most bytes held, the input included.
    mid: Vec<i64>,
    /// Bytes of the recorded graph, and the most held while recording it (the graph included).
    g: Vec<i64>,
    pr: Vec<i64>,
    /// The most bytes the backward holds beyond what is held when it starts.
    pb: Vec<i64>,
    f: Vec<f64>,
    b: Vec<f64>,
    /// `k[i]`: the gradient bytes steps `i ..` leave once their backward has run, and (`k[n]`)
    /// what the code after the chain holds to the end beyond the output's gradient.
    k: Vec<i64>,
    after_peak: i64,
    before_peak: i64,
    /// Bytes of the chain's output, reserved out of every budget.
    reserve: i64,
    /// Every front, each a range of `points`: `Solve(s, t)`'s at `s * n + t`, `Top(s, fresh)`'s
    /// at `2 * s + fresh`.
    points: Vec<Point>,
    solve: Vec<(usize, usize)>,
    top: Vec<(usize, usize)>,
    /// The splits the build joined into fronts, and those it skipped as beaten.
    splits: (usize, usize),
}

/// One checkpointed region of a planned forward: steps `start .. end` on tapes, `a_start` stored,
/// and the free bytes its backward solves with.
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
    /// The most pool bytes the schedule holds above the step's start by the measured costs (the
    /// chain's output and what follows it included), plus any reserve it was planned with.
    pub(crate) peak: usize,
}

/// The buffers of the state being solved, and counts of the splits it joined and skipped.
#[derive(Default)]
struct Work {
    front: Vec<Point>,
    scratch: Vec<Point>,
    merged: usize,
    skipped: usize,
}

/// The schedule of no step: nothing to hold, no time.
const NOTHING: [Point; 1] = [Point {
    need: 0,
    secs: 0.0,
    choice: Choice::All,
}];

impl Rotor {
    /// The chain `costs`, with the fronts of all its states.
    pub(crate) fn new(costs: &ChainCosts) -> Self {
        let costs = &costs.output_reserved();
        let steps = &costs.steps;
        let len = steps.len();
        let n = len.min(MAX_STEPS);
        let at: Vec<usize> = (0..=n).map(|i| i * len / n.max(1)).collect();
        let size = |b: usize| b as i64;
        // The chain's output is held by the caller until the step ends: it is reserved out of the
        // budget from the start, so no step holds it again.
        let input = |i: usize| steps.get(i).map_or(0, |c| size(c.input_bytes));
        // The output's gradient is the output's size; what else the loss holds stays to the end.
        let output_grad = costs.after_held.min(costs.output_bytes);
        let grad = |i: usize| {
            if i == len {
                size(output_grad)
            } else {
                input(i)
            }
        };
        let mut r = Rotor {
            n,
            x: at.iter().map(|&i| input(i)).collect(),
            d: at.iter().map(|&i| grad(i)).collect(),
            first: Vec::with_capacity(n),
            mid: Vec::with_capacity(n),
            g: Vec::with_capacity(n),
            pr: Vec::with_capacity(n),
            pb: Vec::with_capacity(n),
            f: Vec::with_capacity(n),
            b: Vec::with_capacity(n),
            k: vec![0; n + 1],
            after_peak: size(costs.after_peak),
            before_peak: size(costs.before_peak),
            reserve: size(costs.output_bytes),
            points: Vec::new(),
            solve: vec![(0, 0); n * n],
            top: vec![(0, 0); 2 * (n + 1)],
            splits: (0, 0),
            at,
        };
        let mut kept = Vec::with_capacity(n);
        for w in r.at.windows(2) {
            let run = &steps[w[0]..w[1]];
            // The steps of a run, one after another: values only, each dropping its input once
            // its output is made (the first one's is the caller's); recording, each holding the
            // graphs before it; backward, last first, each holding the graphs of the steps before
            // it and the gradients of those after.
            let (mut first, mut mid, mut g, mut pr) = (0, 0, 0, 0);
            for (j, c) in run.iter().enumerate() {
                let held = size(c.input_bytes) + size(c.forward_peak);
                first = if j == 0 {
                    size(c.forward_peak)
                } else {
                    first.max(held)
                };
                mid = mid.max(held);
                pr = pr.max(g + size(c.record_peak.max(c.graph_bytes)));
                g += size(c.graph_bytes);
            }
            let (mut pb, mut later_graphs, mut later_grads) = (0, 0, 0);
            for (j, c) in run.iter().enumerate().rev() {
                let swapped = grad(w[0] + j + 1) - grad(w[1]);
                pb = pb.max(size(c.backward_peak) + swapped - later_graphs + later_grads);
                later_graphs += size(c.graph_bytes);
                later_grads += size(c.gradient_bytes);
            }
            r.first.push(first);
            r.mid.push(mid);
            r.g.push(g);
            r.pr.push(pr);
            r.pb.push(pb);
            r.f.push(run.iter().map(|c| c.forward_secs).sum());
            r.b.push(run.iter().map(|c| c.backward_secs).sum());
            kept.push(later_grads);
        }
        r.k[n] = size(costs.after_held - output_grad);
        for i in (0..n).rev() {
            r.k[i] = r.k[i + 1] + kept[i];
        }
        r.build();
        r
    }

    /// Builds every front: `Solve`'s by the length of the run, then `Top`'s from the end.
    fn build(&mut self) {
        let n = self.n;
        let mut work = Work::default();
        for len in 0..n {
            for s in 0..n - len {
                self.solve[s * n + s + len] = self.solve_state(s, s + len, &mut work);
            }
        }
        for s in (0..=n).rev() {
            for fresh in [false, true] {
                self.top[2 * s + usize::from(fresh)] = self.top_state(s, fresh, &mut work);
            }
        }
        self.splits = (work.merged, work.skipped);
    }

    fn solve_front(&self, s: usize, t: usize) -> &[Point] {
        let (from, to) = self.solve[s * self.n + t];
        &self.points[from..to]
    }

    fn top_front(&self, s: usize, fresh: bool) -> &[Point] {
        let (from, to) = self.top[2 * s + usize::from(fresh)];
        &self.points[from..to]
    }

    /// Merges into the state's front those of `Ck(sp)` for each `sp` in `s + 1 ..= last`: `a_s`
    /// advanced to `a_sp` holding `stored` more, then `right(sp)` holding `stored + x[sp]` and
    /// `left(sp)` holding `stored + moved(sp)`, ending holding `end`.
    #[allow(clippy::too_many_arguments)]
    fn splits<'r>(
        &'r self,
        (s, last): (usize, usize),
        stored: i64,
        end: i64,
        right: impl Fn(usize) -> &'r [Point],
        left: impl Fn(usize) -> &'r [Point],
        moved: impl Fn(usize) -> i64,
        work: &mut Work,
    ) {
        let (mut advance, mut secs) = (0, 0.0);
        for sp in s + 1..=last {
            advance = self.advance_peak(s, sp, advance);
            secs += self.f[sp - 1];
            let (r, l) = (right(sp), left(sp));
            let (Some(r0), Some(l0)) = (r.first(), l.first()) else {
                continue;
            };
            let (a, b, floor) = (
                stored + self.x[sp],
                stored + moved(sp),
                (stored + advance).max(end),
            );
            let least = floor.max(a + r0.need).max(b + l0.need);
            let fastest = secs + r[r.len() - 1].secs + l[l.len() - 1].secs;
            let points = || front::joined((r, a), (l, b), floor, secs, Choice::Ck(sp));
            // Most splits are beaten at every need by those tried before: a bound first, then
            // each point, before any is written.
            if front::beats(&work.front, least, fastest) || front::beaten(&work.front, points()) {
                work.skipped += 1;
                continue;
            }
            front::merge(&mut work.front, points(), &mut work.scratch);
            work.merged += 1;
        }
    }

    /// Starts the state's front with `All`'s: recording the (super-)step, then `rest` holding
    /// its graph, then its backward holding `held` more than on entry, ending holding `end`.
    fn record_first(&self, s: usize, rest: &[Point], held: i64, end: i64, work: &mut Work) {
        let floor = self.pr[s].max(held + self.pb[s]).max(end);
        let secs = self.f[s] + self.b[s];
        work.front.clear();
        let points = front::shifted(rest, self.g[s], floor, secs, Choice::All);
        front::merge(&mut work.front, points, &mut work.scratch);
    }

    /// Keeps the state's front, and returns its range.
    fn keep(&mut self, work: &mut Work) -> (usize, usize) {
        let from = self.points.len();
        self.points.extend_from_slice(&work.front);
        (from, self.points.len())
    }

    /// The front of `Solve(s, t)`, from those of shorter runs and of `Solve(s', t)`, `s' > s`.
    fn solve_state(&mut self, s: usize, t: usize, work: &mut Work) -> (usize, usize) {
        // It ends holding the gradient of a_s instead of a_{t+1}'s, and its steps' gradients.
        let end = self.d[s] - self.d[t + 1] + self.kept(s, t + 1);
        let rest = if s < t {
            self.solve_front(s + 1, t)
        } else {
            &NOTHING
        };
        // B(s) runs holding the graph and what the rest left.
        let held = self.g[s] + self.d[s + 1] - self.d[t + 1] + self.kept(s + 1, t + 1);
        self.record_first(s, rest, held, end, work);
        self.splits(
            (s, t),
            0,
            end,
            |sp| self.solve_front(sp, t),
            |sp| self.solve_front(s, sp - 1),
            |sp| self.d[sp] - self.d[t + 1] + self.kept(sp, t + 1),
            work,
        );
        self.keep(work)
    }

    /// The front of `Top(s, fresh)`, from those of `Top(s', _)`, `s' > s`, and of `Solve`;
    /// `fresh` when `a_s` has no other handle (storing it copies nothing).
    fn top_state(&mut self, s: usize, fresh: bool, work: &mut Work) -> (usize, usize) {
        if s == self.n {
            work.front.clear();
            work.front.push(Point {
                need: self.after_peak.max(self.d[s] + self.k[s]),
                secs: 0.0,
                choice: Choice::All,
            });
            return self.keep(work);
        }
        // It ends holding the gradient of a_s, the steps' gradients and what the loss keeps.
        let end = self.d[s] + self.k[s];
        let held = self.g[s] + self.d[s + 1] + self.k[s + 1];
        self.record_first(s, self.top_front(s + 1, false), held, end, work);
        self.splits(
            (s, self.n),
            if fresh { 0 } else { self.x[s] },
            end,
            |sp| self.top_front(sp, true),
            |sp| self.solve_front(s, sp - 1),
            |sp| self.d[sp] + self.k[sp],
            work,
        );
        self.keep(work)
    }

    /// The most bytes held beyond `a_s` advancing values from it to `a_sp`, given `before`, that
    /// of advancing to `a_{sp-1}`.
    fn advance_peak(&self, s: usize, sp: usize, before: i64) -> i64 {
        if sp == s + 1 {
            self.first[s]
        } else {
            before.max(self.mid[sp - 1])
        }
    }

    /// The gradient bytes (super-)steps `from .. to` leave.
    fn kept(&self, from: usize, to: usize) -> i64 {
        self.k[from] - self.k[to]
    }

    /// The (super-)step that starts at position `pos` of the chain.
    fn index(&self, pos: usize) -> usize {
        if self.at.len() == self.at.last().map_or(0, |&l| l + 1) {
            return pos;
        }
        self.at
            .binary_search(&pos)
            .expect("the plan's positions start (super-)steps")
    }

    /// A choice with positions of the chain.
    fn positioned(&self, choice: Choice) -> Choice {
        match choice {
            Choice::All => Choice::All,
            Choice::Ck(sp) => Choice::Ck(self.at[sp]),
        }
    }

    /// The fastest reversal of steps `s ..= t` with `m` bytes free beyond `a_s` and the gradient of
    /// `a_{t+1}`, and its first choice; infinite time if nothing fits.
    pub(crate) fn solve(&self, s: usize, t: usize, m: u64) -> (f64, Choice) {
        let (s, t) = (self.index(s), self.index(t + 1) - 1);
        match front::best(self.solve_front(s, t), free(m)) {
            Some(p) => (p.secs, self.positioned(p.choice)),
            None => (f64::INFINITY, Choice::All),
        }
    }

    /// Bytes free after recording the graph of the (super-)step at `s` with `m` free, if the
    /// recording fits.
    pub(crate) fn all_free(&self, s: usize, m: u64) -> Option<u64> {
        let i = self.index(s);
        (self.pr[i] <= free(m)).then(|| m - self.g[i] as u64)
    }

    /// The position after the steps `All` at `s` records: `s + 1`, or the end of its super-step.
    pub(crate) fn all_end(&self, s: usize) -> usize {
        self.at[self.index(s) + 1]
    }

    /// The free bytes of the two sub-problems of `Ck(sp)` at `(s, t, m)`: the right part (holding
    /// `a_sp`) and the left part (holding the gradient of `a_sp` instead of `a_{t+1}`'s).
    pub(crate) fn solve_ck_free(&self, t: usize, sp: usize, m: u64) -> Option<(u64, u64)> {
        let (t1, sp) = (self.index(t + 1), self.index(sp));
        let m = free(m);
        let right = m - self.x[sp];
        let left = m + self.d[t1] - self.d[sp] - self.kept(sp, t1);
        Some((u64::try_from(right).ok()?, u64::try_from(left).ok()?))
    }

    /// The least budget in bytes a plan fits in.
    pub(crate) fn smallest_budget(&self) -> usize {
        // After the chain's backward: the input's gradient, every step's gradients, and what the
        // backward of the code before the chain holds.
        let after = self.d[0] + self.k[0] + self.before_peak;
        let least = self.top_front(0, false).first().map_or(0, |p| p.need);
        (self.reserve + least.max(after)) as usize
    }

    /// The least budget in bytes the fastest schedule fits in (it records every step, unless
    /// measured times make a schedule that replays faster).
    pub(crate) fn fastest_budget(&self) -> usize {
        let after = self.d[0] + self.k[0] + self.before_peak;
        let need = self.top_front(0, false).last().map_or(0, |p| p.need);
        (self.reserve + need.max(after)) as usize
    }

    /// The optimal schedule within `budget` bytes, if one fits.
    pub(crate) fn plan(&self, budget: u64) -> Option<TopPlan> {
        let budget = free(budget) - self.reserve;
        let after = self.d[0] + self.k[0] + self.before_peak;
        if after > budget {
            return None;
        }
        let best = front::best(self.top_front(0, false), budget)?;
        let mut plan = TopPlan {
            graph: vec![false; self.at[self.n]],
            regions: Vec::new(),
            secs: best.secs,
            peak: (self.reserve + best.need.max(after)) as usize,
        };
        let (mut s, mut m, mut fresh) = (0, budget, false);
        while s < self.n {
            let point = front::best(self.top_front(s, fresh), m).expect("the optimum fits");
            match point.choice {
                Choice::All => {
                    plan.graph[self.at[s]..self.at[s + 1]].fill(true);
                    m -= self.g[s];
                    fresh = false;
                    s += 1;
                }
                Choice::Ck(sp) => {
                    let m0 = m - if fresh { 0 } else { self.x[s] };
                    let left = m0 - self.d[sp] - self.k[sp];
                    plan.regions.push(RegionPlan {
                        start: self.at[s],
                        end: self.at[sp],
                        free: left as u64,
                    });
                    (s, m, fresh) = (sp, m0 - self.x[sp], true);
                }
            }
        }
        Some(plan)
    }

    /// The (super-)steps planned on, the points of all the fronts, of the largest, and the
    /// splits joined and skipped.
    #[cfg(test)]
    fn size(&self) -> (usize, usize, usize, (usize, usize)) {
        let largest = self
            .solve
            .iter()
            .chain(&self.top)
            .map(|(from, to)| to - from);
        let largest = largest.max().unwrap_or(0);
        (self.n, self.points.len(), largest, self.splits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
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
            least_peak: 0,
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
                return vec![(0, (self.c.after_peak as i64).max(self.d[n] + self.k[n]))];
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
        // The output's gradient goes with the last step's backward; the rest stays to the end.
        let output_grad = c.after_held.min(c.output_bytes);
        d.push(output_grad as i64);
        let mut k = vec![0; n + 1];
        k[n] = (c.after_held - output_grad) as i64;
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
            match r.solve(s, t, m).1 {
                Choice::All => {
                    // Steps s .. to recorded one after another, the rest solved, and their
                    // backward last first.
                    let rest = r.all_free(s, m).unwrap();
                    let to = r.all_end(s);
                    let (mut held, mut peak, mut secs) = (0, 0, 0);
                    for j in s..to {
                        let (_, g, pr, _, fb) = e.step(j);
                        peak = peak.max(held + pr);
                        held += g;
                        secs += fb;
                    }
                    if to <= t {
                        let (c1, p1) = solve(r, e, to, t, rest);
                        peak = peak.max(held + p1);
                        held += e.d[to] - e.d[t + 1] + e.k[to] - e.k[t + 1];
                        secs += c1;
                    }
                    for j in (s..to).rev() {
                        let (_, g, _, pb, _) = e.step(j);
                        peak = peak.max(held + pb);
                        held += e.d[j] - e.d[j + 1] - g + e.k[j] - e.k[j + 1];
                    }
                    assert_eq!(held, end);
                    (secs, peak.max(end))
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
        held += e.d[n] + e.k[n];
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

    /// The peak in bytes of the plain step (every step records its graph), simulated as
    /// [`follow`] does, and its time.
    fn plain_step(chain: &ChainCosts) -> (u64, i64) {
        let reserved = chain.output_reserved();
        let e = exhaustive(&reserved);
        let n = chain.steps.len();
        let (mut held, mut peak, mut secs) = (chain.output_bytes as i64, 0, 0);
        for j in 0..n {
            let (_, g, pr, _, fb) = e.step(j);
            peak = peak.max(held + pr);
            held += g;
            secs += fb;
        }
        peak = peak.max(held + chain.after_peak as i64);
        held += e.d[n] + e.k[n];
        for j in (0..n).rev() {
            let (_, g, _, pb, _) = e.step(j);
            peak = peak.max(held + pb);
            held += e.d[j] - e.d[j + 1] - g + e.k[j] - e.k[j + 1];
        }
        (secs, peak.max(held + chain.before_peak as i64))
    }

    /// Compares the plan of `chain` at each of `budgets` with the exhaustive search, and follows
    /// it in bytes; returns the budgets a plan fits.
    fn compare(chain: &ChainCosts, budgets: impl IntoIterator<Item = i64>) -> usize {
        // Simulated as the runtime holds it: the output reserved from the start.
        let reserved = chain.output_reserved();
        let e = exhaustive(&reserved);
        let rotor = Rotor::new(chain);
        let n = chain.steps.len();
        let mut compared = 0;
        for budget in budgets {
            let plan = rotor.plan(budget as u64);
            let best = e.best(budget);
            assert_eq!(
                plan.as_ref().map(|p| p.secs as u64),
                best,
                "n={n} budget={budget}: {chain:?}"
            );
            if let Some(plan) = plan {
                let (secs, peak) = follow(&rotor, &e, budget as u64);
                assert_eq!(Some(secs), best, "the plan's schedule takes its time");
                assert!(peak <= budget, "peak {peak} > budget {budget}");
                let (plain_secs, plain_peak) = plain_step(chain);
                if budget >= plain_peak {
                    assert!(plan.graph.iter().all(|&g| g) && secs == plain_secs);
                }
                compared += 1;
            }
        }
        compared
    }

    /// The least budget of every schedule of `chain`, by the exhaustive search, and the
    /// budgets of the points of its front.
    fn least_budgets(chain: &ChainCosts) -> (i64, Vec<i64>) {
        let reserved = chain.output_reserved();
        let e = exhaustive(&reserved);
        let after = e.d[0] + e.k[0] + chain.before_peak as i64;
        let reserve = chain.output_bytes as i64;
        let peaks: Vec<i64> = e
            .top(0, false)
            .iter()
            .map(|&(_, p)| reserve + p.max(after))
            .collect();
        (*peaks.iter().min().unwrap(), peaks)
    }

    #[test]
    fn the_plan_is_the_least_time_of_every_schedule_within_the_budget() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut compared = 0;
        for round in 0..60 {
            let n = if round < 6 { 10 } else { rng.between(1, 8) };
            let chain = random_chain(&mut rng, n);
            let (least, _) = least_budgets(&chain);
            assert_eq!(
                Rotor::new(&chain).smallest_budget(),
                least as usize,
                "{chain:?}"
            );
            compared += compare(&chain, least - 2..least + 40);
        }
        assert!(compared > 1000, "{compared}");
    }

    /// A chain of `n` steps with sizes in the megabytes, multiples of 64 bytes as the pool's
    /// classes are, and whole-second times: layers of one width repeated, or of several.
    fn realistic_chain(rng: &mut Rng, n: usize, widths: usize) -> ChainCosts {
        let mb = |rng: &mut Rng, lo: usize, hi: usize| 64 * rng.between(lo << 14, hi << 14);
        let kinds: Vec<(usize, StepCost)> = (0..widths)
            .map(|_| {
                let output = mb(rng, 1, 8);
                let graph = output + mb(rng, 0, 12);
                let cost = StepCost {
                    forward_secs: rng.between(1, 9) as f64,
                    backward_secs: rng.between(1, 9) as f64,
                    input_bytes: 0,
                    forward_peak: output + mb(rng, 0, 4),
                    graph_bytes: graph,
                    record_peak: graph + mb(rng, 0, 4),
                    backward_peak: mb(rng, 1, 12),
                    gradient_bytes: mb(rng, 0, 2),
                };
                (output, cost)
            })
            .collect();
        let first = mb(rng, 1, 8);
        let steps: Vec<StepCost> = (0..n)
            .map(|i| StepCost {
                input_bytes: if i == 0 {
                    first
                } else {
                    kinds[(i - 1) % widths].0
                },
                ..kinds[i % widths].1
            })
            .collect();
        let output = kinds[(n - 1) % widths].0;
        ChainCosts {
            steps,
            output_bytes: output,
            after_peak: mb(rng, 0, 8),
            after_held: output + 64 * rng.between(0, 64),
            before_peak: mb(rng, 0, 16),
            least_peak: 0,
        }
    }

    #[test]
    fn the_plan_is_exact_in_bytes_on_chains_of_megabytes() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut compared = 0;
        for round in 0..40 {
            let n = rng.between(1, 9);
            let chain = realistic_chain(&mut rng, n, 1 + round % 3);
            let (least, peaks) = least_budgets(&chain);
            assert_eq!(
                Rotor::new(&chain).smallest_budget(),
                least as usize,
                "{chain:?}"
            );
            let (_, plain) = plain_step(&chain);
            // Each schedule's exact peak, a byte either side, and budgets between.
            let mut budgets: Vec<i64> = peaks
                .iter()
                .chain([&plain])
                .flat_map(|&p| [p - 1, p, p + 1])
                .collect();
            budgets.extend((0..20).map(|_| least + rng.below((plain - least + 64) as u64) as i64));
            compared += compare(&chain, budgets);
        }
        assert!(compared > 500, "{compared}");
    }

    #[test]
    fn a_long_chain_is_planned_on_super_steps_within_its_budget() {
        let mut rng = Rng(0x8f1b_bcdc_3ce6_53a1);
        for (n, widths) in [(101, 1), (300, 2), (1000, 3)] {
            let chain = realistic_chain(&mut rng, n, widths);
            let rotor = Rotor::new(&chain);
            assert_eq!(rotor.size().0, MAX_STEPS);
            let (_, points, largest, _) = rotor.size();
            assert!(
                largest > 1 && points > MAX_STEPS * MAX_STEPS / 2,
                "{points} {largest}"
            );
            let reserved = chain.output_reserved();
            let e = exhaustive(&reserved);
            let least = rotor.smallest_budget() as u64;
            assert!(rotor.plan(least - 1).is_none());
            let (plain_secs, plain) = plain_step(&chain);
            let plain = plain as u64;
            assert!(least < plain, "{least} {plain}");
            // The plain step is found at its peak, not a byte below.
            let plan = rotor.plan(plain).unwrap();
            assert!(plan.graph.iter().all(|&g| g) && plan.secs as u64 == plain_secs);
            assert!(!rotor.plan(plain - 1).unwrap().graph.iter().all(|&g| g));
            let mut last = f64::INFINITY;
            for k in 0..=16 {
                let budget = least + (plain - least) * k / 16;
                let plan = rotor.plan(budget).unwrap();
                let (secs, peak) = follow(&rotor, &e, budget);
                assert_eq!(secs, plan.secs as u64, "n={n} budget={budget}");
                assert!(
                    peak as u64 <= budget,
                    "n={n}: peak {peak} > budget {budget}"
                );
                assert!(plan.secs <= last);
                last = plan.secs;
            }
        }
    }

    /// A chain of `n` layers of an MLP over a batch of 1024, alternating between `widths`: a
    /// linear map and an activation, costs in proportion to their sizes.
    fn mlp_chain(n: usize, widths: &[usize]) -> ChainCosts {
        let act = |w: usize| crate::pool::class_bytes_of(1024 * w * 4);
        let steps: Vec<StepCost> = (0..n)
            .map(|i| {
                let (w_in, w_out) = (widths[i % widths.len()], widths[(i + 1) % widths.len()]);
                let (x, y) = (act(w_in), act(w_out));
                let secs = (w_in * w_out) as f64 * 1e-9;
                StepCost {
                    forward_secs: secs,
                    backward_secs: 2.0 * secs,
                    input_bytes: x,
                    forward_peak: 2 * y,
                    graph_bytes: 2 * y,
                    record_peak: 3 * y,
                    backward_peak: x + 2 * y,
                    gradient_bytes: crate::pool::class_bytes_of(w_in * w_out * 4),
                }
            })
            .collect();
        let out = act(widths[n % widths.len()]);
        ChainCosts {
            steps,
            output_bytes: out,
            after_peak: 2 * out,
            after_held: out,
            before_peak: 0,
            least_peak: 0,
        }
    }

    /// Seconds this thread has run on a CPU, where Linux says (the machine may be shared).
    fn cpu_secs() -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let ns: f64 = stat.split_whitespace().next()?.parse().ok()?;
        Some(ns * 1e-9)
    }

    /// The time of planning chains of 16 to 1000 layers: the fronts, a plan at each of 8
    /// budgets, and the smallest budget. Prints a table; run in release:
    /// `cargo test -p tensorscope-runtime --release --lib plan_times -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints timings; run in release"]
    fn plan_times() {
        use std::time::Instant;
        println!(
            "layers  widths      steps  points  largest   joined  skipped  fronts(s)  \
             (cpu s)  8 plans(s)  smallest(s)"
        );
        for widths in [&[256][..], &[64, 640]] {
            for n in [16, 48, 96, 100, 200, 500, 1000] {
                let chain = mlp_chain(n, widths);
                let (clock, cpu) = (Instant::now(), cpu_secs());
                let rotor = Rotor::new(&chain);
                let fronts = clock.elapsed().as_secs_f64();
                let cpu = cpu.zip(cpu_secs()).map(|(a, b)| format!("{:.4}", b - a));
                let (least, plain) = (rotor.smallest_budget(), plain_step(&chain).1 as usize);
                let clock = Instant::now();
                for k in 0..8 {
                    let plan = rotor.plan((least + (plain - least) * k / 7) as u64);
                    assert!(plan.is_some());
                }
                let plans = clock.elapsed().as_secs_f64();
                let clock = Instant::now();
                assert_eq!(Rotor::new(&chain).smallest_budget(), least);
                let smallest = clock.elapsed().as_secs_f64();
                let (steps, points, largest, (joined, skipped)) = rotor.size();
                println!(
                    "{n:6}  {:10}  {steps:5}  {points:6}  {largest:7}  {joined:7}  {skipped:7}  \
                     {fronts:9.4}  {:>7}  {plans:10.6}  {smallest:11.4}",
                    format!("{widths:?}"),
                    cpu.unwrap_or_default()
                );
            }
        }
    }
}
