//! The shared record behind a rented tensor: its buffer and the scope charged for it, counted so
//! that clones are zero-copy aliases.
//!
//! A record's own heap allocation is reused (see `recycle`): when the last handle drops, the buffer
//! goes back to its pool at once and the emptied record waits among this thread's spares for the
//! next rent. A steady-state forward therefore makes no heap allocation for its tensors'
//! bookkeeping (counted in `tests/allocations.rs`).

use std::cell::RefCell;

use crate::element::DType;
use crate::pool::PoolBuffer;
use crate::recycle::RecycledRc;
use crate::scope::State;

/// A rented buffer and the scope whose accounting it is charged to.
pub(crate) struct Storage<T: DType> {
    pub(crate) buf: PoolBuffer<T>,
    /// The scope whose stats and budgets count the buffer; an escape to a longer-lived scope moves
    /// the charge there. (Where a handle's ops rent is the handle's own `Tensor::rents_in`.)
    pub(crate) charged_to: RefCell<State>,
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

/// One handle on a [`Storage`].
pub(crate) type Rented<T> = RecycledRc<Storage<T>>;
