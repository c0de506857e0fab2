// Type erasure keeps the brand: `Box<dyn Any>` needs `'static`, and a trait object kept outside the
// scope carries the outer lifetime.
use std::any::Any;
use std::fmt::Debug;

use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let mut erased: Vec<Box<dyn Any>> = Vec::new();
    pool.scope(|s| {
        let mut shown: Vec<Box<dyn Debug + '_>> = Vec::new();
        erased.push(Box::new(s.ones::<f32>(&[4])));
        s.scope(|inner| shown.push(Box::new(inner.ones::<f32>(&[4]))));
        drop(shown);
    });
    drop(erased);
}
