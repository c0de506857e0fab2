// Every return type `#[dispose_scope]` accepts, checked under `#![deny(warnings)]`.
#![deny(warnings)]

use tensorscope::prelude::*;

#[derive(Escape)]
struct Output<'s> {
    y: Tensor<'s>,
    extras: Vec<Tensor<'s>>,
    note: &'static str,
}

#[dispose_scope]
fn tensor<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x * 2.0
}

#[dispose_scope]
fn tuple<'a>(x: &Tensor<'a>) -> (Tensor<'a>, Tensor<'a>, usize) {
    (x + 1.0, x - 1.0, 2)
}

#[dispose_scope]
fn array<'a>(x: &Tensor<'a>) -> [Tensor<'a>; 2] {
    [x.clone(), x.relu()]
}

#[dispose_scope]
fn vec<'a>(x: &Tensor<'a>, n: usize) -> Vec<Tensor<'a>> {
    (0..n).map(|i| x * i as f32).collect()
}

#[dispose_scope]
fn option<'a>(x: &Tensor<'a>, some: bool) -> Option<Tensor<'a>> {
    some.then(|| x.exp())
}

#[dispose_scope]
fn result<'a>(x: &Tensor<'a>, w: &Tensor<'a>) -> Result<Tensor<'a>, tensorscope::Error> {
    x.try_matmul(w)
}

#[dispose_scope]
fn derived<'a>(x: &Tensor<'a>) -> Output<'a> {
    Output {
        y: x.sigmoid(),
        extras: vec![x.tanh()],
        note: "derived",
    }
}

#[dispose_scope]
fn unit<'a>(x: &Tensor<'a>) {
    assert_eq!(x.ndim(), 2);
}

pub(crate) fn main() {
    tensorscope::scope(|s| {
        let x = s.ones::<f32>(&[2, 2]);
        let w = s.ones::<f32>(&[2, 3]);
        assert_eq!(tensor(&x).to_vec(), vec![2.0; 4]);
        assert_eq!(tuple(&x).2, 2);
        assert_eq!(array(&x).len(), 2);
        assert_eq!(vec(&x, 3).len(), 3);
        assert!(option(&x, true).is_some());
        assert_eq!(result(&x, &w).unwrap().shape(), &[2, 3]);
        assert_eq!(derived(&x).note, "derived");
        unit(&x);
    });
}
