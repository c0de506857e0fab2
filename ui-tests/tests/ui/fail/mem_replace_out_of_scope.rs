// `mem::replace` cannot put an inner tensor where an outer one was.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut outer = s.zeros::<f32>(&[4]);
        s.scope(|inner| drop(std::mem::replace(&mut outer, inner.ones::<f32>(&[4]))));
        drop(outer);
    });
}
