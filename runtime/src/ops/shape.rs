//! Shape ops: joining, stacking, slicing, splitting, permuting, tiling (`repeat`, `expand`) and
//! adding or removing axes of length 1. They move elements and do no arithmetic, so they work on
//! every [`DType`]. `narrow` (and `split`, `chunk`), `permute` (and `transpose`, `t`) and `expand`
//! are views: a shape, an offset and a step per axis on their input's buffer, no copy and no
//! rent; `reshape`, `squeeze` and `unsqueeze` are views too, unless the new shape joins axes that
//! do not lie one inside the other (then they copy once); `concat`, `stack` and `repeat` copy.

use super::{check_addressable, check_axis, dimension_overflow, resolve_axis, work, Dim};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Inputs, Op};
use crate::dims::{Dims, Walk};
use crate::element::DType;
use crate::error::{or_panic, panicking, Error, Result, Shape};
use crate::pool::element_count;
use crate::scope::State;
use crate::tensor::Tensor;

/// `concat` along an axis.
#[derive(Debug, Clone, Copy)]
struct Concat {
    axis: usize,
}

impl<T: DType> Op<T> for Concat {
    /// The inputs' lengths along the axis.
    type Saved<'s> = Dims;

    fn name(&self) -> &'static str {
        "concat"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let axis = self.axis;
        let first = cx.input(0);
        let joined = cx
            .inputs()
            .try_fold(0usize, |len, t| len.checked_add(t.shape()[axis]));
        let overflow = || {
            let total = cx
                .inputs()
                .map(|t| t.shape()[axis])
                .fold(0usize, usize::saturating_add);
            dimension_overflow("concat", "joined length", total, first.shape())
        };
        let mut shape = Dims::from_slice(first.shape());
        shape[axis] = joined.ok_or_else(overflow)?;
        check_addressable::<T>(&shape, overflow)?;
        let mut out = cx.rent(&shape)?;
        if !out.is_empty() {
            let steps = Dims::row_major(&shape);
            let mut start = 0;
            for t in cx.inputs().filter(|t| !t.is_empty()) {
                work::visit(1);
                out.write_at(t.shape(), start * steps[axis], &steps, t);
                start += t.shape()[axis];
            }
        }
        let saved = cx.saving().then(|| {
            let mut lengths = Dims::zeros(cx.len());
            for (len, t) in lengths.slice_mut().iter_mut().zip(cx.inputs()) {
                *len = t.shape()[axis];
            }
            lengths
        });
        Ok((out, saved))
    }

    /// The gradient's slices along the axis, one per input.
    fn backward<'b>(
        &self,
        lengths: Dims,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let mut start = 0;
        let parts = lengths.slice().iter().enumerate().map(|(i, &len)| {
            start += len;
            cx.needs(i)
                .then(|| narrowed(&g, cx.at(), self.axis, start - len, len))
                .transpose()
        });
        parts.collect::<Result<Grads<'b, T>>>()
    }
}

/// `narrow(axis, start, len)`.
#[derive(Debug, Clone, Copy)]
struct Narrow {
    axis: usize,
    start: usize,
    len: usize,
}

impl<T: DType> Op<T> for Narrow {
    /// The input's length along the axis.
    type Saved<'s> = usize;

    fn name(&self) -> &'static str {
        "narrow"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let x = cx.input(0);
        let Narrow { axis, start, len } = *self;
        let mut shape = Dims::from_slice(x.shape());
        shape[axis] = len;
        let offset = x.buffer().1 + start * x.step(axis);
        let steps = (0..x.ndim()).map(|i| x.step(i));
        let out = x.strided_view(cx.scope(), shape.slice(), offset, steps);
        Ok((out, cx.saving().then(|| x.shape()[axis])))
    }

    fn reads_views(&self) -> bool {
        true
    }

    /// The gradient in the narrowed positions, zeros elsewhere.
    fn backward<'b>(
        &self,
        full: usize,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let Narrow { axis, start, .. } = *self;
        let mut shape = Dims::from_slice(g.shape());
        shape[axis] = full;
        let mut dx = cx.zeros::<T>(&shape)?;
        let steps = Dims::row_major(&shape);
        dx.write_at(g.shape(), start * steps[axis], &steps, &g);
        Ok(Grads::from([Some(dx)]))
    }
}

