//! `#[checkpoint]` in training: the backward of an annotated forward replays its layer steps from
//! the stored boundaries. Against the same forward without checkpointing, on three models (the deep
//! residual MLP, the transformer blocks of `model_forward`, the convolutional denoiser of
//! `diffusion_denoise`): the loss and every gradient bit for bit at full precision under every
//! policy, a measured error at f16/bf16, the layer steps the backward runs, and the memory a step
//! holds.

use tensorscope::checkpoint::{binomial_recompute_steps, revolve_forward_steps};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Policy, Precision};

use crate::pre_norm_mlp::Model;
use crate::{denoiser, transformer};

const WIDTH: usize = 8;
const BATCH: usize = 4;

fn model(pool: &Pool, blocks: usize) -> Model {
    Model::new(pool, blocks, WIDTH)
}

/// The loss and every parameter's gradient of one step, with `ckpt` (checkpointed) or without.
fn step(pool: &Pool, model: &Model, ckpt: Option<&mut Checkpointer>) -> (f32, Vec<Vec<f32>>) {
    pool.train(|s| {
        let x = s.randn::<f32>(&[BATCH, WIDTH], 100);
        let target = s.randn::<f32>(&[BATCH, WIDTH], 101);
        let y = match ckpt {
            Some(ckpt) => model.forward(ckpt, x),
            None => model.forward_plain(x),
        };
        let loss = y.mse(&target);
        let grads = loss.backward().unwrap();
        let mut all = Vec::new();
        model.visit_params(&ParamPath::ROOT, &mut |_, p| {
            all.push(grads.get(p).expect("a gradient").to_vec())
        });
        assert_eq!(
            grads.len(),
            all.len(),
            "a gradient for every parameter, nothing else"
        );
        (loss.item(), all)
    })
}

pub(crate) fn policies(n: usize, activation: usize) -> Vec<Policy> {
    vec![
        Policy::Every(4),
        Policy::Sqrt,
        Policy::Explicit(vec![n / 3, n / 2]),
        Policy::Budget(3 * activation),
    ]
}

#[test]
fn every_policy_gives_the_plain_gradients_bit_for_bit() {
    let pool = Pool::with_max_memory_mb(256);
    let activation = BATCH * WIDTH * 4;
    for n in [16usize, 64] {
        let model = model(&pool, n);
        let (loss, grads) = step(&pool, &model, None);
        for policy in policies(n, activation) {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            let (got_loss, got) = step(&pool, &model, Some(&mut ckpt));
            assert_eq!(got_loss.to_bits(), loss.to_bits(), "{policy:?} n={n}");
            for (i, (g, want)) in got.iter().zip(&grads).enumerate() {
                assert_eq!(g, want, "{policy:?} n={n}: gradient {i}");
            }
            let report = ckpt.last_backward().expect("the backward ran");
            // Each step replayed once, but those of the last segment, whose graph the forward
            // kept (its backward comes first); under Budget the last segment is the last step.
            let last_segment = match &policy {
                Policy::Every(k) => *k,
                Policy::Sqrt => (n as f64).sqrt().ceil() as usize,
                Policy::Explicit(at) => n - at[1],
                _ => 1,
            };
            assert_eq!(report.replayed_steps, n - last_segment, "{policy:?} n={n}");
            match policy {
                Policy::Budget(_) => {
                    // The reverse sweep of the steps before the last recomputes what revolve's
                    // formula says for these slots, beyond the one taped replay of each step.
                    let slots = 3;
                    let formula = binomial_recompute_steps(n as u64 - 1, slots) as usize;
                    assert_eq!(report.recomputed_steps, formula, "n={n}");
                }
                _ => assert_eq!(report.recomputed_steps, 0, "{policy:?}"),
            }
        }
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
}

/// Under mixed-precision products, a checkpointed step replays each product as the forward ran
/// it: the loss and the gradients are those of the plain step under the same setting, bit for bit.
#[test]
fn checkpointed_steps_with_bf16_products_give_the_plain_gradients_bit_for_bit() {
    use tensorscope::ops::{autocast, Products};
    let pool = Pool::with_max_memory_mb(256);
    let model = model(&pool, 16);
    let (loss, grads) = autocast(Products::Bf16, || step(&pool, &model, None));
    let (f32_loss, _) = step(&pool, &model, None);
    assert_ne!(loss, f32_loss, "the products computed in bf16");
    for policy in policies(16, BATCH * WIDTH * 4) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let (got_loss, got) = autocast(Products::Bf16, || step(&pool, &model, Some(&mut ckpt)));
        assert_eq!(got_loss.to_bits(), loss.to_bits(), "{policy:?}");
        assert_eq!(got, grads, "{policy:?}");
    }
}

