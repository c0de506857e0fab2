//! Dropout: each element zeroed with probability `p`, the others scaled by `1 / (1 - p)`, so the
//! expected value is unchanged.
//!
//! The op's record holds the seed of its mask, drawn from the thread's generator
//! ([`manual_seed`](crate::manual_seed)) when the op runs: the backward regenerates the mask from
//! the seed rather than saving it, and a `#[checkpoint]` replay regenerates the same mask, as
//! PyTorch's checkpoint restores the RNG state. A plain forward and a checkpointed forward of the
//! same model, after the same seed, draw the same masks, so they train bit for bit alike.

use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op};
use crate::element::Element;
use crate::error::{panicking, Error, Result};
use crate::init::{thread_seed, SplitMix64};
use crate::tensor::Tensor;

/// Dropout with probability `p` (checked) and the seed of its mask.
#[derive(Debug, Clone, Copy)]
struct Dropout {
    p: f64,
    seed: u64,
}

impl Dropout {
    /// Multiplies `values` in place by the mask over `1 - p`: 0 where an element is dropped (so a
    /// NaN or an infinity stays NaN, as in PyTorch), `1 / (1 - p)` where it is kept. One uniform
    /// draw per element, in order, from the seed.
    fn apply<T: Element>(&self, values: &mut [T]) {
        let scale = T::from_f64(1.0 / (1.0 - self.p));
        let mut rng = SplitMix64::new(self.seed);
        for v in values {
            let keep = rng.next_f64() >= self.p;
            *v = *v * if keep { scale } else { T::zero() };
        }
    }
}

impl<T: Element> Op<T> for Dropout {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        "dropout"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let x = cx.take(0);
        let mut out = x.into_writable_copy(cx.scope())?;
        self.apply(out.unique_slice_mut());
        Ok((out, cx.saving().then_some(())))
    }

    /// The gradient times the same mask over `1 - p`, regenerated from the seed.
    fn backward<'b>(&self, (): (), g: Tensor<'b, T>, cx: &Backward<'b>) -> Result<Grads<'b, T>> {
        let mut dx = Arg::Owned(g).into_writable_copy(cx.at())?;
        self.apply(dx.unique_slice_mut());
        Ok(Grads::from([Some(dx)]))
    }
}

/// Checks a dropout probability: in `[0, 1)`, else [`Error::InvalidArgument`] naming `op`.
pub(crate) fn check_probability(op: &'static str, p: f64) -> Result<()> {
    match (0.0..1.0).contains(&p) {
        true => Ok(()),
        false => Err(Error::InvalidArgument {
            op,
            arg: "p",
            reason: format!("{p} is outside [0, 1)"),
        }),
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// Dropout (PyTorch's `F.dropout` in training): each element zeroed with probability `p`, the
    /// others multiplied by `1 / (1 - p)`; `p = 0` is the identity (this tensor, nothing drawn).
    /// The mask comes from a seed drawn from this thread's generator
    /// ([`manual_seed`](crate::manual_seed)), which the op's record keeps: the backward (the
    /// gradient times the same mask over `1 - p`) and a `#[checkpoint]` replay regenerate the mask
    /// from it, bit for bit. For evaluation, do not call it ([`nn::Dropout`](crate::nn::Dropout) does that by its
    /// training flag). Fails with [`Error::InvalidArgument`] for a `p` outside `[0, 1)`.
    ///
    /// ```
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let y = s.ones::<f32>(&[1000]).dropout(0.25).to_vec();
    ///     assert!(y.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
    ///     let kept = y.iter().filter(|&&v| v != 0.0).count();
    ///     assert!((700..800).contains(&kept), "{kept}");
    /// });
    /// ```
    pub fn try_dropout(&self, p: f64) -> Result<Tensor<'s, T>> {
        check_probability("dropout", p)?;
        if p == 0.0 {
            return Ok(self.clone());
        }
        let op = Dropout {
            p,
            seed: thread_seed(),
        };
        autograd::run(op, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// Dropout with probability `p`.
        pub fn dropout(&self, p: f64) -> Tensor<'s, T> = try_dropout;
    }
}
