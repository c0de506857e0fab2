use tensorscope::{Param, Parameters};

#[derive(Parameters)]
struct Mlp {
    #[param(skip, rename = "w")]
    weight: Param,
}

fn main() {}
