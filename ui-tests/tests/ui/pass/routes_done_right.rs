// The programs of the compile-fail cases, written so that they compile: what is kept past a scope
// is escaped to the scope that keeps it, or detached into a `Param`, or copied out as plain data.
#![deny(warnings)]

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt::Debug;
use std::marker::PhantomData;

use tensorscope::prelude::*;

thread_local! {
    static LAST: RefCell<Option<Param>> = const { RefCell::new(None) };
}

struct State<'a> {
    hidden: Tensor<'a>,
}

fn step<'a>(state: &mut State<'a>, outer: &Scope<'a, '_>) {
    state.hidden = outer.scope(|i| i.escape(i.ones::<f32>(&[4])));
}

fn identity<T>(value: T) -> T {
    value
}

fn erased<'s>(t: Tensor<'s>) -> impl Debug + 's {
    t
}

trait Layer {
    fn forward<'a>(&mut self, x: &Tensor<'a>) -> Tensor<'a>;
}

struct Recorder {
    seen: Vec<Vec<f32>>,
}

impl Layer for Recorder {
    #[dispose_scope]
    fn forward<'a>(&mut self, x: &Tensor<'a>) -> Tensor<'a> {
        self.seen.push(x.to_vec());
        x * 2.0
    }
}

#[checkpoint(every = 2)]
fn forward<'a>(x: Tensor<'a>, history: &mut Vec<Vec<f32>>) -> Tensor<'a> {
    let mut x = x;
    for _ in 0..4 {
        x = x.tanh();
        history.push(x.to_vec());
    }
    x
}

#[dispose_scope]
fn project<'a>(w: &Param, x: &Tensor<'a>) -> Tensor<'a> {
    x.matmul(w).relu()
}

#[derive(Escape)]
struct Marked<'s> {
    value: Tensor<'s>,
    _brand: PhantomData<&'s ()>,
}

#[dispose_scope]
fn marked<'a>(x: &Tensor<'a>) -> Marked<'a> {
    Marked {
        value: x * 2.0,
        _brand: PhantomData,
    }
}

pub(crate) fn main() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2, 2], &[1.0f32; 4]);
    let mut erased_values: Vec<Box<dyn Any>> = Vec::new();
    let mut later: Option<Box<dyn Fn() -> usize>> = None;
    let mut params = Vec::new();
    pool.scope(|s| {
        let mut kept: Vec<Tensor<'_>> = Vec::new();
        let mut by_name: HashMap<&str, Tensor<'_>> = HashMap::new();
        let slot: RefCell<Option<Tensor<'_>>> = RefCell::new(None);
        let cell: Cell<Option<Tensor<'_>>> = Cell::new(None);
        let mut outer = s.zeros::<f32>(&[4]);
        let mut last = Some(s.zeros::<f32>(&[4]));
        let mut shown: Vec<Box<dyn Debug + '_>> = Vec::new();
        s.scope(|inner| {
            kept.push(inner.escape(inner.ones::<f32>(&[4])));
            by_name.insert("h", inner.escape(inner.ones::<f32>(&[4])));
            *slot.borrow_mut() = Some(inner.escape(inner.ones::<f32>(&[4])));
            cell.set(Some(inner.escape(inner.ones::<f32>(&[4]))));
            let mut fresh = inner.escape(inner.ones::<f32>(&[4]));
            std::mem::swap(&mut outer, &mut fresh);
            last.replace(inner.escape(inner.ones::<f32>(&[4])));
            shown.push(Box::new(inner.escape(inner.ones::<f32>(&[4]))));
        });
        erased_values.push(Box::new(s.ones::<f32>(&[4]).detach()));
        let t = s.ones::<f32>(&[4]).detach();
        later = Some(Box::new(move || t.len()));
        LAST.with_borrow_mut(|l| *l = Some(s.ones::<f32>(&[4]).detach()));
        let mut state = State {
            hidden: s.zeros::<f32>(&[4]),
        };
        step(&mut state, s);
        assert_eq!(state.hidden.to_vec(), vec![1.0; 4]);
        let _generic = s.scope(|i| i.escape(identity(i.ones::<f32>(&[4]))));
        let _opaque = erased(s.ones::<f32>(&[4]));
        let mut recorder = Recorder { seen: Vec::new() };
        let y = recorder.forward(&s.ones::<f32>(&[1, 2]));
        assert_eq!((y.to_vec(), recorder.seen.len()), (vec![2.0, 2.0], 1));
        let mut history = Vec::new();
        let _ = forward(s.ones::<f32>(&[2]), &mut history);
        assert_eq!(history.len(), 4);
        for _ in 0..3 {
            // Kept across steps: escaped to the outer scope, or detached into a parameter.
            s.scope(|step| {
                let x = step.ones::<f32>(&[1, 2]);
                kept.push(step.escape(project(&w, &x)));
                params.push(project(&w, &x).detach());
            });
        }
        let m = marked(&s.ones::<f32>(&[2]));
        assert_eq!(m.value.to_vec(), vec![2.0, 2.0]);
        assert_eq!((kept.len(), by_name.len(), shown.len()), (4, 1, 1));
        drop((slot, cell, outer, last));
    });
    assert_eq!(
        (erased_values.len(), later.map(|f| f()), params.len()),
        (1, Some(4), 3)
    );
    assert!(LAST.with_borrow(Option::is_some));
    // Parameters alone compute inside a scope, bound to it.
    let squared = pool.scope(|s| s.bind(&w).matmul(&w).detach());
    assert_eq!(squared.to_vec(), vec![2.0; 4]);
    // Ids and masks of an inner scope: the result belongs to that scope and leaves it by escape.
    pool.scope(|outer| {
        let table = outer.ones::<f32>(&[4, 3]);
        let rows = outer.scope(|inner| {
            let ids = inner.from_slice::<i64>(&[2], &[1, 2]);
            let mask = inner.ones::<u8>(&[3]);
            inner.escape(table.index_select(0, &ids).masked_fill(&mask, 0.0))
        });
        assert_eq!(rows.to_vec(), vec![0.0; 6]);
    });
}
