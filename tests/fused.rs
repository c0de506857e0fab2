//! The fused matrix product, `matmul_with`: the bits of the ops it stands for, one rent, the same
//! errors, and the unfused graph when training.

mod common;

use common::{assert_fully_written, panic_message, test_pool};
use tensorscope::ops::Epilogue;
use tensorscope::prelude::*;
use tensorscope::{Element, Error};

/// `[rows.., k] x [k, n]` operands, a bias row and a residual of the output's shape, of `T`.
fn operands<'s, T: Element>(
    s: &Scope<'s, '_>,
    lead: &[usize],
    (k, n): (usize, usize),
) -> [Tensor<'s, T>; 4] {
    let with = |last: usize| [lead, &[last]].concat();
    [
        s.randn::<T>(&with(k), 1),
        s.randn::<T>(&[k, n], 2) * T::from_f64(1.0 / (k.max(1) as f64).sqrt()),
        s.randn::<T>(&[n], 3),
        s.randn::<T>(&with(n), 4),
    ]
}

/// Shapes around the product's blocks: one row, rows past a 144-row block, depths past a 256-deep
/// step, widths past a 1024-column panel (where rows finish after the last panel), leading axes.
const SHAPES: [(&[usize], usize, usize); 7] = [
    (&[1], 3, 5),
    (&[7], 64, 64),
    (&[300], 40, 17),
    (&[2, 75], 300, 48),
    (&[20], 520, 1100),
    (&[4, 3, 5], 16, 24),
    (&[13], 0, 9),
];

fn check_every_epilogue_matches_the_ops<T: Element>() {
    let pool = test_pool(256);
    for (lead, k, n) in SHAPES {
        pool.scope(|s| {
            let [x, w, b, r] = operands::<T>(s, lead, (k, n));
            let eps = T::from_f64(1e-5);
            let cases: [(&str, Epilogue<'_, '_, T>, Tensor<'_, T>); 7] = [
                ("plain", Epilogue::new(), x.matmul(&w)),
                (
                    "bias, gelu",
                    Epilogue::new().add(&b).gelu(),
                    (x.matmul(&w) + &b).gelu(),
                ),
                (
                    "bias, residual, layer norm",
                    Epilogue::new().add(&b).add(&r).layer_norm(eps),
                    (x.matmul(&w) + &b + &r).layer_norm(eps),
                ),
                (
                    "residual after the activation",
                    Epilogue::new().add(&b).silu().add(&r),
                    (x.matmul(&w) + &b).silu() + &r,
                ),
                (
                    "every activation",
                    Epilogue::new().relu().tanh().sigmoid().gelu_erf(),
                    x.matmul(&w).relu().tanh().sigmoid().gelu_erf(),
                ),
                (
                    "norm then bias",
                    Epilogue::new().layer_norm(eps).add(&b),
                    x.matmul(&w).layer_norm(eps) + &b,
                ),
                (
                    "rms norm, softmax, log-softmax",
                    Epilogue::new()
                        .rms_norm(eps)
                        .softmax()
                        .add(&r)
                        .log_softmax(),
                    (x.matmul(&w).rms_norm(eps).softmax(-1) + &r).log_softmax(-1),
                ),
            ];
            for (what, epilogue, unfused) in cases {
                let fused = x.matmul_with(&w, epilogue);
                assert_fully_written(what, &fused);
                let same = fused
                    .as_slice()
                    .iter()
                    .zip(unfused.as_slice())
                    .all(|(a, b)| a.to_bits_u64() == b.to_bits_u64());
                assert!(
                    same && fused.shape() == unfused.shape(),
                    "{what}, {lead:?} x [{k}, {n}]: the fused product differs from the ops"
                );
            }
        });
    }
}

/// Bit patterns, to compare NaN-free results exactly.
trait Bits {
    fn to_bits_u64(self) -> u64;
}
impl<T: Element> Bits for T {
    fn to_bits_u64(self) -> u64 {
        self.to_f64().to_bits()
    }
}

#[test]
fn every_epilogue_gives_the_bits_of_the_ops_it_stands_for() {
    check_every_epilogue_matches_the_ops::<f32>();
    check_every_epilogue_matches_the_ops::<f64>();
}

#[test]
fn operands_the_pass_cannot_read_run_as_the_ops() {
    let pool = test_pool(64);
    pool.scope(|s| {
        let [x, w, b, _] = operands::<f32>(s, &[6], (8, 4));
        // A column broadcast over the rows, a batch of right matrices, and f16 operands.
        let column = s.randn::<f32>(&[6, 1], 5);
        let fused = x.matmul_with(&w, Epilogue::new().add(&column).gelu());
        assert_eq!(fused.to_vec(), (x.matmul(&w) + &column).gelu().to_vec());
        let batch = s.randn::<f32>(&[2, 8, 4], 6);
        let fused = x.matmul_with(&batch, Epilogue::new().add(&b));
        assert_eq!(fused.shape(), &[2, 6, 4]);
        assert_eq!(fused.to_vec(), (x.matmul(&batch) + &b).to_vec());
        let (xh, wh) = (x.cast::<tensorscope::f16>(), w.cast::<tensorscope::f16>());
        let fused = xh.matmul_with(&wh, Epilogue::new().relu());
        assert_eq!(fused.to_vec(), xh.matmul(&wh).relu().to_vec());
    });
}

#[test]
fn the_fused_pass_rents_the_output_alone() {
    let pool = test_pool(64);
    let w = pool.scope(|s| s.randn::<f32>(&[64, 32], 1).detach());
    let b = pool.scope(|s| s.randn::<f32>(&[32], 2).detach());
    let rents = || {
        let stats = pool.stats();
        stats.hits + stats.misses
    };
    pool.scope(|s| {
        let x = s.randn::<f32>(&[100, 64], 3);
        let r = s.randn::<f32>(&[100, 32], 4);
        let before = rents();
        drop(x.matmul_with(&w, Epilogue::new().add(&b).add(&r).gelu().layer_norm(1e-5)));
        // `b` is bound into the scope without a copy: the output is the one rent.
        assert_eq!(rents() - before, 1, "one output, no temporaries");
    });
}

#[test]
fn errors_are_the_ops_errors() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3]);
        let w = s.zeros::<f32>(&[4, 5]);
        let err = x.try_matmul_with(&w, Epilogue::new().gelu()).unwrap_err();
        assert_eq!(err.to_string(), x.try_matmul(&w).unwrap_err().to_string());
        let w = s.zeros::<f32>(&[3, 5]);
        let bad = s.zeros::<f32>(&[4]);
        let err = x
            .try_matmul_with(&w, Epilogue::new().add(&bad))
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("add: incompatible shapes [2, 5] and [4]"),
            "{err}"
        );
        let mut many = Epilogue::new();
        for _ in 0..9 {
            many = many.relu();
        }
        let err = x.try_matmul_with(&w, many).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    op: "matmul_with",
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(
            panic_message(|| drop(x.matmul_with(&s.zeros::<f32>(&[2, 2]), Epilogue::new()))),
            x.try_matmul(&s.zeros::<f32>(&[2, 2]))
                .unwrap_err()
                .to_string()
        );
    });
}

