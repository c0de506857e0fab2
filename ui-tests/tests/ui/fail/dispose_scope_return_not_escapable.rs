use tensorscope::prelude::*;

struct Plain<'a> {
    y: Tensor<'a>,
}

#[dispose_scope]
fn forward<'a>(x: &Tensor<'a>) -> Plain<'a> {
    Plain { y: x * 2.0 }
}

fn main() {}
