// A struct's parameters are f32 unless `#[param(element = "..")]` says otherwise.
use tensorscope::{Param, Parameters};

#[derive(Parameters)]
struct Mlp {
    weight: Param,
    scale: Param<f64>,
}

fn main() {}
