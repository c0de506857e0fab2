//! Scaled-dot-product attention, fused: `softmax(scale q k^T) v` (with a causal mask, if asked)
//! without the `[.., tq, tk]` matrices of scores and probabilities that the same attention written
//! with `matmul`, `masked_fill` and `softmax` makes and keeps for its backward.
//!
//! The forward is FlashAttention-2's (Dao, 2023) on the CPU: for each head and block of [`BR`]
//! query rows, the blocks of [`BC`] keys in turn, each tile of scores a packed product
//! (`ops::gemm`, reading `k` transposed where it lies), folded into the block's output by an
//! online softmax (a running max and sum per row, the output rescaled when the max grows); under
//! the causal mask, key blocks wholly in a query block's future are skipped. It keeps `q`, `k`,
//! `v`, the output and each query's log-sum-exp for the backward, which recomputes each tile's
//! probabilities from them (`P = exp(S - lse)`) and runs FlashAttention-2's backward per head:
//! `D = rowsum(dO * O)`, then per tile `dV += P^T dO`, `dP = dO V^T`, `dS = P * (dP - D)`,
//! `dQ += scale dS K`, `dK += scale dS^T Q`, every product accumulating into the gradient where
//! it lies. Work is split over the worker threads by (head, query block) forward and by head
//! backward, so no two threads write the same rows; the tiles live in a per-thread scratch buffer.
//!
//! `f16` and `bf16` attention computes in `f32` ([`Element::Wide`]), as PyTorch's does: a score
//! `q k` passes `f16`'s 65504 long before a softmax is saturated. The operands are widened into
//! pooled `f32` copies, the `f32` kernels run on them, and the results are rounded back; `f32` and
//! `f64` run on their own slices, copying nothing.

use std::any::TypeId;
use std::ops::Range;

use super::gemm::{Matrix, PER_PART};
use super::linalg::{product, Products};
use super::{lanes, simd, work};
use crate::autograd::{self, Backward, Forward, Grads, Inputs, Op, Saved};
use crate::element::DType;
use crate::element::Element;
use crate::error::{panicking, Error, Result, Shape};
use crate::scope::State;
use crate::tensor::Tensor;

/// Query rows per block: a tile of scores is `BR x BC`, 16 KiB of `f32`, in the L1 cache beside
/// the packed operands of its products.
const BR: usize = 64;
/// Keys per block.
const BC: usize = 64;

/// The op's name, as its errors give it.
const NAME: &str = "scaled_dot_product_attention";

/// How [`Tensor::scaled_dot_product_attention`] attends; [`AttentionOptions::default`] is every
/// query to every key, scaled by `1 / sqrt(d)`:
///
/// ```
/// use tensorscope::ops::AttentionOptions;
/// let causal = AttentionOptions { causal: true, ..AttentionOptions::default() };
/// assert_eq!(causal.scale, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AttentionOptions {
    /// Whether a query attends only to keys at or before its own position, aligned bottom-right:
    /// of `tq` queries and `tk` keys, query `i` sees keys `j <= i + tk - tq`, so the last query
    /// sees every key. That is what decoding with a key/value cache needs (the new queries are
    /// the last positions of the sequence), and with `tq == tk` it is PyTorch's
    /// `is_causal=True`; for `tq < tk` PyTorch aligns its mask top-left instead (query `i` sees
    /// keys `j <= i`). With more queries than keys the first ones would see no key: an error.
    pub causal: bool,
    /// The factor of the scores `q k^T`; `None` is `1 / sqrt(d)`, `d` the head dimension.
    pub scale: Option<f64>,
}

/// The fused attention of `q`, `k` and `v` (inputs 0, 1 and 2).
#[derive(Debug, Clone, Copy)]
struct Attention {
    causal: bool,
    /// The factor of the scores, resolved.
    scale: f64,
}

/// The sizes of one call: `heads` matrices (every index of the leading axes) of `tq` queries and
/// `tk` keys, queries and keys `d` wide, values `dv`.
#[derive(Debug, Clone, Copy)]
struct Dims {
    heads: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dv: usize,
    causal: bool,
}

impl Dims {
    /// The sizes of `q: [.., tq, d]`, `k: [.., tk, d]` and `v: [.., tk, dv]` (checked).
    fn of(causal: bool, q: &[usize], k: &[usize], v: &[usize]) -> Dims {
        let [ref lead @ .., tq, d] = *q else {
            unreachable!("ranks checked")
        };
        Dims {
            heads: lead.iter().product(),
            tq,
            tk: k[k.len() - 2],
            d,
            dv: v[v.len() - 1],
            causal,
        }
    }

