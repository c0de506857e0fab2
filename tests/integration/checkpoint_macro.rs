//! `#[checkpoint]`: both body forms, the three places checkpoints go, policies and precision, and
//! exact recompute from what the annotated forward stored.

use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy};

use crate::common::{assert_all_released_or_escaped, panic_message};

struct Mlp {
    weights: Vec<Param>,
}

impl Mlp {
    fn new(pool: &Pool, n: usize, width: usize) -> Self {
        pool.scope(|s| Mlp {
            weights: (0..n)
                .map(|i| (s.randn::<f32>(&[width, width], i as u64) * 0.2).detach())
                .collect(),
        })
    }

    /// One layer, also used to replay layers from checkpoints.
    fn layer<'s>(&self, x: &Tensor<'s>, i: usize) -> Tensor<'s> {
        (&x.matmul(&self.weights[i]) + x).tanh()
    }

    #[checkpoint(every = 4, replay = "forward_layer")]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for (i, _) in self.weights.iter().enumerate() {
            let h = self.layer(&x, i);
            x = h;
        }
        x
    }

    #[checkpoint(policy = "sqrt", precision = "f16")]
    fn forward_installed<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for i in 0..self.weights.len() {
            x = self.layer(&x, i);
        }
        x
    }

    #[checkpoint(every = 2, saving = "products")]
    fn forward_saving<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for i in 0..self.weights.len() {
            x = self.layer(&x, i);
        }
        x
    }

    fn forward_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        (0..self.weights.len()).fold(x, |x, i| self.layer(&x, i))
    }
}

#[test]
fn saving_products_in_the_attribute_keeps_each_layers_product() {
    let pool = Pool::with_max_memory_mb(64);
    let mlp = Mlp::new(&pool, 8, 4);
    // The checkpointer says nothing is saved; the attribute's option applies.
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
    let grads_of = |ckpt: Option<&mut Checkpointer>| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[3, 4], 9);
            let y = match ckpt {
                Some(ckpt) => mlp.forward_saving(ckpt, x),
                None => mlp.forward_plain(x),
            };
            let grads = y.sum_all().backward().unwrap();
            let all = mlp.weights.iter().map(|w| grads.get(w).unwrap().to_vec());
            all.collect::<Vec<Vec<f32>>>()
        })
    };
    assert_eq!(grads_of(Some(&mut ckpt)), grads_of(None));
    assert_eq!(
        ckpt.config().saving,
        tensorscope::checkpoint::Saving::Products
    );
    let report = ckpt.last_backward().unwrap();
    // Segments of 2, the last one's graph kept: 6 layers replayed, one product each.
    assert_eq!((report.replayed_steps, report.kept_ops), (6, 6));
}

#[test]
fn the_loop_form_stores_the_policy_layers_and_replays_exactly() {
    let pool = Pool::with_max_memory_mb(64);
    let mlp = Mlp::new(&pool, 16, 8);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
    pool.scope(|s| {
        let input = s.randn::<f32>(&[4, 8], 42);
        let y = mlp.forward(&mut ckpt, input.clone());
        assert_eq!(y.to_vec(), mlp.forward_plain(input.clone()).to_vec());
        assert_eq!(ckpt.stored_layers(), vec![0, 4, 8, 12]);
        assert_eq!(
            ckpt.config().policy,
            Policy::Every(4),
            "the attribute's policy applies"
        );
        assert_eq!(ckpt.memory_saved_bytes(), 12 * 4 * 8 * 4);

        // Replay any layer's input from the stored checkpoints: bit-identical.
        let layers: Vec<usize> = (0..16).collect();
        let mut plain = input.clone();
        for i in 0..16 {
            let replayed = ckpt
                .recompute_from_checkpoint(s, i, &layers, |x, l| mlp.layer(x, l))
                .unwrap();
            assert_eq!(replayed.to_vec(), plain.to_vec(), "input of layer {i}");
            plain = mlp.layer(&plain, i);
        }
    });
}

