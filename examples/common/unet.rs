//! A UNet with long skips, the shape of a diffusion model's denoiser: a convolution in, three
//! levels down (a residual block each, the first two followed by a stride-2 convolution), a
//! middle block, three levels up (a residual block on the concatenation with the down path's
//! value of its level, the last two preceded by nearest upsampling and a convolution), and a
//! convolution out. Residual blocks are group norm, SiLU, 3x3 convolution, twice, plus the input
//! (through a 1x1 convolution when the channels change). No time embedding, no attention.
//!
//! Written once with `#[checkpoint]` over the whole down-and-up path: one chain of 12 layers whose
//! up layers read the down path's values (skip connections), checkpointed as an installed
//! checkpointer says, and run as written without one. Shared by
//! `examples/checkpoint_curve.rs` through `#[path]`; `scripts/checkpoint_curve_torch.py` builds
//! the same model in PyTorch.

#![allow(dead_code)] // each user needs a different part

use tensorscope::prelude::*;
use tensorscope::Parameters;

/// `[out, inp, k, k]` with PyTorch's default scale for a convolution's weight: uniform on
/// `±1/sqrt(inp k^2)` here as a normal of that standard deviation.
fn kernel(pool: &Pool, out: usize, inp: usize, k: usize, seed: u64) -> Param {
    let scale = 1.0 / ((inp * k * k) as f32).sqrt();
    pool.scope(|s| (s.randn::<f32>(&[out, inp, k, k], seed) * scale).detach())
}

/// Group norm, SiLU, convolution, twice, plus the input (projected when the channels change).
#[derive(Parameters)]
pub(crate) struct ResBlock {
    conv1: Param,
    conv2: Param,
    skip: Option<Param>,
    #[param(skip)]
    groups: usize,
}

impl ResBlock {
    fn new(pool: &Pool, inp: usize, out: usize, groups: usize, seed: u64) -> Self {
        ResBlock {
            conv1: kernel(pool, out, inp, 3, seed),
            conv2: kernel(pool, out, out, 3, seed + 1),
            skip: (inp != out).then(|| kernel(pool, out, inp, 1, seed + 2)),
            groups,
        }
    }

    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let g = self.groups;
        let h = x.group_norm(g, 1e-5).silu().conv2d(&self.conv1, 1, 1);
        let h = h.group_norm(g, 1e-5).silu().conv2d(&self.conv2, 1, 1);
        match &self.skip {
            Some(w) => h + &x.conv2d(w, 1, 0),
            None => h + x,
        }
    }
}

#[derive(Parameters)]
pub(crate) struct Unet {
    conv_in: Param,
    down1: ResBlock,
    downsample1: Param,
    down2: ResBlock,
    downsample2: Param,
    down3: ResBlock,
    mid: ResBlock,
    up3: ResBlock,
    upsample2: Param,
    up2: ResBlock,
    upsample1: Param,
    up1: ResBlock,
    conv_out: Param,
    #[param(skip)]
    groups: usize,
}

impl Unet {
    /// A UNet of `latent` channels in and out, `c` channels at the top level, `2c` and `4c`
    /// below, group norm over `groups`.
    pub(crate) fn new(pool: &Pool, latent: usize, c: usize, groups: usize) -> Self {
        let block = |inp, out, seed| ResBlock::new(pool, inp, out, groups, seed);
        Unet {
            conv_in: kernel(pool, c, latent, 3, 1),
            down1: block(c, c, 10),
            downsample1: kernel(pool, c, c, 3, 20),
            down2: block(c, 2 * c, 30),
            downsample2: kernel(pool, 2 * c, 2 * c, 3, 40),
            down3: block(2 * c, 4 * c, 50),
            mid: block(4 * c, 4 * c, 60),
            up3: block(8 * c, 4 * c, 70),
            upsample2: kernel(pool, 2 * c, 4 * c, 3, 80),
            up2: block(4 * c, 2 * c, 90),
            upsample1: kernel(pool, c, 2 * c, 3, 100),
            up1: block(2 * c, c, 110),
            conv_out: kernel(pool, latent, c, 3, 120),
            groups,
        }
    }

    /// The nearest 2x upsampling of `x` and a convolution to `w`'s channels.
    fn upsample<'a>(x: &Tensor<'a>, w: &Param) -> Tensor<'a> {
        x.upsample_nearest2d(2).conv2d(w, 1, 1)
    }

    /// The forward: the whole down-and-up path one checkpointed chain (12 layers, from `d1` to
    /// `out`; the up layers read `d3`, `d2` and `d1`) under the policy of the checkpointer
    /// installed on the thread (`tensorscope::Checkpointer::install`); with none, the layers run as written.
    #[checkpoint]
    pub(crate) fn forward<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let h = x.conv2d(&self.conv_in, 1, 1);
        let d1 = self.down1.forward(&h);
        let s1 = d1.conv2d(&self.downsample1, 2, 1);
        let d2 = self.down2.forward(&s1);
        let s2 = d2.conv2d(&self.downsample2, 2, 1);
        let d3 = self.down3.forward(&s2);
        let m = self.mid.forward(&d3);
        let u3 = self.up3.forward(&Tensor::concat(&[&m, &d3], 1));
        let p2 = Self::upsample(&u3, &self.upsample2);
        let u2 = self.up2.forward(&Tensor::concat(&[&p2, &d2], 1));
        let p1 = Self::upsample(&u2, &self.upsample1);
        let u1 = self.up1.forward(&Tensor::concat(&[&p1, &d1], 1));
        let out = u1
            .group_norm(self.groups, 1e-5)
            .silu()
            .conv2d(&self.conv_out, 1, 1);
        out
    }
}
