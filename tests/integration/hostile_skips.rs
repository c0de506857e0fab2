//! Hostile checks of skip connections in `#[checkpoint]` let sequences: odd shapes of sequences
//! (skips from the input, a value read by many lets or twice in one, shadowed names, `let mut`,
//! annotated lets, reads hidden in closures and macros, a let that skips the one before it, a tail
//! that is not a let, a weight shared by several steps) against the same function without the
//! attribute under every policy, for three steps each; `Policy::Memory` budgets around the smallest
//! one; and panics inside a step, in the forward and in the backward's replay, not leaking pool
//! memory.

// Reads hidden in a closure called at once and in a `vec!` are what two of the sequences test.
#![allow(clippy::redundant_closure_call, clippy::useless_vec)]

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Parameters, Policy};

use crate::checkpoint_memory::kept_step;

const W: usize = 8;
const SHAPE: [usize; 2] = [4, W];

pub(crate) fn weight(pool: &Pool, rows: usize, cols: usize, seed: u64) -> Param {
    pool.scope(|s| (s.randn::<f32>(&[rows, cols], seed) * (1.0 / (rows as f32).sqrt())).detach())
}

#[derive(Parameters)]
struct Net {
    w: Vec<Param>,
    /// A `[2W, W]` weight for concatenations.
    cat: Param,
    emb: Param,
    /// The input, when a step reads it as a parameter (its gradient: the chain input's).
    inp: Param,
    /// Counts the calls of `Net::maybe_panic`; it panics at call `panic_at` (0: never).
    #[param(skip)]
    calls: Cell<usize>,
    #[param(skip)]
    panic_at: Cell<usize>,
}

macro_rules! add {
    ($a:expr, $b:expr) => {
        &$a + &$b
    };
}

impl Net {
    fn new(pool: &Pool) -> Self {
        Net {
            w: (0..8).map(|i| weight(pool, W, W, 40 + i)).collect(),
            cat: weight(pool, 2 * W, W, 60),
            emb: weight(pool, SHAPE[0], W, 61),
            inp: weight(pool, SHAPE[0], W, 62),
            calls: Cell::new(0),
            panic_at: Cell::new(0),
        }
    }

