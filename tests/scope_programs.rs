//! Random programs through the real scope API, against a model of what must be true after every
//! step: nested scopes, rents of random shapes and element types, clones, drops, escapes, detaches,
//! panics inside scopes and over-budget rents.
//!
//! Checked after every step: the pool's bytes in use equal the bytes of the distinct live buffers
//! (aliases counted once); every rent was a hit or a miss and every freed buffer a return; no two live
//! tensors share a buffer unless one is an alias of the other (each buffer holds its own value, read
//! back); every scope's counters balance when it ends. After the outermost scope, the bytes in use are
//! exactly those of the parameters that detaching made (moved buffers, or copies of shared ones).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use tensorscope::{bf16, f16, Error, Param, Pool, PoolConfig, Scope, Tensor};

#[derive(Debug, Clone)]
enum Op {
    Rent { shape: Vec<usize>, ty: u8 },
    Clone(usize),
    Drop(usize),
    Push,
    Pop { escape: Vec<usize> },
    Detach(usize),
    PanicInChild { rents: usize },
    OverBudget,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::collection::vec(0usize..6, 0..3), 0u8..4).prop_map(|(shape, ty)| Op::Rent { shape, ty }),
        2 => any::<usize>().prop_map(Op::Clone),
        3 => any::<usize>().prop_map(Op::Drop),
        2 => Just(Op::Push),
        2 => prop::collection::vec(any::<usize>(), 0..3).prop_map(|escape| Op::Pop { escape }),
        1 => any::<usize>().prop_map(Op::Detach),
        1 => (0usize..4).prop_map(|rents| Op::PanicInChild { rents }),
        1 => Just(Op::OverBudget),
    ]
}

