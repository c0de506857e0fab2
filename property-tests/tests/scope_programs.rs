//! Random programs through the real scope API, against a model of what must be true after every
//! step: nested scopes, rents of random shapes and element types, clones, drops, escapes, detaches,
//! by-value ops (in place when nothing else holds the buffer), panics inside scopes and over-budget
//! rents; and gradient graphs: tensors marked for a gradient, recorded ops that save their inputs or
//! outputs, graphs escaping with their tensors, backward passes that release what was saved.
//!
//! Checked after every step: the pool's bytes in use equal the bytes of the distinct buffers held by
//! live tensors and by the saved tensors of live graphs (aliases counted once); every rent was a hit
//! or a miss and every freed buffer a return; no two live tensors share a buffer unless one is an
//! alias of the other (each buffer holds its own value, read back); every scope's counters balance
//! when it ends. After the outermost scope, the bytes in use are exactly those of the parameters that
//! detaching made (moved buffers, or copies of shared ones).

use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use tensorscope::{bf16, f16, Error, Param, Pool, PoolConfig, Scope, Tensor, TensorOps};

#[derive(Debug, Clone)]
enum Op {
    Rent {
        shape: Vec<usize>,
        ty: u8,
    },
    Clone(usize),
    Drop(usize),
    Push,
    Pop {
        escape: Vec<usize>,
    },
    Detach(usize),
    PanicInChild {
        rents: usize,
    },
    OverBudget,
    /// `t + 1` by value: in place if no other handle (alias or saved tensor) holds the buffer.
    AddOne(usize),
    /// An f32 tensor marked as needing a gradient.
    Mark(usize),
    /// `t * t` (saves `t` twice) or `relu(t)` (saves its output) of an f32 tensor.
    Record {
        i: usize,
        square: bool,
    },
    /// Backward from the sum of an f32 tensor that carries a graph.
    Backward(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Half of the rents f32, the type that graphs are recorded on here.
        4 => (prop::collection::vec(0usize..6, 0..3), prop_oneof![3 => Just(0u8), 1 => 1u8..4])
            .prop_map(|(shape, ty)| Op::Rent { shape, ty }),
        2 => any::<usize>().prop_map(Op::Clone),
        3 => any::<usize>().prop_map(Op::Drop),
        2 => Just(Op::Push),
        2 => prop::collection::vec(any::<usize>(), 0..3).prop_map(|escape| Op::Pop { escape }),
        1 => any::<usize>().prop_map(Op::Detach),
        1 => (0usize..4).prop_map(|rents| Op::PanicInChild { rents }),
        1 => Just(Op::OverBudget),
        2 => any::<usize>().prop_map(Op::AddOne),
        3 => any::<usize>().prop_map(Op::Mark),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(i, square)| Op::Record { i, square }),
        1 => any::<usize>().prop_map(Op::Backward),
    ]
}