    fn maybe_panic<'a>(&self, t: Tensor<'a>) -> Tensor<'a> {
        let n = self.calls.get() + 1;
        self.calls.set(n);
        if n == self.panic_at.get() {
            panic!("hostile panic at call {n}");
        }
        t
    }

    // A: skips from the input (read by many lets, by the last one), a value read twice in one let.
    fn a_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = (a.matmul(&w[1]) + &h).tanh();
        let c = (&b * &a + &a).matmul(&w[2]).tanh();
        let d = (c.matmul(&w[3]) + &h + &a).tanh();
        (d + &h).matmul(&w[4])
    }

    #[checkpoint]
    fn a_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = (a.matmul(&w[1]) + &h).tanh();
        let c = (&b * &a + &a).matmul(&w[2]).tanh();
        let d = (c.matmul(&w[3]) + &h + &a).tanh();
        let out = (d + &h).matmul(&w[4]);
        out
    }

    // B: shadowed names: the later reads of `h` are of the second `h`.
    fn b_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let h = (a.matmul(&w[1]) + &h).tanh();
        let b = h.matmul(&w[2]).tanh();
        let c = (b.matmul(&w[3]) + &h).tanh();
        let h = (c + &a).matmul(&w[4]).tanh();
        (h.matmul(&w[5]) + &b).tanh()
    }

    #[checkpoint]
    fn b_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let h = (a.matmul(&w[1]) + &h).tanh();
        let b = h.matmul(&w[2]).tanh();
        let c = (b.matmul(&w[3]) + &h).tanh();
        let h = (c + &a).matmul(&w[4]).tanh();
        let h = (h.matmul(&w[5]) + &b).tanh();
        h
    }

    // C: `let mut`, annotated lets, reads inside a closure, `vec!` and a local macro.
    fn c_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b: Tensor<'_> = a.matmul(&w[1]).tanh();
        let c = Tensor::concat(&vec![&b, &h], 1).matmul(&self.cat).tanh();
        let d = [&a, &b].iter().fold(c.clone(), |acc, t| &acc + *t).tanh();
        let e = add!(d, a).matmul(&w[2]).tanh();
        let f = (|| &e * &h)().matmul(&w[3]);
        f
    }

    #[checkpoint]
    #[allow(unused_mut)]
    fn c_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let mut h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b: Tensor<'_> = a.matmul(&w[1]).tanh();
        let mut c = Tensor::concat(&vec![&b, &h], 1).matmul(&self.cat).tanh();
        let d = [&a, &b].iter().fold(c.clone(), |acc, t| &acc + *t).tanh();
        let e = add!(d, a).matmul(&w[2]).tanh();
        let f = (|| &e * &h)().matmul(&w[3]);
        f
    }

    // D: a let that does not read the one right before it (`c` reads `a`, not `b`), and a tail
    // expression that is not a let (reading the last let and the input).
    fn d_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = (a.matmul(&w[2]) + &b).tanh();
        let d = (c + &b).matmul(&w[3]).tanh();
        let e = d.matmul(&w[4]).tanh();
        (e + &h).matmul(&w[5])
    }

    fn d2_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = a.matmul(&w[2]).tanh();
        let d = (c + &b).matmul(&w[3]).tanh();
        let e = d.matmul(&w[4]).tanh();
        (e + &h).matmul(&w[5])
    }

    #[checkpoint]
    fn d_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = (a.matmul(&w[2]) + &b).tanh();
        let d = (c + &b).matmul(&w[3]).tanh();
        let e = d.matmul(&w[4]).tanh();
        (e + &h).matmul(&w[5])
    }

    // D2: `c` does not read `b`, so the sequence the function ends with starts at `c`: `h`, `a`
    // and `b` are values from before the region, each read by one step.
    #[checkpoint]
    fn d2_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = a.matmul(&w[2]).tanh();
        let d = (c + &b).matmul(&w[3]).tanh();
        let e = d.matmul(&w[4]).tanh();
        let out = (e + &h).matmul(&w[5]);
        out
    }

    // E: one weight read by every step and a value from before the sequence (`t`) read by
    // several: equal up to the sums' rounding.
    fn e_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w[0];
        let t = x.bind(&self.emb).tanh();
        let h = x.tanh();
        let a = (h.matmul(w) + &t).tanh();
        let b = (a.matmul(w) + &h).tanh();
        let c = (b.matmul(w) + &t + &a).tanh();
        let d = (c.matmul(w) + &t).tanh();
        d.matmul(w)
    }

    #[checkpoint]
    fn e_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w[0];
        let t = x.bind(&self.emb).tanh();
        let h = x.tanh();
        let a = (h.matmul(w) + &t).tanh();
        let b = (a.matmul(w) + &h).tanh();
        let c = (b.matmul(w) + &t + &a).tanh();
        let d = (c.matmul(w) + &t).tanh();
        let out = d.matmul(w);
        out
    }

    // T1: `a` read by the next let and twice by the one after it.
    fn t1_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = (&b * &a + &a).matmul(&w[2]).tanh();
        c.matmul(&w[3])
    }

    #[checkpoint]
    fn t1_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = (&b * &a + &a).matmul(&w[2]).tanh();
        let out = c.matmul(&w[3]);
        out
    }

    // T2: the let before read twice by the next (no skip).
    fn t2_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = (a.matmul(&w[1]) * &a + &a).tanh();
        let c = b.matmul(&w[2]).tanh();
        c.matmul(&w[3])
    }

    #[checkpoint]
    fn t2_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = (a.matmul(&w[1]) * &a + &a).tanh();
        let c = b.matmul(&w[2]).tanh();
        let out = c.matmul(&w[3]);
        out
    }

    // M3: `a` read once each by three later lets.
    fn m3_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = (b.matmul(&w[2]) + &a).tanh();
        let d = (c.matmul(&w[3]) + &a).tanh();
        d.matmul(&w[4])
    }

    #[checkpoint]
    fn m3_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = a.matmul(&w[1]).tanh();
        let c = (b.matmul(&w[2]) + &a).tanh();
        let d = (c.matmul(&w[3]) + &a).tanh();
        let out = d.matmul(&w[4]);
        out
    }

    // DN: the docs' DenseNet pattern (every step reads every earlier one).
    fn dn_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let a = x.tanh();
        let b = a.matmul(&w[0]).tanh();
        let c = (&b + &a).matmul(&w[1]).tanh();
        let d = (&c + &b + &a).matmul(&w[2]).tanh();
        (&d + &c + &b + &a).matmul(&w[3]).tanh()
    }

    #[checkpoint]
    fn dn_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let a = x.tanh();
        let b = a.matmul(&w[0]).tanh();
        let c = (&b + &a).matmul(&w[1]).tanh();
        let d = (&c + &b + &a).matmul(&w[2]).tanh();
        let e = (&d + &c + &b + &a).matmul(&w[3]).tanh();
        e
    }

    // F: a layer that may panic (in the forward, or in the backward's replay of it), with skips.
    fn f_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = self.maybe_panic((a.matmul(&w[1]) + &h).tanh());
        let c = (b.matmul(&w[2]) + &a).tanh();
        let d = (c.matmul(&w[3]) + &h).tanh();
        d.matmul(&w[4])
    }

    #[checkpoint]
    fn f_ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let a = h.matmul(&w[0]).tanh();
        let b = self.maybe_panic((a.matmul(&w[1]) + &h).tanh());
        let c = (b.matmul(&w[2]) + &a).tanh();
        let d = (c.matmul(&w[3]) + &h).tanh();
        let out = d.matmul(&w[4]);
        out
    }
}

