// A tensor of one sibling scope cannot be used after that scope ended, e.g. in the next sibling.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut previous = None;
        s.scope(|first| {
            previous = Some(first.ones::<f32>(&[4]));
        });
        s.scope(|second| {
            let t = second.ones::<f32>(&[4]);
            drop(&t + previous.as_ref().unwrap());
        });
    });
}
