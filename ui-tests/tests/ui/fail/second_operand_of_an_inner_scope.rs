// Every operand of every op carries its scope's brand, whatever its element type (ids, labels and
// masks included): an op on a tensor of an inner scope gives a tensor of that scope, which cannot
// be returned from it (it would live in, and rent in, a scope that has ended). One case per op
// family that takes a second tensor, and a backward's seed.
use tensorscope::autograd::{Backward, Forward, Grads, Op};
use tensorscope::ops::Cmp;
use tensorscope::prelude::*;

/// An op of the user's own, with a second input.
#[derive(Clone)]
struct Twice;

impl Op<f32> for Twice {
    type Saved<'s> = ();
    fn name(&self) -> &'static str {
        "twice"
    }
    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, f32>,
    ) -> tensorscope::Result<(Tensor<'s, f32>, Option<()>)> {
        Ok((cx.input(0) + cx.input(1), Some(())))
    }
    fn backward<'b>(
        &self,
        (): (),
        g: Tensor<'b, f32>,
        _: &Backward<'b>,
    ) -> tensorscope::Result<Grads<'b, f32>> {
        Ok(Grads::from([Some(g.clone()), Some(g)]))
    }
}

fn main() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|outer| {
        let table = outer.randn::<f32>(&[4, 3], 1);
        let image = outer.randn::<f32>(&[1, 2, 5, 5], 2);
        let _sum = outer.scope(|inner| &table + &inner.ones::<f32>(&[3]));
        let _zipped = outer.scope(|inner| table.zip_map(&inner.ones::<f32>(&[3]), |a, b| a * b));
        let _product = outer.scope(|inner| table.matmul(&inner.ones::<f32>(&[3, 2])));
        let _convolved = outer.scope(|inner| image.conv2d(&inner.ones::<f32>(&[1, 2, 3, 3]), 1, 0));
        let _error = outer.scope(|inner| table.mse(&inner.zeros::<f32>(&[4, 3])));
        let _loss = outer.scope(|inner| {
            let labels = inner.from_slice::<i64>(&[4], &[0, 1, 2, 0]);
            table.cross_entropy_ids(&labels)
        });
        let _joined = outer.scope(|inner| Tensor::concat(&[&table, &inner.ones::<f32>(&[1, 3])], 0));
        let _compared = outer.scope(|inner| table.cmp(&inner.zeros::<f32>(&[3]), Cmp::Gt));
        let _chosen = outer.scope(|inner| inner.ones::<u8>(&[3]).where_cond(&table, &table));
        let _masked = outer.scope(|inner| table.masked_fill(&inner.ones::<u8>(&[3]), 0.0));
        let _rows = outer.scope(|inner| {
            let ids = inner.from_slice::<i64>(&[2], &[1, 2]);
            table.index_select(0, &ids)
        });
        let _picked = outer.scope(|inner| {
            let at = inner.from_slice::<i64>(&[4, 1], &[0, 1, 2, 0]);
            table.gather(1, &at)
        });
        let _embedded = outer.scope(|inner| {
            let ids = inner.from_slice::<i64>(&[1, 2], &[3, 0]);
            table.embedding(&ids)
        });
        let _larger = outer.scope(|inner| table.maximum(&inner.zeros::<f32>(&[3])));
        let _powers = outer.scope(|inner| table.pow_tensor(&inner.ones::<f32>(&[3])));
        let _added = outer.scope(|inner| {
            let ids = inner.from_slice::<i64>(&[1], &[2]);
            table.index_add(0, &ids, &table.narrow(0, 0, 1))
        });
        let _scattered = outer.scope(|inner| table.scatter_add(1, &inner.zeros::<i64>(&[4, 1]), &table));
        let _rotated = outer.scope(|inner| {
            let (cos, sin) = inner.rope_tables::<f32>(0..4, 3, 10_000.0);
            table.rope(&cos, &sin)
        });
        let _counted = outer.scope(|inner| {
            let ids = outer.from_slice::<i64>(&[2], &[1, 2]);
            &ids + &inner.ones::<i64>(&[2])
        });
        let _custom = outer.scope(|inner| Tensor::apply(Twice, &[&table, &inner.ones::<f32>(&[3])]));
        let total = table.clone().requires_grad().sum_all();
        let _gradients = outer.scope(|inner| total.backward_with(&inner.ones::<f32>(&[])).unwrap());
    });
}
