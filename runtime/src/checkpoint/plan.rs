//! Where a forward stores checkpoints: each policy's plan.

use super::{schedule, CheckpointConfig, CheckpointError, Policy, Result};
use crate::element::Element;

impl CheckpointConfig {
    /// Writes into `plan` (emptied first) the positions to store for `n` layers whose activations
    /// hold `activation_elems` elements of `T` each, and returns the slots of the binomial schedule
    /// (`Budget`; 0 otherwise). Written into the caller's list, so that a training loop plans
    /// without allocating.
    pub(crate) fn plan<T: Element>(
        &self,
        n: usize,
        activation_elems: usize,
        plan: &mut Vec<usize>,
    ) -> Result<usize> {
        plan.clear();
        if n == 0 {
            return Ok(0);
        }
        match &self.policy {
            Policy::Every(0) => Err(CheckpointError::InvalidPolicy(
                "Every(0) has no step; use Every(k) with k >= 1".into(),
            )),
            Policy::Every(k) => {
                plan.extend((0..n).step_by(*k));
                Ok(0)
            }
            Policy::Sqrt | Policy::Memory(_) => {
                plan.extend((0..n).step_by(((n as f64).sqrt().ceil() as usize).max(1)));
                Ok(0)
            }
            Policy::Explicit(positions) => {
                if let Some(&p) = positions.iter().find(|&&p| p >= n) {
                    return Err(CheckpointError::InvalidPolicy(format!(
                        "explicit checkpoint position {p} is past the last of {n} layers"
                    )));
                }
                plan.extend_from_slice(positions);
                plan.push(0);
                plan.sort_unstable();
                plan.dedup();
                Ok(0)
            }
            Policy::Budget(bytes) => {
                let data = activation_elems.saturating_mul(self.precision.bytes_per_element::<T>());
                let per = crate::pool::class_bytes_of(data);
                let slots = bytes.checked_div(per).unwrap_or(n);
                if slots == 0 {
                    return Err(CheckpointError::InvalidPolicy(format!(
                        "a budget of {bytes} bytes holds no stored activation of {per} bytes \
                         ({data} bytes of data in the pool's size class)"
                    )));
                }
                let slots = slots.min(n.max(1));
                schedule::binomial_chain(n, slots, plan);
                Ok(slots)
            }
        }
    }
}
