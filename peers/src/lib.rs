//! tensorscope's `matmul` against other `f32` matrix products, on the same operands, each writing
//! into an output it owns, all on [`THREADS`] threads.
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

/// Threads every candidate runs on.
pub const THREADS: usize = 2;

/// One product `[m, k] x [k, n]`, row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Short name used in bench ids and tables.
    pub name: &'static str,
    /// Rows of `a` and of the output.
    pub m: usize,
    /// Columns of `a`, rows of `b`.
    pub k: usize,
    /// Columns of `b` and of the output.
    pub n: usize,
}

impl Shape {
    /// `[m, k] x [k, n]`, named `name`.
    pub const fn new(name: &'static str, m: usize, k: usize, n: usize) -> Self {
        Self { name, m, k, n }
    }

    /// Floating-point operations of the product: a multiply and an add per term.
    pub fn flops(&self) -> u64 {
        2 * (self.m * self.k * self.n) as u64
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Shape { name, m, k, n } = *self;
        write!(f, "{name}: [{m}, {k}] x [{k}, {n}]")
    }
}

/// The shapes compared: the reference forwards' products (M, E), one step of training an MLP
/// block of width 128 and hidden width 256 at batch 32 (the forward product and the two products
/// of its backward, `dx = dy w^T` and `dw = x^T dy`, which tensorscope computes on contiguous
/// transposed copies), and a square product.
pub const SHAPES: [Shape; 6] = [
    Shape::new("M", 256, 1024, 1024),
    Shape::new("E", 16384, 64, 64),
    Shape::new("T_fwd", 32, 128, 256),
    Shape::new("T_dx", 32, 256, 128),
    Shape::new("T_dw", 128, 32, 256),
    Shape::new("S", 1024, 1024, 1024),
];

