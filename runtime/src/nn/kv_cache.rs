//! A key/value cache for decoding: each attention layer's keys and values of the positions seen so
//! far, preallocated for a maximum length, appended in place, read where they lie.

use std::ops::Range;

use crate::element::Element;
use crate::error::{panicking, Error, Result, Shape};
use crate::ops::attention::{attend_filled, check_scale};
use crate::scope::Scope;
use crate::tensor::Tensor;

/// One attention layer's keys and values for a batch of sequences, each filled to its own length:
/// two `[batch, kv_heads, max_len, head_dim]` tensors rented once from the scope that makes the
/// cache (under its budget and the pool's), written in place by [`KvCache::append`] and
/// [`KvCache::append_to`], read by [`KvCache::attend`] or as views ([`KvCache::keys`]).
///
/// A cache is a value of its scope like a tensor: it is branded `'s`, so it cannot outlive the scope
/// that made it, and it holds no tensor of the scopes inside (appending copies the values in). The
/// per-token scopes of a generation loop, inside the cache's scope, append to it and attend over
/// it; each token's temporaries go back to the pool at the end of its scope, the cache at the end
/// of the request's. Its memory is counted in that scope's [`ScopeStats`](crate::ScopeStats) and
/// budget from the start: a request whose cache does not fit fails when it makes the cache, not
/// halfway through generating.
///
/// Appending needs the cache's buffers to itself: while a view from [`KvCache::keys`] or
/// [`KvCache::values`] is alive, an append fails (it would change what the view shows).
/// [`KvCache::attend`] keeps no view.
///
/// ```
/// use tensorscope::nn::KvCache;
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(16);
/// pool.scope(|request| {
///     // One sequence, 2 key/value heads of dimension 4, room for 8 positions.
///     let mut cache = KvCache::<f32>::new(request, 1, 2, 8, 4);
///     for token in 0..3 {
///         request.scope(|step| {
///             let k = step.randn::<f32>(&[1, 2, 1, 4], token);
///             let v = step.randn::<f32>(&[1, 2, 1, 4], 100 + token);
///             cache.append(&k, &v);
///             // 4 query heads share the 2 key/value heads (grouped-query attention).
///             let q = step.randn::<f32>(&[1, 4, 1, 4], 200 + token);
///             let out = cache.attend(&q, None);
///             assert_eq!(out.shape(), &[1, 4, 1, 4]);
///         });
///     }
///     assert_eq!(cache.len(0), 3);
///     assert_eq!(cache.keys(0).shape(), &[1, 2, 3, 4]);
/// });
/// ```
pub struct KvCache<'s, T: Element = f32> {
    keys: Tensor<'s, T>,
    values: Tensor<'s, T>,
    /// Positions filled, per sequence.
    lens: Vec<usize>,
}

impl<T: Element> std::fmt::Debug for KvCache<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("kv_heads", &self.kv_heads())
            .field("max_len", &self.max_len())
            .field("head_dim", &self.head_dim())
            .field("lens", &self.lens)
            .finish()
    }
}

/// The names of the cache's appends and attentions in errors.
const APPEND: &str = "KvCache::append";
const ATTEND: &str = "KvCache::attend";

impl<'s, T: Element> KvCache<'s, T> {
    /// A cache for `batch` sequences of up to `max_len` positions, each position `kv_heads` keys
    /// and values of `head_dim` elements, rented in `scope` (its contents unspecified until
    /// appended). Fails with [`Error::InvalidArgument`] for a zero size, or with a budget error
    /// naming the bytes asked for when the cache does not fit the scope's or the pool's budget.
    pub fn try_new(
        scope: &Scope<'s, '_>,
        batch: usize,
        kv_heads: usize,
        max_len: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let shape = [batch, kv_heads, max_len, head_dim];
        if shape.contains(&0) {
            return Err(Error::InvalidArgument {
                op: "KvCache::new",
                arg: "shape",
                reason: format!(
                    "[batch, kv_heads, max_len, head_dim] = {} has a zero size",
                    Shape::from(&shape[..])
                ),
            });
        }
        Ok(KvCache {
            keys: scope.try_rent(&shape)?,
            values: scope.try_rent(&shape)?,
            lens: vec![0; batch],
        })
    }