/// A copy of `len` positions of `axis` of `x` from `start` (checked by the caller), in `scope`.
fn narrowed<'s, T: DType>(
    x: &Tensor<'s, T>,
    scope: &State,
    axis: usize,
    start: usize,
    len: usize,
) -> Result<Tensor<'s, T>> {
    let mut shape = Dims::from_slice(x.shape());
    shape[axis] = len;
    let mut out = Tensor::try_rent_in(scope, &shape)?;
    work::visit(1);
    let (_, offset) = x.buffer();
    let steps = (0..x.ndim()).map(|i| x.step(i));
    out.copy_from(&x.strided_view(scope, &shape, offset + start * x.step(axis), steps));
    Ok(out)
}

/// `permute(axes)`: axis `i` of the output is axis `axes[i]` of the input.
#[derive(Debug, Clone)]
struct Permute {
    axes: Dims,
}

impl Permute {
    /// The view of `x` with its axes in this order, whose ops rent in `scope`.
    fn view_of<'t, T: DType>(&self, x: &Tensor<'_, T>, scope: &State) -> Tensor<'t, T> {
        let axes = self.axes.slice();
        let mut shape = Dims::zeros(axes.len());
        for (len, &a) in shape.slice_mut().iter_mut().zip(axes) {
            *len = x.shape()[a];
        }
        let steps = axes.iter().map(|&a| x.step(a));
        x.strided_view(scope, shape.slice(), x.buffer().1, steps)
    }
}

impl<T: DType> Op<T> for Permute {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        "permute"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let out = self.view_of(cx.input(0), cx.scope());
        Ok((out, cx.saving().then_some(())))
    }

    fn reads_views(&self) -> bool {
        true
    }

    /// The gradient permuted back.
    fn backward<'b>(&self, (): (), g: Tensor<'b, T>, _: &Backward<'b>) -> Result<Grads<'b, T>> {
        let mut inverse = self.axes.clone();
        for (i, &a) in self.axes.slice().iter().enumerate() {
            inverse[a] = i;
        }
        Ok(Grads::from([Some(g.try_permute(inverse.slice())?)]))
    }
}

/// `repeat(reps)`: the input, its shape led by 1s to the length of `reps`, tiled `reps[i]` times
/// along axis `i`. `expand` is the same op on axes of length 1.
#[derive(Debug, Clone)]
struct Tile {
    reps: Dims,
    expand: bool,
}

impl<T: DType> Op<T> for Tile {
    /// The input's shape.
    type Saved<'s> = Dims;

    fn name(&self) -> &'static str {
        if self.expand {
            "expand"
        } else {
            "repeat"
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let x = cx.input(0);
        let [kept, tiled, shape] = tile_shapes(x.shape(), self.reps.slice());
        if self.expand {
            // A view: a step of 0 along every axis it repeats (new axes, axes of length 1).
            let lead = shape.len() - x.ndim();
            let steps = (0..shape.len()).map(|i| match i.checked_sub(lead) {
                Some(j) if self.reps[i] == 1 => x.step(j),
                _ => 0,
            });
            let out = x.strided_view(cx.scope(), shape.slice(), x.buffer().1, steps);
            return Ok((out, cx.saving().then(|| Dims::from_slice(x.shape()))));
        }
        let mut out = cx.rent(shape.slice())?;
        if !out.is_empty() {
            work::visit(super::rows(tiled.slice()));
            // The output as `[r0, s0, r1, s1, ..]`, the input broadcast along the tiles.
            let src = x.reshaped(cx.scope(), &kept, Dims::row_major(&kept));
            out.write_at(&tiled, 0, &Dims::row_major(&tiled), &src);
        }
        Ok((out, cx.saving().then(|| Dims::from_slice(x.shape()))))
    }