    /// Whether the output has no element: nothing to compute, every gradient zero.
    fn empty(&self) -> bool {
        self.heads * self.tq * self.dv == 0
    }

    /// Query blocks per head.
    fn blocks(&self) -> usize {
        self.tq.div_ceil(BR)
    }

    /// The keys query `i` sees: `0..visible(i)` (under `causal`, `tq <= tk` is checked).
    fn visible(&self, i: usize) -> usize {
        match self.causal {
            true => i + 1 + self.tk - self.tq,
            false => self.tk,
        }
    }
}

/// A tile of one head: query rows `i0..i0 + br`, keys `j0..j0 + bc`.
#[derive(Debug, Clone, Copy)]
struct Tile {
    i0: usize,
    br: usize,
    j0: usize,
    bc: usize,
}

impl Tile {
    /// How many of the tile's keys (its first ones) row `r` of the tile sees.
    #[inline(always)]
    fn seen(&self, dims: &Dims, r: usize) -> usize {
        dims.visible(self.i0 + r)
            .saturating_sub(self.j0)
            .min(self.bc)
    }

    /// The tile's rows of `x` (one head's `[t, width]` matrix), as a matrix.
    fn rows<'a, T>(&self, x: &'a [T], width: usize) -> Matrix<'a, T> {
        Matrix::row_major(&x[self.i0 * width..][..self.br * width], self.br, width)
    }

    /// The tile's keys of `x` (one head's `[tk, width]` keys or values), as a matrix.
    fn keys<'a, T>(&self, x: &'a [T], width: usize) -> Matrix<'a, T> {
        Matrix::row_major(&x[self.j0 * width..][..self.bc * width], self.bc, width)
    }

    /// The unscaled scores `q k^T` of the tile into `s` (`[br, bc]`), from one head's `q` and
    /// `k`; `k` read transposed where it lies.
    fn scores<T: Element>(&self, dims: &Dims, q: &[T], k: &[T], s: &mut [T]) {
        product(
            Products::F32,
            self.rows(q, dims.d),
            self.keys(k, dims.d).t(),
            s,
            false,
        );
    }
}

/// Matrix `h` of `x`, matrices of `len` elements (an empty slice stays empty).
fn head<T>(x: &[T], h: usize, len: usize) -> &[T] {
    x.get(h * len..(h + 1) * len).unwrap_or_default()
}

/// [`head`] of a mutable slice.
fn head_mut<T>(x: &mut [T], h: usize, len: usize) -> &mut [T] {
    x.get_mut(h * len..(h + 1) * len).unwrap_or_default()
}

/// The elements of `t`, or none.
fn elements<'a, T: Element>(t: &'a mut Option<Tensor<'_, T>>) -> &'a mut [T] {
    t.as_mut().map_or(&mut [], |t| t.unique_slice_mut())
}

/// `f(r)` for every row `r < rows`, compiled for the widest instruction set the CPU has, so that
/// the loops `f` runs over a row (`exp` included) vectorise; `f` must be `#[inline(always)]`.
fn each_row(rows: usize, f: impl FnMut(usize)) {
    struct Rows<F>(usize, F);
    impl<F: FnMut(usize)> simd::Kernel for Rows<F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Rows(rows, mut f) = self;
            for r in 0..rows {
                f(r)
            }
        }
    }
    simd::dispatch(Rows(rows, f));
}

/// `granules` split into runs of about `granules / parts` consecutive ones, each with its part of
/// every slice of `slices`: granule `g` starts at row `row(g)` (`row(granules)` is the end), and a
/// row of slice `i` is `slices[i].1` elements. An empty slice gives empty parts.
fn runs<T, const N: usize>(
    granules: usize,
    parts: usize,
    row: impl Fn(usize) -> usize,
    slices: [(&mut [T], usize); N],
) -> impl Iterator<Item = (Range<usize>, [&mut [T]; N])> {
    let per = granules.div_ceil(parts.max(1)).max(1);
    let mut rest = slices;
    (0..granules).step_by(per).map(move |g0| {
        let g1 = (g0 + per).min(granules);
        let rows = row(g1) - row(g0);
        let taken = std::array::from_fn(|i| {
            let (slice, width) = &mut rest[i];
            let len = (rows * *width).min(slice.len());
            let (part, tail) = std::mem::take(slice).split_at_mut(len);
            *slice = tail;
            part
        });
        (g0..g1, taken)
    })
}

