//! The measured training loop of the training examples: Adam steps in a pool of the row's own, the
//! gradients kept in a scope around a chunk of steps and zeroed after each update, and each step's
//! time and peak pool bytes beyond what was in use before it.
//!
//! Shared by `examples/checkpointed_training.rs`, `examples/gpt.rs` and
//! `examples/checkpoint_curve.rs` through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use std::ops::Range;
use std::time::Instant;

use tensorscope::nn::{Adam, Optimizer};
use tensorscope::prelude::*;
use tensorscope::{Gradients, Parameters};

/// Steps a row runs before the next row takes its turn: rows that alternate in chunks see the same
/// drift in the machine's speed.
pub(crate) const CHUNK: usize = 5;

/// What one row's steps measured.
#[derive(Default)]
pub(crate) struct Measured {
    /// Milliseconds of each measured step.
    pub(crate) times: Vec<f64>,
    /// The loss of every step.
    pub(crate) losses: Vec<f32>,
    /// The largest pool bytes a measured step rented beyond what was in use before it.
    pub(crate) peak: usize,
}

impl Measured {
    /// Runs steps `steps` of `model` in `pool`: `loss_of(model, scope, step, grads)` runs the
    /// forward and the backward into `grads` and returns the loss, then Adam updates the model.
    /// After a chunk's first step (and the first two overall) the gradients and Adam's moments
    /// hold their memory, so what a step rents beyond them is activations: those steps are
    /// measured. `name` labels a failure.
    pub(crate) fn run<M: Parameters<f32>>(
        &mut self,
        name: &str,
        pool: &Pool,
        model: &mut M,
        adam: &mut Adam,
        steps: Range<usize>,
        mut loss_of: impl FnMut(&mut M, &Scope<'_, '_>, usize, &mut Gradients<'_>) -> f32,
    ) {
        let first = steps.start;
        pool.scope(|outer| {
            let mut grads = Gradients::new(outer);
            for step in steps {
                let baseline = pool.stats().bytes_in_use;
                pool.reset_peak();
                let started = Instant::now();
                let loss = outer.scope(|s| loss_of(model, s, step, &mut grads));
                adam.step(model, &grads)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                grads.zero().unwrap_or_else(|e| panic!("{name}: {e}"));
                if step > first && step > 1 {
                    self.times.push(started.elapsed().as_secs_f64() * 1e3);
                    self.peak = self.peak.max(pool.stats().peak_bytes_in_use - baseline);
                }
                self.losses.push(loss);
            }
        });
    }

    /// The median of the measured step times, in milliseconds.
    pub(crate) fn median_ms(&self) -> f64 {
        let mut times = self.times.clone();
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    }
}
