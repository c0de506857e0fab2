// `mem::swap` cannot trade an inner tensor for an outer one.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut outer = s.zeros::<f32>(&[4]);
        s.scope(|inner| {
            let mut fresh = inner.ones::<f32>(&[4]);
            std::mem::swap(&mut outer, &mut fresh);
        });
        drop(outer);
    });
}
