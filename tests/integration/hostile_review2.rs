//! A second hostile review, written from the public docs alone: `ChainCosts::least_peak` stated
//! by hand (too small, 0, huge) through `Checkpointer::set_costs`; skip connections at the edges
//! of a `#[checkpoint]` sequence (the chain's first value read by the last step only, a value read
//! by many steps and twice in one, a step whose value is an alias of the one before it) under
//! every policy; skip chains on two threads at once on one pool; infinities and NaNs inside skip
//! values; and `Checkpointer::plan_report` against the measured peak and `last_backward`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tensorscope::checkpoint::{ChainCosts, PlanKind, Saving, StepRun};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Parameters, Policy};

use crate::hostile_skips::{is_budget_error, weight};

const R: usize = 64;
const W: usize = 32;

#[derive(Parameters)]
struct Net {
    w: Vec<Param>,
    /// Added to a skip value: finite, or with infinities, or with a NaN.
    bad: Param,
}

impl Net {
    fn new(pool: &Pool, bad: &[f32]) -> Self {
        let mut data = vec![0.0f32; R * W];
        data[..bad.len()].copy_from_slice(bad);
        Net {
            w: (0..12).map(|i| weight(pool, W, W, 700 + i)).collect(),
            bad: Param::from_slice(pool, &[R, W], &data),
        }
    }

    // L: `d1` read by the next step, twice by step 4 and by the last; `h`, the chain's first
    // value, read by the last step only; `d2` by step 3.
    fn l_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = d2.matmul(&w[2]).tanh();
        let u2 = (d3.matmul(&w[3]) + &d2).tanh();
        let u1 = (u2.matmul(&w[4]) + &d1 * &d1).tanh();
        u1.matmul(&w[5]) + &h + &d1
    }

    #[checkpoint]
    fn l_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = d2.matmul(&w[2]).tanh();
        let u2 = (d3.matmul(&w[3]) + &d2).tanh();
        let u1 = (u2.matmul(&w[4]) + &d1 * &d1).tanh();
        let out = u1.matmul(&w[5]) + &h + &d1;
        out
    }

    // A: a step whose value is an alias of its input (`b`, a reshape of `a`), both read later.
    fn a_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.reshape(&[R * 2, W / 2]).reshape(&[R, W]);
        let c = (b.matmul(&w[1]) + &a).tanh();
        let d = (c.matmul(&w[2]) + &b + &a).tanh();
        d.matmul(&w[3])
    }

    #[checkpoint]
    fn a_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.reshape(&[R * 2, W / 2]).reshape(&[R, W]);
        let c = (b.matmul(&w[1]) + &a).tanh();
        let d = (c.matmul(&w[2]) + &b + &a).tanh();
        let out = d.matmul(&w[3]);
        out
    }
}

