//! `Display` of tensors and parameters: values nested in brackets by axis, one width and notation
//! per tensor, elision of large tensors, then `Tensor[shape; dtype]`.

use tensorscope::prelude::*;
use tensorscope::{bf16, f16};

#[test]
fn a_matrix_prints_one_row_per_line_then_shape_and_dtype() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let t = s.from_slice::<f32>(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(
            t.to_string(),
            "[[1.0000, 2.0000, 3.0000],\n [4.0000, 5.0000, 6.0000]]\nTensor[2, 3; f32]"
        );
    });
}

#[test]
fn integers_print_as_integers_right_aligned() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let ids = s.from_slice::<i64>(&[5], &[3, -1, 200, 0, 7]);
        assert_eq!(ids.to_string(), "[  3,  -1, 200,   0,   7]\nTensor[5; i64]");
        // A precision applies to floats only.
        assert_eq!(format!("{ids:.2}"), ids.to_string());
        let mask = s.from_slice::<u8>(&[2, 2], &[1, 0, 0, 1]);
        assert_eq!(mask.to_string(), "[[1, 0],\n [0, 1]]\nTensor[2, 2; u8]");
    });
}

#[test]
fn rank_0_prints_its_value_alone() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        assert_eq!(
            s.from_slice::<f32>(&[], &[2.5]).to_string(),
            "2.5000\nTensor[; f32]"
        );
        assert_eq!(
            s.from_slice::<i32>(&[], &[-7]).to_string(),
            "-7\nTensor[; i32]"
        );
    });
}

#[test]
fn an_empty_tensor_prints_empty_brackets_and_its_shape() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        assert_eq!(s.zeros::<f32>(&[0, 3]).to_string(), "[]\nTensor[0, 3; f32]");
        assert_eq!(s.zeros::<i64>(&[2, 0]).to_string(), "[]\nTensor[2, 0; i64]");
    });
    // Empty tensors are not walked, however long their other axes (this used to try to allocate
    // 2^40 indices).
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let wide = s.zeros::<f32>(&[0, 1 << 40]);
        assert_eq!(wide.to_string(), "[]\nTensor[0, 1099511627776; f32]");
        let tall = s.zeros::<f32>(&[1 << 40, 0]);
        assert_eq!(tall.to_string(), "[]\nTensor[1099511627776, 0; f32]");
    });
}

#[test]
fn blocks_of_a_3d_tensor_are_separated_by_a_blank_line() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let values: Vec<i32> = (0..24).collect();
        let t = s.from_slice::<i32>(&[2, 3, 4], &values);
        let want = "\
[[[ 0,  1,  2,  3],
  [ 4,  5,  6,  7],
  [ 8,  9, 10, 11]],

 [[12, 13, 14, 15],
  [16, 17, 18, 19],
  [20, 21, 22, 23]]]
Tensor[2, 3, 4; i32]";
        assert_eq!(t.to_string(), want);
    });
}

#[test]
fn a_large_tensor_shows_three_indices_at_each_end_of_every_axis() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let values: Vec<f32> = (0..10_000).map(|i| 1.0 + i as f32 / 100.0).collect();
        let t = s.from_slice::<f32>(&[100, 100], &values);
        let want = "\
[[  1.0000,   1.0100,   1.0200,      ...,   1.9700,   1.9800,   1.9900],
 [  2.0000,   2.0100,   2.0200,      ...,   2.9700,   2.9800,   2.9900],
 [  3.0000,   3.0100,   3.0200,      ...,   3.9700,   3.9800,   3.9900],
 ...,
 [ 98.0000,  98.0100,  98.0200,      ...,  98.9700,  98.9800,  98.9900],
 [ 99.0000,  99.0100,  99.0200,      ...,  99.9700,  99.9800,  99.9900],
 [100.0000, 100.0100, 100.0200,      ..., 100.9700, 100.9800, 100.9900]]
Tensor[100, 100; f32]";
        assert_eq!(t.to_string(), want);

        // Only axes longer than 6 are elided, and only past 1000 elements.
        let values: Vec<i64> = (0..1200).collect();
        let t = s.from_slice::<i64>(&[2, 600], &values);
        let want = "\
[[   0,    1,    2,  ...,  597,  598,  599],
 [ 600,  601,  602,  ..., 1197, 1198, 1199]]
