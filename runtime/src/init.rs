//! Seeded random numbers, the same stream on every platform: initial values (`randn`, `uniform`),
//! the masks of dropout and the draws of sampling. [`Generator`] is a seeded stream; each thread
//! also has one of its own, which [`manual_seed`] seeds (PyTorch's `torch.manual_seed`), and which
//! ops that draw without being given a generator take their seeds from.

use std::cell::Cell;

/// SplitMix64 (Steele, Lea and Flood 2014): tiny, fast, and the same stream on every platform.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal by Box-Muller (one of the pair; simplicity over speed).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // in (0, 1], so the log is finite
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// The seed every thread's generator starts from, PyTorch's default seed: a program that never
/// calls [`manual_seed`] draws the same numbers on every run.
const DEFAULT_SEED: u64 = 67_280_421_310_721;

thread_local! {
    /// The state of this thread's generator.
    static THREAD: Cell<u64> = const { Cell::new(DEFAULT_SEED) };
}

/// Seeds this thread's generator (PyTorch's `torch.manual_seed`, for the calling thread): the
/// draws that follow on this thread ([`Tensor::dropout`](crate::Tensor::dropout)'s masks,
/// [`Generator::from_thread`]) are the same after the same seed. Every thread starts from one
/// fixed seed, so a program that never seeds is reproducible too.
///
/// ```
/// use tensorscope::{manual_seed, Pool};
/// let pool = Pool::with_max_memory_mb(16);
/// pool.scope(|s| {
///     let x = s.ones::<f32>(&[64]);
///     manual_seed(7);
///     let a = x.dropout(0.5).to_vec();
///     manual_seed(7);
///     assert_eq!(x.dropout(0.5).to_vec(), a);
///     assert_ne!(x.dropout(0.5).to_vec(), a); // the next draw
/// });
/// ```
pub fn manual_seed(seed: u64) {
    THREAD.set(seed);
}

/// The next draw of this thread's generator: the seed of one op's random numbers.
pub(crate) fn thread_seed() -> u64 {
    let mut rng = SplitMix64(THREAD.get());
    let seed = rng.next_u64();
    THREAD.set(rng.0);
    seed
}

/// A seeded stream of random numbers (SplitMix64: the same stream on every platform, not for
/// cryptography), for the sampling ops ([`Tensor::multinomial`](crate::Tensor::multinomial),
/// [`Tensor::sample_logits`](crate::Tensor::sample_logits)): the same seed gives the same draws.
#[derive(Debug, Clone)]
pub struct Generator(SplitMix64);

impl Generator {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Generator(SplitMix64::new(seed))
    }

    /// A generator seeded by the next draw of this thread's generator (see [`manual_seed`]).
    pub fn from_thread() -> Self {
        Generator::new(thread_seed())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// The next number uniform in `[0, 1)`, with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        self.0.next_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_close_to_the_distribution() {
        let mut rng = SplitMix64::new(7);
        let n = 100_000;
        let (mut sum, mut sq) = (0.0, 0.0);
        for _ in 0..n {
            let x = rng.normal();
            sum += x;
            sq += x * x;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
        let u: f64 = (0..n).map(|_| rng.next_f64()).sum::<f64>() / n as f64;
        assert!((u - 0.5).abs() < 0.01, "uniform mean {u}");
    }

    #[test]
    fn the_thread_generator_replays_after_the_same_seed() {
        manual_seed(3);
        let first = [thread_seed(), thread_seed()];
        assert_ne!(first[0], first[1]);
        manual_seed(3);
        assert_eq!([thread_seed(), thread_seed()], first);
        let (mut a, mut b) = (Generator::new(9), Generator::new(9));
        assert_eq!(a.next_u64(), b.next_u64());
        assert!((0.0..1.0).contains(&a.next_f64()));
    }
}