    /// The gradient of every tile, summed.
    fn backward<'b>(
        &self,
        shape: Dims,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let [kept, tiled, _] = tile_shapes(shape.slice(), self.reps.slice());
        let mut dx = cx.zeros::<T>(shape.slice())?;
        // `expand` reads views, so its gradient may be one.
        let g = g.try_contiguous_in(cx.at())?;
        if !g.is_empty() {
            work::visit(self.reps.size());
            // `g` as `[r0, s0, r1, s1, ..]` (axis `2i` the tile along axis `i`, `2i + 1` the
            // position in it), walked in order, each position's tiles added into `dx` in turn.
            let mut into = Dims::row_major(&kept);
            into.iter_mut().step_by(2).for_each(|step| *step = 0);
            let from = g
                .steps_as(&tiled)
                .expect("a row-major gradient splits its axes in place");
            let (values, start) = g.buffer();
            let walk = Walk::new(&tiled, [0, start], [&into, &from]);
            let dx_values = dx.unique_slice_mut();
            walk.for_each_run(|_, [at, from], len, [step, from_step]| {
                for i in 0..len {
                    let d = &mut dx_values[at + i * step];
                    *d = d.add_gradient(values[from + i * from_step]);
                }
            });
        }
        Ok(Grads::from([Some(dx)]))
    }

    fn reads_views(&self) -> bool {
        self.expand
    }
}

/// For an input of `shape` tiled `reps` times (`reps` at least as long): the input's shape led by
/// 1s with a 1 before every axis (`[1, s0, 1, s1, ..]`), the output's as tiles and positions in a
/// tile (`[r0, s0, r1, s1, ..]`), and the output's (`[r0 s0, r1 s1, ..]`).
fn tile_shapes(shape: &[usize], reps: &[usize]) -> [Dims; 3] {
    let n = reps.len();
    let (mut kept, mut tiled, mut out) = (Dims::zeros(2 * n), Dims::zeros(2 * n), Dims::zeros(n));
    for (i, &r) in reps.iter().enumerate() {
        let s = (i + shape.len()).checked_sub(n).map_or(1, |j| shape[j]);
        (kept[2 * i], kept[2 * i + 1]) = (1, s);
        (tiled[2 * i], tiled[2 * i + 1]) = (r, s);
        out[i] = r * s;
    }
    [kept, tiled, out]
}

/// `reshape(shape)`: an alias with another shape.
#[derive(Debug, Clone)]
struct Reshape {
    shape: Dims,
}

impl<T: DType> Op<T> for Reshape {
    /// The input's shape.
    type Saved<'s> = Dims;

    fn name(&self) -> &'static str {
        "reshape"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let x = cx.input(0);
        let saved = cx.saving().then(|| Dims::from_slice(x.shape()));
        let alias = match x.steps_as(&self.shape) {
            Some(steps) => x.reshaped(cx.scope(), &self.shape, steps),
            // A view whose axes the new shape crosses: a copy, reshaped.
            None => {
                let copy = x.clone().try_contiguous_in(cx.scope())?;
                copy.reshaped(cx.scope(), &self.shape, Dims::row_major(&self.shape))
            }
        };
        Ok((alias, saved))
    }

    fn reads_views(&self) -> bool {
        true
    }

    /// The gradient reshaped back.
    fn backward<'b>(
        &self,
        shape: Dims,
        g: Tensor<'b, T>,
        _: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        Ok(Grads::from([Some(g.try_reshape(shape.slice())?)]))
    }
}

impl<'s, T: DType> Tensor<'s, T> {
    /// Joins `tensors` along `axis`. All must have the same rank and the same lengths on every other
    /// axis. Fails with [`Error::NoInputs`] for an empty list, [`Error::AxisOutOfRange`] for a bad
    /// axis, and [`Error::ShapeMismatch`] naming the first two shapes that do not fit.
    pub fn try_concat(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Result<Tensor<'s, T>> {
        let Some((first, rest)) = tensors.split_first() else {
            return Err(Error::NoInputs { op: "concat" });
        };
        let axis = check_axis("concat", first, axis)?;
        for t in rest {
            let reason = if t.ndim() != first.ndim() {
                Some(format!("ranks differ ({} and {})", first.ndim(), t.ndim()))
            } else {
                (0..t.ndim())
                    .find(|&i| i != axis && t.shape()[i] != first.shape()[i])
                    .map(|i| {
                        format!(
                            "axis {i} differs ({} and {}); only the joined axis {axis} may",
                            first.shape()[i],
                            t.shape()[i]
                        )
                    })
            };
            if let Some(reason) = reason {
                return Err(Error::ShapeMismatch {
                    op: "concat",
                    lhs: Shape::from(first.shape()),
                    rhs: Shape::from(t.shape()),
                    reason,
                });
            }
        }
        autograd::run(Concat { axis }, &mut Inputs::Slice(tensors))
    }

