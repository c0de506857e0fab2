//! Rotary position embeddings (RoPE) as Hugging Face's Llama applies them: the tables of a
//! [`Scope::rope_tables`] and [`Tensor::rope`], which rotates the two halves of every query or key
//! vector by its position's angles. `rope` is made of recorded ops (narrow, negation, concat,
//! products), so it differentiates, and replays under `#[checkpoint]`, as they do.

use super::elementwise::Binary;
use super::tensor_ops::Unary;
use crate::autograd::{self, args, Arg};
use crate::element::Element;
use crate::error::{panicking, Error, Result, Shape};
use crate::scope::Scope;
use crate::tensor::Tensor;

impl<'s, T: Element> Tensor<'s, T> {
    /// This `[.., t, d]` tensor of queries or keys rotated by the angles of `cos` and `sin`, tables
    /// of shape `[t, d]` ([`Scope::rope_tables`]), or `[.., t, d]` broadcasting to this tensor's
    /// shape (each sequence of a batch at its own positions: `[batch, 1, t, d]` for
    /// `[batch, heads, t, d]`): `x * cos + rotate_half(x) * sin`, where
    /// `rotate_half(x)` is `cat(-x2, x1)` of the two halves `x1`, `x2` of the last axis (Hugging
    /// Face's `apply_rotary_pos_emb`). Every operand gets a gradient. Fails with
    /// [`Error::InvalidShape`] for a rank below 2 or an odd last axis, and with
    /// [`Error::ShapeMismatch`] if a table is neither `[t, d]` nor broadcasts to the tensor as one.
    ///
    /// ```
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let (cos, sin) = s.rope_tables::<f32>(0..3, 4, 10_000.0);
    ///     let q = s.ones::<f32>(&[2, 3, 4]);
    ///     let rotated = q.rope(&cos, &sin);
    ///     assert_eq!(rotated.shape(), &[2, 3, 4]);
    ///     // Position 0 turns by no angle.
    ///     assert_eq!(rotated.to_vec()[..4], [1.0; 4]);
    /// });
    /// ```
    pub fn try_rope(&self, cos: &Tensor<'s, T>, sin: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        let [.., t, d] = *self.shape() else {
            return Err(Error::InvalidShape {
                op: "rope",
                shape: Shape::from(self.shape()),
                reason: "needs at least two axes, [.., positions, dim]".into(),
            });
        };
        if !d.is_multiple_of(2) {
            return Err(Error::InvalidShape {
                op: "rope",
                shape: Shape::from(self.shape()),
                reason: format!("the last axis ({d}) must have an even length to be halved"),
            });
        }
        for table in [cos, sin] {
            let shape = table.shape();
            let lead = self.ndim().checked_sub(shape.len());
            let fits = lead.is_some_and(|lead| {
                shape.ends_with(&[t, d])
                    && (shape.iter().zip(&self.shape()[lead..])).all(|(&a, &x)| a == 1 || a == x)
            });
            if !fits {
                return Err(Error::ShapeMismatch {
                    op: "rope",
                    lhs: Shape::from(self.shape()),
                    rhs: Shape::from(shape),
                    reason: format!(
                        "the cos and sin tables must be [{t}, {d}], or [.., {t}, {d}] with \
                         leading axes that broadcast to the tensor's (a table per sequence)"
                    ),
                });
            }
        }
        let half = d / 2;
        let (x1, x2) = (
            self.try_narrow(-1, 0, half)?,
            self.try_narrow(-1, half, half)?,
        );
        let x2 = autograd::run(Unary::Neg, &mut args([Arg::Owned(x2)]))?;
        let rotated = Tensor::try_concat(&[&x2, &x1], -1)?;
        let rotated = autograd::run(
            Binary::Mul,
            &mut args([Arg::Owned(rotated), Arg::Borrowed(sin)]),
        )?;
        self.try_mul(cos)?.try_add_owned(&rotated)
    }

    panicking! {
        /// This `[.., t, d]` tensor rotated by the angles of `cos` and `sin`.
        pub fn rope(&self, cos: &Tensor<'s, T>, sin: &Tensor<'s, T>) -> Tensor<'s, T> = try_rope;
    }
}

impl<'s> Scope<'s, '_> {
    /// The cos and sin tables of rotary embeddings for `positions` (`0..t` for the first `t`),
    /// each `[positions, dim]`, as Hugging Face's `LlamaRotaryEmbedding` makes them: the angle of
    /// position `p` at column `j` is `p / base^(2i / dim)` with `i = j mod dim/2` (the frequencies
    /// repeated for the two halves), `base` 10000 for Llama 2. Computed in `f64` and rounded to
    /// `T`, so an `f32` table holds the nearest values where PyTorch's `f32` product may round
    /// twice. Fails with [`Error::InvalidArgument`] for an odd or zero `dim` or a `base` that is
    /// not finite and positive, or a budget error.
    pub fn try_rope_tables<T: Element>(
        &self,
        positions: impl IntoIterator<Item = usize>,
        dim: usize,
        base: f64,
    ) -> Result<(Tensor<'s, T>, Tensor<'s, T>)> {
        if dim == 0 || !dim.is_multiple_of(2) {
            return Err(Error::InvalidArgument {
                op: "rope_tables",
                arg: "dim",
                reason: format!("{dim} is not a positive even number"),
            });
        }
        if !(base.is_finite() && base > 0.0) {
            return Err(Error::InvalidArgument {
                op: "rope_tables",
                arg: "base",
                reason: format!("{base} is not a finite positive number"),
            });
        }
        let half = dim / 2;
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| base.powf((2 * i) as f64 / dim as f64).recip())
            .collect();
        let inv_freq = &inv_freq;
        let angles: Vec<f64> = positions
            .into_iter()
            .flat_map(|p| (0..dim).map(move |j| p as f64 * inv_freq[j % half]))
            .collect();
        let shape = [angles.len() / dim, dim];
        let table = |f: fn(f64) -> f64| {
            self.try_rent_with(&shape, |mut v| {
                for (o, &a) in v.iter_mut().zip(&angles) {
                    *o = T::from_f64(f(a));
                }
            })
        };
        Ok((table(f64::cos)?, table(f64::sin)?))
    }

    panicking! {
        /// The cos and sin tables of rotary embeddings for `positions`.
        pub fn rope_tables<T: Element>(&self, positions: impl IntoIterator<Item = usize>, dim: usize, base: f64) -> (Tensor<'s, T>, Tensor<'s, T>) = try_rope_tables;
    }
}
