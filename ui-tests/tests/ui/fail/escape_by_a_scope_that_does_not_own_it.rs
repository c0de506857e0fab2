// Only a tensor's own scope (or a scope inside which it was made) can hand it on: a scope cannot
// escape the tensors of a deeper, sibling or unrelated scope to its own parent, which would carry
// them past the end of the scope that made them.
use tensorscope::prelude::*;

// A #[dispose_scope] function whose tensor parameter has a brand unrelated to the result's.
#[dispose_scope]
fn relabel<'a, 'b>(s: &Scope<'a, '_>, t: Tensor<'b>) -> Tensor<'a> {
    let _ = s;
    t
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|outer| {
        // An outer scope escaping a tensor of its child.
        let _kept = outer.scope(|inner| outer.escape(inner.ones::<f32>(&[4])));
        // A sibling escaping another sibling's tensor.
        outer.scope(|a| {
            let x = a.ones::<f32>(&[4]);
            outer.scope(|b| b.escape(x.clone()));
        });
        // A scope of another tree.
        outer.scope(|a| {
            let x = a.ones::<f32>(&[4]);
            Pool::with_max_memory_mb(16).scope(|other| other.escape(x.clone()));
        });
    });
}
