// The two fixes for a running loss: keep a number, or escape the value without its graph.
#![deny(warnings)]
use tensorscope::prelude::*;

pub(crate) fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2, 1], &[0.5f32, -1.0]);
    pool.scope(|outer| {
        let mut total = 0.0;
        let mut total_loss = outer.zeros::<f32>(&[]);
        for _ in 0..10 {
            let loss = outer.train(|step| {
                let x = step.ones::<f32>(&[4, 2]);
                let loss = x.matmul(&w).try_mse(&step.zeros(&[4, 1])).unwrap();
                loss.backward().unwrap();
                total += loss.item();
                step.escape(loss.without_grad())
            });
            assert!(!loss.has_graph());
            total_loss = &total_loss + &loss;
        }
        assert_eq!(total, total_loss.item());
    });
}
