// Tensors belong to their scope's thread.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let t = s.ones::<f32>(&[4]);
        std::thread::spawn(move || t.len());
    });
}
