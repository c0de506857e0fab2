//! Step time against peak step memory for every checkpoint policy, on three models: the 64-block
//! residual MLP of `checkpointed_training`, a GPT of 6 blocks of width 384 over 256 tokens, and the
//! convolutional denoiser of `diffusion_denoise` (64 channels, 64x64).
//!
//! `cargo run --release --example checkpoint_curve [-- --steps 12 --models mlp,gpt,denoiser --json PATH]`
//!
//! Rows: no checkpointing, `Every(k)`, `Sqrt`, `Budget` at several slot counts, and
//! `Policy::Memory` at seven budgets from the smallest that fits to the plain step's peak. Each row
//! trains the same model from the same seeds with Adam, in a pool of its own, the rows taking turns
//! a few steps at a time; a step's peak is the pool's most bytes in use beyond what was in use
//! before it (parameters, Adam's moments and the kept gradients), as `checkpointed_training`
//! measures it. With `--json` the points are written for `scripts/plot_checkpoint_curves.py`,
//! which draws them beside PyTorch's (`scripts/checkpoint_curve_torch.py`).

use std::fmt::Write as _;

use tensorscope::nn::Adam;
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Parameters, Policy};

#[path = "common/denoiser.rs"]
mod denoiser;
#[path = "common/gpt.rs"]
mod gpt;
#[path = "common/measured_training.rs"]
mod measured_training;
#[path = "common/pre_norm_mlp.rs"]
mod pre_norm_mlp;

use measured_training::{Measured, CHUNK};

/// One model's training step: the loss of batch `step` under `ckpt` (none: the plain forward),
/// its backward added into `grads`.
type LossOf<'m, M> =
    dyn Fn(&M, Option<&mut Checkpointer>, &Scope<'_, '_>, usize, &mut Gradients<'_>) -> f32 + 'm;

/// A row of the table: a policy and what its steps measured.
struct Row<M> {
    name: String,
    pool: Pool,
    model: M,
    adam: Adam,
    ckpt: Option<Checkpointer>,
    measured: Measured,
}

/// A measured point of the curve.
struct Point {
    model: &'static str,
    config: String,
    step_ms: f64,
    peak_bytes: usize,
}

/// Every row of one model, trained `steps` steps in turns; the Memory rows' budgets come from the
/// costs a profiling step measured and the plain row's peak.
fn curve<M: Parameters<f32>>(
    model_name: &'static str,
    steps: usize,
    make: &dyn Fn(&Pool) -> M,
    loss_of: &LossOf<'_, M>,
    activation: usize,
    every: &[usize],
) -> Vec<Point> {
    let row = |name: String, ckpt: Option<Checkpointer>| {
        let pool = Pool::with_max_memory_mb(8192);
        Row {
            name,
            model: make(&pool),
            pool,
            adam: Adam::new(1e-3),
            ckpt,
            measured: Measured::default(),
        }
    };
    let policy = |p: Policy| Some(Checkpointer::new(CheckpointConfig::new(p)));
    let mut rows = vec![row("none".into(), None)];
    rows.extend(
        every
            .iter()
            .map(|&k| row(format!("every {k}"), policy(Policy::Every(k)))),
    );
    rows.push(row("sqrt".into(), policy(Policy::Sqrt)));
    for slots in [2, 4, 8] {
        let p = policy(Policy::Budget(slots * activation));
        rows.push(row(format!("budget {slots}"), p));
    }
    // The costs, from a profiling step (the second), and the plain step's peak: the range of the
    // budgets.
    let mut plain = row("plain".into(), None);
    let mut probe = row("profile".into(), policy(Policy::Memory(usize::MAX)));
    run(&mut plain, loss_of, 0..3);
    run(&mut probe, loss_of, 0..2);
    let ckpt = probe.ckpt.as_ref().expect("the probe has a checkpointer");
    let (costs, smallest) = (ckpt.costs().expect("measured"), ckpt.smallest_budget());
    let smallest = smallest.expect("measured");
    let plain = plain.measured.peak.max(smallest);
    for fraction in [0.0, 0.05, 0.1, 0.2, 0.35, 0.6, 1.0] {
        let budget = smallest + ((plain - smallest) as f64 * fraction) as usize;
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        ckpt.set_costs(costs.clone());
        rows.push(row(format!("memory {:.2} MiB", mib(budget)), Some(ckpt)));
    }
    // Two warm-up steps, then the rows take turns, a few steps each, in one order and then the
    // other, so that no row always runs first or last.
    for (turn, start) in (0..steps + 2).step_by(CHUNK).enumerate() {
        let chunk = start..(start + CHUNK).min(steps + 2);
        if turn % 2 == 1 {
            rows.reverse();
        }
        for r in &mut rows {
            run(r, loss_of, chunk.clone());
        }
        if turn % 2 == 1 {
            rows.reverse();
        }
    }
    println!("\n{model_name}: {} rows, {steps} steps each", rows.len());
    println!(
        "{:<18} {:>10} {:>11} {:>10} {:>9} {:>11}",
        "policy", "peak MiB", "median ms", "recomputed", "replayed", "final loss"
    );
    rows.iter()
        .map(|r| {
            let m = &r.measured;
            let report = r.ckpt.as_ref().and_then(Checkpointer::last_backward);
            let (recomputed, replayed) =
                report.map_or((0, 0), |b| (b.recomputed_steps, b.replayed_steps));
            println!(
                "{:<18} {:>10.3} {:>11.2} {:>10} {:>9} {:>11.5}",
                r.name,
                mib(m.peak),
                m.median_ms(),
                recomputed,
                replayed,
                m.losses[m.losses.len() - 1]
            );
            Point {
                model: model_name,
                config: r.name.clone(),
                step_ms: m.median_ms(),
                peak_bytes: m.peak,
            }
        })
        .collect()
}

fn run<M: Parameters<f32>>(
    row: &mut Row<M>,
    loss_of: &LossOf<'_, M>,
    steps: std::ops::Range<usize>,
) {
    let Row {
        name,
        pool,
        model,
        adam,
        ckpt,
        measured,
    } = row;
    measured.run(name, pool, model, adam, steps, |model, s, step, grads| {
        loss_of(model, ckpt.as_mut(), s, step, grads)
    });
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let mut steps = 12;
    let mut models = "mlp,gpt,denoiser".to_string();
    let mut json = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--steps" => steps = value.parse().expect("--steps needs a whole number"),
            "--models" => models = value,
            "--json" => json = Some(value),
            other => panic!("unknown argument {other}; accepted: --steps --models --json"),
        }
    }
    let mut points = Vec::new();
    for model in models.split(',') {
        points.extend(match model {
            "mlp" => mlp(steps),
            "gpt" => gpt_curve(steps),
            "denoiser" => denoiser_curve(steps),
            other => panic!("unknown model {other}; accepted: mlp, gpt, denoiser"),
        });
    }
    if let Some(path) = json {
        let mut out = String::from("[\n");
        for (i, p) in points.iter().enumerate() {
            let sep = if i + 1 < points.len() { "," } else { "" };
            let _ = writeln!(
                out,
                "  {{\"model\": \"{}\", \"config\": \"{}\", \"step_ms\": {:.3}, \"peak_bytes\": {}}}{sep}",
                p.model, p.config, p.step_ms, p.peak_bytes
            );
        }
        out.push_str("]\n");
        std::fs::write(&path, out).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
        println!("\nwrote {path}");
    }
}

