// Nested annotated functions, `return`, `?` and early returns from loops.
#![deny(warnings)]

use tensorscope::prelude::*;

#[dispose_scope]
fn layer<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    (x * 2.0).gelu()
}

#[dispose_scope]
fn stack<'a>(x: &Tensor<'a>, depth: usize) -> Tensor<'a> {
    let mut h = layer(x);
    for _ in 1..depth {
        h = layer(&h);
    }
    h
}

#[dispose_scope]
fn first_positive<'a>(
    x: &Tensor<'a>,
    tries: usize,
) -> Result<Option<Tensor<'a>>, tensorscope::Error> {
    for i in 0..tries {
        let shifted = x.try_add(&x.reshape(x.shape()))? - i as f32;
        if shifted.as_slice().unwrap().iter().all(|&v| v > 0.0) {
            return Ok(Some(shifted));
        }
    }
    Ok(None)
}

pub(crate) fn main() {
    tensorscope::scope(|s| {
        let x = s.ones::<f32>(&[4]);
        assert_eq!(stack(&x, 3).shape(), &[4]);
        assert!(first_positive(&x, 3).unwrap().is_some());
    });
}
