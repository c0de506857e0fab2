use tensorscope::{Param, Parameters};

#[derive(Parameters)]
struct Mlp {
    weight: Param,
    #[param(skp)]
    width: usize,
}

fn main() {}
