use tensorscope::prelude::*;

#[dispose_scope]
struct Layer {
    width: usize,
}

fn main() {
    let _ = Layer { width: 1 }.width;
}
