// PyTorch's FAQ leak ("My model reports cuda runtime error(2): out of memory"): a running total of
// the loss kept outside the training step. In PyTorch `total_loss += loss` keeps every step's graph
// alive; here the step's loss cannot leave the step's scope at all.
use tensorscope::prelude::*;

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2, 1], &[0.5f32, -1.0]);
    pool.scope(|outer| {
        let mut total_loss = outer.zeros::<f32>(&[]);
        for _ in 0..10 {
            outer.train(|step| {
                let x = step.ones::<f32>(&[4, 2]);
                let loss = x.matmul(&w).try_mse(&step.zeros(&[4, 1])).unwrap();
                let grads = loss.backward().unwrap();
                drop(grads);
                total_loss = &total_loss + &loss;
            });
        }
        drop(total_loss);
    });
}
