//! Elementwise loops compiled three times (AVX-512, AVX2, baseline) and chosen at run time by the
//! CPU's features, so that one build vectorises as wide as the machine allows: the kernels of
//! `ops::kernels` run 2x faster with AVX2 and 4x faster with AVX-512 than with the SSE2 that every
//! x86-64 has (measured in `docs/benchmarks.md`). Other targets run the baseline loop.
//!
//! The same IEEE operations run at every width (Rust never fuses `a * b + c` into an FMA on its
//! own), so every level gives the same bits. Loops that want FMA say so ([`FmaKernel`]: the matrix
//! products) and get an AVX2 + FMA variant.
//!
//! Large loops are split over the worker threads ([`crate::threads`]).
//!
//! The `unsafe` here is calling a function compiled for features the CPU is first checked to have.
#![allow(unsafe_code)]

use crate::threads;

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

/// A loop using `mul_add`, which compiles to one instruction with FMA and to a slow library call
/// without it: with `FMA` false it must use `a * b + c` instead. Inline as for [`Kernel`].
pub(crate) trait FmaKernel {
    type Out;
    fn run<const FMA: bool>(self) -> Self::Out;
}

/// Runs `k` with FMA, compiled for AVX2 and FMA, if the CPU has both; else without, at the baseline.
#[inline]
pub(crate) fn dispatch_fma<K: FmaKernel>(k: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above), all `avx2_fma` needs.
            return unsafe { avx2_fma(k) };
        }
    }
    k.run::<false>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_fma<K: FmaKernel>(k: K) -> K::Out {
    k.run::<true>()
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

/// Elements per thread below which an elementwise loop is not split: waking a worker costs about
/// as much as this many elements of the cheapest op.
const PER_PART: usize = 1 << 16;

/// `x = f(x)` for every element, split over the threads when `xs` is large.
pub(crate) fn map_in_place<T: Copy + Send>(xs: &mut [T], f: impl Fn(T) -> T + Sync) {
    struct Map<'a, T, F>(&'a mut [T], &'a F);
    impl<T: Copy, F: Fn(T) -> T> Kernel for Map<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Map(xs, f) = self;
            for x in xs {
                *x = (*f)(*x);
            }
        }
    }
    threads::split_mut(xs, 1, PER_PART, |_, xs| dispatch(Map(xs, &f)));
}

/// `dst[i] = f(src[i])`, split over the threads when large.
pub(crate) fn map_into<T: Copy + Sync, U: Send>(
    dst: &mut [U],
    src: &[T],
    f: impl Fn(T) -> U + Sync,
) {
    struct Map<'a, T, U, F>(&'a mut [U], &'a [T], &'a F);
    impl<T: Copy, U, F: Fn(T) -> U> Kernel for Map<'_, T, U, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Map(dst, src, f) = self;
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = (*f)(x);
            }
        }
    }
    threads::split_mut(dst, 1, PER_PART, |start, dst| {
        dispatch(Map(dst, &src[start..], &f))
    });
}

/// `dst[i] = f(a[i], b[i])`, split over the threads when large.
pub(crate) fn zip_into<T: Copy + Send + Sync>(
    dst: &mut [T],
    (a, b): (&[T], &[T]),
    f: impl Fn(T, T) -> T + Sync,
) {
    struct Zip<'a, T, F>(&'a mut [T], &'a [T], &'a [T], &'a F);
    impl<T: Copy, F: Fn(T, T) -> T> Kernel for Zip<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Zip(dst, a, b, f) = self;
            for (d, (&x, &y)) in dst.iter_mut().zip(a.iter().zip(b)) {
                *d = (*f)(x, y);
            }
        }
    }
    threads::split_mut(dst, 1, PER_PART, |start, dst| {
        let len = dst.len();
        dispatch(Zip(dst, &a[start..][..len], &b[start..][..len], &f))
    });
}

