//! A `Param` has no ops: the op names users try on one say to bind it first.
use tensorscope::prelude::*;

fn transposed(w: &Param) {
    let _ = w.t();
}

fn product(pool: &Pool, w: &Param) {
    pool.scope(|s| {
        let x = s.ones::<f32>(&[2, 2]);
        let _ = w.matmul(&x);
    });
}

fn main() {
    let pool = Pool::with_max_memory_mb(1);
    let w = Param::<f32>::zeros(&pool, &[2, 2]);
    transposed(&w);
    product(&pool, &w);
}
