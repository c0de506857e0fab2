//! Serving a Llama-style model (`examples/common/llama.rs`) from a safetensors file of Hugging
//! Face's names: generation through per-layer key/value caches, with tokens per second, time to
//! first token and peak memory; a throughput table of prefill and decode at several batch sizes;
//! and several requests served at once from threads sharing one model, each under its own budget.
//!
//! ```text
//! cargo run --release --example llama
//! cargo run --release --example llama -- --weights /tmp/llama_bench/model.safetensors \
//!     --batch 1,8 --prompt 128 --new 64 --rounds 3 --streams 1,2,4
//! ```
//!
//! The weights default to `tests/fixtures/llama_tiny.safetensors` (`scripts/llama_fixture.py`,
//! which also stored transformers' greedy tokens there: they are checked first). A bigger model
//! comes from `scripts/llama_fixture.py --bench DIR` (its `config.json` is read from beside the
//! weights). `scripts/llama_serve_torch.py` and `peers/candle_llama` print the same table for
//! PyTorch and candle on the same weights. The threads are `TENSORSCOPE_THREADS` (default: the
//! machine's cores; `tensorscope::threads()`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tensorscope::nn::{generate, GenerateOptions, Generation, SafeTensorsFile, Sampling};
use tensorscope::prelude::*;

#[path = "common/llama.rs"]
mod llama;

use llama::Llama;

/// The command line.
struct Args {
    weights: PathBuf,
    prompt: usize,
    new: usize,
    batches: Vec<usize>,
    rounds: usize,
    streams: Vec<usize>,
    sampling: Sampling,
    budget_mb: usize,
}

fn args() -> Args {
    let mut a = Args {
        weights: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/llama_tiny.safetensors"),
        prompt: 32,
        new: 16,
        batches: vec![1, 8],
        rounds: 3,
        streams: vec![1, 2, 4],
        sampling: Sampling {
            temperature: 0.8,
            top_k: Some(40),
            top_p: Some(0.95),
            seed: 1,
        },
        budget_mb: 4096,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let fail = |message: String| -> ! {
        eprintln!("{message}");
        std::process::exit(2)
    };
    for pair in raw.chunks(2) {
        let (name, value) = (pair[0].as_str(), pair.get(1).map(String::as_str));
        let value = value.unwrap_or_else(|| fail(format!("{name} needs a value")));
        let number = |v: &str| -> usize {
            v.parse()
                .unwrap_or_else(|_| fail(format!("{name} needs whole numbers, got {v}")))
        };
        let real = || -> f32 {
            value
                .parse()
                .unwrap_or_else(|_| fail(format!("{name} needs a number, got {value}")))
        };
        let list = || value.split(',').map(number).collect::<Vec<_>>();
        match name {
            "--weights" => a.weights = PathBuf::from(value),
            "--prompt" => a.prompt = number(value),
            "--new" => a.new = number(value),
            "--batch" => a.batches = list(),
            "--rounds" => a.rounds = number(value).max(1),
            "--streams" => a.streams = list(),
            "--temperature" => a.sampling.temperature = real(),
            "--top-k" => a.sampling.top_k = Some(number(value)),
            "--top-p" => a.sampling.top_p = Some(real()),
            "--seed" => a.sampling.seed = number(value) as u64,
            "--budget-mb" => a.budget_mb = number(value),
            other => fail(format!(
                "unknown argument {other}; accepted: --weights --prompt --new --batch --rounds \
                 --streams --temperature --top-k --top-p --seed --budget-mb"
            )),
        }
    }
    if a.prompt == 0 || a.new == 0 {
        fail("--prompt and --new need at least 1 token".into())
    }
    a
}

/// The process's resident memory now and at its peak since the last [`reset_peak_rss`], in MiB
/// (Linux; zeros elsewhere).
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Starts the peak resident memory again from the current one (Linux's `clear_refs`), so that the
/// peak of serving is not the peak of loading.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

const MIB: f64 = (1 << 20) as f64;

fn main() {
    let a = args();
    let pool = Pool::with_max_memory_mb(a.budget_mb);
    let started = Instant::now();
    let (model, file) = Llama::open(&pool, &a.weights).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let weights = pool.stats().bytes_in_use;
    let c = model.config;
    println!(
        "{}: {} layers, hidden {}, {} heads on {} key/value heads, vocab {}; {:.1} MiB of weights, \
         loaded in {:.2} s",
        a.weights.display(),
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.vocab_size,
        weights as f64 / MIB,
        started.elapsed().as_secs_f64()
    );
    check_against_pytorch(&pool, &model, &file, &a);
    drop(file);
    let (_, loading) = rss_mib();
    println!(
        "resident memory at its peak while loading: {loading:.1} MiB (the file is read whole, then \
         copied into the pool)"
    );
    reset_peak_rss();
    throughput(&pool, &model, &a, weights);
    let model = Arc::new(model);
    streams(&pool, &model, &a);
}

/// On the fixture (a file holding `ref.prompt.*`): transformers' greedy tokens, then a sampled
/// generation of the same prompts.
fn check_against_pytorch(pool: &Pool, model: &Llama, file: &SafeTensorsFile, a: &Args) {
    if !file.contains("ref.prompt.0") {
        return;
    }
    let ids = |name: String| file.param::<i64>(pool, &name).map(|p| p.to_vec());
    let prompts: Vec<Vec<i64>> = (0..3)
        .map_while(|i| ids(format!("ref.prompt.{i}")).ok())
        .collect();
    let want: Vec<Vec<i64>> = (0..3)
        .map_while(|i| ids(format!("ref.generated.{i}")).ok())
        .collect();
    if want.len() != prompts.len() {
        return;
    }
    let batch: Vec<&[i64]> = prompts.iter().map(Vec::as_slice).collect();
    let greedy = pool
        .scope(|s| generate(model, s, &batch, &GenerateOptions::greedy(want[0].len())))
        .expect("generation");
    println!(
        "\ngreedy, the fixture's 3 prompts of {:?} tokens as one batch: tokens equal to \
         transformers': {}",
        prompts.iter().map(Vec::len).collect::<Vec<_>>(),
        greedy.tokens == want
    );
    let options = GenerateOptions {
        max_new_tokens: want[0].len(),
        sampling: a.sampling,
        stop_tokens: Vec::new(),
    };
    let sampled = pool
        .scope(|s| generate(model, s, &batch, &options))
        .expect("generation");
    let s = a.sampling;
    println!(
        "sampled (temperature {}, top-k {:?}, top-p {:?}, seed {}):",
        s.temperature, s.top_k, s.top_p, s.seed
    );
    for (prompt, tokens) in prompts.iter().zip(&sampled.tokens) {
        println!("  {prompt:?} -> {tokens:?}");
    }
}

/// A prompt of `len` ids below `vocab`, the same for every run (a fixed linear congruence).
fn prompt(len: usize, vocab: usize) -> Vec<i64> {
    let mut x: u64 = 12345;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as i64
        })
        .collect()
}

