//! Heap allocations kept for reuse on each thread, so that a steady-state forward or training step
//! allocates nothing: the bookkeeping of every step (tensor records, scope states, graph nodes, the
//! backward walk's work lists, checkpoint tapes) has the same shape as the last step's, so it can
//! live in the allocations the last step let go of.
//!
//! One mechanism serves every type: a per-thread list of spares per type (found by [`TypeId`]),
//! bounded in count, and two handles that draw from it and give back to it.
//!
//! - [`Recycled`]: a reference-counted record (`Rc` or `Arc`) of a value. When its last handle drops,
//!   the value is dropped at once, as with a plain `Rc`, and the emptied record waits among the
//!   spares for the next value of its type.
//! - [`RecycledVec`]: a `Vec` whose buffer, emptied, goes back to the spares when it drops.
//!
//! Nothing here is needed for memory safety: the spares are owned values (an emptied record, an
//! empty `Vec`), so a handle that is never dropped (`mem::forget`) only keeps its allocation from
//! being reused, and a spare list that is full, or gone during thread teardown, frees what it is
//! given.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;
use std::sync::Arc;

/// Spare records kept per type and thread: more than a step of a deep model holds at once is never
/// needed, and an empty record is a few words.
const RECORDS_KEPT: usize = 4096;
/// Spare lists kept per type and thread: as many as are in use at once (a backward's lists, nested
/// in a checkpointed region's).
const LISTS_KEPT: usize = 32;
/// A list whose buffer is larger than this is freed rather than kept, so that one huge step does
/// not hold its lists' memory for good.
const LIST_BYTES_KEPT: usize = 1 << 20;

thread_local! {
    /// For each type `X` with spares, a `Vec<X>` of them, found by `X`'s `TypeId`.
    // `const`: an access then skips the lazy-initialisation check (one take and one keep per
    // recorded op, and per tensor and node record).
    static SPARES: RefCell<HashMap<TypeId, Box<dyn Any>, ById>> =
        const { RefCell::new(HashMap::with_hasher(ById)) };
}

/// Hashes a `TypeId` as the `u64` it writes, already a hash: one multiply-free step where the
/// default hasher runs SipHash on every take and keep (one each per recorded op).
#[derive(Clone, Copy, Default)]
struct ById;

impl std::hash::BuildHasher for ById {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Not how a `TypeId` hashes itself today, but correct for any bytes.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 ^= n;
    }
}

/// A spare `X` of this thread, if there is one.
fn take<X: 'static>() -> Option<X> {
    SPARES
        .try_with(|spares| {
            let mut spares = spares.try_borrow_mut().ok()?;
            let list = spares.get_mut(&TypeId::of::<X>())?;
            list.downcast_mut::<Vec<X>>()?.pop()
        })
        .ok()
        .flatten()
}

/// Keeps `spare` for a later [`take`], unless `kept` of its type are waiting already. Whatever is
/// not kept is dropped after the list is released (a spare holds no value, so dropping it runs no
/// code of ours; this only keeps the order obvious).
fn keep<X: 'static>(spare: X, kept: usize) {
    let rejected = SPARES.try_with(|spares| {
        let Ok(mut spares) = spares.try_borrow_mut() else {
            return Some(spare);
        };
        let list = spares
            .entry(TypeId::of::<X>())
            .or_insert_with(|| Box::new(Vec::<X>::new()));
        match list.downcast_mut::<Vec<X>>() {
            Some(list) if list.len() < kept => {
                list.push(spare);
                None
            }
            _ => Some(spare),
        }
    });
    drop(rejected);
}

/// A reference-counted pointer to an optional value: `Rc<Option<V>>` or `Arc<Option<V>>`. The
/// record is empty (`None`) only while it waits among the spares.
pub(crate) trait Shared: Clone + 'static {
    /// What the record holds.
    type Value: 'static;
    /// A new record of `value`.
    fn new(value: Option<Self::Value>) -> Self;
    /// The contents, if this is the only handle.
    fn slot(this: &mut Self) -> Option<&mut Option<Self::Value>>;
    /// The contents.
    fn contents(this: &Self) -> &Option<Self::Value>;
    /// Handles on the record, this one included.
    fn count(this: &Self) -> usize;
    /// The record's address: equal for handles on one record.
    fn addr(this: &Self) -> usize;
}

macro_rules! shared {
    ($pointer:ident) => {
        impl<V: 'static> Shared for $pointer<Option<V>> {
            type Value = V;
            fn new(value: Option<V>) -> Self {
                $pointer::new(value)
            }
            fn slot(this: &mut Self) -> Option<&mut Option<V>> {
                $pointer::get_mut(this)
            }
            fn contents(this: &Self) -> &Option<V> {
                this
            }
            fn count(this: &Self) -> usize {
                $pointer::strong_count(this)
            }
            fn addr(this: &Self) -> usize {
                $pointer::as_ptr(this) as usize
            }
        }
    };
}
shared!(Rc);
shared!(Arc);

