//! The convolutional denoiser of `examples/diffusion_denoise.rs`: convolutions, group norm, SiLU,
//! a stride-2 convolution down, nearest upsampling back, and a skip connection, written plainly and
//! with `#[checkpoint]` over the layers from the skip's source on (the skip is a read of the
//! chain's input).
//!
//! Shared by `examples/diffusion_denoise.rs` and `tests/integration/checkpoint_training.rs` through
//! `#[path]`.

#![allow(dead_code)] // each user needs a different part

use tensorscope::prelude::*;
use tensorscope::{Checkpointer, Parameters};

#[derive(Parameters)]
pub(crate) struct Denoiser {
    conv_in: Param,
    down: Param,
    mid: Param,
    up: Param,
    conv_out: Param,
    #[param(skip)]
    groups: usize,
}

fn kernel<'s>(s: &Scope<'s, '_>, out: usize, inp: usize, seed: u64) -> Tensor<'s> {
    s.randn::<f32>(&[out, inp, 3, 3], seed) * (1.0 / ((inp * 9) as f32).sqrt())
}

impl Denoiser {
    /// A denoiser of `latent` channels in and out, `channels` inside, group norm over `groups`.
    pub(crate) fn new(pool: &Pool, latent: usize, channels: usize, groups: usize) -> Self {
        pool.scope(|s| Denoiser {
            conv_in: kernel(s, channels, latent, 1).detach(),
            down: kernel(s, channels, channels, 2).detach(),
            mid: kernel(s, channels, channels, 3).detach(),
            up: kernel(s, channels, channels, 4).detach(),
            conv_out: (kernel(s, latent, channels, 5) * 0.1).detach(),
            groups,
        })
    }

    /// The noise predicted in `x` (`[1, latent, size, size]`, size even).
    #[dispose_scope]
    pub(crate) fn predict_noise<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let g = self.groups;
        let h1 = x.conv2d(&self.conv_in, 1, 1).group_norm(g, 1e-5).silu();
        let h2 = h1.conv2d(&self.down, 2, 1).group_norm(g, 1e-5).silu();
        let h3 = h2.conv2d(&self.mid, 1, 1).group_norm(g, 1e-5).silu();
        let merged = h3.upsample_nearest2d(2) + &h1; // the skip connection
        let h4 = merged.conv2d(&self.up, 1, 1).group_norm(g, 1e-5).silu();
        h4.conv2d(&self.conv_out, 1, 1)
    }

    /// The same prediction, the layers after the input convolution checkpointed as `ckpt` says;
    /// `h1`, the chain's input, is read again by the upsampling step (a skip connection), which
    /// the chain keeps until that step's backward.
    #[checkpoint]
    pub(crate) fn predict_noise_checkpointed<'a>(
        &self,
        ckpt: &mut Checkpointer,
        x: Tensor<'a>,
    ) -> Tensor<'a> {
        let g = self.groups;
        let h1 = x.conv2d(&self.conv_in, 1, 1).group_norm(g, 1e-5).silu();
        let h = h1.conv2d(&self.down, 2, 1).group_norm(g, 1e-5).silu();
        let h = h.conv2d(&self.mid, 1, 1).group_norm(g, 1e-5).silu();
        let h = h.upsample_nearest2d(2) + &h1;
        let h = h.conv2d(&self.up, 1, 1).group_norm(g, 1e-5).silu();
        let h = h.conv2d(&self.conv_out, 1, 1);
        h
    }
}