    /// A cache for `batch` sequences of up to `max_len` positions: [`KvCache::try_new`].
    ///
    /// # Panics
    /// Where that returns an error, with the error's message.
    #[track_caller]
    pub fn new(
        scope: &Scope<'s, '_>,
        batch: usize,
        kv_heads: usize,
        max_len: usize,
        head_dim: usize,
    ) -> Self {
        crate::error::or_panic(Self::try_new(scope, batch, kv_heads, max_len, head_dim))
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Key/value heads per position.
    pub fn kv_heads(&self) -> usize {
        self.keys.shape()[1]
    }

    /// Positions each sequence has room for.
    pub fn max_len(&self) -> usize {
        self.keys.shape()[2]
    }

    /// Elements per key or value head.
    pub fn head_dim(&self) -> usize {
        self.keys.shape()[3]
    }

    /// Positions sequence `seq` holds. Panics if `seq` is not below [`KvCache::batch`], as
    /// [`KvCache::keys`], [`KvCache::values`] and [`KvCache::reset`] do.
    pub fn len(&self, seq: usize) -> usize {
        self.lens[seq]
    }

    /// Positions each sequence holds.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Whether no sequence holds a position.
    pub fn is_empty(&self) -> bool {
        self.lens.iter().all(|&len| len == 0)
    }

    /// Pool bytes the cache holds (its keys and values, at their size classes).
    pub fn allocated_bytes(&self) -> usize {
        self.keys.allocated_bytes() + self.values.allocated_bytes()
    }

    /// Empties sequence `seq`, for a new request in its slot; the others keep their positions.
    pub fn reset(&mut self, seq: usize) {
        self.lens[seq] = 0;
    }

    /// Empties every sequence.
    pub fn clear(&mut self) {
        self.lens.fill(0);
    }

    /// Appends `k` and `v`, each `[batch, kv_heads, n, head_dim]`, to the sequences: sequence `i`
    /// gets `n` positions after the ones it holds. Fails, changing nothing, with
    /// [`Error::ShapeMismatch`] for operands of another shape, and with [`Error::InvalidArgument`]
    /// when a sequence has no room for `n` more positions (naming it), when a view of the cache is
    /// still alive, or when an operand carries a gradient graph (the cache stores values; serve in a
    /// scope that does not record, as [`Pool::scope`](crate::Pool::scope) and
    /// [`Scope::no_grad`] are).
    pub fn try_append(&mut self, k: &Tensor<'_, T>, v: &Tensor<'_, T>) -> Result<()> {
        let n = self.check_append(k, v, self.batch())?;
        if let Some(seq) = (0..self.batch()).find(|&i| self.lens[i] + n > self.max_len()) {
            return Err(self.no_room(seq, n));
        }
        for seq in 0..self.batch() {
            let (k, v) = (k.try_narrow(0, seq, 1)?, v.try_narrow(0, seq, 1)?);
            self.write(seq, &k, &v, n);
        }
        Ok(())
    }

    panicking! {
        /// Appends `k` and `v` (`[batch, kv_heads, n, head_dim]`) to every sequence.
        pub fn append(&mut self, k: &Tensor<'_, T>, v: &Tensor<'_, T>) -> () = try_append;
    }

    /// Appends `k` and `v`, each `[1, kv_heads, n, head_dim]`, to sequence `seq` alone: how a
    /// prompt fills its sequence's cache, prompts of different lengths one at a time. Fails as
    /// [`KvCache::append`] does, and with [`Error::IndexOutOfRange`] for a `seq` past the batch.
    pub fn try_append_to(
        &mut self,
        seq: usize,
        k: &Tensor<'_, T>,
        v: &Tensor<'_, T>,
    ) -> Result<()> {
        self.rows(APPEND, Some(seq))?;
        let n = self.check_append(k, v, 1)?;
        if self.lens[seq] + n > self.max_len() {
            return Err(self.no_room(seq, n));
        }
        self.write(seq, k, v, n);
        Ok(())
    }

    panicking! {
        /// Appends `k` and `v` (`[1, kv_heads, n, head_dim]`) to sequence `seq`.
        pub fn append_to(&mut self, seq: usize, k: &Tensor<'_, T>, v: &Tensor<'_, T>) -> () = try_append_to;
    }

    /// The positions of `t` new tokens of every sequence (`seq` is `None`: `[batch, t]`) or of
    /// sequence `seq` alone (`[1, t]`), each row counting on from the positions its sequence holds:
    /// the ids of a model's position embeddings or rotary tables, rented in `scope`. Fails with
    /// [`Error::IndexOutOfRange`] for a `seq` past the batch, or with a budget error.
    ///
    /// ```
    /// use tensorscope::nn::KvCache;
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let mut cache = KvCache::<f32>::new(s, 2, 1, 8, 2);
    ///     let k = s.zeros::<f32>(&[1, 1, 3, 2]);
    ///     cache.append_to(1, &k, &k);
    ///     assert_eq!(cache.positions(s, None, 2).to_vec(), [0, 1, 3, 4]);
    ///     assert_eq!(cache.positions(s, Some(1), 1).to_vec(), [3]);
    /// });
    /// ```
    pub fn try_positions<'t>(
        &self,
        scope: &Scope<'t, '_>,
        seq: Option<usize>,
        t: usize,
    ) -> Result<Tensor<'t, i64>> {
        let lens = &self.lens[self.rows("KvCache::positions", seq)?];
        scope.try_rent_with::<i64>(&[lens.len(), t], |mut positions| {
            for (mut row, &len) in positions.outer_iter_mut().zip(lens) {
                for (j, p) in row.iter_mut().enumerate() {
                    *p = (len + j) as i64;
                }
            }
        })
    }

    /// The positions of `t` new tokens: [`KvCache::try_positions`].
    ///
    /// # Panics
    /// Where that returns an error, with the error's message.
    #[track_caller]
    pub fn positions<'t>(
        &self,
        scope: &Scope<'t, '_>,
        seq: Option<usize>,
        t: usize,
    ) -> Tensor<'t, i64> {
        crate::error::or_panic(self.try_positions(scope, seq, t))
    }

    /// Sequence `seq`'s keys, `[1, kv_heads, len, head_dim]`: a view of the cache, no copy.
    pub fn keys(&self, seq: usize) -> Tensor<'s, T> {
        filled(&self.keys, seq, self.lens[seq])
    }

    /// Sequence `seq`'s values, `[1, kv_heads, len, head_dim]`: a view of the cache, no copy.
    pub fn values(&self, seq: usize) -> Tensor<'s, T> {
        filled(&self.values, seq, self.lens[seq])
    }

    /// Causal attention of the queries `q`, `[batch, heads, tq, head_dim]`, over each sequence's
    /// cached keys and values, read where they lie: the `tq` queries of sequence `i` are its last
    /// `tq` positions (appended before this call), and query `j` of them sees the keys up to its
    /// own position, `lens[i] - tq + j`. `heads` may be a multiple of the cache's `kv_heads`
    /// (grouped-query attention: each key/value head serves `heads / kv_heads` query heads in
    /// turn). The scores are scaled by `scale`, `1 / sqrt(head_dim)` if `None`. The output,
    /// `[batch, heads, tq, head_dim]`, is rented in `q`'s scope; it carries no gradient.
    ///
    /// The kernel is the fused attention's ([`Tensor::scaled_dot_product_attention`]), each query
    /// head reading its key head's filled rows: no scores matrix, no copy of the cache.
    ///
    /// Fails with [`Error::ShapeMismatch`] if `q`'s batch or head dimension differs from the
    /// cache's, its heads are not a multiple of `kv_heads`, or a sequence holds fewer than `tq`
    /// positions; with [`Error::InvalidArgument`] for a scale that is not finite in the type the
    /// scores are computed in (`f32` for an `f32`, `f16` or `bf16` cache: 1e300 is not) or a `q`
    /// that carries a gradient graph. An `f16` or `bf16` cache computes in `f32`, as the fused
    /// attention does, widening its filled rows into pooled `f32` copies of the attended
    /// sequences' keys and values for the call: twice those sequences' bytes in the cache, rented
    /// in `q`'s scope and returned before this returns.
    pub fn try_attend<'t>(&self, q: &Tensor<'t, T>, scale: Option<f64>) -> Result<Tensor<'t, T>> {
        self.attend_rows(self.rows(ATTEND, None)?, q, scale)
    }

    /// Causal attention of `q` (`[batch, heads, tq, head_dim]`) over the cache:
    /// [`KvCache::try_attend`].
    ///
    /// # Panics
    /// Where that returns an error, with the error's message.
    #[track_caller]
    pub fn attend<'t>(&self, q: &Tensor<'t, T>, scale: Option<f64>) -> Tensor<'t, T> {
        crate::error::or_panic(self.try_attend(q, scale))
    }

    /// [`KvCache::attend`] of sequence `seq` alone: `q` is `[1, heads, tq, head_dim]`, its last
    /// `tq` positions (a prompt appended by [`KvCache::append_to`]). Fails as `attend` does, and
    /// with [`Error::IndexOutOfRange`] for a `seq` past the batch.
    pub fn try_attend_to<'t>(
        &self,
        seq: usize,
        q: &Tensor<'t, T>,
        scale: Option<f64>,
    ) -> Result<Tensor<'t, T>> {
        self.attend_rows(self.rows(ATTEND, Some(seq))?, q, scale)
    }

    /// [`KvCache::attend`] of sequence `seq` alone: [`KvCache::try_attend_to`].
    ///
    /// # Panics
    /// Where that returns an error, with the error's message.
    #[track_caller]
    pub fn attend_to<'t>(
        &self,
        seq: usize,
        q: &Tensor<'t, T>,
        scale: Option<f64>,
    ) -> Tensor<'t, T> {
        crate::error::or_panic(self.try_attend_to(seq, q, scale))
    }

    /// The attention of `q` over the sequences `rows` of the cache, checked.
    fn attend_rows<'t>(
        &self,
        rows: Range<usize>,
        q: &Tensor<'t, T>,
        scale: Option<f64>,
    ) -> Result<Tensor<'t, T>> {
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: ATTEND,
            lhs: Shape::from(q.shape()),
            rhs: Shape::from(self.keys.shape()),
            reason,
        };
        let [batch, heads, tq, d] = *q.shape() else {
            return Err(mismatch(
                "q must be [batch, heads, tq, head_dim], the cache [batch, kv_heads, max_len, \
                 head_dim]"
                    .into(),
            ));
        };
        if batch != rows.len() || d != self.head_dim() {
            return Err(mismatch(format!(
                "q has batch {batch} and head dimension {d}, for {} sequences of head dimension {}",
                rows.len(),
                self.head_dim()
            )));
        }
        let kv_heads = self.kv_heads();
        if heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(mismatch(format!(
                "{heads} query heads cannot share {kv_heads} key/value heads evenly"
            )));
        }
        let lens = &self.lens[rows.clone()];
        if let Some(i) = lens.iter().position(|&len| len < tq) {
            return Err(mismatch(format!(
                "sequence {} holds {} positions, fewer than the {tq} queries; append their keys \
                 and values first",
                rows.start + i,
                lens[i]
            )));
        }
        if q.node.is_some() {
            return Err(no_graph(ATTEND, "q"));
        }
        let scale = check_scale::<T>(ATTEND, scale.unwrap_or(1.0 / (d as f64).sqrt()))?;
        let per_seq = kv_heads * self.max_len() * d;
        let part = rows.start * per_seq..rows.end * per_seq;
        let kv = (&self.keys.slice()[part.clone()], &self.values.slice()[part]);
        attend_filled(q, kv, (kv_heads, self.max_len()), lens, scale)
    }

    /// The sequences an op `op` of sequence `seq`, or of every one (`None`), works on; fails with
    /// [`Error::IndexOutOfRange`] for a `seq` past the batch.
    fn rows(&self, op: &'static str, seq: Option<usize>) -> Result<Range<usize>> {
        match seq {
            None => Ok(0..self.batch()),
            Some(seq) if seq < self.batch() => Ok(seq..seq + 1),
            Some(seq) => Err(Error::IndexOutOfRange {
                op,
                index: seq as i64,
                axis: 0,
                len: self.batch(),
            }),
        }
    }

    /// Checks an append of `k` and `v` of `batch` sequences; the positions they hold.
    fn check_append(&self, k: &Tensor<'_, T>, v: &Tensor<'_, T>, batch: usize) -> Result<usize> {
        let expected = |n: usize| [batch, self.kv_heads(), n, self.head_dim()];
        for (name, x) in [("k", k), ("v", v)] {
            let n = x.shape().get(2).copied().unwrap_or(0);
            if x.shape() != expected(n) || x.shape() != k.shape() {
                // Against `k` when only the two operands disagree, else against the cache.
                let other = match x.shape() == expected(n) {
                    true => k.shape(),
                    false => self.keys.shape(),
                };
                return Err(Error::ShapeMismatch {
                    op: APPEND,
                    lhs: Shape::from(x.shape()),
                    rhs: Shape::from(other),
                    reason: format!(
                        "{name} must be [{batch}, {}, n, {}] (batch, kv_heads, positions, \
                         head_dim), as k is, for this cache",
                        self.kv_heads(),
                        self.head_dim()
                    ),
                });
            }
            if x.node.is_some() {
                return Err(no_graph(APPEND, name));
            }
        }
        if !(self.keys.is_writable() && self.values.is_writable()) {
            return Err(Error::InvalidArgument {
                op: APPEND,
                arg: "self",
                reason: "a view of the cache (KvCache::keys or values) is still alive; drop it \
                         before appending"
                    .into(),
            });
        }
        Ok(k.shape()[2])
    }

    /// The error of sequence `seq` having no room for `n` more positions.
    fn no_room(&self, seq: usize, n: usize) -> Error {
        Error::InvalidArgument {
            op: APPEND,
            arg: "k",
            reason: format!(
                "sequence {seq} holds {} of its {} positions; {n} more do not fit (reset it, or \
                 make the cache longer)",
                self.lens[seq],
                self.max_len()
            ),
        }
    }

    /// Writes `k` and `v` (`[1, kv_heads, n, head_dim]`, checked) after sequence `seq`'s positions.
    fn write(&mut self, seq: usize, k: &Tensor<'_, T>, v: &Tensor<'_, T>, n: usize) {
        let [_, heads, max, d] = *self.keys.shape() else {
            unreachable!("a cache is rank 4")
        };
        let shape = [1, heads, n, d];
        let start = (seq * heads * max + self.lens[seq]) * d;
        let steps = [0, max * d, d, 1];
        self.keys.write_at(&shape, start, &steps, k);
        self.values.write_at(&shape, start, &steps, v);
        self.lens[seq] += n;
    }
}

/// The error of an operand `arg` of a cache op carrying a gradient graph.
fn no_graph(op: &'static str, arg: &'static str) -> Error {
    Error::InvalidArgument {
        op,
        arg,
        reason: "it carries a gradient graph, and the cache keeps values without their gradient; \
                 decode in a scope that does not record (Pool::scope, Scope::no_grad)"
            .into(),
    }
}

/// The first `len` positions of sequence `seq` of a cache's `[batch, heads, max, d]` buffer.
fn filled<'s, T: Element>(buffer: &Tensor<'s, T>, seq: usize, len: usize) -> Tensor<'s, T> {
    buffer.narrow(0, seq, 1).narrow(2, 0, len)
}