/// `(w[i], s(i)) = f(w[i], s(i), g[i])` for every element: an optimizer's update of a parameter
/// `w` and its states `S` (one slice, or a pair) from the gradient `g`, compiled for the widest
/// instruction set (not split over threads).
pub(crate) fn update<T: Copy, S: States<T>>(
    w: &mut [T],
    states: S,
    g: &[T],
    f: impl Fn(T, S::Values, T) -> (T, S::Values),
) {
    struct Update<'a, T, S, F>(&'a mut [T], S, &'a [T], &'a F);
    impl<T: Copy, S: States<T>, F: Fn(T, S::Values, T) -> (T, S::Values)> Kernel
        for Update<'_, T, S, F>
    {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Update(w, states, g, f) = self;
            states.zip(w, g, f);
        }
    }
    dispatch(Update(w, states, g, &f));
}

/// The per-element states of an optimizer: one slice, or a pair of them, walked beside the
/// parameter and the gradient.
pub(crate) trait States<T> {
    /// The states of one element.
    type Values: Copy;
    /// `(w[i], states of i) = f(w[i], states of i, g[i])` for every element, the slices zipped so
    /// that the loop vectorises.
    fn zip(self, w: &mut [T], g: &[T], f: &impl Fn(T, Self::Values, T) -> (T, Self::Values));
}

impl<T: Copy> States<T> for &mut [T] {
    type Values = T;
    #[inline(always)]
    fn zip(self, w: &mut [T], g: &[T], f: &impl Fn(T, T, T) -> (T, T)) {
        for ((w, s), &g) in w.iter_mut().zip(self).zip(g) {
            (*w, *s) = f(*w, *s, g);
        }
    }
}

impl<T: Copy> States<T> for (&mut [T], &mut [T]) {
    type Values = (T, T);
    #[inline(always)]
    fn zip(self, w: &mut [T], g: &[T], f: &impl Fn(T, (T, T), T) -> (T, (T, T))) {
        for ((w, (s, t)), &g) in w.iter_mut().zip(self.0.iter_mut().zip(self.1)).zip(g) {
            (*w, (*s, *t)) = f(*w, (*s, *t), g);
        }
    }
}

/// `dst[i] = f(dst[i], other[i % other.len()])`: `other` the same length as `dst`, or a block
/// repeated along it (a bias row over a batch). Split over the threads when large.
pub(crate) fn zip_in_place<T: Copy + Send + Sync>(
    dst: &mut [T],
    other: &[T],
    f: impl Fn(T, T) -> T + Sync,
) {
    struct Zip<'a, T, F>(&'a mut [T], &'a [T], &'a F);
    impl<T: Copy, F: Fn(T, T) -> T> Kernel for Zip<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Zip(dst, other, f) = self;
            for chunk in dst.chunks_exact_mut(other.len()) {
                for (d, &o) in chunk.iter_mut().zip(other) {
                    *d = (*f)(*d, o);
                }
            }
        }
    }
    if other.is_empty() {
        return;
    }
    if other.len() == dst.len() {
        // Same length: any split lines up.
        threads::split_mut(dst, 1, PER_PART, |start, dst| {
            dispatch(Zip(dst, &other[start..][..dst.len()], &f))
        });
    } else {
        // Runs of whole repeats of `other`.
        let repeats = PER_PART.div_ceil(other.len());
        threads::split_mut(dst, other.len(), repeats, |_, dst| {
            dispatch(Zip(dst, other, &f))
        });
    }
}

/// Applies `kernel` to every `lane`-long run of `xs` (the lanes along a last axis), split over the
/// threads when `xs` is large.
pub(crate) fn lanes<T: Send>(xs: &mut [T], lane: usize, kernel: impl Fn(&mut [T]) + Sync) {
    let per_part = PER_PART.div_ceil(lane.max(1));
    threads::split_mut(xs, lane, per_part, |_, xs| {
        xs.chunks_exact_mut(lane).for_each(&kernel)
    });
}
