use tensorscope::prelude::*;

#[dispose_scope(max_memory_mb = 0)]
fn forward<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x * 2.0
}

fn main() {}
