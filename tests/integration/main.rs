//! The integration tests of `tensorscope`, as one test binary: each module checks one behaviour of
//! the public API, named for it (`scopes`, `dispose_scope`, `checkpoint_training`, ...); `ops/` has a
//! module per op family; `common` holds the helpers more than one module uses, once.
//!
//! Run one module with `cargo test --test integration scopes::`, one test by its path
//! (`cargo test --test integration ops::linalg::matmul_2d`).
//!
//! Why one binary: every test crate instantiates the generic op code again and is linked on its own,
//! so one binary per file cost most of `cargo test`'s build time (16 of them on two cores: 88 s for
//! a fresh build against 63 s as one, and about 15 s against 5 s to run). Tests of one binary run
//! on threads of one process, so none may rely on being alone in it: a test that asserts pool
//! figures makes a pool of its own, and what one asserts of the global pool, which others rent from
//! at the same time, holds whatever they do.
//!
//! `tests/allocations.rs` stays a binary of its own: it installs a counting `#[global_allocator]`,
//! which would count the allocations of every test running beside it.

// The example models the tests train and compare, shared with `examples/` through `#[path]`.
#[path = "../../examples/common/denoiser.rs"]
mod denoiser;
#[path = "../../examples/common/gpt.rs"]
mod gpt;
#[path = "../../examples/common/llama.rs"]
mod llama;
#[path = "../../examples/common/pre_norm_mlp.rs"]
mod pre_norm_mlp;
#[path = "../../examples/common/swiglu.rs"]
mod swiglu;
#[path = "../../examples/common/transformer.rs"]
mod transformer;

mod common;

mod autograd;
mod checkpoint;
mod checkpoint_macro;
mod checkpoint_memory;
mod checkpoint_memory_changes;
mod checkpoint_saving;
mod checkpoint_skips;
mod checkpoint_training;
mod custom_op;
mod display;
mod dispose_scope;
mod gpt_parity;
mod hostile_review2;
mod hostile_skips;
mod kv_cache;
mod llama_parity;
mod nn;
mod ops;
mod optimizer_state;
mod reliability;
mod safetensors;
mod scopes;
mod tied_parameters;
mod trace;
mod training;
