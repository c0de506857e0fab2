// A field that holds no parameters is an error at its type, with the note that suggests
// `#[param(skip)]`.
use tensorscope::{Param, Parameters};

#[derive(Parameters)]
struct Mlp {
    weight: Param,
    count: usize,
    labels: Vec<String>,
}

fn main() {}
