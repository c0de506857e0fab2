// Storing a scoped tensor in a struct that outlives the scope.
use tensorscope::prelude::*;

struct Cache<'a> {
    last: Option<Tensor<'a>>,
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut cache = Cache { last: None };
        s.scope(|inner| {
            cache.last = Some(inner.zeros::<f32>(&[4]));
        });
        drop(cache);
    });
}