/// Where the keys and values of each query head lie in `k` and `v`: grouped-query attention
/// shares a key head among `group` query heads, a key head's matrix has room for `rows` keys of
/// which its sequence fills the first (`lens`, one per sequence of `per_seq` query heads; every
/// head has `Dims::tk` keys when `lens` is empty).
#[derive(Debug, Clone, Copy)]
struct Keys<'a> {
    group: usize,
    rows: usize,
    lens: &'a [usize],
    per_seq: usize,
}

impl<'a> Keys<'a> {
    /// One key head per query head, each `tk` keys: the layout of the attention op's operands.
    fn whole(dims: &Dims) -> Keys<'a> {
        Keys {
            group: 1,
            rows: dims.tk,
            lens: &[],
            per_seq: 1,
        }
    }

    /// Query head `h`'s sizes (its keys counted) and its keys and values in `k` and `v`.
    fn of<'x, T>(&self, dims: &Dims, h: usize, k: &'x [T], v: &'x [T]) -> (Dims, &'x [T], &'x [T]) {
        let tk = self.lens.get(h / self.per_seq).copied().unwrap_or(dims.tk);
        let kv = h / self.group;
        let (kh, vh) = (
            head(k, kv, self.rows * dims.d),
            head(v, kv, self.rows * dims.dv),
        );
        let dims = Dims { tk, ..*dims };
        (dims, &kh[..tk * dims.d], &vh[..tk * dims.dv])
    }
}

/// The forward of every head into `out`, and each query's log-sum-exp into `lse` unless it is
/// empty, split over the worker threads by (head, query block).
fn run_forward<T: Element>(
    dims: &Dims,
    keys: Keys<'_>,
    scale: f64,
    inputs: (&[T], &[T], &[T]),
    out: &mut [T],
    lse: &mut [T],
) {
    if dims.empty() {
        return;
    }
    let (granules, per_head) = (dims.heads * dims.blocks(), dims.blocks());
    work::visit(granules);
    let scale = T::from_f64(scale);
    let row = |g: usize| (g / per_head) * dims.tq + (g % per_head) * BR;
    let outputs = [(out, dims.dv), (lse, 1)];
    // Two products a tile, `d` and `dv` deep.
    let min = PER_PART.div_ceil(BR.min(dims.tq) * dims.tk * (dims.d + dims.dv));
    super::for_each_part(
        granules,
        min,
        |parts| runs(granules, parts, row, outputs),
        |(blocks, [out, lse])| forward_blocks(dims, keys, scale, inputs, blocks, out, lse),
    );
}

/// Causal attention of `q` (`[batch, heads, tq, d]`) over the first `lens[i]` keys and values of
/// sequence `i` in `k` and `v` (`[batch, kv_heads, rows, d]` each, row-major, `heads` a multiple
/// of `kv_heads`): each sequence's queries are its last `tq` positions. Recorded nowhere (a
/// key/value cache's attention, checked by [`crate::nn::KvCache::attend`]); the output is rented
/// in `q`'s scope.
pub(crate) fn attend_filled<'s, T: Element>(
    q: &Tensor<'s, T>,
    (k, v): (&[T], &[T]),
    (kv_heads, rows): (usize, usize),
    lens: &[usize],
    scale: f64,
) -> Result<Tensor<'s, T>> {
    let q = q.try_contiguous()?;
    let &[batch, heads, tq, d] = q.shape() else {
        unreachable!("rank checked by the cache")
    };
    let dims = Dims {
        heads: batch * heads,
        tq,
        tk: lens.iter().copied().max().unwrap_or(0),
        d,
        dv: d,
        causal: true,
    };
    let keys = Keys {
        group: heads / kv_heads,
        rows,
        lens,
        per_seq: heads,
    };
    let scope = &q.rents_in;
    let mut out = Tensor::try_rent_in(scope, q.shape())?;
    // An f16 or bf16 cache widens only its filled rows, into copies of the cache's layout: their
    // size does not grow with the sequences, so every step's copies come from the pool's cache
    // (copies of the filled rows alone, a row longer each step, missed it at each new size
    // class: heap allocations in a steady-state decode).
    let filled = |x: &[T]| {
        let heads = lens
            .iter()
            .flat_map(|&len| std::iter::repeat_n(len, kv_heads));
        let range = move |(head, len)| {
            let start = head * rows * d;
            (start..start + len * d, start)
        };
        (x.len(), heads.enumerate().map(range))
    };
    let mut copies = [(); 3].map(|()| None);
    let [cq, ck, cv] = &mut copies;
    let inputs = (
        widened(q.slice(), whole(q.slice()), scope, cq)?,
        widened(k, filled(k), scope, ck)?,
        widened(v, filled(v), scope, cv)?,
    );
    narrowed(scope, [out.unique_slice_mut()], |[out]| {
        run_forward(&dims, keys, scale, inputs, out, &mut [])
    })?;
    Ok(out)
}

