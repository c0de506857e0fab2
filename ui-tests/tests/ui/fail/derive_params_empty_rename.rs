// A name is the dot-joined path of the file's tensor: no segment of it may be empty.
use tensorscope::{Param, Parameters};

#[derive(Parameters)]
struct Mlp {
    #[param(rename = "")]
    weight: Param,
    #[param(rename = "a..b")]
    bias: Param,
}

fn main() {}
