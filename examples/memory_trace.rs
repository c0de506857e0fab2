//! A memory trace of three training steps of a checkpointed model: the 8-block pre-norm MLP of
//! `checkpointed_training` (batch 64, width 64), its block loop under `#[checkpoint]` with
//! `Policy::Sqrt`, trained with Adam. Writes the pool's trace as Chrome trace JSON and prints what
//! it holds: the events, the bytes rented per scope and per op.
//!
//! `cargo run --release --example memory_trace [-- PATH]` (default `target/memory.trace.json`);
//! `-- --off` runs the same steps without a trace, for counting what tracing costs. Open the file in <https://ui.perfetto.dev> (Open trace file) or `chrome://tracing`. Each step is
//! a slice named `training step`, each block's `#[dispose_scope]` forward a slice inside it named by
//! its path, and each rent, return and eviction an instant on the thread's track whose arguments
//! say its bytes, size class, scope, checkpoint segment, layer and op; the pool's bytes in use and
//! cached are the counter track `pool bytes`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tensorscope::nn::{Adam, Optimizer};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Policy, TraceEventKind};

#[path = "common/pre_norm_mlp.rs"]
mod pre_norm_mlp;

const BLOCKS: usize = 8;
const WIDTH: usize = 64;
const BATCH: usize = 64;
const STEPS: usize = 3;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = match args.as_slice() {
        [] => Some(PathBuf::from("target/memory.trace.json")),
        [off] if off == "--off" => None,
        [path] => Some(PathBuf::from(path)),
        _ => {
            eprintln!("usage: memory_trace [PATH | --off]");
            std::process::exit(2)
        }
    };
    let pool = Pool::with_max_memory_mb(256);
    let mut model: pre_norm_mlp::Model = pre_norm_mlp::Model::new(&pool, BLOCKS, WIDTH);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Sqrt));
    let mut adam = Adam::new(1e-3);

    if path.is_some() {
        pool.start_trace();
    }
    for step in 0..STEPS {
        let loss = pool.scope_named("training step", |s| {
            let x = s.randn::<f32>(&[BATCH, WIDTH], 7);
            let target = s.randn::<f32>(&[BATCH, WIDTH], 8);
            let mut grads = Gradients::new(s);
            let loss = s.train(|t| {
                let x = t.rebind(&x);
                let loss = model.forward(&mut ckpt, x).mse(&target);
                loss.backward_into(&mut grads).expect("backward");
                loss.item()
            });
            adam.step(&mut model, &grads).expect("adam step");
            loss
        });
        println!("step {step}: loss {loss:.5}");
    }
    let Some(path) = path else { return };
    let trace = pool.finish_trace();

    let mut by_scope: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut by_op: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let (mut hits, mut misses) = (0, 0);
    for e in trace.events() {
        if let TraceEventKind::Rent {
            class_bytes, hit, ..
        } = e.kind
        {
            let scope = e.scope.map_or_else(|| "none".to_owned(), |s| s.to_string());
            let entry = by_scope.entry(scope).or_default();
            *entry = (entry.0 + 1, entry.1 + class_bytes);
            let entry = by_op.entry(e.op.unwrap_or("none")).or_default();
            *entry = (entry.0 + 1, entry.1 + class_bytes);
            if hit {
                hits += 1;
            } else {
                misses += 1;
            }
        }
    }
    println!(
        "\n{} events over {STEPS} steps: {} rents ({hits} from the cache, {misses} fresh); peak {} B \
         in use",
        trace.events().len(),
        hits + misses,
        trace
            .events()
            .iter()
            .map(|e| e.bytes_in_use)
            .max()
            .unwrap_or(0)
    );
    println!("\n{:<48} {:>6} {:>12}", "scope", "rents", "bytes");
    for (scope, (rents, bytes)) in &by_scope {
        println!("{scope:<48} {rents:>6} {bytes:>12}");
    }
    println!("\n{:<48} {:>6} {:>12}", "op", "rents", "bytes");
    for (op, (rents, bytes)) in &by_op {
        println!("{op:<48} {rents:>6} {bytes:>12}");
    }
    if let Err(e) = trace.save(&path) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    println!(
        "\ntrace written to {}: open it in https://ui.perfetto.dev",
        path.display()
    );
}