type Fwd = for<'n, 'a> fn(&'n Net, Tensor<'a>) -> Tensor<'a>;
type CkptFwd = for<'n, 'c, 'a> fn(&'n Net, &'c mut Checkpointer, Tensor<'a>) -> Tensor<'a>;

fn chains() -> Vec<(&'static str, Fwd, CkptFwd, usize)> {
    vec![
        ("b", Net::b_plain, Net::b_ckpt, 6),
        ("c", Net::c_plain, Net::c_ckpt, 6),
        ("d", Net::d_plain, Net::d_ckpt, 5),
        ("d2", Net::d2_plain, Net::d2_ckpt, 3),
        ("f", Net::f_plain, Net::f_ckpt, 5),
        ("t1", Net::t1_plain, Net::t1_ckpt, 4),
        ("t2", Net::t2_plain, Net::t2_ckpt, 4),
    ]
}

fn policies(steps: usize) -> Vec<Policy> {
    let act = SHAPE[0] * W * 4;
    vec![
        Policy::Every(1),
        Policy::Every(2),
        Policy::Every(3),
        Policy::Every(steps),
        Policy::Sqrt,
        Policy::Explicit(vec![1]),
        Policy::Explicit((1..steps).step_by(2).collect()),
        Policy::Explicit(vec![]),
        Policy::Budget(act),
        Policy::Budget(2 * act),
        Policy::Budget(4 * act),
        Policy::Memory(64 << 20),
        Policy::Memory(24 << 10),
        Policy::Memory(12 << 10),
        Policy::Memory(8 << 10),
    ]
}

/// The loss's bits and the gradient of each of `net`'s parameters (`None`: not read), of one
/// step from the input `randn(SHAPE, 3)` against the target `randn(.., 4)`.
fn run(
    pool: &Pool,
    net: &Net,
    f: Fwd,
    c: CkptFwd,
    ckpt: Option<&mut Checkpointer>,
) -> (u32, Vec<Option<Vec<f32>>>) {
    run_from(pool, net, f, c, ckpt, false)
}

/// `run`, from `net.inp` (its gradient is the chain input's) when `bound`.
fn run_from(
    pool: &Pool,
    net: &Net,
    f: Fwd,
    c: CkptFwd,
    ckpt: Option<&mut Checkpointer>,
    bound: bool,
) -> (u32, Vec<Option<Vec<f32>>>) {
    pool.train(|s| {
        let x = match bound {
            true => s.bind(&net.inp) * 1.0,
            false => s.randn::<f32>(&SHAPE, 3),
        };
        let y = match ckpt {
            Some(ckpt) => c(net, ckpt, x),
            None => f(net, x),
        };
        let loss = y.mse(&s.randn::<f32>(y.shape(), 4));
        let grads = loss.backward().unwrap();
        let mut all = Vec::new();
        net.visit_params(&ParamPath::ROOT, &mut |_, p| {
            all.push(grads.get(p).map(|g| g.to_vec()))
        });
        assert_eq!(grads.len(), all.iter().flatten().count());
        assert!(
            all.iter().flatten().count() >= 2,
            "gradients of the weights read"
        );
        (loss.item().to_bits(), all)
    })
}

pub(crate) fn is_budget_error(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    let msg = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))?;
    Some(msg)
}