/// Whether `T` and `U` are one type (attention computes `f32` and `f64` in their own type).
fn same<T: 'static, U: 'static>() -> bool {
    TypeId::of::<T>() == TypeId::of::<U>()
}

/// `x`'s elements as `T::Wide`s, the type attention computes in: `x` itself for `f32` and `f64`;
/// for `f16` and `bf16`, a copy of `len` elements rented in `scope` (held by `copy`) into which
/// each range of `x` that `parts` gives is widened, at the position it gives; the other elements
/// are unspecified (the kernels read only those).
fn widened<'a, T: Element>(
    x: &'a [T],
    (len, parts): (usize, impl Iterator<Item = (Range<usize>, usize)>),
    scope: &State,
    copy: &'a mut Option<Tensor<'static, T::Wide>>,
) -> Result<&'a [T::Wide]> {
    if same::<T, T::Wide>() {
        return Ok(bytemuck::cast_slice(x));
    }
    let mut wide = Tensor::<T::Wide>::try_rent_in(scope, &[len])?;
    let to = wide.unique_slice_mut();
    for (range, at) in parts {
        T::widen(&x[range.clone()], &mut to[at..at + range.len()]);
    }
    Ok(copy.insert(wide).slice())
}

/// All of `x` at its own place, for [`widened`].
fn whole<T>(x: &[T]) -> (usize, std::iter::Once<(Range<usize>, usize)>) {
    (x.len(), std::iter::once((0..x.len(), 0)))
}

/// Runs `f` on `outs` as `T::Wide`s, for kernels that write every element: `outs` themselves for
/// `f32` and `f64`; for `f16` and `bf16`, one buffer rented in `scope` for them all, rounded into
/// `outs` after (as PyTorch rounds its `f32` accumulators).
fn narrowed<T: Element, const N: usize>(
    scope: &State,
    mut outs: [&mut [T]; N],
    f: impl FnOnce([&mut [T::Wide]; N]),
) -> Result<()> {
    if same::<T, T::Wide>() {
        f(outs.map(|out| bytemuck::cast_slice_mut(out)));
        return Ok(());
    }
    let total = outs.iter().map(|out| out.len()).sum();
    let mut wide = Tensor::<T::Wide>::try_rent_in(scope, &[total])?;
    let mut rest = wide.unique_slice_mut();
    f(outs.each_ref().map(|out| {
        let (part, tail) = std::mem::take(&mut rest).split_at_mut(out.len());
        rest = tail;
        part
    }));
    let mut from = wide.slice();
    for out in &mut outs {
        let (part, tail) = from.split_at(out.len());
        from = tail;
        T::narrow(part, out);
    }
    Ok(())
}

impl<T: Element> Op<T> for Attention {
    /// `q`, `k` and `v`, and the output with each query's log-sum-exp (in the type the scores
    /// are computed in: a log-sum-exp can pass `f16`'s 65504).
    type Saved<'s> = (
        (Saved<'s, T>, Saved<'s, T>, Saved<'s, T>),
        (Saved<'s, T>, Saved<'s, T::Wide>),
    );

