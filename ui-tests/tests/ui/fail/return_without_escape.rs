// A tensor cannot leave the scope that made it unless it is escaped.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let _kept = pool.scope(|s| s.ones::<f32>(&[4]));
}