/// Every odd sequence: the loss and every gradient bit for bit under every policy, three steps
/// each. A `Policy::Memory` budget below the smallest one may panic (the documented error), and
/// then must name the budget; the rest must match.
#[test]
fn odd_sequences_give_the_plain_gradients_under_every_policy() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool);
    let mut failures = Vec::new();
    for (name, f, c, steps) in chains() {
        let plain = run(&pool, &net, f, c, None);
        // No checkpointer: as written.
        assert!(run(&pool, &net, f, c, None) == plain, "{name}: plain twice");
        for policy in policies(steps) {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            for round in 0..3 {
                let got =
                    catch_unwind(AssertUnwindSafe(|| run(&pool, &net, f, c, Some(&mut ckpt))));
                match got {
                    Ok(got) => {
                        if got.0 != plain.0 {
                            failures.push(format!("{name} {policy:?} round {round}: loss"));
                        }
                        for (i, (g, want)) in got.1.iter().zip(&plain.1).enumerate() {
                            if g != want {
                                let diff = match (g, want) {
                                    (Some(g), Some(w)) => g
                                        .iter()
                                        .zip(w)
                                        .map(|(a, b)| (a - b).abs())
                                        .fold(0f32, f32::max),
                                    _ => f32::NAN,
                                };
                                failures.push(format!(
                                    "{name} {policy:?} round {round}: gradient {i}, max |diff| {diff:e}"
                                ));
                            }
                        }
                    }
                    Err(e) => {
                        let msg = is_budget_error(&*e).unwrap_or_default();
                        let budget_error = matches!(policy, Policy::Memory(b) if b < (64 << 20))
                            && msg.to_lowercase().contains("budget");
                        if !budget_error {
                            failures.push(format!("{name} {policy:?} round {round}: panic {msg}"));
                        }
                        break;
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A weight read by every step and a value from before the sequence read by several: within
/// `2 sqrt(steps)` units of `f32` precision of the largest gradient element.
#[test]
fn a_shared_weight_and_an_outer_value_differ_by_rounding_only() {
    let pool = Pool::with_max_memory_mb(256);
    let net = Net::new(&pool);
    let (f, c): (Fwd, CkptFwd) = (Net::e_plain, Net::e_ckpt);
    let plain = run(&pool, &net, f, c, None);
    let steps = 5;
    for policy in policies(steps) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        for round in 0..3 {
            let got = run(&pool, &net, f, c, Some(&mut ckpt));
            assert_eq!(got.0, plain.0, "{policy:?} round {round}: loss");
            for (i, (g, want)) in got.1.iter().zip(&plain.1).enumerate() {
                assert_eq!(g.is_some(), want.is_some(), "{policy:?}: gradient {i}");
                let (Some(g), Some(want)) = (g, want) else {
                    continue;
                };
                let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                let tol = 2.0 * (steps as f32).sqrt() * f32::EPSILON * max;
                for (j, (x, y)) in g.iter().zip(want).enumerate() {
                    assert!(
                        (x - y).abs() <= tol,
                        "{policy:?} round {round}: gradient {i}[{j}] {x} vs {y} (tol {tol})"
                    );
                }
            }
        }
    }
}

/// Inference: the checkpointed output equals the plain one under every policy.
#[test]
fn odd_sequences_in_inference_give_the_plain_output() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    for (name, f, c, steps) in chains() {
        let plain = pool.scope(|s| f(&net, s.randn::<f32>(&SHAPE, 3)).to_vec());
        for policy in policies(steps) {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            for _ in 0..2 {
                let got = pool.scope(|s| c(&net, &mut ckpt, s.randn::<f32>(&SHAPE, 3)).to_vec());
                assert_eq!(got, plain, "{name} {policy:?}");
            }
        }
    }
}

/// A wide ladder with skips from the input read by every up step.
#[derive(Parameters)]
struct Wide {
    w: Vec<Param>,
}

impl Wide {
    fn plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = d2.matmul(&w[2]).tanh();
        let u3 = (d3.matmul(&w[3]) + &h + &d1).tanh();
        let u2 = (u3.matmul(&w[4]) + &h + &d2).tanh();
        let u1 = (u2.matmul(&w[5]) + &h + &d1).tanh();
        u1.matmul(&w[6])
    }

    #[checkpoint]
    fn ckpt<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = d2.matmul(&w[2]).tanh();
        let u3 = (d3.matmul(&w[3]) + &h + &d1).tanh();
        let u2 = (u3.matmul(&w[4]) + &h + &d2).tanh();
        let u1 = (u2.matmul(&w[5]) + &h + &d1).tanh();
        let out = u1.matmul(&w[6]);
        out
    }
}

/// `Policy::Memory(b)`: at and above the smallest budget the step's peak is within `b` (three
/// steps each, fresh and kept gradients); below it, the documented error, never an overrun.
#[test]
fn memory_budgets_around_the_smallest_hold_or_fail_loudly() {
    let pool = Pool::with_max_memory_mb(512);
    let wide = Wide {
        w: (0..7).map(|i| weight(&pool, 64, 64, 80 + i)).collect(),
    };
    let params: Vec<Param> = wide.named_params().into_iter().map(|(_, p)| p).collect();
    let params: Vec<&Param> = params.iter().collect();
    let step = |ckpt: Option<&mut Checkpointer>| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[128, 64], 3);
            let target = s.randn::<f32>(&[128, 64], 4);
            let mut grads = None;
            let loss = |ckpt: Option<&mut Checkpointer>| {
                let y = match ckpt {
                    Some(ckpt) => wide.ckpt(ckpt, x.clone()),
                    None => wide.plain(x.clone()),
                };
                y.mse(&target)
            };
            kept_step(&pool, &mut grads, loss, None, &params);
            grads.as_mut().unwrap().zero().unwrap();
            kept_step(&pool, &mut grads, loss, ckpt, &params)
        })
    };
    let (plain, plain_peak) = step(None);
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(64 << 20)));
    for _ in 0..2 {
        let (grads, _) = step(Some(&mut probe));
        assert!(grads == plain, "the profiling step's gradients");
    }
    let smallest = probe.smallest_budget().expect("costs after profiling");
    println!("wide: smallest {smallest} B, plain {plain_peak} B");
    let plain_peak = plain_peak.max(smallest + 8192);
    let mut report = Vec::new();
    for budget in [
        smallest,
        smallest + 1,
        smallest + 4096,
        smallest + (plain_peak - smallest) / 2,
        plain_peak,
    ] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        for round in 0..3 {
            let (grads, peak) = step(Some(&mut ckpt));
            assert!(grads == plain, "budget {budget} round {round}: gradients");
            report.push((budget, round, peak));
            assert!(
                peak <= budget,
                "budget {budget} (smallest {smallest}, plain {plain_peak}) round {round}: peak {peak}; {report:?}"
            );
        }
    }
    for budget in [smallest - 1, smallest / 2] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        let mut failed = false;
        for round in 0..3 {
            let start = pool.stats().bytes_in_use;
            match catch_unwind(AssertUnwindSafe(|| step(Some(&mut ckpt)))) {
                Ok((grads, peak)) => {
                    assert!(grads == plain, "budget {budget} round {round}: gradients");
                    // The profiling step (round 0) holds the least memory a schedule can; the
                    // error comes before the next step.
                    assert!(
                        round == 0 && peak <= smallest,
                        "below the smallest {smallest}: budget {budget} round {round} ran with peak {peak}"
                    );
                }
                Err(e) => {
                    let msg = is_budget_error(&*e).unwrap_or_default();
                    assert!(
                        msg.contains(&format!("{smallest} bytes")),
                        "budget {budget}: {msg}"
                    );
                    assert_eq!(pool.stats().bytes_in_use, start, "budget {budget}: leaked");
                    failed = true;
                }
            }
        }
        assert!(
            failed,
            "budget {budget} below the smallest {smallest} never failed"
        );
    }
}

