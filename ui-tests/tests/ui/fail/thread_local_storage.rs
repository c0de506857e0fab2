// A thread-local lives for the whole thread: no scoped tensor can be stored in one.
use std::cell::RefCell;

use tensorscope::prelude::*;

thread_local! {
    static LAST: RefCell<Option<Tensor<'static>>> = const { RefCell::new(None) };
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let t = s.ones::<f32>(&[4]);
        LAST.with_borrow_mut(|last| *last = Some(t));
    });
}
