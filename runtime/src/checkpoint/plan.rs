//! Where a forward stores checkpoints: each policy's plan.

use super::{schedule, CheckpointError, Checkpointer, Policy, Result};
use crate::element::Element;

impl<T: Element> Checkpointer<T> {
    /// Positions to store for `n` layers whose activations hold `activation_bytes` each (as `T`).
    pub(crate) fn plan(&self, n: usize, activation_elems: usize) -> Result<(Vec<usize>, usize)> {
        if n == 0 {
            return Ok((Vec::new(), 0));
        }
        let every = |k: usize| (0..n).step_by(k).collect::<Vec<_>>();
        let (plan, slots) = match &self.config.policy {
            Policy::Every(0) => {
                return Err(CheckpointError::InvalidPolicy(
                    "Every(0) has no step; use Every(k) with k >= 1".into(),
                ))
            }
            Policy::Every(k) => (every(*k), 0),
            Policy::Sqrt => (every(((n as f64).sqrt().ceil() as usize).max(1)), 0),
            Policy::Explicit(positions) => {
                if let Some(&p) = positions.iter().find(|&&p| p >= n) {
                    return Err(CheckpointError::InvalidPolicy(format!(
                        "explicit checkpoint position {p} is past the last of {n} layers"
                    )));
                }
                let mut plan = positions.clone();
                plan.push(0);
                plan.sort_unstable();
                plan.dedup();
                (plan, 0)
            }
            Policy::Budget(bytes) => {
                let data =
                    activation_elems.saturating_mul(self.config.precision.bytes_per_element::<T>());
                let per = crate::pool::class_bytes_of(data);
                let slots = bytes.checked_div(per).unwrap_or(n);
                if slots == 0 {
                    return Err(CheckpointError::InvalidPolicy(format!(
                        "a budget of {bytes} bytes holds no stored activation of {per} bytes \
                         ({data} bytes of data in the pool's size class)"
                    )));
                }
                let slots = slots.min(n.max(1));
                (schedule::binomial_chain(n, slots), slots)
            }
        };
        Ok((plan, slots))
    }
}
