use tensorscope::prelude::*;

#[dispose_scope]
async fn forward<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x * 2.0
}

fn main() {}
