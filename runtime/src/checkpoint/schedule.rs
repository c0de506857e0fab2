//! Where checkpoints go: the policies' plans and binomial checkpointing (Griewank and Walther's
//! revolve) for a memory budget.
//!
//! **Cost model.** A forward over `n` layers computes `a_1 .. a_n` from the input `a_0`; the backward
//! then needs `a_{n-1}, .., a_0`, in that order. With `s` slots for stored activations (the input's
//! included), the forward stores a chain of checkpoints and the reverse sweep recomputes the rest,
//! reusing slots as they free up. A layer step costs one forward evaluation.
//!
//! **The formula.** With every advance paid, Griewank and Walther (2000, "Algorithm 799: revolve")
//! show the fewest forward steps that reverse `l` steps with `s` slots is
//!
//! ```text
//! t(l, s) = r * l - C(s + r, s + 1),   r the least integer with C(s + r, s) >= l,
//! ```
//!
//! where `C(s + r, s) = beta(s, r)` is the number of steps `s` slots can reverse with at most `r`
//! evaluations of any step. Our forward pass itself is free (it has to run anyway) but does not keep
//! `a_{n-1}`, so reversing `n` layers costs what reversing `n + 1` states costs minus the `n` steps of
//! the forward sweep: **recomputed steps = t(n + 1, s) - n**. The tests check this against the dynamic
//! program it comes from and against the steps the reverse sweep actually runs.

/// `C(n, k)`, saturating at `u128::MAX`.
fn binomial(n: u64, k: u64) -> u128 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    (0..k).fold(1u128, |acc, i| {
        acc.saturating_mul(u128::from(n - i)) / u128::from(i + 1)
    })
}

/// Griewank and Walther's `t(l, s)`: the fewest forward steps that reverse `l` steps from a stored
/// start with `s` slots, every advance paid. Computed in 128 bits and saturated at `u64::MAX`.
///
/// # Panics
/// If `s == 0`: without a slot even the start cannot be kept.
pub fn revolve_forward_steps(l: u64, s: u64) -> u64 {
    assert!(s >= 1, "revolve needs at least one slot");
    if l <= 1 {
        return 0;
    }
    let l = u128::from(l);
    if u128::from(s) + 1 >= l {
        // A slot for every state: each step once (r = 1, and C(s + 1, s + 1) = 1).
        return saturate(l - 1);
    }
    if s == 1 {
        return saturate(l * (l - 1) / 2);
    }
    // The least r with C(s + r, s) >= l; C grows with r, and r = l - 1 always suffices.
    let (mut lo, mut hi) = (1u64, u64::try_from(l - 1).unwrap_or(u64::MAX));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if binomial(s.saturating_add(mid), s) >= l {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let r = lo;
    let subtracted = binomial(s.saturating_add(r), s.saturating_add(1));
    saturate((u128::from(r) * l).saturating_sub(subtracted))
}

fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Layer steps the reverse sweep recomputes for `n` layers with `s` slots under the binomial
/// schedule: `t(n + 1, s) - n`, saturated.
///
/// # Panics
/// If `s == 0`.
pub fn binomial_recompute_steps(n: u64, s: u64) -> u64 {
    match revolve_forward_steps(n.saturating_add(1), s) {
        u64::MAX => u64::MAX,
        t => t - n,
    }
}

/// The split of a paid reversal of `l` steps with `s >= 2` slots: advance `m` steps, store, reverse
/// the right part with one slot fewer, then the left part with all of them.
pub(crate) fn paid_split(l: u64, s: u64) -> u64 {
    (1..l)
        .min_by_key(|&m| m + revolve_forward_steps(l - m, s - 1) + revolve_forward_steps(m, s))
        .unwrap_or(1)
}

/// The split of the forward sweep: where the next chain checkpoint goes, `m` steps on, for `l` steps
/// left and `s >= 2` slots.
pub(crate) fn sweep_split(l: u64, s: u64) -> u64 {
    (1..l)
        .min_by_key(|&m| binomial_recompute_steps(l - m, s - 1) + revolve_forward_steps(m, s))
        .unwrap_or(1)
}

/// Positions (0-based, `< n`) of the checkpoints the forward sweep stores under the binomial
/// schedule with `s` slots: a chain that starts at the input.
pub(crate) fn binomial_chain(n: usize, s: usize) -> Vec<usize> {
    let mut chain = vec![0];
    let (mut pos, mut left, mut slots) = (0u64, n as u64, s as u64);
    while left > 1 && slots > 1 {
        let m = sweep_split(left, slots);
        pos += m;
        chain.push(pos as usize);
        left -= m;
        slots -= 1;
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dynamic programs the formulas come from, written out plainly.
    fn paid_dp(l: u64, s: u64, memo: &mut std::collections::HashMap<(u64, u64), u64>) -> u64 {
        if l <= 1 {
            return 0;
        }
        if s == 1 {
            return l * (l - 1) / 2;
        }
        if let Some(&v) = memo.get(&(l, s)) {
            return v;
        }
        let v = (1..l)
            .map(|m| m + paid_dp(l - m, s - 1, memo) + paid_dp(m, s, memo))
            .min()
            .unwrap();
        memo.insert((l, s), v);
        v
    }

    fn sweep_dp(l: u64, s: u64, memo: &mut std::collections::HashMap<(u64, u64), u64>) -> u64 {
        if l <= 1 {
            return 0;
        }
        if s == 1 {
            return l * (l - 1) / 2;
        }
        (1..l)
            .map(|m| sweep_dp(l - m, s - 1, memo) + paid_dp(m, s, memo))
            .min()
            .unwrap()
    }

    #[test]
    fn closed_form_matches_the_dynamic_program() {
        let mut memo = Default::default();
        for s in 1..=6 {
            for l in 1..=60 {
                assert_eq!(
                    revolve_forward_steps(l, s),
                    paid_dp(l, s, &mut memo),
                    "l={l} s={s}"
                );
            }
        }
        for s in 1..=5 {
            for n in 1..=30 {
                assert_eq!(
                    binomial_recompute_steps(n, s),
                    sweep_dp(n, s, &mut memo),
                    "n={n} s={s}"
                );
            }
        }
    }

    #[test]
    fn known_values() {
        // beta(s, r) = C(s + r, s) steps need at most r evaluations each.
        assert_eq!(binomial(6, 3), 20);
        assert_eq!(revolve_forward_steps(20, 3), 3 * 20 - 15);
        // With a slot per layer nothing is recomputed; with one slot, everything is, quadratically.
        assert_eq!(binomial_recompute_steps(16, 16), 0);
        assert_eq!(binomial_recompute_steps(16, 1), 16 * 15 / 2);
        assert_eq!(binomial_chain(16, 16), (0..16).collect::<Vec<_>>());
        assert_eq!(binomial_chain(16, 1), vec![0]);
    }

    #[test]
    fn huge_inputs_saturate_instead_of_overflowing() {
        // t(2^50, 2) is about 5.3e22, past u64.
        assert_eq!(revolve_forward_steps(1 << 50, 2), u64::MAX);
        assert_eq!(
            revolve_forward_steps(1 << 28, 1),
            (1u64 << 28) * ((1 << 28) - 1) / 2
        );
        assert_eq!(revolve_forward_steps(5, u64::MAX), 4);
        assert_eq!(binomial_recompute_steps(u64::MAX, 3), u64::MAX);
        assert_eq!(binomial_recompute_steps(1000, 1000), 0);
    }
}
