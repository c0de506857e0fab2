//! Attribute macros of tensorscope. Use them through the `tensorscope` crate, which re-exports them.
//!
//! This crate is a placeholder until `#[dispose_scope]` and `#[checkpoint]` land; it exports nothing yet.
