//! The digits example's classifier: two 3x3 convolutions (ReLU, 2x2 max pooling) and two linear
//! layers, for scikit-learn's 8x8 digits (`[b, 1, 8, 8]`, values in [0, 1]), as in
//! `scripts/digits_torch.py`.
//!
//! Shared by `examples/digits.rs`, `examples/ddpm.rs` (which checks its samples with it) and
//! `tests/ddpm.rs` through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use tensorscope::nn::{Adam, Linear, NnError, Optimizer};
use tensorscope::prelude::*;
use tensorscope::Gradients;

/// A 3x3 convolution, padding 1, with a bias per output channel.
#[derive(Parameters)]
struct Conv {
    weight: Param,
    bias: Param,
}

/// PyTorch's default initialisation of a layer with `fan_in` inputs: uniform in
/// `±1/sqrt(fan_in)`, weights and bias alike.
fn uniform(pool: &Pool, shape: &[usize], fan_in: usize, seed: u64) -> Param {
    let bound = 1.0 / (fan_in as f64).sqrt();
    pool.scope(|s| s.uniform::<f32>(shape, -bound, bound, seed).detach())
}

impl Conv {
    fn new(pool: &Pool, inputs: usize, outputs: usize, seed: u64) -> Conv {
        let fan_in = inputs * 9;
        Conv {
            weight: uniform(pool, &[outputs, inputs, 3, 3], fan_in, seed),
            bias: uniform(pool, &[outputs], fan_in, seed + 1),
        }
    }

    /// `relu(conv(x) + b)` pooled 2x2: `[b, c, h, w]` to `[b, outputs, h/2, w/2]`.
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let channels = self.bias.len();
        let y = x.conv2d(&self.weight, 1, 1) + &x.bind(&self.bias).reshape(&[1, channels, 1, 1]);
        y.relu().max_pool2d(2, 2)
    }
}

/// Two convolutions and two linear layers, as in `scripts/digits_torch.py`.
#[derive(Parameters)]
pub(crate) struct Classifier {
    conv1: Conv,
    conv2: Conv,
    fc1: Linear,
    fc2: Linear,
}

impl Classifier {
    pub(crate) fn new(pool: &Pool, seed: u64) -> Classifier {
        let linear = |inputs, outputs, seed| {
            let weight = uniform(pool, &[inputs, outputs], inputs, seed);
            let bias = uniform(pool, &[outputs], inputs, seed + 1);
            Linear::from_params(weight, bias).expect("the shapes fit")
        };
        Classifier {
            conv1: Conv::new(pool, 1, 16, seed),
            conv2: Conv::new(pool, 16, 32, seed + 2),
            fc1: linear(128, 64, seed + 4),
            fc2: linear(64, 10, seed + 6),
        }
    }

    /// The logits of `x` (`[b, 1, 8, 8]`): `[b, 10]`.
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = self.conv2.forward(&self.conv1.forward(x));
        let h = h.reshape(&[x.shape()[0], 128]);
        let h = self.fc1.forward(&h).expect("[b, 128]").relu();
        self.fc2.forward(&h).expect("[b, 64]")
    }
}

/// `0..n` shuffled by a Fisher-Yates pass of SplitMix64 seeded with `seed`.
pub(crate) fn shuffled(n: usize, seed: u64, order: &mut Vec<i64>) {
    order.clear();
    order.extend(0..n as i64);
    let mut state = seed;
    for i in (1..n).rev() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        order.swap(i, ((z ^ (z >> 31)) % (i as u64 + 1)) as usize);
    }
}

/// One epoch over the mini-batches of `order` (ids of `images` and `labels`, `batch` at a time):
/// each a training step of cross-entropy, its gradients clipped at norm 1, then `adam`'s step at
/// the learning rate `lr(i)` of the `i`-th batch; `after(i, loss)` is called after it. The mean
/// loss over the epoch's images.
#[allow(clippy::too_many_arguments)] // the data, its order and the optimizer's settings
pub(crate) fn train_epoch(
    pool: &Pool,
    model: &mut Classifier,
    adam: &mut Adam,
    (images, labels): (&Param, &Param<i64>),
    order: &[i64],
    batch: usize,
    lr: &dyn Fn(usize) -> f32,
    after: &mut dyn FnMut(usize, f32),
) -> Result<f64, NnError> {
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        let mut total = 0.0;
        for (i, ids) in order.chunks(batch).enumerate() {
            adam.set_lr(lr(i));
            let loss = outer.train(|s| {
                let ids = s.try_from_slice::<i64>(&[ids.len()], ids)?;
                let x = s.bind(images).try_index_select(0, &ids)?;
                let y = s.bind(labels).try_index_select(0, &ids)?;
                let loss = model.forward(&x).try_cross_entropy_ids(&y)?;
                loss.backward_into(&mut grads)?;
                loss.try_item()
            })?;
            grads.clip_norm(1.0)?;
            adam.step(model, &grads)?;
            grads.zero()?;
            total += f64::from(loss) * ids.len() as f64;
            after(i, loss);
        }
        Ok(total / order.len() as f64)
    })
}

/// A classifier trained on `images` and `labels` for `epochs` epochs of batches of 64 (AdamW at
/// 3e-3), from `seed`.
pub(crate) fn train(
    pool: &Pool,
    images: &Param,
    labels: &Param<i64>,
    epochs: usize,
    seed: u64,
) -> Result<Classifier, NnError> {
    let mut model = Classifier::new(pool, seed);
    let mut adam = Adam::adamw(3e-3, 0.01);
    let mut order = Vec::new();
    for epoch in 0..epochs {
        shuffled(labels.len(), seed + epoch as u64, &mut order);
        let data = (images, labels);
        train_epoch(
            pool,
            &mut model,
            &mut adam,
            data,
            &order,
            64,
            &|_| 3e-3,
            &mut |_, _| (),
        )?;
    }
    Ok(model)
}

/// Of `n` images `side` x `side` (values in [-1, 1], `side` a multiple of 8), averaged down to
/// 8x8 in [0, 1]: how many `model` gives one class a probability of at least `threshold`, and
/// how many of those it puts in each class.
pub(crate) fn confident(
    pool: &Pool,
    model: &Classifier,
    images: &[f32],
    n: usize,
    side: usize,
    threshold: f32,
) -> (usize, [usize; 10]) {
    let probabilities = pool.scope(|s| {
        let x = (s.from_slice::<f32>(&[n, 1, side, side], images) + 1.0) * 0.5;
        let x = x.avg_pool2d(side / 8, side / 8);
        model.forward(&x).softmax(-1).to_vec()
    });
    let mut counts = [0; 10];
    for row in probabilities.chunks(10) {
        let (class, &p) = row
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("10 classes");
        if p >= threshold {
            counts[class] += 1;
        }
    }
    (counts.iter().sum(), counts)
}
