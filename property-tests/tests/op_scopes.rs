//! Ops of several tensors from three nested scopes (outer, middle, inner), the middle and inner ones
//! with random byte budgets, against a model of where each output rents and which budgets it
//! counts against. For every op, with its operands taken from random scopes in either order
//! (floats, `u8` masks and `i64` ids alike), and for a `#[dispose_scope]` function of two tensors:
//!
//! - it fails with `ScopeBudgetExceeded` exactly when the deepest operand's scope, or a budgeted
//!   scope around it, would pass its limit with what the op rents (the model sums the live bytes of
//!   each scope and the scopes inside it);
//! - otherwise what it rents is counted in the deepest operand's scope and in no other.

use proptest::prelude::*;
use tensorscope::ops::Cmp;
use tensorscope::prelude::*;
use tensorscope::{DType, Error, Result, ScopeStats};

const ROWS: usize = 64;
const COLS: usize = 16;

#[dispose_scope]
fn combined<'a>(a: &Tensor<'a>, b: &Tensor<'a>) -> Tensor<'a> {
    a + b
}

/// The tensors each scope makes: `[ROWS, COLS]`, `[COLS]`, `[COLS, COLS]` floats, a `[COLS]` mask
/// and `[ROWS / 2]` ids.
struct Operands<'s> {
    big: Tensor<'s>,
    row: Tensor<'s>,
    square: Tensor<'s>,
    mask: Tensor<'s, u8>,
    ids: Tensor<'s, i64>,
}

impl<'s> Operands<'s> {
    fn new(s: &Scope<'s, '_>) -> Self {
        Operands {
            big: s.ones(&[ROWS, COLS]),
            row: s.ones(&[COLS]),
            square: s.ones(&[COLS, COLS]),
            mask: s.ones(&[COLS]),
            ids: s.zeros(&[ROWS / 2]),
        }
    }

    fn bytes(&self) -> usize {
        self.big.allocated_bytes()
            + self.row.allocated_bytes()
            + self.square.allocated_bytes()
            + self.mask.allocated_bytes()
            + self.ids.allocated_bytes()
    }
}

/// The pool bytes (size class) of a tensor of `shape` of `T`.
fn class<T: DType>(shape: &[usize]) -> usize {
    static SCRATCH: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
    let pool = SCRATCH.get_or_init(|| Pool::with_max_memory_mb(16));
    pool.rent::<T>(shape).allocated_bytes()
}

/// The `#[dispose_scope]` function's kind: its result is escaped, so adopted, not rented, by
/// the deepest scope.
const ANNOTATED: u8 = 9;

/// Op `kind` on operands of `a` and `b`, in that order.
fn run<'s>(kind: u8, a: &Operands<'s>, b: &Operands<'s>) -> Result<usize> {
    match kind {
        0 => a.big.try_add(&b.row).map(|t| t.len()),
        1 => a.row.try_add(&b.big).map(|t| t.len()),
        2 => a.big.try_matmul(&b.square).map(|t| t.len()),
        3 => a.big.try_masked_fill(&b.mask, 0.0).map(|t| t.len()),
        4 => a.mask.try_where_cond(&b.big, &a.row).map(|t| t.len()),
        5 => a.big.try_cmp(&b.row, Cmp::Gt).map(|t| t.len()),
        6 => Tensor::try_concat(&[&a.big, &b.big], 0).map(|t| t.len()),
        7 => a.big.try_index_select(0, &b.ids).map(|t| t.len()),
        8 => a.big.try_mse(&b.big).map(|t| t.len()),
        _ => {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                combined(&a.big, &b.big).len()
            }));
            result.map_err(|p| {
                let message = p.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(message.starts_with("scope budget exceeded"), "{message}");
                Error::ScopeBudgetExceeded {
                    requested: 0,
                    in_use: 0,
                    limit: 0,
                }
            })
        }
    }
}

/// What op `kind` holds at its peak, in pool bytes.
fn need(kind: u8) -> usize {
    let big = class::<f32>(&[ROWS, COLS]);
    match kind {
        5 => class::<u8>(&[ROWS, COLS]),
        6 => class::<f32>(&[2 * ROWS, COLS]),
        7 => class::<f32>(&[ROWS / 2, COLS]),
        // The difference, then the value beside it.
        8 => big + class::<f32>(&[]),
        _ => big,
    }
}

proptest! {

    #[test]
    fn ops_of_several_tensors_rent_in_the_deepest_scope_under_its_budgets(
        // Room beyond the scopes' own tensors: none, or up to twice the largest output.
        rooms in prop::collection::vec(prop::option::of(0usize..40_000), 2),
        program in prop::collection::vec((0u8..10, 0usize..3, 0usize..3), 1..12),
    ) {
        let pool = Pool::with_max_memory_mb(64);
        let each = pool.scope(|s| Operands::new(s).bytes());
        // A budget covers its scope's tensors and those of the scopes inside it, plus the room.
        let limits: Vec<Option<usize>> = vec![
            None,
            rooms[0].map(|room| 2 * each + room),
            rooms[1].map(|room| each + room),
        ];
        pool.scope(|outer| {
            let o = Operands::new(outer);
            let in_middle = |middle: &Scope<'_, '_>| {
                let m = Operands::new(middle);
                let in_inner = |inner: &Scope<'_, '_>| {
                    let i = Operands::new(inner);
                    let stats = || [outer.stats(), middle.stats(), inner.stats()];
                    for &(kind, la, lb) in &program {
                        let levels = [&o, &m, &i];
                        let deepest = la.max(lb);
                        // Live bytes of each scope and the scopes inside it: their operands.
                        let fits = (0..=deepest).all(|level| {
                            limits[level].is_none_or(|limit| (3 - level) * each + need(kind) <= limit)
                        });
                        let before = stats();
                        let result = run(kind, levels[la], levels[lb]);
                        let after = stats();
                        if fits {
                            prop_assert!(result.is_ok(), "op {} from {} and {}: {:?}", kind, la, lb, result);
                            for level in 0..3 {
                                let counted = match kind {
                                    ANNOTATED => after[level].adopted - before[level].adopted,
                                    _ => after[level].rented - before[level].rented,
                                };
                                prop_assert_eq!(
                                    counted > 0,
                                    level == deepest,
                                    "op {} from {} and {}: {} buffers in scope {}", kind, la, lb, counted, level
                                );
                            }
                        } else {
                            prop_assert!(
                                matches!(result, Err(Error::ScopeBudgetExceeded { .. })),
                                "op {} from {} and {}: {:?}", kind, la, lb, result
                            );
                        }
                        // Everything the op rented went back (or was never rented).
                        prop_assert_eq!(live(&after), live(&before));
                    }
                    Ok(())
                };
                match limits[2] {
                    Some(limit) => middle.scope_with_budget(limit, in_inner),
                    None => middle.scope(in_inner),
                }
            };
            match limits[1] {
                Some(limit) => outer.scope_with_budget(limit, in_middle),
                None => outer.scope(in_middle),
            }
        })?;
    }
}

/// Live buffers of each scope.
fn live(stats: &[ScopeStats; 3]) -> [u64; 3] {
    stats.map(|s| s.live())
}
