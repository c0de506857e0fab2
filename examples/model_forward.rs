//! A transformer-style model whose every sub-module forward is `#[dispose_scope]`: attention with
//! softmax, an MLP, LayerNorm and residual connections, run over a loop of batches. Shows that every
//! batch after the first is served from the pool (no misses) and the peak bytes each call holds.
//!
//! `cargo run --release --example model_forward`

use tensorscope::prelude::*;

const DIM: usize = 128;
const SEQ: usize = 64;
const BATCH: usize = 8;
const BLOCKS: usize = 4;

fn weight(s: &Scope<'_, '_>, rows: usize, cols: usize, seed: u64) -> Param {
    (s.randn::<f32>(&[rows, cols], seed) * (1.0 / (rows as f32).sqrt())).detach()
}

/// Single-head self-attention over `[batch, seq, dim]`.
struct Attention {
    wq: Param,
    wk: Param,
    wv: Param,
    wo: Param,
}

impl Attention {
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let q = x.matmul(&self.wq);
        let k = x.matmul(&self.wk);
        let v = x.matmul(&self.wv);
        let scores = q.matmul(&k.transpose()) * (1.0 / (DIM as f32).sqrt()); // [batch, seq, seq]
        let weights = scores.softmax(2);
        weights.matmul(&v).matmul(&self.wo)
    }
}

/// `gelu(x W1 + b1) W2 + b2`, hidden width 4x.
struct Mlp {
    w1: Param,
    b1: Param,
    w2: Param,
    b2: Param,
}

impl Mlp {
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = (x.matmul(&self.w1) + &self.b1).gelu();
        h.matmul(&self.w2) + &self.b2
    }
}

/// Pre-norm block: `h = x + attn(ln(x)); y = h + mlp(ln(h))`.
struct Block {
    attention: Attention,
    mlp: Mlp,
}

impl Block {
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x + &self.attention.forward(&x.layer_norm(1e-5));
        let out = self.mlp.forward(&(&h).layer_norm(1e-5)); // `&h`: keep `h` for the residual
        h + &out
    }
}

struct Model {
    blocks: Vec<Block>,
}

impl Model {
    fn new(pool: &Pool) -> Self {
        pool.scope(|s| Model {
            blocks: (0..BLOCKS as u64)
                .map(|i| Block {
                    attention: Attention {
                        wq: weight(s, DIM, DIM, 10 * i),
                        wk: weight(s, DIM, DIM, 10 * i + 1),
                        wv: weight(s, DIM, DIM, 10 * i + 2),
                        wo: weight(s, DIM, DIM, 10 * i + 3),
                    },
                    mlp: Mlp {
                        w1: weight(s, DIM, 4 * DIM, 10 * i + 4),
                        b1: Param::zeros(pool, &[4 * DIM]),
                        w2: weight(s, 4 * DIM, DIM, 10 * i + 5),
                        b2: Param::zeros(pool, &[DIM]),
                    },
                })
                .collect(),
        })
    }

    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let mut x = x.clone();
        for block in &self.blocks {
            x = block.forward(&x);
        }
        x
    }
}

fn main() {
    let pool = Pool::with_max_memory_mb(512);
    let model = Model::new(&pool);
    let weights = pool.stats().bytes_in_use;
    let activation = BATCH * SEQ * DIM * 4;
    println!(
        "{BLOCKS} blocks, dim {DIM}, sequence {SEQ}, batch {BATCH}: weights {weights} B, one activation \
         {activation} B\n"
    );
    println!(
        "{:>5} {:>7} {:>7} {:>14} {:>10}",
        "batch", "hits", "misses", "peak B / call", "mean |y|"
    );
    let (mut misses_after_first, mut rented_per_call) = (0, 0);
    for batch in 0..8u64 {
        pool.reset_peak();
        let before = pool.stats();
        let mean = pool.scope(|s| {
            let x = s.randn::<f32>(&[BATCH, SEQ, DIM], 100 + batch);
            let y = model.forward(&x);
            y.as_slice().iter().map(|v| v.abs()).sum::<f32>() / y.len() as f32
        });
        let after = pool.stats();
        println!(
            "{batch:>5} {:>7} {:>7} {:>14} {:>10.4}",
            after.hits - before.hits,
            after.misses - before.misses,
            after.peak_bytes_in_use - before.bytes_in_use,
            mean
        );
        if batch == 0 {
            misses_after_first = after.misses;
        }
        rented_per_call = after.rented_bytes - before.rented_bytes;
        assert!(mean.is_finite());
    }
    let end = pool.stats();
    assert_eq!(
        end.misses, misses_after_first,
        "no allocation after the first batch"
    );
    assert_eq!(
        end.bytes_in_use, weights,
        "between batches only the weights are in use"
    );
    println!(
        "\nAfter the first batch every rent is a hit; between batches only the weights are in use \
         ({} B). Peak bytes per call are what one forward holds at its busiest: a few activations and \
         one [batch, seq, seq] attention matrix, not the {} B all its temporaries add up to.",
        end.bytes_in_use,
        rented_per_call
    );
}
