//! The reference forward of the performance work, written three ways on the same weights:
//! 16 residual MLP blocks `y = LayerNorm(x + gelu(x W1 + b1) W2 + b2)` (square weights, no affine
//! LayerNorm, GELU's tanh form), f32.
//!
//! - (a) `plain`: ndarray with a fresh allocation for every op's result;
//! - (b) `pooled`: tensorscope, one `#[dispose_scope]` function per block;
//! - (c) `prealloc`: hand-written into buffers allocated once and reused across calls.
//!
//! All three run the ops as separate passes (matmul into an output, bias, GELU, residual, layer
//! norm). (a) and (c) run ndarray's products (matrixmultiply) and a scalar GELU, (b) tensorscope's
//! own products and vectorised kernels: (a) against (c) shows what fresh allocation costs, (b)
//! against both what the library gives, time and memory together. Shared by `benches/forward.rs`,
//! `examples/reference_forward.rs` and `tests/allocations.rs` through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use ndarray::linalg::general_mat_mul;
use ndarray::{Array1, Array2, ArrayView2, Axis, Zip};
use tensorscope::prelude::*;

/// A batch size and width.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    pub(crate) name: &'static str,
    pub(crate) batch: usize,
    pub(crate) width: usize,
}

/// Matmul-bound: allocation barely matters.
pub(crate) const M: Shape = Shape {
    name: "M",
    batch: 256,
    width: 1024,
};
/// Memory-bound: 4 MiB activations, cheap matmuls.
pub(crate) const E: Shape = Shape {
    name: "E",
    batch: 16384,
    width: 64,
};
pub(crate) const BLOCKS: usize = 16;
pub(crate) const EPS: f32 = 1e-5;

pub(crate) fn shape_named(name: &str) -> Option<Shape> {
    match name {
        "M" | "m" => Some(M),
        "E" | "e" => Some(E),
        _ => None,
    }
}

/// One block's weights as ndarray arrays.
pub(crate) struct Weights {
    pub(crate) w1: Array2<f32>,
    pub(crate) b1: Array1<f32>,
    pub(crate) w2: Array2<f32>,
    pub(crate) b2: Array1<f32>,
}

/// `blocks` blocks' weights for `shape`, made in `pool` as parameters (no other copy: a process
/// measuring the pooled forward's peak RSS holds the weights once), from tensorscope's seeded
/// generator.
pub(crate) fn pooled_params(pool: &Pool, shape: Shape, blocks: usize) -> Vec<Pooled> {
    (0..blocks).map(|i| block_params(pool, shape, i)).collect()
}

/// Block `i`'s weights for `shape`, made in `pool`.
fn block_params(pool: &Pool, shape: Shape, i: usize) -> Pooled {
    let w = shape.width;
    let scale = 1.0 / (w as f32).sqrt();
    let seed = 4 * i as u64;
    pool.scope(|s| Pooled {
        w1: (s.randn::<f32>(&[w, w], seed) * scale).detach(),
        b1: (s.randn::<f32>(&[w], seed + 1) * 0.1).detach(),
        w2: (s.randn::<f32>(&[w, w], seed + 2) * scale).detach(),
        b2: (s.randn::<f32>(&[w], seed + 3) * 0.1).detach(),
    })
}

/// The input for `shape`, made in `pool` as a parameter.
pub(crate) fn pooled_input(pool: &Pool, shape: Shape) -> Param {
    pool.scope(|s| s.randn::<f32>(&[shape.batch, shape.width], 999).detach())
}

/// The same weights as [`pooled_params`] (all [`BLOCKS`]) as ndarray arrays, for (a) and (c). Each
/// block is made in a pool of its own that is dropped once the block is copied out, so at most one
/// block is ever held twice.
pub(crate) fn weights(shape: Shape) -> Vec<Weights> {
    let m = |p: &Param| p.to_array().into_dimensionality().expect("2-D");
    let v = |p: &Param| p.to_array().into_dimensionality().expect("1-D");
    (0..BLOCKS)
        .map(|i| {
            let b = block_params(&Pool::with_max_memory_mb(64), shape, i);
            Weights {
                w1: m(&b.w1),
                b1: v(&b.b1),
                w2: m(&b.w2),
                b2: v(&b.b2),
            }
        })
        .collect()
}