#[test]
fn segments_release_their_temporaries() {
    let pool = Pool::with_max_memory_mb(64);
    let mlp = Mlp::new(&pool, 16, 8);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
    pool.scope(|s| {
        let before = pool.stats().bytes_in_use;
        let y = mlp.forward(&mut ckpt, s.randn::<f32>(&[4, 8], 42));
        let segment = s
            .last_child_stats()
            .expect("the last segment ran in a child scope");
        assert_all_released_or_escaped(segment);
        assert_eq!(segment.escaped, 1, "the output");
        // What stays: the output and the four stored inputs (aliases of forward activations).
        assert_eq!(
            pool.stats().bytes_in_use,
            before + y.allocated_bytes() + 4 * 128,
            "everything else went back to the pool"
        );
    });
}

#[test]
fn the_installed_checkpointer_is_used_without_a_parameter() {
    let pool = Pool::with_max_memory_mb(64);
    let mlp = Mlp::new(&pool, 16, 8);
    let mut ckpt = Checkpointer::<f32>::new(CheckpointConfig::new(Policy::Every(1)));
    pool.scope(|s| {
        let input = s.randn::<f32>(&[4, 8], 1);
        let y = ckpt.install(|| mlp.forward_installed(input.clone()));
        assert_eq!(ckpt.stored_layers(), vec![0, 4, 8, 12], "sqrt(16) = 4");
        assert_eq!(
            ckpt.memory_stored_bytes(),
            4 * 32 * 2,
            "f16: two bytes an element"
        );
        assert_eq!(y.to_vec(), mlp.forward_plain(input.clone()).to_vec());
        // Not installed: the same result, and `ckpt` is left as it was (no forward replanned it).
        let ckpt_before = ckpt.stored_layers();
        let bytes_before = ckpt.memory_stored_bytes();
        assert_eq!(mlp.forward_installed(input.clone()).to_vec(), y.to_vec());
        assert_eq!(
            (ckpt.stored_layers(), ckpt.memory_stored_bytes()),
            (ckpt_before, bytes_before)
        );
    });
}

struct Stack {
    a: Param,
    b: Param,
}

impl Stack {
    #[checkpoint(every = 2, max = 3, replay = "step")]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: &Tensor<'a>) -> Tensor<'a> {
        let x = x * 1.0; // the input of the sequence
        let x = x.matmul(&self.a).relu();
        let x = &x + 1.0;
        let x = x.matmul(&self.b).tanh();
        let x = x.exp();
        let x = x.sum(1);
        x
    }
}

#[test]
fn the_sequence_form_stores_its_policy_layers() {
    let pool = Pool::with_max_memory_mb(64);
    let stack = pool.scope(|s| Stack {
        a: (s.randn::<f32>(&[3, 3], 5) * 0.5).detach(),
        b: (s.randn::<f32>(&[3, 3], 6) * 0.5).detach(),
    });
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Sqrt));
    pool.scope(|s| {
        let x = s.randn::<f32>(&[2, 3], 9);
        let y = stack.forward(&mut ckpt, &x);
        let expected = x.matmul(&stack.a).relu() + 1.0;
        let expected = expected.matmul(&stack.b).tanh().exp().sum(1);
        assert_eq!(y.to_vec(), expected.to_vec());
        assert_eq!(
            ckpt.stored_layers(),
            vec![0, 2, 4],
            "5 layer steps, every 2"
        );
    });
}

impl Stack {
    #[checkpoint(every = 1, max = 2)]
    fn too_many<'a>(&self, ckpt: &mut Checkpointer, x: &Tensor<'a>) -> Tensor<'a> {
        let x = x * 1.0;
        let x = x.relu();
        let x = x.exp();
        let x = x.tanh();
        x
    }
}

