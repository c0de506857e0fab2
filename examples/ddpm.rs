//! A denoising diffusion model (DDPM, Ho et al. 2020) trained on scikit-learn's handwritten digits
//! (`examples/data/digits.safetensors`, upsampled from 8x8 to 16x16 as PyTorch's bilinear
//! `interpolate` does, scaled to [-1, 1]), and sampled with the DDPM sampler (every one of the
//! `--timesteps`) or DDIM's (`--ddim N` of them, deterministic). The generated digits are written
//! as a PNG grid; the digits example's classifier, trained here on the real digits, says how many
//! of them it recognises as some digit with confidence.
//!
//! ```text
//! cargo run --release --example ddpm -- [--steps 3000] [--batch 64] [--channels 32] [--lr 2e-3]
//!     [--timesteps 1000] [--ddim 0] [--samples 64] [--seed 0] [--memory-mb 512]
//!     [--png target/ddpm.png] [--export PATH] [--save DIR] [--resume DIR] [--stop N] [--sample-only]
//! ```
//!
//! Training: AdamW, a warm-up and cosine schedule, clipping at norm 1, an exponential moving
//! average of the weights (0.999) that the samplers use. `--save DIR` writes the model, its
//! average and the optimizer's state every 500 steps and at the end; `--resume DIR` continues
//! from them as a run never stopped would (`--stop N` ends after step `N`, as an interruption
//! would); `--sample-only` with `--resume` only samples. Everything runs in a pool of
//! `--memory-mb` MiB: a step that would need more fails with the budget's error. `--export PATH`
//! writes the averaged weights alone at bf16 (what `tests/ddpm.rs` samples from).
//! `scripts/ddpm_torch.py` is the same recipe in PyTorch.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tensorscope::nn::{
    Adam, Group, LoadOptions, NnError, Optimizer, SafeTensorsFile, SaveOptions, Schedule,
    WarmupCosine,
};
use tensorscope::prelude::*;
use tensorscope::Gradients;

#[path = "common/ddpm_unet.rs"]
mod ddpm_unet;
#[path = "common/diffusion.rs"]
mod diffusion;
#[path = "common/digits_classifier.rs"]
mod digits_classifier;

use ddpm_unet::Unet;
use diffusion::{Diffusion, Sampler};

const DATA: &str = "examples/data/digits.safetensors";
const SIDE: usize = 16;
const EMA: f32 = 0.999;
const SAVE_EVERY: usize = 500;

struct Args {
    steps: usize,
    batch: usize,
    channels: usize,
    lr: f32,
    timesteps: usize,
    ddim: usize,
    samples: usize,
    seed: u64,
    memory_mb: usize,
    png: PathBuf,
    export: Option<PathBuf>,
    save: Option<PathBuf>,
    resume: Option<PathBuf>,
    stop: Option<usize>,
    sample_only: bool,
}

fn args() -> Args {
    let mut a = Args {
        steps: 3000,
        batch: 64,
        channels: 32,
        lr: 2e-3,
        timesteps: 1000,
        ddim: 0,
        samples: 64,
        seed: 0,
        memory_mb: 512,
        png: "target/ddpm.png".into(),
        export: None,
        save: None,
        resume: None,
        stop: None,
        sample_only: false,
    };
    let mut raw = std::env::args().skip(1);
    while let Some(flag) = raw.next() {
        if flag == "--sample-only" {
            a.sample_only = true;
            continue;
        }
        let value = raw
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        let number = || -> usize {
            value
                .parse()
                .unwrap_or_else(|_| fail(&format!("{flag} needs a whole number, not {value}")))
        };
        match flag.as_str() {
            "--steps" => a.steps = number(),
            "--batch" => a.batch = number().max(1),
            "--channels" => a.channels = number(),
            "--lr" => {
                a.lr = value
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("--lr needs a number, not {value}")))
            }
            "--timesteps" => a.timesteps = number().max(1),
            "--ddim" => a.ddim = number(),
            "--samples" => a.samples = number().max(1),
            "--seed" => a.seed = number() as u64,
            "--memory-mb" => a.memory_mb = number(),
            "--png" => a.png = value.into(),
            "--export" => a.export = Some(value.into()),
            "--save" => a.save = Some(value.into()),
            "--resume" => a.resume = Some(value.into()),
            "--stop" => a.stop = Some(number()),
            other => fail(&format!(
                "unknown argument {other}; accepted: --steps --batch --channels --lr --timesteps \
                 --ddim --samples --seed --memory-mb --png --export --save --resume --stop \
                 --sample-only"
            )),
        }
    }
    if a.channels == 0 || !a.channels.is_multiple_of(8) {
        fail(&format!(
            "--channels must be a positive multiple of 8, not {}",
            a.channels
        ));
    }
    if a.sample_only && a.resume.is_none() {
        fail("--sample-only samples a saved model: give it --resume DIR");
    }
    a
}

