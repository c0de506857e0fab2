//! Elementwise loops compiled three times (AVX-512, AVX2, baseline) and chosen at run time by the
//! CPU's features, so that one build vectorises as wide as the machine allows: the kernels of
//! `ops::kernels` run 2x faster with AVX2 and 4x faster with AVX-512 than with the SSE2 that every
//! x86-64 has (measured in `docs/benchmarks.md`). Other targets run the baseline loop.
//!
//! The same IEEE operations run at every width (Rust never fuses `a * b + c` into an FMA on its
//! own), so every level gives the same bits.
//!
//! The one `unsafe` of the library is here: calling a function compiled for features the CPU is
//! first checked to have.
#![allow(unsafe_code)]

/// A loop to run at the widest vector width the CPU has. `run` must be `#[inline(always)]`, and so
/// must the closures it calls, so that the whole loop compiles inside each width's function rather
/// than being called from it: `for` loops, not `Iterator::for_each`, whose closure would not be
/// inlined across codegen units.
pub(crate) trait Kernel {
    type Out;
    fn run(self) -> Self::Out;
}

/// Runs `k` compiled for the widest instruction set this CPU has.
#[inline]
pub(crate) fn dispatch<K: Kernel>(k: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512dq")
            && std::is_x86_feature_detected!("avx512bw")
        {
            // SAFETY: the CPU has every feature `avx512` is compiled for (checked just above),
            // which is the only requirement of calling it.
            return unsafe { avx512(k) };
        }
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above), the only feature `avx2` needs.
            return unsafe { avx2(k) };
        }
    }
    k.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw")]
unsafe fn avx512<K: Kernel>(k: K) -> K::Out {
    k.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2<K: Kernel>(k: K) -> K::Out {
    k.run()
}

/// `x = f(x)` for every element.
pub(crate) fn map_in_place<T: Copy>(xs: &mut [T], f: impl Fn(T) -> T) {
    struct Map<'a, T, F>(&'a mut [T], F);
    impl<T: Copy, F: Fn(T) -> T> Kernel for Map<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Map(xs, f) = self;
            for x in xs {
                *x = f(*x);
            }
        }
    }
    dispatch(Map(xs, f));
}

/// `dst[i] = f(src[i])`.
pub(crate) fn map_into<T: Copy, U>(dst: &mut [U], src: &[T], f: impl Fn(T) -> U) {
    struct Map<'a, T, U, F>(&'a mut [U], &'a [T], F);
    impl<T: Copy, U, F: Fn(T) -> U> Kernel for Map<'_, T, U, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Map(dst, src, f) = self;
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = f(x);
            }
        }
    }
    dispatch(Map(dst, src, f));
}

/// `dst[i] = f(dst[i], other[i % other.len()])`: `other` the same length as `dst`, or a block
/// repeated along it (a bias row over a batch).
pub(crate) fn zip_in_place<T: Copy>(dst: &mut [T], other: &[T], f: impl Fn(T, T) -> T) {
    struct Zip<'a, T, F>(&'a mut [T], &'a [T], F);
    impl<T: Copy, F: Fn(T, T) -> T> Kernel for Zip<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Zip(dst, other, f) = self;
            for chunk in dst.chunks_exact_mut(other.len()) {
                for (d, &o) in chunk.iter_mut().zip(other) {
                    *d = f(*d, o);
                }
            }
        }
    }
    if !other.is_empty() {
        dispatch(Zip(dst, other, f));
    }
}