impl Net {
    // E: `d1` read by the next step and by two later ones, `d2` by a later one, `h` (the chain's
    // first value) by the last step only; every skip read an operand of an add.
    fn e_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = (d2.matmul(&w[2]) + &d1).tanh();
        let u = (d3.matmul(&w[3]) + &d1 + &d2).tanh();
        u.matmul(&w[4]) + &h
    }

    #[checkpoint]
    fn e_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = (d2.matmul(&w[2]) + &d1).tanh();
        let u = (d3.matmul(&w[3]) + &d1 + &d2).tanh();
        let out = u.matmul(&w[4]) + &h;
        out
    }

    // E2: E with `d1` added twice in one step.
    fn e2_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = (d2.matmul(&w[2]) + &d1 + &d1).tanh();
        let u = (d3.matmul(&w[3]) + &d1 + &d2).tanh();
        u.matmul(&w[4]) + &h
    }

    #[checkpoint]
    fn e2_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = (d2.matmul(&w[2]) + &d1 + &d1).tanh();
        let u = (d3.matmul(&w[3]) + &d1 + &d2).tanh();
        let out = u.matmul(&w[4]) + &h;
        out
    }

    // S: a skip value on both sides of one op (`&d1 * &d1`).
    fn s_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let u1 = (d2.matmul(&w[4]) + &d1 * &d1).tanh();
        u1.matmul(&w[5])
    }

    #[checkpoint]
    fn s_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let u1 = (d2.matmul(&w[4]) + &d1 * &d1).tanh();
        let out = u1.matmul(&w[5]);
        out
    }

    // S2: the same op on the step's own input (`&d2 * &d2`, no skip).
    fn s2_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let u1 = (d2.matmul(&w[4]) + &d2 * &d2).tanh();
        u1.matmul(&w[5])
    }

    #[checkpoint]
    fn s2_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let u1 = (d2.matmul(&w[4]) + &d2 * &d2).tanh();
        let out = u1.matmul(&w[5]);
        out
    }

    // C: `a` (carrying `bad`) read by the next step through a clone and by two later ones as an
    // operand of an add.
    fn c_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]) + &self.bad;
        let b = a.clone().tanh();
        let c = (b.matmul(&w[1]) + &a).tanh();
        let d = (c.matmul(&w[2]) + a.clone()).tanh();
        d.matmul(&w[3])
    }

    #[checkpoint]
    fn c_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]) + &self.bad;
        let b = a.clone().tanh();
        let c = (b.matmul(&w[1]) + &a).tanh();
        let d = (c.matmul(&w[2]) + a.clone()).tanh();
        let out = d.matmul(&w[3]);
        out
    }

    // T: a skip value read through a unary op (`(&a).tanh()`) before the add.
    fn t_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]) + &self.bad;
        let b = a.clone().tanh();
        let c = (b.matmul(&w[1]) + (&a).tanh()).tanh();
        let d = (c.matmul(&w[2]) + &a).tanh();
        d.matmul(&w[3])
    }

    #[checkpoint]
    fn t_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]) + &self.bad;
        let b = a.clone().tanh();
        let c = (b.matmul(&w[1]) + (&a).tanh()).tanh();
        let d = (c.matmul(&w[2]) + &a).tanh();
        let out = d.matmul(&w[3]);
        out
    }
}

impl Net {
    // G: eleven steps on four copies of the input, `a2` read by step 5, `h` by the last: long and
    // wide enough that the plans between the least schedule and the plain step store and replay
    // some steps.
    fn g_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = Tensor::concat(&[&x, &x, &x, &x], 0).tanh();
        let a1 = h.matmul(&w[0]).tanh();
        let a2 = a1.matmul(&w[1]).tanh();
        let a3 = a2.matmul(&w[2]).tanh();
        let a4 = a3.matmul(&w[3]).tanh();
        let a5 = (a4.matmul(&w[4]) + &a2).tanh();
        let a6 = a5.matmul(&w[5]).tanh();
        let a7 = a6.matmul(&w[6]).tanh();
        let a8 = a7.matmul(&w[7]).tanh();
        let a9 = a8.matmul(&w[8]).tanh();
        let a10 = a9.matmul(&w[9]).tanh();
        (a10.matmul(&w[10]) + &h).narrow(0, 0, R)
    }

    #[checkpoint]
    fn g_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = Tensor::concat(&[&x, &x, &x, &x], 0).tanh();
        let a1 = h.matmul(&w[0]).tanh();
        let a2 = a1.matmul(&w[1]).tanh();
        let a3 = a2.matmul(&w[2]).tanh();
        let a4 = a3.matmul(&w[3]).tanh();
        let a5 = (a4.matmul(&w[4]) + &a2).tanh();
        let a6 = a5.matmul(&w[5]).tanh();
        let a7 = a6.matmul(&w[6]).tanh();
        let a8 = a7.matmul(&w[7]).tanh();
        let a9 = a8.matmul(&w[8]).tanh();
        let a10 = a9.matmul(&w[9]).tanh();
        let out = (a10.matmul(&w[10]) + &h).narrow(0, 0, R);
        out
    }
}

type Fwd = for<'n, 'a> fn(&'n Net, Tensor<'a>) -> Tensor<'a>;
type CkptFwd = for<'n, 'c, 'a> fn(&'n Net, &'c mut Checkpointer, Tensor<'a>) -> Tensor<'a>;