#[test]
fn a_checkpointer_error_panics_with_its_message() {
    let pool = Pool::with_max_memory_mb(64);
    let stack = pool.scope(|s| Stack {
        a: s.ones::<f32>(&[1, 1]).detach(),
        b: s.ones::<f32>(&[1, 1]).detach(),
    });
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Sqrt));
    pool.scope(|s| {
        let x = s.ones::<f32>(&[1, 1]);
        assert_eq!(
            panic_message(|| drop(stack.too_many(&mut ckpt, &x))),
            "#[checkpoint]: saving layer 2 would store 3 checkpoints, past the limit of 2"
        );
    });
    assert_eq!(
        pool.stats().bytes_in_use,
        2 * 64,
        "only the two weights remain"
    );
}

#[test]
fn the_generated_replay_drives_recompute_and_the_reverse_sweep() {
    let pool = Pool::with_max_memory_mb(64);
    let mlp = Mlp::new(&pool, 16, 8);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
    pool.scope(|s| {
        let input = s.randn::<f32>(&[4, 8], 3);
        mlp.forward(&mut ckpt, input.clone());
        // The replay is the loop body for one layer: the same as the hand-written layer.
        let mut inputs = Vec::new();
        let mut plain = input.clone();
        for i in 0..16 {
            inputs.push(plain.to_vec());
            let replayed = mlp.forward_layer(&plain, i);
            plain = mlp.layer(&plain, i);
            assert_eq!(replayed.to_vec(), plain.to_vec(), "layer {i}");
        }
        let a13 = ckpt
            .recompute_from_checkpoint(s, 13, &(0..16).collect::<Vec<_>>(), |x, i| {
                mlp.forward_layer(x, i)
            })
            .unwrap();
        assert_eq!(a13.to_vec(), inputs[13]);
        let mut order = Vec::new();
        let report = ckpt
            .reverse(
                s,
                |x, i| mlp.forward_layer(x, i),
                |i, x| {
                    assert_eq!(x.to_vec(), inputs[i], "input of layer {i}");
                    order.push(i);
                },
            )
            .unwrap();
        assert_eq!(order, (0..16).rev().collect::<Vec<_>>());
        assert_eq!(report.recomputed_steps, 16 - 4);
    });
}

#[test]
fn the_sequence_replay_runs_one_let_and_names_the_bad_index() {
    let pool = Pool::with_max_memory_mb(64);
    let stack = pool.scope(|s| Stack {
        a: s.ones::<f32>(&[2, 2]).detach(),
        b: s.ones::<f32>(&[2, 2]).detach(),
    });
    pool.scope(|s| {
        let x = s.full::<f32>(&[1, 2], 0.5);
        assert_eq!(stack.step(&x, 0).to_vec(), vec![1.0, 1.0]); // x.matmul(&a).relu()
        assert_eq!(stack.step(&x, 1).to_vec(), vec![1.5, 1.5]); // &x + 1.0
        assert_eq!(
            panic_message(|| drop(stack.step(&x, 9))),
            "layer 9 is past the last of the 5 layers"
        );
    });
}

/// Less common forms: layers borrowed mutably, several assigned variables, named replays, nested
/// forwards.
mod forms {
    use super::*;

    struct Lin {
        scale: f32,
        calls: usize,
    }

    struct Net {
        layers: Vec<Lin>,
    }

    impl Net {
        /// Layers borrowed mutably (not `Clone`); the iterable reads the activation.
        #[checkpoint(every = 2)]
        fn forward_mut<'a>(&mut self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
            let mut x = x;
            for layer in &mut self.layers {
                layer.calls += 1;
                x = x * layer.scale;
            }
            for _ in 0..x.shape()[0] {
                x = x + 1.0;
            }
            x
        }

