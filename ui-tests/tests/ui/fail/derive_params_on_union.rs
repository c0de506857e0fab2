// The derive refuses an enum, and the model is still usable as a set of parameters (one error).
use tensorscope::{Param, Parameters};

#[derive(Parameters)]
enum Head {
    Linear(Param),
    Identity,
}

fn main() {
    let _ = Head::Identity.named_params();
}
