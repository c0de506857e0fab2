//! Skip connections inside a checkpointed chain: a `#[checkpoint]` sequence whose `let`s read
//! earlier ones (a UNet's down-to-up concatenations, a residual from the chain's input, a step
//! reading several earlier ones as a DenseNet does). Against the unannotated forward: the loss and
//! every gradient under every policy, in inference and without a checkpointer; `Policy::Memory`
//! within its budgets; and a value read across the boundary of a region (a recorded step reading
//! a taped one) failing as the docs say.

use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Parameters, Policy};

use crate::checkpoint_memory::{kept_step, within_budgets};
use crate::checkpoint_training::gradients;

/// A small UNet: a convolution in, two levels down (the second strided), a middle, and two levels
/// up, each concatenating the down path's value of its level (long skips), then a convolution out
/// on the sum with the chain's input.
#[derive(Parameters)]
struct Unet {
    conv_in: Param,
    down1: Param,
    down2: Param,
    mid: Param,
    up2: Param,
    up1: Param,
    conv_out: Param,
}

fn kernel(pool: &Pool, out: usize, inp: usize, seed: u64) -> Param {
    pool.scope(|s| {
        (s.randn::<f32>(&[out, inp, 3, 3], seed) * (1.0 / ((inp * 9) as f32).sqrt())).detach()
    })
}

impl Unet {
    fn new(pool: &Pool, latent: usize, c: usize) -> Self {
        Unet {
            conv_in: kernel(pool, c, latent, 1),
            down1: kernel(pool, c, c, 2),
            down2: kernel(pool, c, c, 3),
            mid: kernel(pool, c, c, 4),
            up2: kernel(pool, c, 2 * c, 5),
            up1: kernel(pool, c, 2 * c, 6),
            conv_out: kernel(pool, latent, c, 7),
        }
    }

    fn forward<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let h = x.conv2d(&self.conv_in, 1, 1).silu();
        let d1 = h.conv2d(&self.down1, 1, 1).silu();
        let d2 = d1.conv2d(&self.down2, 2, 1).silu();
        let m = d2.conv2d(&self.mid, 1, 1).silu();
        let u2 = Tensor::concat(&[&m, &d2], 1).conv2d(&self.up2, 1, 1).silu();
        let up = u2.upsample_nearest2d(2);
        let u1 = Tensor::concat(&[&up, &d1], 1)
            .conv2d(&self.up1, 1, 1)
            .silu();
        (u1 + &h).conv2d(&self.conv_out, 1, 1)
    }

    /// The same forward with every layer after `conv_in` one step of the checkpointer's chain.
    #[checkpoint]
    fn forward_checkpointed<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let h = x.conv2d(&self.conv_in, 1, 1).silu();
        let d1 = h.conv2d(&self.down1, 1, 1).silu();
        let d2 = d1.conv2d(&self.down2, 2, 1).silu();
        let m = d2.conv2d(&self.mid, 1, 1).silu();
        let u2 = Tensor::concat(&[&m, &d2], 1).conv2d(&self.up2, 1, 1).silu();
        let up = u2.upsample_nearest2d(2);
        let u1 = Tensor::concat(&[&up, &d1], 1)
            .conv2d(&self.up1, 1, 1)
            .silu();
        let out = (u1 + &h).conv2d(&self.conv_out, 1, 1);
        out
    }
}

const SHAPE: [usize; 4] = [2, 3, 8, 8];
/// The chain's steps: `d1` to `out`.
const STEPS: usize = 7;
/// Bytes of the chain's largest activation (`h`, `d1`, `up`, `u1`: batch 2, 4 channels, 8x8).
const ACTIVATION: usize = 2 * 4 * 8 * 8 * 4;

fn policies() -> Vec<Policy> {
    vec![
        Policy::Every(1),
        Policy::Every(2),
        Policy::Every(3),
        Policy::Every(STEPS),
        Policy::Sqrt,
        Policy::Explicit(vec![1, 3, 5]),
        Policy::Explicit(vec![4]),
        Policy::Budget(ACTIVATION),
        Policy::Budget(3 * ACTIVATION),
        Policy::Memory(64 << 20),
    ]
}

fn step(pool: &Pool, unet: &Unet, ckpt: Option<&mut Checkpointer>) -> (u32, Vec<Vec<f32>>) {
    let mut ckpt = ckpt;
    gradients(
        pool,
        &SHAPE,
        |x| match ckpt.as_deref_mut() {
            Some(ckpt) => unet.forward_checkpointed(ckpt, x),
            None => unet.forward(x),
        },
        |f| unet.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
    )
}

#[test]
fn a_unet_with_long_skips_is_one_chain_with_the_plain_gradients_under_every_policy() {
    let pool = Pool::with_max_memory_mb(256);
    let unet = Unet::new(&pool, 3, 4);
    let plain = step(&pool, &unet, None);
    for policy in policies() {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        // Twice: `Policy::Memory` profiles, then plans.
        for round in 0..2 {
            let got = step(&pool, &unet, Some(&mut ckpt));
            assert!(got.0 == plain.0, "{policy:?}, round {round}: the loss");
            for (i, (g, want)) in got.1.iter().zip(&plain.1).enumerate() {
                assert!(g == want, "{policy:?}, round {round}: gradient {i}");
            }
        }
        // Every policy but the one segment of all the steps replays some.
        let report = ckpt.last_backward().unwrap_or_default();
        let whole = matches!(policy, Policy::Every(STEPS) | Policy::Memory(_));
        assert!(whole || report.replayed_steps > 0, "{policy:?}: {report:?}");
    }
}

