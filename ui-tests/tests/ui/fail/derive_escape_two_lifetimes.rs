use tensorscope::prelude::*;

#[derive(Escape)]
struct Pair<'a, 'b> {
    left: Tensor<'a>,
    right: Tensor<'b>,
}

#[derive(Escape)]
enum Either<'a> {
    Left(Tensor<'a>),
}

fn main() {}
