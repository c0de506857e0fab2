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

/// `C(n, k)` exactly if it is below `cap`, else `None` (also when a product overflows `u128`).
///
/// The partial products `C(n, 0), C(n, 1), .., C(n, min(k, n - k))` increase and `C(n, i) >= 2^i`,
/// so the loop stops within 128 steps for any `cap`, however large `k` is: that is what keeps
/// `revolve_forward_steps(2^60, 2^26)` from running 2^26 multiplications per probe.
fn binomial_below(n: u64, k: u64, cap: u128) -> Option<u128> {
    if k > n {
        return (cap > 0).then_some(0);
    }
    let k = k.min(n - k);
    let mut acc = 1u128;
    for i in 0..k {
        // Exact: C(n, i) (n - i) = C(n, i + 1) (i + 1).
        acc = acc.checked_mul(u128::from(n - i))? / u128::from(i + 1);
        if acc >= cap {
            return None;
        }
    }
    (acc < cap).then_some(acc)
}

/// `beta(s, r) = C(s + r, s)`, the steps `s` slots reverse with at most `r` evaluations of each, if
/// it is below `cap`.
fn beta_below(s: u64, r: u64, cap: u128) -> Option<u128> {
    // Past u64, C(s + r, s) >= s + r > any cap a caller passes (at most 2^64).
    binomial_below(s.checked_add(r)?, s, cap)
}

