//! `index_add` and `scatter_add`: values and gradients against PyTorch
//! (`scripts/scatter_fixture.py`), gradients against finite differences (also where the index
//! is smaller than the source), a checkpointed replay, and the errors, raised before anything is
//! rented.

use tensorscope::prelude::*;
use tensorscope::{Error, Shape};

use super::checks::{assert_checkpoint_replays_exactly, Fixture};
use crate::autograd::check;
use crate::common::test_pool;

#[test]
fn index_add_and_scatter_add_match_pytorch() {
    let fixture = Fixture::open("scatter");
    for prefix in ["index_add_rows", "index_add_middle"] {
        let ids = fixture.param::<i64>(&format!("{prefix}.ids"));
        let axis = fixture.values::<i64>(&format!("{prefix}.axis"))[0];
        fixture.check(prefix, &["x", "src"], |x| {
            x[0].index_add(axis, &x[0].bind(&ids), &x[1])
        });
    }
    for prefix in ["scatter_lanes", "scatter_rows"] {
        let index = fixture.param::<i64>(&format!("{prefix}.index"));
        let axis = fixture.values::<i64>(&format!("{prefix}.axis"))[0];
        fixture.check(prefix, &["x", "src"], |x| {
            x[0].scatter_add(axis, &x[0].bind(&index), &x[1])
        });
    }
    // An index smaller than the source: the source's gradient is checked by finite differences.
    let index = fixture.param::<i64>("scatter_small.index");
    let src = fixture.param::<f64>("scatter_small.src");
    fixture.check("scatter_small", &["x"], |x| {
        x[0].scatter_add(0, &x[0].bind(&index), &x[0].bind(&src))
    });
}

#[test]
fn gradients_match_finite_differences() {
    let pool = Pool::with_max_memory_mb(8);
    let ids = Param::from_slice(&pool, &[4], &[2i64, 0, 2, 2]);
    check("index_add", &[&[3, 3, 2], &[3, 4, 2]], |x| {
        x[0].try_index_add(-2, &x[0].bind(&ids), &x[1])
    });
    // The index covers part of the source: the rest gets a zero gradient.
    let index = Param::from_slice(&pool, &[2, 2], &[1i64, 0, 1, 1]);
    check("scatter_add", &[&[3, 3], &[3, 4]], |x| {
        x[0].try_scatter_add(1, &x[0].bind(&index), &x[1])
    });
}

#[test]
fn the_source_past_the_index_is_not_read_and_gets_a_zero_gradient() {
    test_pool(16).scope(|s| {
        let x = s.zeros::<f32>(&[2, 3]).requires_grad();
        let index = s.from_slice::<i64>(&[1, 2], &[2, 2]);
        let src = s
            .from_slice::<f32>(&[2, 3], &[1., 2., 3., 4., 5., 6.])
            .requires_grad();
        let y = x.scatter_add(1, &index, &src);
        assert_eq!(y.to_vec(), vec![0., 0., 3., 0., 0., 0.]);
        let grads = (&y * &s.from_slice::<f32>(&[2, 3], &[1., 2., 3., 4., 5., 6.]))
            .sum_all()
            .backward()
            .unwrap();
        assert_eq!(
            grads.of(&src).unwrap().to_vec(),
            vec![3., 3., 0., 0., 0., 0.]
        );
        assert_eq!(grads.of(&x).unwrap().to_vec(), vec![1., 2., 3., 4., 5., 6.]);
    });
}

#[test]
fn checkpointed_index_add_and_scatter_add_replay_bit_for_bit() {
    let pool = Pool::with_max_memory_mb(16);
    let ids = Param::from_slice(&pool, &[3], &[5i64, 1, 5]);
    let positions: Vec<i64> = (0..24).map(|i| i * 7 % 5).collect();
    let index = Param::from_slice(&pool, &[4, 6], &positions);
    assert_checkpoint_replays_exactly(
        &[4, 6],
        &[6, 6],
        |i, x, w| {
            let h = x.matmul(w).tanh();
            match i % 2 {
                0 => x.index_add(1, &x.bind(&ids), &h.narrow(1, 0, 3)),
                _ => x.scatter_add(1, &x.bind(&index), &h),
            }
        },
        || (),
    );
}

#[test]
fn bad_ids_and_shapes_are_typed_errors_raised_before_any_rent() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[3, 4]);
        let src = s.ones::<f32>(&[2, 4]);
        let ids = s.from_slice::<i64>(&[2], &[0, 3]);
        let rents = || pool.stats().hits + pool.stats().misses;
        let before = rents();
        let err = x.try_index_add(0, &ids, &src).unwrap_err();
        assert_eq!(
            err,
            Error::IndexOutOfRange {
                op: "index_add",
                index: 3,
                axis: 0,
                len: 3
            }
        );
        assert_eq!(rents(), before, "nothing rented");
        let ids = s.from_slice::<i64>(&[2], &[0, 2]);
        assert_eq!(
            x.try_index_add(0, &ids, &s.ones::<f32>(&[3, 4]))
                .unwrap_err()
                .to_string(),
            "index_add: incompatible shapes [3, 4] and [3, 4]: the source must be [2, 4]: the \
             input's shape with the ids' length, 2, on axis 0"
        );
        assert_eq!(
            x.try_index_add(0, &ids.reshape(&[1, 2]), &src)
                .unwrap_err()
                .to_string(),
            "index_add: invalid shape [1, 2]: the ids must be 1-D"
        );
        assert_eq!(
            x.try_index_add(2, &ids, &src).unwrap_err(),
            Error::AxisOutOfRange {
                op: "index_add",
                axis: 2,
                ndim: 2
            }
        );

        let index = s.from_slice::<i64>(&[2, 2], &[0, 1, 2, -1]);
        let before = rents();
        assert_eq!(
            x.try_scatter_add(0, &index, &src).unwrap_err(),
            Error::IndexOutOfRange {
                op: "scatter_add",
                index: -1,
                axis: 0,
                len: 3
            }
        );
        assert_eq!(rents(), before, "nothing rented");
        let index = s.zeros::<i64>(&[2, 5]);
        assert_eq!(
            x.try_scatter_add(0, &index, &s.ones::<f32>(&[2, 5]))
                .unwrap_err(),
            Error::ShapeMismatch {
                op: "scatter_add",
                lhs: Shape(vec![3, 4]),
                rhs: Shape(vec![2, 5]),
                reason: "the index needs the input's rank and, on every axis but 0, at most its \
                         length"
                    .into()
            }
        );
        assert_eq!(
            x.try_scatter_add(0, &s.zeros::<i64>(&[3, 4]), &src)
                .unwrap_err()
                .to_string(),
            "scatter_add: incompatible shapes [2, 4] and [3, 4]: the index needs the source's \
             rank and, on every axis, at most its length"
        );
    });
}