    fn name(&self) -> &'static str {
        NAME
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (q, k, v) = (cx.input(0), cx.input(1), cx.input(2));
        let dims = Dims::of(self.causal, q.shape(), k.shape(), v.shape());
        let mut shape = crate::dims::Dims::from_slice(q.shape());
        shape[q.ndim() - 1] = dims.dv;
        let mut out = cx.rent(shape.slice())?;
        // Each query's log-sum-exp, for the backward only.
        let mut lse = match cx.saving() {
            true => Some(cx.rent::<T::Wide>(&q.shape()[..q.ndim() - 1])?),
            false => None,
        };
        let scope = cx.scope();
        let mut copies = [(); 3].map(|()| None);
        let [cq, ck, cv] = &mut copies;
        let inputs = (
            widened(q.slice(), whole(q.slice()), scope, cq)?,
            widened(k.slice(), whole(k.slice()), scope, ck)?,
            widened(v.slice(), whole(v.slice()), scope, cv)?,
        );
        let keys = Keys::whole(&dims);
        narrowed(scope, [out.unique_slice_mut()], |[out]| {
            run_forward(&dims, keys, self.scale, inputs, out, elements(&mut lse))
        })?;
        let saved = lse.map(|lse| {
            let inputs = (cx.save(q), cx.save(k), cx.save(v));
            (inputs, (cx.save(&out), cx.save(&lse)))
        });
        Ok((out, saved))
    }

    fn backward<'b>(
        &self,
        ((q, k, v), (o, lse)): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let dims = Dims::of(self.causal, q.shape(), k.shape(), v.shape());
        // Rented where the kernels write every element, zeros where they run not at all.
        let grad = |i: usize, shape: &[usize]| match (cx.needs(i), dims.empty()) {
            (false, _) => Ok(None),
            (true, true) => cx.zeros(shape).map(Some),
            (true, false) => cx.rent(shape).map(Some),
        };
        let mut grads = [
            grad(0, q.shape())?,
            grad(1, k.shape())?,
            grad(2, v.shape())?,
        ];
        if !dims.empty() {
            work::visit(dims.heads);
            let scope = cx.at();
            let mut copies = [(); 5].map(|()| None);
            let [cq, ck, cv, co, cg] = &mut copies;
            let (q, k, v, o, g) = (
                q.0.slice(),
                k.0.slice(),
                v.0.slice(),
                o.0.slice(),
                g.slice(),
            );
            let saves = Saves {
                q: widened(q, whole(q), scope, cq)?,
                k: widened(k, whole(k), scope, ck)?,
                v: widened(v, whole(v), scope, cv)?,
                o: widened(o, whole(o), scope, co)?,
                lse: lse.0.slice(),
                g: widened(g, whole(g), scope, cg)?,
            };
            let scale = T::Wide::from_f64(self.scale);
            let (tq, tk, d) = (dims.tq, dims.tk, dims.d);
            let [dq, dk, dv] = &mut grads;
            let outs = [elements(dq), elements(dk), elements(dv)];
            narrowed(scope, outs, |[dq, dk, dv]| {
                let outputs = [(dq, tq * d), (dk, tk * d), (dv, tk * dims.dv)];
                // Five products a tile: three `d` deep or wide, two `dv`.
                let min = PER_PART.div_ceil(tq * tk * (3 * d + 2 * dims.dv));
                super::for_each_part(
                    dims.heads,
                    min,
                    |parts| runs(dims.heads, parts, |h| h, outputs),
                    |(heads, grads)| backward_heads(&dims, scale, &saves, heads, grads),
                );
            })?;
        }
        Ok(grads.into_iter().collect())
    }
}

/// The forward of query blocks `blocks` (numbered across the heads, [`Dims::blocks`] per head):
/// their rows of the output into `out`, and each row's log-sum-exp into `lse` (unless empty).
fn forward_blocks<T: Element>(
    dims: &Dims,
    keys: Keys<'_>,
    scale: T,
    (q, k, v): (&[T], &[T], &[T]),
    blocks: Range<usize>,
    out: &mut [T],
    lse: &mut [T],
) {
    let Dims { tq, d, dv, .. } = *dims;
    super::with_scratch(BR * BC + 2 * BR, |scratch: &mut [T]| {
        let (s, stats) = scratch.split_at_mut(BR * BC);
        let (m, l) = stats.split_at_mut(BR);
        let mut row = 0;
        for b in blocks {
            let (h, i0) = (b / dims.blocks(), (b % dims.blocks()) * BR);
            let br = BR.min(tq - i0);
            let qh = head(q, h, tq * d);
            let (dims, kh, vh) = keys.of(dims, h, k, v);
            let dims = &dims;
            let o = &mut out[row * dv..][..br * dv];
            // The keys the block's last row sees, the most any of its rows sees: under the
            // causal mask, the blocks past them are wholly in the future.
            let keys = dims.visible(i0 + br - 1);
            for j0 in (0..keys).step_by(BC) {
                let tile = Tile {
                    i0,
                    br,
                    j0,
                    bc: BC.min(keys - j0),
                };
                let s = &mut s[..br * tile.bc];
                tile.scores(dims, qh, kh, s);
                online_softmax(dims, &tile, scale, s, o, (m, l));
                let p = Matrix::row_major(&*s, br, tile.bc);
                product(Products::F32, p, tile.keys(vh, dv), o, j0 > 0);
            }
            let lse = lse.get_mut(row..row + br).unwrap_or_default();
            each_row(
                br,
                #[inline(always)]
                |r| {
                    let inv = l[r].recip();
                    for x in &mut o[r * dv..][..dv] {
                        *x = *x * inv;
                    }
                    if let Some(lse) = lse.get_mut(r) {
                        *lse = m[r] + l[r].ln_kernel();
                    }
                },
            );
            row += br;
        }
    });
}

