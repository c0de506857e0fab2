// The fixes docs/guide.md gives for the two lifetime errors it shows ("Lifetime errors you will
// see"; the README showed them until 2026-11-26).
#![deny(warnings)]

use tensorscope::prelude::*;

pub(crate) fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let kept = pool.scope(|s| s.ones::<f32>(&[4]).detach());
    assert_eq!(kept.len(), 4);

    pool.scope(|s| {
        let mut total_loss = s.zeros::<f32>(&[1]);
        for step in 0..10 {
            s.scope(|iteration| {
                let loss = iteration.full::<f32>(&[1], step as f32);
                total_loss = iteration.escape(&total_loss + &loss);
            });
        }
        assert_eq!(total_loss.to_vec(), vec![45.0]);
    });
}
