//! Peak memory and time of loading a safetensors file of f32 parameters
//! (`ParamStore::from_safetensors`, or with `--into` `load_safetensors` into a store of ones of
//! the same names and shapes): the parameters' pool buffers must be resident, and anything beyond
//! them is what the loader costs (a whole copy of the file if it reads it into memory; for a load
//! into existing parameters, their old values until every tensor is read).
//!
//! `cargo run --release --example load_weights [-- --mb 400] [--into]`
//!
//! Writes `--mb` MiB (400 unless given) of f32 parameters, tensors of 2^20 floats, to the temporary
//! directory unless the file is there already, then loads it in a child process of its own (this
//! program again, `--load PATH` or `--load-into PATH`), so that the peak resident set (`VmHWM`) is
//! the load's alone, and prints the file size, the bytes the pool holds, the child's resident set
//! before the load and its peak, and the load time. The file stays in the page cache from one run
//! to the next.

use std::path::Path;
use std::process::{exit, Command};
use std::time::Instant;

use tensorscope::nn::{LoadOptions, NnError, ParamStore, SafeTensorsFile, SaveOptions, Weights};
use tensorscope::Pool;

const USAGE: &str = "usage: load_weights [--mb MIB] [--into] | --load PATH | --load-into PATH";
const TENSOR_FLOATS: usize = 1 << 20;
const MIB: f64 = (1 << 20) as f64;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [] => measure(400, false),
        ["--into"] => measure(400, true),
        ["--mb", mb] => measure(mb.parse().unwrap_or_else(|_| fail(USAGE)), false),
        ["--mb", mb, "--into"] => measure(mb.parse().unwrap_or_else(|_| fail(USAGE)), true),
        ["--load", path] => load(Path::new(path), false),
        ["--load-into", path] => load(Path::new(path), true),
        _ => fail(USAGE),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("load_weights: {message}");
    exit(1)
}

/// Writes the file if needed, loads it in a child process and prints the child's figures.
fn measure(mib: usize, into: bool) {
    let tensors = (mib / 4).max(1);
    let path = std::env::temp_dir().join(format!("tensorscope_load_weights_{mib}mib.safetensors"));
    if !path.exists() {
        write(&path, tensors);
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| fail(&format!("no path to rerun: {e}")));
    let out = Command::new(exe)
        .arg(if into { "--load-into" } else { "--load" })
        .arg(&path)
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run the loading process: {e}")));
    if !out.status.success() {
        fail(&format!(
            "the loading process failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<f64> = line
        .split_whitespace()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| fail(&format!("unexpected output {line:?}")))
        })
        .collect();
    let [pool, before, peak, secs] = fields[..] else {
        fail(&format!("unexpected output {line:?}"))
    };
    let file = std::fs::metadata(&path).map_or(0, |m| m.len()) as f64;
    println!("{} ({tensors} tensors of 2^20 f32)\n", path.display());
    println!("| file size | pool holds | RSS before load | peak RSS (VmHWM) | load time |");
    println!("|----------:|-----------:|----------------:|-----------------:|----------:|");
    println!(
        "| {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.3} s |",
        file / MIB,
        pool / MIB,
        before / 1024.0,
        peak / 1024.0,
        secs
    );
}

/// Writes `tensors` parameters of 2^20 normal samples each to `path`.
fn write(path: &Path, tensors: usize) {
    let pool = Pool::with_max_memory_mb(tensors * 8 + 64);
    let mut store = ParamStore::<f32>::new(&pool);
    for i in 0..tensors {
        store
            .randn(
                &format!("layers.{i}.weight"),
                &[TENSOR_FLOATS],
                0.02,
                i as u64,
            )
            .unwrap_or_else(|e| fail(&format!("cannot make the parameters: {e}")));
    }
    store
        .save_safetensors(path, &SaveOptions::new())
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", path.display())));
}

/// The child: loads `path` (`into` a store of ones of its names and shapes, made first and so
/// resident, as a model initialised before a load is) and prints the pool's bytes in use, the
/// resident set before the load and its peak (KiB), and the seconds the load took.
fn load(path: &Path, into: bool) {
    let mib = std::fs::metadata(path)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())))
        .len() as usize
        >> 20;
    let pool = Pool::with_max_memory_mb(2 * mib + 64);
    let cannot_load = |e: NnError| -> ! { fail(&format!("cannot load {}: {e}", path.display())) };
    let mut existing = ParamStore::<f32>::new(&pool);
    if into {
        let file = SafeTensorsFile::open(path).unwrap_or_else(|e| cannot_load(e));
        for name in file.names() {
            let shape = file.shape(name).unwrap_or_else(|e| cannot_load(e));
            existing
                .ones(name, shape)
                .unwrap_or_else(|e| cannot_load(e));
        }
    }
    let before = status_kib("VmRSS:");
    let start = Instant::now();
    let store = match into {
        true => existing
            .load_safetensors(path, &LoadOptions::new())
            .map(|_| existing),
        false => ParamStore::<f32>::from_safetensors(&pool, path, &LoadOptions::new()),
    }
    .unwrap_or_else(|e| cannot_load(e));
    let secs = start.elapsed().as_secs_f64();
    let peak = status_kib("VmHWM:");
    let floats: usize = store.iter().map(|(_, p)| p.len()).sum();
    assert_eq!(floats, store.len() * TENSOR_FLOATS);
    println!("{} {before} {peak} {secs}", pool.stats().bytes_in_use);
}

/// A field of `/proc/self/status` in KiB (Linux only: elsewhere there is nothing to measure).
fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_else(|e| fail(&format!("cannot read /proc/self/status (Linux only): {e}")));
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| fail(&format!("no {key} in /proc/self/status")))
}