/// Folds a tile of unscaled scores `s` (`[br, bc]`) into its rows' running max `m` and sum `l` and
/// their output `o` (`[br, dv]`), the tile's product with its values not yet added: `s` becomes
/// `exp(scale s - m)` (0 at the keys a row does not see), and `o` is rescaled by
/// `exp(m_before - m)`. The first tile of a block starts the rows.
fn online_softmax<T: Element>(
    dims: &Dims,
    tile: &Tile,
    scale: T,
    s: &mut [T],
    o: &mut [T],
    (m, l): (&mut [T], &mut [T]),
) {
    let (bc, dv, first) = (tile.bc, dims.dv, tile.j0 == 0);
    each_row(
        tile.br,
        #[inline(always)]
        |r| {
            let (seen, hidden) = s[r * bc..][..bc].split_at_mut(tile.seen(dims, r));
            for x in seen.iter_mut() {
                *x = *x * scale;
            }
            let most = lanes::max(seen);
            let max = if first || most > m[r] { most } else { m[r] };
            for x in seen.iter_mut() {
                *x = (*x - max).exp_kernel();
            }
            hidden.fill(T::zero());
            let sum = lanes::sum(seen);
            if first {
                l[r] = sum;
            } else {
                let alpha = (m[r] - max).exp_kernel();
                l[r] = alpha * l[r] + sum;
                for x in &mut o[r * dv..][..dv] {
                    *x = *x * alpha;
                }
            }
            m[r] = max;
        },
    );
}

/// What the backward reads, of every head or of one: the inputs, the output, each query's
/// log-sum-exp, and the output's gradient.
#[derive(Clone, Copy)]
struct Saves<'a, T> {
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    o: &'a [T],
    lse: &'a [T],
    g: &'a [T],
}

impl<'a, T> Saves<'a, T> {
    /// Head `h`'s.
    fn head(&self, dims: &Dims, h: usize) -> Saves<'a, T> {
        let Dims { tq, tk, d, dv, .. } = *dims;
        Saves {
            q: head(self.q, h, tq * d),
            k: head(self.k, h, tk * d),
            v: head(self.v, h, tk * dv),
            o: head(self.o, h, tq * dv),
            lse: head(self.lse, h, tq),
            g: head(self.g, h, tq * dv),
        }
    }
}

/// The gradients of heads `heads` into their parts of `dq`, `dk` and `dv` (an empty slice is a
/// gradient not needed): per head, FlashAttention-2's backward, the key blocks outside (their
/// gradients accumulate in the cache) and the query blocks that see them inside.
fn backward_heads<T: Element>(
    dims: &Dims,
    scale: T,
    saves: &Saves<'_, T>,
    heads: Range<usize>,
    mut grads: [&mut [T]; 3],
) {
    let Dims { tq, tk, d, .. } = *dims;
    super::with_scratch(2 * BR * BC + tq, |scratch: &mut [T]| {
        let (p, rest) = scratch.split_at_mut(BR * BC);
        let (ds, delta) = rest.split_at_mut(BR * BC);
        for (n, h) in heads.enumerate() {
            let x = saves.head(dims, h);
            let [dq, dk, dv] = &mut grads;
            let mut grads = [
                head_mut(dq, n, tq * d),
                head_mut(dk, n, tk * d),
                head_mut(dv, n, tk * dims.dv),
            ];
            // D = rowsum(dO * O), each query's `sum(P dP)`.
            let width = dims.dv;
            each_row(
                tq,
                #[inline(always)]
                |i| {
                    let (g, o) = (&x.g[i * width..][..width], &x.o[i * width..][..width]);
                    delta[i] = lanes::sum_with(g, o, |g, o| g * o);
                },
            );
            let head = HeadBackward {
                dims,
                scale,
                x,
                delta,
            };
            for j0 in (0..tk).step_by(BC) {
                // The first query block with a row that sees key `j0`.
                let start = match dims.causal {
                    true => j0.saturating_sub(tk - tq) / BR * BR,
                    false => 0,
                };
                for i0 in (start..tq).step_by(BR) {
                    let tile = Tile {
                        i0,
                        br: BR.min(tq - i0),
                        j0,
                        bc: BC.min(tk - j0),
                    };
                    head.tile(&tile, &mut grads, (p, ds), i0 == start);
                }
            }
        }
    });
}

/// One head's backward: what it reads, and each query's `D`.
struct HeadBackward<'a, T> {
    dims: &'a Dims,
    scale: T,
    x: Saves<'a, T>,
    delta: &'a [T],
}