#[test]
fn in_inference_the_chain_gives_the_plain_output() {
    let pool = Pool::with_max_memory_mb(64);
    let unet = Unet::new(&pool, 3, 4);
    let plain = pool.scope(|s| unet.forward(s.randn::<f32>(&SHAPE, 3)).to_vec());
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(2)));
    let got = pool.scope(|s| {
        unet.forward_checkpointed(&mut ckpt, s.randn::<f32>(&SHAPE, 3))
            .to_vec()
    });
    assert_eq!(got, plain);
    // In inference the boundaries are stored as the plan says, whatever the steps read.
    assert_eq!(ckpt.stored_layers(), vec![0, 2, 4, 6]);
}

/// A UNet of products: four levels down, a middle, four up, each up level adding the down
/// path's value of its level (long skips nested as a UNet's are), at a width where activations,
/// not workspaces, make the step's peak.
#[derive(Parameters)]
struct Ladder {
    w: Vec<Param>,
}

impl Ladder {
    fn new(pool: &Pool, width: usize) -> Self {
        let scale = 1.0 / (width as f32).sqrt();
        let w = (0..10)
            .map(|i| pool.scope(|s| (s.randn::<f32>(&[width, width], 20 + i) * scale).detach()))
            .collect();
        Ladder { w }
    }

    fn forward<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = d2.matmul(&w[2]).tanh();
        let d4 = d3.matmul(&w[3]).tanh();
        let m = d4.matmul(&w[4]).tanh();
        let u4 = (m + &d4).matmul(&w[5]).tanh();
        let u3 = (u4 + &d3).matmul(&w[6]).tanh();
        let u2 = (u3 + &d2).matmul(&w[7]).tanh();
        let u1 = (u2 + &d1).matmul(&w[8]).tanh();
        (u1 + &h).matmul(&w[9])
    }

    #[checkpoint]
    fn forward_checkpointed<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let d3 = d2.matmul(&w[2]).tanh();
        let d4 = d3.matmul(&w[3]).tanh();
        let m = d4.matmul(&w[4]).tanh();
        let u4 = (m + &d4).matmul(&w[5]).tanh();
        let u3 = (u4 + &d3).matmul(&w[6]).tanh();
        let u2 = (u3 + &d2).matmul(&w[7]).tanh();
        let u1 = (u2 + &d1).matmul(&w[8]).tanh();
        let out = (u1 + &h).matmul(&w[9]);
        out
    }
}

#[test]
fn a_chain_with_long_skips_stays_within_its_memory_budgets() {
    let pool = Pool::with_max_memory_mb(512);
    let ladder = Ladder::new(&pool, 64);
    let params: Vec<Param> = ladder.named_params().into_iter().map(|(_, p)| p).collect();
    let params: Vec<&Param> = params.iter().collect();
    within_budgets("ladder", |ckpt| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[256, 64], 3);
            let target = s.randn::<f32>(&[256, 64], 4);
            let mut grads = None;
            let loss = |ckpt: Option<&mut Checkpointer>| {
                let y = match ckpt {
                    Some(ckpt) => ladder.forward_checkpointed(ckpt, x.clone()),
                    None => ladder.forward(x.clone()),
                };
                y.mse(&target)
            };
            kept_step(&pool, &mut grads, loss, None, &params);
            grads.as_mut().unwrap().zero().unwrap();
            kept_step(&pool, &mut grads, loss, ckpt, &params)
        })
    });
}

/// A chain of products where the step at `p` reads the inputs of `reads[p]` as well as its own
/// (summed before its product), run through the checkpointer's chain with skips.
#[derive(Parameters)]
struct Dense {
    w: Vec<Param>,
}

impl Dense {
    /// Every step reads every earlier step's input (a DenseNet's pattern, summed), into the
    /// installed checkpointer.
    #[checkpoint]
    fn forward_checkpointed<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let a = x.tanh();
        let b = a.matmul(&self.w[0]).tanh();
        let c = (&b + &a).matmul(&self.w[1]).tanh();
        let d = (&c + &b + &a).matmul(&self.w[2]).tanh();
        let e = (&d + &c + &b + &a).matmul(&self.w[3]).tanh();
        e
    }

    fn forward<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let a = x.tanh();
        let b = a.matmul(&self.w[0]).tanh();
        let c = (&b + &a).matmul(&self.w[1]).tanh();
        let d = (&c + &b + &a).matmul(&self.w[2]).tanh();
        (&d + &c + &b + &a).matmul(&self.w[3]).tanh()
    }
}

#[test]
fn steps_reading_several_earlier_steps_get_the_plain_gradients() {
    let pool = Pool::with_max_memory_mb(64);
    let w = (0..4)
        .map(|i| pool.scope(|s| (s.randn::<f32>(&[8, 8], 10 + i) * 0.3).detach()))
        .collect();
    let dense = Dense { w };
    let grads = |checkpointed: bool| {
        gradients(
            &pool,
            &[4, 8],
            |x| match checkpointed {
                true => dense.forward_checkpointed(x),
                false => dense.forward(x),
            },
            |f| dense.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
        )
    };
    let plain = grads(false);
    // With no checkpointer installed, the chain runs as written.
    assert!(grads(true) == plain, "no checkpointer");
    for policy in [
        Policy::Every(1),
        Policy::Every(2),
        Policy::Sqrt,
        Policy::Budget(128),
        Policy::Memory(1 << 20),
    ] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        for round in 0..2 {
            let got = ckpt.install(|| grads(true));
            assert!(got == plain, "{policy:?}, round {round}");
        }
    }
}
