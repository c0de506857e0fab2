//! Random programs of parameter writes, forwards, backward passes and optimizer steps against a
//! model of parameter versions (PyTorch's `_version`): a handle's version is kept by its clones
//! until one is written, and every write (in place, by copy on write, an optimizer's update) makes
//! a new one. Checked after every step:
//!
//! - a backward adding into a `Gradients` that holds another version of one of its parameters, or
//!   using two versions of one parameter itself, is `ParamUsedWithTwoValues` and adds nothing;
//! - an optimizer step given a gradient of another version than the parameter holds is
//!   `StaleGradient`, and one given a set holding two handles of one parameter with different
//!   values is `ParamListedTwice`; a refused step changes no value, no version and no buffer
//!   (handles that shared one still do); two handles with the same values are a tie, updated
//!   once, the later given the first's data;
//! - otherwise every handle holds the values the model predicts, and the gradients their sums.
//!
//! Forwards use the parameters through `add`, which saves nothing of them (a later write is in
//! place), or `mul`, which saves them (a later write copies first): the versions behave the same.

use proptest::prelude::*;
use tensorscope::nn::{NnError, Optimizer, Sgd};
use tensorscope::{Error, Gradients, Param, Pool, Scope, Tensor};

#[derive(Debug, Clone)]
enum Op {
    /// A clone of handle `i`.
    Clone(usize),
    /// Adds 1 to every element of handle `i` through `view_mut`.
    Write(usize),
    /// A loss summing the handles `uses` (through `add` or `mul`), then, after writing the handles
    /// `between`, a backward into the gradients.
    Backward {
        uses: Vec<usize>,
        mul: bool,
        between: Vec<usize>,
    },
    /// Zeroes the gradients.
    Zero,
    /// An SGD step (learning rate 1) over the handles `set`.
    Step(Vec<usize>),
}

fn op() -> impl Strategy<Value = Op> {
    let handles = || prop::collection::vec(any::<usize>(), 1..3);
    prop_oneof![
        2 => any::<usize>().prop_map(Op::Clone),
        2 => any::<usize>().prop_map(Op::Write),
        4 => (handles(), any::<bool>(), prop::collection::vec(any::<usize>(), 0..2))
            .prop_map(|(uses, mul, between)| Op::Backward { uses, mul, between }),
        1 => Just(Op::Zero),
        3 => handles().prop_map(Op::Step),
    ]
}

/// A handle as the model sees it: which parameter (its key), its version and its value (every
/// element the same).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Handle {
    key: usize,
    version: u64,
    value: f32,
}

/// A parameter's gradient as the model sees it: the sum (every element the same), and the version
/// it was computed from (`None` once zeroed).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Grad {
    sum: f32,
    version: Option<u64>,
}

struct Model {
    handles: Vec<Handle>,
    grads: Vec<Option<Grad>>,
    next_version: u64,
}

impl Model {
    fn write(&mut self, h: usize, by: f32) {
        self.next_version += 1;
        self.handles[h].version = self.next_version;
        self.handles[h].value += by;
    }
}

const LEN: usize = 3;

/// The loss of `forward` for `uses`: the sum over the handles used of `zeros + p` (or `ones * p`).
fn loss<'s>(s: &Scope<'s, '_>, params: &[Param], uses: &[usize], mul: bool) -> Tensor<'s> {
    let mut total = s.zeros::<f32>(&[LEN]);
    for &u in uses {
        let term = if mul {
            s.ones::<f32>(&[LEN]) * &params[u]
        } else {
            s.zeros::<f32>(&[LEN]) + &params[u]
        };
        total = total + &term;
    }
    total.sum_all()
}

fn check(model: &Model, params: &[Param], grads: &Gradients<'_>) {
    for (h, p) in model.handles.iter().zip(params) {
        assert!(
            p.as_slice().iter().all(|&x| x == h.value),
            "{h:?}: {:?}",
            p.to_vec()
        );
    }
    for (key, grad) in model.grads.iter().enumerate() {
        let original = model
            .handles
            .iter()
            .position(|h| h.key == key)
            .expect("kept");
        let got = grads.get(&params[original]).map(|g| g.to_vec());
        assert_eq!(
            got,
            grad.map(|g| vec![g.sum; LEN]),
            "gradient of parameter {key}"
        );
    }
}

