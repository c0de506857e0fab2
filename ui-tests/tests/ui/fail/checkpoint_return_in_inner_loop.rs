// A `return` inside an inner loop of a layer would end the step, not the function.
use tensorscope::prelude::*;

#[checkpoint(every = 2)]
fn forward<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        for _ in 0..2 {
            if x.to_vec()[0] > 2.0 {
                return x;
            }
            break; // an inner loop's own break is fine
        }
        x = x + 1.0;
    }
    x
}

fn main() {}
