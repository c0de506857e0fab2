//! The accepted forms of what `tests/ui/fail/` refuses, and other programs the compile-time checks
//! must not reject: each file in `tests/ui/pass/` denies warnings itself (`#![deny(warnings)]`), and
//! each test runs the file's `main`. They are modules of this one test crate rather than trybuild
//! cases: trybuild checks the compile-fail cases together in one `cargo check`, which it does only
//! when no case has to be built and run.

#[path = "ui/pass/checkpoint_forms.rs"]
mod checkpoint_forms;
#[path = "ui/pass/derive_params_forms.rs"]
mod derive_params_forms;
#[path = "ui/pass/loss_summed_across_steps_done_right.rs"]
mod loss_summed_across_steps_done_right;
#[path = "ui/pass/methods_and_generics.rs"]
mod methods_and_generics;
#[path = "ui/pass/nested_and_early_returns.rs"]
mod nested_and_early_returns;
#[path = "ui/pass/readme_fixes.rs"]
mod readme_fixes;
#[path = "ui/pass/return_types.rs"]
mod return_types;
#[path = "ui/pass/routes_done_right.rs"]
mod routes_done_right;

#[test]
fn checkpoint_forms() {
    checkpoint_forms::main();
}

#[test]
fn derive_params_forms() {
    derive_params_forms::main();
}

#[test]
fn loss_summed_across_steps_done_right() {
    loss_summed_across_steps_done_right::main();
}

#[test]
fn methods_and_generics() {
    methods_and_generics::main();
}

#[test]
fn nested_and_early_returns() {
    nested_and_early_returns::main();
}

#[test]
fn readme_fixes() {
    readme_fixes::main();
}

#[test]
fn return_types() {
    return_types::main();
}

#[test]
fn routes_done_right() {
    routes_done_right::main();
}
