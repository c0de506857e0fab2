// Ids, gather positions and masks carry their scope's brand like any tensor: an op reading ids or a
// mask of an inner scope gives a tensor of that scope, which cannot be returned from it (it would
// live in, and rent in, a scope that has ended).
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|outer| {
        let table = outer.randn::<f32>(&[4, 3], 1);
        let _rows = outer.scope(|inner| {
            let ids = inner.from_slice::<i64>(&[2], &[1, 2]);
            table.index_select(0, &ids)
        });
        let _picked = outer.scope(|inner| {
            let at = inner.from_slice::<i64>(&[4, 1], &[0, 1, 2, 0]);
            table.gather(1, &at)
        });
        let _embedded = outer.scope(|inner| {
            let ids = inner.from_slice::<i64>(&[1, 2], &[3, 0]);
            table.embedding(&ids)
        });
        let _masked = outer.scope(|inner| {
            let mask = inner.ones::<u8>(&[3]);
            table.masked_fill(&mask, 0.0)
        });
    });
}
