//! candle-transformers' Llama served on the CPU: the peer of tensorscope's Llama on the same
//! Hugging Face weights.
//!
//! # What it measures
//!
//! The weights directory (`--weights DIR`, default `/tmp/llama_bench`) holds a Hugging Face
//! `config.json` and a single `model.safetensors` in `f32` with Hugging Face's tensor names (what
//! `scripts/llama_fixture.py --bench` writes). They are memory-mapped through candle's
//! `VarBuilder::from_mmaped_safetensors` and loaded into
//! [`candle_transformers::models::llama::Llama`] on `Device::Cpu` in `f32` (loading copies each
//! tensor out of the map into memory of candle's own; the map is dropped once the model is built).
//!
//! For each batch size of `--batch` (default `1,8`) and each of `--rounds` rounds (default 3):
//!
//! * a fresh `Cache` (`use_kv_cache = true`);
//! * **prefill**: one `forward` over a `[batch, prompt]` tensor of `--prompt` token ids (default
//!   128; drawn once from a fixed seed, below the vocabulary size, the same prompt in every row),
//!   which fills the cache, then the greedy argmax of the logits it returns;
//! * **decode**: `--new` steps (default 64), each a `forward` of one token per sequence (the
//!   previous argmax) at the next position, then its argmax.
//!
//! Reported, as the median over the rounds: prefill tokens/s (`batch * prompt / prefill time`,
//! the forward and its argmax), decode tokens/s (`batch * new / decode time`) and the time to
//! first token (ms: from creating the cache and the prompt tensor to the first token's ids, so
//! the prefill and a little more). Then the peak resident set (`VmHWM` of `/proc/self/status`, in
//! MiB, over the whole run, the load included) and the thread count. The output is a markdown
//! table.
//!
//! Every row of a batch has the same prompt, so greedy decoding must give every row the same
//! tokens, and the same tokens at every batch size: the program checks both and says so, which
//! is the check that candle's `forward` and `Cache` serve a batch greater than 1.
//!
//! # candle's API, as used here
//!
//! `Llama::forward(&ids, index_pos, &mut cache)` takes `[batch, seq]` `u32` ids and returns the
//! logits of the **last position only**, `[batch, vocab]` in `f32`: enough for greedy serving.
//! The `Cache` grows each layer's keys and values by `Tensor::cat` along the sequence on every
//! step (a copy of the whole cache per token), and it holds one position for every row of the
//! batch: the rows of a batch share `index_pos`, so sequences of different lengths cannot be
//! batched without padding of the caller's own.
//!
//! # Threads
//!
//! `--threads N` (default 2). candle 0.11's CPU backend has three sources of threads, and all
//! three are set to `N` at the start of `main`, before any candle call:
//!
//! * its matrix products call the `gemm` crate with `Parallelism::Rayon(n)`, `n` read from the
//!   environment variable `RAYON_NUM_THREADS` (`candle_core::utils::get_num_threads`; without it,
//!   the physical cores) and `Parallelism::None` when `n` is 1; gemm's tasks run on the current
//!   rayon pool, here rayon's global pool, which this program builds with `N` threads;
//! * its large element-wise maps run on a "barrier pool" of its own, of `CANDLE_NUM_THREADS`
//!   (else `RAYON_NUM_THREADS`) threads, counting the caller;
//! * candle-nn's softmax and RMS norm iterate in parallel on the current (global) rayon pool.
//!
//! So the program sets `RAYON_NUM_THREADS=N` and `CANDLE_NUM_THREADS=N` in its own environment
//! and builds the global rayon pool with `N` threads. `--candle-pool` instead runs the benchmark
//! inside `Device::Cpu.with_context`, which installs candle's private rayon pool (also of
//! `RAYON_NUM_THREADS` threads) in place of the global one.
//!
//! # How to run it
//!
//! From this directory, default compiler flags (no `-C target-cpu=native`: like the other peers,
//! `peers/`, and tensorscope itself, which have no `.cargo/config.toml` or `RUSTFLAGS`):
//!
//! ```sh
//! cargo run --release -- --weights /tmp/llama_bench              # batch 1 and 8, 2 threads
//! cargo run --release -- --threads 1 --batch 1,8 --prompt 128 --new 64 --rounds 3
//! ```

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Config, Llama, LlamaConfig};