/// One fresh training step: the loss's bits, every parameter's gradient (`None`: not read) and
/// the pool's peak above the checkpointed forward's start (the step's start without one; alone on
/// its pool only).
struct Step {
    loss: u32,
    grads: Vec<Option<Vec<f32>>>,
    peak: usize,
}

fn step(pool: &Pool, net: &Net, f: Fwd, c: CkptFwd, ckpt: Option<&mut Checkpointer>) -> Step {
    pool.train(|s| {
        let x = s.randn::<f32>(&[R, W], 3);
        let target = s.randn::<f32>(&[R, W], 4);
        let mut start = pool.stats().bytes_in_use;
        pool.reset_peak();
        let y = match ckpt {
            Some(ckpt) => {
                let y = c(net, ckpt, x);
                start = ckpt.forward_start_bytes();
                y
            }
            None => f(net, x),
        };
        let loss = y.mse(&target);
        let grads = loss.backward().unwrap();
        // Saturating: on threads sharing the pool, another's `reset_peak` lowers the pool's peak,
        // which is then no measure (the tests on threads read the report's, counted per thread).
        let peak = pool.stats().peak_bytes_in_use.saturating_sub(start);
        let mut all = Vec::new();
        net.visit_params(&ParamPath::ROOT, &mut |_, p| {
            all.push(grads.get(p).map(|g| g.to_vec()))
        });
        Step {
            loss: loss.item().to_bits(),
            grads: all,
            peak,
        }
    })
}

/// Equal bit for bit, any NaN equal to any NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// What differs between `got` and `want`: the loss, and each gradient with how many elements
/// differ, the largest difference and the first pair.
fn diffs(label: &str, got: &Step, want: &Step) -> Vec<String> {
    let mut out = Vec::new();
    let (gl, wl) = (f32::from_bits(got.loss), f32::from_bits(want.loss));
    if !same(gl, wl) {
        out.push(format!("{label}: loss {gl} vs {wl}"));
    }
    for (i, (g, w)) in got.grads.iter().zip(&want.grads).enumerate() {
        match (g, w) {
            (Some(g), Some(w)) => {
                let bad: Vec<(f32, f32)> = g
                    .iter()
                    .zip(w)
                    .filter(|(a, b)| !same(**a, **b))
                    .map(|(a, b)| (*a, *b))
                    .collect();
                if let Some(first) = bad.first() {
                    let max = bad.iter().map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                    out.push(format!(
                        "{label}: gradient {i}: {} elements differ, max |diff| {max:e}, first {first:?}",
                        bad.len()
                    ));
                }
            }
            (None, None) => {}
            _ => out.push(format!("{label}: gradient {i} present in one only")),
        }
    }
    out
}

fn panic_message(e: &(dyn std::any::Any + Send)) -> String {
    is_budget_error(e).unwrap_or_default()
}

/// The count policies over `steps` steps of activations of `act` bytes at most.
fn count_policies(steps: usize, act: usize) -> Vec<Policy> {
    vec![
        Policy::Every(1),
        Policy::Every(2),
        Policy::Every(3),
        Policy::Every(steps),
        Policy::Sqrt,
        Policy::Explicit(vec![]),
        Policy::Explicit(vec![steps - 1]),
        Policy::Explicit((1..steps).step_by(2).collect()),
        Policy::Budget(act),
        Policy::Budget(3 * act),
    ]
}

/// A checkpointer under `Memory(huge)` after three fresh profiling/planned steps of `c`.
fn probe(pool: &Pool, net: &Net, f: Fwd, c: CkptFwd, saving: Saving) -> Checkpointer {
    let config = CheckpointConfig::new(Policy::Memory(1 << 40)).with_saving(saving);
    let mut probe = Checkpointer::new(config);
    for _ in 0..3 {
        step(pool, net, f, c, Some(&mut probe));
    }
    probe
}

