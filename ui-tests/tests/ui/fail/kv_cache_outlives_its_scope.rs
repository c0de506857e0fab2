// A key/value cache is a value of the scope that made it, like a tensor: it cannot be returned
// from the scope or kept in an outer variable from a per-token scope (and, holding tensors, it is
// not `Send`, as they are not).
use tensorscope::nn::KvCache;
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let returned = pool.scope(|s| KvCache::<f32>::new(s, 1, 2, 8, 4));
    drop(returned);

    pool.scope(|request| {
        let mut kept = None;
        request.scope(|step| {
            kept = Some(KvCache::<f32>::new(step, 1, 2, 8, 4));
        });
        drop(kept);
    });
}
