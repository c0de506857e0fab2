//! Trains a small convolutional classifier on scikit-learn's 8x8 handwritten digits
//! (`examples/data/digits.safetensors`: 1437 training and 360 held-out images; see
//! `examples/data/README.md` for their source and licence): shuffled mini-batches, AdamW without
//! decay on biases, a warm-up and cosine schedule, clipping by norm, a progress bar, the held-out
//! accuracy after each epoch, and a loss curve drawn as SVG. `--save DIR` writes the model and the
//! optimizer's state after each epoch, by name; `--resume DIR` continues from them, with the same
//! result as a run never stopped (`--stop N` ends a run after epoch `N`, as an interruption would).
//!
//! ```text
//! cargo run --release --example digits -- [--epochs 30] [--batch 64] [--seed 0] [--save DIR] [--resume DIR] [--stop N]
//!     [--svg PATH] [--torch-json PATH]
//! ```
//!
//! `scripts/digits_torch.py` is the same model, data order, schedule and clipping in PyTorch; its
//! `--json` output given as `--torch-json` is drawn beside this run's curve.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tensorscope::nn::{
    Adam, Group, LoadOptions, NnError, Optimizer, SafeTensorsFile, SaveOptions, Schedule,
    WarmupCosine,
};
use tensorscope::prelude::*;

const DATA: &str = "examples/data/digits.safetensors";

#[path = "common/digits_classifier.rs"]
mod digits_classifier;

use digits_classifier::{shuffled, train_epoch, Classifier};

struct Args {
    epochs: usize,
    batch: usize,
    stop: Option<usize>,
    seed: u64,
    save: Option<PathBuf>,
    resume: Option<PathBuf>,
    svg: Option<PathBuf>,
    torch_json: Option<PathBuf>,
}

fn args() -> Args {
    let mut a = Args {
        epochs: 30,
        batch: 64,
        stop: None,
        seed: 0,
        save: None,
        resume: None,
        svg: None,
        torch_json: None,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    for pair in raw.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_else(|| {
            fail(&format!("{} needs a value", pair[0]));
        });
        let number = || -> u64 {
            value
                .parse()
                .unwrap_or_else(|_| fail(&format!("{} needs a whole number", pair[0])))
        };
        match pair[0].as_str() {
            "--epochs" => a.epochs = number() as usize,
            "--seed" => a.seed = number(),
            "--batch" => a.batch = number().max(1) as usize,
            "--stop" => a.stop = Some(number() as usize),
            "--save" => a.save = Some(value.into()),
            "--resume" => a.resume = Some(value.into()),
            "--svg" => a.svg = Some(value.into()),
            "--torch-json" => a.torch_json = Some(value.into()),
            other => fail(&format!(
                "unknown argument {other}; accepted: --epochs --batch --seed --save --resume --stop \
                 --svg --torch-json"
            )),
        }
    }
    a
}

fn fail(message: &str) -> ! {
    eprintln!("digits: {message}");
    std::process::exit(2)
}

/// The model, the optimizer and the epoch reached, from `dir` (as [`save`] wrote them).
fn resume(model: &mut Classifier, adam: &mut Adam, dir: &Path) -> Result<usize, NnError> {
    let path = dir.join("model.safetensors");
    model.load_safetensors(&path, &LoadOptions::new())?;
    adam.load_state(model, &dir.join("optimizer.safetensors"))?;
    let file = SafeTensorsFile::open(&path)?;
    Ok(file
        .metadata()
        .get("epoch")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0))
}

fn save(model: &Classifier, adam: &Adam, dir: &Path, epoch: usize) -> Result<(), NnError> {
    if let Err(e) = std::fs::create_dir_all(dir) {
        fail(&format!("{}: {e}", dir.display()));
    }
    let options = SaveOptions::new().metadata("epoch", epoch.to_string());
    model.save_safetensors(dir.join("model.safetensors"), &options)?;
    adam.save_state(model, &dir.join("optimizer.safetensors"))
}

/// The share of `images` whose argmax logit is their label, in percent.
fn accuracy(pool: &Pool, model: &Classifier, images: &Param, labels: &Param<i64>) -> f64 {
    pool.scope(|s| {
        let predicted = model.forward(&s.bind(images)).argmax(-1).to_vec();
        let right = predicted
            .iter()
            .zip(labels.as_slice())
            .filter(|(p, l)| p == l)
            .count();
        100.0 * right as f64 / labels.len() as f64
    })
}

