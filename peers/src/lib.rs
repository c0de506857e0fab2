//! tensorscope's `matmul` against other `f32` matrix products, on the same operands, each writing
//! into an output it owns, all on [`threads`] threads (2 unless `PEERS_THREADS` says otherwise).
//!
//! A [`Candidate`] is one library set up for one [`Shape`]: it owns copies of the operands and its
//! output, so timing a call times the product alone. [`candidates`] lists them in a fixed order;
//! [`Candidate::check`] compares a candidate's result with an `f64` reference before anything is
//! timed, so a fast but wrong product (a layout mix-up) is an error rather than a row in a table.
//!
//! This crate is outside the workspace (see `README.md`): its dependencies are heavy and, with the
//! `blas` feature, need a system library.

// Linking: ndarray's `blas` feature declares the CBLAS functions; this crate brings the library.
#[cfg(feature = "blas")]
use blas_src as _;

use std::hint::black_box;

use tensorscope::prelude::*;

/// Threads every candidate runs on: `PEERS_THREADS` if set (1 for the one-thread table), else 2.
pub fn threads() -> usize {
    std::env::var("PEERS_THREADS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(2)
}

/// One product `C = A B` of `[m, k]` by `[k, n]` matrices, `batch` times over as many pairs,
/// each operand stored row-major or, if marked transposed, as its transpose (`a` stored `[k, m]`
/// and read as `A = a^T`: the backward's `x^T dy` and `dy w^T` read their operands so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Short name used in bench ids and tables.
    pub name: &'static str,
    /// Products in the batch (1: one product).
    pub batch: usize,
    /// Rows of `A` and of the output.
    pub m: usize,
    /// Columns of `A`, rows of `B`.
    pub k: usize,
    /// Columns of `B` and of the output.
    pub n: usize,
    /// `A` is stored as `[k, m]`, its transpose.
    pub a_t: bool,
    /// `B` is stored as `[n, k]`, its transpose.
    pub b_t: bool,
}

impl Shape {
    /// `[m, k] x [k, n]`, both stored row-major, named `name`.
    pub const fn new(name: &'static str, m: usize, k: usize, n: usize) -> Self {
        Self {
            name,
            batch: 1,
            m,
            k,
            n,
            a_t: false,
            b_t: false,
        }
    }

    /// This product with `A` stored transposed (`A^T B` of the stored operands).
    pub const fn a_transposed(self) -> Self {
        Self { a_t: true, ..self }
    }

    /// This product with `B` stored transposed (`A B^T` of the stored operands).
    pub const fn b_transposed(self) -> Self {
        Self { b_t: true, ..self }
    }

    /// `batch` products of this shape.
    pub const fn batched(self, batch: usize) -> Self {
        Self { batch, ..self }
    }

    /// Floating-point operations of the product: a multiply and an add per term.
    pub fn flops(&self) -> u64 {
        2 * (self.batch * self.m * self.k * self.n) as u64
    }

    /// The stored shape of one `a` (`[m, k]`, or `[k, m]` transposed).
    pub fn a_stored(&self) -> [usize; 2] {
        if self.a_t {
            [self.k, self.m]
        } else {
            [self.m, self.k]
        }
    }

    /// The stored shape of one `b` (`[k, n]`, or `[n, k]` transposed).
    pub fn b_stored(&self) -> [usize; 2] {
        if self.b_t {
            [self.n, self.k]
        } else {
            [self.k, self.n]
        }
    }

    /// The row and column steps of `A` (`m x k`) over one stored `a`.
    pub fn a_steps(&self) -> (usize, usize) {
        if self.a_t {
            (1, self.m)
        } else {
            (self.k, 1)
        }
    }

    /// The row and column steps of `B` (`k x n`) over one stored `b`.
    pub fn b_steps(&self) -> (usize, usize) {
        if self.b_t {
            (1, self.k)
        } else {
            (self.n, 1)
        }
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Shape { name, batch, .. } = *self;
        let [ra, ca] = self.a_stored();
        let [rb, cb] = self.b_stored();
        let mark = |t| if t { "^T" } else { "" };
        let lead = if batch > 1 {
            format!("{batch} x ")
        } else {
            String::new()
        };
        write!(
            f,
            "{name}: {lead}[{ra}, {ca}]{} x [{rb}, {cb}]{}",
            mark(self.a_t),
            mark(self.b_t)
        )
    }
}