#[test]
fn low_precision_boundaries_give_a_small_measured_gradient_error() {
    let pool = Pool::with_max_memory_mb(256);
    let model = model(&pool, 16);
    let (_, exact) = step(&pool, &model, None);
    for precision in [Precision::F16, Precision::Bf16] {
        let config = CheckpointConfig::new(Policy::Sqrt).with_precision(precision);
        let (_, got) = step(&pool, &model, Some(&mut Checkpointer::new(config)));
        // The largest normwise relative error over the parameters' gradients.
        let worst = got
            .iter()
            .zip(&exact)
            .map(|(g, e)| {
                let diff: f32 = g.iter().zip(e).map(|(a, b)| (a - b) * (a - b)).sum();
                let norm: f32 = e.iter().map(|v| v * v).sum();
                (diff / norm.max(f32::MIN_POSITIVE)).sqrt()
            })
            .fold(0.0f32, f32::max);
        println!("{precision:?}: largest normwise relative gradient error {worst:.3e}");
        assert!(worst > 0.0 && worst < 2e-2, "{precision:?}: {worst}");
    }
}

#[test]
fn a_checkpointed_step_holds_a_fraction_of_the_activations() {
    let pool = Pool::with_max_memory_mb(256);
    let n = 64;
    let model = model(&pool, n);
    // Persistent gradients, made by a first step, so a step's peak is its activations.
    let peak = |ckpt: Option<&mut Checkpointer>| {
        pool.scope(|outer| {
            let mut grads = Gradients::new(outer);
            let mut ckpt = ckpt;
            let mut run = |grads: &mut Gradients<'_>| {
                outer.train(|s| {
                    let x = s.randn::<f32>(&[BATCH, WIDTH], 7);
                    let y = match ckpt.as_deref_mut() {
                        Some(ckpt) => model.forward(ckpt, x),
                        None => model.forward_plain(x),
                    };
                    y.mse(&s.zeros(&[BATCH, WIDTH]))
                        .backward_into(grads)
                        .unwrap();
                });
                grads.zero().unwrap();
            };
            run(&mut grads);
            let before = pool.stats().bytes_in_use;
            pool.reset_peak();
            run(&mut grads);
            pool.stats().peak_bytes_in_use - before
        })
    };
    let plain = peak(None);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Sqrt));
    let sqrt = peak(Some(&mut ckpt));
    println!("peak beyond parameters and gradients: plain {plain} B, sqrt {sqrt} B");
    assert!(sqrt * 4 <= plain, "sqrt {sqrt} B against plain {plain} B");
    // Budget, counted by the pool: each slot more holds one activation more, as the stored
    // checkpoints are released while the reverse sweep consumes them (the checkpointer held them
    // all through the backward before, so slots it reused were never freed).
    let activation = (BATCH * WIDTH * 4) as f64;
    let budget = |slots: usize| {
        let policy = Policy::Budget(slots * BATCH * WIDTH * 4);
        peak(Some(&mut Checkpointer::new(CheckpointConfig::new(policy))))
    };
    let one = budget(1);
    for slots in [2, 5, 10, 20] {
        let more = (budget(slots) as f64 - one as f64) / activation;
        println!("Budget({slots} slots): {more:.2} activations more than one slot");
        assert!(
            more <= (slots - 1) as f64,
            "{slots} slots: {more:.2} activations more"
        );
    }
}

#[test]
fn a_budget_backward_runs_revolves_forward_steps() {
    // 100 layer steps, 10 slots. Revolve reverses 100 steps with 10 slots in t(100, 10) = 222
    // forward steps, plus one taped evaluation of each step, the last one's at the end of the
    // forward sweep. Here too: the forward pass keeps the last step's graph (its taped
    // evaluation), stores the binomial chain of the 99 steps before it, and the reverse sweep
    // recomputes t(100, 10) - 99 steps and replays each of the 99 once with recording on.
    let pool = Pool::with_max_memory_mb(256);
    let n = 100;
    let model = model(&pool, n);
    let (_, plain) = step(&pool, &model, None);
    let activation = BATCH * WIDTH * 4;
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Budget(10 * activation)));
    let (_, got) = step(&pool, &model, Some(&mut ckpt));
    assert_eq!(got, plain, "bit for bit");
    let report = ckpt.last_backward().unwrap();
    assert_eq!(report.recomputed_steps, 123);
    assert_eq!(report.replayed_steps, n - 1);
    // Every evaluation of a step: exactly revolve's count.
    assert_eq!(
        n + report.recomputed_steps + report.replayed_steps,
        revolve_forward_steps(n as u64, 10) as usize + n
    );
    assert_eq!(revolve_forward_steps(n as u64, 10), 222);
    assert!(report.peak_activations <= 10 + 1, "{report:?}");
}

