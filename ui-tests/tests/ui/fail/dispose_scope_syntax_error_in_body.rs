// A syntax error in an annotated body is reported as such, not as "applies to a function".
use tensorscope::prelude::*;

#[dispose_scope]
fn forward<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    let y = ;
    x * 2.0
}

fn main() {}
