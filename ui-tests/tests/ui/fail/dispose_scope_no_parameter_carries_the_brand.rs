// The return type names `'a`, but no `&Scope<'a, '_>` or `Tensor<'a>` parameter carries it (a type
// alias hides it): the macro cannot know which scope the result belongs to.
use tensorscope::prelude::*;

type Activation<'a> = Tensor<'a>;

#[dispose_scope]
fn forward<'a>(x: &Activation<'a>) -> Activation<'a> {
    x * 2.0
}

fn main() {}