/// The loss and every gradient of one step of `forward` (a loss of the model's output against a
/// fixed random target), each parameter listed by `each`.
pub(crate) fn gradients(
    pool: &Pool,
    shape: &[usize],
    mut forward: impl for<'s> FnMut(Tensor<'s>) -> Tensor<'s>,
    each: impl Fn(&mut dyn FnMut(&Param)),
) -> (u32, Vec<Vec<f32>>) {
    pool.train(|s| {
        let y = forward(s.randn::<f32>(shape, 3));
        let loss = y.mse(&s.randn::<f32>(y.shape(), 4));
        let grads = loss.backward().unwrap();
        let mut all = Vec::new();
        each(&mut |p| all.push(grads.get(p).expect("a gradient").to_vec()));
        assert_eq!(grads.len(), all.len());
        (loss.item().to_bits(), all)
    })
}

#[test]
fn transformer_blocks_and_the_denoiser_checkpoint_exactly_under_every_policy() {
    let pool = Pool::with_max_memory_mb(256);
    let model = transformer::Transformer::new(&pool, 6, 8);
    let shape = [2, 5, 8];
    let plain = gradients(
        &pool,
        &shape,
        |x| model.forward(&x),
        |f| model.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
    );
    for policy in policies(6, 2 * 5 * 8 * 4) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let got = gradients(
            &pool,
            &shape,
            |x| model.forward_checkpointed(&mut ckpt, x),
            |f| model.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
        );
        assert!(got == plain, "transformer, {policy:?}");
    }

    let denoiser = denoiser::Denoiser::new(&pool, 2, 4, 2);
    let shape = [1, 2, 6, 6];
    let plain = gradients(
        &pool,
        &shape,
        |x| denoiser.predict_noise(&x),
        |f| denoiser.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
    );
    // Five steps from `h1`, the chain's input, which the upsampling step reads (a skip).
    for policy in policies(5, 4 * 6 * 6 * 4) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let got = gradients(
            &pool,
            &shape,
            |x| denoiser.predict_noise_checkpointed(&mut ckpt, x),
            |f| denoiser.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
        );
        assert!(got == plain, "denoiser, {policy:?}");
        // Each step is replayed once but those of the last segment, whose graph the forward
        // kept: Every(4) replays 4 (the fifth step's segment is last), Sqrt (segments of 3)
        // 3, Explicit([1, 2]) 2 (steps 0 and 1: the last segment starts at 2), Budget all
        // but the last step.
        let replayed = ckpt.last_backward().map_or(0, |r| r.replayed_steps);
        let want = match policy {
            Policy::Every(_) | Policy::Budget(_) => 4,
            Policy::Sqrt => 3,
            _ => 2,
        };
        assert_eq!(replayed, want, "{policy:?}");
    }
    assert_eq!(
        pool.stats().bytes_in_use - pool_weights(&model, &denoiser),
        0
    );
}

fn pool_weights(model: &transformer::Transformer, denoiser: &denoiser::Denoiser) -> usize {
    let mut bytes = 0;
    model.visit_params(&ParamPath::ROOT, &mut |_, p| bytes += p.allocated_bytes());
    denoiser.visit_params(&ParamPath::ROOT, &mut |_, p| bytes += p.allocated_bytes());
    bytes
}

/// A forward that tries a backward from inside its first layer step.
struct Probe {
    w: Param,
    seen: std::cell::RefCell<Vec<tensorscope::Result<()>>>,
}

impl Probe {
    #[checkpoint(every = 1)]
    fn forward<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for i in 0..3 {
            x = x.matmul(&self.w).tanh();
            if i == 0 {
                let attempt = x.sum(0).sum(0).backward().map(drop);
                self.seen.borrow_mut().push(attempt);
            }
        }
        x
    }
}

