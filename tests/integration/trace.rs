//! Memory traces: what a pool's trace records of a checkpointed training step (scopes, segments,
//! ops, the bytes after each event), and the Chrome trace JSON it writes, parsed back.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;
use tensorscope::prelude::*;
use tensorscope::{
    CheckpointConfig, Checkpointer, Policy, ScopeName, Trace, TraceEvent, TraceEventKind,
};

use crate::pre_norm_mlp;

/// The name `#[dispose_scope]` gives `pre_norm_mlp::Block::forward`'s scope: its module's path
/// and the function's name.
const BLOCK_FORWARD: &str = "integration::pre_norm_mlp::forward";

fn is_rent(e: &TraceEvent) -> bool {
    matches!(e.kind, TraceEventKind::Rent { .. })
}

fn named(e: &TraceEvent) -> Option<&'static str> {
    match e.scope {
        Some(ScopeName::Named(name)) => Some(name),
        _ => None,
    }
}

/// Checks that every thread's scope closes are the reverse of its opens, and returns how many
/// scopes opened.
fn assert_scopes_nest(trace: &Trace) -> usize {
    let mut open: HashMap<u64, Vec<ScopeName>> = HashMap::new();
    let mut opened = 0;
    for e in trace.events() {
        match e.kind {
            TraceEventKind::ScopeOpen => {
                open.entry(e.thread).or_default().push(e.scope.unwrap());
                opened += 1;
            }
            TraceEventKind::ScopeClose => {
                let top = open.get_mut(&e.thread).and_then(Vec::pop);
                assert_eq!(top, e.scope, "a close matches the innermost open scope");
            }
            _ => {}
        }
    }
    assert!(open.values().all(Vec::is_empty), "every scope closed");
    opened
}

/// One training step of a 4-block pre-norm MLP whose block loop is checkpointed every 2 blocks.
fn step(pool: &Pool, model: &pre_norm_mlp::Model, ckpt: &mut Checkpointer) -> f32 {
    pool.scope_named("step", |s| {
        let x = s.randn::<f32>(&[8, 16], 1);
        let target = s.randn::<f32>(&[8, 16], 2);
        s.train(|t| {
            let x = t.rebind(&x);
            let loss = model.forward(ckpt, x).mse(&target);
            let grads = loss.backward().expect("backward");
            assert!(!grads.is_empty());
            loss.to_vec()[0]
        })
    })
}

