// Generic code and `impl Trait` returns keep the brand of what they wrap.
use std::fmt::Debug;

use tensorscope::prelude::*;

fn identity<T>(value: T) -> T {
    value
}

fn erased<'s>(t: Tensor<'s>) -> impl Debug + 's {
    t
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let _generic = pool.scope(|s| identity(s.ones::<f32>(&[4])));
    let _opaque = pool.scope(|s| erased(s.ones::<f32>(&[4])));
}
