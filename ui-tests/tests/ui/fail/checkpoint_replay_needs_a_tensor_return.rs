use tensorscope::prelude::*;

#[checkpoint(every = 2, replay = "step")]
fn total<'a>(x: Tensor<'a>) -> f32 {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x.sum(0).to_vec()[0]
}

#[checkpoint(every = 2, replay = "not a name")]
fn spaced<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

fn main() {}