#[test]
fn the_output_lives_in_the_deepest_operand_scope() {
    let pool = test_pool(16);
    let w = pool.scope(|s| s.ones::<f32>(&[3, 2]).detach());
    pool.scope(|outer| {
        let x = outer.ones::<f32>(&[4, 3]);
        let (_, inner) = outer.scope_with_stats(|s| {
            let r = s.ones::<f32>(&[4, 2]);
            let y = x.matmul_with(&w, Epilogue::new().add(&r));
            assert_eq!(y.to_vec(), vec![4.0; 8]);
        });
        // The residual's scope rented it and the output.
        assert_eq!((inner.rented, inner.released), (2, 2));
    });
}

#[test]
fn training_through_a_fused_product_gives_the_graph_of_the_ops() {
    let pool = test_pool(64);
    let (w, b) = pool.scope(|s| {
        (
            s.randn::<f64>(&[5, 4], 1).detach(),
            s.randn::<f64>(&[4], 2).detach(),
        )
    });
    let grads = |fused: bool| {
        pool.train(|s| {
            let x = s.randn::<f64>(&[3, 5], 3);
            let r = s.randn::<f64>(&[3, 4], 4);
            let y = if fused {
                x.matmul_with(&w, Epilogue::new().add(&b).gelu().add(&r).layer_norm(1e-5))
            } else {
                ((x.matmul(&w) + &b).gelu() + &r).layer_norm(1e-5)
            };
            let g = (&y * &y).sum_all().backward().unwrap();
            (g.get(&w).unwrap().to_vec(), g.get(&b).unwrap().to_vec())
        })
    };
    assert_eq!(grads(true), grads(false));
    let (gw, _) = grads(true);
    assert!(gw.iter().any(|&g| g != 0.0));
}