/// A handle on a shared value whose record is reused (see the module docs): cloned, compared and
/// read like an `Rc`/`Arc`.
pub(crate) struct Recycled<P: Shared>(P);

/// A recycled `Rc`.
pub(crate) type RecycledRc<V> = Recycled<Rc<Option<V>>>;
/// A recycled `Arc`, for values shared between threads (a record is kept by the thread that
/// drops its last handle).
pub(crate) type RecycledArc<V> = Recycled<Arc<Option<V>>>;

impl<P: Shared> Recycled<P> {
    /// A handle on `value`, in a spare record if this thread has one.
    pub(crate) fn new(value: P::Value) -> Self {
        if let Some(mut record) = take::<P>() {
            if let Some(slot) = P::slot(&mut record) {
                *slot = Some(value);
                return Recycled(record);
            }
        }
        Recycled(P::new(Some(value)))
    }

    /// The value, if this is the only handle on it.
    pub(crate) fn get_mut(&mut self) -> Option<&mut P::Value> {
        P::slot(&mut self.0).and_then(Option::as_mut)
    }

    /// The value itself, if this is the only handle on it (the record goes to the spares); else
    /// the handle back.
    pub(crate) fn into_unique(mut self) -> Result<P::Value, Self> {
        match P::slot(&mut self.0).and_then(Option::take) {
            Some(value) => Ok(value),
            None => Err(self),
        }
    }

    /// Handles on the value, this one included.
    pub(crate) fn handles(this: &Self) -> usize {
        P::count(&this.0)
    }

    /// Whether `a` and `b` are handles on one value.
    pub(crate) fn ptr_eq(a: &Self, b: &Self) -> bool {
        P::addr(&a.0) == P::addr(&b.0)
    }
}

impl<P: Shared> Deref for Recycled<P> {
    type Target = P::Value;
    fn deref(&self) -> &P::Value {
        P::contents(&self.0)
            .as_ref()
            .expect("a record is emptied only when its last handle drops")
    }
}

impl<P: Shared> Clone for Recycled<P> {
    fn clone(&self) -> Self {
        Recycled(self.0.clone())
    }
}

impl<P: Shared> Drop for Recycled<P> {
    fn drop(&mut self) {
        if let Some(slot) = P::slot(&mut self.0) {
            // The last handle: the value is dropped now (with nothing borrowed: its own drop may
            // recycle), then the emptied record is kept (this handle's count then drops to the
            // spare's one).
            drop(slot.take());
            keep(self.0.clone(), RECORDS_KEPT);
        }
    }
}

/// A boxed value whose allocation is reused: a graph node's op record, a tape's step. Made by
/// [`slot`] (from a spare box of its type, if this thread has one) and given back by
/// [`recycle_slot`]; a trait object over it gives itself back from its own `recycle` method.
pub(crate) struct Slot<V>(Option<V>);

impl<V> Slot<V> {
    /// The value; a slot is empty only while it waits among the spares.
    pub(crate) fn get(&self) -> &V {
        self.0.as_ref().expect("a slot in use holds its value")
    }

    /// The value, writable.
    pub(crate) fn get_mut(&mut self) -> &mut V {
        self.0.as_mut().expect("a slot in use holds its value")
    }
}

/// A box holding `value`, in a spare box of its type if this thread has one.
pub(crate) fn slot<V: 'static>(value: V) -> Box<Slot<V>> {
    match take::<Box<Slot<V>>>() {
        Some(mut spare) => {
            spare.0 = Some(value);
            spare
        }
        None => Box::new(Slot(Some(value))),
    }
}

/// Drops the value in `slot` and keeps the box for the next [`slot`] of its type.
pub(crate) fn recycle_slot<V: 'static>(mut slot: Box<Slot<V>>) {
    // The value drops here, before the spares are borrowed: its own drop may recycle.
    slot.0 = None;
    keep(slot, RECORDS_KEPT);
}

/// A `Vec` whose buffer is reused: it starts from a spare buffer of this thread (empty, with the
/// capacity an earlier list grew to) and gives its buffer back, emptied, when it drops.
pub(crate) struct RecycledVec<X: 'static>(Vec<X>);

impl<X: 'static> RecycledVec<X> {
    /// An empty list, on a spare buffer if this thread has one.
    pub(crate) fn new() -> Self {
        RecycledVec(take::<Vec<X>>().unwrap_or_default())
    }

    /// An empty list without a buffer, for a list that stays empty in most uses: it takes no
    /// spare that another list could use (a push allocates, and the buffer is kept at drop).
    pub(crate) fn empty() -> Self {
        RecycledVec(Vec::new())
    }

    /// Pushes `x`, on a spare buffer if the list has none yet (made by [`RecycledVec::empty`]).
    pub(crate) fn push_spared(&mut self, x: X) {
        if self.0.capacity() == 0 {
            self.0 = take::<Vec<X>>().unwrap_or_default();
        }
        self.0.push(x);
    }
}

