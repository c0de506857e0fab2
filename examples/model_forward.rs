//! A transformer-style model whose every sub-module forward is `#[dispose_scope]`: attention with
//! softmax, an MLP, LayerNorm and residual connections, run over a loop of batches. Shows that every
//! batch after the first is served from the pool (no misses) and the peak bytes each call holds.
//!
//! `cargo run --release --example model_forward`

use tensorscope::prelude::*;

#[path = "common/transformer.rs"]
mod transformer;

use transformer::Transformer;

const DIM: usize = 128;
const SEQ: usize = 64;
const BATCH: usize = 8;
const BLOCKS: usize = 4;

fn main() {
    let pool = Pool::with_max_memory_mb(512);
    let model = Transformer::new(&pool, BLOCKS, DIM);
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
            y.view().iter().map(|v| v.abs()).sum::<f32>() / y.len() as f32
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
