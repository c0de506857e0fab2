// The route that made a `#[dispose_scope]` result outlive its caller's scope: the brand carried by
// a weight. A `Param` carries no brand, so the function must name the tensor's scope.
use tensorscope::prelude::*;

#[dispose_scope]
fn project<'a>(w: &Param, x: &Tensor<'_>) -> Tensor<'a> {
    x.matmul(w).relu()
}

#[dispose_scope]
fn project_old<'a>(w: &Tensor<'a>, x: &Tensor<'a>) -> Tensor<'a> {
    x.matmul(w).relu()
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2, 2], &[1.0f32; 4]);
    let mut history = Vec::new();
    pool.scope(|s| {
        for _ in 0..3 {
            s.scope(|step| {
                let x = step.ones::<f32>(&[1, 2]);
                // A weight bound in the step scope is the step's: the result cannot outlive it.
                history.push(project_old(&step.bind(&w), &x));
            });
        }
    });
}