fn fail(message: &str) -> ! {
    eprintln!("ddpm: {message}");
    std::process::exit(2)
}

/// SplitMix64: the example's source of data order and timesteps (the noise is the pool's).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `images` (`[n, 1, 8, 8]` in [0, 1]) at `SIDE` x `SIDE` in [-1, 1]: bilinear, half-pixel
/// centres, edges clamped (PyTorch's `interpolate(mode="bilinear", align_corners=False)`).
fn upsampled(images: &[f32], n: usize) -> Vec<f32> {
    let scale = 8.0 / SIDE as f32;
    let source = |o: usize| {
        let x = ((o as f32 + 0.5) * scale - 0.5).max(0.0);
        let i = (x as usize).min(7);
        (i, (i + 1).min(7), x - i as f32)
    };
    let mut out = Vec::with_capacity(n * SIDE * SIDE);
    for image in images.chunks(64).take(n) {
        for oy in 0..SIDE {
            let (y0, y1, fy) = source(oy);
            for ox in 0..SIDE {
                let (x0, x1, fx) = source(ox);
                let at = |y: usize, x: usize| image[y * 8 + x];
                let top = at(y0, x0) * (1.0 - fx) + at(y0, x1) * fx;
                let bottom = at(y1, x0) * (1.0 - fx) + at(y1, x1) * fx;
                out.push(2.0 * (top * (1.0 - fy) + bottom * fy) - 1.0);
            }
        }
    }
    out
}

/// `ema = EMA ema + (1 - EMA) model`, parameter by parameter. `handles` is a recycled list.
fn update_average(ema: &mut Unet, model: &Unet, handles: &mut Vec<Param>) {
    model.visit_params(&ParamPath::ROOT, &mut |_, p| handles.push(p.clone()));
    let mut source = handles.drain(..);
    ema.for_each_param(&mut |e| {
        let p = source
            .next()
            .expect("the average has the model's parameters");
        for (e, p) in e.view_mut().iter_mut().zip(p.as_slice()) {
            *e = EMA * *e + (1.0 - EMA) * p;
        }
    });
}

/// Writes the model, its average and the optimizer's state to `dir`, at `step`.
fn save(model: &Unet, ema: &Unet, adam: &Adam, dir: &Path, step: usize) -> Result<(), NnError> {
    if let Err(e) = std::fs::create_dir_all(dir) {
        fail(&format!("{}: {e}", dir.display()));
    }
    let options = SaveOptions::new().metadata("step", step.to_string());
    model.save_safetensors(dir.join("model.safetensors"), &options)?;
    ema.save_safetensors(dir.join("ema.safetensors"), &options)?;
    adam.save_state(model, &dir.join("optimizer.safetensors"))
}

/// Reads what [`save`] wrote to `dir`; the step the saved run had reached.
fn resume(model: &mut Unet, ema: &mut Unet, adam: &mut Adam, dir: &Path) -> Result<usize, NnError> {
    let path = dir.join("model.safetensors");
    model.load_safetensors(&path, &LoadOptions::new())?;
    ema.load_safetensors(dir.join("ema.safetensors"), &LoadOptions::new())?;
    adam.load_state(model, &dir.join("optimizer.safetensors"))?;
    let file = SafeTensorsFile::open(&path)?;
    Ok(file
        .metadata()
        .get("step")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0))
}