/// One step of `wide` with fresh gradients (`backward()`, made inside the step): the gradients
/// and the pool's peak above the checkpointed forward's start (the step's start without one).
fn fresh_step(pool: &Pool, wide: &Wide, ckpt: Option<&mut Checkpointer>) -> (Vec<Vec<f32>>, usize) {
    let params: Vec<Param> = wide.named_params().into_iter().map(|(_, p)| p).collect();
    pool.train(|s| {
        let x = s.randn::<f32>(&[128, 64], 5);
        let target = s.randn::<f32>(&[128, 64], 6);
        let mut start = pool.stats().bytes_in_use;
        pool.reset_peak();
        let y = match ckpt {
            Some(ckpt) => {
                let y = wide.ckpt(ckpt, x);
                start = ckpt.forward_start_bytes();
                y
            }
            None => wide.plain(x),
        };
        let grads = y.mse(&target).backward().unwrap();
        let peak = pool.stats().peak_bytes_in_use - start;
        let all: Vec<Vec<f32>> = params
            .iter()
            .map(|p| grads.get(p).unwrap().to_vec())
            .collect();
        (all, peak)
    })
}

/// `Policy::Memory(b)` with fresh gradients each step: at and above the smallest budget after the
/// profiling steps, every step's peak above the forward's start is within `b`.
#[test]
fn memory_budgets_hold_with_fresh_gradients() {
    let pool = Pool::with_max_memory_mb(512);
    let wide = Wide {
        w: (0..7).map(|i| weight(&pool, 64, 64, 90 + i)).collect(),
    };
    let step = |ckpt: Option<&mut Checkpointer>| fresh_step(&pool, &wide, ckpt);
    let (plain, plain_peak) = step(None);
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(64 << 20)));
    for _ in 0..3 {
        assert!(
            step(Some(&mut probe)).0 == plain,
            "the profiling steps' gradients"
        );
    }
    let smallest = probe.smallest_budget().expect("costs after profiling");
    println!("wide, fresh gradients: smallest {smallest} B, plain {plain_peak} B");
    let mut seen = Vec::new();
    for budget in [
        smallest,
        smallest + 2048,
        smallest + smallest / 4,
        2 * smallest,
    ] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        ckpt.set_costs(probe.costs().unwrap());
        for round in 0..3 {
            let (grads, peak) = step(Some(&mut ckpt));
            seen.push((budget, round, peak));
            assert!(grads == plain, "budget {budget} round {round}: gradients");
            assert!(
                peak <= budget,
                "budget {budget} round {round}: peak {peak}; {seen:?}"
            );
            // With skip reads too, the plan's predicted peak bounds the measured one.
            let report = ckpt.plan_report().unwrap();
            let (_, measured) = report.measured.unwrap();
            let predicted = report.predicted_peak.unwrap();
            assert!(
                measured <= predicted && predicted <= budget,
                "budget {budget} round {round}: measured {measured}\n{report}"
            );
        }
    }
}

