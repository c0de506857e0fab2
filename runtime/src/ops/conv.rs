//! Image ops on `[batch, channels, height, width]` tensors: convolution (with stride, padding,
//! dilation and groups; 1-D convolution of `[batch, channels, length]` as images of height 1),
//! group normalization and nearest-neighbour upsampling, with their backward kernels.

use std::ops::Range;

use ndarray::{Dimension, IxDyn};

use super::gemm::Matrix;
use super::lanes::LaneOp;
use super::linalg::product_band;
use super::{check_addressable, dimension_overflow, gemm, work, Operand};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::Element;
use crate::error::{panicking, Error, Result, Shape};
use crate::tensor::Tensor;
use crate::threads;

/// The options of a convolution ([`Tensor::conv2d_with`], [`Tensor::conv1d`]), as PyTorch's
/// `Conv2d` and `Conv1d` take them: `stride`, zero `padding` on every side, `dilation` (the
/// spacing between kernel taps) and `groups` (the input and output channels split into that many
/// groups, each convolved with its own kernels: `groups = channels` is a depthwise convolution).
/// [`ConvOptions::default`] is stride 1, padding 0, dilation 1, one group; name the options that
/// differ:
///
/// ```
/// use tensorscope::ops::ConvOptions;
/// let options = ConvOptions { dilation: 2, groups: 4, ..ConvOptions::default() };
/// assert_eq!((options.stride, options.padding), (1, 0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvOptions {
    /// The step between output positions (at least 1).
    pub stride: usize,
    /// Zeros added on each side of each spatial axis.
    pub padding: usize,
    /// The spacing between kernel taps (at least 1; 1 is a dense kernel).
    pub dilation: usize,
    /// The number of channel groups (at least 1, dividing the input and output channels).
    pub groups: usize,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// A convolution: 2-D, or 1-D (`[n, c, l]` read as images of height 1, the kernel too).
#[derive(Debug, Clone, Copy)]
struct Conv2d {
    one_d: bool,
    options: ConvOptions,
}

impl<T: Element> Op<T> for Conv2d {
    /// The input and the weight.
    type Saved<'s> = (Saved<'s, T>, Saved<'s, T>);

    fn name(&self) -> &'static str {
        if self.one_d {
            "conv1d"
        } else {
            "conv2d"
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (x, weight) = (cx.input(0), cx.input(1));
        let conv = Conv::new(self, x, weight)?;
        let mut out = cx.rent(conv.out_shape().slice())?;
        if !out.is_empty() {
            let mut cols = cx.rent::<T>(&conv.forward_cols_shape::<T>())?;
            conv.forward_into(
                x.slice(),
                weight.slice(),
                out.unique_slice_mut(),
                cols.unique_slice_mut(),
            );
        }
        Ok((out, cx.saving().then(|| (cx.save(x), cx.save(weight)))))
    }

    /// Per image and group, `dW_g += g_g cols_g^T`, if needed; and `dx`, if needed: with stride 1
    /// the forward of the transposed convolution ([`Conv::transposed`]) on `g`, else per image and
    /// group `dx_g = col2im(W_g^T g_g)`.
    fn backward<'b>(
        &self,
        (x, weight): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (x, weight) = (x.get(cx), weight.get(cx));
        let conv = Conv::new(self, &x, &weight)?;
        let (rows, positions) = (conv.rows(), conv.positions());
        let mut dx = cx.needs(0).then(|| cx.zeros::<T>(x.shape())).transpose()?;
        let mut dw = cx
            .needs(1)
            .then(|| cx.zeros::<T>(weight.shape()))
            .transpose()?;
        if g.is_empty() || rows == 0 {
            return Ok(Grads::from([dx, dw]));
        }
        let transposed = conv.transposed().filter(|_| dx.is_some());
        if let (Some(dx), Some(back)) = (&mut dx, &transposed) {
            let mut flipped = cx.rent::<T>(weight.shape())?;
            conv.flip_kernels(weight.slice(), flipped.unique_slice_mut());
            let mut cols = cx.rent::<T>(&back.forward_cols_shape::<T>())?;
            back.forward_into(
                g.slice(),
                flipped.slice(),
                dx.unique_slice_mut(),
                cols.unique_slice_mut(),
            );
        }
        if let Some(dw) = &mut dw {
            work::visit(conv.n * conv.groups);
            if conv.groups == 1 {
                let mut cols = cx.rent::<T>(&[conv.weight_grad_len::<T>()])?;
                conv.weight_grad_into(
                    x.slice(),
                    g.slice(),
                    dw.unique_slice_mut(),
                    cols.unique_slice_mut(),
                );
            } else {
                // Tile by tile of output rows: `dW_g += g_g[.., tile] cols_g(tile)^T`.
                let mut cols = cx.rent::<T>(&conv.cols_shape::<T>())?;
                for block in conv.blocks() {
                    let g_block = &g.slice()[block.out];
                    for oys in conv.tiles::<T>() {
                        let gi = conv.gradient_rows(g_block, oys.clone());
                        let image = &x.slice()[block.x.clone()];
                        let patches = conv.patches(image, oys, cols.unique_slice_mut());
                        let dw_group = &mut dw.unique_slice_mut()[block.w.clone()];
                        product_band(gi, patches.t(), dw_group, (rows, 0), true);
                    }
                }
            }
        }
        if let (Some(dx), None) = (&mut dx, &transposed) {
            // A strided convolution: `W_g^T g_g` into a whole patch matrix, scattered back.
            let parts = threads::threads().min(conv.n).max(1);
            let mut cols = cx.rent::<T>(&[parts, rows, positions])?;
            work::visit(conv.n * conv.groups);
            let (g, weight) = (g.slice(), weight.slice());
            conv.strided_input_grad_into(g, weight, dx.unique_slice_mut(), cols.unique_slice_mut());
        }
        Ok(Grads::from([dx, dw]))
    }
}

/// Nearest-neighbour upsampling by an integer scale.
#[derive(Debug, Clone, Copy)]
struct Upsample {
    scale: usize,
}