/// A live tensor of any element type, with the id of its buffer (shared by aliases).
enum Any<'s> {
    F32(Tensor<'s, f32>),
    F64(Tensor<'s, f64>),
    F16(Tensor<'s, f16>),
    Bf16(Tensor<'s, bf16>),
}

struct Live<'s> {
    tensor: Any<'s>,
    buffer: u32,
}

impl<'s> Live<'s> {
    fn alias(&self) -> Live<'s> {
        let tensor = match &self.tensor {
            Any::F32(t) => Any::F32(t.clone()),
            Any::F64(t) => Any::F64(t.clone()),
            Any::F16(t) => Any::F16(t.clone()),
            Any::Bf16(t) => Any::Bf16(t.clone()),
        };
        Live {
            tensor,
            buffer: self.buffer,
        }
    }

    fn allocated(&self) -> usize {
        match &self.tensor {
            Any::F32(t) => t.allocated_bytes(),
            Any::F64(t) => t.allocated_bytes(),
            Any::F16(t) => t.allocated_bytes(),
            Any::Bf16(t) => t.allocated_bytes(),
        }
    }

    /// Every element still holds this buffer's value (small ids are exact in every type).
    fn intact(&self) -> bool {
        let v = f64::from(self.buffer % 200);
        match &self.tensor {
            Any::F32(t) => t.as_slice().iter().all(|&x| f64::from(x) == v),
            Any::F64(t) => t.as_slice().iter().all(|&x| x == v),
            Any::F16(t) => t.as_slice().iter().all(|&x| x.to_f64() == v),
            Any::Bf16(t) => t.as_slice().iter().all(|&x| x.to_f64() == v),
        }
    }
}

/// A detached tensor: a parameter of any element type, with its buffer's id and the value it holds.
enum AnyParam {
    F32(Param<f32>),
    F64(Param<f64>),
    F16(Param<f16>),
    Bf16(Param<bf16>),
}

struct Kept {
    param: AnyParam,
    buffer: u32,
    value: u32,
}

impl Kept {
    fn allocated(&self) -> usize {
        match &self.param {
            AnyParam::F32(p) => p.allocated_bytes(),
            AnyParam::F64(p) => p.allocated_bytes(),
            AnyParam::F16(p) => p.allocated_bytes(),
            AnyParam::Bf16(p) => p.allocated_bytes(),
        }
    }

    fn intact(&self) -> bool {
        let v = f64::from(self.value % 200);
        match &self.param {
            AnyParam::F32(p) => p.as_slice().iter().all(|&x| f64::from(x) == v),
            AnyParam::F64(p) => p.as_slice().iter().all(|&x| x == v),
            AnyParam::F16(p) => p.as_slice().iter().all(|&x| x.to_f64() == v),
            AnyParam::Bf16(p) => p.as_slice().iter().all(|&x| x.to_f64() == v),
        }
    }
}

/// What the model tracks across the whole program.
struct World {
    pool: Pool,
    next_buffer: u32,
    /// Non-empty rents made, and buffers freed (each distinct buffer once).
    rents: u64,
    detached: Vec<Kept>,
}

impl World {
    fn rent<'s>(&mut self, s: &'s Scope<'_>, shape: &[usize], ty: u8) -> Live<'s> {
        self.next_buffer += 1;
        let id = self.next_buffer;
        let v = f64::from(id % 200);
        let tensor = match ty {
            0 => Any::F32(s.full(shape, v as f32)),
            1 => Any::F64(s.full(shape, v)),
            2 => Any::F16(s.full(shape, f16::from_f64(v))),
            _ => Any::Bf16(s.full(shape, bf16::from_f64(v))),
        };
        let live = Live { tensor, buffer: id };
        if live.allocated() > 0 {
            self.rents += 1;
        }
        live
    }
}

fn check(world: &World, stack: &[&Vec<Live<'_>>]) {
    let mut seen = HashMap::new();
    for lives in stack {
        for l in lives.iter() {
            seen.insert(l.buffer, l.allocated());
            assert!(
                l.intact(),
                "buffer {} was overwritten by another tensor",
                l.buffer
            );
        }
    }
    for k in &world.detached {
        seen.insert(k.buffer, k.allocated());
        assert!(k.intact());
    }
    let stats = world.pool.stats();
    assert_eq!(
        stats.bytes_in_use,
        seen.values().sum::<usize>(),
        "bytes in use"
    );
    assert_eq!(
        stats.hits + stats.misses,
        world.rents,
        "every rent a hit or a miss"
    );
    let alive = seen.values().filter(|&&b| b > 0).count() as u64;
    assert_eq!(
        stats.returns,
        world.rents - alive,
        "every freed buffer returned"
    );
}

/// Runs ops in scope `s` until a `Pop`; returns the escaped tensors (already re-branded).
fn run<'p, 's>(
    s: &'s Scope<'p>,
    ops: &mut std::slice::Iter<'_, Op>,
    world: &mut World,
    outer: &[&Vec<Live<'_>>],
) -> Vec<Live<'p>>
where
    'p: 's,
{
    let mut lives: Vec<Live<'s>> = Vec::new();
    while let Some(op) = ops.next() {
        let pick = |i: usize, len: usize| (len > 0).then(|| i % len);
        match op {
            Op::Rent { shape, ty } => {
                let l = world.rent(s, shape, *ty);
                lives.push(l);
            }
            Op::Clone(i) => {
                if let Some(i) = pick(*i, lives.len()) {
                    let alias = lives[i].alias();
                    lives.push(alias);
                }
            }
            Op::Drop(i) => {
                if let Some(i) = pick(*i, lives.len()) {
                    lives.swap_remove(i);
                }
            }
            Op::Detach(i) => {
                if let Some(i) = pick(*i, lives.len()) {
                    let l = lives.swap_remove(i);
                    // The only handle moves its buffer into the parameter; a shared one is copied
                    // into a new buffer (a rent of its own).
                    let shared = outer
                        .iter()
                        .flat_map(|v| v.iter())
                        .chain(&lives)
                        .any(|o| o.buffer == l.buffer);
                    let allocated = l.allocated();
                    let param = match l.tensor {
                        Any::F32(t) => AnyParam::F32(t.detach()),
                        Any::F64(t) => AnyParam::F64(t.detach()),
                        Any::F16(t) => AnyParam::F16(t.detach()),
                        Any::Bf16(t) => AnyParam::Bf16(t.detach()),
                    };
                    let buffer = if shared {
                        world.next_buffer += 1;
                        world.rents += u64::from(allocated > 0);
                        world.next_buffer
                    } else {
                        l.buffer
                    };
                    world.detached.push(Kept {
                        param,
                        buffer,
                        value: l.buffer,
                    });
                }
            }
            Op::Push => {
                let mut stack: Vec<&Vec<Live<'_>>> = outer.to_vec();
                stack.push(&lives);
                let (escaped, stats) = s.scope_with_stats(|inner| run(inner, ops, world, &stack));
                assert_eq!(
                    stats.rented + stats.adopted,
                    stats.released + stats.escaped + stats.leaked
                );
                assert_eq!(stats.leaked, 0, "{stats:?}");
                lives.extend(escaped);
            }
            Op::Pop { escape } => {
                let mut out = Vec::new();
                for &i in escape {
                    if let Some(i) = pick(i, lives.len()) {
                        out.push(lives.swap_remove(i));
                    }
                }
                // Re-brand for the parent: escape each tensor, keep its buffer id.
                return out
                    .into_iter()
                    .map(|l| {
                        let tensor = match l.tensor {
                            Any::F32(t) => Any::F32(s.escape(t)),
                            Any::F64(t) => Any::F64(s.escape(t)),
                            Any::F16(t) => Any::F16(s.escape(t)),
                            Any::Bf16(t) => Any::Bf16(s.escape(t)),
                        };
                        Live {
                            tensor,
                            buffer: l.buffer,
                        }
                    })
                    .collect();
            }
            Op::PanicInChild { rents } => {
                let before = world.pool.stats().bytes_in_use;
                let mut made = 0u64;
                let caught = catch_unwind(AssertUnwindSafe(|| {
                    s.scope(|inner| {
                        for k in 0..*rents {
                            made +=
                                u64::from(inner.full::<f32>(&[k + 1], 1.0).allocated_bytes() > 0);
                        }
                        panic!("fault injected in a child scope");
                    })
                }));
                assert!(caught.is_err());
                world.rents += made;
                assert_eq!(
                    world.pool.stats().bytes_in_use,
                    before,
                    "the panic returned every buffer"
                );
            }
            Op::OverBudget => {
                let before = world.pool.stats();
                let err = s.try_rent::<f32>(&[1 << 30]).unwrap_err();
                assert!(matches!(err, Error::BudgetExceeded { .. }), "{err}");
                let after = world.pool.stats();
                assert_eq!(after.failed_rents, before.failed_rents + 1);
                assert_eq!(after.bytes_in_use, before.bytes_in_use);
            }
        }
        let mut stack: Vec<&Vec<Live<'_>>> = outer.to_vec();
        stack.push(&lives);
        check(world, &stack);
    }
    Vec::new()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn random_scope_programs_keep_every_invariant(ops in prop::collection::vec(op(), 1..80)) {
        let pool = Pool::new(PoolConfig::with_max_bytes(1 << 20));
        let mut world = World { pool: pool.clone(), next_buffer: 0, rents: 0, detached: Vec::new() };
        let mut iter = ops.iter();
        let ((), stats) = pool.scope_with_stats(|s| {
            // What the outermost scope escapes stays its own (it has no parent scope), and drops here.
            drop(run(s, &mut iter, &mut world, &[]));
        });
        prop_assert_eq!(stats.leaked, 0);
        check(&world, &[]);
        let detached_bytes: usize = {
            let seen: HashMap<u32, usize> =
                world.detached.iter().map(|k| (k.buffer, k.allocated())).collect();
            seen.values().sum()
        };
        prop_assert_eq!(pool.stats().bytes_in_use, detached_bytes);
        world.detached.clear();
        prop_assert_eq!(pool.stats().bytes_in_use, 0);
    }
}