#[test]
fn a_backward_from_inside_a_taped_step_is_an_error_naming_the_region() {
    let pool = Pool::with_max_memory_mb(16);
    let probe = Probe {
        w: Param::from_slice(&pool, &[2, 2], &[0.5f32, 0.1, -0.2, 0.3]),
        seen: Default::default(),
    };
    let grads = pool.train(|s| {
        let y = probe.forward(s.ones::<f32>(&[1, 2]));
        y.sum(1).sum(0).backward().unwrap().len()
    });
    let err = probe.seen.borrow_mut().remove(0).unwrap_err();
    assert_eq!(err, tensorscope::Error::BackwardInsideCheckpoint);
    assert!(err.to_string().contains("#[checkpoint] region"), "{err}");
    assert_eq!(grads, 1, "the region's own backward is unaffected");
}

/// `#[checkpoint]` forwards nested in the layer steps of another.
struct Nested {
    weights: Vec<Param>,
}

impl Nested {
    #[checkpoint(every = 2)]
    fn inner<'a>(&self, x: Tensor<'a>, at: usize) -> Tensor<'a> {
        let mut x = x;
        for w in &self.weights[at..at + 4] {
            x = x.matmul(w).tanh();
        }
        x
    }

    #[checkpoint(every = 1)]
    fn outer<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for at in [0, 4, 8] {
            x = self.inner(x, at);
        }
        x
    }

    fn plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        self.weights.iter().fold(x, |x, w| x.matmul(w).tanh())
    }
}

#[test]
fn nested_checkpointed_forwards_train_like_the_plain_one() {
    let pool = Pool::with_max_memory_mb(64);
    let model = Nested {
        weights: (0..12)
            .map(|i| pool.scope(|s| (s.randn::<f32>(&[4, 4], i) * 0.5).detach()))
            .collect(),
    };
    let each = |f: &mut dyn FnMut(&Param)| model.weights.iter().for_each(f);
    let plain = gradients(&pool, &[2, 4], |x| model.plain(x), each);
    let nested = gradients(&pool, &[2, 4], |x| model.outer(x), each);
    assert!(nested == plain);
}

/// A loop whose steps share one weight (an RNN), with optional extras per step.
struct Recurrent {
    w: Param,
    steps: usize,
}

impl Recurrent {
    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for _ in 0..self.steps {
            x = x.matmul(&self.w).tanh();
        }
        x
    }

    fn plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        (0..self.steps).fold(x, |x, _| x.matmul(&self.w).tanh())
    }
}

/// How far the gradient of an RNN's shared weight under every policy is from the plain one, for
/// `steps` steps of a `[batch, width]` state and a weight of seed `seed` scaled by
/// `scale / sqrt(width)`: the largest difference over the largest gradient element (normwise), and
/// the largest difference relative to its element (floored at 1e-3). The forward is exact.
fn shared_weight_differences(
    steps: usize,
    width: usize,
    batch: usize,
    scale: f32,
    seed: u64,
) -> (f32, f32) {
    // The plain graph of 10,000 steps of `[8, 64]` keeps about 40 MiB.
    let pool = Pool::with_max_memory_mb(512);
    let w = pool.scope(|s| {
        (s.randn::<f32>(&[width, width], seed) * (scale / (width as f32).sqrt())).detach()
    });
    let model = Recurrent { w, steps };
    let each = |f: &mut dyn FnMut(&Param)| f(&model.w);
    let (loss, plain) = gradients(&pool, &[batch, width], |x| model.plain(x), each);
    let largest = plain[0].iter().fold(0.0f32, |m, g| m.max(g.abs()));
    let (mut normwise, mut elementwise) = (0.0f32, 0.0f32);
    for policy in policies(steps, batch * width * 4) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let (got_loss, got) = gradients(
            &pool,
            &[batch, width],
            |x| model.forward(&mut ckpt, x),
            each,
        );
        assert_eq!(got_loss, loss, "{policy:?}: the forward is exact");
        for (a, b) in got[0].iter().zip(&plain[0]) {
            normwise = normwise.max((a - b).abs() / largest);
            elementwise = elementwise.max((a - b).abs() / b.abs().max(1e-3));
        }
    }
    (normwise, elementwise)
}

