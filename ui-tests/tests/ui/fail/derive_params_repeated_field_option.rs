use tensorscope::{Param, Parameters};

#[derive(Parameters)]
struct Mlp {
    #[param(rename = "w", rename = "weight")]
    weight: Param,
}

fn main() {}
