//! Compile-time checks: what must not compile (with the exact compiler messages, `tests/ui/fail`)
//! and the accepted forms, compiled under `#![deny(warnings)]` (`tests/ui/pass`).
//!
//! Snapshots are for the installed stable toolchain; regenerate with
//! `TRYBUILD=overwrite cargo test -p tensorscope-ui-tests` and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