#[test]
fn a_checkpointed_training_step_is_traced_with_its_scopes_segments_and_ops() {
    let pool = Pool::with_max_memory_mb(64);
    let model = pre_norm_mlp::Model::new(&pool, 4, 16);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(2)));
    let first = step(&pool, &model, &mut ckpt); // fills the pool
    let before = pool.stats();
    pool.start_trace();
    let traced_line = line!() + 1;
    let second = pool.scope(|_| step(&pool, &model, &mut ckpt));
    let trace = pool.finish_trace();
    assert_eq!(first, second, "tracing changes nothing computed");
    let events = trace.events();
    let after = pool.stats();

    // Every rent and return, and only those, as the pool counted them.
    let rents = events.iter().filter(|e| is_rent(e)).count() as u64;
    let returns = events
        .iter()
        .filter(|e| matches!(e.kind, TraceEventKind::Return { .. }))
        .count() as u64;
    assert_eq!(
        rents,
        (after.hits + after.misses) - (before.hits + before.misses)
    );
    assert_eq!(returns, after.returns - before.returns);
    assert!(
        events
            .iter()
            .filter(|e| is_rent(e))
            .all(|e| matches!(e.kind, TraceEventKind::Rent { hit: true, .. })),
        "a steady-state step is served from the cache"
    );
    assert!(events.windows(2).all(|w| w[0].nanos <= w[1].nanos));
    let last = events.last().unwrap();
    assert_eq!(
        (last.bytes_in_use, last.bytes_cached),
        (after.bytes_in_use, after.bytes_cached),
        "the bytes after the last event are the pool's"
    );
    assert_eq!(trace.timeline()[0].bytes_in_use, before.bytes_in_use);

    // Scopes: the outer one named by where it was opened, the step's by its name, each block's by
    // its `#[dispose_scope]` function's path; nested on one thread.
    let opened = assert_scopes_nest(&trace);
    let opens: Vec<&TraceEvent> = events
        .iter()
        .filter(|e| e.kind == TraceEventKind::ScopeOpen)
        .collect();
    assert_eq!(opened, opens.len());
    match opens[0].scope {
        Some(ScopeName::At(at)) => {
            assert!(at.file().ends_with("trace.rs"), "{}", at.file());
            assert_eq!(at.line(), traced_line);
        }
        other => panic!("the outer scope is unnamed, got {other:?}"),
    }
    assert_eq!(named(opens[1]), Some("step"));
    let block_scopes = opens
        .iter()
        .filter(|e| named(e) == Some(BLOCK_FORWARD))
        .count();
    // Each block's forward, once: a backward replays a segment's recorded ops, not its closures.
    assert_eq!(block_scopes, 4);
    let thread = events[0].thread;
    assert!(events.iter().all(|e| e.thread == thread), "one thread");

    // Segments: under Every(2) the first two blocks run on a tape, replayed by the backward from
    // the stored input of block 0; the last segment records its graph (its backward comes first).
    let segments: BTreeSet<(usize, usize, bool)> = events
        .iter()
        .filter_map(|e| e.segment.map(|s| (s.start, s.layer, s.replayed)))
        .collect();
    assert_eq!(
        segments,
        BTreeSet::from([(0, 0, true), (0, 1, true), (0, 2, false), (0, 3, false)])
    );
    // The backward's replays of the taped blocks are tagged with their segment too.
    let replays: BTreeSet<(usize, usize, bool)> = events
        .iter()
        .filter(|e| e.backward && is_rent(e))
        .filter_map(|e| e.segment.map(|s| (s.start, s.layer, s.replayed)))
        .collect();
    assert_eq!(replays, BTreeSet::from([(0, 0, true), (0, 1, true)]));
    // Ops: the blocks' products rent in the blocks' scopes, within a segment, in the forward;
    // their backward rents the products' gradients.
    let block_matmuls = events
        .iter()
        .filter(|e| is_rent(e) && e.op == Some("matmul") && named(e) == Some(BLOCK_FORWARD))
        .filter(|e| !e.backward && e.segment.is_some())
        .count();
    assert_eq!(block_matmuls, 4 * 2, "two products per block");
    assert!(events
        .iter()
        .any(|e| is_rent(e) && e.backward && e.op == Some("matmul")));
    let ops: BTreeSet<&str> = events.iter().filter_map(|e| e.op).collect();
    for op in ["layer_norm", "gelu", "add", "mse"] {
        assert!(ops.contains(op), "{op} in {ops:?}");
    }
    // Outside every op: the inputs `randn` rents.
    let first_rent = events.iter().find(|e| is_rent(e)).unwrap();
    assert_eq!((named(first_rent), first_rent.op), (Some("step"), None));

    // The Chrome trace JSON, parsed back.
    let mut json = Vec::new();
    trace.write_chrome_json(&mut json).unwrap();
    let parsed: Value = serde_json::from_slice(&json).expect("valid JSON");
    let list = parsed["traceEvents"]
        .as_array()
        .expect("a traceEvents list");
    let pool_events = events.iter().filter(|e| e.is_pool_event()).count();
    // The process's and the thread's names, the first counter, the events, a counter per pool event.
    assert_eq!(list.len(), 2 + 1 + events.len() + pool_events);
    let ph = |v: &Value| v["ph"].as_str().unwrap().to_owned();
    assert_eq!(
        list[1]["args"]["name"].as_str(),
        std::thread::current().name()
    );
    let mut stack: Vec<String> = Vec::new();
    let mut last_ts = 0.0;
    let mut instants = 0;
    for v in list.iter().filter(|v| ph(v) != "M") {
        let ts = v["ts"].as_f64().expect("a time");
        assert!(ts >= last_ts, "times in order");
        last_ts = ts;
        let name = v["name"].as_str().unwrap().to_owned();
        match ph(v).as_str() {
            "B" => stack.push(name),
            "E" => assert_eq!(stack.pop(), Some(name), "E closes the last B"),
            "i" => {
                instants += 1;
                let args = &v["args"];
                assert_eq!(args["scope"].as_str(), stack.last().map(String::as_str));
                assert!(args["bytes"].as_u64().is_some() && args["class"].as_u64().is_some());
                assert!(args["op"].is_string() && args["in_use"].is_u64());
                assert_eq!(v["s"], "t");
                assert_eq!(v["tid"].as_u64(), Some(thread));
            }
            "C" => assert!(v["args"]["in use"].is_u64() && v["args"]["cached"].is_u64()),
            other => panic!("unexpected phase {other}"),
        }
    }
    assert!(stack.is_empty());
    assert_eq!(instants, pool_events);
    let matmul = list
        .iter()
        .find(|v| v["args"]["op"] == "matmul" && v["args"]["scope"] == BLOCK_FORWARD)
        .expect("a block's matmul rent");
    assert_eq!(matmul["name"], "rent (hit)");
    assert_eq!(matmul["args"]["bytes"], 8 * 32 * 4);
    assert_eq!(matmul["args"]["class"], 8 * 32 * 4);
    assert_eq!(matmul["args"]["segment"], 0);
    assert_eq!(matmul["args"]["layer"], 0);
    assert_eq!(matmul["args"]["pass"], "forward");
}

