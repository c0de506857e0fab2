use tensorscope::{Param, Parameters};

#[derive(Parameters)]
#[param(elemnt = "f64")]
struct Mlp {
    weight: Param<f64>,
}

fn main() {}