proptest! {

    #[test]
    fn versions_decide_which_gradients_apply(ops in prop::collection::vec(op(), 1..40)) {
        let pool = Pool::with_max_memory_mb(16);
        // Two parameters, 0 and 1; handles 0 and 1 are their originals and are never removed.
        let mut params = vec![Param::<f32>::zeros(&pool, &[LEN]), Param::zeros(&pool, &[LEN])];
        let mut model = Model {
            handles: vec![
                Handle { key: 0, version: 1, value: 0.0 },
                Handle { key: 1, version: 2, value: 0.0 },
            ],
            grads: vec![None, None],
            next_version: 2,
        };
        let mut sgd = Sgd::new(1.0f32, 0.0);
        pool.train(|s| {
            let mut grads = Gradients::new(s);
            for op in &ops {
                let count = model.handles.len();
                let pick = |i: usize| i % count;
                match op {
                    Op::Clone(i) => {
                        let i = pick(*i);
                        params.push(params[i].clone());
                        model.handles.push(model.handles[i]);
                    }
                    Op::Write(i) => {
                        let i = pick(*i);
                        params[i].view_mut().mapv_inplace(|x| x + 1.0);
                        model.write(i, 1.0);
                    }
                    Op::Backward { uses, mul, between } => {
                        let uses: Vec<usize> = uses.iter().map(|&u| pick(u)).collect();
                        let loss = loss(s, &params, &uses, *mul);
                        // What the forward read: the handles' versions now.
                        let read: Vec<Handle> = uses.iter().map(|&u| model.handles[u]).collect();
                        for &w in between {
                            let w = pick(w);
                            params[w].view_mut().mapv_inplace(|x| x + 1.0);
                            model.write(w, 1.0);
                        }
                        let result = loss.backward_into(&mut grads);
                        let conflict = read.iter().any(|a| {
                            read.iter().any(|b| a.key == b.key && a.version != b.version)
                                || model.grads[a.key]
                                    .and_then(|g| g.version)
                                    .is_some_and(|v| v != a.version)
                        });
                        if conflict {
                            prop_assert!(
                                matches!(result, Err(Error::ParamUsedWithTwoValues { .. })),
                                "{result:?}"
                            );
                        } else {
                            prop_assert!(result.is_ok(), "{result:?}");
                            for h in &read {
                                let g = model.grads[h.key].get_or_insert(Grad { sum: 0.0, version: None });
                                g.sum += 1.0;
                                g.version = Some(h.version);
                            }
                        }
                    }
                    Op::Zero => {
                        grads.zero().unwrap();
                        for g in model.grads.iter_mut().flatten() {
                            *g = Grad { sum: 0.0, version: None };
                        }
                    }
                    Op::Step(set) => {
                        let mut set: Vec<usize> = set.iter().map(|&i| pick(i)).collect();
                        set.sort_unstable();
                        set.dedup();
                        let shared_before: Vec<bool> = set
                            .iter()
                            .map(|&i| params.iter().enumerate().any(|(j, p)| j != i && p.shares_buffer_with(&params[i])))
                            .collect();
                        let trained: Vec<usize> =
                            set.iter().copied().filter(|&i| model.grads[model.handles[i].key].is_some()).collect();
                        // Two handles of one parameter with different values: the step cannot
                        // tell which to update. With the same values they are a tie.
                        let twice = trained.iter().enumerate().any(|(n, &a)| {
                            trained[..n].iter().any(|&b| {
                                let (a, b) = (model.handles[a], model.handles[b]);
                                a.key == b.key && a.version != b.version
                            })
                        });
                        let stale = trained.iter().any(|&i| {
                            let h = model.handles[i];
                            model.grads[h.key].and_then(|g| g.version).is_some_and(|v| v != h.version)
                        });
                        let mut handles: Vec<&mut Param> = params
                            .iter_mut()
                            .enumerate()
                            .filter(|(i, _)| set.contains(i))
                            .map(|(_, p)| p)
                            .collect();
                        let result = sgd.step(&mut handles, &grads);
                        drop(handles);
                        if twice || stale {
                            prop_assert!(
                                matches!(
                                    result,
                                    Err(NnError::ParamListedTwice { .. })
                                        | Err(NnError::Tensor(Error::StaleGradient { .. }))
                                ),
                                "{result:?}"
                            );
                            // Nothing changed: no copy on write either.
                            for (&i, &shared) in set.iter().zip(&shared_before) {
                                let still = params.iter().enumerate().any(|(j, p)| j != i && p.shares_buffer_with(&params[i]));
                                prop_assert_eq!(still, shared, "handle {} was copied by a refused step", i);
                            }
                        } else {
                            prop_assert!(result.is_ok(), "{result:?}");
                            // Each parameter once, at its first handle in the set; its later
                            // handles are given the first's data.
                            for (n, &i) in trained.iter().enumerate() {
                                let key = model.handles[i].key;
                                match trained[..n].iter().find(|&&f| model.handles[f].key == key) {
                                    Some(&first) => {
                                        model.handles[i] = model.handles[first];
                                        prop_assert!(params[i].shares_buffer_with(&params[first]));
                                    }
                                    None => {
                                        let by = -model.grads[key].expect("trained").sum;
                                        model.write(i, by);
                                    }
                                }
                            }
                        }
                    }
                }
                check(&model, &params, &grads);
            }
            Ok(())
        })?;
    }
}