/// The smallest `Policy::Memory` budget of a chain with skips, against the peak of the same step
/// without the attribute and under count policies. Found (fresh gradients, `Wide`): smallest
/// 426048 B; the unannotated step 327744 B, `Every(7)` (one segment) 327744 B, `Sqrt` 376896 B,
/// `Every(1)` and `Every(2)` 426048 B. Since: a schedule that records every step is planned
/// without the skips' reserve, and the least-memory schedule's measured peak counts: smallest
/// 376896 B, `Every(1)`, `Every(2)` and `Sqrt` 376896 B, the plain step and `Every(7)` still
/// 327744 B (every value of this chain is read to its end, so nothing can be let go; the
/// planner's count of the plain step is above its measured peak here: open).
#[test]
#[ignore = "finding, open: with skips, Policy::Memory's smallest budget (376896 B) is above the \
            peaks of the unannotated step and of Every(7) (327744 B)"]
fn finding_the_smallest_memory_budget_is_within_the_plain_peak() {
    let pool = Pool::with_max_memory_mb(512);
    let wide = Wide {
        w: (0..7).map(|i| weight(&pool, 64, 64, 90 + i)).collect(),
    };
    let (plain, plain_peak) = fresh_step(&pool, &wide, None);
    let mut peaks = Vec::new();
    for policy in [
        Policy::Every(1),
        Policy::Every(2),
        Policy::Sqrt,
        Policy::Every(7),
    ] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let (grads, peak) = fresh_step(&pool, &wide, Some(&mut ckpt));
        assert!(grads == plain, "{policy:?}");
        peaks.push((policy, peak));
    }
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(64 << 20)));
    for _ in 0..3 {
        assert!(fresh_step(&pool, &wide, Some(&mut probe)).0 == plain);
    }
    let smallest = probe.smallest_budget().unwrap();
    assert!(
        smallest <= plain_peak,
        "smallest {smallest} B, plain {plain_peak} B, count policies {peaks:?}"
    );
}

/// A panic in a layer, in the forward or in the backward's replay of it, unwinds without leaking
/// the pool's memory, and the checkpointer gives the plain gradients after it.
#[test]
fn panics_in_a_layer_with_skips_do_not_leak() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let (f, c): (Fwd, CkptFwd) = (Net::f_plain, Net::f_ckpt);
    let plain = run(&pool, &net, f, c, None);
    let base = pool.stats().bytes_in_use;
    // The control: a panic in the unannotated forward.
    net.calls.set(0);
    net.panic_at.set(1);
    assert!(catch_unwind(AssertUnwindSafe(|| run(&pool, &net, f, c, None))).is_err());
    net.panic_at.set(0);
    assert_eq!(pool.stats().bytes_in_use, base, "the plain forward's panic");
    let mut leaks = Vec::new();
    for policy in [
        Policy::Every(1),
        Policy::Every(2),
        Policy::Sqrt,
        Policy::Budget(SHAPE[0] * W * 4),
        Policy::Memory(64 << 20),
    ] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        // Warm up (Memory profiles), then count the layer's calls of a step.
        for _ in 0..2 {
            assert!(
                run(&pool, &net, f, c, Some(&mut ckpt)) == plain,
                "{policy:?}"
            );
        }
        net.calls.set(0);
        assert!(
            run(&pool, &net, f, c, Some(&mut ckpt)) == plain,
            "{policy:?}"
        );
        let per_step = net.calls.get();
        assert!(per_step >= 1, "{policy:?}");
        // Panic at each call of a step: the forward's, then the replays'.
        for at in 1..=per_step {
            let start = pool.stats().bytes_in_use;
            net.calls.set(0);
            net.panic_at.set(at);
            let got = catch_unwind(AssertUnwindSafe(|| run(&pool, &net, f, c, Some(&mut ckpt))));
            net.panic_at.set(0);
            let e = got.expect_err("the layer panicked");
            let msg = is_budget_error(&*e).unwrap_or_default();
            assert!(msg.contains("hostile panic"), "{policy:?} at {at}: {msg}");
            let after_panic = pool.stats().bytes_in_use;
            net.calls.set(0);
            let again = run(&pool, &net, f, c, Some(&mut ckpt));
            assert!(again == plain, "{policy:?}: after a panic at call {at}");
            let after_next = pool.stats().bytes_in_use;
            // At the unwind itself, see `finding_a_panicked_step_gives_its_pool_memory_back_at_the_unwind`.
            let _ = after_panic;
            if after_next != start {
                leaks.push(format!(
                    "{policy:?}, panic at call {at} of {per_step}: {start} B before, {after_panic} B \
                     after the unwind, {after_next} B after the next step"
                ));
            }
        }
        let before_drop = pool.stats().bytes_in_use;
        drop(ckpt);
        if pool.stats().bytes_in_use != base {
            leaks.push(format!(
                "{policy:?}: {base} B at the start, {before_drop} B before dropping the checkpointer, {} B after",
                pool.stats().bytes_in_use
            ));
        }
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// The gradients of one chain under one policy (three steps) against the plain ones: the
/// differences found, with the largest element difference.
fn mismatches(
    pool: &Pool,
    net: &Net,
    f: Fwd,
    c: CkptFwd,
    policy: Policy,
    bound: bool,
) -> Vec<String> {
    let plain = run_from(pool, net, f, c, None, bound);
    assert!(
        run_from(pool, net, f, c, None, bound) == plain,
        "the plain step is deterministic"
    );
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
    let mut out = Vec::new();
    for round in 0..3 {
        let got = run_from(pool, net, f, c, Some(&mut ckpt), bound);
        if got.0 != plain.0 {
            out.push(format!("{policy:?} round {round}: loss"));
        }
        for (i, (g, want)) in got.1.iter().zip(&plain.1).enumerate() {
            if g != want {
                let diff = match (g, want) {
                    (Some(g), Some(w)) => g
                        .iter()
                        .zip(w)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max),
                    _ => f32::NAN,
                };
                out.push(format!(
                    "{policy:?} round {round}: gradient {i}, max |diff| {diff:e}"
                ));
            }
        }
    }
    out
}