/// The command line, with its defaults.
struct Args {
    weights: String,
    batches: Vec<usize>,
    prompt: usize,
    new: usize,
    rounds: usize,
    threads: usize,
    candle_pool: bool,
}

const USAGE: &str = "usage: candle_llama [--weights DIR] [--batch 1,8] [--prompt 128] [--new 64] \
                     [--rounds 3] [--threads 2] [--candle-pool]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        weights: "/tmp/llama_bench".into(),
        batches: vec![1, 8],
        prompt: 128,
        new: 64,
        rounds: 3,
        threads: 2,
        candle_pool: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--candle-pool" {
            args.candle_pool = true;
            continue;
        }
        if flag == "-h" || flag == "--help" {
            return Err(USAGE.into());
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{flag}: expected a positive integer, got {v:?}"))
        };
        match flag.as_str() {
            "--weights" => args.weights = value,
            "--batch" => {
                args.batches = value.split(',').map(number).collect::<Result<_, _>>()?;
            }
            "--prompt" => args.prompt = number(&value)?,
            "--new" => args.new = number(&value)?,
            "--rounds" => args.rounds = number(&value)?,
            "--threads" => args.threads = number(&value)?,
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

/// Reads a `config.json` into candle's `Config`. transformers 5 writes `rope_theta` under
/// `rope_parameters`, where candle's `LlamaConfig` does not look (it would silently take its
/// default of 10000): it is copied up to the top level first.
fn read_config(dir: &str) -> Result<Config, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(format!("{dir}/config.json"))?;
    let mut json: serde_json::Value = serde_json::from_str(&text)?;
    if json.get("rope_theta").is_none() {
        if let Some(theta) = json.pointer("/rope_parameters/rope_theta").cloned() {
            json["rope_theta"] = theta;
        }
    }
    let config: LlamaConfig = serde_json::from_value(json)?;
    Ok(config.into_config(false))
}

/// `count` token ids below `vocab` from a fixed seed (splitmix64).
fn prompt_ids(count: usize, vocab: usize) -> Vec<u32> {
    let mut state: u64 = 0x5eed_1234_abcd_0001;
    (0..count)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z % vocab as u64) as u32
        })
        .collect()
}

/// One round at one batch size: its timings and the tokens of row 0.
struct Round {
    prefill: Duration,
    first_token: Duration,
    decode: Duration,
    tokens: Vec<u32>,
    rows_agree: bool,
}