/// The chains whose skips every policy should reverse bit for bit.
fn holding_chains() -> [(&'static str, Fwd, CkptFwd, usize); 6] {
    [
        ("G", Net::g_plain, Net::g_ckpt, 11),
        ("E", Net::e_plain, Net::e_ckpt, 5),
        ("E2", Net::e2_plain, Net::e2_ckpt, 5),
        ("A", Net::a_plain, Net::a_ckpt, 5),
        ("C", Net::c_plain, Net::c_ckpt, 5),
        ("S2", Net::s2_plain, Net::s2_ckpt, 4),
    ]
}

/// Skip edges that hold (E: the chain's first value read by the last step only, a value read by
/// three steps; A: a step whose value is an alias of its input, both read later; C: reads through
/// clones; S2: `&d2 * &d2` of the step's own input): the loss and every gradient bit for bit under
/// every count policy and under `Policy::Memory` at budgets from the profiling step's peak up,
/// each step within its budget; below the smallest budget, the documented error naming it.
#[test]
fn skip_edges_are_bit_for_bit_and_within_budget_under_every_policy() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let mut failures = Vec::new();
    for (name, f, c, steps) in holding_chains() {
        let plain = step(&pool, &net, f, c, None);
        failures.extend(diffs(
            &format!("{name} plain twice"),
            &step(&pool, &net, f, c, None),
            &plain,
        ));
        let probe = probe(&pool, &net, f, c, Saving::Nothing);
        let smallest = probe.smallest_budget().unwrap();
        let least = probe.costs().unwrap().least_peak;
        // From the least schedule's peak up: see `finding_the_profiling_step_runs_over_the_smallest_budget`.
        let lo = smallest.max(least);
        let hi = plain.peak.max(lo);
        let act = if name == "G" {
            4 * R * W * 4
        } else {
            R * W * 4
        };
        let mut policies = count_policies(steps, act);
        for b in [lo, lo + 1, (lo + hi) / 2, hi, 2 * hi, 1 << 40] {
            policies.push(Policy::Memory(b));
        }
        for policy in policies {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            for round in 0..3 {
                let got = step(&pool, &net, f, c, Some(&mut ckpt));
                failures.extend(diffs(
                    &format!("{name} {policy:?} round {round}"),
                    &got,
                    &plain,
                ));
                if let Policy::Memory(b) = policy {
                    if got.peak > b {
                        failures.push(format!(
                            "{name} {policy:?} round {round}: peak {} over the budget",
                            got.peak
                        ));
                    }
                }
            }
        }
        let mut below = Checkpointer::new(CheckpointConfig::new(Policy::Memory(smallest - 1)));
        below.set_costs(probe.costs().unwrap());
        match catch_unwind(AssertUnwindSafe(|| {
            step(&pool, &net, f, c, Some(&mut below))
        })) {
            Ok(got) => failures.push(format!("{name} below the smallest: ran, peak {}", got.peak)),
            Err(e) => {
                let msg = panic_message(&*e);
                if !msg.contains(&format!("smallest budget that fits is {smallest} bytes")) {
                    failures.push(format!("{name} below the smallest {smallest}: {msg}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A skip value read through an op of its own before it joins the step (`(&a).tanh()`), or on
/// both sides of one op (`&d1 * &d1`), as `L` does with `d1` also read by two more steps: the
/// plain graph's walk can reach its readers in another order than latest first, so its gradients
/// (and those before it) equal the unannotated forward's up to the sum's rounding, as the docs
/// say, not bit for bit. Found (R=64, W=32): `S`, `w[0]`'s gradient, 633 of 1024 elements differ
/// by up to 1.4e-9, under `Every(1)`, `Every(2)` and `Sqrt`; `T`, `w[0]` 608 elements up to
/// 1.9e-9 and `bad` (the gradient of `a` itself) 627 up to 4.7e-10; `L`, `w[0]` 712 up to
/// 5.6e-9. The loss is bit for bit in every case.
#[test]
fn a_skip_read_through_an_op_gets_the_plain_gradients_up_to_rounding() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let chains: [(&str, Fwd, CkptFwd); 3] = [
        ("S", Net::s_plain, Net::s_ckpt),
        ("T", Net::t_plain, Net::t_ckpt),
        ("L", Net::l_plain, Net::l_ckpt),
    ];
    let mut failures = Vec::new();
    let mut largest = 0f32;
    for (name, f, c) in chains {
        let plain = step(&pool, &net, f, c, None);
        for policy in [
            Policy::Every(1),
            Policy::Every(2),
            Policy::Sqrt,
            Policy::Memory(1 << 40),
        ] {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            let got = step(&pool, &net, f, c, Some(&mut ckpt));
            let label = format!("{name} {policy:?}");
            if got.loss != plain.loss {
                failures.push(format!("{label}: the loss"));
            }
            for (g, w) in got.grads.iter().zip(&plain.grads) {
                let (Some(g), Some(w)) = (g, w) else {
                    assert_eq!(g.is_some(), w.is_some(), "{label}");
                    continue;
                };
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (a, b) in g.iter().zip(w) {
                    largest = largest.max((a - b).abs());
                    if (a - b).abs() > 1e-6 * scale {
                        failures.push(format!("{label}: {a} vs {b} (largest {scale})"));
                    }
                }
            }
        }
    }
    println!("largest difference {largest:e}");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A fresh checkpointer under `Policy::Memory(b)`, `b` the smallest budget a probe of the same
/// chain reports: with skip connections its profiling steps can hold more than a schedule that
/// records more (as the docs of `Policy::Memory` say), by what the probe's least-memory schedule
/// held; the planned steps after them, and a checkpointer given the probe's costs, hold `b`.
/// Found (fresh gradients, R=64, W=32): `L` smallest 86080 B, profiling steps 90176 B, planned
/// steps 81984 B; `A` smallest 73792 B, profiling steps 77888 B.
#[test]
fn with_skips_only_the_profiling_steps_may_run_over_the_smallest_budget() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let chains: [(&str, Fwd, CkptFwd); 2] = [
        ("L", Net::l_plain, Net::l_ckpt),
        ("A", Net::a_plain, Net::a_ckpt),
    ];
    let mut failures = Vec::new();
    for (name, f, c) in chains {
        let probe = probe(&pool, &net, f, c, Saving::Nothing);
        let (smallest, costs) = (probe.smallest_budget().unwrap(), probe.costs().unwrap());
        let mut fresh = Checkpointer::new(CheckpointConfig::new(Policy::Memory(smallest)));
        let mut stated = Checkpointer::new(CheckpointConfig::new(Policy::Memory(smallest)));
        stated.set_costs(costs.clone());
        for round in 0..4 {
            let got = step(&pool, &net, f, c, Some(&mut fresh));
            let kind = fresh.plan_report().unwrap().kind;
            let bound = match kind {
                PlanKind::Profiled => smallest.max(costs.least_peak),
                _ => smallest,
            };
            if got.peak > bound {
                failures.push(format!(
                    "{name} Memory({smallest}) round {round}: peak {} ({kind:?}, least {})",
                    got.peak, costs.least_peak
                ));
            }
            let got = step(&pool, &net, f, c, Some(&mut stated));
            if got.peak > smallest {
                failures.push(format!("{name} stated, round {round}: peak {}", got.peak));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The costs of `L` as a probe measures them, and its smallest budget.
fn l_costs(pool: &Pool, net: &Net) -> (ChainCosts, usize) {
    let probe = probe(pool, net, Net::l_plain, Net::l_ckpt, Saving::Nothing);
    (probe.costs().unwrap(), probe.smallest_budget().unwrap())
}

/// What a fresh `Memory(budget)` step of `L` does under `costs` stated by hand.
struct Stated {
    /// `smallest_budget()` right after `set_costs`.
    smallest: Option<usize>,
    /// The step's peak, or the panic's message.
    ran: Result<usize, String>,
}

fn under_stated(pool: &Pool, net: &Net, costs: &ChainCosts, budget: usize) -> Stated {
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
    ckpt.set_costs(costs.clone());
    let smallest = ckpt.smallest_budget();
    let ran = catch_unwind(AssertUnwindSafe(|| {
        step(pool, net, Net::l_plain, Net::l_ckpt, Some(&mut ckpt)).peak
    }))
    .map_err(|e| panic_message(&*e));
    Stated { smallest, ran }
}

/// `least_peak` stated as measured, as 0 (the docs' "not measured") and as huge (up to
/// `usize::MAX`, no overflow): at the smallest budget the step runs within it, and below it fails
/// with the documented error naming the smallest budget.
#[test]
fn a_stated_least_peak_of_zero_or_huge_keeps_the_budget_or_fails_clearly() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let (costs, smallest) = l_costs(&pool, &net);
    assert!(costs.least_peak > 0, "a profiling step measures least_peak");
    let mut failures = Vec::new();
    for least in [costs.least_peak, 0, usize::MAX / 4, usize::MAX] {
        let mut stated = costs.clone();
        stated.least_peak = least;
        for budget in [smallest, smallest + 4096, smallest - 1, smallest / 2] {
            let got = under_stated(&pool, &net, &stated, budget);
            let label = format!("least_peak {least}, budget {budget} (smallest {smallest})");
            match got.ran {
                Ok(peak) if budget < smallest || peak > budget => {
                    failures.push(format!("{label}: ran with peak {peak}"))
                }
                Ok(_) => {}
                Err(msg)
                    if budget < smallest
                        && msg.contains(&format!(
                            "smallest budget that fits is {smallest} bytes"
                        )) => {}
                Err(msg) => failures.push(format!("{label}: {msg}")),
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `least_peak` stated too small (1 byte, a tenth of the measured one), below what every
/// schedule holds by the other costs, is ignored: `smallest_budget()` is the planner's count, and
/// `Memory(b)` below it fails naming it, before anything runs. Found before the check (`L`):
/// stated 1, `smallest_budget()` Some(1), `Memory(1)` ran the least schedule at 90176 B with no
/// error, its report predicting 1 B.
#[test]
fn a_stated_least_peak_below_what_every_schedule_holds_is_ignored() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let (costs, smallest) = l_costs(&pool, &net);
    // The planner's count (of a chain without skips, before a forward has shown them).
    let mut zero = costs.clone();
    zero.least_peak = 0;
    let counted = under_stated(&pool, &net, &zero, 1).smallest;
    let named = format!("smallest budget that fits is {smallest} bytes");
    let mut failures = Vec::new();
    for least in [1, costs.least_peak / 10] {
        let mut stated = costs.clone();
        stated.least_peak = least;
        for budget in [least, smallest / 2] {
            let got = under_stated(&pool, &net, &stated, budget);
            let line = format!(
                "least_peak {least} (measured {}), smallest_budget {:?} (counted {counted:?}), \
                 budget {budget}: {:?}",
                costs.least_peak, got.smallest, got.ran,
            );
            if got.smallest != counted || !got.ran.as_ref().is_err_and(|m| m.contains(&named)) {
                failures.push(line);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `smallest_budget()` of a checkpointer given a probe's costs by `set_costs` counts the skip
/// reads of the last forward it ran, as documented: before its first forward it counts the chain
/// without skips (found: 69696 B where the probe says 86080 B), the forward at that budget fails
/// naming the probe's figure, and from then on `smallest_budget()` is that figure, which runs.
#[test]
fn smallest_budget_after_set_costs_counts_the_skips_once_a_forward_has_run() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let (costs, smallest) = l_costs(&pool, &net);
    let mut fresh = Checkpointer::new(CheckpointConfig::new(Policy::Memory(1)));
    fresh.set_costs(costs.clone());
    let before = fresh.smallest_budget().unwrap();
    assert!(before <= smallest, "{before} vs {smallest}");
    let failed = catch_unwind(AssertUnwindSafe(|| {
        step(&pool, &net, Net::l_plain, Net::l_ckpt, Some(&mut fresh))
    }));
    let msg = panic_message(&*failed.err().expect("Memory(1) fails"));
    assert!(
        msg.contains(&format!("smallest budget that fits is {smallest} bytes")),
        "{msg}"
    );
    assert_eq!(fresh.smallest_budget(), Some(smallest));
    let got = under_stated(&pool, &net, &costs, smallest);
    assert!(
        got.ran.as_ref().is_ok_and(|&p| p <= smallest),
        "{:?}",
        got.ran
    );
}

/// Two threads at once on one pool, each with its own checkpointers running `E` (and `G`) under
/// `Policy::Memory` (the least schedule's peak, and a budget halfway to the plain peak) and under
/// `Sqrt`: the gradients equal the unannotated step's bit for bit, and each thread's measured peak
/// (the report's, counted on its thread) is within its budget and below a planned step's
/// predicted peak (printed beside the peak of the same step alone: the plans follow measured
/// times, which the other thread changes, so the two can differ).
#[test]
fn skip_chains_on_two_threads_keep_their_budgets_and_gradients() {
    let mut failures = Vec::new();
    for (f, c) in [
        (Net::e_plain as Fwd, Net::e_ckpt as CkptFwd),
        (Net::g_plain, Net::g_ckpt),
    ] {
        failures.extend(on_two_threads(f, c));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn on_two_threads(f: Fwd, c: CkptFwd) -> Vec<String> {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let plain = step(&pool, &net, f, c, None);
    let probe = probe(&pool, &net, f, c, Saving::Nothing);
    let lo = probe
        .smallest_budget()
        .unwrap()
        .max(probe.costs().unwrap().least_peak);
    let budgets = [lo, (lo + plain.peak.max(lo)) / 2];
    // The same steps alone: the measured peak of each round.
    let alone: Vec<Vec<usize>> = budgets
        .iter()
        .map(|&b| {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(b)));
            (0..5)
                .map(|_| {
                    step(&pool, &net, f, c, Some(&mut ckpt));
                    ckpt.plan_report().unwrap().measured.unwrap().1
                })
                .collect()
        })
        .collect();
    let results: Vec<Vec<String>> = std::thread::scope(|t| {
        let handles: Vec<_> = budgets
            .iter()
            .zip(&alone)
            .map(|(&budget, alone)| {
                let (pool, net, plain) = (&pool, &net, &plain);
                t.spawn(move || {
                    let mut out = Vec::new();
                    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
                    let mut sqrt = Checkpointer::new(CheckpointConfig::new(Policy::Sqrt));
                    for (round, &alone) in alone.iter().enumerate() {
                        let label = format!("Memory({budget}) round {round}");
                        let got = step(pool, net, f, c, Some(&mut ckpt));
                        out.extend(diffs(&label, &got, plain));
                        let report = ckpt.plan_report().unwrap();
                        let (_, measured) = report.measured.unwrap();
                        // The plan follows measured times, which another thread changes: the
                        // peak need not equal the one alone, only keep the budget.
                        if measured > budget {
                            out.push(format!("{label}: peak {measured}, alone {alone}\n{report}"));
                        }
                        if let Some(pred) = report.predicted_peak {
                            if measured > pred {
                                out.push(format!(
                                    "{label}: {measured} > predicted {pred}\n{report}"
                                ));
                            }
                        }
                        let got = step(pool, net, f, c, Some(&mut sqrt));
                        out.extend(diffs(&format!("Sqrt round {round}"), &got, plain));
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    results.into_iter().flatten().collect()
}

/// `C` with infinities in the skip value `a` (finite loss and gradients) and with a NaN in it (NaN
/// gradients): under every policy, either the documented `BadValue` panic where a stored input
/// holds them, or the loss and every gradient of the unannotated forward, bit for bit, NaN for
/// NaN; the policies that store only the chain's input never refuse.
#[test]
fn infinities_and_nans_in_a_skip_value_give_the_plain_gradients() {
    let pool = Pool::with_max_memory_mb(256);
    let mut failures = Vec::new();
    let mut refused = Vec::new();
    let (f, c): (Fwd, CkptFwd) = (Net::c_plain, Net::c_ckpt);
    for (label, bad) in [
        ("inf", vec![f32::INFINITY, 0.0, f32::NEG_INFINITY]),
        ("nan", vec![0.0, f32::NAN]),
    ] {
        let net = Net::new(&pool, &bad);
        let plain = step(&pool, &net, f, c, None);
        let finite = plain
            .grads
            .iter()
            .flatten()
            .flatten()
            .all(|g| g.is_finite());
        assert_eq!(
            finite,
            label == "inf",
            "{label}: the plain gradients' finiteness"
        );
        let mut policies = count_policies(5, R * W * 4);
        policies.push(Policy::Memory(1 << 40));
        for policy in policies {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            for round in 0..3 {
                let got = catch_unwind(AssertUnwindSafe(|| {
                    step(&pool, &net, f, c, Some(&mut ckpt))
                }));
                match got {
                    Ok(got) => failures.extend(diffs(
                        &format!("{label} {policy:?} round {round}"),
                        &got,
                        &plain,
                    )),
                    Err(e) => {
                        let msg = panic_message(&*e);
                        let only_input = matches!(&policy, Policy::Explicit(v) if v.is_empty())
                            || matches!(policy, Policy::Every(5) | Policy::Memory(_));
                        if msg.contains("cannot be stored") && !only_input {
                            refused.push(format!("{label} {policy:?}"));
                        } else {
                            failures.push(format!("{label} {policy:?} round {round}: {msg}"));
                        }
                        break;
                    }
                }
            }
        }
    }
    println!("refused (BadValue): {refused:?}");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `plan_report` at budgets from the smallest (of the saving in force) to past the plain peak,
/// fresh gradients, with `Saving::Nothing` and `Saving::Products`, on `E` and `A`: a planned step's
/// measured peak is at most its predicted peak, which is at most the budget; a planned or least
/// step is within the budget; the taped steps are as many as `last_backward` replayed, and the
/// gradients are the plain ones.
#[test]
fn the_plan_report_bounds_the_peak_and_counts_the_replays() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool, &[]);
    let mut failures = Vec::new();
    let mut kinds = Vec::new();
    let chains: [(&str, Fwd, CkptFwd, usize); 3] = [
        ("E", Net::e_plain, Net::e_ckpt, 5),
        ("A", Net::a_plain, Net::a_ckpt, 5),
        ("G", Net::g_plain, Net::g_ckpt, 11),
    ];
    for (name, f, c, steps) in chains {
        let plain = step(&pool, &net, f, c, None);
        for saving in [Saving::Nothing, Saving::Products] {
            let probe = probe(&pool, &net, f, c, saving);
            let smallest = probe.smallest_budget().unwrap();
            let hi = plain.peak.max(smallest) + 4096;
            for k in 0..=6 {
                let budget = smallest + (hi - smallest) * k / 6;
                let config = CheckpointConfig::new(Policy::Memory(budget)).with_saving(saving);
                let mut ckpt = Checkpointer::new(config);
                for round in 0..4 {
                    let label = format!("{name} {saving:?} budget {budget} round {round}");
                    let got = catch_unwind(AssertUnwindSafe(|| {
                        step(&pool, &net, f, c, Some(&mut ckpt))
                    }));
                    let got = match got {
                        Ok(got) => got,
                        Err(e) => {
                            failures.push(format!("{label}: {}", panic_message(&*e)));
                            break;
                        }
                    };
                    failures.extend(diffs(&label, &got, &plain));
                    let report = ckpt.plan_report().unwrap();
                    let (_, measured) = report.measured.unwrap();
                    kinds.push((
                        name,
                        budget,
                        round,
                        report.kind,
                        report.predicted_peak,
                        measured,
                    ));
                    if measured != got.peak {
                        failures.push(format!("{label}: report {measured}, pool {}", got.peak));
                    }
                    if report.kind != PlanKind::Profiled && measured > budget {
                        failures.push(format!("{label}: {measured} over the budget\n{report}"));
                    }
                    if report.kind == PlanKind::Planned {
                        let pred = report.predicted_peak.unwrap();
                        if measured > pred || pred > budget {
                            failures.push(format!(
                                "{label}: measured {measured}, predicted {pred}\n{report}"
                            ));
                        }
                    }
                    let taped = report
                        .steps
                        .iter()
                        .filter(|s| matches!(s, StepRun::Taped { .. }))
                        .count();
                    let replayed = ckpt.last_backward().map_or(0, |r| r.replayed_steps);
                    if taped != replayed || report.steps.len() != steps {
                        failures.push(format!(
                            "{label}: {} steps reported, {taped} taped; the backward replayed {replayed}\n{report}",
                            report.steps.len()
                        ));
                    }
                }
            }
        }
    }
    println!("{kinds:?}");
    assert!(failures.is_empty(), "{failures:#?}");
}