/// `a` is read by `b` (the next let), `c` and `d`; under `Every(3)` the segment `[a, b, c]` is
/// replayed and `d` is in the next one. Found by the review, before the seeded walks: `w[0]`'s gradient (read by `a` only) differs from
/// the plain one by about 1.5e-8 under `Every(3)`, `Sqrt` and `Explicit([1, 3])`.
#[test]
fn a_value_read_by_three_lets_across_segments_is_bit_identical() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let mut all = Vec::new();
    for policy in [Policy::Every(3), Policy::Sqrt, Policy::Explicit(vec![1, 3])] {
        all.extend(mismatches(
            &pool,
            &net,
            Net::m3_plain,
            Net::m3_ckpt,
            policy,
            false,
        ));
    }
    assert!(all.is_empty(), "{all:#?}");
}

/// `a` is read by `b`, twice by `c` (`&b * &a + &a`) and by `d`. Found by the review, before the
/// seeded walks: `w[0]`'s gradient differed
/// by about 1.5e-8 under every policy, `Every(1)` included.
#[test]
fn a_value_read_twice_in_one_let_and_by_another_is_bit_identical() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let mut all = Vec::new();
    for policy in [
        Policy::Every(1),
        Policy::Every(2),
        Policy::Budget(SHAPE[0] * W * 4),
        Policy::Memory(64 << 20),
    ] {
        all.extend(mismatches(
            &pool,
            &net,
            Net::a_plain,
            Net::a_ckpt,
            policy,
            false,
        ));
    }
    assert!(all.is_empty(), "{all:#?}");
}

/// The chain input's gradient (the input a bound parameter) when the sequence's input `h` is read
/// by several later lets, bit for bit, under every policy. Found by the review, before the seeded
/// walks: `c` (`h` read by `a`, a `concat`
/// and a closure) under `Every(3)`, `Sqrt`, and `f` (`h` read by `a`, `b`, `d`) under `Every(2)`,
/// `Every(3)`, `Sqrt`: the input's gradient differs by 3.7e-9 and 7.5e-9.
#[test]
fn the_input_gradient_of_odd_sequences_is_the_plain_one() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let mut all = Vec::new();
    for (name, f, c, steps) in chains() {
        for policy in policies(steps) {
            for m in mismatches(&pool, &net, f, c, policy, true) {
                all.push(format!("{name}: {m}"));
            }
        }
    }
    assert!(all.is_empty(), "{all:#?}");
}

/// A panic in the forward of a checkpointed step with skips: after the unwind, the pool holds what
/// it held before the step. Found by the review, before a forward that does not end let go of
/// its stored boundaries: 128-256 B more (under `Every(1)`, `Every(2)`, `Sqrt`,
/// `Budget`; not under `Memory`), given back by the checkpointer's next step.
#[test]
fn a_panicked_step_gives_its_pool_memory_back_at_the_unwind() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let (f, c): (Fwd, CkptFwd) = (Net::f_plain, Net::f_ckpt);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
    run(&pool, &net, f, c, Some(&mut ckpt));
    let start = pool.stats().bytes_in_use;
    net.calls.set(0);
    net.panic_at.set(1);
    let got = catch_unwind(AssertUnwindSafe(|| run(&pool, &net, f, c, Some(&mut ckpt))));
    net.panic_at.set(0);
    assert!(got.is_err(), "the layer panicked");
    let after = pool.stats().bytes_in_use;
    drop(ckpt);
    let dropped = pool.stats().bytes_in_use;
    assert_eq!(
        after, start,
        "after the unwind (after dropping the checkpointer: {dropped} B)"
    );
}