Tensor[2, 600; i64]";
        assert_eq!(t.to_string(), want);
        let values: Vec<i64> = (0..1000).collect();
        assert!(!s
            .from_slice::<i64>(&[1000], &values)
            .to_string()
            .contains("..."));
    });
}

#[test]
fn long_rows_wrap_at_80_columns() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let values: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let want = "\
[ 0.0000,  1.0000,  2.0000,  3.0000,  4.0000,  5.0000,  6.0000,  7.0000,
  8.0000,  9.0000, 10.0000, 11.0000, 12.0000, 13.0000, 14.0000, 15.0000,
 16.0000, 17.0000, 18.0000, 19.0000]
Tensor[20; f32]";
        assert_eq!(s.from_slice::<f32>(&[20], &values).to_string(), want);
    });
}

#[test]
fn half_precision_floats_print_their_rounded_values() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let h: Vec<f16> = [0.1f32, -2.0, 3.0].map(f16::from_f32).to_vec();
        assert_eq!(
            s.from_slice::<f16>(&[3], &h).to_string(),
            "[ 0.1000, -2.0000,  3.0000]\nTensor[3; f16]"
        );
        // f16's 0.1 is 0.0999755859375: eight decimals show it.
        assert_eq!(
            format!("{:.8}", s.from_slice::<f16>(&[1], &h[..1])),
            "[0.09997559]\nTensor[1; f16]"
        );
        let b: Vec<bf16> = [1.0f32, 100.0, 0.5].map(bf16::from_f32).to_vec();
        assert_eq!(
            s.from_slice::<bf16>(&[3], &b).to_string(),
            "[  1.0000, 100.0000,   0.5000]\nTensor[3; bf16]"
        );
    });
}

#[test]
fn wide_ranges_switch_to_scientific_notation() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let t = s.from_slice::<f64>(&[3], &[1e-5, 1.0, 1e9]);
        assert_eq!(
            t.to_string(),
            "[1.0000e-05, 1.0000e+00, 1.0000e+09]\nTensor[3; f64]"
        );
        let t = s.from_slice::<f32>(&[2], &[0.001, 10.0]);
        assert_eq!(t.to_string(), "[1.0000e-03, 1.0000e+01]\nTensor[2; f32]");
        assert_eq!(format!("{t:.1}"), "[1.0e-03, 1.0e+01]\nTensor[2; f32]");
        let t = s.from_slice::<f64>(&[3], &[1.23456, 100.0, -0.5]);
        assert_eq!(
            format!("{t:.2}"),
            "[  1.23, 100.00,  -0.50]\nTensor[3; f64]"
        );
    });
}

#[test]
fn nan_and_infinities_print_by_name() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let t = s.from_slice::<f64>(&[4], &[f64::NAN, f64::INFINITY, -f64::INFINITY, 1.5]);
        assert_eq!(
            t.to_string(),
            "[   NaN,    inf,   -inf, 1.5000]\nTensor[4; f64]"
        );
        // They do not count in the choice of notation.
        let t = s.from_slice::<f32>(&[3], &[f32::NAN, 0.0, 2.0]);
        assert_eq!(t.to_string(), "[   NaN, 0.0000, 2.0000]\nTensor[3; f32]");
    });
}

#[test]
fn a_param_prints_as_a_tensor_does() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2, 2], &[0.5f32, -1.0, 2.0, 0.25]);
    assert_eq!(
        w.to_string(),
        "[[ 0.5000, -1.0000],\n [ 2.0000,  0.2500]]\nParam[2, 2; f32]"
    );
    let bound = pool.scope(|s| s.bind(&w).to_string());
    assert_eq!(
        bound,
        "[[ 0.5000, -1.0000],\n [ 2.0000,  0.2500]]\nTensor[2, 2; f32]"
    );
}

