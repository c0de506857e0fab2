//! The checkpointer installed on a thread, for `#[checkpoint]` functions without a parameter.

use super::Checkpointer;
use crate::element::Element;

impl<T: Element> Checkpointer<T> {
    /// Makes this checkpointer the active one on this thread while `f` runs: `#[checkpoint]`
    /// functions without a `&mut Checkpointer` parameter save into it. Nested calls stack; the
    /// checkpointer is back in `self` when `install` returns, also if `f` panics.
    pub fn install<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let empty = Checkpointer::for_element(self.config.clone());
        let taken = std::mem::replace(self, empty);
        ACTIVE.with_borrow_mut(|stack| stack.push(Box::new(taken)));
        let _restore = Restore(self);
        f()
        // `restore` drops here (or while unwinding) and puts the checkpointer back.
    }
}

thread_local! {
    /// Installed checkpointers, innermost last (see [`Checkpointer::install`]).
    static ACTIVE: std::cell::RefCell<Vec<Box<dyn std::any::Any>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Puts an installed checkpointer back where it came from.
struct Restore<'c, T: Element>(&'c mut Checkpointer<T>);

impl<T: Element> Drop for Restore<'_, T> {
    fn drop(&mut self) {
        let top = ACTIVE.with_borrow_mut(Vec::pop);
        if let Some(Ok(ckpt)) = top.map(|b| b.downcast::<Checkpointer<T>>()) {
            *self.0 = *ckpt;
        }
    }
}

/// Stands in the thread's stack for a checkpointer a `#[checkpoint]` forward is using.
struct Busy;

/// Runs `f` with the innermost installed checkpointer if it holds element type `T`, or with `None`
/// (no checkpointer installed, one of another type, or one already in use by an enclosing
/// `#[checkpoint]` forward: nested forwards store nothing rather than replan the outer one's).
pub(crate) fn with_active<T: Element, R>(f: impl FnOnce(Option<&mut Checkpointer<T>>) -> R) -> R {
    let top = ACTIVE.with_borrow_mut(|stack| {
        if stack.last().is_some_and(|b| b.is::<Checkpointer<T>>()) {
            let ckpt = stack.pop();
            stack.push(Box::new(Busy));
            ckpt
        } else {
            None
        }
    });
    let Some(boxed) = top else {
        return f(None);
    };
    /// Puts the checkpointer back in place of the marker when `f` ends, by return or unwinding.
    struct PutBack(Option<Box<dyn std::any::Any>>);
    impl Drop for PutBack {
        fn drop(&mut self) {
            if let Some(b) = self.0.take() {
                ACTIVE.with_borrow_mut(|stack| {
                    stack.pop();
                    stack.push(b);
                });
            }
        }
    }
    let mut guard = PutBack(Some(boxed));
    f(guard
        .0
        .as_mut()
        .and_then(|b| b.downcast_mut::<Checkpointer<T>>()))
}
