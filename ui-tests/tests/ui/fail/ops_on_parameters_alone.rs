// A parameter has no ops: nothing can be computed from parameters alone, so no temporary escapes
// every scope (`history.push(&w * step)` in a per-step scope used to compile and leak).
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2, 2], &[1.0f32; 4]);
    let mut history = Vec::new();
    for step in 0..3 {
        pool.scope(|_| history.push(&w * step as f32));
    }
    let _square = w.matmul(&w);
}
