// A type error inside an annotated body is reported at the user's code, not at the macro.
use tensorscope::prelude::*;

#[dispose_scope]
fn forward<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    let scale: f32 = x.shape();
    x * scale
}

#[dispose_scope]
fn wrong_return<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x.len()
}

fn main() {}