#[test]
fn a_weight_shared_by_every_step_gets_its_gradient_summed_per_segment() {
    // The plain graph adds the shared weight's per-use gradients in forward order; the region adds
    // them segment by segment, last segment first: the same sum, associated differently, so the
    // rounding grows with the steps that share the weight (as the square root of their number,
    // measured: see `shared_weight_differences_by_steps`).
    for steps in [16, 1000] {
        let (normwise, _) = shared_weight_differences(steps, 16, 4, 1.0, 5);
        let bound = 2.0 * (steps as f32).sqrt() * f32::EPSILON;
        assert!(normwise <= bound, "{steps} steps: {normwise:e} > {bound:e}");
    }
}

/// Four layer steps that each read one weight and one value made before the region (a UNet's time
/// embedding `t`, made from the parameter `e`).
struct SharedReads {
    w: Param,
    e: Param,
}

impl SharedReads {
    const STEPS: usize = 4;

    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>, t: &Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for _ in 0..Self::STEPS {
            x = (x.matmul(&self.w) + t).tanh();
        }
        x
    }

    fn plain<'a>(&self, x: Tensor<'a>, t: &Tensor<'a>) -> Tensor<'a> {
        (0..Self::STEPS).fold(x, |x, _| (x.matmul(&self.w) + t).tanh())
    }

    /// The loss and the gradients of `w` and `e` of one step, with `ckpt` or without.
    fn step(&self, pool: &Pool, ckpt: Option<&mut Checkpointer>) -> (u32, [Vec<f32>; 2]) {
        pool.train(|s| {
            let x = s.randn::<f32>(&[BATCH, WIDTH], 30);
            let t = s.bind(&self.e).sin();
            let y = match ckpt {
                Some(ckpt) => self.forward(ckpt, x, &t),
                None => self.plain(x, &t),
            };
            let loss = y.mse(&s.randn::<f32>(y.shape(), 31));
            let grads = loss.backward().unwrap();
            let of = |p: &Param| grads.get(p).expect("a gradient").to_vec();
            (loss.item().to_bits(), [of(&self.w), of(&self.e)])
        })
    }
}

#[test]
fn a_weight_and_an_earlier_value_read_by_every_step_get_the_plain_gradients_up_to_rounding() {
    // Each of the four steps adds a gradient to `w` and to `t` (so to `e`). The plain graph sums
    // them in its order, the region per segment: the same terms, associated differently. The one-
    // reader case is exact: `every_policy_gives_the_plain_gradients_bit_for_bit`.
    let pool = Pool::with_max_memory_mb(64);
    let (w, e) = pool.scope(|s| {
        let w = s.randn::<f32>(&[WIDTH, WIDTH], 32) * (1.0 / (WIDTH as f32).sqrt());
        (w.detach(), s.randn::<f32>(&[WIDTH], 33).detach())
    });
    let model = SharedReads { w, e };
    let (loss, plain) = model.step(&pool, None);
    let mut worst = 0.0f32;
    for policy in policies(SharedReads::STEPS, BATCH * WIDTH * 4) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let (got_loss, got) = model.step(&pool, Some(&mut ckpt));
        assert_eq!(got_loss, loss, "{policy:?}: the forward is exact");
        for (name, (got, want)) in ["w", "e"].iter().zip(got.iter().zip(&plain)) {
            let largest = want.iter().fold(0.0f32, |m, g| m.max(g.abs()));
            let diff = got
                .iter()
                .zip(want)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            let normwise = diff / largest;
            println!(
                "{policy:?} {name}: bit-identical {}, {normwise:e}",
                got == want
            );
            assert!(
                normwise <= 4.0 * f32::EPSILON,
                "{policy:?} {name}: {normwise:e}"
            );
            worst = worst.max(normwise);
        }
    }
    println!("largest difference over the largest gradient element: {worst:e}");
}

/// The table of how far a shared weight's checkpointed gradient is from the plain one, by the
/// number of steps sharing it (docs/guide.md, "Checkpointing"): `cargo test --release --test integration
/// checkpoint_training::shared_weight_differences_by_steps -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: prints a table"]
fn shared_weight_differences_by_steps() {
    println!("steps  normwise  elementwise  (worst of 5 shapes x 3 seeds x 4 policies)");
    for steps in [16usize, 100, 1000, 10_000] {
        let (mut normwise, mut elementwise) = (0.0f32, 0.0f32);
        for (width, batch, scale) in [
            (4, 2, 1.0),
            (16, 4, 1.0),
            (32, 8, 1.0),
            (32, 8, 2.0),
            (64, 8, 1.2),
        ] {
            for seed in [3, 5, 11] {
                let (n, e) = shared_weight_differences(steps, width, batch, scale, seed);
                (normwise, elementwise) = (normwise.max(n), elementwise.max(e));
            }
        }
        println!("{steps:>5}  {normwise:>8.1e}  {elementwise:>11.1e}");
    }
}

