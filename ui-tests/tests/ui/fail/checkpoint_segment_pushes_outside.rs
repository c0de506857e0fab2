// A `#[checkpoint]` segment runs in its own scope: its activations cannot be kept outside it.
use tensorscope::prelude::*;

#[checkpoint(every = 2)]
fn forward<'a>(x: Tensor<'a>, history: &mut Vec<Tensor<'a>>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.tanh();
        history.push(x.clone());
    }
    x
}

fn main() {}
