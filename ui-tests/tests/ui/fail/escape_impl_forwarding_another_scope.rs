// A hand-written `Escape` cannot forward a field of another brand: the target it is given escapes
// from `'from` only, and a tensor's own escape asks for a target from its brand.
use tensorscope::prelude::*;
use tensorscope::EscapeTarget;

struct Smuggle<'x>(Tensor<'x>);

impl<'from, 'to, 'x> Escape<'from, 'to> for Smuggle<'x> {
    type Escaped = Tensor<'to>;
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Tensor<'to> {
        self.0.escape_to(target)
    }
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|outer| {
        let kept = outer.scope(|inner| outer.escape(Smuggle(inner.full::<f32>(&[4], 7.0))));
        drop(kept);
    });
}