/// `images` (`n` of `side` x `side`, values in [-1, 1]) as a grayscale PNG grid, each image drawn
/// at twice its size with a 2-pixel border.
fn write_png(path: &Path, images: &[f32], n: usize, side: usize) -> Result<(), String> {
    let (columns, cell) = ((n as f64).sqrt().ceil() as usize, 2 * side + 2);
    let rows = n.div_ceil(columns);
    let (width, height) = (columns * cell + 2, rows * cell + 2);
    let mut pixels = vec![0u8; width * height];
    for (k, image) in images.chunks(side * side).enumerate() {
        let (top, left) = (2 + k / columns * cell, 2 + k % columns * cell);
        for y in 0..2 * side {
            for x in 0..2 * side {
                let v = (image[y / 2 * side + x / 2] + 1.0) * 127.5;
                pixels[(top + y) * width + left + x] = v.round().clamp(0.0, 255.0) as u8;
            }
        }
    }
    let error = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = std::fs::File::create(path).map_err(|e| error(&e))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width as u32, height as u32);
    encoder.set_color(png::ColorType::Grayscale);
    let mut writer = encoder.write_header().map_err(|e| error(&e))?;
    writer.write_image_data(&pixels).map_err(|e| error(&e))
}

/// A one-line progress bar on standard error, drawn only on a terminal.
struct Progress {
    on: bool,
    label: &'static str,
    total: usize,
}

impl Progress {
    fn new(label: &'static str, total: usize) -> Self {
        Progress {
            on: std::io::stderr().is_terminal(),
            label,
            total,
        }
    }

    fn show(&self, done: usize, note: std::fmt::Arguments<'_>) {
        if self.on {
            let bar = "#".repeat(done * 30 / self.total.max(1));
            eprint!(
                "\r{} {done:>5}/{} [{bar:<30}] {note}   ",
                self.label, self.total
            );
            let _ = std::io::stderr().flush();
        }
    }

    fn clear(&self) {
        if self.on {
            eprint!("\r{:90}\r", "");
        }
    }
}

