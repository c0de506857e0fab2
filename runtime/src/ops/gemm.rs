//! Large matrix products of `f32` and `f64` on the [`gemm`](https://docs.rs/gemm) crate (pure Rust, its
//! own runtime dispatch to AVX-512/AVX2/FMA kernels, both cores through rayon), which measured 1.43x
//! (`[256, 1024] x [1024, 1024]`) and 1.56x (`[16384, 64] x [64, 64]`) faster than
//! `matrixmultiply` here (`cargo bench --bench matmul`, docs/benchmarks.md). `f16` and `bf16` keep
//! ndarray's generic product.
#![allow(unsafe_code)]

/// Multiply-adds from which a product runs here rather than on `matrixmultiply`. Below, on the
/// reference forward E's `[16384, 64] x [64, 64]`, `gemm` was faster alone (1.56x in `cargo bench
/// --bench matmul`) but slower in the forward: after a parallel product rayon's workers spin for a
/// while, which on a 2-core machine slows the single-threaded elementwise ops that follow (E took 79
/// to 95 ms against 67 to 71 on `matrixmultiply`), and on one core it is slower than
/// `matrixmultiply` on two.
pub(crate) const LARGE: usize = 1 << 28;

/// `c = a b` for row-major `a: [m, k]`, `b: [k, n]`, `c: [m, n]`, in `f32` or `f64` (`T` is checked
/// by the caller: [`Element::GEMM`](crate::Element)).
pub(crate) fn product<T: Copy + Default + 'static>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    (m, k, n): (usize, usize, usize),
    (zero, one): (T, T),
) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "gemm: slices shorter than [{m}, {k}] x [{k}, {n}] -> [{m}, {n}]"
    );
    if k == 0 {
        // An empty sum: zeros, whatever the buffer held.
        c[..m * n].fill(zero);
        return;
    }
    let (k_, n_) = (k as isize, n as isize);
    // SAFETY: `a`, `b` and `c` hold at least `m k`, `k n` and `m n` elements (asserted above), laid
    // out row-major with the strides given (column stride 1, row strides k, n and n), so every
    // element `gemm` reads or writes is inside them; `c` is a unique borrow, so it aliases neither
    // `a` nor `b`; `T` is `f32` or `f64`, both of which `gemm` supports (it panics on other types,
    // which is safe); `read_dst` is false, so `c`'s old contents are never read.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n_,
            false,
            a.as_ptr(),
            1,
            k_,
            b.as_ptr(),
            1,
            n_,
            zero,
            one,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}
