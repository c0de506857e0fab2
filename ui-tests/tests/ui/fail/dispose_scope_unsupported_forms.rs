use tensorscope::prelude::*;

#[dispose_scope]
fn diverges<'a>(x: &Tensor<'a>) -> ! {
    panic!("{}", x.len())
}

#[dispose_scope]
#[track_caller]
fn located<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x * 2.0
}

#[dispose_scope(crate = 5)]
fn numbered_crate<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x * 2.0
}

fn main() {}
