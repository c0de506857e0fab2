use tensorscope::prelude::*;

#[dispose_scope(max_memory_mb = "lots", crate = tensorscope)]
fn forward<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x * 2.0
}

fn main() {}
