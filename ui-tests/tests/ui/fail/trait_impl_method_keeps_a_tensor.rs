// A trait method cannot keep its input in `self`: the trait's signature gives it no longer brand.
use tensorscope::prelude::*;

trait Layer {
    fn forward<'a>(&mut self, x: &Tensor<'a>) -> Tensor<'a>;
}

struct Recorder<'m> {
    seen: Vec<Tensor<'m>>,
}

impl<'m> Layer for Recorder<'m> {
    #[dispose_scope]
    fn forward<'a>(&mut self, x: &Tensor<'a>) -> Tensor<'a> {
        self.seen.push(x.clone());
        x * 2.0
    }
}

fn main() {}