/// The chain input's gradient when the sequence's input is read by several later lets: the
/// other gradients bit for bit, the input's within `2 sqrt(steps)` units of `f32` precision of
/// its largest element (the bound for a value read by several steps).
#[test]
fn the_input_gradient_of_odd_sequences_is_the_plain_one_up_to_rounding() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let inp = 10;
    for (name, f, c, steps) in chains() {
        let plain = run_from(&pool, &net, f, c, None, true);
        for policy in policies(steps) {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            for round in 0..3 {
                let got = catch_unwind(AssertUnwindSafe(|| {
                    run_from(&pool, &net, f, c, Some(&mut ckpt), true)
                }));
                let Ok(got) = got else {
                    assert!(
                        matches!(policy, Policy::Memory(b) if b < (64 << 20)),
                        "{name} {policy:?}"
                    );
                    break;
                };
                assert_eq!(got.0, plain.0, "{name} {policy:?} round {round}: loss");
                for (i, (g, want)) in got.1.iter().zip(&plain.1).enumerate() {
                    if i != inp {
                        assert!(g == want, "{name} {policy:?} round {round}: gradient {i}");
                        continue;
                    }
                    let (g, want) = (g.as_ref().unwrap(), want.as_ref().unwrap());
                    let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let tol = 2.0 * (steps as f32).sqrt() * f32::EPSILON * max;
                    for (x, y) in g.iter().zip(want) {
                        assert!(
                            (x - y).abs() <= tol,
                            "{name} {policy:?}: {x} vs {y} (tol {tol})"
                        );
                    }
                }
            }
        }
    }
}

// Compile-time probes, tried once each in this module and removed (they do not compile, as they
// should not, except where noted):
// - the tail reading an inside value, `(out + &a).tanh()`, through a macro, `add!(out, a)`, or
//   a closure, `(|| &out + &b)()`: the attribute's error "`a` is a value inside the #[checkpoint]
//   sequence, which is not kept after it; ...".
// - a skip value pushed into a caller's `&mut Vec<Tensor<'a>>`, stored in a caller's
//   `&RefCell<Option<Tensor<'a>>>`, or assigned to a local declared before the sequence
//   (`let mut keep = None; .. let b = { keep = Some(a.clone()); .. };`): E0521 "borrowed data
//   escapes outside of closure" (`scope_of_each_checkpointed_segment`).
// - not a leak, but a surprise: a plain Rust `let` after the sequence that reads its last value
//   (`let n = out.shape()[0]; out * (1.0 / n as f32)`) is taken as one more layer, and the tail's
//   `out` is then rejected as "a value inside the sequence ... only the sequence's last `let`
//   (`n`)"; `let f = || &out + &b; f()` likewise becomes a layer and fails with E0308 "expected
//   `Tensor<'_>`, found closure".

/// The DenseNet chain of `checkpoint_skips.rs` (`steps_reading_several_earlier_steps_get_the_plain_gradients`,
/// copied), under the policies its test does not run. Found by the review, before the seeded
/// walks: `w[0]`'s gradient differed by
/// 7.5e-9 under `Every(3)` and `Explicit([1, 3])` (segments that put some of `b`'s readers with it
/// and some after it; `b` is read by `c`, `d` and `e`).
#[test]
fn the_docs_dense_chain_is_bit_identical_under_every_policy() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let mut all = Vec::new();
    for policy in [Policy::Every(3), Policy::Explicit(vec![1, 3])] {
        all.extend(mismatches(
            &pool,
            &net,
            Net::dn_plain,
            Net::dn_ckpt,
            policy,
            false,
        ));
    }
    assert!(all.is_empty(), "{all:#?}");
}

/// The same chain bit for bit under the other policies (three steps each).
#[test]
fn the_docs_dense_chain_is_bit_identical_under_the_other_policies() {
    let pool = Pool::with_max_memory_mb(64);
    let net = Net::new(&pool);
    let mut all = Vec::new();
    for policy in policies(4) {
        if matches!(&policy, Policy::Every(3)) || policy == Policy::Explicit(vec![1, 3]) {
            continue;
        }
        all.extend(mismatches(
            &pool,
            &net,
            Net::dn_plain,
            Net::dn_ckpt,
            policy,
            false,
        ));
    }
    assert!(all.is_empty(), "{all:#?}");
}
