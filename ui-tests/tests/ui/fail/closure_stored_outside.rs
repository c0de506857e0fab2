// A closure that captures a scoped tensor carries its brand: it cannot be kept past the scope.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let mut later: Option<Box<dyn Fn() -> usize>> = None;
    pool.scope(|s| {
        let t = s.ones::<f32>(&[4]);
        later = Some(Box::new(move || t.len()));
    });
    drop(later);
}
