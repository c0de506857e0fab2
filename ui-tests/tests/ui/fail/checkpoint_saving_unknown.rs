// `saving` takes "products" or "nothing"; other ops are named through the config, where a list
// of names is a list, not a string to misspell.
use tensorscope::prelude::*;

#[checkpoint(every = 2, saving = "dots")]
fn forward<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

fn main() {}