impl<T: Element> Op<T> for Upsample {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        "upsample_nearest2d"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (x, scale) = (cx.input(0), self.scale);
        let [n, c, h, w] = nchw("upsample_nearest2d", x)?;
        let overflow = || dimension_overflow("upsample_nearest2d", "scale", scale, x.shape());
        let (ho, wo) = (
            h.checked_mul(scale).ok_or_else(overflow)?,
            w.checked_mul(scale).ok_or_else(overflow)?,
        );
        let out_shape = [n, c, ho, wo];
        check_addressable::<T>(&out_shape, overflow)?;
        let mut out = cx.rent(&out_shape)?;
        if !out.is_empty() {
            let src = x.slice();
            work::visit(n * c);
            for (plane, dst) in out.unique_slice_mut().chunks_exact_mut(ho * wo).enumerate() {
                let input = &src[plane * h * w..][..h * w];
                for (oy, row) in dst.chunks_exact_mut(wo).enumerate() {
                    let in_row = &input[(oy / scale) * w..][..w];
                    row.iter_mut()
                        .enumerate()
                        .for_each(|(ox, v)| *v = in_row[ox / scale]);
                }
            }
        }
        Ok((out, cx.saving().then_some(())))
    }

    /// Each input pixel gets the sum of its block.
    fn backward<'b>(&self, (): (), g: Tensor<'b, T>, cx: &Backward<'b>) -> Result<Grads<'b, T>> {
        let scale = self.scale;
        let [n, c, ho, wo] = nchw("upsample_nearest2d backward", &g)?;
        let (h, w) = (ho / scale, wo / scale);
        let mut dx = cx.zeros::<T>(&[n, c, h, w])?;
        if !dx.is_empty() {
            work::visit(n * c);
            let src = g.slice();
            for (plane, dst) in dx.unique_slice_mut().chunks_exact_mut(h * w).enumerate() {
                let block = &src[plane * ho * wo..][..ho * wo];
                for (oy, row) in block.chunks_exact(wo).enumerate() {
                    let in_row = &mut dst[(oy / scale) * w..][..w];
                    for (ox, &v) in row.iter().enumerate() {
                        in_row[ox / scale] = in_row[ox / scale] + v;
                    }
                }
            }
        }
        Ok(Grads::from([Some(dx)]))
    }
}

pub(crate) fn nchw<T: Element>(op: &'static str, t: &Tensor<'_, T>) -> Result<[usize; 4]> {
    match *t.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        _ => Err(Error::InvalidShape {
            op,
            shape: Shape::from(t.shape()),
            reason: "expected [batch, channels, height, width]".into(),
        }),
    }
}

/// Bytes of the patches one tile of output rows gathers (im2col), at most (or one output row's):
/// they stay in a core's L2 cache beside the product's packed panels while the product reads
/// them, instead of a whole image's patch matrix (`k_h k_w` times the image: 9.4 MB for a 3x3
/// kernel over 64 channels of 64x64) written out and read back.
const TILE_BYTES: usize = 256 << 10;
/// Output positions per tile, at least: a product with fewer columns of patches than this runs
/// its tiles part empty and its calls' overheads too often (one row of 16 positions, what
/// [`TILE_BYTES`] holds of a 3x3 kernel over 256 channels of 16x16, made that forward 2.9x
/// slower than its untiled one).
const TILE_COLUMNS: usize = 256;

/// The sizes of a convolution, checked: input `[n, c_in, h, w]`, weight `[c_out, c_in / groups,
/// kh, kw]`, output `[n, c_out, ho, wo]` (a 1-D convolution has `h = kh = ho = 1`, and the height
/// axis stride 1, no padding, no dilation). Each group has `cg = c_in / groups` input and
/// `og = c_out / groups` output channels; its patch matrix (im2col) has `rows = cg kh kw` rows and
/// `positions = ho wo` columns.
#[derive(Clone, Copy)]
struct Conv {
    one_d: bool,
    n: usize,
    h: usize,
    w: usize,
    groups: usize,
    cg: usize,
    og: usize,
    kh: usize,
    kw: usize,
    /// Per spatial axis (height, width): stride, padding, dilation.
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    ho: usize,
    wo: usize,
}

/// The ranges of one image and group: its input channels in the input, its output channels in the
/// output, its kernels in the weight.
struct Block {
    x: Range<usize>,
    out: Range<usize>,
    w: Range<usize>,
}

