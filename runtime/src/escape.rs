//! Escape: handing values from a scope to its parent.
//!
//! [`Scope::escape`](crate::Scope::escape) takes anything that implements [`Escape`]: a tensor, and
//! tuples, arrays, `Vec`, `Option` and `Result` of escapable values, and plain values (numbers,
//! `bool`, `String`, `()`, errors and stats) that pass through unchanged.

use std::marker::PhantomData;

use crate::element::DType;
use crate::scope::{Invariant, State};
use crate::tensor::Tensor;

/// Where an escape goes: from the scope with brand `'from` to its parent, with brand `'to`. Made
/// only by [`Scope::escape`](crate::Scope::escape); implementations of [`Escape`] pass it on to
/// their fields. `'from` is invariant, so a tensor's own escape accepts only a target from its
/// brand: an implementation cannot forward a field of another scope.
pub struct EscapeTarget<'from, 'to> {
    state: State,
    _brand: PhantomData<(Invariant<'from>, &'to ())>,
}

impl EscapeTarget<'_, '_> {
    pub(crate) fn new(state: &State) -> Self {
        EscapeTarget {
            state: state.clone(),
            _brand: PhantomData,
        }
    }

    pub(crate) fn state(&self) -> &State {
        &self.state
    }
}

/// A value of the scope with brand `'from` that can be handed to an outer scope with brand `'to`.
///
/// `'from` is what makes an escape safe to allow: [`Scope::escape`](crate::Scope::escape) asks for
/// `Escape<'s, 'p>`, with `'s` the escaping scope's own (invariant) brand, so it takes only tensors of
/// that scope or of the scopes around it, never those of a deeper, sibling or unrelated scope.
///
/// Implemented for [`Tensor`], tuples of up to 8 elements, arrays, `Vec`, `Option`, `Result` (only the
/// `Ok` value is escaped; an error type holding tensors would keep its brand and not compile), and
/// for scalar types, `String`, `()`, [`Error`](crate::Error), [`Param`](crate::Param) and the stats types, which
/// pass through. Structs derive it (`#[derive(Escape)]` in `tensorscope`); other types implement it
/// with their brand as `'from`, passing the target on:
///
/// ```
/// use tensorscope::{Escape, EscapeTarget, Pool, Tensor};
///
/// enum Output<'a> {
///     One(Tensor<'a>),
///     Two(Tensor<'a>, Tensor<'a>),
/// }
///
/// impl<'a, 'to> Escape<'a, 'to> for Output<'a> {
///     type Escaped = Output<'to>;
///     fn escape_to(self, target: &EscapeTarget<'a, 'to>) -> Output<'to> {
///         match self {
///             Output::One(t) => Output::One(t.escape_to(target)),
///             Output::Two(a, b) => Output::Two(a.escape_to(target), b.escape_to(target)),
///         }
///     }
/// }
///
/// let pool = Pool::with_max_memory_mb(16);
/// pool.scope(|s| {
///     let out = s.scope(|inner| inner.escape(Output::One(inner.ones::<f32>(&[2]))));
///     assert!(matches!(out, Output::One(t) if t.to_vec() == [1.0, 1.0]));
/// });
/// ```
///
/// A target escapes from one brand only: an implementation cannot forward a field of another
/// brand than its `'from`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be escaped from a scope",
    label = "this value would leave its scope",
    note = "add `#[derive(Escape)]` to a struct of tensors, or return tensors, tuples, arrays, `Vec`, \
            `Option` or `Result` of them"
)]
pub trait Escape<'from, 'to> {
    /// The same value re-branded for the outer scope.
    type Escaped;
    /// Moves every tensor inside `self` to `target`, without copying data.
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Self::Escaped;
}

impl<'from, 'to, T: DType> Escape<'from, 'to> for Tensor<'from, T> {
    type Escaped = Tensor<'to, T>;
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Tensor<'to, T> {
        self.move_to(target.state())
    }
}

impl<'from, 'to, E: Escape<'from, 'to>> Escape<'from, 'to> for Vec<E> {
    type Escaped = Vec<E::Escaped>;
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Self::Escaped {
        self.into_iter().map(|e| e.escape_to(target)).collect()
    }
}

impl<'from, 'to, E: Escape<'from, 'to>, const N: usize> Escape<'from, 'to> for [E; N] {
    type Escaped = [E::Escaped; N];
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Self::Escaped {
        self.map(|e| e.escape_to(target))
    }
}

impl<'from, 'to, E: Escape<'from, 'to>> Escape<'from, 'to> for Option<E> {
    type Escaped = Option<E::Escaped>;
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Self::Escaped {
        self.map(|e| e.escape_to(target))
    }
}

impl<'from, 'to, E: Escape<'from, 'to>, Err> Escape<'from, 'to> for Result<E, Err> {
    type Escaped = Result<E::Escaped, Err>;
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Self::Escaped {
        self.map(|e| e.escape_to(target))
    }
}

macro_rules! escape_tuple {
    ($($name:ident)+) => {
        impl<'from, 'to, $($name: Escape<'from, 'to>),+> Escape<'from, 'to> for ($($name,)+) {
            type Escaped = ($($name::Escaped,)+);
            #[allow(non_snake_case)]
            fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Self::Escaped {
                let ($($name,)+) = self;
                ($($name.escape_to(target),)+)
            }
        }
    };
}

escape_tuple!(A);
escape_tuple!(A B);
escape_tuple!(A B C);
escape_tuple!(A B C D);
escape_tuple!(A B C D E);
escape_tuple!(A B C D E F);
escape_tuple!(A B C D E F G);
escape_tuple!(A B C D E F G H);

macro_rules! escape_plain {
    ($($t:ty)*) => {$(
        impl<'from, 'to> Escape<'from, 'to> for $t {
            type Escaped = $t;
            fn escape_to(self, _target: &EscapeTarget<'from, 'to>) -> $t {
                self
            }
        }
    )*};
}

escape_plain!(() bool char u8 u16 u32 u64 u128 usize i8 i16 i32 i64 i128 isize f32 f64 half::f16 half::bf16 String);
escape_plain!(crate::PoolStats crate::ScopeStats crate::Error);

impl<'from, 'to, T: DType> Escape<'from, 'to> for crate::Param<T> {
    type Escaped = Self;
    /// A parameter belongs to no scope: it passes through unchanged.
    fn escape_to(self, _target: &EscapeTarget<'from, 'to>) -> Self {
        self
    }
}