/// Steps with a `map` (no derivative): dead, or kept out of the graph with `without_grad`, or on
/// the gradient's path in the first step.
struct Masked {
    weights: Vec<Param>,
    mask: u8,
}

impl Masked {
    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for (i, w) in self.weights.iter().enumerate() {
            let mapped = (&x).map(|v| if v > 0.0 { 1.0 } else { 0.5 });
            x = match self.mask {
                _ if i > 0 => x.matmul(w).tanh(),
                0 => x.matmul(w).tanh(), // `mapped` is dead
                1 => (x.matmul(w) * &mapped.without_grad()).tanh(),
                _ => (x.matmul(w) * &mapped).tanh(), // in the first step, which is taped
            };
        }
        x
    }
}

#[test]
fn a_map_in_a_step_fails_the_backward_only_on_the_gradients_path_and_changes_nothing() {
    let pool = Pool::with_max_memory_mb(64);
    let weights: Vec<Param> = (0..8)
        .map(|i| pool.scope(|s| (s.randn::<f32>(&[4, 4], i) * 0.5).detach()))
        .collect();
    let run = |mask: u8, ckpt: Option<&mut Checkpointer>| {
        let model = Masked {
            weights: weights.clone(),
            mask,
        };
        pool.train(|s| {
            let mut grads = Gradients::new(s);
            let x = s.randn::<f32>(&[2, 4], 1);
            let y = match ckpt {
                Some(ckpt) => model.forward(ckpt, x),
                None => model.forward(
                    &mut Checkpointer::new(CheckpointConfig::new(Policy::Every(8))),
                    x,
                ),
            };
            let result = y.mse(&s.zeros(&[2, 4])).backward_into(&mut grads);
            let values: Vec<Vec<f32>> = weights
                .iter()
                .filter_map(|w| grads.get(w).map(|g| g.to_vec()))
                .collect();
            (result, values)
        })
    };
    for mask in [0, 1] {
        let (plain, plain_grads) = run(mask, None);
        plain.unwrap();
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(2)));
        let (result, grads) = run(mask, Some(&mut ckpt));
        result.unwrap();
        assert_eq!(grads, plain_grads, "mask {mask}");
    }
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(2)));
    let (result, grads) = run(2, Some(&mut ckpt));
    assert_eq!(
        result.unwrap_err(),
        tensorscope::Error::NotDifferentiable { op: "map" }
    );
    assert!(grads.is_empty(), "checked before any gradient was added");
}

#[test]
fn a_budget_that_growing_activations_would_pass_is_an_error_naming_the_figures() {
    let pool = Pool::with_max_memory_mb(64);
    let w = Param::from_slice(&pool, &[1], &[0.5f32]);
    let grow = |ckpt: &mut Checkpointer| {
        pool.scope(|s| {
            ckpt.checkpointed_forward(&s.ones::<f32>(&[2, 16]), &[0, 1, 2, 3], |x, _| {
                let h = (x * &w).tanh();
                Tensor::concat(&[x, &h], 1)
            })
            .map(drop)
        })
    };
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Budget(512)));
    let err = grow(&mut ckpt).unwrap_err();
    assert!(
        matches!(
            err,
            tensorscope::CheckpointError::BudgetExceeded { budget: 512, .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("past the budget of 512"), "{err}");
}

/// A forward of four layers, each but the first also reading a value of the step before it: that
/// step's input (`input`), or the product computed inside it.
fn dense<'s>(
    ckpt: Option<&mut Checkpointer>,
    w: &Param,
    x: &Tensor<'s>,
    input: bool,
) -> Result<Tensor<'s>, tensorscope::CheckpointError> {
    let previous: std::cell::RefCell<Option<Tensor<'s>>> = Default::default();
    let layer = |x: &Tensor<'s>, _| {
        let product = x.matmul(w);
        let y = match previous.borrow().as_ref() {
            Some(p) => (&product + p).tanh(),
            None => product.clone().tanh(),
        };
        *previous.borrow_mut() = Some(if input { x.clone() } else { product });
        y
    };
    match ckpt {
        Some(ckpt) => ckpt.checkpointed_forward(x, &[0, 1, 2, 3], layer),
        None => Ok((0..4).fold(x.clone(), |x, i| layer(&x, i))),
    }
}