impl<T: Element> HeadBackward<'_, T> {
    /// The tile's part of the head's gradients `[dq, dk, dv]` (each empty if not needed), with
    /// `p` and `ds` as scratch for its probabilities and their gradient; `first` if the tile is the
    /// first of its keys (their gradients are written, not added to).
    fn tile(
        &self,
        tile: &Tile,
        [dq, dk, dv]: &mut [&mut [T]; 3],
        (p, ds): (&mut [T], &mut [T]),
        first: bool,
    ) {
        let Self {
            dims,
            scale,
            x,
            delta,
        } = *self;
        let Tile { i0, br, j0, bc } = *tile;
        let p = &mut p[..br * bc];
        tile.scores(dims, x.q, x.k, p);
        // P = exp(scale S - lse), 0 where masked.
        each_row(
            br,
            #[inline(always)]
            |r| {
                let (seen, hidden) = p[r * bc..][..bc].split_at_mut(tile.seen(dims, r));
                let lse = x.lse[i0 + r];
                for s in seen {
                    *s = (*s * scale - lse).exp_kernel();
                }
                hidden.fill(T::zero());
            },
        );
        let (p, g) = (&*p, tile.rows(x.g, dims.dv));
        let probabilities = Matrix::row_major(p, br, bc);
        if !dv.is_empty() {
            let dv = &mut dv[j0 * dims.dv..][..bc * dims.dv];
            product(Products::F32, probabilities.t(), g, dv, !first);
        }
        if dq.is_empty() && dk.is_empty() {
            return;
        }
        // dP = dO V^T, then dS = scale P (dP - D): the scores' gradient with the scale in.
        let ds = &mut ds[..br * bc];
        product(Products::F32, g, tile.keys(x.v, dims.dv).t(), ds, false);
        each_row(
            br,
            #[inline(always)]
            |r| {
                let d = delta[i0 + r];
                let row = &mut ds[r * bc..][..bc];
                for (s, &p) in row.iter_mut().zip(&p[r * bc..][..bc]) {
                    *s = scale * p * (*s - d);
                }
            },
        );
        let ds = Matrix::row_major(&*ds, br, bc);
        if !dq.is_empty() {
            let dq = &mut dq[i0 * dims.d..][..br * dims.d];
            product(Products::F32, ds, tile.keys(x.k, dims.d), dq, j0 > 0);
        }
        if !dk.is_empty() {
            let dk = &mut dk[j0 * dims.d..][..bc * dims.d];
            product(Products::F32, ds.t(), tile.rows(x.q, dims.d), dk, !first);
        }
    }
}

/// Checks the shapes of `q`, `k` and `v` and the options of an attention of `T`s; the scale it
/// uses.
fn check<T: Element>(
    q: &[usize],
    k: &[usize],
    v: &[usize],
    options: AttentionOptions,
) -> Result<f64> {
    let shape = |shape: &[usize]| Shape::from(shape);
    let mismatch = |lhs: &[usize], rhs: &[usize], reason: String| Error::ShapeMismatch {
        op: NAME,
        lhs: shape(lhs),
        rhs: shape(rhs),
        reason,
    };
    for (name, x, axes) in [
        ("q", q, "[.., tq, d]"),
        ("k", k, "[.., tk, d]"),
        ("v", v, "[.., tk, dv]"),
    ] {
        if x.len() < 2 {
            return Err(Error::InvalidShape {
                op: NAME,
                shape: shape(x),
                reason: format!("{name} needs at least two axes, {axes}"),
            });
        }
    }
    fn lead(x: &[usize]) -> &[usize] {
        &x[..x.len() - 2]
    }
    for (name, x) in [("k", k), ("v", v)] {
        if lead(x) != lead(q) {
            return Err(mismatch(
                q,
                x,
                format!(
                    "the leading (batch and head) axes of q and {name} differ, {} and {}; they \
                     must be equal (they are not broadcast)",
                    shape(lead(q)),
                    shape(lead(x))
                ),
            ));
        }
    }
    let [.., tq, d] = *q else {
        unreachable!("rank checked")
    };
    let [.., tk, dk] = *k else {
        unreachable!("rank checked")
    };
    let tv = v[v.len() - 2];
    if d != dk {
        let reason = format!(
            "q and k have head dimensions {d} and {dk} (their last axes); they must be equal"
        );
        return Err(mismatch(q, k, reason));
    }
    if tk != tv {
        let reason = format!("k has {tk} keys and v {tv} values (axis -2); they must be equal");
        return Err(mismatch(k, v, reason));
    }
    if d == 0 {
        return Err(Error::InvalidShape {
            op: NAME,
            shape: shape(q),
            reason: "the head dimension (the last axis) is 0: a score needs one element at least"
                .into(),
        });
    }
    if tk == 0 && tq > 0 {
        let reason = format!("{tq} queries and no key: every query needs a key to attend to");
        return Err(mismatch(q, k, reason));
    }
    if options.causal && tq > tk {
        let reason = format!(
            "causal attention aligns the last query with the last key, so of {tq} queries and {tk} \
             keys the first {} would see no key; causal needs at most as many queries as keys",
            tq - tk
        );
        return Err(mismatch(q, k, reason));
    }
    check_scale::<T>(NAME, options.scale.unwrap_or(1.0 / (d as f64).sqrt()))
}

