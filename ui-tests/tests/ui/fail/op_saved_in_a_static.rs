// A thread local outlives every scope: it cannot keep what an op saved, nor the
// gradient a backward is given.
use std::cell::RefCell;

use tensorscope::autograd::{Backward, Forward, Grads, Op, Saved};
use tensorscope::prelude::*;

thread_local! {
    static STASH: RefCell<Vec<Saved<'static, f32>>> = const { RefCell::new(Vec::new()) };
    static GRADIENT: RefCell<Option<Tensor<'static, f32>>> = const { RefCell::new(None) };
}

#[derive(Clone)]
struct Stash;

impl Op<f32> for Stash {
    type Saved<'s> = Saved<'s, f32>;
    fn name(&self) -> &'static str {
        "stash"
    }
    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, f32>,
    ) -> tensorscope::Result<(Tensor<'s, f32>, Option<Saved<'s, f32>>)> {
        let x = cx.input(0);
        STASH.with(|stash| stash.borrow_mut().push(cx.save(x)));
        Ok((x * 2.0, Some(cx.save(x))))
    }
    fn backward<'b>(
        &self,
        x: Saved<'b, f32>,
        g: Tensor<'b, f32>,
        _: &Backward<'b>,
    ) -> tensorscope::Result<Grads<'b, f32>> {
        STASH.with(|stash| stash.borrow_mut().push(x));
        GRADIENT.with(|kept| *kept.borrow_mut() = Some(g.clone()));
        Ok(Grads::from([Some(g * 2.0)]))
    }
}

fn main() {}
