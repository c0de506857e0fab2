//! The convolutions of a diffusion UNet (64 base channels, multipliers 1, 2, 4, input 64x64; the
//! shapes of issue 40), timed: for each shape its forward (nothing recorded), its forward and
//! backward to the input (`dx`: the input requires a gradient, the weight is a constant), and its
//! forward and backward to the weight (`dw`), `f32`, on [`tensorscope::threads`] worker threads
//! (`TENSORSCOPE_THREADS`). Each case runs for about 0.3 s per round; a row gives the median over
//! the rounds of each round's median.
//!
//! `cargo run --release --example conv_table [-- --batch 4 --rounds 5 --only r64,down64 --json]`
//!
//! `--json` prints one line per case and round instead of the table, as
//! `scripts/conv_torch.py --vs BINARY` reads it: that script times PyTorch's convolutions on the same
//! shapes and runs this binary between its own rounds, so both sides' rounds alternate.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tensorscope::ops::ConvOptions;
use tensorscope::prelude::*;

/// A convolution of a UNet: name, input channels, image side, output channels, kernel side, stride.
/// Padding is `kernel / 2`. Keep in step with `SHAPES` in `scripts/conv_torch.py`.
const SHAPES: [(&str, usize, usize, usize, usize, usize); 7] = [
    ("in3", 3, 64, 64, 3, 1),
    ("r64", 64, 64, 64, 3, 1),
    ("down64", 64, 64, 64, 3, 2),
    ("r128", 128, 32, 128, 3, 1),
    ("r256", 256, 16, 256, 3, 1),
    ("p64to128", 64, 32, 128, 1, 1),
    ("p128to64", 128, 64, 64, 1, 1),
];

/// What a case times.
#[derive(Clone, Copy)]
enum Mode {
    Forward,
    Dx,
    Dw,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Forward, Mode::Dx, Mode::Dw];

    fn name(self) -> &'static str {
        match self {
            Mode::Forward => "fwd",
            Mode::Dx => "fwd+dx",
            Mode::Dw => "fwd+dw",
        }
    }
}

/// The median of `times`.
fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Calls `f` for about `budget` (at least three times) and gives the median call's milliseconds.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    median(&mut times)
}

struct Args {
    batch: usize,
    rounds: usize,
    only: Option<Vec<String>>,
    json: bool,
}

fn args() -> Args {
    let mut args = Args {
        batch: 4,
        rounds: 5,
        only: None,
        json: false,
    };
    let mut raw = std::env::args().skip(1);
    let fail = |message: String| -> ! {
        eprintln!("{message}");
        std::process::exit(2)
    };
    while let Some(name) = raw.next() {
        let mut value = || {
            raw.next()
                .unwrap_or_else(|| fail(format!("{name} needs a value")))
        };
        let number = |v: String| {
            v.parse()
                .unwrap_or_else(|_| fail(format!("{name} needs a whole number, not {v}")))
        };
        match name.as_str() {
            "--batch" => args.batch = number(value()),
            "--rounds" => args.rounds = number(value()),
            "--only" => args.only = Some(value().split(',').map(String::from).collect()),
            "--json" => args.json = true,
            other => fail(format!(
                "unknown argument {other}; accepted: --batch --rounds --only --json"
            )),
        }
    }
    args
}

fn main() {
    let args = args();
    let shapes: Vec<_> = SHAPES
        .iter()
        .filter(|s| {
            args.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|n| n == s.0))
        })
        .collect();
    if shapes.is_empty() {
        eprintln!(
            "--only names no shape; the shapes: {}",
            SHAPES.map(|s| s.0).join(", ")
        );
        std::process::exit(2);
    }
    let pool = Pool::with_max_memory_mb(4096);
    let budget = Duration::from_millis(300);
    let mut rows: Vec<(String, &str, Vec<f64>)> = Vec::new();
    for round in 0..args.rounds {
        for (i, &&(name, c_in, side, c_out, k, stride)) in shapes.iter().enumerate() {
            let n = args.batch;
            // Uniform on [-1, 1), the weight on PyTorch's default bound 1/sqrt(fan-in).
            let bound = 1.0 / ((c_in * k * k) as f64).sqrt();
            let (x, w) = pool.scope(|s| {
                let x = s.uniform::<f32>(&[n, c_in, side, side], -1.0, 1.0, 1);
                let w = s.uniform::<f32>(&[c_out, c_in, k, k], -bound, bound, 2);
                (x.detach(), w.detach())
            });
            let options = ConvOptions {
                stride,
                padding: k / 2,
                ..ConvOptions::default()
            };
            for (j, mode) in Mode::ALL.into_iter().enumerate() {
                let ms = match mode {
                    Mode::Forward => time(budget, || {
                        pool.scope(|s| {
                            let y = s.bind(&x).conv2d_with(&s.bind(&w), options);
                            black_box(y.as_slice().unwrap()[0]);
                        })
                    }),
                    Mode::Dx | Mode::Dw => time(budget, || {
                        pool.train(|s| {
                            // A bound parameter is a leaf in a training scope: the operand
                            // not differentiated is made a constant.
                            let (xs, ws) = match mode {
                                Mode::Dx => (s.bind(&x).requires_grad(), s.bind(&w).without_grad()),
                                _ => (s.bind(&x).without_grad(), s.bind(&w).requires_grad()),
                            };
                            let y = xs.conv2d_with(&ws, options);
                            let grads = y.backward_with(&s.ones::<f32>(y.shape())).unwrap();
                            let leaf = if matches!(mode, Mode::Dx) { &xs } else { &ws };
                            black_box(grads.of(leaf).unwrap().as_slice().unwrap()[0]);
                        })
                    }),
                };
                if args.json {
                    println!(
                        "{{\"shape\": \"{name}\", \"mode\": \"{}\", \"round\": {round}, \"ms\": {ms:.4}}}",
                        mode.name()
                    );
                }
                let at = i * Mode::ALL.len() + j;
                match rows.get_mut(at) {
                    Some(row) => row.2.push(ms),
                    None => rows.push((name.to_string(), mode.name(), vec![ms])),
                }
            }
        }
    }
    if args.json {
        return;
    }
    println!(
        "batch {}, {} threads, {} rounds: median ms",
        args.batch,
        tensorscope::threads(),
        args.rounds
    );
    println!("| shape | case | ms |");
    println!("| --- | --- | --- |");
    for (name, mode, mut times) in rows {
        println!("| {name} | {mode} | {:.3} |", median(&mut times));
    }
}