/// The same input as [`pooled_input`], as an ndarray array.
pub(crate) fn input(shape: Shape) -> Array2<f32> {
    pooled_input(&Pool::with_max_memory_mb(64), shape)
        .to_array()
        .into_dimensionality()
        .expect("2-D")
}

/// Bytes of the most tensors alive at once in one forward, derived from the shapes: a block's
/// input, its hidden activation and its second matmul's output.
pub(crate) fn liveness_bound_bytes(shape: Shape) -> usize {
    3 * shape.batch * shape.width * std::mem::size_of::<f32>()
}

#[inline]
fn gelu(x: f32) -> f32 {
    let c = (2.0f32 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
}

fn layer_norm_rows(mut a: ndarray::ArrayViewMut2<'_, f32>) {
    for mut row in a.axis_iter_mut(Axis(0)) {
        let n = row.len() as f32;
        let mean = row.sum() / n;
        let var = row.fold(0.0, |acc, &v| acc + (v - mean) * (v - mean)) / n;
        let inv = (var + EPS).sqrt().recip();
        row.mapv_inplace(|v| (v - mean) * inv);
    }
}

/// (a) A fresh array for every op's result.
pub(crate) fn plain(ws: &[Weights], x: &Array2<f32>) -> Array2<f32> {
    let mut x = x.clone();
    for w in ws {
        let h = (&x.dot(&w.w1) + &w.b1).mapv(gelu);
        let mut y = &(&h.dot(&w.w2) + &w.b2) + &x;
        layer_norm_rows(y.view_mut());
        x = y;
    }
    x
}

/// (b) The block's parameters, kept outside every scope (and shareable between threads).
pub(crate) struct Pooled {
    pub(crate) w1: Param,
    pub(crate) b1: Param,
    pub(crate) w2: Param,
    pub(crate) b2: Param,
}

#[dispose_scope]
pub(crate) fn pooled_block<'a>(x: &Tensor<'a>, p: &Pooled) -> Tensor<'a> {
    let h = (x.matmul(&p.w1) + &p.b1).gelu();
    (h.matmul(&p.w2) + &p.b2 + x).layer_norm(EPS)
}

pub(crate) fn pooled<'a>(blocks: &[Pooled], x: &Tensor<'a>) -> Tensor<'a> {
    let mut x = x.clone();
    for block in blocks {
        x = pooled_block(&x, block);
    }
    x
}

/// (c) Buffers allocated once.
pub(crate) struct Buffers {
    h: Array2<f32>,
    y: Array2<f32>,
    x: Array2<f32>,
}

impl Buffers {
    pub(crate) fn new(shape: Shape) -> Self {
        let z = || Array2::zeros((shape.batch, shape.width));
        Buffers {
            h: z(),
            y: z(),
            x: z(),
        }
    }
}

pub(crate) fn prealloc<'b>(
    ws: &[Weights],
    input: &Array2<f32>,
    buf: &'b mut Buffers,
) -> &'b Array2<f32> {
    for (i, w) in ws.iter().enumerate() {
        let x: ArrayView2<'_, f32> = if i == 0 { input.view() } else { buf.x.view() };
        general_mat_mul(1.0, &x, &w.w1, 0.0, &mut buf.h);
        Zip::from(buf.h.rows_mut()).for_each(|mut row| row += &w.b1);
        buf.h.mapv_inplace(gelu);
        general_mat_mul(1.0, &buf.h, &w.w2, 0.0, &mut buf.y);
        Zip::from(buf.y.rows_mut()).for_each(|mut row| row += &w.b2);
        buf.y += &x;
        layer_norm_rows(buf.y.view_mut());
        std::mem::swap(&mut buf.x, &mut buf.y);
    }
    &buf.x
}
