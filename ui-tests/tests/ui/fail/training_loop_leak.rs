// The training-loop leak: a tensor of step i kept alive into step i + 1 through an accumulator.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut total_loss = s.zeros::<f32>(&[1]);
        for step in 0..10 {
            s.scope(|iteration| {
                let loss = iteration.full::<f32>(&[1], step as f32);
                total_loss = &total_loss + &loss; // the sum belongs to `iteration`
            });
        }
        drop(total_loss);
    });
}
