//! The denoiser of a DDPM (Ho et al. 2020), as `diffusers`' `UNet2DModel` builds it and PyTorch's
//! and candle's examples write it: a sinusoidal embedding of the timestep through two linear
//! layers, residual blocks (group norm, SiLU, 3x3 convolution, the timestep added per channel,
//! twice, plus the input), self-attention at the lowest resolution, stride-2 convolutions down,
//! nearest upsampling and a convolution up, and the down path's values concatenated into the up
//! path (long skips). Three levels of `channels`, `2 channels` and `2 channels` at full, half and
//! quarter size. `scripts/ddpm_torch.py` is the same model in PyTorch.
//!
//! Shared by `examples/ddpm.rs` and `tests/ddpm.rs` through `#[path]`.

use tensorscope::nn::{Conv2d, GroupNorm, Linear, Module};
use tensorscope::ops::ConvOptions;
use tensorscope::prelude::*;
use tensorscope::Result;

const GROUPS: usize = 8;

/// A `k` x `k` convolution padded to keep the size (at stride 1).
fn conv(pool: &Pool, inp: usize, out: usize, k: usize, stride: usize, seed: u64) -> Result<Conv2d> {
    let options = ConvOptions {
        stride,
        padding: k / 2,
        ..Default::default()
    };
    Conv2d::new(pool, inp, out, k, options, seed)
}

/// Group norm, SiLU, convolution, the timestep's projection added, and again; plus the input.
#[derive(Parameters)]
struct ResBlock {
    norm1: GroupNorm,
    conv1: Conv2d,
    time: Linear,
    norm2: GroupNorm,
    conv2: Conv2d,
    skip: Option<Conv2d>,
}

impl ResBlock {
    fn new(pool: &Pool, inp: usize, out: usize, emb: usize, seed: u64) -> Result<Self> {
        Ok(ResBlock {
            norm1: GroupNorm::new(pool, GROUPS, inp, 1e-5)?,
            conv1: conv(pool, inp, out, 3, 1, seed)?,
            time: Linear::new(pool, emb, out, seed + 1)?,
            norm2: GroupNorm::new(pool, GROUPS, out, 1e-5)?,
            conv2: conv(pool, out, out, 3, 1, seed + 2)?,
            skip: (inp != out)
                .then(|| conv(pool, inp, out, 1, 1, seed + 3))
                .transpose()?,
        })
    }

    /// `x` `[b, inp, h, w]`, `t` the activated timestep embedding `[b, emb]`.
    fn forward<'a>(&self, x: &Tensor<'a>, t: &Tensor<'a>) -> Result<Tensor<'a>> {
        let h = self.conv1.forward(&self.norm1.forward(x)?.silu())?;
        let shift = self.time.forward(t)?;
        let h = h + &shift.reshape(&[x.shape()[0], shift.shape()[1], 1, 1]);
        let h = self.conv2.forward(&self.norm2.forward(&h)?.silu())?;
        Ok(match &self.skip {
            Some(skip) => h + &skip.forward(x)?,
            None => h + x,
        })
    }
}

/// One-head self-attention over the positions of `[b, c, h, w]`, plus the input.
#[derive(Parameters)]
struct Attention {
    norm: GroupNorm,
    qkv: Conv2d,
    out: Conv2d,
}

impl Attention {
    fn new(pool: &Pool, c: usize, seed: u64) -> Result<Self> {
        Ok(Attention {
            norm: GroupNorm::new(pool, GROUPS, c, 1e-5)?,
            qkv: conv(pool, c, 3 * c, 1, 1, seed)?,
            out: conv(pool, c, c, 1, 1, seed + 1)?,
        })
    }

    fn forward<'a>(&self, x: &Tensor<'a>) -> Result<Tensor<'a>> {
        let &[b, c, h, w] = x.shape() else {
            unreachable!("the UNet's images are 4-D")
        };
        // [b, 3c, h, w] -> [3, b, h w, c]: the queries, keys and values of each position.
        let qkv = self.qkv.forward(&self.norm.forward(x)?)?;
        let qkv = qkv.reshape(&[b, 3, c, h * w]).permute(&[1, 0, 3, 2]);
        let [q, k, v] = [0, 1, 2].map(|i| qkv.narrow(0, i, 1));
        let y = q.scaled_dot_product_attention(&k, &v, Default::default());
        let y = y
            .reshape(&[b, h * w, c])
            .transpose(1, 2)
            .reshape(&[b, c, h, w]);
        Ok(self.out.forward(&y)? + x)
    }
}