    panicking! {
        /// Joins `tensors` along `axis`.
        pub fn concat(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Tensor<'s, T> = Self::try_concat;
    }

    /// Stacks `tensors` along a new axis `axis` (`-1`: a new last axis): `n` tensors of shape `[a, b]`
    /// stacked along 1 give `[a, n, b]`. All must have the same shape. Fails with
    /// [`Error::NoInputs`], [`Error::AxisOutOfRange`] (the new axis may be 0 to the rank), or
    /// [`Error::ShapeMismatch`] naming the first two shapes that differ.
    pub fn try_stack(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Result<Tensor<'s, T>> {
        let Some(first) = tensors.first() else {
            return Err(Error::NoInputs { op: "stack" });
        };
        let axis = resolve_axis("stack", axis, first.ndim() + 1)?;
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::ShapeMismatch {
                op: "stack",
                lhs: Shape::from(first.shape()),
                rhs: Shape::from(t.shape()),
                reason: "stacked tensors must have the same shape".into(),
            });
        }
        let lifted = tensors
            .iter()
            .map(|t| t.try_unsqueeze(axis))
            .collect::<Result<Vec<_>>>()?;
        Tensor::try_concat(&lifted.iter().collect::<Vec<_>>(), axis)
    }

    panicking! {
        /// Stacks `tensors` along a new axis.
        pub fn stack(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Tensor<'s, T> = Self::try_stack;
    }

    /// A view of positions `start..start + len` of `axis` (PyTorch's `narrow`, or `x[.., a..b, ..]`):
    /// no copy; contiguous when `axis` is the first of length above 1.
    /// Fails with [`Error::AxisOutOfRange`], or [`Error::InvalidShape`] if the range passes the axis's
    /// length.
    pub fn try_narrow(&self, axis: impl Dim, start: usize, len: usize) -> Result<Tensor<'s, T>> {
        let axis = check_axis("narrow", self, axis)?;
        let full = self.shape()[axis];
        if start.checked_add(len).is_none_or(|end| end > full) {
            return Err(Error::InvalidShape {
                op: "narrow",
                shape: Shape::from(self.shape()),
                reason: format!(
                    "positions {start}..{} of axis {axis} pass its length {full}",
                    start.saturating_add(len)
                ),
            });
        }
        autograd::run(
            Narrow { axis, start, len },
            &mut args([Arg::Borrowed(self)]),
        )
    }

    panicking! {
        /// A view of positions `start..start + len` of `axis`.
        pub fn narrow(&self, axis: impl Dim, start: usize, len: usize) -> Tensor<'s, T> = try_narrow;
    }

    /// Splits `axis` into pieces of `size` positions (the last may be shorter; one empty piece for
    /// an empty axis), as PyTorch's `split`. Fails with [`Error::AxisOutOfRange`], or [`Error::InvalidShape`] for a size of 0.
    pub fn try_split(&self, size: usize, axis: impl Dim) -> Result<Vec<Tensor<'s, T>>> {
        let axis = check_axis("split", self, axis)?;
        if size == 0 {
            return Err(Error::InvalidShape {
                op: "split",
                shape: Shape::from(self.shape()),
                reason: "pieces of size 0".into(),
            });
        }
        let full = self.shape()[axis];
        if full == 0 {
            // One empty piece, as PyTorch's `split`.
            return Ok(vec![self.try_narrow(axis, 0, 0)?]);
        }
        (0..full)
            .step_by(size)
            .map(|start| self.try_narrow(axis, start, size.min(full - start)))
            .collect()
    }

    panicking! {
        /// Splits `axis` into pieces of `size` positions.
        pub fn split(&self, size: usize, axis: impl Dim) -> Vec<Tensor<'s, T>> = try_split;
    }

    /// Splits `axis` into `N` views, as PyTorch's `chunk`: pieces of `ceil(len / N)` positions, the
    /// last shorter; when the axis is too short for `N` such pieces (`len = 2` into 3), the
    /// missing ones at the end are empty views, where PyTorch returns fewer. An array, so that
    /// `let [q, k, v] = qkv.chunk::<3>(-1);` names the pieces and allocates nothing. Fails with
    /// [`Error::AxisOutOfRange`], or [`Error::InvalidShape`] for `N = 0`.
    pub fn try_chunk<const N: usize>(&self, axis: impl Dim) -> Result<[Tensor<'s, T>; N]> {
        let axis = check_axis("chunk", self, axis)?;
        if N == 0 {
            return Err(Error::InvalidShape {
                op: "chunk",
                shape: Shape::from(self.shape()),
                reason: "0 chunks".into(),
            });
        }
        let full = self.shape()[axis];
        let size = full.div_ceil(N);
        let mut failure = None;
        let pieces = std::array::from_fn(|i| {
            let start = (i * size).min(full);
            let piece = self.try_narrow(axis, start, size.min(full - start));
            piece.unwrap_or_else(|e| {
                failure.get_or_insert(e);
                self.clone()
            })
        });
        failure.map_or(Ok(pieces), Err)
    }

    /// Splits `axis` into `N` views. As [`Tensor::try_chunk`] (written out: `panicking!` takes no
    /// const generics).
    ///
    /// # Panics
    /// Where that returns an error, with the error's message.
    #[track_caller]
    pub fn chunk<const N: usize>(&self, axis: impl Dim) -> [Tensor<'s, T>; N] {
        crate::error::or_panic(self.try_chunk(axis))
    }

    /// A view with the axes in the order `axes` (a permutation of `0..rank`, negative axes allowed):
    /// axis `i` of the result is axis `axes[i]` of the input, as PyTorch's `permute`. No copy: the
    /// ops that read it in order copy it then (a matrix product reads it where it lies). Fails with
    /// [`Error::AxisOutOfRange`], or [`Error::InvalidShape`] if `axes` is not a permutation.
    pub fn try_permute<D: Dim>(&self, axes: &[D]) -> Result<Tensor<'s, T>> {
        let nd = self.ndim();
        // `Dims`, as shapes are: no allocation at any rank.
        let mut resolved = Dims::zeros(axes.len());
        for (r, &a) in resolved.slice_mut().iter_mut().zip(axes) {
            *r = resolve_axis("permute", a, nd)?;
        }
        let mut seen = Dims::zeros(nd);
        let is_permutation = axes.len() == nd
            && resolved.slice().iter().all(|&a| {
                seen[a] += 1;
                seen[a] == 1
            });
        if !is_permutation {
            return Err(Error::InvalidShape {
                op: "permute",
                shape: Shape::from(self.shape()),
                reason: format!(
                    "axes {:?} are not a permutation of the {nd} axes",
                    resolved.slice()
                ),
            });
        }
        let op = Permute { axes: resolved };
        // Without a graph nothing records: the view is made here, as reshape's alias is (the
        // backward of every product transposes an operand).
        if self.node.is_none() {
            return Ok(op.view_of(self, &self.rents_in));
        }
        autograd::run(op, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// A view with the axes in the order `axes`.
        pub fn permute<D: Dim>(&self, axes: &[D]) -> Tensor<'s, T> = try_permute;
    }

    /// The same elements in a new shape (as many elements), without a copy when the tensor is
    /// contiguous or the new shape only splits or joins axes that lie one inside the other in its
    /// buffer (PyTorch's `view`: `[b, t, c]` narrowed from `[b, t, 3c]` splits into `[b, t, h,
    /// d]` in place); otherwise (`x.t().flatten()`) a copy, as PyTorch's `reshape`.
    ///
    /// Fails with [`Error::ShapeMismatch`] if the element counts differ, [`Error::SizeOverflow`] if the
    /// new shape is too large to address.
    pub fn try_reshape(&self, shape: &[usize]) -> Result<Tensor<'s, T>> {
        let count = element_count::<T>(shape)?;
        if count != self.len() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: Shape::from(self.shape()),
                rhs: Shape::from(shape),
                reason: format!("{} elements cannot be viewed as {count}", self.len()),
            });
        }
        // Without a graph the op records nothing and its output is the alias in this tensor's
        // scope: made here, reshape (the most frequent op of a step, in backward rules too) skips
        // the op core's bookkeeping.
        if self.node.is_none() {
            if let Some(steps) = self.steps_as(shape) {
                return Ok(self.reshaped(&self.rents_in, shape, steps));
            }
        }
        let shape = Dims::from_slice(shape);
        autograd::run(Reshape { shape }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// The same elements in a new shape, without a copy where the layout allows.
        pub fn reshape(&self, shape: &[usize]) -> Tensor<'s, T> = try_reshape;
    }

    /// A view with axes `a` and `b` swapped (PyTorch's `transpose(a, b)`; `transpose(1, 2)` turns
    /// `[b, t, h, d]` into `[b, h, t, d]`). Fails with [`Error::AxisOutOfRange`].
    pub fn try_transpose(&self, a: impl Dim, b: impl Dim) -> Result<Tensor<'s, T>> {
        let a = check_axis("transpose", self, a)?;
        let b = check_axis("transpose", self, b)?;
        let mut axes = Dims::zeros(self.ndim());
        for (i, axis) in axes.slice_mut().iter_mut().enumerate() {
            *axis = i;
        }
        axes.slice_mut().swap(a, b);
        self.try_permute(axes.slice())
    }

    panicking! {
        /// A view with axes `a` and `b` swapped.
        pub fn transpose(&self, a: impl Dim, b: impl Dim) -> Tensor<'s, T> = try_transpose;
    }

    /// A view with the last two axes swapped (`[.., m, n] -> [.., n, m]`), as candle's `t()` and
    /// PyTorch's `mT`: `x.matmul(&w.t())` reads `w` where it lies. Fails with
    /// [`Error::InvalidShape`] for a rank below 2.
    pub fn try_t(&self) -> Result<Tensor<'s, T>> {
        if self.ndim() < 2 {
            return Err(Error::InvalidShape {
                op: "t",
                shape: Shape::from(self.shape()),
                reason: "needs at least two axes".into(),
            });
        }
        self.try_transpose(-2, -1)
    }

    panicking! {
        /// A view with the last two axes swapped.
        pub fn t(&self) -> Tensor<'s, T> = try_t;
    }

    /// A zero-copy alias with a new axis of length 1 at `axis` (0 to the rank; `-1` appends one).
    /// Fails with [`Error::AxisOutOfRange`].
    pub fn try_unsqueeze(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = resolve_axis("unsqueeze", axis, self.ndim() + 1)?;
        let shape = Dims::from_slice(self.shape()).inserted(axis, 1);
        self.try_reshape(shape.slice())
    }

    panicking! {
        /// A zero-copy alias with a new axis of length 1.
        pub fn unsqueeze(&self, axis: impl Dim) -> Tensor<'s, T> = try_unsqueeze;
    }

    /// A zero-copy alias without `axis`, which must have length 1. Unlike PyTorch, which returns
    /// the tensor unchanged, squeezing an axis of another length is an error
    /// ([`Error::InvalidShape`]), since it is almost always a shape bug; also
    /// [`Error::AxisOutOfRange`].
    pub fn try_squeeze(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("squeeze", self, axis)?;
        if self.shape()[axis] != 1 {
            return Err(Error::InvalidShape {
                op: "squeeze",
                shape: Shape::from(self.shape()),
                reason: format!("axis {axis} has length {}, not 1", self.shape()[axis]),
            });
        }
        self.try_reshape(Dims::from_slice(self.shape()).removed(axis).slice())
    }

    panicking! {
        /// A zero-copy alias without `axis`.
        pub fn squeeze(&self, axis: impl Dim) -> Tensor<'s, T> = try_squeeze;
    }

    /// The tensor tiled `reps[i]` times along axis `i` (PyTorch's `Tensor.repeat`): `[1, 2]`
    /// repeated `[2, 2]` is `[[1, 2, 1, 2], [1, 2, 1, 2]]`. `reps` may be longer than the rank: the
    /// shape is then led by axes of length 1. The gradient of every tile is summed. Fails with
    /// [`Error::InvalidArgument`] if `reps` is shorter than the rank, and
    /// [`Error::DimensionOverflow`] for an output too large to address.
    pub fn try_repeat(&self, reps: &[usize]) -> Result<Tensor<'s, T>> {
        if reps.len() < self.ndim() {
            return Err(Error::InvalidArgument {
                op: "repeat",
                arg: "reps",
                reason: format!(
                    "{} repetitions for a tensor of rank {}: one per axis at least",
                    reps.len(),
                    self.ndim()
                ),
            });
        }
        self.tile(Dims::from_slice(reps), false)
    }

    panicking! {
        /// The tensor tiled `reps[i]` times along axis `i`.
        pub fn repeat(&self, reps: &[usize]) -> Tensor<'s, T> = try_repeat;
    }

    /// The tensor broadcast to `shape` (PyTorch's `expand`, with the lengths written out): its axes
    /// of length 1 repeated, and new leading axes: a view, in which those axes step 0 (no copy).
    /// The gradient is summed over
    /// the repeated axes. Fails with [`Error::ShapeMismatch`] if the tensor does not broadcast to
    /// `shape`, and [`Error::DimensionOverflow`] for a shape too large to address.
    pub fn try_expand(&self, shape: &[usize]) -> Result<Tensor<'s, T>> {
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: "expand",
            lhs: Shape::from(self.shape()),
            rhs: Shape::from(shape),
            reason,
        };
        let Some(lead) = shape.len().checked_sub(self.ndim()) else {
            return Err(mismatch("the shape has fewer axes than the tensor".into()));
        };
        let mut reps = Dims::zeros(shape.len());
        for (i, &len) in shape.iter().enumerate() {
            let from = i.checked_sub(lead).map_or(1, |j| self.shape()[j]);
            reps[i] = match from {
                _ if from == len => 1,
                1 => len,
                _ => {
                    return Err(mismatch(format!(
                        "axis {i} of the result has length {len}, which the input's {from} cannot \
                         broadcast to"
                    )))
                }
            };
        }
        self.tile(reps, true)
    }

    panicking! {
        /// The tensor broadcast to `shape`.
        pub fn expand(&self, shape: &[usize]) -> Tensor<'s, T> = try_expand;
    }

    /// `repeat(reps)`, or `expand` if `expand`, after checking that the output can be addressed.
    fn tile(&self, reps: Dims, expand: bool) -> Result<Tensor<'s, T>> {
        let op = if expand { "expand" } else { "repeat" };
        let lead = reps.len() - self.ndim();
        let mut shape = Dims::zeros(reps.len());
        for (i, &r) in reps.slice().iter().enumerate() {
            let len = i.checked_sub(lead).map_or(1, |j| self.shape()[j]);
            let overflow = || dimension_overflow(op, "repetitions", r, self.shape());
            shape[i] = len.checked_mul(r).ok_or_else(overflow)?;
        }
        let all = reps.iter().try_fold(1usize, |n, &r| n.checked_mul(r));
        let all = all.unwrap_or(usize::MAX);
        let overflow = || dimension_overflow(op, "repetitions", all, self.shape());
        check_addressable::<T>(shape.slice(), overflow)?;
        autograd::run(Tile { reps, expand }, &mut args([Arg::Borrowed(self)]))
    }

    /// All the elements as one axis (`[len]`): an alias of a contiguous tensor, a copy of a view
    /// whose elements do not lie in one run.
    pub fn flatten(&self) -> Tensor<'s, T> {
        or_panic(self.try_reshape(&[self.len()]))
    }
}