/// The shapes compared: the reference forwards' products (M, E), one step of training an MLP
/// block of width 128 and hidden width 256 at batch 32 (the forward product and the two products
/// of its backward, `dx = dy w^T` and `dw = x^T dy`, here on row-major copies), and a square
/// product.
pub const SHAPES: [Shape; 6] = [
    Shape::new("M", 256, 1024, 1024),
    Shape::new("E", 16384, 64, 64),
    Shape::new("T_fwd", 32, 128, 256),
    Shape::new("T_dx", 32, 256, 128),
    Shape::new("T_dw", 128, 32, 256),
    Shape::new("S", 1024, 1024, 1024),
];

/// The products of a GPT training step at the size of issue 27 (batch 8, context 256, width 384,
/// 6 heads of 64): the fused QKV projection and the MLP's up projection (`[b t, d] x [d, 3d]`,
/// `[b t, d] x [d, 4d]`), the up projection's backward read where its operands lie (`dx = dy
/// w^T`, `dw = x^T dy`), the unfused attention's scores (`q k^T`, a batch of 48 heads) and its
/// weighted values. The same at GPT-2 small's width (768, 12 heads).
pub const TRANSFORMER_SHAPES: [Shape; 12] = [
    Shape::new("qkv384", 2048, 384, 1152),
    Shape::new("fc384", 2048, 384, 1536),
    Shape::new("fc_dx384", 2048, 1536, 384).b_transposed(),
    Shape::new("fc_dw384", 384, 2048, 1536).a_transposed(),
    Shape::new("scores384", 256, 64, 256)
        .b_transposed()
        .batched(48),
    Shape::new("av384", 256, 256, 64).batched(48),
    Shape::new("qkv768", 2048, 768, 2304),
    Shape::new("fc768", 2048, 768, 3072),
    Shape::new("fc_dx768", 2048, 3072, 768).b_transposed(),
    Shape::new("fc_dw768", 768, 2048, 3072).a_transposed(),
    Shape::new("scores768", 256, 64, 256)
        .b_transposed()
        .batched(96),
    Shape::new("av768", 256, 256, 64).batched(96),
];

/// Makes every candidate's thread count [`threads`]. Call it first thing in `main`, before any
/// product runs and before the process starts a thread: tensorscope and matrixmultiply read their
/// variable once, on first use (`TENSORSCOPE_THREADS`, `MATMUL_NUM_THREADS`). gemm and faer take
/// the count per call; OpenBLAS reads its variable when the library loads, so it is told by a call.
pub fn use_threads() {
    let n = threads().to_string();
    std::env::set_var("TENSORSCOPE_THREADS", &n);
    std::env::set_var("MATMUL_NUM_THREADS", &n);
    #[cfg(feature = "blas")]
    openblas::set_threads(threads());
}

/// What OpenBLAS reports about itself (build configuration and the kernel it chose for this CPU),
/// or `None` without the `blas` feature.
pub fn blas_info() -> Option<String> {
    #[cfg(feature = "blas")]
    return Some(openblas::info());
    #[cfg(not(feature = "blas"))]
    None
}

/// One library's product for one shape, with its own operands and output.
pub trait Candidate {
    /// The library's name as used in bench ids and tables.
    fn name(&self) -> &'static str;
    /// Computes `c = a b` once.
    fn run(&mut self);
    /// Computes `c = a b` once and returns `c`, row-major.
    fn result(&mut self) -> Vec<f32>;