/// The DDPM's noise predictor for images of `inp` channels, sides a multiple of 4.
#[derive(Parameters)]
pub(crate) struct Unet {
    time1: Linear,
    time2: Linear,
    conv_in: Conv2d,
    down1: ResBlock,
    pool1: Conv2d,
    down2: ResBlock,
    pool2: Conv2d,
    down3: ResBlock,
    attn3: Attention,
    mid1: ResBlock,
    mid_attn: Attention,
    mid2: ResBlock,
    up3: ResBlock,
    up_attn3: Attention,
    unpool2: Conv2d,
    up2: ResBlock,
    unpool1: Conv2d,
    up1: ResBlock,
    norm_out: GroupNorm,
    conv_out: Conv2d,
    /// The embedding's frequencies `10000^(-i / half)`, `[1, half]`: a constant.
    #[param(skip)]
    freqs: Param,
}

impl Unet {
    /// A UNet of `channels` (a multiple of 8) at full size, its weights drawn from `seed`.
    pub(crate) fn new(pool: &Pool, inp: usize, channels: usize, seed: u64) -> Result<Self> {
        let (c, c2, emb) = (channels, 2 * channels, 4 * channels);
        let res = |i, o, seed| ResBlock::new(pool, i, o, emb, seed);
        Ok(Unet {
            time1: Linear::new(pool, c, emb, seed)?,
            time2: Linear::new(pool, emb, emb, seed + 1)?,
            conv_in: conv(pool, inp, c, 3, 1, seed + 2)?,
            down1: res(c, c, seed + 10)?,
            pool1: conv(pool, c, c, 3, 2, seed + 20)?,
            down2: res(c, c2, seed + 30)?,
            pool2: conv(pool, c2, c2, 3, 2, seed + 40)?,
            down3: res(c2, c2, seed + 50)?,
            attn3: Attention::new(pool, c2, seed + 60)?,
            mid1: res(c2, c2, seed + 70)?,
            mid_attn: Attention::new(pool, c2, seed + 80)?,
            mid2: res(c2, c2, seed + 90)?,
            up3: res(2 * c2, c2, seed + 100)?,
            up_attn3: Attention::new(pool, c2, seed + 110)?,
            unpool2: conv(pool, c2, c2, 3, 1, seed + 120)?,
            up2: res(2 * c2, c2, seed + 130)?,
            unpool1: conv(pool, c2, c2, 3, 1, seed + 140)?,
            up1: res(c2 + c, c, seed + 150)?,
            norm_out: GroupNorm::new(pool, GROUPS, c, 1e-5)?,
            conv_out: conv(pool, c, inp, 3, 1, seed + 160)?,
            freqs: pool.scope(|s| {
                let scale = -(10_000f32.ln()) / (c / 2) as f32;
                (s.arange(0.0, (c / 2) as f32, 1.0) * scale)
                    .exp()
                    .reshape(&[1, c / 2])
                    .detach()
            }),
        })
    }

    /// The noise predicted in `x` (`[b, inp, h, w]`) at timesteps `t` (`[b]`, as floats).
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>, t: &Tensor<'a>) -> Result<Tensor<'a>> {
        let t = self
            .time2
            .forward(&self.time1.forward(&self.embed(t))?.silu())?
            .silu();
        let s1 = self.down1.forward(&self.conv_in.forward(x)?, &t)?;
        let s2 = self.down2.forward(&self.pool1.forward(&s1)?, &t)?;
        let s3 = self
            .attn3
            .forward(&self.down3.forward(&self.pool2.forward(&s2)?, &t)?)?;
        let h = self.mid1.forward(&s3, &t)?;
        let h = self.mid2.forward(&self.mid_attn.forward(&h)?, &t)?;
        let h = self.up3.forward(&Tensor::concat(&[&h, &s3], 1), &t)?;
        let h = self
            .unpool2
            .forward(&self.up_attn3.forward(&h)?.upsample_nearest2d(2))?;
        let h = self.up2.forward(&Tensor::concat(&[&h, &s2], 1), &t)?;
        let h = self.unpool1.forward(&h.upsample_nearest2d(2))?;
        let h = self.up1.forward(&Tensor::concat(&[&h, &s1], 1), &t)?;
        self.conv_out.forward(&self.norm_out.forward(&h)?.silu())
    }

    /// The transformer's sinusoidal embedding of `t`, `channels` wide: `[sin(t f), cos(t f)]`.
    fn embed<'a>(&self, t: &Tensor<'a>) -> Tensor<'a> {
        let angles = t.reshape(&[t.len(), 1]) * &t.bind(&self.freqs).without_grad();
        Tensor::concat(&[&(&angles).sin(), &angles.cos()], 1)
    }
}
