// A mistake in a derived struct is one error: the fallback impl keeps its uses from adding more.
use tensorscope::prelude::*;

#[derive(Escape)]
struct Pair<'a, 'b> {
    left: Tensor<'a>,
    right: Tensor<'b>,
}

#[dispose_scope]
fn pair<'a>(x: &Tensor<'a>) -> Pair<'a, 'a> {
    Pair { left: x * 2.0, right: x * 3.0 }
}

fn main() {}
