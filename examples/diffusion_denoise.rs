//! The diffusion case the activation pool was made for: a small convolutional denoiser (convolutions,
//! group norm, SiLU, nearest upsampling, a skip connection) with activations like [1, 64, 64, 64],
//! run for 50 denoising steps on the pool, then the same loop with the pool's caching turned off
//! (every op a fresh allocation).
//!
//! `cargo run --release --example diffusion_denoise [-- --timeline DIR]`
//!
//! With `--timeline DIR` it also writes the pooled run's memory timeline (bytes in use and cached
//! after every rent and return) to `DIR/memory.svg` (a plot) and the pool's trace to
//! `DIR/memory.trace.json` (a Chrome trace of every rent and return with its scope and op, and the
//! scopes as slices: open it in Perfetto or `chrome://tracing`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use tensorscope::prelude::*;
use tensorscope::TimelinePoint;

#[path = "common/denoiser.rs"]
mod denoiser;

use denoiser::Denoiser;

const CHANNELS: usize = 64;
const LATENT: usize = 4;
const SIZE: usize = 64;
const STEPS: usize = 50;
const GROUPS: usize = 8;

struct Run {
    millis: f64,
    stats: tensorscope::PoolStats,
    checksum: f32,
}

fn denoise(pool: &Pool, model: &Denoiser) -> Run {
    let before = pool.stats();
    pool.reset_peak();
    let started = Instant::now();
    let checksum = pool.scope(|s| {
        let mut x = s.randn::<f32>(&[1, LATENT, SIZE, SIZE], 42);
        for _ in 0..STEPS {
            let noise = model.predict_noise(&x);
            x = x - &(noise * 0.05);
        }
        x.view().iter().map(|v| v.abs()).sum::<f32>()
    });
    let mut stats = pool.stats();
    stats.hits -= before.hits;
    stats.misses -= before.misses;
    stats.peak_bytes_in_use -= before.bytes_in_use;
    Run {
        millis: started.elapsed().as_secs_f64() * 1e3,
        stats,
        checksum,
    }
}

const MIB: f64 = (1 << 20) as f64;
const PLOTTED_STEPS: usize = 4;

/// Writes the first `PLOTTED_STEPS` steps of `points` as an SVG step plot of the bytes in use and
/// cached (the whole run is too dense to read; the trace keeps all of it).
fn write_svg(points: &[TimelinePoint], path: &Path) -> std::io::Result<()> {
    const W: f64 = 900.0;
    const H: f64 = 340.0;
    // The plotting area, inside the axes' labels.
    let (left, right, top, bottom) = (70.0, W - 20.0, 40.0, H - 45.0);
    let points = &points[..(points.len() * PLOTTED_STEPS / STEPS + 1).min(points.len())];
    let ms = |p: &TimelinePoint| p.micros as f64 / 1e3;
    let end = points.last().map_or(1.0, ms).max(1.0);
    let most = points
        .iter()
        .map(|p| (p.bytes_in_use + p.bytes_cached) as f64 / MIB)
        .fold(1.0, f64::max)
        * 1.1;
    let x = |t: f64| left + (right - left) * t / end;
    let y = |mib: f64| bottom - (bottom - top) * mib / most;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" font-size=\"16\" text-anchor=\"middle\">pool memory, the first \
         {PLOTTED_STEPS} of {STEPS} denoising steps</text>\n\
         <path d=\"M{left},{top}V{bottom}H{right}\" fill=\"none\" stroke=\"black\"/>\n",
        W / 2.0
    );
    for i in 0..=5 {
        let (t, mib) = (end * i as f64 / 5.0, most * i as f64 / 5.0);
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{t:.0}</text>\n\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{mib:.0}</text>\n",
            x(t),
            bottom + 16.0,
            left - 6.0,
            y(mib) + 4.0
        );
    }
    svg += &format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">ms</text>\n\
         <text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">MiB</text>\n",
        (left + right) / 2.0,
        H - 8.0,
        (top + bottom) / 2.0,
        (top + bottom) / 2.0
    );
    /// Bytes in use or cached at a point of the timeline.
    type Figure = fn(&TimelinePoint) -> usize;
    let series: [(&str, &str, Figure); 2] = [
        ("in use", "blue", |p| p.bytes_in_use),
        ("cached (idle)", "red", |p| p.bytes_cached),
    ];
    for (i, (label, color, value)) in series.into_iter().enumerate() {
        // A step plot: a figure holds until the next rent or return changes it.
        let mut d = String::new();
        for (k, p) in points.iter().enumerate() {
            let v = y(value(p) as f64 / MIB);
            d += &match k {
                0 => format!("M{:.1},{v:.1}", x(ms(p))),
                _ => format!("H{:.1}V{v:.1}", x(ms(p))),
            };
        }
        let ly = top + 16.0 * (i as f64 + 1.0);
        svg += &format!(
            "<path d=\"{d}\" fill=\"none\" stroke=\"{color}\"/>\n\
             <path d=\"M{},{ly}h20\" stroke=\"{color}\"/>\n\
             <text x=\"{}\" y=\"{}\">{label}</text>\n",
            left + 10.0,
            left + 36.0,
            ly + 4.0
        );
    }
    svg += "</svg>\n";
    std::fs::write(path, svg)
}