/// The 64-block pre-norm MLP, width 128, batch 32, against a teacher `tanh(x A)`.
fn mlp(steps: usize) -> Vec<Point> {
    let (blocks, width, batch) = (64, 128, 32);
    let teacher = Param::from_slice(
        Pool::global(),
        &[width, width],
        &Pool::global().scope(|s| (s.randn::<f32>(&[width, width], 7) * 0.2).to_vec()),
    );
    let loss_of = |model: &pre_norm_mlp::Model,
                   ckpt: Option<&mut Checkpointer>,
                   s: &Scope<'_, '_>,
                   step: usize,
                   grads: &mut Gradients<'_>| {
        let x = s.randn::<f32>(&[batch, width], 1000 + step as u64);
        let target = x.matmul(&s.bind(&teacher)).tanh();
        s.train(|t| {
            let x = t.rebind(&x);
            let y = match ckpt {
                Some(ckpt) => model.forward(ckpt, x),
                None => model.forward_plain(x),
            };
            let loss = y.mse(&target);
            loss.backward_into(grads).expect("the backward");
            loss.item()
        })
    };
    let make = |pool: &Pool| pre_norm_mlp::Model::new(pool, blocks, width);
    curve(
        "mlp",
        steps,
        &make,
        &loss_of,
        batch * width * 4,
        &[2, 4, 8, 16],
    )
}

/// A GPT of 6 blocks of width 384 (6 heads), context 256, batch 4, GPT-2's tiny vocabulary of
/// the fixture (96).
fn gpt_curve(steps: usize) -> Vec<Point> {
    let config = gpt::Config {
        layers: 6,
        dim: 384,
        heads: 6,
        n_ctx: 256,
        ..gpt::Config::TINY
    };
    let rows = 4;
    let loss_of = |model: &gpt::Gpt,
                   ckpt: Option<&mut Checkpointer>,
                   s: &Scope<'_, '_>,
                   step: usize,
                   grads: &mut Gradients<'_>| {
        let v = config.vocab as i64;
        let ids: Vec<i64> = (0..rows * config.n_ctx)
            .map(|i| (i as i64 * 7 + step as i64 * 13) % v)
            .collect();
        let ids = s.from_slice::<i64>(&[rows, config.n_ctx], &ids);
        s.train(|t| {
            let ids = t.rebind(&ids);
            let logits = match ckpt {
                Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                None => model.forward(&ids),
            };
            let loss = gpt::Gpt::loss(&logits, &ids);
            loss.backward_into(grads).expect("the backward");
            loss.item()
        })
    };
    let make = |pool: &Pool| gpt::Gpt::random(pool, config, 1).expect("the model's own shapes");
    let activation = rows * config.n_ctx * config.dim * 4;
    curve("gpt", steps, &make, &loss_of, activation, &[1, 2, 3])
}

/// The denoiser of `diffusion_denoise`: 64 channels, latent 4, 64x64, 8 groups, one step of a
/// mean squared error against noise.
fn denoiser_curve(steps: usize) -> Vec<Point> {
    let loss_of = |model: &denoiser::Denoiser,
                   ckpt: Option<&mut Checkpointer>,
                   s: &Scope<'_, '_>,
                   step: usize,
                   grads: &mut Gradients<'_>| {
        let x = s.randn::<f32>(&[1, 4, 64, 64], 100 + step as u64);
        let noise = s.randn::<f32>(&[1, 4, 64, 64], 200 + step as u64);
        s.train(|t| {
            let x = t.rebind(&x);
            let y = match ckpt {
                Some(ckpt) => model.predict_noise_checkpointed(ckpt, x),
                None => model.predict_noise(&x),
            };
            let loss = y.mse(&noise);
            loss.backward_into(grads).expect("the backward");
            loss.item()
        })
    };
    let make = |pool: &Pool| denoiser::Denoiser::new(pool, 4, 64, 8);
    // The largest activation the checkpointed layers store: 64 channels at 64x64.
    curve("denoiser", steps, &make, &loss_of, 64 * 64 * 64 * 4, &[2])
}
