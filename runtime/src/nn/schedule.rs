//! Learning-rate schedules: the rate of each optimizer step, from its index.

use std::f64::consts::PI;

/// The learning rate of each step, numbered from 0: set it before each step with
/// [`Optimizer::set_lr`](super::Optimizer::set_lr) (PyTorch's `torch.optim.lr_scheduler`, without
/// the scheduler object's state: a schedule is a function of the step, so a resumed run needs only
/// its step count). A closure `Fn(u64) -> f64` is a schedule too.
///
/// ```
/// use tensorscope::nn::{Adam, Linear, Module, Optimizer, Schedule, WarmupCosine};
/// use tensorscope::{Pool, TensorOps};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let mut model = Linear::new(&pool, 4, 1, 0).unwrap();
/// let schedule = WarmupCosine { lr: 1e-2, warmup: 2, total: 10, min_lr: 0.0 };
/// let mut adam = Adam::new(0.0);
/// for step in 0..10 {
///     adam.set_lr(schedule.lr(step) as f32);
///     pool.train(|s| {
///         let y = model.forward(&s.ones::<f32>(&[2, 4])).unwrap();
///         let loss = (&y * &y).mean_all();
///         adam.step(&mut model, &loss.backward().unwrap()).unwrap();
///     });
/// }
/// assert_eq!(schedule.lr(0), 0.0);
/// assert_eq!(schedule.lr(2), 1e-2);
/// assert!(schedule.lr(9) < 1e-3);
/// ```
pub trait Schedule {
    /// The learning rate of step `step` (0 for the first).
    fn lr(&self, step: u64) -> f64;
}

impl<F: Fn(u64) -> f64> Schedule for F {
    fn lr(&self, step: u64) -> f64 {
        self(step)
    }
}

/// The same rate at every step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constant(pub f64);

impl Schedule for Constant {
    fn lr(&self, _: u64) -> f64 {
        self.0
    }
}

/// `lr` times `gamma` every `every` steps (PyTorch's `StepLR`): `lr gamma^(step / every)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepDecay {
    /// The rate of the first steps.
    pub lr: f64,
    /// Steps between decays (at least 1).
    pub every: u64,
    /// The factor of each decay.
    pub gamma: f64,
}

impl Schedule for StepDecay {
    fn lr(&self, step: u64) -> f64 {
        let decays = step / self.every.max(1);
        self.lr * self.gamma.powi(decays.min(i32::MAX as u64) as i32)
    }
}

/// A linear warm-up from 0 over `warmup` steps, then a half cosine from `lr` down to `min_lr` at
/// step `total` (the schedule of most transformer training). Step `s < warmup` has
/// `lr s / warmup` (step 0 has 0); step `s >= warmup` has
/// `min_lr + (lr - min_lr) (1 + cos(pi (s - warmup) / (total - warmup))) / 2`, and `min_lr` from
/// `total` on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupCosine {
    /// The peak rate, reached at step `warmup`.
    pub lr: f64,
    /// Steps of the linear warm-up.
    pub warmup: u64,
    /// The step at which the rate reaches `min_lr`.
    pub total: u64,
    /// The final rate.
    pub min_lr: f64,
}

impl Schedule for WarmupCosine {
    fn lr(&self, step: u64) -> f64 {
        let fall = |progress: f64| 0.5 * (1.0 + (PI * progress).cos());
        warm_up_then(step, self.warmup, self.total, self.lr, self.min_lr, fall)
    }
}

/// A linear warm-up from 0 over `warmup` steps, then a straight line from `lr` down to `end_lr` at
/// step `total` (PyTorch's `LinearLR` after a warm-up; `transformers`' linear schedule).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmupLinear {
    /// The peak rate, reached at step `warmup`.
    pub lr: f64,
    /// Steps of the linear warm-up.
    pub warmup: u64,
    /// The step at which the rate reaches `end_lr`.
    pub total: u64,
    /// The final rate.
    pub end_lr: f64,
}

impl Schedule for WarmupLinear {
    fn lr(&self, step: u64) -> f64 {
        warm_up_then(step, self.warmup, self.total, self.lr, self.end_lr, |p| {
            1.0 - p
        })
    }
}

/// The rate of `step` under a linear warm-up from 0 to `peak` over `warmup` steps, then from `peak`
/// to `end` at `total` along `fall` (1 at progress 0, 0 at progress 1), and `end` after.
fn warm_up_then(
    step: u64,
    warmup: u64,
    total: u64,
    peak: f64,
    end: f64,
    fall: impl Fn(f64) -> f64,
) -> f64 {
    if step < warmup {
        return peak * step as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup);
    if step >= total || span == 0 {
        return end;
    }
    end + (peak - end) * fall((step - warmup) as f64 / span as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedules_give_pytorchs_rates() {
        let cosine = WarmupCosine {
            lr: 3e-3,
            warmup: 50,
            total: 690,
            min_lr: 0.0,
        };
        assert_eq!(cosine.lr(0), 0.0);
        assert_eq!(cosine.lr(25), 1.5e-3);
        assert_eq!(cosine.lr(50), 3e-3);
        assert!((cosine.lr(370) - 1.5e-3).abs() < 1e-15, "half way down");
        assert_eq!(cosine.lr(690), 0.0);
        assert!(cosine.lr(689) > 0.0 && cosine.lr(689) < 1e-7);
        let linear = WarmupLinear {
            lr: 1.0,
            warmup: 0,
            total: 4,
            end_lr: 0.0,
        };
        let rates: Vec<f64> = (0..6).map(|s| linear.lr(s)).collect();
        assert_eq!(rates, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]);
        let step = StepDecay {
            lr: 1.0,
            every: 2,
            gamma: 0.5,
        };
        let rates: Vec<f64> = (0..5).map(|s| step.lr(s)).collect();
        assert_eq!(rates, [1.0, 1.0, 0.5, 0.5, 0.25]);
        assert_eq!(Constant(0.1).lr(1000), 0.1);
        assert_eq!((|s: u64| s as f64).lr(3), 3.0);
    }
}
