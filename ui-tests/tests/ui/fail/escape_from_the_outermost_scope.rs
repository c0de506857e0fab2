// An outermost scope's parent brand is as local to its closure as its own: escaping from it does
// not make a tensor that outlives every scope. Results leave as parameters or plain values.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let _kept = pool.scope(|s| s.escape(s.ones::<f32>(&[4])));
    let _global = tensorscope::scope(|s| s.escape(s.ones::<f32>(&[4])));
}
