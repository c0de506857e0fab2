// A `#[dispose_scope]` result goes to one scope: a return type with two brands is refused.
use tensorscope::prelude::*;

#[dispose_scope]
fn both<'a, 'b>(x: &Tensor<'a>, y: &Tensor<'b>) -> (Tensor<'a>, Tensor<'b>) {
    (x * 2.0, y * 2.0)
}

fn main() {}
