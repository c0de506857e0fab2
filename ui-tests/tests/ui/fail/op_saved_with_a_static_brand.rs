// An op cannot declare what it saves as outliving the scope: the forward saves under its scope's
// brand and the backward gets the backward's, so `Saved<'static, _>` is neither what `save` gives
// nor what a backward may keep. And nothing outside the library widens a brand: moving a saved
// value to another brand is the engine's alone.
use tensorscope::autograd::{Backward, Forward, Grads, Op, Saved};
use tensorscope::prelude::*;

#[derive(Clone)]
struct Forever;

impl Op<f32> for Forever {
    type Saved<'s> = Saved<'static, f32>;
    fn name(&self) -> &'static str {
        "forever"
    }
    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, f32>,
    ) -> tensorscope::Result<(Tensor<'s, f32>, Option<Saved<'static, f32>>)> {
        let x = cx.input(0);
        Ok((x * 2.0, Some(cx.save(x))))
    }
    fn backward<'b>(
        &self,
        _: Saved<'static, f32>,
        g: Tensor<'b, f32>,
        _: &Backward<'b>,
    ) -> tensorscope::Result<Grads<'b, f32>> {
        Ok(Grads::from([Some(g * 2.0)]))
    }
}

fn widen<'s>(saved: Saved<'s, f32>) -> Saved<'static, f32> {
    saved
}

fn widen_through_the_op<O: Op<f32>>(saved: O::Saved<'_>) -> O::Saved<'static> {
    saved.rebrand()
}

fn main() {}
