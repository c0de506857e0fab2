use tensorscope::prelude::*;

// A value inside the sequence is not kept after it: only the last `let` (and the first, the
// input) can be read after.
#[checkpoint(every = 2)]
fn inner_read_after<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let h = x.relu();
    let d = h.exp();
    let m = d.clone().tanh();
    let u = &m + &d;
    u + &d
}

// `replay` runs one layer from its input alone, which a skip read cannot.
#[checkpoint(every = 2, replay = "one_layer")]
fn replay_with_a_skip<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let h = x.relu();
    let d = h.clone().exp();
    let u = &d + &h;
    u
}

// A skip value cannot leave the step that reads it.
#[checkpoint(every = 2)]
fn skip_kept_outside<'a>(x: Tensor<'a>, kept: &mut Vec<Tensor<'a>>) -> Tensor<'a> {
    let h = x.relu();
    let d = h.clone().exp();
    let u = {
        kept.push(h.clone());
        &d + &h
    };
    u
}

fn main() {
    tensorscope::scope(|s| {
        let _ = inner_read_after(s.ones::<f32>(&[1]));
        let _ = replay_with_a_skip(s.ones::<f32>(&[1]));
        let mut kept = Vec::new();
        let _ = skip_kept_outside(s.ones::<f32>(&[1]), &mut kept);
    });
}