fn timeline_dir() -> Option<PathBuf> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => None,
        [flag, dir] if flag == "--timeline" => Some(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: diffusion_denoise [--timeline DIR]");
            std::process::exit(2)
        }
    }
}

fn main() {
    let timeline = timeline_dir();
    let pool = Pool::with_max_memory_mb(2048);
    let model = Denoiser::new(&pool, LATENT, CHANNELS, GROUPS);
    let activation = CHANNELS * SIZE * SIZE * 4;
    println!(
        "{STEPS} denoising steps of a [1, {LATENT}, {SIZE}, {SIZE}] latent; activations up to \
         [1, {CHANNELS}, {SIZE}, {SIZE}] ({activation} B)\n"
    );
    if timeline.is_some() {
        pool.start_trace();
    }
    let pooled = denoise(&pool, &model);
    let trace = pool.finish_trace();
    let points = trace.timeline();
    pool.set_caching(false);
    let fresh = denoise(&pool, &model);
    pool.set_caching(true);

    println!(
        "{:<18} {:>10} {:>8} {:>8} {:>9} {:>14}",
        "", "time", "hits", "misses", "hit ratio", "peak B in use"
    );
    for (name, run) in [("pooled", &pooled), ("fresh allocation", &fresh)] {
        let s = &run.stats;
        println!(
            "{name:<18} {:>7.0} ms {:>8} {:>8} {:>9.3} {:>14}",
            run.millis,
            s.hits,
            s.misses,
            s.hits as f64 / (s.hits + s.misses).max(1) as f64,
            s.peak_bytes_in_use
        );
    }
    println!(
        "\nSame model, same code: the pool served {} of {} rents from its cache; without it every op \
         allocated afresh, {:.2}x the time. Both runs compute the same result ({:.3} and {:.3}).",
        pooled.stats.hits,
        pooled.stats.hits + pooled.stats.misses,
        fresh.millis / pooled.millis,
        pooled.checksum,
        fresh.checksum
    );
    assert_eq!(pooled.checksum, fresh.checksum);

    if let Some(dir) = timeline {
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("cannot create {}: {e}", dir.display());
            std::process::exit(1);
        }
        let (svg, trace_path) = (dir.join("memory.svg"), dir.join("memory.trace.json"));
        if let Err(e) = write_svg(&points, &svg) {
            eprintln!("cannot write {}: {e}", svg.display());
            std::process::exit(1);
        }
        if let Err(e) = trace.save(&trace_path) {
            eprintln!("{e}");
            std::process::exit(1);
        }
        println!(
            "\n{} timeline points written to {}, {} trace events to {}",
            points.len(),
            svg.display(),
            trace.events().len(),
            trace_path.display()
        );
    }
}