/// `scale`, if it is finite in the type an attention of `T`s (for `op`) computes its scores in
/// ([`Element::Wide`]): 1e300 is a finite `f64` and infinite as an `f32`, which would make every
/// score NaN. Else [`Error::InvalidArgument`] naming the scale and both types.
pub(crate) fn check_scale<T: Element>(op: &'static str, scale: f64) -> Result<f64> {
    if num_traits::Float::is_finite(<T::Wide as DType>::from_f64(scale)) {
        return Ok(scale);
    }
    Err(Error::InvalidArgument {
        op,
        arg: "scale",
        reason: format!(
            "{scale:?} is not a finite {} (attention of {} computes its scores in {0})",
            T::Wide::NAME,
            T::NAME
        ),
    })
}

impl<'s, T: Element> Tensor<'s, T> {
    /// Scaled-dot-product attention of these queries `[.., tq, d]` over keys `k: [.., tk, d]` and
    /// values `v: [.., tk, dv]`: `softmax(scale q k^T) v`, `[.., tq, dv]`, as PyTorch's
    /// `scaled_dot_product_attention`, fused (see the options: [`AttentionOptions`]). The
    /// leading axes (batch, heads) of the three must be equal; they are not broadcast.
    ///
    /// Unlike the same attention written with [`matmul`](Tensor::matmul),
    /// [`masked_fill`](Tensor::masked_fill) and [`softmax`](crate::TensorOps::softmax), it never
    /// makes the `[.., tq, tk]` scores or probabilities: the forward folds tiles of them into the
    /// output as FlashAttention-2 does, and keeps for the backward only its inputs, its output
    /// and each query's log-sum-exp (`[.., tq]`), from which the backward recomputes each tile.
    /// Every input gets a gradient, and under `#[checkpoint]` a replay gives the same bits.
    ///
    /// Fails, before anything is rented, with [`Error::InvalidShape`] for an operand of rank below
    /// 2 or a head dimension `d` of 0; with [`Error::ShapeMismatch`] naming the two shapes if the
    /// leading axes differ, `q` and `k` differ in `d`, `k` and `v` in `tk`, or a query would see
    /// no key (no keys at all, or `causal` with `tq > tk`); with [`Error::InvalidArgument`] for a
    /// scale that is not finite in the type the scores are computed in (1e300 is a finite `f64`
    /// and an infinite `f32`).
    ///
    /// `f16` and `bf16` compute their scores, softmax and sums in `f32`, as PyTorch does (scores
    /// may pass 65504), from `f32` copies of the operands rented for the call: the output and the
    /// gradients are the `f32` results rounded once.
    ///
    /// ```
    /// use tensorscope::ops::AttentionOptions;
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     // Batch 1, 2 heads, 3 positions, head dimension 4.
    ///     let q = s.randn::<f32>(&[1, 2, 3, 4], 1);
    ///     let k = s.randn::<f32>(&[1, 2, 3, 4], 2);
    ///     let v = s.randn::<f32>(&[1, 2, 3, 4], 3);
    ///     let causal = AttentionOptions { causal: true, ..AttentionOptions::default() };
    ///     let y = q.scaled_dot_product_attention(&k, &v, causal);
    ///     assert_eq!(y.shape(), &[1, 2, 3, 4]);
    ///     // The first query sees only the first key: its output is the first value.
    ///     assert_eq!(y.to_vec()[..4], v.to_vec()[..4]);
    /// });
    /// ```
    pub fn try_scaled_dot_product_attention(
        &self,
        k: &Tensor<'s, T>,
        v: &Tensor<'s, T>,
        options: AttentionOptions,
    ) -> Result<Tensor<'s, T>> {
        let scale = check::<T>(self.shape(), k.shape(), v.shape(), options)?;
        let op = Attention {
            causal: options.causal,
            scale,
        };
        autograd::run(op, &mut Inputs::Slice(&[self, k, v]))
    }

    panicking! {
        /// Scaled-dot-product attention of these queries over keys `k` and values `v`.
        pub fn scaled_dot_product_attention(&self, k: &Tensor<'s, T>, v: &Tensor<'s, T>, options: AttentionOptions) -> Tensor<'s, T> = try_scaled_dot_product_attention;
    }
}
