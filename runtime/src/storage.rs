//! The shared record behind a rented tensor: its buffer and the scope charged for it, counted by
//! `Rc` so that clones are zero-copy aliases.
//!
//! A record's own heap allocation is reused: when the last handle drops, the buffer goes back to
//! its pool at once and the emptied record waits in a per-thread list of spares for the next rent.
//! A steady-state forward therefore makes no heap allocation for its tensors' bookkeeping (counted
//! in `tests/allocations.rs`).

use std::any::Any;
use std::cell::RefCell;
use std::ops::Deref;
use std::rc::Rc;

use crate::element::DType;
use crate::pool::PoolBuffer;
use crate::scope::ScopeState;

/// Spare records kept per thread; more than a forward has tensors alive at once is never needed.
const SPARES: usize = 256;

thread_local! {
    /// Emptied records of any element type, reused by [`Rented::new`].
    static SPARE: RefCell<Vec<Rc<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// A rented buffer and the scope whose accounting it is charged to.
pub(crate) struct Storage<T: DType> {
    pub(crate) buf: PoolBuffer<T>,
    /// The scope whose stats and budgets count the buffer; an escape to a longer-lived scope moves
    /// the charge there. (Where a handle's ops rent is the handle's own `Tensor::rents_in`.)
    pub(crate) charged_to: RefCell<Rc<ScopeState>>,
    /// The buffer was moved into a [`crate::Param`]: the scope charged counted the escape.
    pub(crate) detached: bool,
}

impl<T: DType> Drop for Storage<T> {
    fn drop(&mut self) {
        if !self.detached {
            self.charged_to
                .borrow()
                .on_release(self.buf.allocated_bytes());
        }
        // `buf` drops next and returns to its pool.
    }
}

/// One handle on a [`Storage`]; the record is present for as long as a handle exists.
pub(crate) struct Rented<T: DType>(Rc<Option<Storage<T>>>);

impl<T: DType> Rented<T> {
    /// A handle on `storage`, in a spare record if this thread has one of `T`.
    pub(crate) fn new(storage: Storage<T>) -> Self {
        let spare = SPARE
            .try_with(|spares| {
                let mut spares = spares.borrow_mut();
                let i = spares.iter().rposition(|r| r.is::<Option<Storage<T>>>())?;
                Some(spares.swap_remove(i))
            })
            .ok()
            .flatten()
            .and_then(|r| r.downcast::<Option<Storage<T>>>().ok());
        match spare {
            Some(mut record) => match Rc::get_mut(&mut record) {
                Some(slot) => {
                    *slot = Some(storage);
                    Rented(record)
                }
                None => Rented(Rc::new(Some(storage))),
            },
            None => Rented(Rc::new(Some(storage))),
        }
    }

    /// The storage, if this is the only handle on it.
    pub(crate) fn get_mut(&mut self) -> Option<&mut Storage<T>> {
        Rc::get_mut(&mut self.0).and_then(Option::as_mut)
    }

    /// The storage itself, if this is the only handle on it; else the handle back.
    pub(crate) fn into_unique(mut self) -> Result<Storage<T>, Self> {
        match Rc::get_mut(&mut self.0).and_then(Option::take) {
            Some(storage) => Ok(storage),
            None => Err(self),
        }
    }

    /// Handles on this storage, this one included.
    pub(crate) fn handles(&self) -> usize {
        Rc::strong_count(&self.0)
    }

    /// Whether `self` and `other` are handles on one storage.
    pub(crate) fn same(&self, other: &Self) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
}

impl<T: DType> Deref for Rented<T> {
    type Target = Storage<T>;
    fn deref(&self) -> &Storage<T> {
        (*self.0)
            .as_ref()
            .expect("a record is emptied only when its last handle drops")
    }
}

impl<T: DType> Clone for Rented<T> {
    fn clone(&self) -> Self {
        Rented(Rc::clone(&self.0))
    }
}

impl<T: DType> Drop for Rented<T> {
    fn drop(&mut self) {
        if let Some(slot) = Rc::get_mut(&mut self.0) {
            // The last handle: the buffer goes back now, the emptied record to the spares (this
            // handle's count then drops to the spare's one).
            drop(slot.take());
            let record: Rc<dyn Any> = Rc::clone(&self.0) as Rc<dyn Any>;
            // During thread teardown the list may be gone: the record is then simply freed.
            let _ = SPARE.try_with(|spares| {
                let mut spares = spares.borrow_mut();
                if spares.len() < SPARES {
                    spares.push(record);
                }
            });
        }
    }
}
