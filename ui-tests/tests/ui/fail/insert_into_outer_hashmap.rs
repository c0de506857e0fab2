// Inserting a scoped tensor into a HashMap that outlives the scope.
use std::collections::HashMap;

use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut by_name: HashMap<&str, Tensor<'_>> = HashMap::new();
        s.scope(|inner| {
            by_name.insert("h", inner.ones::<f32>(&[4]));
        });
        drop(by_name);
    });
}
