//! A DDPM's noise schedule (Ho et al. 2020: `T` betas linear from 1e-4 to 0.02) and its two
//! samplers: DDPM's (every timestep, fresh noise at each) and DDIM's (Song et al. 2021: an evenly
//! spaced subset of the timesteps, no noise after the first draw). Both predict the clean image
//! at each step and clip it to [-1, 1], as `diffusers`' schedulers do by default.
//!
//! Shared by `examples/ddpm.rs`, `tests/ddpm.rs` and `tests/allocations.rs` through `#[path]`,
//! each beside `ddpm_unet.rs`.

#![allow(dead_code)] // each user needs a different part

use std::fmt;

use super::ddpm_unet::Unet;
use tensorscope::prelude::*;
use tensorscope::Result;

/// Which sampler draws the images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sampler {
    /// Ancestral sampling through every timestep.
    Ddpm,
    /// Deterministic sampling through `steps` evenly spaced timesteps.
    Ddim { steps: usize },
}

impl Sampler {
    /// The model evaluations it takes on a schedule of `timesteps`.
    pub(crate) fn steps(self, timesteps: usize) -> usize {
        match self {
            Sampler::Ddpm => timesteps,
            Sampler::Ddim { steps } => steps.clamp(1, timesteps),
        }
    }
}

impl fmt::Display for Sampler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sampler::Ddpm => write!(f, "DDPM"),
            Sampler::Ddim { steps } => write!(f, "DDIM ({steps} steps)"),
        }
    }
}

/// The noise schedule: `alpha_bar[t]`, the share of the clean image's variance left at `t`.
pub(crate) struct Diffusion {
    alpha_bar: Vec<f64>,
    /// `sqrt(alpha_bar)` and `sqrt(1 - alpha_bar)`, `[T]`, to look up a batch's timesteps.
    signal: Param,
    noise: Param,
}

impl Diffusion {
    /// Ho et al.'s schedule of `timesteps` betas, linear from 1e-4 to 0.02.
    pub(crate) fn linear(pool: &Pool, timesteps: usize) -> Self {
        let mut left = 1.0;
        let alpha_bar: Vec<f64> = (0..timesteps)
            .map(|t| {
                let beta = 1e-4 + (0.02 - 1e-4) * t as f64 / (timesteps.max(2) - 1) as f64;
                left *= 1.0 - beta;
                left
            })
            .collect();
        let table = |f: fn(f64) -> f64| {
            let values: Vec<f32> = alpha_bar.iter().map(|&a| f(a) as f32).collect();
            Param::from_slice(pool, &[timesteps], &values)
        };
        Diffusion {
            signal: table(f64::sqrt),
            noise: table(|a| (1.0 - a).sqrt()),
            alpha_bar,
        }
    }

    /// The number of timesteps.
    pub(crate) fn timesteps(&self) -> usize {
        self.alpha_bar.len()
    }

    /// `x0` noised to timesteps `t` (`[b]`): `sqrt(alpha_bar[t]) x0 + sqrt(1 - alpha_bar[t]) noise`.
    pub(crate) fn add_noise<'a>(
        &self,
        x0: &Tensor<'a>,
        noise: &Tensor<'a>,
        t: &Tensor<'a, i64>,
    ) -> Tensor<'a> {
        let per_image = |table: &Param| {
            let column = x0.bind(table).without_grad().index_select(0, t);
            column.reshape(&[t.len(), 1, 1, 1])
        };
        x0 * &per_image(&self.signal) + &(noise * &per_image(&self.noise))
    }

    /// `shape` images drawn by `sampler` from `model`'s noise predictions, starting from normal
    /// noise of `seed`; `each(i)` is called after the `i`-th step (from 1). Every step's
    /// temporaries are returned to the pool before the next.
    pub(crate) fn sample(
        &self,
        pool: &Pool,
        model: &Unet,
        sampler: Sampler,
        shape: [usize; 4],
        seed: u64,
        each: &mut dyn FnMut(usize),
    ) -> Result<Vec<f32>> {
        let total = self.timesteps();
        let steps = sampler.steps(total);
        // The timesteps visited, from the noisiest down (DDIM's `t_i = i T / steps`).
        let at = |i: usize| match sampler {
            Sampler::Ddpm => i,
            Sampler::Ddim { .. } => i * total / steps,
        };
        pool.scope(|s| {
            let mut x = s.try_randn::<f32>(&shape, seed)?;
            for i in (0..steps).rev() {
                let t = at(i);
                let (ab, ab_prev) = (
                    self.alpha_bar[t],
                    i.checked_sub(1).map_or(1.0, |p| self.alpha_bar[at(p)]),
                );
                let eps = model.forward(&x, &s.try_full::<f32>(&[shape[0]], t as f32)?)?;
                let x0 = ((&x - &(eps * (1.0 - ab).sqrt() as f32)) * (1.0 / ab.sqrt()) as f32)
                    .clamp(-1.0, 1.0);
                x = match sampler {
                    Sampler::Ddpm => {
                        // The posterior q(x_{t-1} | x_t, x0): its mean, and its variance's noise.
                        let beta = 1.0 - ab / ab_prev;
                        let mean = x0 * (ab_prev.sqrt() * beta / (1.0 - ab)) as f32
                            + &(&x * ((1.0 - beta).sqrt() * (1.0 - ab_prev) / (1.0 - ab)) as f32);
                        match t {
                            0 => mean,
                            _ => {
                                let sigma = (beta * (1.0 - ab_prev) / (1.0 - ab)).sqrt() as f32;
                                mean + &(s.try_randn::<f32>(&shape, seed + 1 + t as u64)? * sigma)
                            }
                        }
                    }
                    Sampler::Ddim { .. } => {
                        // The noise that x0 implies, carried to the previous timestep.
                        let eps =
                            (&x - &(&x0 * ab.sqrt() as f32)) * (1.0 / (1.0 - ab).sqrt()) as f32;
                        x0 * ab_prev.sqrt() as f32 + &(eps * (1.0 - ab_prev).sqrt() as f32)
                    }
                };
                each(steps - i);
            }
            Ok(x.to_vec())
        })
    }
}
