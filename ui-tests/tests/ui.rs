//! Compile-time checks: programs that must not compile, with the exact compiler messages
//! (`tests/ui/fail`). Their accepted forms compile and run in `tests/pass.rs`.
//!
//! Snapshots are for the installed stable toolchain; regenerate with
//! `TRYBUILD=overwrite cargo test -p tensorscope-ui-tests` and review the diff.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*.rs");
}
