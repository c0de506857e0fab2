// A name is the dot-joined path of the file's tensor: it needs a value, and no segment of it may be
// empty. Each field's mistake is reported.
use tensorscope::{Param, Parameters};

#[derive(Parameters)]
struct Mlp {
    #[param(rename = "")]
    weight: Param,
    #[param(rename = "a..b")]
    bias: Param,
    #[param(rename)]
    scale: Param,
}

fn main() {}
