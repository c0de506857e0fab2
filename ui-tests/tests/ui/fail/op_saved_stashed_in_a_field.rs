// What an op saves carries its scope's brand: a field of the op (which is `'static`) cannot keep
// it, whether the forward puts it there or the backward does, as a saved value or as the tensor
// `Saved::get` gives. Without the brand, the stash was read after its scope ended.
use std::cell::RefCell;
use std::rc::Rc;

use tensorscope::autograd::{Backward, Forward, Grads, Op, Saved};
use tensorscope::prelude::*;

#[derive(Clone, Default)]
struct StashInForward(Rc<RefCell<Option<Saved<'static, f32>>>>);

impl Op<f32> for StashInForward {
    type Saved<'s> = Saved<'s, f32>;
    fn name(&self) -> &'static str {
        "stash_in_forward"
    }
    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, f32>,
    ) -> tensorscope::Result<(Tensor<'s, f32>, Option<Saved<'s, f32>>)> {
        let x = cx.input(0);
        *self.0.borrow_mut() = Some(cx.save(x));
        Ok((x * 2.0, Some(cx.save(x))))
    }
    fn backward<'b>(
        &self,
        _: Saved<'b, f32>,
        g: Tensor<'b, f32>,
        _: &Backward<'b>,
    ) -> tensorscope::Result<Grads<'b, f32>> {
        Ok(Grads::from([Some(g * 2.0)]))
    }
}

#[derive(Clone, Default)]
struct StashInBackward {
    saved: Rc<RefCell<Option<Saved<'static, f32>>>>,
    tensor: Rc<RefCell<Option<Tensor<'static, f32>>>>,
}

impl Op<f32> for StashInBackward {
    type Saved<'s> = Saved<'s, f32>;
    fn name(&self) -> &'static str {
        "stash_in_backward"
    }
    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, f32>,
    ) -> tensorscope::Result<(Tensor<'s, f32>, Option<Saved<'s, f32>>)> {
        let x = cx.input(0);
        Ok((x * 2.0, Some(cx.save(x))))
    }
    fn backward<'b>(
        &self,
        x: Saved<'b, f32>,
        g: Tensor<'b, f32>,
        cx: &Backward<'b>,
    ) -> tensorscope::Result<Grads<'b, f32>> {
        *self.tensor.borrow_mut() = Some(x.get(cx));
        *self.saved.borrow_mut() = Some(x);
        Ok(Grads::from([Some(g * 2.0)]))
    }
}

fn main() {}
