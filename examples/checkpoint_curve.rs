//! Step time against peak step memory for every checkpoint policy, on four models: the 64-block
//! residual MLP of `checkpointed_training`, a GPT of 6 blocks of width 384 over 256 tokens, the
//! convolutional denoiser of `diffusion_denoise` (64 channels, 64x64), and a UNet with long skips
//! (`common/unet.rs`: its whole down-and-up path one chain of 12 layers; `--unet C:SIZE:BATCH`,
//! 32 channels at the top, 32x32, batch 4 by default).
//!
//! `cargo run --release --example checkpoint_curve [-- --steps 12 --models mlp,gpt,denoiser,unet --vocab 50257 --unet 64:64:4 --saving both --rows none,sqrt,budget:4,memfrac:10 --json PATH]`
//!
//! Rows: no checkpointing, `Every(k)`, `Sqrt`, `Budget` at several slot counts, and
//! `Policy::Memory` at seven budgets from the smallest that fits to the plain step's peak; or the
//! rows `--rows` lists (`memfrac:P` is the Memory budget `P`% of the way from the smallest to the
//! plain peak). `--saving products` runs every checkpointed row with `Saving::Products` (the
//! outputs of products and attention kept for the replays), `--saving both` each row both ways
//! at the same budgets (those of `Saving::Nothing`); a Memory row whose budget is below the
//! smallest its saving fits in is shown as not fitting. Each row
//! trains the same model from the same seeds with Adam, in a pool of its own, the rows taking turns
//! a few steps at a time; a step's peak is the pool's most bytes in use beyond what was in use
//! before it (parameters, Adam's moments and the kept gradients), as `checkpointed_training`
//! measures it. With `--json` the points are written for `scripts/plot_checkpoint_curves.py`,
//! which draws them beside PyTorch's (`scripts/checkpoint_curve_torch.py`).

use std::fmt::Write as _;

use tensorscope::checkpoint::Saving;
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
#[path = "common/unet.rs"]
mod unet;

use measured_training::Measured;

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

/// A row's policy, as the command line of the process that runs it gives it.
#[derive(Clone, Copy)]
enum Spec {
    None,
    Every(usize),
    Sqrt,
    /// Room for this many activations.
    Budget(usize),
    /// This many bytes for the whole step.
    Memory(usize),
}

impl Spec {
    fn name(self) -> String {
        match self {
            Spec::None => "none".into(),
            Spec::Every(k) => format!("every {k}"),
            Spec::Sqrt => "sqrt".into(),
            Spec::Budget(slots) => format!("budget {slots}"),
            Spec::Memory(bytes) => format!("memory {:.2} MiB", mib(bytes)),
        }
    }

    fn arg(self) -> String {
        match self {
            Spec::None => "none".into(),
            Spec::Every(k) => format!("every:{k}"),
            Spec::Sqrt => "sqrt".into(),
            Spec::Budget(slots) => format!("budget:{slots}"),
            Spec::Memory(bytes) => format!("memory:{bytes}"),
        }
    }

    fn parse(arg: &str) -> Spec {
        let (kind, n) = arg.split_once(':').unwrap_or((arg, "0"));
        let n = n
            .parse()
            .unwrap_or_else(|_| panic!("--row {arg}: not a number after ':'"));
        match kind {
            "none" => Spec::None,
            "every" => Spec::Every(n),
            "sqrt" => Spec::Sqrt,
            "budget" => Spec::Budget(n),
            "memory" => Spec::Memory(n),
            _ => panic!("--row {arg}: accepted none, every:K, sqrt, budget:SLOTS, memory:BYTES"),
        }
    }

    fn checkpointer(self, activation: usize, saving: Saving) -> Option<Checkpointer> {
        let policy = match self {
            Spec::None => return None,
            Spec::Every(k) => Policy::Every(k),
            Spec::Sqrt => Policy::Sqrt,
            Spec::Budget(slots) => Policy::Budget(slots * activation),
            Spec::Memory(bytes) => Policy::Memory(bytes),
        };
        let config = CheckpointConfig::new(policy).with_saving(saving);
        Some(Checkpointer::new(config))
    }
}

/// A row: a policy, and what its replays keep.
#[derive(Clone, Copy)]
struct RowSpec {
    spec: Spec,
    saving: Saving,
}

impl RowSpec {
    fn name(self) -> String {
        match self.saving {
            Saving::Products => format!("{} +products", self.spec.name()),
            _ => self.spec.name(),
        }
    }

