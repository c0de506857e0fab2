// Methods (`&self`, `&mut self`, `self`), generic element types, where-clauses, explicit scopes.
#![deny(warnings)]

use tensorscope::prelude::*;
use tensorscope::Element;

struct Linear<T: Element> {
    w: Param<T>,
    calls: usize,
}

impl<T: Element> Linear<T> {
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a, T>) -> Tensor<'a, T> {
        x.matmul(&self.w)
    }

    #[dispose_scope]
    fn forward_counted<'a>(&mut self, x: Tensor<'a, T>) -> Tensor<'a, T> {
        self.calls += 1;
        x.matmul(&self.w).relu()
    }

    #[dispose_scope]
    fn into_weight<'a>(self, s: &Scope<'a, '_>) -> Tensor<'a, T> {
        s.bind(&self.w) * T::from_f64(1.0)
    }
}

#[dispose_scope]
fn scaled<'a, T>(x: &Tensor<'a, T>, by: T) -> Tensor<'a, T>
where
    T: Element,
{
    x * by
}

pub(crate) fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let w = pool.scope(|s| s.ones::<f64>(&[3, 3]).detach());
    let mut layer = Linear { w, calls: 0 };
    pool.scope(|s| {
        let x = s.ones::<f64>(&[1, 3]);
        let y = layer.forward(&x);
        let z = layer.forward_counted(y);
        assert_eq!(scaled(&z, 0.5).to_vec(), vec![4.5; 3]);
    });
    assert_eq!(layer.calls, 1);
    pool.scope(|s| assert_eq!(layer.into_weight(s).len(), 9));
}
