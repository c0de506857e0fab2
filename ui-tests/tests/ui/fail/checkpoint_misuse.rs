use tensorscope::prelude::*;

#[checkpoint(every = 0)]
fn zero<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

#[checkpoint(every = 2, policy = "sqrt")]
fn both<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

#[checkpoint(evry = 2, precision = "f8")]
fn misspelled<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

#[checkpoint(memory = "64 MiBs")]
fn bad_unit<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

#[checkpoint(memory = "plenty", every = 2)]
fn not_a_budget<'a>(x: Tensor<'a>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.relu();
    }
    x
}

#[checkpoint(policy = "sqrt")]
async fn asynchronous<'a>(x: Tensor<'a>) -> Tensor<'a> {
    x
}

fn main() {}
