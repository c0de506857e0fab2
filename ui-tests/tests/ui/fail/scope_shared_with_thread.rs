// A scope cannot be used from another thread either.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        std::thread::scope(|threads| {
            threads.spawn(|| s.ones::<f32>(&[4]).len());
        });
    });
}