impl<X: 'static> Default for RecycledVec<X> {
    fn default() -> Self {
        RecycledVec::new()
    }
}

impl<X: 'static> FromIterator<X> for RecycledVec<X> {
    fn from_iter<I: IntoIterator<Item = X>>(iter: I) -> Self {
        let mut list = RecycledVec::new();
        list.extend(iter);
        list
    }
}

impl<'a, X: 'static> IntoIterator for &'a RecycledVec<X> {
    type Item = &'a X;
    type IntoIter = std::slice::Iter<'a, X>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<X: 'static> Deref for RecycledVec<X> {
    type Target = Vec<X>;
    fn deref(&self) -> &Vec<X> {
        &self.0
    }
}

impl<X: 'static> DerefMut for RecycledVec<X> {
    fn deref_mut(&mut self) -> &mut Vec<X> {
        &mut self.0
    }
}

impl<X: 'static> Drop for RecycledVec<X> {
    fn drop(&mut self) {
        let mut list = std::mem::take(&mut self.0);
        // The items drop here, before the spares are borrowed: their own drops may recycle.
        list.clear();
        let bytes = list.capacity().saturating_mul(std::mem::size_of::<X>());
        if list.capacity() > 0 && bytes <= LIST_BYTES_KEPT {
            keep(list, LISTS_KEPT);
        }
    }
}

/// A short list held inline: the inputs of an op and their gradients are one or two in almost
/// every op, so two sit in place (padded with `X::default()`) and longer lists go to a
/// [`RecycledVec`].
pub(crate) enum Few<X: 'static> {
    Two([X; 2]),
    Many(RecycledVec<X>),
}

impl<X: Default + 'static> Default for Few<X> {
    fn default() -> Self {
        Few::Two([X::default(), X::default()])
    }
}

impl<X: Default + 'static> FromIterator<X> for Few<X> {
    fn from_iter<I: IntoIterator<Item = X>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let (a, b) = (iter.next(), iter.next());
        match iter.next() {
            None => Few::Two([a.unwrap_or_default(), b.unwrap_or_default()]),
            Some(c) => Few::Many(a.into_iter().chain(b).chain([c]).chain(iter).collect()),
        }
    }
}

impl<X: 'static> Deref for Few<X> {
    type Target = [X];
    fn deref(&self) -> &[X] {
        match self {
            Few::Two(two) => two,
            Few::Many(many) => many,
        }
    }
}

impl<X: 'static> DerefMut for Few<X> {
    fn deref_mut(&mut self) -> &mut [X] {
        match self {
            Few::Two(two) => two,
            Few::Many(many) => many,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_record_holds_the_next_value() {
        let first = RecycledRc::new(String::from("first"));
        let addr = Shared::addr(&first.0);
        drop(first);
        let second = RecycledRc::new(String::from("second"));
        assert_eq!((Shared::addr(&second.0), second.as_str()), (addr, "second"));
    }

    #[test]
    fn a_shared_record_is_not_taken_apart() {
        let a = RecycledArc::new(7u32);
        let b = a.clone();
        let a = a.into_unique().expect_err("b still holds the value");
        assert_eq!((RecycledArc::handles(&a), *b), (2, 7));
        drop(b);
        assert_eq!(a.into_unique().ok(), Some(7));
    }

    #[test]
    fn a_dropped_list_lends_its_buffer_to_the_next() {
        let mut list: RecycledVec<u16> = (0..100).collect();
        list.push(100);
        let capacity = list.capacity();
        drop(list);
        let next = RecycledVec::<u16>::new();
        assert!(next.is_empty() && next.capacity() == capacity);
    }

    #[test]
    fn spares_are_bounded() {
        let records: Vec<RecycledRc<u8>> =
            (0..RECORDS_KEPT + 10).map(|_| RecycledRc::new(1)).collect();
        drop(records);
        let kept = SPARES.with_borrow(|spares| {
            let list = spares.get(&TypeId::of::<Rc<Option<u8>>>())?;
            list.downcast_ref::<Vec<Rc<Option<u8>>>>().map(Vec::len)
        });
        assert_eq!(kept, Some(RECORDS_KEPT));
    }

    #[test]
    fn few_holds_two_inline_and_more_in_a_list() {
        let two: Few<Option<u8>> = [Some(1)].into_iter().collect();
        assert!(matches!(two, Few::Two(_)) && two[..] == [Some(1), None]);
        let many: Few<Option<u8>> = (0..3).map(Some).collect();
        assert!(matches!(many, Few::Many(_)) && many[..] == [Some(0), Some(1), Some(2)]);
    }
}
