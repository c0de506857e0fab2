// `Option::replace` (or `insert`) on an outer option cannot take an inner tensor.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut last = Some(s.zeros::<f32>(&[4]));
        s.scope(|inner| {
            last.replace(inner.ones::<f32>(&[4]));
        });
        drop(last);
    });
}