/// The median of `xs`.
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Prefill and decode tokens per second and time to first token for each batch size: every
/// sequence of a batch has the same prompt, and greedy decoding runs the full `--new` tokens.
fn throughput(pool: &Pool, model: &Llama, a: &Args, weights: usize) {
    let p = prompt(a.prompt, model.config.vocab_size);
    println!(
        "\nthroughput: prompt {} tokens, {} new tokens, greedy, median of {} rounds, {} threads",
        a.prompt,
        a.new,
        a.rounds,
        tensorscope::threads()
    );
    println!(
        "| batch | prefill tok/s | decode tok/s | first token ms | pool peak MiB | bound MiB |"
    );
    println!("|---|---|---|---|---|---|");
    for &batch in &a.batches {
        let prompts = vec![p.as_slice(); batch];
        let options = GenerateOptions::greedy(a.new);
        pool.reset_peak();
        let runs: Vec<Generation> = (0..a.rounds)
            .map(|_| {
                pool.scope(|s| generate(model, s, &prompts, &options))
                    .unwrap_or_else(|e| panic!("batch {batch}: {e}"))
            })
            .collect();
        let per_second = |tokens: usize, time: Duration| tokens as f64 / time.as_secs_f64();
        let prefill = median(
            runs.iter()
                .map(|g| per_second(batch * a.prompt, g.prefill))
                .collect(),
        );
        let decode = median(
            runs.iter()
                .map(|g| per_second(batch * g.steps, g.decode))
                .collect(),
        );
        let first = median(runs.iter().map(|g| g.prefill.as_secs_f64() * 1e3).collect());
        let g = &runs[0];
        // The liveness bound: the weights, the caches and the largest forward's temporaries.
        let bound = weights + g.cache_bytes + g.step_peak_bytes;
        println!(
            "| {batch} | {prefill:.1} | {decode:.1} | {first:.1} | {:.1} | {:.1} |",
            pool.stats().peak_bytes_in_use as f64 / MIB,
            bound as f64 / MIB
        );
    }
    let (rss, peak) = rss_mib();
    println!(
        "resident memory: {rss:.1} MiB now, {peak:.1} MiB at the peak since the model was loaded"
    );
}

/// `n` requests at once, each on a thread of its own with its own scope and budget, sharing the
/// model (an `Arc`) and the pool; then one request whose budget cannot hold its cache, beside
/// others that go on.
fn streams(pool: &Pool, model: &Arc<Llama>, a: &Args) {
    let p = prompt(a.prompt, model.config.vocab_size);
    println!(
        "\nconcurrent streams: batch 1 each, prompt {} tokens, {} new tokens, own scope and \
         budget each",
        a.prompt, a.new
    );
    println!("| streams | tokens/s, all streams (prefill included) | per stream | wall s |");
    println!("|---|---|---|---|");
    let budget = a.budget_mb << 20;
    for &n in a.streams.iter().filter(|&&n| n > 0) {
        let started = Instant::now();
        let results = serve(pool, model, &p, a.new, &vec![budget / n.max(1); n]);
        let wall = started.elapsed().as_secs_f64();
        let tokens: usize = results
            .iter()
            .map(|r| r.as_ref().map_or(0, |g| g.tokens[0].len()))
            .sum();
        println!(
            "| {n} | {:.1} | {:.1} | {wall:.2} |",
            tokens as f64 / wall,
            tokens as f64 / wall / n as f64
        );
    }
    println!("\nthree requests at once, the middle one with a budget of 4 KiB, too small for its caches:");
    let results = serve(pool, model, &p, a.new, &[budget / 4, 4096, budget / 4]);
    for (i, r) in results.iter().enumerate() {
        match r {
            Ok(g) => println!("request {i}: {} tokens", g.tokens[0].len()),
            Err(e) => println!("request {i} failed alone: {e}"),
        }
    }
}

/// One greedy request per budget, each on its own thread; their results in order.
fn serve(
    pool: &Pool,
    model: &Arc<Llama>,
    prompt: &[i64],
    new: usize,
    budgets: &[usize],
) -> Vec<tensorscope::Result<Generation>> {
    std::thread::scope(|threads| {
        let handles: Vec<_> = budgets
            .iter()
            .map(|&budget| {
                let model = Arc::clone(model);
                threads.spawn(move || {
                    pool.scope_with_budget(budget, |s| {
                        generate(&*model, s, &[prompt], &GenerateOptions::greedy(new))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a request thread panicked"))
            .collect()
    })
}