    fn arg(self) -> String {
        match self.saving {
            Saving::Products => format!("{}+products", self.spec.arg()),
            _ => self.spec.arg(),
        }
    }

    fn parse(arg: &str) -> RowSpec {
        match arg.strip_suffix("+products") {
            Some(spec) => RowSpec {
                spec: Spec::parse(spec),
                saving: Saving::Products,
            },
            None => RowSpec {
                spec: Spec::parse(arg),
                saving: Saving::Nothing,
            },
        }
    }
}

/// `--saving`: which savings the checkpointed rows run with.
static SAVINGS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `--rows`: the rows to run instead of the full curve.
static ROWS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn savings() -> Vec<Saving> {
    match SAVINGS.get().map_or("nothing", String::as_str) {
        "nothing" => vec![Saving::Nothing],
        "products" => vec![Saving::Products],
        "both" => vec![Saving::Nothing, Saving::Products],
        other => panic!("--saving {other}: accepted nothing, products, both"),
    }
}

/// Whether this process draws a model's curve or runs one row of it.
#[derive(Clone, Copy)]
enum Mode {
    Curve,
    Row(RowSpec),
}

/// One model's curve: each row runs in a process of its own (`--row`), twice, the rows in one
/// order and then the other, and its timed steps are pooled. A process of its own gives each row
/// the same start (memory allocated in the same order, the same caches): in one process the
/// same schedule ran 10-15% faster or slower by its place among the rows. The Memory rows'
/// budgets range from the smallest that fits the costs a profiling step measured to the plain
/// step's peak.
fn curve<M: Parameters<f32>>(
    model_name: &'static str,
    mode: Mode,
    steps: usize,
    make: &dyn Fn(&Pool) -> M,
    loss_of: &LossOf<'_, M>,
    activation: usize,
    every: &[usize],
) -> Vec<Point> {
    let row = |spec: RowSpec| {
        let pool = Pool::with_max_memory_mb(8192);
        Row {
            name: spec.name(),
            model: make(&pool),
            pool,
            adam: Adam::new(1e-3),
            ckpt: spec.spec.checkpointer(activation, spec.saving),
            measured: Measured::default(),
        }
    };
    let plain = |spec| RowSpec {
        spec,
        saving: Saving::Nothing,
    };
    if let Mode::Row(spec) = mode {
        // Three untimed steps (under Memory: as Sqrt, profiling, planning), then the timed ones.
        let mut r = row(spec);
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(&mut r, loss_of, 0..3);
            r.measured = Measured::default();
            run(&mut r, loss_of, 3..steps + 4);
        }));
        if ran.is_err() {
            // A budget below what this row's saving fits in.
            println!("row infeasible");
            return Vec::new();
        }
        if let Some(plan) = r.ckpt.as_ref().and_then(Checkpointer::plan_report) {
            print!("{plan}");
        }
        let report = r.ckpt.as_ref().and_then(Checkpointer::last_backward);
        let (recomputed, replayed) =
            report.map_or((0, 0), |b| (b.recomputed_steps, b.replayed_steps));
        let m = &r.measured;
        let times: Vec<String> = m.times.iter().map(|t| format!("{t:.3}")).collect();
        println!(
            "row {} {recomputed} {replayed} {} {}",
            m.peak,
            m.losses[m.losses.len() - 1],
            times.join(" ")
        );
        return Vec::new();
    }
    // The plain step's peak and the smallest budget that fits: the range of the Memory rows.
    let mut plain_row = row(plain(Spec::None));
    let mut probe = row(plain(Spec::Memory(usize::MAX)));
    run(&mut plain_row, loss_of, 0..3);
    run(&mut probe, loss_of, 0..2);
    let smallest = probe
        .ckpt
        .as_ref()
        .and_then(Checkpointer::smallest_budget)
        .expect("the second step measured");
    let most = plain_row.measured.peak.max(smallest);
    drop((plain_row, probe));
    let memory =
        |fraction: f64| Spec::Memory(smallest + ((most - smallest) as f64 * fraction) as usize);
    let mut policies = Vec::new();
    match ROWS.get() {
        Some(rows) => {
            for arg in rows.split(',') {
                policies.push(match arg.strip_prefix("memfrac:") {
                    Some(p) => memory(p.parse::<f64>().expect("memfrac:PERCENT") / 100.0),
                    None => Spec::parse(arg),
                });
            }
        }
        None => {
            policies.push(Spec::None);
            policies.extend(every.iter().map(|&k| Spec::Every(k)));
            policies.extend([
                Spec::Sqrt,
                Spec::Budget(2),
                Spec::Budget(4),
                Spec::Budget(8),
            ]);
            for fraction in [0.0, 0.05, 0.1, 0.2, 0.35, 0.6, 1.0] {
                policies.push(memory(fraction));
            }
        }
    }
    let mut specs = Vec::new();
    for spec in policies {
        match spec {
            Spec::None => specs.push(plain(spec)),
            _ => specs.extend(savings().into_iter().map(|saving| RowSpec { spec, saving })),
        }
    }
    let mut results: Vec<(usize, usize, usize, f32, Vec<f64>)> =
        specs.iter().map(|_| (0, 0, 0, 0.0, Vec::new())).collect();
    // The plan report of each Memory row's last step, from its first process.
    let mut plans: Vec<String> = specs.iter().map(|_| String::new()).collect();
    for round in 0..2 {
        let mut order: Vec<usize> = (0..specs.len()).collect();
        if round == 1 {
            order.reverse();
        }
        for i in order {
            let out = std::process::Command::new(std::env::current_exe().expect("this program"))
                .args(["--models", model_name, "--steps", &steps.to_string()])
                .args(["--vocab", &gpt_vocab().to_string()])
                .args(["--unet", &unet_config().arg()])
                .args(["--saving", SAVINGS.get().map_or("nothing", String::as_str)])
                .args(["--row", &specs[i].arg()])
                .output()
                .expect("a row's process runs");
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find_map(|l| l.strip_prefix("row "))
                .unwrap_or_else(|| {
                    panic!(
                        "{}: {}",
                        specs[i].name(),
                        String::from_utf8_lossy(&out.stderr)
                    )
                });
            if plans[i].is_empty() {
                let report = text.lines().take_while(|l| !l.starts_with("row "));
                plans[i] = report.fold(String::new(), |all, l| all + l + "\n");
            }
            let fields: Vec<&str> = line.split(' ').collect();
            let r = &mut results[i];
            if fields[0] == "infeasible" {
                continue;
            }
            r.0 = r.0.max(fields[0].parse().expect("a peak"));
            r.1 = fields[1].parse().expect("a count");
            r.2 = fields[2].parse().expect("a count");
            r.3 = fields[3].parse().expect("a loss");
            r.4.extend(
                fields[4..]
                    .iter()
                    .map(|t| t.parse::<f64>().expect("a time")),
            );
        }
    }
    println!(
        "\n{model_name}: {} rows, each in its own process twice, {steps} timed steps each time",
        specs.len()
    );
    println!(
        "{:<26} {:>10} {:>11} {:>10} {:>9} {:>11} {:>6}",
        "policy", "peak MiB", "median ms", "recomputed", "replayed", "final loss", "kept"
    );
    let points = specs
        .iter()
        .zip(results)
        .zip(&plans)
        .filter_map(
            |((spec, (peak, recomputed, replayed, loss, mut times)), plan)| {
                // Whether a Memory row's plan kept the saving's outputs (its planner's choice).
                let kept = match plan.as_str() {
                    "" => "-",
                    plan if plan.contains("kept, the rest replayed") => "yes",
                    _ => "no",
                };
                if times.is_empty() {
                    println!("{:<26} does not fit its budget", spec.name());
                    return None;
                }
                times.sort_by(f64::total_cmp);
                let median = times[times.len() / 2];
                println!(
                    "{:<26} {:>10.3} {:>11.2} {:>10} {:>9} {:>11.5} {kept:>6}",
                    spec.name(),
                    mib(peak),
                    median,
                    recomputed,
                    replayed,
                    loss
                );
                Some(Point {
                    model: model_name,
                    config: spec.name(),
                    step_ms: median,
                    peak_bytes: peak,
                })
            },
        )
        .collect();
    // The plans of the smallest budget and of the middle one.
    let memory: Vec<usize> = (0..specs.len()).filter(|&i| !plans[i].is_empty()).collect();
    if !memory.is_empty() {
        for i in [memory[0], memory[memory.len() / 2]] {
            println!(
                "\nThe plan of {}, its last step:\n{}",
                specs[i].name(),
                plans[i]
            );
        }
    }
    points
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
    let mut mode = Mode::Curve;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--steps" => steps = value.parse().expect("--steps needs a whole number"),
            "--models" => models = value,
            "--vocab" => {
                let vocab = value.parse().expect("--vocab needs a whole number");
                VOCAB.set(vocab).expect("--vocab is given once");
            }
            "--json" => json = Some(value),
            "--row" => mode = Mode::Row(RowSpec::parse(&value)),
            "--saving" => SAVINGS.set(value).expect("--saving is given once"),
            "--rows" => ROWS.set(value).expect("--rows is given once"),
            "--unet" => UNET.set(value).expect("--unet is given once"),
            other => panic!(
                "unknown argument {other}; accepted: --steps --models --vocab --unet --saving \
                 --rows --json --row"
            ),
        }
    }
    let mut points = Vec::new();
    for model in models.split(',') {
        points.extend(match model {
            "mlp" => mlp(mode, steps),
            "gpt" => gpt_curve(mode, steps),
            "denoiser" => denoiser_curve(mode, steps),
            "unet" => unet_curve(mode, steps),
            other => panic!("unknown model {other}; accepted: mlp, gpt, denoiser, unet"),
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
fn mlp(mode: Mode, steps: usize) -> Vec<Point> {
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
        mode,
        steps,
        &make,
        &loss_of,
        batch * width * 4,
        &[2, 4, 8, 16],
    )
}

/// The GPT's vocabulary: `--vocab`, else the fixture's 96 (`--vocab 50257` for GPT-2's).
static VOCAB: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn gpt_vocab() -> usize {
    *VOCAB.get_or_init(|| gpt::Config::TINY.vocab)
}

/// A GPT of 6 blocks of width 384 (6 heads), context 256, batch 4, the vocabulary of
/// [`gpt_vocab`].
fn gpt_curve(mode: Mode, steps: usize) -> Vec<Point> {
    let config = gpt::Config {
        layers: 6,
        dim: 384,
        heads: 6,
        n_ctx: 256,
        vocab: gpt_vocab(),
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
    curve("gpt", mode, steps, &make, &loss_of, activation, &[1, 2, 3])
}

/// The denoiser of `diffusion_denoise`: 64 channels, latent 4, 64x64, 8 groups, one step of a
/// mean squared error against noise.
fn denoiser_curve(mode: Mode, steps: usize) -> Vec<Point> {
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
    curve(
        "denoiser",
        mode,
        steps,
        &make,
        &loss_of,
        64 * 64 * 64 * 4,
        &[2],
    )
}

/// `--unet C:SIZE:BATCH`.
static UNET: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The UNet's size: channels at the top level, image side, batch.
struct UnetConfig {
    channels: usize,
    size: usize,
    batch: usize,
}

impl UnetConfig {
    fn arg(&self) -> String {
        format!("{}:{}:{}", self.channels, self.size, self.batch)
    }
}

/// `--unet`, else 32 channels, 32x32, batch 4.
fn unet_config() -> UnetConfig {
    let arg = UNET.get().map_or("32:32:4", String::as_str);
    let parts: Vec<usize> = arg
        .split(':')
        .map(|p| {
            p.parse()
                .expect("--unet CHANNELS:SIZE:BATCH, whole numbers")
        })
        .collect();
    let [channels, size, batch] = parts[..] else {
        panic!("--unet {arg}: expected CHANNELS:SIZE:BATCH");
    };
    UnetConfig {
        channels,
        size,
        batch,
    }
}

/// The UNet of `common/unet.rs` (3 channels in and out, group norm of 8), one step of a mean
/// squared error against noise.
fn unet_curve(mode: Mode, steps: usize) -> Vec<Point> {
    let UnetConfig {
        channels,
        size,
        batch,
    } = unet_config();
    let shape = [batch, 3, size, size];
    let loss_of = |model: &unet::Unet,
                   ckpt: Option<&mut Checkpointer>,
                   s: &Scope<'_, '_>,
                   step: usize,
                   grads: &mut Gradients<'_>| {
        let x = s.randn::<f32>(&shape, 100 + step as u64);
        let noise = s.randn::<f32>(&shape, 200 + step as u64);
        s.train(|t| {
            let x = t.rebind(&x);
            let y = match ckpt {
                Some(ckpt) => ckpt.install(|| model.forward(x)),
                None => model.forward(x),
            };
            let loss = y.mse(&noise);
            loss.backward_into(grads).expect("the backward");
            loss.item()
        })
    };
    let make = |pool: &Pool| unet::Unet::new(pool, 3, channels, 8);
    // The largest activation the chain stores: the top level's, at the full size.
    let activation = batch * channels * size * size * 4;
    curve("unet", mode, steps, &make, &loss_of, activation, &[1, 2, 4])
}
