// Without a policy the checkpointer's own configuration applies, precision and limit included: an
// attribute precision or limit alone would be ignored, so it is refused.
use tensorscope::prelude::*;
use tensorscope::Checkpointer;

#[checkpoint(precision = "f16", max = 4)]
fn forward<'a>(ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

fn main() {}