#[test]
fn threads_sharing_a_pool_get_tracks_of_their_own() {
    let pool = Pool::with_max_memory_mb(16);
    pool.start_trace();
    std::thread::scope(|threads| {
        for name in ["left", "right"] {
            let pool = &pool;
            std::thread::Builder::new()
                .name(name.to_owned())
                .spawn_scoped(threads, move || {
                    pool.scope_named(name, |s| {
                        for _ in 0..3 {
                            let x = s.ones::<f32>(&[64]);
                            assert_eq!(x.sum_all().item(), 64.0);
                        }
                    })
                })
                .unwrap();
        }
    });
    let trace = pool.finish_trace();
    assert_eq!(assert_scopes_nest(&trace), 2);
    let threads: BTreeSet<u64> = trace.events().iter().map(|e| e.thread).collect();
    assert_eq!(threads.len(), 2);
    for name in ["left", "right"] {
        let mine: Vec<&TraceEvent> = trace
            .events()
            .iter()
            .filter(|e| named(e) == Some(name))
            .collect();
        assert!(mine.iter().all(|e| e.thread == mine[0].thread));
        // The scope's edges, and per pass a rent and return of `x` and of its sum.
        assert_eq!(mine.len(), 2 + 3 * 4, "{name}: {mine:?}");
    }
    assert_eq!(trace.events().last().unwrap().bytes_in_use, 0);
    let mut json = Vec::new();
    trace.write_chrome_json(&mut json).unwrap();
    let parsed: Value = serde_json::from_slice(&json).unwrap();
    let names: BTreeSet<&str> = parsed["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] == "thread_name")
        .map(|v| v["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["left", "right"]));
}

#[test]
fn a_pool_not_tracing_records_nothing_and_a_failed_save_names_the_file() {
    let pool = Pool::with_max_memory_mb(16);
    let traced = Pool::with_max_memory_mb(16);
    traced.start_trace();
    pool.scope(|s| drop(s.ones::<f32>(&[16])));
    assert!(
        traced.finish_trace().events().is_empty(),
        "another pool's events"
    );
    assert!(pool.finish_trace().events().is_empty(), "never started");

    pool.start_trace();
    pool.scope(|s| drop(s.ones::<f32>(&[16])));
    let trace = pool.finish_trace();
    assert_eq!(trace.events().len(), 4, "open, rent, return, close");
    let path = std::env::temp_dir()
        .join("tensorscope no such folder")
        .join("trace.json");
    let err = trace.save(&path).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    let saved = std::env::temp_dir().join(format!("tensorscope-trace-{}.json", std::process::id()));
    trace.save(&saved).unwrap();
    let parsed: Value = serde_json::from_slice(&std::fs::read(&saved).unwrap()).unwrap();
    std::fs::remove_file(&saved).unwrap();
    assert_eq!(
        parsed["traceEvents"].as_array().unwrap().len(),
        2 + 1 + 4 + 2
    );
}

#[dispose_scope]
fn ones_in<'a>(s: &Scope<'a, '_>) -> Tensor<'a> {
    s.ones::<f32>(&[4])
}

#[dispose_scope]
fn a_sum() -> f32 {
    tensorscope::scope(|s| s.ones::<f32>(&[4]).sum_all().item())
}

struct Doubler;

impl Doubler {
    #[dispose_scope]
    fn double<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        x * 2.0
    }
}

#[test]
fn every_form_of_dispose_scope_names_its_scope_by_its_path() {
    let pool = Pool::with_max_memory_mb(16);
    pool.start_trace();
    pool.scope(|s| {
        let x = ones_in(s);
        let y = Doubler.double(&x);
        assert_eq!(y.to_vec(), vec![2.0; 4]);
        // No scope or tensor parameter: an outermost scope on the pool of the innermost one open.
        assert_eq!(a_sum(), 4.0);
    });
    let trace = pool.finish_trace();
    assert_scopes_nest(&trace);
    let opened: Vec<String> = trace
        .events()
        .iter()
        .filter(|e| e.kind == TraceEventKind::ScopeOpen)
        .map(|e| e.scope.unwrap().to_string())
        .collect();
    let here = format!("scope at {}:", file!());
    assert!(opened[0].starts_with(&here), "{opened:?}");
    // A method is named by its module and its name: an attribute on it does not see the type.
    assert_eq!(
        opened[1..4],
        [
            "integration::trace::ones_in",
            "integration::trace::double",
            "integration::trace::a_sum"
        ]
    );
    // The global pool's scope inside `a_sum` is not this pool's: not in its trace.
    assert_eq!(opened.len(), 4);
    let doubled = trace
        .events()
        .iter()
        .find(|e| is_rent(e) && e.op == Some("scalar"))
        .expect("the rent of `x * 2.0`, an op on a scalar");
    assert_eq!(
        doubled.scope,
        Some(ScopeName::Named("integration::trace::double"))
    );
}
