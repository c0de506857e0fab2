use tensorscope::prelude::*;

#[checkpoint(every = 2)]
fn no_loop<'a>(x: Tensor<'a>) -> Tensor<'a> {
    x.relu().exp()
}

#[checkpoint(every = 2)]
fn early_exit<'a>(x: Tensor<'a>, limit: f32) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..8 {
        if x.to_vec()[0] > limit {
            break;
        }
        x = x * 2.0;
    }
    x
}

fn main() {
    tensorscope::scope(|s| {
        let _ = no_loop(s.ones::<f32>(&[1]));
        let _ = early_exit(s.ones::<f32>(&[1]), 4.0);
    });
}