/// The repetition number of `l >= 2` steps with `s >= 1` slots: the least `r` with
/// `beta(s, r) >= l`. Found by doubling then bisection, each probe stopping early.
fn repetitions(l: u64, s: u64) -> u64 {
    let reaches = |r: u64| beta_below(s, r, u128::from(l)).is_none();
    let mut hi = 1u64;
    while !reaches(hi) {
        // beta(s, l - 1) >= l, so this stops by then.
        hi = hi.saturating_mul(2);
    }
    let mut lo = hi / 2 + 1;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if reaches(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// `t(l, s)` in 128 bits, unsaturated (it is below `r l < 2^128`).
fn forward_steps(l: u64, s: u64) -> u128 {
    if l <= 1 {
        return 0;
    }
    let l128 = u128::from(l);
    if s == 1 {
        return l128 * (l128 - 1) / 2;
    }
    if s >= l - 1 {
        // A slot for every state: each step once.
        return l128 - 1;
    }
    let r = repetitions(l, s);
    let total = u128::from(r) * l128;
    // C(s + r, s + 1) <= r l, as t >= 0.
    let subtracted =
        binomial_below(s + r, s + 1, total + 1).expect("C(s + r, s + 1) is at most r l");
    total - subtracted
}

/// Griewank and Walther's `t(l, s)`: the fewest forward steps that reverse `l` steps from a stored
/// start with `s` slots, every advance paid. Computed in 128 bits and saturated at `u64::MAX`;
/// a few hundred arithmetic steps whatever `l` and `s` are.
///
/// # Panics
/// If `s == 0`: without a slot even the start cannot be kept.
pub fn revolve_forward_steps(l: u64, s: u64) -> u64 {
    assert!(s >= 1, "revolve needs at least one slot");
    saturate(forward_steps(l, s))
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
    assert!(s >= 1, "revolve needs at least one slot");
    match n.checked_add(1) {
        Some(l) => saturate(forward_steps(l, s) - u128::from(n)),
        None => u64::MAX,
    }
}

/// The split of a paid reversal of `l` steps with `s >= 2` slots: advance `m` steps, store, reverse
/// the right part with one slot fewer, then the left part with all of them. Returns the least `m`
/// in `1..l` with `m + t(m, s) + t(l - m, s - 1) = t(l, s)`, in closed form.
///
/// `t(., s)` is convex and piecewise linear: with `r` the repetition number of `l`, its piece of
/// slope `r - 1` is exact on `[beta(s, r - 2), beta(s, r - 1)]` and lies below it elsewhere, and
/// `t(., s - 1)`'s piece of slope `r` is exact on `[beta(s - 1, r - 1), beta(s - 1, r)]`. Their sum
/// with `m` is `r l - beta(s + 1, r - 1) = t(l, s)` (Pascal's rule), so the optimal splits are the
/// `m` where both pieces are exact: from `max(beta(s, r - 2), l - beta(s - 1, r))` on. The tests
/// check this against the brute-force minimum.
pub(crate) fn paid_split(l: u64, s: u64) -> u64 {
    if l <= 2 {
        return 1;
    }
    let r = repetitions(l, s);
    let cap = u128::from(l);
    // beta(s, r - 2) < beta(s, r - 1) < l, so both are exact below the cap.
    let left = match r {
        0 | 1 => 0,
        _ => beta_below(s, r - 2, cap).expect("beta(s, r - 2) < l"),
    };
    let right = beta_below(s - 1, r, cap).map_or(0, |b| cap - b);
    let m = left.max(right).clamp(1, cap - 1);
    u64::try_from(m).expect("m < l")
}

/// The split of the forward sweep: where the next chain checkpoint goes, `m` steps on, for `l`
/// steps left and `s >= 2` slots. Minimising `recompute(l - m, s - 1) + t(m, s)`, with
/// `recompute(q, s) = t(q + 1, s) - q`, is the paid problem for `l + 1` steps.
pub(crate) fn sweep_split(l: u64, s: u64) -> u64 {
    paid_split(l.saturating_add(1), s).min(l.saturating_sub(1).max(1))
}

/// Appends to `out` the positions (0-based, `< n`) of the checkpoints the forward sweep stores
/// under the binomial schedule with `s` slots: a chain that starts at the input. At most `s`
/// closed-form splits; the last few `(n, s)` plans are also kept, so a training loop plans once.
pub(crate) fn binomial_chain(n: usize, s: usize, out: &mut Vec<usize>) {
    /// Recent plans by `(n, s)`, most recently used last.
    type Plans = Vec<((usize, usize), Vec<usize>)>;
    const KEEP: usize = 8;
    static PLANS: std::sync::Mutex<Plans> = std::sync::Mutex::new(Vec::new());
    let mut plans = PLANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(i) = plans.iter().position(|(key, _)| *key == (n, s)) {
        let hit = plans.remove(i);
        plans.push(hit);
    } else {
        if plans.len() == KEEP {
            plans.remove(0);
        }
        plans.push(((n, s), plan_chain(n, s)));
    }
    if let Some((_, plan)) = plans.last() {
        out.extend_from_slice(plan);
    }
}

fn plan_chain(n: usize, s: usize) -> Vec<usize> {
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

    fn chain(n: usize, s: usize) -> Vec<usize> {
        let mut out = Vec::new();
        binomial_chain(n, s, &mut out);
        out
    }

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
    fn closed_form_splits_are_the_first_brute_force_minimum() {
        for s in 2..=7 {
            for l in 1..=90 {
                let cost =
                    |m: u64| m + revolve_forward_steps(m, s) + revolve_forward_steps(l - m, s - 1);
                let brute = (1..l).min_by_key(|&m| cost(m)).unwrap_or(1);
                assert_eq!(paid_split(l, s), brute, "paid l={l} s={s}");
                if l > 1 {
                    assert_eq!(cost(paid_split(l, s)), revolve_forward_steps(l, s));
                }
                let sweep_cost =
                    |m: u64| binomial_recompute_steps(l - m, s - 1) + revolve_forward_steps(m, s);
                let brute = (1..l).min_by_key(|&m| sweep_cost(m)).unwrap_or(1);
                assert_eq!(sweep_split(l, s), brute, "sweep l={l} s={s}");
            }
        }
    }

    #[test]
    fn huge_schedules_take_closed_form_time() {
        // Each of these took seconds (or hours) with linear searches; now a few hundred steps each.
        // r = 3, and 3 * 2^60 - C(2^26 + 3, 2^26 + 1), from Python's exact `math.comb`.
        assert_eq!(
            revolve_forward_steps(1 << 60, 1 << 26),
            3_456_512_713_839_083_517
        );
        let chain = chain(100_000, 120);
        assert_eq!(chain.len(), 120);
        assert!(chain.windows(2).all(|w| w[0] < w[1]) && chain[119] < 100_000);
        for l in [2, 3, 1000, 100_000, 1 << 40] {
            for s in [2, 3, 120, 1 << 20] {
                let m = paid_split(l, s);
                assert!((1..l).contains(&m), "l={l} s={s} m={m}");
            }
        }
    }

    #[test]
    fn known_values() {
        // beta(s, r) = C(s + r, s) steps need at most r evaluations each.
        assert_eq!(binomial_below(6, 3, u128::MAX), Some(20));
        assert_eq!(binomial_below(6, 3, 20), None);
        assert_eq!(binomial_below(1 << 40, 1 << 39, 1 << 64), None);
        assert_eq!(revolve_forward_steps(20, 3), 3 * 20 - 15);
        // With a slot per layer nothing is recomputed; with one slot, everything is, quadratically.
        assert_eq!(binomial_recompute_steps(16, 16), 0);
        assert_eq!(binomial_recompute_steps(16, 1), 16 * 15 / 2);
        assert_eq!(chain(16, 16), (0..16).collect::<Vec<_>>());
        assert_eq!(chain(16, 1), vec![0]);
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