impl Conv {
    fn new<T: Element>(op: &Conv2d, x: &Tensor<'_, T>, weight: &Tensor<'_, T>) -> Result<Conv> {
        let (name, one_d) = (Op::<T>::name(op), op.one_d);
        let ConvOptions {
            stride,
            padding,
            dilation,
            groups,
        } = op.options;
        // A 1-D tensor `[a, b, l]` is read as `[a, b, 1, l]`: the same elements in the same order.
        let dims = |t: &Tensor<'_, T>| match (one_d, t.shape()) {
            (false, &[a, b, h, w]) => Some([a, b, h, w]),
            (true, &[a, b, l]) => Some([a, b, 1, l]),
            _ => None,
        };
        let Some([n, c_in, h, w]) = dims(x) else {
            let reason = match one_d {
                true => "expected [batch, channels, length]",
                false => "expected [batch, channels, height, width]",
            };
            return Err(Error::InvalidShape {
                op: name,
                shape: Shape::from(x.shape()),
                reason: reason.into(),
            });
        };
        let mismatch = |reason: String| Error::ShapeMismatch {
            op: name,
            lhs: Shape::from(x.shape()),
            rhs: Shape::from(weight.shape()),
            reason,
        };
        let Some([c_out, wc_in, kh, kw]) = dims(weight) else {
            return Err(mismatch(match one_d {
                true => "the weight must be [c_out, c_in / groups, k]".into(),
                false => "the weight must be [c_out, c_in / groups, k_h, k_w]".into(),
            }));
        };
        let invalid = |arg, reason: String| Error::InvalidArgument {
            op: name,
            arg,
            reason,
        };
        if groups == 0 {
            return Err(invalid("groups", "must be at least 1".into()));
        }
        for (channels, side) in [(c_in, "input"), (c_out, "output")] {
            if channels % groups != 0 {
                return Err(invalid(
                    "groups",
                    format!("{groups} groups do not divide {channels} {side} channels"),
                ));
            }
        }
        if wc_in.checked_mul(groups) != Some(c_in) {
            return Err(mismatch(match groups {
                1 => format!("input channels differ ({c_in} and {wc_in})"),
                _ => format!(
                    "input channels differ ({c_in} and {wc_in} per group x {groups} groups)"
                ),
            }));
        }
        if stride == 0 {
            return Err(mismatch("stride must be at least 1".into()));
        }
        if dilation == 0 {
            return Err(invalid("dilation", "must be at least 1".into()));
        }
        // The height of a 1-D convolution is 1, as is its kernel's: stride 1, no padding, no
        // dilation along it.
        let height = |value: usize, plain: usize| if one_d { plain } else { value };
        let stride = [height(stride, 1), stride];
        let padding = [height(padding, 0), padding];
        let dilation = [height(dilation, 1), dilation];
        let overflow = |operand, value| dimension_overflow(name, operand, value, x.shape());
        // Per axis: the padded length and the span of the dilated kernel.
        let fit = |axis: usize, len: usize, k: usize| -> Result<(usize, usize)> {
            let (p, d) = (padding[axis], dilation[axis]);
            let padded = p
                .checked_mul(2)
                .and_then(|p| p.checked_add(len))
                .ok_or_else(|| overflow("padding", p))?;
            let span = k
                .saturating_sub(1)
                .checked_mul(d)
                .and_then(|s| s.checked_add(1))
                .ok_or_else(|| overflow("dilation", d))?;
            Ok((padded, span))
        };
        let ((ph, sh), (pw, sw)) = (fit(0, h, kh)?, fit(1, w, kw)?);
        if sh > ph || sw > pw || kh == 0 || kw == 0 {
            let size = |a: usize, b: usize| match one_d {
                true => format!("{b}-long"),
                false => format!("{a}x{b}"),
            };
            let dilated = match dilation[1] {
                1 => String::new(),
                d => format!(" dilated by {d} (spanning {})", size(sh, sw)),
            };
            let image = if one_d { "sequence" } else { "image" };
            return Err(mismatch(format!(
                "a {} kernel{dilated} does not fit a {} padded {image}",
                size(kh, kw),
                size(ph, pw)
            )));
        }
        let (ho, wo) = ((ph - sh) / stride[0] + 1, (pw - sw) / stride[1] + 1);
        // Addressable, so `ho * wo` (both at least 1) cannot overflow.
        check_addressable::<T>(&[n, c_out, ho, wo], || overflow("padding", padding[1]))?;
        Ok(Conv {
            one_d,
            n,
            h,
            w,
            groups,
            cg: wc_in,
            og: c_out / groups,
            kh,
            kw,
            stride,
            padding,
            dilation,
            ho,
            wo,
        })
    }

    fn out_shape(&self) -> IxDyn {
        let c_out = self.og * self.groups;
        match self.one_d {
            true => IxDyn(&[self.n, c_out, self.wo]),
            false => IxDyn(&[self.n, c_out, self.ho, self.wo]),
        }
    }

    fn rows(&self) -> usize {
        self.cg * self.kh * self.kw
    }

    fn positions(&self) -> usize {
        self.ho * self.wo
    }

    /// Every image and group, in order.
    fn blocks(&self) -> impl Iterator<Item = Block> + '_ {
        let (x_len, out_len) = (self.cg * self.h * self.w, self.og * self.positions());
        let w_len = self.og * self.rows();
        (0..self.n * self.groups).map(move |i| {
            let g = i % self.groups;
            Block {
                x: i * x_len..(i + 1) * x_len,
                out: i * out_len..(i + 1) * out_len,
                w: g * w_len..(g + 1) * w_len,
            }
        })
    }

    /// Whether a group's patch matrix is its image as it lies (a 1x1 kernel, stride 1, no
    /// padding): then no patches are gathered.
    fn pointwise(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// Output rows per tile of patches: as many as fit [`TILE_BYTES`], but at least
    /// [`TILE_COLUMNS`] positions' worth; all of them if pointwise (its patches are the image,
    /// nothing is gathered).
    fn tile_rows<T: Element>(&self) -> usize {
        let row = self.rows() * self.wo * std::mem::size_of::<T>();
        let least = TILE_COLUMNS.div_ceil(self.wo.max(1));
        match self.pointwise() {
            true => self.ho,
            false => (TILE_BYTES / row.max(1)).max(least).clamp(1, self.ho),
        }
    }

    /// The tiles of output rows, first to last.
    fn tiles<T: Element>(&self) -> impl Iterator<Item = Range<usize>> {
        let (rows, ho) = (self.tile_rows::<T>(), self.ho);
        (0..ho)
            .step_by(rows)
            .map(move |start| start..(start + rows).min(ho))
    }

    /// Whole images per tile of patches: as many as reach [`TILE_COLUMNS`] positions (or fill
    /// [`TILE_BYTES`], if more) when one image has fewer positions, so that the products are as
    /// wide as a large image's; else one. At 4x4, one image's product is 16 columns wide, half
    /// the register tile, and its calls' overheads are paid per 16 positions. Grouped and
    /// pointwise convolutions take one image at a time.
    fn images_per_tile<T: Element>(&self) -> usize {
        let positions = self.positions();
        if self.groups != 1 || self.pointwise() || positions == 0 || positions >= TILE_COLUMNS {
            return 1;
        }
        let image = self.rows() * positions * std::mem::size_of::<T>();
        (TILE_BYTES / image.max(1))
            .max(TILE_COLUMNS.div_ceil(positions))
            .clamp(1, self.n.max(1))
    }

    /// The shape of one tile's buffer: the patch matrix `[rows, tile_rows wo]`, or with several
    /// images per tile ([`Conv::images_per_tile`]) their patches side by side and, below them,
    /// `og` rows for the product's output or the gathered gradient (`[rows + og, images
    /// positions]`); none if pointwise.
    fn cols_shape<T: Element>(&self) -> [usize; 2] {
        match (self.pointwise(), self.images_per_tile::<T>()) {
            (true, _) => [0, 0],
            (false, 1) => [self.rows(), self.tile_rows::<T>() * self.wo],
            (false, k) => [self.rows() + self.og, k * self.positions()],
        }
    }

    /// The patch matrix of one group of one image at output rows `oys`, `[rows, oys.len() wo]`:
    /// the image itself if pointwise, else gathered into `cols` (im2col).
    fn patches<'a, T: Element>(
        &self,
        image: &'a [T],
        oys: Range<usize>,
        cols: &'a mut [T],
    ) -> Matrix<'a, T> {
        let (rows, columns) = (self.rows(), oys.len() * self.wo);
        if self.pointwise() {
            return Matrix {
                data: &image[oys.start * self.wo..],
                rows,
                cols: columns,
                rs: self.positions(),
                cs: 1,
            };
        }
        let cols = &mut cols[..rows * columns];
        self.im2col(image, oys, cols, columns);
        Matrix::row_major(cols, rows, columns)
    }

    /// The tiles of patches [`Conv::forward_into`] gathers at once: one per thread it splits the
    /// images over (at most the batch), each [`Conv::cols_shape`]; none if pointwise.
    fn forward_cols_shape<T: Element>(&self) -> [usize; 3] {
        let [rows, columns] = self.cols_shape::<T>();
        [threads::threads().min(self.n).max(1), rows, columns]
    }

    /// `out = conv(x, weight)`, every image and group: each group's kernels times its patches,
    /// tile by tile of output rows (through `cols`, [`Conv::forward_cols_shape`]), each product
    /// into its band of the output's columns, on the packed product. The images are
    /// split over the threads, each part with its own tile from `cols`, so that gathering
    /// the patches runs in parallel too; the product of a part runs on its thread (one image's
    /// product is split over the threads instead). Each image is computed as on one thread: the
    /// same bits on any number of threads. Every image and group is written, also an empty one
    /// (no channels, or no pixels but padding): its output is the product with all-zero patches.
    fn forward_into<T: Element>(&self, x: &[T], weight: &[T], out: &mut [T], cols: &mut [T]) {
        work::visit(self.n * self.groups);
        let (rows, positions) = (self.rows(), self.positions());
        let per_part = self.cols_shape::<T>().iter().product::<usize>();
        // The parts `cols` has a tile for (any number if none is needed).
        let most = cols.len().checked_div(per_part).unwrap_or(self.n).max(1);
        let (x_len, out_len) = (self.cg * self.h * self.w, self.og * positions);
        let w_len = self.og * rows;
        let work = self.groups * self.og * rows * positions;
        let min_images = gemm::PER_PART.div_ceil(work.max(1));
        let image_out = self.groups * out_len;
        self.for_each_image_part(
            (out, image_out),
            (cols, per_part, most),
            min_images,
            |first, out, cols| {
                if self.images_per_tile::<T>() > 1 {
                    let kernel = Matrix::row_major(weight, self.og, rows);
                    return self.forward_images(x, kernel, first, out, cols);
                }
                for (i, out) in out.chunks_exact_mut(out_len).enumerate() {
                    let (image, g) = (first + i / self.groups, i % self.groups);
                    let at = (image * self.groups + g) * x_len;
                    let kernel =
                        Matrix::row_major(&weight[g * w_len..(g + 1) * w_len], self.og, rows);
                    for oys in self.tiles::<T>() {
                        let first = oys.start * self.wo;
                        let patches = self.patches(&x[at..at + x_len], oys, cols);
                        product_band(kernel, patches, out, (positions, first), false);
                    }
                }
            },
        );
    }

    /// `f(first image, its images' part of `data`, its `per_part` of `cols`)` for parts of the
    /// images split over the threads (at least `min_images` each, at most `most` parts, the
    /// parts `cols` has room for); `data` holds `image_len` values per image.
    fn for_each_image_part<T: Element>(
        &self,
        (data, image_len): (&mut [T], usize),
        (cols, per_part, most): (&mut [T], usize, usize),
        min_images: usize,
        f: impl Fn(usize, &mut [T], &mut [T]) + Sync,
    ) {
        super::for_each_part(
            self.n,
            min_images,
            |parts| {
                let run = self.n.div_ceil(parts.min(most));
                let mut cols = cols;
                data.chunks_mut(run * image_len)
                    .enumerate()
                    .map(move |(i, data)| {
                        let (mine, rest) = std::mem::take(&mut cols).split_at_mut(per_part);
                        cols = rest;
                        (i * run, data, mine)
                    })
            },
            |(first, data, cols)| f(first, data, cols),
        );
    }

    /// [`Conv::forward_into`] for images `first..` (those `out` holds) with several images per
    /// tile: their patches side by side in `cols`, one product into the rows below them, each
    /// image's columns of it copied to its place in `out`. One group.
    fn forward_images<T: Element>(
        &self,
        x: &[T],
        kernel: Matrix<'_, T>,
        first: usize,
        out: &mut [T],
        cols: &mut [T],
    ) {
        let (positions, per_tile) = (self.positions(), self.images_per_tile::<T>());
        let out_len = self.og * positions;
        let (patches, product) = cols.split_at_mut(self.rows() * per_tile * positions);
        for (tile, out) in out.chunks_mut(per_tile * out_len).enumerate() {
            let images = first + tile * per_tile..first + tile * per_tile + out.len() / out_len;
            let patches = self.gather(x, images, patches);
            let ld = patches.cols;
            product_band(
                kernel,
                patches,
                &mut product[..self.og * ld],
                (ld, 0),
                false,
            );
            for (j, out) in out.chunks_exact_mut(out_len).enumerate() {
                for (o, row) in out.chunks_exact_mut(positions).enumerate() {
                    row.copy_from_slice(&product[o * ld + j * positions..][..positions]);
                }
            }
        }
    }

    /// The patches of whole `images` of `x` side by side in `cols` (image `j`'s in columns `j
    /// positions..`): `[rows, images.len() positions]`. One group.
    fn gather<'a, T: Element>(
        &self,
        x: &[T],
        images: Range<usize>,
        cols: &'a mut [T],
    ) -> Matrix<'a, T> {
        let (positions, x_len) = (self.positions(), self.cg * self.h * self.w);
        let ld = images.len() * positions;
        // No input channels: no patch rows to gather.
        for (j, image) in images.enumerate().filter(|_| self.rows() > 0) {
            let image = &x[image * x_len..(image + 1) * x_len];
            self.im2col(image, 0..self.ho, &mut cols[j * positions..], ld);
        }
        Matrix::row_major(&cols[..self.rows() * ld], self.rows(), ld)
    }

    /// `dx = col2im(W_g^T g_g)` for every image and group (a strided convolution's input
    /// gradient), the images split over the threads, each part with its own whole patch matrix
    /// from `cols` (`[rows, positions]` each, for at most one part per thread). Each image is
    /// computed as on one thread. With the images on one thread, a 64-channel 64x64 stride-2
    /// `fwd+dx` took 1.56x PyTorch's time at 2 threads and 1.00x at 1.
    fn strided_input_grad_into<T: Element>(
        &self,
        g: &[T],
        weight: &[T],
        dx: &mut [T],
        cols: &mut [T],
    ) {
        let (rows, positions) = (self.rows(), self.positions());
        let (x_len, out_len, w_len) = (
            self.cg * self.h * self.w,
            self.og * positions,
            self.og * rows,
        );
        let per_part = rows * positions;
        if x_len == 0 || per_part == 0 {
            return;
        }
        let most = (cols.len() / per_part).max(1);
        let min_images = gemm::PER_PART.div_ceil(self.groups * self.og * per_part);
        self.for_each_image_part(
            (dx, self.groups * x_len),
            (cols, per_part, most),
            min_images,
            |first, dx, cols| {
                for (i, dx) in dx.chunks_exact_mut(x_len).enumerate() {
                    let block = first * self.groups + i;
                    let group = block % self.groups;
                    let gi =
                        Matrix::row_major(&g[block * out_len..][..out_len], self.og, positions);
                    let kernel =
                        Matrix::row_major(&weight[group * w_len..][..w_len], self.og, rows);
                    product_band(kernel.t(), gi, cols, (positions, 0), false);
                    self.col2im(cols, dx);
                }
            },
        );
    }

    /// The output gradient of one image (`g`, `[og, positions]`) at output rows `oys`.
    fn gradient_rows<'a, T: Element>(&self, g: &'a [T], oys: Range<usize>) -> Matrix<'a, T> {
        Matrix {
            data: &g[oys.start * self.wo..],
            rows: self.og,
            cols: oys.len() * self.wo,
            rs: self.positions(),
            cs: 1,
        }
    }

    /// The buffer [`Conv::weight_grad_into`] takes: the weight's gradient transposed, a tile of
    /// patches split between the threads by channels, and per thread, with several images per
    /// tile, their gathered output gradients.
    fn weight_grad_len<T: Element>(&self) -> usize {
        let (columns, gathered) = self.weight_grad_tile::<T>();
        let parts = threads::threads().min(self.cg).max(1);
        self.rows() * self.og + self.rows() * columns + parts * gathered
    }

    /// The columns of [`Conv::weight_grad_into`]'s tiles of patches (none if pointwise: its
    /// patches are the image's channels), and the length of a part's gathered output gradients
    /// (none with one image per tile).
    fn weight_grad_tile<T: Element>(&self) -> (usize, usize) {
        let [_, columns] = self.cols_shape::<T>();
        match self.images_per_tile::<T>() {
            1 => (columns, 0),
            _ => (columns, self.og * columns),
        }
    }

    /// `dW = sum over images and tiles of g cols^T` (one group), split over the threads by input
    /// channels: each part gathers the patch rows of its channels, tile by tile of every image
    /// in order, and adds `cols_c g^T` into its rows of `dW^T` (in `cols`, then turned into
    /// `dw`). Every entry is summed in one part, over the images and positions in order: the
    /// same bits on any number of threads. Splitting the images instead left the gathering on
    /// one thread (a 64-channel 64x64 `fwd+dw` took 1.63x PyTorch's time at 2 threads and 1.00x
    /// at 1).
    fn weight_grad_into<T: Element>(&self, x: &[T], g: &[T], dw: &mut [T], cols: &mut [T]) {
        let (rows, og, taps, hw) = (self.rows(), self.og, self.kh * self.kw, self.h * self.w);
        let (positions, per_tile) = (self.positions(), self.images_per_tile::<T>());
        let (columns, gathered_len) = self.weight_grad_tile::<T>();
        let (dw_t, mut rest) = cols.split_at_mut(rows * og);
        dw_t.fill(T::zero());
        let (x_len, out_len) = (self.cg * hw, og * positions);
        let min_channels = gemm::PER_PART.div_ceil((og * taps * self.n * positions).max(1));
        super::for_each_part(
            self.cg,
            min_channels,
            |parts| {
                let run = self.cg.div_ceil(parts);
                dw_t.chunks_mut(run * taps * og)
                    .enumerate()
                    .map(move |(i, band)| {
                        let channels = i * run..(i * run + band.len() / (taps * og));
                        let len = channels.len() * taps * columns + gathered_len;
                        let (mine, others) = std::mem::take(&mut rest).split_at_mut(len);
                        rest = others;
                        (channels, band, mine)
                    })
            },
            |(channels, band, buf)| {
                let sub = Conv {
                    cg: channels.len(),
                    ..*self
                };
                let (patches_buf, gathered) = buf.split_at_mut(channels.len() * taps * columns);
                let sub_image =
                    |image: usize| &x[image * x_len + channels.start * hw..][..sub.cg * hw];
                let sub_rows = sub.rows();
                if per_tile > 1 {
                    for (tile, g) in g.chunks(per_tile * out_len).enumerate() {
                        let first = tile * per_tile;
                        let ld = g.len() / out_len * positions;
                        for (j, g) in g.chunks_exact(out_len).enumerate() {
                            let patches = &mut patches_buf[j * positions..];
                            sub.im2col(sub_image(first + j), 0..self.ho, patches, ld);
                            for (o, row) in g.chunks_exact(positions).enumerate() {
                                gathered[o * ld + j * positions..][..positions]
                                    .copy_from_slice(row);
                            }
                        }
                        let patches =
                            Matrix::row_major(&patches_buf[..sub_rows * ld], sub_rows, ld);
                        let gi = Matrix::row_major(&gathered[..og * ld], og, ld);
                        product_band(patches, gi.t(), band, (og, 0), true);
                    }
                    return;
                }
                for (image, g) in g.chunks_exact(out_len).enumerate() {
                    for oys in self.tiles::<T>() {
                        let gi = self.gradient_rows(g, oys.clone());
                        let patches = sub.patches(sub_image(image), oys, patches_buf);
                        product_band(patches, gi.t(), band, (og, 0), true);
                    }
                }
            },
        );
        for (r, row) in dw_t.chunks_exact(og).enumerate() {
            for (o, &v) in row.iter().enumerate() {
                dw[o * rows + r] = v;
            }
        }
    }

    /// For a convolution of stride 1 whose padding is at most its dilated kernel's reach, the
    /// convolution whose forward on the output's gradient is the input's gradient: over `ho x wo`
    /// images with the input and output channels swapped, padding `dilation (k - 1) - padding`,
    /// by the kernels of [`Conv::flip_kernels`]. Its output is `h x w`: `ho + 2 (d (k - 1) - p)
    /// - d (k - 1) = h`. One product the size of the forward's, where `col2im(W^T g)` writes and
    /// reads a patch matrix `k_h k_w` times the image's size.
    fn transposed(&self) -> Option<Conv> {
        if self.stride != [1, 1] {
            return None;
        }
        let pad =
            |axis: usize, k: usize| (self.dilation[axis] * (k - 1)).checked_sub(self.padding[axis]);
        Some(Conv {
            h: self.ho,
            w: self.wo,
            cg: self.og,
            og: self.cg,
            padding: [pad(0, self.kh)?, pad(1, self.kw)?],
            ho: self.h,
            wo: self.w,
            ..*self
        })
    }

    /// The kernels of [`Conv::transposed`] from `weight` (`[groups og, cg, kh, kw]`): per group,
    /// `[cg, og, kh, kw]` with each kernel turned by 180 degrees.
    fn flip_kernels<T: Element>(&self, weight: &[T], flipped: &mut [T]) {
        let taps = self.kh * self.kw;
        for (i, kernel) in weight.chunks_exact(taps).enumerate() {
            let (g, o, c) = (i / (self.og * self.cg), i / self.cg % self.og, i % self.cg);
            let at = ((g * self.cg + c) * self.og + o) * taps;
            for (t, &v) in kernel.iter().enumerate() {
                flipped[at + taps - 1 - t] = v;
            }
        }
    }

    /// Calls `f(patch row, column, image offset, count)` for every run of patch entries of one group
    /// at output rows `oys` (the patch matrix of those rows, `[rows, oys.len() wo]`) that lie
    /// inside the image (the others are the zero border): `count` entries of one patch row
    /// and output row, consecutive in the patch matrix and `stride` apart in the image. The
    /// columns inside the image are a range, found once per kernel tap rather than checked per
    /// entry: `ox` is inside when `0 <= ox stride + kx dilation - padding < w`.
    fn for_each_run(&self, oys: Range<usize>, mut f: impl FnMut(usize, usize, usize, usize)) {
        let sx = self.stride[1];
        // The first output position `o` with `o step + tap >= padding`, and the first with
        // `o step + tap >= padding + len`: the inside columns are the range between them.
        let first_at =
            |limit: usize, tap: usize, step: usize| limit.saturating_sub(tap).div_ceil(step);
        for c in 0..self.cg {
            for ky in 0..self.kh {
                for kx in 0..self.kw {
                    let row = (c * self.kh + ky) * self.kw + kx;
                    let tap = kx * self.dilation[1];
                    let lo = first_at(self.padding[1], tap, sx).min(self.wo);
                    let hi = first_at(self.padding[1] + self.w, tap, sx).min(self.wo);
                    if lo >= hi {
                        continue;
                    }
                    for oy in oys.clone() {
                        let iy = (oy * self.stride[0] + ky * self.dilation[0])
                            .checked_sub(self.padding[0])
                            .filter(|&i| i < self.h);
                        let Some(iy) = iy else {
                            continue;
                        };
                        let ix = lo * sx + tap - self.padding[1];
                        let at = (c * self.h + iy) * self.w + ix;
                        f(row, (oy - oys.start) * self.wo + lo, at, hi - lo);
                    }
                }
            }
        }
    }

    /// The patch matrix of one group of one image at output rows `oys` (im2col), written whole:
    /// the border entries are zeros.
    /// Patch row `r` is written to `patches[r ld..r ld + oys.len() wo]` (`ld` at least that).
    fn im2col<T: Element>(&self, image: &[T], oys: Range<usize>, patches: &mut [T], ld: usize) {
        match self.stride == [1, 1] && self.wo == self.w {
            true => self.im2col_shifted(image, oys, patches, ld),
            false => self.im2col_runs(image, oys, patches, ld),
        }
    }

    /// The first `rows` rows of `ld` of `patches`, each cut to its first `columns`.
    fn patch_rows<'a, T>(
        &self,
        patches: &'a mut [T],
        ld: usize,
        columns: usize,
    ) -> impl Iterator<Item = &'a mut [T]> {
        patches
            .chunks_mut(ld.max(1))
            .take(self.rows())
            .map(move |row| &mut row[..columns])
    }

    /// [`Conv::im2col`] by runs of one tap and output row.
    fn im2col_runs<T: Element>(
        &self,
        image: &[T],
        oys: Range<usize>,
        patches: &mut [T],
        ld: usize,
    ) {
        let columns = oys.len() * self.wo;
        self.patch_rows(patches, ld, columns)
            .for_each(|row| row.fill(T::zero()));
        let sx = self.stride[1];
        self.for_each_run(oys, |row, col, at, count| {
            let out = &mut patches[row * ld + col..row * ld + col + count];
            if sx == 1 {
                out.copy_from_slice(&image[at..at + count]);
            } else {
                out.iter_mut()
                    .zip(image[at..].iter().step_by(sx))
                    .for_each(|(o, &v)| *o = v);
            }
        });
    }

    /// [`Conv::im2col`] where the output rows are as wide as the image's (stride 1, the padding
    /// keeping the width): a patch row of output rows `oys` is then one span of its channel
    /// shifted by its tap, copied at once, with the entries outside the image zeroed (the rows
    /// above and below it, and the columns that wrapped around a row's end). It copies one run
    /// per tap where [`Conv::im2col_runs`] copies one per tap and output row (14-16 values at
    /// 16x16), and writes each entry once where that path zeroes the tile first (`memset` was 7%
    /// of a small UNet's training step).
    fn im2col_shifted<T: Element>(
        &self,
        image: &[T],
        oys: Range<usize>,
        patches: &mut [T],
        ld: usize,
    ) {
        let (w, columns) = (self.w, oys.len() * self.wo);
        let signed = |v: usize| v as isize;
        if columns == 0 {
            return;
        }
        let mut patch_rows = self.patch_rows(patches, ld, columns);
        for c in 0..self.cg {
            for ky in 0..self.kh {
                let dy = signed(ky * self.dilation[0]) - signed(self.padding[0]);
                // The output rows whose input row `oy + dy` is inside the image.
                let first = oys.start.max((-dy).max(0) as usize).min(oys.end);
                let end = oys
                    .end
                    .min((signed(self.h) - dy).max(0) as usize)
                    .max(first);
                for kx in 0..self.kw {
                    let dx = signed(kx * self.dilation[1]) - signed(self.padding[1]);
                    let patch_row = patch_rows.next().expect("a patch row per tap");
                    let (above, rest) = patch_row.split_at_mut((first - oys.start) * w);
                    let (out, below) = rest.split_at_mut((end - first) * w);
                    above.fill(T::zero());
                    below.fill(T::zero());
                    // Output (oy, ox) reads image (oy + dy, ox + dx): one span, clipped to the
                    // image (what it clips lands in wrapped columns only).
                    let start = (signed(c * self.h + first) + dy) * signed(w) + dx;
                    let len = signed(out.len());
                    let from = (-start).clamp(0, len);
                    let to = (signed(image.len()) - start).clamp(from, len);
                    let (head, rest) = out.split_at_mut(from as usize);
                    let (copied, tail) = rest.split_at_mut((to - from) as usize);
                    head.fill(T::zero());
                    if from < to {
                        let span = (start + from) as usize..(start + to) as usize;
                        copied.copy_from_slice(&image[span]);
                    }
                    tail.fill(T::zero());
                    // The columns whose `ox + dx` is outside the row read a neighbour's pixels.
                    let wrapped = match dx {
                        0 => continue,
                        d if d < 0 => 0..(-d as usize).min(w),
                        d => w.saturating_sub(d as usize)..w,
                    };
                    for line in out.chunks_exact_mut(w) {
                        line[wrapped.clone()].fill(T::zero());
                    }
                }
            }
        }
    }

    /// The transpose of im2col: each patch entry added into the image pixel it came from.
    fn col2im<T: Element>(&self, patches: &[T], image: &mut [T]) {
        let sx = self.stride[1];
        let positions = self.positions();
        self.for_each_run(0..self.ho, |row, col, at, count| {
            let pixels = image[at..].iter_mut().step_by(sx);
            for (pixel, &p) in pixels.zip(&patches[row * positions + col..][..count]) {
                *pixel = *pixel + p;
            }
        });
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// 2-D convolution (cross-correlation, as in PyTorch) of `[n, c_in, h, w]` with `weight`
    /// `[c_out, c_in, k_h, k_w]` (a tensor or a [`Param`](crate::Param)), zero `padding` on every
    /// side and `stride`: [`Tensor::try_conv2d_with`] with those options, which says what fails.
    pub fn try_conv2d(
        &self,
        weight: &impl Operand<'s, T>,
        stride: usize,
        padding: usize,
    ) -> Result<Tensor<'s, T>> {
        let options = ConvOptions {
            stride,
            padding,
            ..ConvOptions::default()
        };
        self.try_conv2d_with(weight, options)
    }

    /// 2-D convolution (cross-correlation, as in PyTorch's `F.conv2d`) of `[n, c_in, h, w]` with
    /// `weight` `[c_out, c_in / groups, k_h, k_w]` (a tensor or a [`Param`](crate::Param)) and
    /// `options` (stride, zero padding, dilation, groups; see [`ConvOptions`]). The output is
    /// `[n, c_out, h_out, w_out]`, with
    /// `h_out = (h + 2 padding - dilation (k_h - 1) - 1) / stride + 1` and `w_out` alike.
    ///
    /// Computed by im2col in tiles: the patches of a tile of output rows of one image's group go
    /// into a rented `[c_in / groups k_h k_w, tile]` matrix of about 256 KiB (at least 256
    /// positions; none for a 1x1 kernel with stride 1 and no padding, whose patches are the
    /// image), multiplied by the group's kernels straight into the output's columns on the packed
    /// `f32`/`f64` product that [`Tensor::matmul`] runs. The images are split over the
    /// [`threads`](crate::threads), each with its own tile. The input's gradient of a stride-1
    /// convolution is the convolution of the output's gradient by the kernels turned and
    /// transposed; of a strided one, a whole patch matrix's product scattered back (col2im), which
    /// rents `k_h k_w` times one image's group (9.4 MB for a 3x3 kernel over `[64, 64, 64]`).
    ///
    /// Fails with [`Error::InvalidShape`] for an input that is not 4-D;
    /// [`Error::InvalidArgument`] for zero groups or dilation, or groups that do not divide the
    /// input or output channels; [`Error::ShapeMismatch`] naming both shapes (a weight that is not
    /// 4-D, channels that differ, a kernel larger than the padded image, a zero stride); and
    /// [`Error::DimensionOverflow`] for a padding or dilation that makes the sizes too large.
    ///
    /// ```
    /// use tensorscope::ops::ConvOptions;
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     // Depthwise: 4 channels, each with its own dilated 3x3 kernel.
    ///     let x = s.ones::<f32>(&[1, 4, 8, 8]);
    ///     let w = s.ones::<f32>(&[4, 1, 3, 3]);
    ///     let y = x.conv2d_with(&w, ConvOptions { dilation: 2, groups: 4, ..Default::default() });
    ///     assert_eq!(y.shape(), &[1, 4, 4, 4]);
    ///     assert_eq!(y.to_vec(), vec![9.0; 64]);
    /// });
    /// ```
    pub fn try_conv2d_with(
        &self,
        weight: &impl Operand<'s, T>,
        options: ConvOptions,
    ) -> Result<Tensor<'s, T>> {
        self.convolve(weight, false, options)
    }

    /// 1-D convolution (cross-correlation, as in PyTorch's `F.conv1d`) of `[n, c_in, l]` with
    /// `weight` `[c_out, c_in / groups, k]` and `options` (see [`ConvOptions`]); the output is
    /// `[n, c_out, (l + 2 padding - dilation (k - 1) - 1) / stride + 1]`. It runs the 2-D kernels
    /// on images of height 1. Fails as [`Tensor::try_conv2d_with`], with [`Error::InvalidShape`]
    /// for an input that is not 3-D and [`Error::ShapeMismatch`] for a weight that is not.
    ///
    /// ```
    /// use tensorscope::ops::ConvOptions;
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let x = s.from_slice::<f32>(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    ///     let w = s.from_slice::<f32>(&[1, 1, 2], &[1., -1.]);
    ///     let y = x.conv1d(&w, ConvOptions { dilation: 2, ..Default::default() });
    ///     assert_eq!(y.to_vec(), vec![-2., -2., -2.]);
    /// });
    /// ```
    pub fn try_conv1d(
        &self,
        weight: &impl Operand<'s, T>,
        options: ConvOptions,
    ) -> Result<Tensor<'s, T>> {
        self.convolve(weight, true, options)
    }

    /// The convolution of this tensor with `weight`, 1-D or 2-D.
    fn convolve(
        &self,
        weight: &impl Operand<'s, T>,
        one_d: bool,
        options: ConvOptions,
    ) -> Result<Tensor<'s, T>> {
        let weight = weight.bind_beside(self);
        let inputs = &mut args([Arg::Borrowed(self), Arg::Borrowed(&*weight)]);
        autograd::run(Conv2d { one_d, options }, inputs)
    }

    /// Group normalization of `[n, c, h, w]`: the channels are split into `groups` groups and each
    /// (image, group) is normalized to zero mean and unit variance over its channels and pixels.
    /// Scale and shift by broadcasting with `[c, 1, 1]` tensors. Fails with [`Error::InvalidShape`]
    /// if `groups` is zero or does not divide the channels.
    pub fn try_group_norm(&self, groups: usize, eps: T) -> Result<Tensor<'s, T>> {
        let [_, c, _, _] = nchw("group_norm", self)?;
        if groups == 0 || c % groups != 0 {
            return Err(Error::InvalidShape {
                op: "group_norm",
                shape: Shape::from(self.shape()),
                reason: format!("{groups} groups do not divide {c} channels"),
            });
        }
        LaneOp::groups(groups, eps).run(Arg::Borrowed(self))
    }

    /// Nearest-neighbour upsampling of `[n, c, h, w]` by an integer `scale`: `[n, c, scale h, scale w]`,
    /// each pixel repeated in a `scale x scale` block. Fails with [`Error::InvalidShape`] for a zero
    /// scale or a tensor that is not 4-D, and with [`Error::DimensionOverflow`] for a scale that
    /// makes the output too large.
    pub fn try_upsample_nearest2d(&self, scale: usize) -> Result<Tensor<'s, T>> {
        nchw("upsample_nearest2d", self)?;
        if scale == 0 {
            return Err(Error::InvalidShape {
                op: "upsample_nearest2d",
                shape: Shape::from(self.shape()),
                reason: "the scale must be at least 1".into(),
            });
        }
        autograd::run(Upsample { scale }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// 2-D convolution.
        pub fn conv2d(&self, weight: &impl Operand<'s, T>, stride: usize, padding: usize) -> Tensor<'s, T> = try_conv2d;
        /// 2-D convolution with every option.
        pub fn conv2d_with(&self, weight: &impl Operand<'s, T>, options: ConvOptions) -> Tensor<'s, T> = try_conv2d_with;
        /// 1-D convolution.
        pub fn conv1d(&self, weight: &impl Operand<'s, T>, options: ConvOptions) -> Tensor<'s, T> = try_conv1d;
        /// Group normalization.
        pub fn group_norm(&self, groups: usize, eps: T) -> Tensor<'s, T> = try_group_norm;
        /// Nearest-neighbour upsampling.
        pub fn upsample_nearest2d(&self, scale: usize) -> Tensor<'s, T> = try_upsample_nearest2d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A convolution of `cg` channels over `h` x `w` images, stride 1, its padding keeping the
    /// size: `k` taps per axis `dilation` apart.
    fn same_size(cg: usize, [h, w]: [usize; 2], [kh, kw]: [usize; 2], dilation: usize) -> Conv {
        let padding = [dilation * (kh - 1) / 2, dilation * (kw - 1) / 2];
        Conv {
            one_d: false,
            n: 1,
            h,
            w,
            groups: 1,
            cg,
            og: 1,
            kh,
            kw,
            stride: [1, 1],
            padding,
            dilation: [dilation; 2],
            ho: h,
            wo: w,
        }
    }

    #[test]
    fn shifted_patches_are_the_runs_patches() {
        let kernels = [
            ([3, 3], 1),
            ([5, 5], 1),
            ([3, 3], 2),
            ([1, 3], 1),
            ([3, 1], 3),
        ];
        for size in [[1, 1], [2, 3], [5, 4], [4, 7], [16, 16]] {
            for (kernel, dilation) in kernels {
                let conv = same_size(3, size, kernel, dilation);
                let image: Vec<f32> = (0..3 * size[0] * size[1]).map(|i| i as f32 + 1.0).collect();
                for oys in [0..size[0], 1.min(size[0])..size[0], 0..size[0].div_ceil(2)] {
                    let len = conv.rows() * oys.len() * conv.wo;
                    let (mut shifted, mut runs) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                    let ld = oys.len() * conv.wo;
                    conv.im2col_shifted(&image, oys.clone(), &mut shifted, ld);
                    conv.im2col_runs(&image, oys.clone(), &mut runs, ld);
                    assert_eq!(
                        shifted, runs,
                        "{size:?} kernel {kernel:?} dilation {dilation} rows {oys:?}"
                    );
                }
            }
        }
    }
}