/// Runs `f` on a thread with a stack of 2 MiB, the default of spawned threads, whatever
/// `RUST_MIN_STACK` says: printing must not need a stack frame per axis.
fn on_a_2_mib_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_one_element_tensor_of_rank_100_000_prints_on_a_default_stack() {
    on_a_2_mib_stack(|| {
        const RANK: usize = 100_000;
        let pool = Pool::with_max_memory_mb(16);
        pool.scope(|s| {
            let t = s.from_slice::<f32>(&[1], &[1.0]).reshape(&[1; RANK]);
            assert_eq!(t.ndim(), RANK);
            let want = format!(
                "{}1.0000{}\nTensor[{}; f32]",
                "[".repeat(RANK),
                "]".repeat(RANK),
                vec!["1"; RANK].join(", ")
            );
            assert_eq!(t.to_string(), want);
            assert_eq!(format!("{t:?}"), want, "Debug prints as Display");
            let p = t.detach();
            assert_eq!(format!("{p:?}"), want.replace("Tensor[", "Param["));
        });
    });
}

#[test]
fn a_tensor_of_rank_3002_prints_its_blocks_and_rows() {
    on_a_2_mib_stack(|| {
        // [2, 1 x 3000, 2]: two blocks of axis 0, each 3000 brackets deep around a row of 2.
        const ONES: usize = 3000;
        const RANK: usize = ONES + 2;
        let mut shape = vec![1; RANK];
        shape[0] = 2;
        shape[RANK - 1] = 2;
        let pool = Pool::with_max_memory_mb(16);
        pool.scope(|s| {
            let t = s.from_slice::<i32>(&[4], &[1, 2, 3, 4]).reshape(&shape);
            // A row's elements wrap at 80 columns counting its indent of one space per axis: past
            // 80 axes every element after the first starts a line of its own.
            let row = |a: i32, b: i32| format!("[{a},\n{}{b}]", " ".repeat(RANK));
            let block =
                |a: i32, b: i32| format!("{}{}{}", "[".repeat(ONES), row(a, b), "]".repeat(ONES));
            // Blocks of axis 0 are separated by a blank line per axis below the next.
            let separator = format!(",{} ", "\n".repeat(RANK - 1));
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            let want = format!(
                "[{}{separator}{}]\nTensor[{}; i32]",
                block(1, 2),
                block(3, 4),
                dims.join(", ")
            );
            assert_eq!(t.to_string(), want);
        });
    });
}

#[test]
fn an_expanded_view_prints_summarized_without_a_copy() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        // 2^40 elements over one f32: a copy would be 4 TiB.
        let one = s.from_slice::<f32>(&[1], &[2.5]);
        let wide = one.expand(&[1 << 40]);
        let start = std::time::Instant::now();
        assert_eq!(
            wide.to_string(),
            "[2.5000, 2.5000, 2.5000,    ..., 2.5000, 2.5000, 2.5000]\nTensor[1099511627776; f32]"
        );
        assert_eq!(format!("{wide:?}"), wide.to_string());
        assert!(start.elapsed().as_secs_f64() < 1.0, "{:?}", start.elapsed());
        assert_eq!(pool.stats().bytes_in_use, one.allocated_bytes());

        // Rows of a column broadcast along the last axis, then transposed: the steps are read.
        let col = s.from_slice::<i64>(&[3, 1], &[1, 2, 3]);
        let grid = col.expand(&[3, 1 << 30]).t();
        let want = "\
[[1, 2, 3],
 [1, 2, 3],
 [1, 2, 3],
 ...,
 [1, 2, 3],
 [1, 2, 3],
 [1, 2, 3]]
Tensor[1073741824, 3; i64]";
        assert_eq!(grid.to_string(), want);
        // A view that is not expanded prints as its copy does, offset and steps read.
        let x = s.from_slice::<i64>(&[3, 4], &(0..12).collect::<Vec<_>>());
        let view = x.narrow(1, 1, 2).t();
        assert_eq!(view.to_string(), view.contiguous().to_string());
        assert_eq!(
            view.to_string(),
            "[[ 1,  5,  9],\n [ 2,  6, 10]]\nTensor[2, 3; i64]"
        );
    });
}