/// Makes every candidate's thread count [`THREADS`]. Call it first thing in `main`, before any
/// product runs and before the process starts a thread: tensorscope and matrixmultiply read their
/// variable once, on first use (`TENSORSCOPE_THREADS`, `MATMUL_NUM_THREADS`). gemm and faer take
/// the count per call; OpenBLAS reads its variable when the library loads, so it is told by a call.
pub fn use_threads() {
    let n = THREADS.to_string();
    std::env::set_var("TENSORSCOPE_THREADS", &n);
    std::env::set_var("MATMUL_NUM_THREADS", &n);
    #[cfg(feature = "blas")]
    openblas::set_threads(THREADS);
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
        let Shape { m, k, n, .. } = operands.shape;
        let entries = (0..m).map(|i| (i, (i * 7919) % n));
        let entries = entries.chain((0..n).map(|j| ((j * 104_729) % m, j)));
        for (i, j) in entries {
            let (mut exact, mut size) = (0.0f64, 0.0f64);
            for p in 0..k {
                let term = f64::from(operands.a[i * k + p]) * f64::from(operands.b[p * n + j]);
                exact += term;
                size += term.abs();
            }
            let got = f64::from(c[i * n + j]);
            let bound = k as f64 * f64::from(f32::EPSILON) * size + f64::from(f32::MIN_POSITIVE);
            if (got - exact).abs() > bound {
                return Err(format!(
                    "{} on {}: c[{i}, {j}] = {got}, expected {exact} (bound {bound:.3e})",
                    self.name(),
                    operands.shape
                ));
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
    /// `[m, k]`, row-major.
    pub a: Vec<f32>,
    /// `[k, n]`, row-major.
    pub b: Vec<f32>,
    pool: Pool,
    pa: Param<f32>,
    pb: Param<f32>,
}

impl Operands {
    /// Draws `a` and `b` for `shape`.
    pub fn new(shape: Shape) -> Self {
        let Shape { m, k, n, .. } = shape;
        // Room for the operands and a few outputs of the largest shape.
        let pool = Pool::with_max_memory_mb(256);
        let (pa, pb) = pool.scope(|s| {
            (
                s.randn::<f32>(&[m, k], 1).detach(),
                s.randn::<f32>(&[k, n], 2).detach(),
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

/// tensorscope's `matmul` of a scoped tensor by a parameter, as a forward computes `x w`. The
/// output is rented from the pool and returned to it when dropped: after the first call every
/// rental is a hit on the same buffer, which is how tensorscope preallocates.
struct Tensorscope {
    pool: Pool,
    a: Param<f32>,
    b: Param<f32>,
}

impl Tensorscope {
    fn new(operands: &Operands) -> Self {
        Self {
            pool: operands.pool.clone(),
            a: operands.pa.clone(),
            b: operands.pb.clone(),
        }
    }
}

impl Candidate for Tensorscope {
    fn name(&self) -> &'static str {
        "tensorscope"
    }

    fn run(&mut self) {
        self.pool.scope(|s| {
            let c = s.bind(&self.a).matmul(&self.b);
            black_box(c.as_slice()[0]);
        });
    }

    fn result(&mut self) -> Vec<f32> {
        self.pool
            .scope(|s| s.bind(&self.a).matmul(&self.b).as_slice().to_vec())
    }
}

/// Row-major copies of the operands and an output, for the candidates that take raw slices.
struct Buffers {
    shape: Shape,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl Buffers {
    fn new(operands: &Operands) -> Self {
        let Shape { m, n, .. } = operands.shape;
        Self {
            shape: operands.shape,
            a: operands.a.clone(),
            b: operands.b.clone(),
            c: vec![0.0; m * n],
        }
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
        let Buffers {
            shape: Shape { m, k, n, .. },
            a,
            b,
            c,
        } = &mut self.0;
        let (m, k, n) = (*m, *k, *n);
        // SAFETY: `a` holds `m * k` elements, `b` `k * n` and `c` `m * n` (made so in
        // `Buffers::new`), and the strides below address them row-major, inside those lengths;
        // `c` is borrowed mutably, so nothing else reads or writes it meanwhile.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                n as isize,
                1,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        }
        black_box(c[0]);
    }

    fn result(&mut self) -> Vec<f32> {
        self.run();
        self.0.c.clone()
    }
}

/// The `gemm` crate (`gemm::gemm`, `Parallelism::Rayon(THREADS)`): `c = 0 c + 1 a b`, not
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
        let Buffers {
            shape: Shape { m, k, n, .. },
            a,
            b,
            c,
        } = &mut self.0;
        let (m, k, n) = (*m, *k, *n);
        // SAFETY: as for `Matrixmultiply::run`: the three buffers have the lengths the shape
        // and the row-major strides (column stride 1, row stride the row length) address, and
        // `c` is borrowed mutably. `read_dst` is false, so `c`'s old values are not read.
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
                1,
                k as isize,
                b.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(THREADS),
            );
        }
        black_box(c[0]);
    }

    fn result(&mut self) -> Vec<f32> {
        self.run();
        self.0.c.clone()
    }
}

/// faer's `linalg::matmul::matmul` on row-major views, `Accum::Replace`, `Par::rayon(THREADS)`.
struct Faer(Buffers);

impl Candidate for Faer {
    fn name(&self) -> &'static str {
        "faer"
    }

    fn run(&mut self) {
        let Buffers {
            shape: Shape { m, k, n, .. },
            a,
            b,
            c,
        } = &mut self.0;
        let a = faer::MatRef::from_row_major_slice(a, *m, *k);
        let b = faer::MatRef::from_row_major_slice(b, *k, *n);
        let dst = faer::MatMut::from_row_major_slice_mut(c, *m, *n);
        faer::linalg::matmul::matmul(
            dst,
            faer::Accum::Replace,
            a,
            b,
            1.0f32,
            faer::Par::rayon(THREADS),
        );
        black_box(c[0]);
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
    use ndarray::Array2;

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

    /// ndarray's `general_mat_mul` with its `blas` feature: `cblas_sgemm` of OpenBLAS.
    pub(super) struct OpenBlas {
        a: Array2<f32>,
        b: Array2<f32>,
        c: Array2<f32>,
    }

    impl OpenBlas {
        pub(super) fn new(operands: &Operands) -> Self {
            let super::Shape { m, k, n, .. } = operands.shape;
            let array = |rows, cols, data: &[f32]| {
                Array2::from_shape_vec((rows, cols), data.to_vec()).expect("operand length")
            };
            Self {
                a: array(m, k, &operands.a),
                b: array(k, n, &operands.b),
                c: Array2::zeros((m, n)),
            }
        }
    }

    impl Candidate for OpenBlas {
        fn name(&self) -> &'static str {
            "openblas"
        }

        fn run(&mut self) {
            general_mat_mul(1.0, &self.a, &self.b, 0.0, &mut self.c);
            black_box(self.c[[0, 0]]);
        }

        fn result(&mut self) -> Vec<f32> {
            self.run();
            self.c.iter().copied().collect()
        }
    }
}
