// Pushing a scoped tensor into a Vec that outlives the scope.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut kept: Vec<Tensor<'_>> = Vec::new();
        s.scope(|inner| kept.push(inner.ones::<f32>(&[4])));
        drop(kept);
    });
}