    /// Compares [`Candidate::result`] with an `f64` reference on one entry of every row and one
    /// of every column, each within the classic bound `k * eps * sum |a_ip b_pj|` of an `f32` dot
    /// product; the error names the first entry outside it.
    fn check(&mut self, operands: &Operands) -> Result<(), String> {
        let c = self.result();
        let shape = operands.shape;
        let Shape { batch, m, k, n, .. } = shape;
        let ((ra, ca), (rb, cb)) = (shape.a_steps(), shape.b_steps());
        // The first and the last product of a batch.
        for h in [0, batch - 1] {
            let (a, b) = (operands.a_of(h), operands.b_of(h));
            let c = &c[h * m * n..][..m * n];
            let entries = (0..m).map(|i| (i, (i * 7919) % n));
            let entries = entries.chain((0..n).map(|j| ((j * 104_729) % m, j)));
            for (i, j) in entries {
                let (mut exact, mut size) = (0.0f64, 0.0f64);
                for p in 0..k {
                    let term = f64::from(a[i * ra + p * ca]) * f64::from(b[p * rb + j * cb]);
                    exact += term;
                    size += term.abs();
                }
                let got = f64::from(c[i * n + j]);
                let bound =
                    k as f64 * f64::from(f32::EPSILON) * size + f64::from(f32::MIN_POSITIVE);
                if (got - exact).abs() > bound {
                    return Err(format!(
                        "{} on {shape}: product {h}, c[{i}, {j}] = {got}, expected {exact} \
                         (bound {bound:.3e})",
                        self.name(),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The operands of one shape, drawn once (standard normal, fixed seeds) and shared by every
/// candidate.
pub struct Operands {
    /// The product's shape.
    pub shape: Shape,
    /// The stored `a`s, one after the other, each [`Shape::a_stored`] row-major.
    pub a: Vec<f32>,
    /// The stored `b`s, likewise.
    pub b: Vec<f32>,
    pool: Pool,
    pa: Param<f32>,
    pb: Param<f32>,
}

impl Operands {
    /// Draws `a` and `b` for `shape`.
    pub fn new(shape: Shape) -> Self {
        let stored = |[rows, cols]: [usize; 2]| match shape.batch {
            1 => vec![rows, cols],
            batch => vec![batch, rows, cols],
        };
        // Room for the operands and a few outputs of the largest shape.
        let pool = Pool::with_max_memory_mb(512);
        let (pa, pb) = pool.scope(|s| {
            (
                s.randn::<f32>(&stored(shape.a_stored()), 1).detach(),
                s.randn::<f32>(&stored(shape.b_stored()), 2).detach(),
            )
        });
        Self {
            shape,
            a: pa.as_slice().to_vec(),
            b: pb.as_slice().to_vec(),
            pool,
            pa,
            pb,
        }
    }

    /// The stored `a` of product `h` of the batch.
    pub fn a_of(&self, h: usize) -> &[f32] {
        let len = self.a.len() / self.shape.batch;
        &self.a[h * len..][..len]
    }

    /// The stored `b` of product `h` of the batch.
    pub fn b_of(&self, h: usize) -> &[f32] {
        let len = self.b.len() / self.shape.batch;
        &self.b[h * len..][..len]
    }
}

/// Every candidate for `operands`, in table order: tensorscope, matrixmultiply, gemm, faer, and
/// OpenBLAS with the `blas` feature.
pub fn candidates(operands: &Operands) -> Vec<Box<dyn Candidate>> {
    let list: Vec<Box<dyn Candidate>> = vec![
        Box::new(Tensorscope::new(operands)),
        Box::new(Matrixmultiply(Buffers::new(operands))),
        Box::new(Gemm(Buffers::new(operands))),
        Box::new(Faer(Buffers::new(operands))),
    ];
    #[cfg(feature = "blas")]
    let list = {
        let mut list = list;
        list.push(Box::new(openblas::OpenBlas::new(operands)) as Box<dyn Candidate>);
        list
    };
    list
}

/// tensorscope's `matmul` of a scoped tensor by a parameter, as a forward computes `x w` (or of
/// their `t()` views, read where they lie, as a backward computes `dy w^T` and `x^T dy`). The
/// output is rented from the pool and returned to it when dropped: after the first call every
/// rental is a hit on the same buffer, which is how tensorscope preallocates.
struct Tensorscope {
    shape: Shape,
    pool: Pool,
    a: Param<f32>,
    b: Param<f32>,
}

impl Tensorscope {
    fn new(operands: &Operands) -> Self {
        Self {
            shape: operands.shape,
            pool: operands.pool.clone(),
            a: operands.pa.clone(),
            b: operands.pb.clone(),
        }
    }
}

impl Tensorscope {
    /// `A B` in `s`: the stored operands bound, transposed as views where the shape says.
    fn product<'s>(&self, s: &Scope<'s, '_>) -> Tensor<'s> {
        let (a, b) = (s.bind(&self.a), s.bind(&self.b));
        let a = if self.shape.a_t { a.t() } else { a };
        let b = if self.shape.b_t { b.t() } else { b };
        a.matmul(&b)
    }
}

impl Candidate for Tensorscope {
    fn name(&self) -> &'static str {
        "tensorscope"
    }

    fn run(&mut self) {
        self.pool.scope(|s| {
            let c = self.product(s);
            black_box(c.as_slice().map(|c| c[0]));
        });
    }

    fn result(&mut self) -> Vec<f32> {
        self.pool.scope(|s| self.product(s).to_vec())
    }
}

/// Copies of the stored operands and an output, for the candidates that take raw slices.
struct Buffers {
    shape: Shape,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Buffers {
    fn new(operands: &Operands) -> Self {
        let Shape { batch, m, n, .. } = operands.shape;
        Self {
            shape: operands.shape,
            a: operands.a.clone(),
            b: operands.b.clone(),
            c: vec![0.0; batch * m * n],
        }
    }

    /// Calls `product(a, b, c)` for every product of the batch in turn: its stored operands and
    /// its row-major `[m, n]` output.
    fn each(&mut self, mut product: impl FnMut(&[f32], &[f32], &mut [f32])) {
        let Shape { batch, m, n, .. } = self.shape;
        let (a_len, b_len) = (self.a.len() / batch, self.b.len() / batch);
        let operands = self.a.chunks(a_len).zip(self.b.chunks(b_len));
        for ((a, b), c) in operands.zip(self.c.chunks_mut(m * n)) {
            product(a, b, c);
        }
        black_box(self.c[0]);
    }
}

/// `matrixmultiply::sgemm` with its `threading` feature: what ndarray's `general_mat_mul` calls
/// for `f32` without the `blas` feature (the same arguments), called directly so that it stays
/// this candidate when the `blas` feature sends `general_mat_mul` to OpenBLAS. Its AVX-512
/// kernels are off, as in ndarray, unless the `matrixmultiply-avx512` feature is on.
struct Matrixmultiply(Buffers);

impl Candidate for Matrixmultiply {
    fn name(&self) -> &'static str {
        if cfg!(feature = "matrixmultiply-avx512") {
            "matrixmultiply_avx512"
        } else {
            "matrixmultiply"
        }
    }

    fn run(&mut self) {
        let shape = self.0.shape;
        let Shape { m, k, n, .. } = shape;
        let ((ra, ca), (rb, cb)) = (shape.a_steps(), shape.b_steps());
        self.0.each(|a, b, c| {
            // SAFETY: `a` holds one stored `[m, k]` or `[k, m]` operand and `b` one `[k, n]` or
            // `[n, k]` (`Buffers::each`), which the steps of `Shape::a_steps`/`b_steps` address
            // inside those lengths; `c` holds `m * n` elements addressed row-major and is
            // borrowed mutably, so nothing else reads or writes it meanwhile.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    a.as_ptr(),
                    ra as isize,
                    ca as isize,
                    b.as_ptr(),
                    rb as isize,
                    cb as isize,
                    0.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
        });
    }

    fn result(&mut self) -> Vec<f32> {
        self.run();
        self.0.c.clone()
    }
}

/// The `gemm` crate (`gemm::gemm`, `Parallelism::Rayon(threads)`): `c = 0 c + 1 a b`, not
/// reading `c`. Its AVX-512 kernels are off (its default) unless the `gemm-avx512` feature is on.
struct Gemm(Buffers);

impl Candidate for Gemm {
    fn name(&self) -> &'static str {
        if cfg!(feature = "gemm-avx512") {
            "gemm_avx512"
        } else {
            "gemm"
        }
    }

    fn run(&mut self) {
        let shape = self.0.shape;
        let Shape { m, k, n, .. } = shape;
        let ((ra, ca), (rb, cb)) = (shape.a_steps(), shape.b_steps());
        let threads = threads();
        self.0.each(|a, b, c| {
            // SAFETY: as for `Matrixmultiply::run`: the three buffers have the lengths the shape
            // and the steps address, and `c` is borrowed mutably. `read_dst` is false, so `c`'s
            // old values are not read.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    ca as isize,
                    ra as isize,
                    b.as_ptr(),
                    cb as isize,
                    rb as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(threads),
                );
            }
        });
    }

    fn result(&mut self) -> Vec<f32> {
        self.run();
        self.0.c.clone()
    }
}

/// faer's `linalg::matmul::matmul` on row-major views (transposed where the shape says),
/// `Accum::Replace`, `Par::rayon(threads)`.
struct Faer(Buffers);

impl Candidate for Faer {
    fn name(&self) -> &'static str {
        "faer"
    }

    fn run(&mut self) {
        let shape = self.0.shape;
        let Shape { m, n, .. } = shape;
        let ([ra, ca], [rb, cb]) = (shape.a_stored(), shape.b_stored());
        let par = faer::Par::rayon(threads());
        self.0.each(|a, b, c| {
            let (a, b) = (
                faer::MatRef::from_row_major_slice(a, ra, ca),
                faer::MatRef::from_row_major_slice(b, rb, cb),
            );
            let a = if shape.a_t { a.transpose() } else { a };
            let b = if shape.b_t { b.transpose() } else { b };
            let dst = faer::MatMut::from_row_major_slice_mut(c, m, n);
            faer::linalg::matmul::matmul(dst, faer::Accum::Replace, a, b, 1.0f32, par);
        });
    }

    fn result(&mut self) -> Vec<f32> {
        self.run();
        self.0.c.clone()
    }
}

/// OpenBLAS: its thread count, what it reports about itself, and the candidate.
#[cfg(feature = "blas")]
mod openblas {
    use std::ffi::{c_char, c_int, CStr};
    use std::hint::black_box;

    use ndarray::linalg::general_mat_mul;
    use ndarray::{Array2, ArrayView2};

    use super::{Candidate, Operands};

    extern "C" {
        fn openblas_set_num_threads(n: c_int);
        fn openblas_get_config() -> *const c_char;
        fn openblas_get_corename() -> *const c_char;
    }

    pub(super) fn set_threads(n: usize) {
        let n = c_int::try_from(n).expect("a thread count fits a C int");
        // SAFETY: OpenBLAS's own setter, taking a plain int; called before any product runs.
        unsafe { openblas_set_num_threads(n) }
    }

    pub(super) fn info() -> String {
        // SAFETY: both return pointers to NUL-terminated static strings inside the library,
        // valid for the process's life; they are copied out at once.
        let (config, core) = unsafe {
            (
                CStr::from_ptr(openblas_get_config()),
                CStr::from_ptr(openblas_get_corename()),
            )
        };
        format!(
            "{} (kernel: {})",
            config.to_string_lossy(),
            core.to_string_lossy()
        )
    }

    /// ndarray's `general_mat_mul` with its `blas` feature: `cblas_sgemm` of OpenBLAS, on the
    /// stored operands' views (transposed where the shape says), one call per product.
    pub(super) struct OpenBlas {
        shape: super::Shape,
        a: Vec<f32>,
        b: Vec<f32>,
        c: Array2<f32>,
    }

    impl OpenBlas {
        pub(super) fn new(operands: &Operands) -> Self {
            let super::Shape { batch, m, n, .. } = operands.shape;
            Self {
                shape: operands.shape,
                a: operands.a.clone(),
                b: operands.b.clone(),
                c: Array2::zeros((batch * m, n)),
            }
        }
    }

    impl Candidate for OpenBlas {
        fn name(&self) -> &'static str {
            "openblas"
        }

        fn run(&mut self) {
            let shape = self.shape;
            let (a_len, b_len) = (self.a.len() / shape.batch, self.b.len() / shape.batch);
            let view = |data, [rows, cols]: [usize; 2], t| {
                let v = ArrayView2::from_shape((rows, cols), data).expect("operand length");
                if t {
                    v.reversed_axes()
                } else {
                    v
                }
            };
            let products = self.a.chunks(a_len).zip(self.b.chunks(b_len));
            let outputs = self.c.exact_chunks_mut((shape.m, shape.n));
            for ((a, b), mut c) in products.zip(outputs) {
                let a = view(a, shape.a_stored(), shape.a_t);
                let b = view(b, shape.b_stored(), shape.b_t);
                general_mat_mul(1.0, &a, &b, 0.0, &mut c);
            }
            black_box(self.c[[0, 0]]);
        }

        fn result(&mut self) -> Vec<f32> {
            self.run();
            self.c.iter().copied().collect()
        }
    }
}
