// The derive refuses a union (which field holds a value is not known), and the model is still
// usable as a set of parameters (one error).
use tensorscope::Parameters;

#[derive(Parameters)]
union Raw {
    bits: u32,
    value: f32,
}

fn main() {
    let _ = Raw { bits: 0 }.named_params();
}