        /// Several variables assigned; the activation is the one returned. A non-tensor run of
        /// `let`s comes first.
        #[checkpoint(every = 1, max = 1)]
        fn counted<'a>(&self, input: Tensor<'a>) -> Tensor<'a> {
            let k = 1usize;
            let k = k + 1;
            let mut last = 0;
            let mut h = input;
            for (i, layer) in self.layers.iter().enumerate() {
                last = i + k;
                h = h * layer.scale;
            }
            assert!(last > 0);
            h
        }

        #[checkpoint(every = 2, replay = "layer")]
        fn named<'a>(&self, input: Tensor<'a>) -> Tensor<'a> {
            let mut h = input;
            for layer in &self.layers {
                h = h * layer.scale;
            }
            h
        }
    }

    #[checkpoint(every = 1)]
    fn inner_forward<'a>(x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for _ in 0..3 {
            x = x + 1.0;
        }
        x
    }

    #[checkpoint(every = 2)]
    fn outer_forward<'a>(x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for _ in 0..4 {
            x = inner_forward(x * 2.0);
        }
        x
    }

    fn net() -> Net {
        Net {
            layers: (0..4)
                .map(|i| Lin {
                    scale: 1.0 + i as f32,
                    calls: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn layers_borrowed_mutably_and_an_iterable_that_reads_the_activation() {
        let pool = Pool::with_max_memory_mb(64);
        let mut net = net();
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
        pool.scope(|s| {
            let y = net.forward_mut(&mut ckpt, s.ones::<f32>(&[3]));
            assert_eq!(y.to_vec(), vec![24.0 + 3.0; 3]);
            assert_eq!(net.layers[3].calls, 1);
        });
    }

    #[test]
    fn the_returned_variable_is_the_activation_and_a_limit_without_checkpointer_stores_nothing() {
        let pool = Pool::with_max_memory_mb(64);
        let net = net();
        pool.scope(|s| {
            // `max = 1` with no checkpointer stores nothing, so it does not fail.
            assert_eq!(net.counted(s.ones::<f32>(&[2])).to_vec(), vec![24.0; 2]);
        });
    }

    #[test]
    fn a_named_replay_takes_the_activation_not_the_parameter_it_was_bound_from() {
        let pool = Pool::with_max_memory_mb(64);
        let net = net();
        pool.scope(|s| {
            let a = s.full::<f32>(&[2], 2.0);
            assert_eq!(net.layer(&a, 2).to_vec(), vec![6.0; 2]);
            assert_eq!(net.named(a).to_vec(), vec![48.0; 2]);
        });
    }

    #[test]
    fn a_nested_forward_does_not_replan_the_outer_checkpointer() {
        let pool = Pool::with_max_memory_mb(64);
        pool.scope(|s| {
            let mut outer = Checkpointer::<f32>::new(CheckpointConfig::new(Policy::Every(1)));
            let y = outer.install(|| outer_forward(s.zeros::<f32>(&[1])));
            assert_eq!(y.to_vec(), vec![45.0]);
            assert_eq!(outer.stored_layers(), vec![0, 2]);
            assert_eq!(outer.config().policy, Policy::Every(2));
        });
    }
}

#[test]
fn a_checkpointed_forward_differentiates_like_the_plain_one() {
    let pool = Pool::with_max_memory_mb(64);
    let mlp = Mlp::new(&pool, 8, 4);
    // Full precision stores without a copy when it can; a forward that carries a graph must still
    // reach every layer's parameters, and the stored values must not become parameters themselves.
    let grads_of = |checkpointed: bool, marked: bool| {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(1)));
        pool.train(|s| {
            let mut x = s.randn::<f32>(&[3, 4], 9);
            if marked {
                x = x.requires_grad();
            }
            let y = if checkpointed {
                mlp.forward(&mut ckpt, x.clone())
            } else {
                mlp.forward_plain(x.clone())
            };
            let grads = y.sum(1).sum(0).backward().unwrap();
            let mut all: Vec<Vec<f32>> = mlp
                .weights
                .iter()
                .map(|w| grads.get(w).expect("every weight has a gradient").to_vec())
                .collect();
            if marked {
                all.push(grads.of(&x).expect("the input's gradient").to_vec());
            }
            assert_eq!(
                grads.len(),
                all.len(),
                "no gradient for a stored checkpoint"
            );
            all
        })
    };
    for marked in [false, true] {
        assert_eq!(
            grads_of(true, marked),
            grads_of(false, marked),
            "marked input: {marked}"
        );
    }
}
