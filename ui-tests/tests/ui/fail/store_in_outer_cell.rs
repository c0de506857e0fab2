// Interior mutability does not help a scoped tensor out: a `Cell` keeps the brand.
use std::cell::Cell;

use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let cell: Cell<Option<Tensor<'_>>> = Cell::new(None);
        s.scope(|inner| cell.set(Some(inner.ones::<f32>(&[4]))));
        drop(cell);
    });
}