fn main() {
    let a = args();
    let pool = Pool::with_max_memory_mb(a.memory_mb);
    let file = SafeTensorsFile::open(DATA).unwrap_or_else(|e| fail(&e.to_string()));
    let read = |name: &str| {
        file.param::<f32>(&pool, name)
            .unwrap_or_else(|e| fail(&e.to_string()))
    };
    let digits = read("train.images");
    let n = digits.shape()[0];
    let train = Param::from_slice(&pool, &[n, 1, SIDE, SIDE], &upsampled(digits.as_slice(), n));
    let diffusion = Diffusion::linear(&pool, a.timesteps);

    let new_model =
        || Unet::new(&pool, 1, a.channels, a.seed).unwrap_or_else(|e| fail(&e.to_string()));
    let (mut model, mut ema) = (new_model(), new_model());
    let no_decay = |name: &str| match name.ends_with("bias") || name.contains("norm") {
        true => Group::NO_DECAY,
        false => Group::DEFAULT,
    };
    let mut adam = Adam::adamw(a.lr, 0.01).groups(no_decay);
    let first = match &a.resume {
        Some(dir) => {
            resume(&mut model, &mut ema, &mut adam, dir).unwrap_or_else(|e| fail(&e.to_string()))
        }
        None => 0,
    };
    let last = if a.sample_only {
        first
    } else {
        a.stop.unwrap_or(a.steps).min(a.steps)
    };
    let run = match a.sample_only {
        true => format!("sampling the model saved at step {first}"),
        false => format!("steps {}..{last} of {}", first + 1, a.steps),
    };
    println!(
        "ddpm: {} parameters, {n} digits at {SIDE}x{SIDE}, {} timesteps, batch {}; {run}; pool \
         budget {} MiB, threads {}",
        model.param_count(),
        a.timesteps,
        a.batch,
        a.memory_mb,
        tensorscope::threads()
    );

    let schedule = WarmupCosine {
        lr: f64::from(a.lr),
        warmup: 100,
        total: a.steps as u64,
        min_lr: 0.0,
    };
    let mut rng = Rng(a.seed);
    // The data order and timesteps of the steps before `first`, drawn again so that a resumed
    // run goes on as the uninterrupted one would.
    let (mut ids, mut ts, mut handles) = (Vec::new(), Vec::new(), Vec::new());
    let draw = |rng: &mut Rng, ids: &mut Vec<i64>, ts: &mut Vec<i64>| {
        ids.clear();
        ts.clear();
        for _ in 0..a.batch {
            ids.push(rng.below(n) as i64);
            ts.push(rng.below(a.timesteps) as i64);
        }
    };
    for _ in 0..first {
        draw(&mut rng, &mut ids, &mut ts);
    }
    let progress = Progress::new("train", a.steps);
    let (mut times, mut recent) = (Vec::new(), 0.0);
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for step in first..last {
            draw(&mut rng, &mut ids, &mut ts);
            adam.set_lr(schedule.lr(step as u64) as f32);
            let start = Instant::now();
            let loss = outer.train(|s| -> tensorscope::Result<f32> {
                let ids = s.try_from_slice(&[a.batch], &ids)?;
                let x0 = s.bind(&train).without_grad().try_index_select(0, &ids)?;
                let t = s.try_from_slice(&[a.batch], &ts)?;
                let noise = s.try_randn::<f32>(x0.shape(), a.seed ^ ((step as u64) << 20))?;
                let noisy = diffusion.add_noise(&x0, &noise, &t);
                let loss = model
                    .forward(&noisy, &t.try_cast::<f32>()?)?
                    .try_mse(&noise)?;
                loss.backward_into(&mut grads)?;
                loss.try_item()
            });
            let loss = loss.unwrap_or_else(|e| fail(&format!("step {}: {e}", step + 1)));
            grads.clip_norm(1.0).expect("clip");
            adam.step(&mut model, &grads).expect("step");
            grads.zero().expect("zero");
            update_average(&mut ema, &model, &mut handles);
            times.push(start.elapsed().as_secs_f64() * 1e3);
            recent = if step == first {
                loss
            } else {
                0.98 * recent + 0.02 * loss
            };
            progress.show(step + 1, format_args!("loss {recent:.4}"));
            let done = step + 1;
            if done % SAVE_EVERY == 0 || done == last {
                progress.clear();
                println!("step {done:5}  loss (running mean) {recent:.4}");
                if let Some(dir) = &a.save {
                    save(&model, &ema, &adam, dir, done).unwrap_or_else(|e| fail(&e.to_string()));
                }
            }
        }
    });
    if !times.is_empty() {
        times.sort_by(f64::total_cmp);
        println!(
            "median step {:.1} ms over {} steps",
            times[times.len() / 2],
            times.len()
        );
    }
    if last < a.steps && !a.sample_only {
        println!("stopped after step {last}; resume with --resume DIR");
        return;
    }

    if let Some(path) = &a.export {
        let options = SaveOptions::new()
            .dtype::<tensorscope::bf16>()
            .metadata("step", last.to_string());
        ema.save_safetensors(path, &options)
            .unwrap_or_else(|e| fail(&e.to_string()));
        println!("wrote the averaged weights to {} (bf16)", path.display());
    }
    let sampler = match a.ddim {
        0 => Sampler::Ddpm,
        steps => Sampler::Ddim { steps },
    };
    let progress = Progress::new("sample", sampler.steps(a.timesteps));
    let start = Instant::now();
    let images = diffusion
        .sample(
            &pool,
            &ema,
            sampler,
            [a.samples, 1, SIDE, SIDE],
            a.seed + 1,
            &mut |i| progress.show(i, format_args!("")),
        )
        .unwrap_or_else(|e| fail(&e.to_string()));
    progress.clear();
    println!(
        "sampled {} digits with {sampler} in {:.1} s",
        a.samples,
        start.elapsed().as_secs_f64()
    );
    write_png(&a.png, &images, a.samples, SIDE).unwrap_or_else(|e| fail(&e));
    println!("wrote {}", a.png.display());
    let (confident, counts) = recognised(&pool, &file, &digits, &images, a.samples);
    println!(
        "the digits classifier is at least 90% sure of {confident} of {} samples; as digits 0..9: \
         {counts:?}",
        a.samples
    );
}

/// How many of `images` (`[n, 1, SIDE, SIDE]` in [-1, 1]) the digits example's classifier,
/// trained here for 20 epochs on the real `digits` (`[n, 1, 8, 8]`), gives one class at least
/// 90%, and how many it puts in each class.
fn recognised(
    pool: &Pool,
    file: &SafeTensorsFile,
    digits: &Param,
    images: &[f32],
    n: usize,
) -> (usize, [usize; 10]) {
    let labels = file
        .param::<i64>(pool, "train.labels")
        .unwrap_or_else(|e| fail(&e.to_string()));
    let classifier = digits_classifier::train(pool, digits, &labels, 20, 0)
        .unwrap_or_else(|e| fail(&e.to_string()));
    digits_classifier::confident(pool, &classifier, images, n, SIDE, 0.9)
}
