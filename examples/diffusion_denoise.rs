//! The diffusion case the activation pool was made for: a small convolutional denoiser (convolutions,
//! group norm, SiLU, nearest upsampling, a skip connection) with activations like [1, 64, 64, 64],
//! run for 50 denoising steps on the pool, then the same loop with the pool's caching turned off
//! (every op a fresh allocation).
//!
//! `cargo run --release --example diffusion_denoise`

use std::time::Instant;

use tensorscope::prelude::*;

const CHANNELS: usize = 64;
const LATENT: usize = 4;
const SIZE: usize = 64;
const STEPS: usize = 50;
const GROUPS: usize = 8;

struct Denoiser {
    conv_in: Tensor<'static>,
    down: Tensor<'static>,
    mid: Tensor<'static>,
    up: Tensor<'static>,
    conv_out: Tensor<'static>,
}

fn kernel(s: &Scope<'_>, out: usize, inp: usize, seed: u64) -> Tensor<'static> {
    (s.randn::<f32>(&[out, inp, 3, 3], seed) * (1.0 / ((inp * 9) as f32).sqrt())).detach()
}

impl Denoiser {
    fn new(pool: &Pool) -> Self {
        pool.scope(|s| Denoiser {
            conv_in: kernel(s, CHANNELS, LATENT, 1),
            down: kernel(s, CHANNELS, CHANNELS, 2),
            mid: kernel(s, CHANNELS, CHANNELS, 3),
            up: kernel(s, CHANNELS, CHANNELS, 4),
            conv_out: (kernel(s, LATENT, CHANNELS, 5) * 0.1).detach(),
        })
    }

    /// The noise predicted in `x` ([1, 4, 64, 64]).
    #[dispose_scope]
    fn predict_noise<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h1 = x
            .conv2d(&self.conv_in, 1, 1)
            .group_norm(GROUPS, 1e-5)
            .silu(); // [1, 64, 64, 64]
        let h2 = h1.conv2d(&self.down, 2, 1).group_norm(GROUPS, 1e-5).silu(); // [1, 64, 32, 32]
        let h3 = h2.conv2d(&self.mid, 1, 1).group_norm(GROUPS, 1e-5).silu();
        let merged = h3.upsample_nearest2d(2) + &h1; // the skip connection
        let h4 = merged
            .conv2d(&self.up, 1, 1)
            .group_norm(GROUPS, 1e-5)
            .silu();
        h4.conv2d(&self.conv_out, 1, 1)
    }
}

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
        x.as_slice().iter().map(|v| v.abs()).sum::<f32>()
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

fn main() {
    let pool = Pool::with_max_memory_mb(2048);
    let model = Denoiser::new(&pool);
    let activation = CHANNELS * SIZE * SIZE * 4;
    println!(
        "{STEPS} denoising steps of a [1, {LATENT}, {SIZE}, {SIZE}] latent; activations up to \
         [1, {CHANNELS}, {SIZE}, {SIZE}] ({activation} B)\n"
    );
    let pooled = denoise(&pool, &model);
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
}