#[test]
fn a_step_reading_the_input_of_the_step_before_it_is_a_skip_in_a_region_and_fails_past_it() {
    let pool = Pool::with_max_memory_mb(64);
    let w = Param::from_slice(&pool, &[2, 2], &[0.5f32, 0.1, -0.2, 0.3]);
    let grads = |ckpt: Option<&mut Checkpointer>| {
        pool.train(|s| {
            let y = dense(ckpt, &w, &s.ones(&[1, 2]), true).unwrap();
            match y.sum_all().backward() {
                Ok(grads) => Ok(grads.get(&w).unwrap().to_vec()),
                Err(e) => Err(e),
            }
        })
    };
    let plain = grads(None).unwrap();
    // The profiling step of `Memory` runs every step on a tape in one region: each read is a skip
    // connection inside it.
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(64 << 20)));
    assert_eq!(grads(Some(&mut ckpt)).unwrap(), plain);
    // Under Every(2) the last segment records its graph; its first step reads a value on the
    // region's tape, which only `#[checkpoint]`'s skip reads carry out of a region.
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(2)));
    assert_eq!(
        grads(Some(&mut ckpt)).unwrap_err(),
        tensorscope::Error::BackwardInsideCheckpoint
    );
}

#[test]
fn a_step_reading_a_value_computed_inside_an_earlier_step_is_refused_in_training() {
    let pool = Pool::with_max_memory_mb(64);
    let w = Param::from_slice(&pool, &[2, 2], &[0.5f32, 0.1, -0.2, 0.3]);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(4)));
    // In inference the layers run as written.
    pool.scope(|s| {
        dense(Some(&mut ckpt), &w, &s.ones(&[1, 2]), false)
            .map(drop)
            .unwrap()
    });
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(64 << 20)));
    let err = pool.train(|s| {
        dense(Some(&mut ckpt), &w, &s.ones(&[1, 2]), false)
            .map(drop)
            .unwrap_err()
    });
    assert_eq!(err, tensorscope::CheckpointError::CrossStepValue);
}

#[test]
fn a_training_forward_with_nothing_to_train_has_no_graph_and_plans_what_it_stores() {
    let pool = Pool::with_max_memory_mb(64);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(2)));
    let layers: Vec<usize> = (0..6).collect();
    let ((), stats) = pool.scope_with_stats(|s| {
        s.train(|t| {
            let y = ckpt
                .checkpointed_forward(&t.ones::<f32>(&[2]), &layers, |x, _| (x * 2.0).tanh())
                .unwrap();
            assert!(!y.has_graph(), "no parameter, no marked input");
            assert_eq!(y.backward().unwrap_err(), tensorscope::Error::NoGraph);
        })
    });
    assert_eq!(stats.leaked, 0);
    // The last segment's input is not stored in training (its graph is kept): nor is it planned.
    assert_eq!(ckpt.stored_layers(), vec![0, 2]);
    assert!(ckpt.is_checkpoint_layer(2) && !ckpt.is_checkpoint_layer(4));
}

/// A step that makes a constant of its own, which its tape keeps for the replay.
struct WithConstant {
    w: Param,
}

impl WithConstant {
    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for _ in 0..3 {
            let k = (x.clone().without_grad() * 0.5).tanh();
            x = (x.matmul(&self.w) * &k).tanh();
        }
        x
    }
}

#[test]
fn constants_a_taped_step_makes_are_accounted_to_the_scope_that_keeps_them() {
    let pool = Pool::with_max_memory_mb(64);
    let model = WithConstant {
        w: Param::from_slice(&pool, &[2, 2], &[0.5f32, 0.1, -0.2, 0.3]),
    };
    // Budget tapes every step, so the last segment's scope is one whose constants the tape keeps.
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Budget(1 << 10)));
    let ((), stats) = pool.scope_with_stats(|s| {
        s.train(|t| {
            let y = model.forward(&mut ckpt, t.ones::<f32>(&[1, 2]));
            let segment = t.last_child_stats().unwrap();
            assert_eq!(
                (segment.leaked, segment.bytes_in_use),
                (0, 0),
                "{segment:?}"
            );
            y.sum(1).sum(0).backward().unwrap();
        })
    });
    assert_eq!(stats.leaked, 0);
}