fn main() {
    let a = args();
    let pool = Pool::with_max_memory_mb(256);
    let file = SafeTensorsFile::open(DATA).unwrap_or_else(|e| fail(&e.to_string()));
    let read = |name: &str| {
        file.param::<f32>(&pool, name)
            .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let labels = |name: &str| {
        file.param::<i64>(&pool, name)
            .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let (train_x, train_y) = (read("train.images"), labels("train.labels"));
    let (test_x, test_y) = (read("test.images"), labels("test.labels"));
    let n = train_y.len();
    let steps_per_epoch = n.div_ceil(a.batch);
    let total = (steps_per_epoch * a.epochs) as u64;
    let schedule = WarmupCosine {
        lr: 3e-3,
        warmup: 50,
        total,
        min_lr: 0.0,
    };

    let mut model = Classifier::new(&pool, a.seed);
    let no_decay = |name: &str| {
        if name.ends_with("bias") {
            Group::NO_DECAY
        } else {
            Group::DEFAULT
        }
    };
    let mut adam = Adam::adamw(3e-3, 0.01).groups(no_decay);
    let first = match &a.resume {
        Some(dir) => resume(&mut model, &mut adam, dir).unwrap_or_else(|e| fail(&e.to_string())),
        None => 0,
    };
    println!(
        "digits: {} parameters, {n} training images, {} held out; epochs {}..{} of {}",
        model.param_count(),
        test_y.len(),
        first + 1,
        a.epochs,
        a.epochs
    );

    let bar = std::io::stderr().is_terminal();
    let (mut order, mut losses, mut times) = (Vec::new(), Vec::new(), Vec::new());
    for epoch in first..a.stop.unwrap_or(a.epochs).min(a.epochs) {
        shuffled(n, a.seed + epoch as u64, &mut order);
        let mut start = Instant::now();
        let lr = |i: usize| schedule.lr((epoch * steps_per_epoch + i) as u64) as f32;
        let mut after = |i: usize, loss: f32| {
            if epoch > first {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            if bar {
                let done = (i + 1) * 30 / steps_per_epoch;
                eprint!(
                    "\r{:>3}/{} [{:<30}] loss {loss:.4}",
                    epoch + 1,
                    a.epochs,
                    "#".repeat(done)
                );
                let _ = std::io::stderr().flush();
            }
            start = Instant::now();
        };
        let data = (&train_x, &train_y);
        let loss = train_epoch(
            &pool, &mut model, &mut adam, data, &order, a.batch, &lr, &mut after,
        )
        .unwrap_or_else(|e| fail(&e.to_string()));
        losses.push(loss);
        let held_out = accuracy(&pool, &model, &test_x, &test_y);
        if bar {
            eprint!("\r{:70}\r", "");
        }
        println!(
            "epoch {:3}  train loss {loss:.4}  held-out accuracy {held_out:6.2}%",
            epoch + 1
        );
        if let Some(dir) = &a.save {
            save(&model, &adam, dir, epoch + 1).unwrap_or_else(|e| fail(&e.to_string()));
        }
    }
    let held_out = accuracy(&pool, &model, &test_x, &test_y);
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "held-out accuracy {held_out:.2}%; median step {median:.3} ms over {} steps (threads: \
         TENSORSCOPE_THREADS or the default)",
        times.len()
    );
    if let Some(path) = &a.svg {
        let torch = a.torch_json.as_ref().map(|p| torch_losses(p));
        std::fs::write(path, svg(first, &losses, torch.as_deref()))
            .unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
        println!("wrote {}", path.display());
    }
}

/// The per-epoch training losses of `scripts/digits_torch.py --json`.
fn torch_losses(path: &Path) -> Vec<f64> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| fail(&format!("{}: {e}", path.display())));
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| fail(&e.to_string()));
    json["train_loss"]
        .as_array()
        .unwrap_or_else(|| fail("the PyTorch JSON has no train_loss list"))
        .iter()
        .filter_map(serde_json::Value::as_f64)
        .collect()
}

/// A line chart of the mean training loss by epoch (log scale), this run's and PyTorch's.
fn svg(first: usize, ours: &[f64], torch: Option<&[f64]>) -> String {
    let (w, h, pad) = (640.0, 360.0, 48.0);
    let all = ours.iter().chain(torch.unwrap_or(&[]));
    let (lo, hi) = all.fold((f64::MAX, f64::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let (lo, hi) = (lo.max(1e-6).log10(), hi.max(1e-6).log10() + 1e-9);
    let epochs = (first + ours.len())
        .max(torch.map_or(0, <[f64]>::len))
        .max(2);
    let x = |e: usize| pad + (w - 2.0 * pad) * e as f64 / (epochs - 1) as f64;
    let y = |v: f64| h - pad - (h - 2.0 * pad) * (v.max(1e-6).log10() - lo) / (hi - lo);
    let line = |from: usize, values: &[f64], colour: &str| {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, &v)| format!("{:.1},{:.1}", x(from + i), y(v)))
            .collect();
        format!(
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        )
    };
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    out += &format!(r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    out += &format!(
        r#"<text x="{pad}" y="20">Digits: mean training loss by epoch (log scale, {:.3} to {:.3})</text>"#,
        10f64.powf(lo),
        10f64.powf(hi)
    );
    out += &line(first, ours, "#1f77b4");
    out += &format!(
        r##"<text x="{pad}" y="{}" fill="#1f77b4">tensorscope</text>"##,
        h - 12.0
    );
    if let Some(torch) = torch {
        out += &line(0, torch, "#d62728");
        out += &format!(
            r##"<text x="{}" y="{}" fill="#d62728">PyTorch</text>"##,
            pad + 110.0,
            h - 12.0
        );
    }
    out += &format!(
        r#"<text x="{}" y="{}">epoch {epochs}</text>"#,
        w - pad - 40.0,
        h - 12.0
    );
    out + "</svg>\n"
}
