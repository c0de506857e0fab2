// A struct whose field is typed with the outer brand cannot hold an inner scope's tensor.
use tensorscope::prelude::*;

struct State<'a> {
    hidden: Tensor<'a>,
}

fn step<'a>(state: &mut State<'a>, inner: &Scope<'a, '_>) {
    inner.scope(|i| state.hidden = i.ones::<f32>(&[4]));
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let mut state = State { hidden: s.zeros::<f32>(&[4]) };
        step(&mut state, s);
        drop(state);
    });
}
