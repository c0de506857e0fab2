// Interior mutability does not help a scoped tensor out: a `RefCell` keeps the brand.
use std::cell::RefCell;

use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let slot: RefCell<Option<Tensor<'_>>> = RefCell::new(None);
        s.scope(|inner| {
            *slot.borrow_mut() = Some(inner.ones::<f32>(&[4]));
        });
        drop(slot);
    });
}