/// A live tensor of any element type, with the id of its buffer (shared by aliases).
enum Any<'s> {
    F32(Tensor<'s, f32>),
    F64(Tensor<'s, f64>),
    F16(Tensor<'s, f16>),
    Bf16(Tensor<'s, bf16>),
}

/// A live tensor: its buffer's id, the value every element holds, and its graph node (an index
/// into [`World::nodes`]), if it carries a graph.
struct Live<'s> {
    tensor: Any<'s>,
    buffer: u32,
    value: f64,
    node: Option<usize>,
}

impl<'s> Live<'s> {
    fn alias(&self) -> Live<'s> {
        let tensor = match &self.tensor {
            Any::F32(t) => Any::F32(t.clone()),
            Any::F64(t) => Any::F64(t.clone()),
            Any::F16(t) => Any::F16(t.clone()),
            Any::Bf16(t) => Any::Bf16(t.clone()),
        };
        Live { tensor, ..*self }
    }

    fn is_f32(&self) -> bool {
        matches!(self.tensor, Any::F32(_))
    }

    fn allocated(&self) -> usize {
        match &self.tensor {
            Any::F32(t) => t.allocated_bytes(),
            Any::F64(t) => t.allocated_bytes(),
            Any::F16(t) => t.allocated_bytes(),
            Any::Bf16(t) => t.allocated_bytes(),
        }
    }

    /// Every element still holds the tensor's value (small whole numbers, exact in every type).
    fn intact(&self) -> bool {
        let v = self.value;
        match &self.tensor {
            Any::F32(t) => t.view().iter().all(|&x| f64::from(x) == v),
            Any::F64(t) => t.view().iter().all(|&x| x == v),
            Any::F16(t) => t.view().iter().all(|&x| x.to_f64() == v),
            Any::Bf16(t) => t.view().iter().all(|&x| x.to_f64() == v),
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
    value: f64,
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
        let v = self.value;
        match &self.param {
            AnyParam::F32(p) => p.as_slice().iter().all(|&x| f64::from(x) == v),
            AnyParam::F64(p) => p.as_slice().iter().all(|&x| x == v),
            AnyParam::F16(p) => p.as_slice().iter().all(|&x| x.to_f64() == v),
            AnyParam::Bf16(p) => p.as_slice().iter().all(|&x| x.to_f64() == v),
        }
    }
}

/// A node of a gradient graph as the model sees it: the buffers its rule saved, its inputs'
/// nodes (none for a marked tensor, a leaf), and whether a backward pass ran its rule (which
/// releases what it saved; a leaf has no rule).
struct Node {
    saves: Vec<u32>,
    inputs: Vec<usize>,
    consumed: bool,
}

/// What the model tracks across the whole program.
struct World {
    pool: Pool,
    next_buffer: u32,
    /// Non-empty rents made, and buffers freed (each distinct buffer once).
    rents: u64,
    detached: Vec<Kept>,
    nodes: Vec<Node>,
    /// The allocated bytes of every buffer made.
    sizes: HashMap<u32, usize>,
}

impl World {
    /// A new buffer id for `live`'s data, counting its rent.
    fn new_buffer(&mut self, allocated: usize) -> u32 {
        self.next_buffer += 1;
        self.rents += u64::from(allocated > 0);
        self.sizes.insert(self.next_buffer, allocated);
        self.next_buffer
    }

    fn rent<'s>(&mut self, s: &Scope<'s, '_>, shape: &[usize], ty: u8) -> Live<'s> {
        // Small whole numbers: exact in every type after the additions a program can make.
        let v = f64::from((self.next_buffer + 1) % 50);
        let tensor = match ty {
            0 => Any::F32(s.full(shape, v as f32)),
            1 => Any::F64(s.full(shape, v)),
            2 => Any::F16(s.full(shape, f16::from_f64(v))),
            _ => Any::Bf16(s.full(shape, bf16::from_f64(v))),
        };
        let mut live = Live {
            tensor,
            buffer: 0,
            value: v,
            node: None,
        };
        live.buffer = self.new_buffer(live.allocated());
        live
    }

    fn node(&mut self, saves: Vec<u32>, inputs: Vec<usize>) -> Option<usize> {
        self.nodes.push(Node {
            saves,
            inputs,
            consumed: false,
        });
        Some(self.nodes.len() - 1)
    }

    /// The nodes reachable from `roots`.
    fn reachable(&self, roots: impl IntoIterator<Item = usize>) -> HashSet<usize> {
        let mut seen = HashSet::new();
        let mut pending: Vec<usize> = roots.into_iter().collect();
        while let Some(n) = pending.pop() {
            if seen.insert(n) {
                pending.extend(&self.nodes[n].inputs);
            }
        }
        seen
    }

    /// The buffers that the live tensors' graphs keep through saved tensors.
    fn saved(&self, stack: &[&Vec<Live<'_>>]) -> HashSet<u32> {
        let roots = stack.iter().flat_map(|v| v.iter()).filter_map(|l| l.node);
        self.reachable(roots)
            .into_iter()
            .filter(|&n| !self.nodes[n].consumed)
            .flat_map(|n| self.nodes[n].saves.iter().copied())
            .collect()
    }

    /// Whether a handle other than `live` holds its buffer: an alias on the stack or a saved tensor
    /// of a live graph (`live`'s own included).
    fn shared(&self, live: &Live<'_>, stack: &[&Vec<Live<'_>>]) -> bool {
        let aliases = stack
            .iter()
            .flat_map(|v| v.iter())
            .filter(|o| o.buffer == live.buffer)
            .count();
        aliases > 1 || self.saved(stack).contains(&live.buffer)
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
    for b in world.saved(stack) {
        seen.insert(b, world.sizes[&b]);
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
    s: &Scope<'s, 'p>,
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
                    // The only handle moves its buffer into the parameter; a shared one is copied
                    // into a new buffer (a rent of its own).
                    let shared = world.shared(&lives[i], &with(outer, &lives));
                    let l = lives.swap_remove(i);
                    let allocated = l.allocated();
                    let param = match l.tensor {
                        Any::F32(t) => AnyParam::F32(t.detach()),
                        Any::F64(t) => AnyParam::F64(t.detach()),
                        Any::F16(t) => AnyParam::F16(t.detach()),
                        Any::Bf16(t) => AnyParam::Bf16(t.detach()),
                    };
                    let buffer = if shared {
                        world.new_buffer(allocated)
                    } else {
                        l.buffer
                    };
                    world.detached.push(Kept {
                        param,
                        buffer,
                        value: l.value,
                    });
                }
            }
            Op::AddOne(i) => {
                if let Some(i) = pick(*i, lives.len()) {
                    // By value: written in place unless another handle holds the buffer, such as a
                    // tensor a graph saved, whose value must not change under it.
                    let shared = world.shared(&lives[i], &with(outer, &lives));
                    let l = lives.swap_remove(i);
                    let allocated = l.allocated();
                    let (tensor, value) = match l.tensor {
                        Any::F32(t) => (Any::F32(t + 1.0), f64::from(l.value as f32 + 1.0)),
                        Any::F64(t) => (Any::F64(t + 1.0), l.value + 1.0),
                        Any::F16(t) => (Any::F16(t + f16::ONE), l.value + 1.0),
                        Any::Bf16(t) => (Any::Bf16(t + bf16::ONE), l.value + 1.0),
                    };
                    let buffer = if shared {
                        world.new_buffer(allocated)
                    } else {
                        l.buffer
                    };
                    let node = l.node.and_then(|n| world.node(Vec::new(), vec![n]));
                    lives.push(Live {
                        tensor,
                        buffer,
                        value,
                        node,
                    });
                }
            }
            Op::Mark(i) => {
                if let Some(i) = pick(*i, lives.len()).filter(|&i| lives[i].is_f32()) {
                    let l = lives.swap_remove(i);
                    let Any::F32(t) = l.tensor else {
                        unreachable!("picked an f32 tensor")
                    };
                    lives.push(Live {
                        tensor: Any::F32(t.requires_grad()),
                        node: world.node(Vec::new(), Vec::new()),
                        ..l
                    });
                }
            }
            Op::Record { i, square } => {
                if let Some(i) = pick(*i, lives.len()).filter(|&i| lives[i].is_f32()) {
                    let l = &lives[i];
                    let Any::F32(t) = &l.tensor else {
                        unreachable!("picked an f32 tensor")
                    };
                    let (out, value) = if *square {
                        (t * t, f64::from((l.value as f32) * (l.value as f32)))
                    } else {
                        (t.relu(), l.value) // values are never negative
                    };
                    let out = Live {
                        tensor: Any::F32(out),
                        buffer: 0,
                        value,
                        node: None,
                    };
                    let buffer = world.new_buffer(out.allocated());
                    // Ops record only from an input that carries a graph: `t * t` saves `t` twice,
                    // relu saves its output.
                    let node = match l.node {
                        Some(n) if *square => world.node(vec![l.buffer, l.buffer], vec![n, n]),
                        Some(n) => world.node(vec![buffer], vec![n]),
                        None => None,
                    };
                    lives.push(Live {
                        buffer,
                        node,
                        ..out
                    });
                }
            }
            Op::Backward(i) => {
                let picked = pick(*i, lives.len()).filter(|&i| lives[i].is_f32());
                if let Some((i, root)) = picked.and_then(|i| Some((i, lives[i].node?))) {
                    // The ops' nodes: leaves have no rule to run.
                    let graph: Vec<usize> = world
                        .reachable([root])
                        .into_iter()
                        .filter(|&n| !world.nodes[n].inputs.is_empty())
                        .collect();
                    let Any::F32(t) = &lives[i].tensor else {
                        unreachable!("picked an f32 tensor")
                    };
                    let before = world.pool.stats();
                    let loss = t.try_reshape(&[t.len()]).unwrap().try_sum(0).unwrap();
                    let result = loss.backward().map(drop);
                    drop(loss);
                    let after = world.pool.stats();
                    world.rents += (after.hits + after.misses) - (before.hits + before.misses);
                    if graph.iter().all(|&n| !world.nodes[n].consumed) {
                        result.unwrap();
                        // Every rule ran and released what it saved.
                        graph
                            .into_iter()
                            .for_each(|n| world.nodes[n].consumed = true);
                    } else {
                        // The root's rule or one under it ran before. `backward` checks the whole
                        // graph before running any rule, so the pass fails having run none of the
                        // graph's rules (only the sum's and the reshape's, made here and dropped
                        // with the loss): every rule not yet run still holds what it saved. (Only
                        // a budget error could stop a pass halfway, and these programs stay far
                        // below the budget.)
                        assert!(matches!(result, Err(Error::GraphConsumed)), "{result:?}");
                    }
                }
            }
            Op::Push => {
                let stack = with(outer, &lives);
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
                            value: l.value,
                            node: l.node,
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
        check(world, &with(outer, &lives));
    }
    Vec::new()
}

/// The scopes' tensors from the outermost to `lives`.
fn with<'a, 'l>(outer: &[&'a Vec<Live<'l>>], lives: &'a Vec<Live<'l>>) -> Vec<&'a Vec<Live<'l>>> {
    let mut stack = outer.to_vec();
    stack.push(lives);
    stack
}

/// Runs `ops` in a fresh pool's outermost scope, checking every invariant after each op and the
/// pool's accounting at the end; the count of tensors the outermost scope escaped (they drop with
/// it, having no parent scope).
fn run_program(ops: &[Op]) -> Result<usize, TestCaseError> {
    let pool = Pool::new(PoolConfig::with_max_bytes(1 << 20));
    let mut world = World {
        pool: pool.clone(),
        next_buffer: 0,
        rents: 0,
        detached: Vec::new(),
        nodes: Vec::new(),
        sizes: HashMap::new(),
    };
    let mut iter = ops.iter();
    let (escaped, stats) = pool.scope_with_stats(|s| run(s, &mut iter, &mut world, &[]).len());
    prop_assert_eq!(stats.leaked, 0);
    check(&world, &[]);
    let detached_bytes: usize = {
        let seen: HashMap<u32, usize> = world
            .detached
            .iter()
            .map(|k| (k.buffer, k.allocated()))
            .collect();
        seen.values().sum()
    };
    prop_assert_eq!(pool.stats().bytes_in_use, detached_bytes);
    world.detached.clear();
    prop_assert_eq!(pool.stats().bytes_in_use, 0);
    Ok(escaped)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_scope_programs_keep_every_invariant(ops in prop::collection::vec(op(), 1..80)) {
        run_program(&ops)?;
    }
}

/// A backward refused because part of its graph was differentiated before runs no rule, so the
/// rules not yet run keep what they saved: here `r * r` keeps `r` after `r` itself is dropped.
/// (The model once marked the whole graph consumed on such a pass; seed `cc 8c26e2...`.)
#[test]
fn a_refused_backward_keeps_what_unrun_rules_saved() {
    use Op::*;
    let ops = [
        Rent {
            shape: vec![],
            ty: 0,
        },
        Mark(0),
        // r = relu(x) saves r; s = r * r saves r twice.
        Record {
            i: 0,
            square: false,
        },
        Record { i: 1, square: true },
        // Runs relu's rule (releasing its alias of r), then fails on s's graph before running
        // s's rule; twice, to check nothing changed.
        Backward(1),
        Backward(2),
        Backward(2),
        // r's last handle outside the graph: s's rule still holds it.
        Drop(1),
        Pop { escape: vec![] },
    ];
    assert_eq!(run_program(&ops).unwrap(), 0, "the program escapes nothing");
}