fn round(
    model: &Llama,
    config: &Config,
    device: &Device,
    prompt: &[u32],
    batch: usize,
    new: usize,
) -> candle_core::Result<Round> {
    let start = Instant::now();
    let mut cache = Cache::new(true, DType::F32, config, device)?;
    let ids = Tensor::new(prompt, device)?
        .unsqueeze(0)?
        .repeat((batch, 1))?
        .contiguous()?;
    let prefill_start = Instant::now();
    let logits = model.forward(&ids, 0, &mut cache)?; // [batch, vocab]: the last position's
    let mut next: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
    let prefill = prefill_start.elapsed();
    let first_token = start.elapsed();

    let mut rows_agree = next.iter().all(|&t| t == next[0]);
    let mut tokens = vec![next[0]];
    let decode_start = Instant::now();
    for step in 0..new {
        let ids = Tensor::new(next.as_slice(), device)?.reshape((batch, 1))?;
        let logits = model.forward(&ids, prompt.len() + step, &mut cache)?;
        next = logits.argmax(D::Minus1)?.to_vec1()?;
        rows_agree &= next.iter().all(|&t| t == next[0]);
        tokens.push(next[0]);
    }
    let decode = decode_start.elapsed();
    Ok(Round {
        prefill,
        first_token,
        decode,
        tokens,
        rows_agree,
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// `VmHWM` (the peak resident set) of `/proc/self/status`, in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The results of one batch size.
struct Row {
    batch: usize,
    prefill_tps: f64,
    decode_tps: f64,
    first_token_ms: f64,
}

fn bench(
    args: &Args,
    model: &Llama,
    config: &Config,
    device: &Device,
) -> candle_core::Result<(Vec<Row>, Vec<String>)> {
    let prompt = prompt_ids(args.prompt, config.vocab_size);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut reference: Option<Vec<u32>> = None;
    for &batch in &args.batches {
        let mut prefill = Vec::new();
        let mut decode = Vec::new();
        let mut first = Vec::new();
        for r in 0..args.rounds {
            let out = round(model, config, device, &prompt, batch, args.new)?;
            eprintln!(
                "batch {batch} round {r}: prefill {:.1} ms, decode {:.1} ms, first token {:.1} ms",
                out.prefill.as_secs_f64() * 1e3,
                out.decode.as_secs_f64() * 1e3,
                out.first_token.as_secs_f64() * 1e3,
            );
            prefill.push((batch * args.prompt) as f64 / out.prefill.as_secs_f64());
            decode.push((batch * args.new) as f64 / out.decode.as_secs_f64());
            first.push(out.first_token.as_secs_f64() * 1e3);
            if !out.rows_agree {
                notes.push(format!("batch {batch} round {r}: the rows' greedy tokens differ"));
            }
            match &reference {
                None => reference = Some(out.tokens),
                Some(tokens) if *tokens != out.tokens => notes.push(format!(
                    "batch {batch} round {r}: greedy tokens differ from batch {}'s first round",
                    args.batches[0]
                )),
                Some(_) => {}
            }
        }
        rows.push(Row {
            batch,
            prefill_tps: median(prefill),
            decode_tps: median(decode),
            first_token_ms: median(first),
        });
    }
    if notes.is_empty() {
        notes.push(format!(
            "greedy tokens: the same in every row, round and batch size ({} tokens per sequence)",
            args.new + 1
        ));
    }
    Ok((rows, notes))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    // Before any candle call and any other thread: candle reads these once, lazily.
    let n = args.threads.to_string();
    std::env::set_var("RAYON_NUM_THREADS", &n);
    std::env::set_var("CANDLE_NUM_THREADS", &n);
    rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads)
        .build_global()?;

    let device = Device::Cpu;
    let config = read_config(&args.weights)?;
    let load_start = Instant::now();
    let model = {
        let path = format!("{}/model.safetensors", args.weights);
        // SAFETY: the file is not modified while it is mapped (the map lives only in this block).
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[path], DType::F32, &device)? };
        Llama::load(vb, &config)?
    };
    let load = load_start.elapsed();
    let rss_after_load = peak_rss_mib();

    let (rows, notes) = if args.candle_pool {
        device.with_context(|| bench(&args, &model, &config, &device))?
    } else {
        bench(&args, &model, &config, &device)?
    };

    println!(
        "candle-transformers 0.11 Llama, f32, CPU: {} (vocab {}, hidden {}, {} layers, {} heads, \
         {} kv heads, intermediate {}), prompt {}, new {}, median of {} rounds, load {:.2} s",
        args.weights,
        config.vocab_size,
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
        args.prompt,
        args.new,
        args.rounds,
        load.as_secs_f64(),
    );
    println!();
    println!("| batch | prefill tok/s | decode tok/s | first token ms |");
    println!("|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} |",
            row.batch, row.prefill_tps, row.decode_tps, row.first_token_ms
        );
    }
    println!();
    let mib = |x: Option<f64>| x.map_or("unknown".into(), |m| format!("{m:.0} MiB"));
    println!(
        "peak RSS (VmHWM): {} (after load: {})",
        mib(peak_rss_mib()),
        mib(rss_after_load)
    );
    println!(
        "threads: {} (RAYON_NUM_THREADS = CANDLE_NUM_THREADS = {}; gemm on {} rayon pool)",
        args.threads,
        args.threads,
        if args.candle_pool {
            "candle's private"
        } else {
            "the global"
        },
    );
    for note in notes {
        println!("{note}");
    }
    Ok(())
}
