//! Tensors: n-d arrays on pooled buffers, branded with the lifetime of the scope that made them.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;

use ndarray::{ArrayD, ArrayView, ArrayViewD, ArrayViewMutD, Dimension, IxDyn, ShapeBuilder};

use crate::autograd::{self, Mode, Node, NodeRef};
use crate::dims::{view_steps, Dims, Walk};
use crate::element::DType;
use crate::error::{panicking, Error, Result, Shape};
use crate::param::Param;
use crate::pool::PoolBuffer;
use crate::recycle::{RecycledArc, RecycledRc};
use crate::scope::{ScopeState, State};
use crate::storage::{Rented, Storage};

/// An n-dimensional array of `T` in a pooled buffer, usable while the scope with brand `'s` is open.
///
/// - `clone()` is a zero-copy alias: both handles share one buffer, which goes back to the pool the
///   moment the last of them drops.
/// - Ops on `&Tensor` rent a new output in the tensor's scope; ops on an owned `Tensor` that is the
///   only handle on its buffer write in place (see [`TensorOps`](crate::TensorOps)), so `x.relu()`
///   on a temporary allocates nothing.
/// - A second operand can be a [`Param`] (`x.matmul(&w)`, `&x + &b`): it is read where it lies.
/// - Buffers are 64-byte aligned. A tensor is row-major over its buffer, except the views that
///   `t()`, `transpose`, `permute`, `narrow` and `expand` make: a shape and a step per axis on
///   their input's buffer, no copy ([`Tensor::is_contiguous`], [`Tensor::contiguous`]).
///
/// ```
/// use tensorscope::{Param, Pool, TensorOps};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let w = Param::from_slice(&pool, &[2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
/// let total = pool.scope(|s| {
///     let x = s.from_slice::<f32>(&[1, 2], &[1.0, 1.0]);
///     let y = x.matmul(&w).relu(); // `relu` writes in the matmul's output buffer
///     y.to_vec().iter().sum::<f32>() // plain values leave the scope freely
/// });
/// assert_eq!(total, 10.0);
/// ```
///
/// Shapes, ops that write in place, and the data as ndarray arrays:
///
/// ```
/// use tensorscope::{Pool, TensorOps};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let array = pool.scope(|s| {
///     let x = s.arange(0.0f32, 6.0, 1.0).reshape(&[2, 3]); // [[0, 1, 2], [3, 4, 5]], no copy
///     let y = x.matmul(&s.ones::<f32>(&[3, 4])); // [2, 3] x [3, 4] -> [2, 4]
///     assert_eq!(y.shape(), &[2, 4]);
///     assert_eq!(y.sum(-1).to_vec(), vec![12.0, 48.0]); // along the last axis
///     let rented = s.stats().rented;
///     let z = (y * 0.5).relu(); // `y` is owned and its only handle: both ops write in its buffer
///     assert_eq!(s.stats().rented, rented);
///     assert_eq!(z.view()[[1, 0]], 6.0); // an ndarray view of the data, no copy
///     z.to_array() // an owned copy, which can leave the scope
/// });
/// assert_eq!(array, ndarray::array![[1.5, 1.5, 1.5, 1.5], [6.0, 6.0, 6.0, 6.0]].into_dyn());
/// ```
///
/// # Printing
///
/// `Display` (`{}`) prints the values nested in brackets by axis, right-aligned to one width, then
/// a line with the shape and element type, as PyTorch and candle do:
///
/// ```
/// use tensorscope::Pool;
///
/// let pool = Pool::with_max_memory_mb(16);
/// pool.scope(|s| {
///     let t = s.from_slice::<f32>(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, -6.0]);
///     assert_eq!(
///         t.to_string(),
///         "[[ 1.0000,  2.0000,  3.0000],\n [ 4.0000,  5.0000, -6.0000]]\nTensor[2, 3; f32]"
///     );
///     assert_eq!(format!("{:.1}", t.reshape(&[6])), "[ 1.0,  2.0,  3.0,  4.0,  5.0, -6.0]\nTensor[6; f32]");
/// });
/// ```
///
/// - Floats share one notation per tensor, as PyTorch chooses it from the nonzero finite values:
///   fixed with 4 decimals, or scientific (`1.0000e+08`) when the largest magnitude passes 1e8, the
///   smallest is below 1e-4, or the largest is over 1000 times the smallest. A precision (`{:.2}`)
///   replaces the 4. NaN and infinities print as `NaN`, `inf` and `-inf`; integers as integers.
/// - Blocks of a 3-D tensor are separated by a blank line (two for 4-D, ...); rows wrap at 80 columns.
/// - Over 1000 elements, every axis longer than 6 shows its first and last 3 indices around `...`.
/// - A rank-0 tensor prints its value alone (`2.5000` then `Tensor[; f32]`); one without elements
///   prints `[]`.
///
/// [`Param`] prints the same way, its last line starting `Param[`. `Debug` (`{:?}`) prints the
/// same as `Display`: no part of printing recurses per axis, so a valid tensor of any rank prints.
///
/// # Lifetimes
///
/// `'s` is the brand of the scope that made the tensor: the `'s` of the `&Scope<'s, '_>` its
/// closure received. The closure must accept every `'s` (`for<'s>`), so inside it `'s` is a lifetime the
/// compiler knows nothing about except that it ends with the closure: a `Tensor<'s>` cannot be
/// returned from it, pushed into an outer `Vec`, stored in an outer struct, `RefCell`, thread-local or
/// `Box<dyn Any>`, or captured by a closure that outlives it. The only way out is on purpose, with
/// [`Scope::escape`](crate::Scope::escape) (to the parent scope) or [`Tensor::detach`] (to a
/// [`Param`]).
///
/// The brand is covariant: a tensor of an outer scope can be used wherever one of an inner scope is
/// expected, never the other way round. No public API makes a tensor whose brand outlives every
/// scope: an outermost scope's parent brand is as local to its closure as its own, and parameters,
/// which live outside scopes, have no ops.
///
/// `Tensor` is neither `Send` nor `Sync`: it belongs to its scope's thread.
///
/// ```compile_fail
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(8);
/// pool.scope(|s| {
///     let t = s.zeros::<f32>(&[4]);
///     std::thread::spawn(move || t.len()); // error: `Rc<..>` cannot be sent between threads
/// });
/// ```
///
/// # Memory safety
///
/// Memory safety rests on reference counts alone, never on a destructor running or a scope's exit
/// code: a buffer goes back to the pool when its last handle drops, wherever that handle is. A tensor
/// kept alive past its scope by `mem::forget` or a reference cycle only keeps its buffer out of the
/// pool (never reused), and the scope counts it in [`ScopeStats::leaked`](crate::ScopeStats::leaked).
pub struct Tensor<'s, T: DType = f32> {
    data: Data<T>,
    /// The scope that ops on this handle rent their outputs in (the scope charged for the buffer is
    /// its storage's `charged_to`, which an escape moves).
    pub(crate) rents_in: State,
    dim: Dims,
    /// Where the elements lie in the buffer, for a view (`t()`, `permute`, `narrow`, `expand`);
    /// `None`: row-major over the whole buffer.
    strided: Option<RecycledRc<Strided>>,
    /// The gradient graph the value was computed by, if it needs a gradient (see `autograd`).
    pub(crate) node: Option<NodeRef<T>>,
    _brand: PhantomData<&'s ()>,
}

/// Where the elements of a view lie in its buffer: element `[i0, i1, ..]` at
/// `offset + i0 * steps[0] + i1 * steps[1] + ..` (a step of 0 repeats an axis, as `expand` does).
///
/// The steps are [`Dims`], as shapes are: a view of any rank allocates nothing (its record and,
/// past [`INLINE`](crate::dims::INLINE) axes, its lists are recycled).
pub(crate) struct Strided {
    offset: usize,
    steps: Dims,
}

/// Where a tensor's elements are.
#[derive(Clone)]
enum Data<T: DType> {
    /// A buffer rented in a scope, which accounts for it.
    Rented(Rented<T>),
    /// A parameter's buffer, bound into a scope: shared, read-only, accounted to no scope.
    Bound(RecycledArc<PoolBuffer<T>>),
}

impl<'s, T: DType> Tensor<'s, T> {
    /// Rents a tensor with unspecified contents, owned by `scope`.
    pub(crate) fn try_rent_in(scope: &State, shape: &[usize]) -> Result<Self> {
        scope.check_budgets::<T>(shape)?;
        Ok(Tensor::of_buffer(
            scope,
            scope.pool().try_rent::<T>(shape)?,
            shape,
        ))
    }

    /// Rents a zeroed tensor owned by `scope`.
    pub(crate) fn try_rent_zeroed_in(scope: &State, shape: &[usize]) -> Result<Self> {
        scope.check_budgets::<T>(shape)?;
        let buf = scope.pool().try_rent_zeroed::<T>(shape)?;
        Ok(Tensor::of_buffer(scope, buf, shape))
    }

    /// Wraps a buffer just rented for `shape` as a tensor owned by `scope`.
    fn of_buffer(scope: &State, buf: PoolBuffer<T>, shape: &[usize]) -> Self {
        scope.on_rent(buf.allocated_bytes());
        Tensor {
            data: Data::Rented(Rented::new(Storage {
                buf,
                charged_to: RefCell::new(scope.clone()),
                detached: false,
            })),
            rents_in: scope.clone(),
            dim: Dims::from_slice(shape),
            strided: None,
            node: None,
            _brand: PhantomData,
        }
    }

    /// `param`'s data as a tensor whose ops rent in `scope`: no copy, no rent, nothing accounted.
    /// In a training scope it is a leaf of the gradient graph, keyed by the parameter.
    pub(crate) fn bound(scope: &State, param: &Param<T>) -> Self {
        let node = (autograd::mode() == Mode::Train).then(|| {
            Node::leaf(
                param.key(),
                Some((param.version(), Dims::from_slice(param.shape()))),
                scope,
            )
        });
        Tensor {
            data: Data::Bound(param.buffer().clone()),
            rents_in: scope.clone(),
            dim: Dims::from_slice(param.shape()),
            strided: None,
            node,
            _brand: PhantomData,
        }
    }

    /// A tensor owned by `scope` holding a copy of `array`.
    pub(crate) fn try_copy_of<D: Dimension>(
        scope: &State,
        array: ArrayView<'_, T, D>,
    ) -> Result<Self> {
        let mut t = Tensor::try_rent_in(scope, array.shape())?;
        if !t.is_empty() {
            t.unique_view_mut().assign(&array.into_dyn());
        }
        Ok(t)
    }

    /// Another handle on the same buffer (and graph) whose ops rent in `scope`.
    pub(crate) fn alias_in<'t>(&self, scope: &State) -> Tensor<'t, T> {
        Tensor {
            data: self.data.clone(),
            rents_in: scope.clone(),
            dim: self.dim.clone(),
            strided: self.strided.clone(),
            node: self.node.clone(),
            _brand: PhantomData,
        }
    }

    /// This handle without its brand, graph kept (no new handle: a unique tensor stays unique): how
    /// the op core holds inputs and gradients, which it never hands out.
    pub(crate) fn into_unbranded(self) -> Tensor<'static, T> {
        Tensor {
            data: self.data,
            rents_in: self.rents_in,
            dim: self.dim,
            strided: self.strided,
            node: self.node,
            _brand: PhantomData,
        }
    }

    /// This handle without its graph and its brand (no new handle: a unique tensor stays unique).
    pub(crate) fn into_saved(self) -> Tensor<'static, T> {
        Tensor {
            data: self.data,
            rents_in: self.rents_in,
            dim: self.dim,
            strided: self.strided,
            node: None,
            _brand: PhantomData,
        }
    }

    /// Whether `other` is a handle on the same elements: the same buffer, shape and layout (an
    /// alias, as an op's saved input is of the input it read).
    pub(crate) fn same_view(&self, other: &Tensor<'_, T>) -> bool {
        let layout = match (&self.strided, &other.strided) {
            (None, None) => true,
            (Some(a), Some(b)) => a.offset == b.offset && a.steps == b.steps,
            _ => false,
        };
        self.buffer_addr() == other.buffer_addr() && self.dim == other.dim && layout
    }

    /// The address of the buffer: equal for handles on one buffer.
    pub(crate) fn buffer_addr(&self) -> *const () {
        std::ptr::from_ref(self.buf()).cast()
    }

    /// An alias without a graph and without a brand, for a backward rule to keep.
    pub(crate) fn saved(&self) -> Tensor<'static, T> {
        let mut alias = self.alias_in(&self.rents_in);
        alias.node = None;
        alias
    }

    /// Moves the buffer's accounting to `target` if `target` lives longer than its owner (see
    /// `ScopeState::hands_over_to`). A bound parameter's buffer belongs to no scope.
    pub(crate) fn move_accounting(&self, target: &State) {
        if let Data::Rented(storage) = &self.data {
            let bytes = storage.buf.allocated_bytes();
            let mut owner = storage.charged_to.borrow_mut();
            if owner.hands_over_to(target) {
                owner.on_escape(bytes);
                target.on_adopt(bytes);
                ScopeState::transfer_budgets(&owner, target, bytes);
                *owner = target.clone();
            }
        }
    }

    /// Re-brands this tensor for `target`, moving the accounting of its buffer, and of everything
    /// its gradient graph saved, there if `target` lives longer (see [`Tensor::move_accounting`]).
    pub(crate) fn move_to<'t>(self, target: &State) -> Tensor<'t, T> {
        self.move_accounting(target);
        if let Some(node) = &self.node {
            autograd::move_graph(node, target);
        }
        let rents_in = if target.is_within(&self.rents_in) {
            self.rents_in.clone()
        } else {
            target.clone()
        };
        Tensor {
            data: self.data,
            rents_in,
            dim: self.dim,
            strided: self.strided,
            node: self.node,
            _brand: PhantomData,
        }
    }

    /// This tensor if it is the only handle on its buffer, else a copy of it (same scope, same
    /// graph), so that its buffer can be written.
    pub(crate) fn try_into_unique(self) -> Result<Self> {
        let scope = self.rents_in.clone();
        self.try_into_unique_in(&scope)
    }

    /// Like [`Tensor::try_into_unique`], a copy being rented in `scope` (the tensor's scope then).
    pub(crate) fn try_into_unique_in(self, scope: &State) -> Result<Self> {
        match self.is_writable() {
            true => Ok(self),
            false => self.try_copy_in(scope),
        }
    }

    /// A copy of this tensor's values, row-major in a buffer rented in `scope`, on the same graph
    /// (the same values, so the same gradient).
    fn try_copy_in(self, scope: &State) -> Result<Self> {
        let mut copy = Tensor::try_rent_in(scope, self.shape())?;
        copy.copy_from(&self);
        copy.node = self.node;
        Ok(copy)
    }

    /// Whether by-value ops may write this handle's buffer: the only handle on it, and not a view
    /// (a view covers part of its buffer, or covers it in another order).
    pub(crate) fn is_writable(&self) -> bool {
        self.strided.is_none() && self.is_unique()
    }

    /// Writes `src`'s elements, in row-major order, into this freshly rented tensor of its shape
    /// (or of a shape `src` broadcasts to).
    pub(crate) fn copy_from(&mut self, src: &Tensor<'_, T>) {
        match src.as_slice() {
            Some(values) if src.shape() == self.shape() => {
                self.unique_slice_mut().copy_from_slice(values)
            }
            _ => {
                let shape = Dims::from_slice(self.shape());
                self.write_at(&shape, 0, &Dims::row_major(&shape), src)
            }
        }
    }

    /// Writes `src`, broadcast to `shape`, into the elements of this tensor's buffer (one it owns
    /// alone: just rented, or checked writable) at `start + i0 * steps[0] + i1 * steps[1] + ..`:
    /// a copy, a broadcast, or a block of a bigger tensor (a gradient's slice, a concat's part).
    pub(crate) fn write_at(
        &mut self,
        shape: &[usize],
        start: usize,
        steps: &[usize],
        src: &Tensor<'_, T>,
    ) {
        let (from, from_start) = src.buffer();
        let walk = Walk::new(shape, [start, from_start], [steps, &src.steps_over(shape)]);
        let to = self.unique_slice_mut();
        walk.for_each_run(|_, [at, from_at], len, [to_step, from_step]| {
            match (to_step, from_step) {
                (1, 1) => to[at..at + len].copy_from_slice(&from[from_at..from_at + len]),
                _ => (0..len).for_each(|i| to[at + i * to_step] = from[from_at + i * from_step]),
            }
        });
    }

    /// This tensor with its elements row-major in a buffer of their own: itself (an alias) if it
    /// is contiguous, else a copy rented in `scope`, with the same graph (the same values, so the
    /// same gradient). How the op core hands a view to a kernel that reads slices.
    pub(crate) fn try_contiguous_in(self, scope: &State) -> Result<Self> {
        match self.is_contiguous() {
            true => Ok(self),
            false => self.try_copy_in(scope),
        }
    }

    /// This tensor with its elements row-major in one run of its buffer: a zero-copy alias if they
    /// already are, else a copy rented in this tensor's scope, on the same gradient graph (as
    /// PyTorch's `contiguous()`). Views (`t()`, `transpose`, `permute`, `narrow`, `expand`) share
    /// their input's buffer in another order; ops make the copies they need themselves, so this is
    /// only needed for [`Tensor::as_slice`]. Fails only with a budget error.
    pub fn try_contiguous(&self) -> Result<Tensor<'s, T>> {
        self.clone().try_contiguous_in(&self.rents_in)
    }

    panicking! {
        /// This tensor with its elements row-major in one run of its buffer.
        pub fn contiguous(&self) -> Tensor<'s, T> = try_contiguous;
    }

    /// Whether the elements lie row-major in one run of the buffer (always, except for views made
    /// by `t()`, `transpose`, `permute`, `narrow` past the first axis, and `expand`).
    pub fn is_contiguous(&self) -> bool {
        match &self.strided {
            None => true,
            Some(view) => {
                let mut step = 1;
                for (&len, &s) in self.shape().iter().zip(view.steps.iter()).rev() {
                    if len != 1 && s != step {
                        return false;
                    }
                    step *= len;
                }
                true
            }
        }
    }

    /// The whole buffer this tensor's elements lie in, and where the first of them is.
    pub(crate) fn buffer(&self) -> (&[T], usize) {
        (
            self.buf(),
            self.strided.as_ref().map_or(0, |view| view.offset),
        )
    }

    /// The step in the buffer between neighbours along `axis`.
    pub(crate) fn step(&self, axis: usize) -> usize {
        match &self.strided {
            None => self.shape()[axis + 1..].iter().product(),
            Some(view) => view.steps[axis],
        }
    }

    /// The step in the buffer along each axis of `shape`, which this tensor broadcasts to (aligned
    /// at the last axis, as broadcasting aligns): 0 along an axis this tensor lacks or has once.
    pub(crate) fn steps_over(&self, shape: &[usize]) -> Dims {
        let mut steps = Dims::zeros(shape.len());
        let lead = shape.len() - self.ndim();
        for (axis, step) in steps[lead..].iter_mut().enumerate() {
            if self.shape()[axis] != 1 {
                *step = self.step(axis);
            }
        }
        steps
    }

    /// A view of this tensor's buffer with `shape` and `offset` and `steps` (checked by the
    /// caller to stay within the buffer), whose ops rent in `scope`: how `t()`, `permute`,
    /// `narrow` and `expand` make their outputs.
    pub(crate) fn strided_view<'t>(
        &self,
        scope: &State,
        shape: &[usize],
        offset: usize,
        steps: impl IntoIterator<Item = usize>,
    ) -> Tensor<'t, T> {
        let mut alias = self.alias_in(scope);
        alias.dim = Dims::from_slice(shape);
        let mut view = Strided {
            // A view of no element starts at 0, where every reader may slice from (a narrow of
            // nothing at the end of an axis would point past the buffer).
            offset: if shape.contains(&0) { 0 } else { offset },
            steps: Dims::zeros(shape.len()),
        };
        for (s, step) in view.steps.iter_mut().zip(steps) {
            *s = step;
        }
        // A view that is row-major over the whole buffer is the plain tensor.
        alias.strided = Some(RecycledRc::new(view));
        if offset == 0 && alias.len() == self.buf().len() && alias.is_contiguous() {
            alias.strided = None;
        }
        alias
    }

    fn buf(&self) -> &PoolBuffer<T> {
        match &self.data {
            Data::Rented(storage) => &storage.buf,
            Data::Bound(buf) => buf,
        }
    }

    /// The buffer of a tensor that was just rented (or checked writable) and so has no alias.
    pub(crate) fn unique_slice_mut(&mut self) -> &mut [T] {
        assert!(self.strided.is_none(), "a view is never written in place");
        match &mut self.data {
            Data::Rented(storage) => storage
                .get_mut()
                .map(|s| &mut *s.buf)
                .expect("a freshly rented tensor has no alias"),
            Data::Bound(_) => unreachable!("a bound parameter is never unique, so never written"),
        }
    }

    pub(crate) fn unique_view_mut(&mut self) -> ArrayViewMutD<'_, T> {
        let dim = IxDyn(&self.dim);
        ArrayViewMutD::from_shape(dim, self.unique_slice_mut())
            .expect("a tensor's buffer holds exactly its shape")
    }

    /// Sets the scope this handle's ops rent in.
    #[inline]
    pub(crate) fn with_scope(mut self, scope: &State) -> Self {
        if !State::ptr_eq(&self.rents_in, scope) {
            self.rents_in = scope.clone();
        }
        self
    }

    /// Sets the scope this handle's ops rent in, in place and from an owned handle: how the op
    /// core gives an output its scope without a clone or a move of the tensor.
    #[inline(always)]
    pub(crate) fn set_scope(&mut self, scope: State) {
        if !State::ptr_eq(&self.rents_in, &scope) {
            self.rents_in = scope;
        }
    }

    /// A zero-copy tensor of `param`'s values whose ops rent in this tensor's scope: how a function
    /// that has tensors but no [`Scope`](crate::Scope) brings a parameter in (with a scope, use
    /// [`Scope::bind`](crate::Scope::bind)). Ops on it never write through to the parameter.
    pub fn bind<U: DType>(&self, param: &Param<U>) -> Tensor<'s, U> {
        Tensor::bound(&self.rents_in, param)
    }

    /// The shape, one length per axis.
    pub fn shape(&self) -> &[usize] {
        &self.dim
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.dim.len()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self.strided {
            None => self.buf().len(),
            Some(_) => self.dim.size(),
        }
    }

    /// Whether the tensor has no elements (some axis has length 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements in row-major order, if they lie so in one run of the buffer
    /// ([`Tensor::is_contiguous`]): `None` for a view that reads its buffer in another order
    /// (`t()`, `permute`, ..). [`Tensor::to_vec`] and [`Tensor::view`] read any tensor;
    /// [`Tensor::contiguous`] makes a copy that has a slice.
    pub fn as_slice(&self) -> Option<&[T]> {
        match &self.strided {
            None => Some(self.buf()),
            Some(view) => self
                .is_contiguous()
                .then(|| &self.buf()[view.offset..view.offset + self.len()]),
        }
    }

    /// The elements of a tensor the op core made contiguous (an op's inputs, a backward's
    /// gradient), or that was rented by the op itself.
    pub(crate) fn slice(&self) -> &[T] {
        match self.as_slice() {
            Some(values) => values,
            None => panic!(
                "internal error: a view of shape {:?} reached a kernel that reads contiguous data",
                self.shape()
            ),
        }
    }

    /// A read-only ndarray view of the data (strided for a view of another order).
    pub fn view(&self) -> ArrayViewD<'_, T> {
        match &self.strided {
            None => ArrayViewD::from_shape(IxDyn(&self.dim), self.buf()),
            // No element to find: ndarray checks the steps against the buffer even so.
            Some(_) if self.is_empty() => ArrayViewD::from_shape(IxDyn(&self.dim), &[]),
            Some(view) => ArrayViewD::from_shape(
                IxDyn(&self.dim).strides(IxDyn(&view.steps)),
                &self.buf()[view.offset..],
            ),
        }
        .expect("a tensor's buffer holds its view")
    }

    /// A writable ndarray view. If other handles share the buffer (or it is a bound parameter's),
    /// the data is first copied into a buffer of this handle's own (copy on write), so the aliases and
    /// the parameter never see the writes.
    ///
    /// Fails with [`Error::WriteToGraph`] for a tensor that carries a gradient graph (write into
    /// `without_grad()` of it instead), or if the copy cannot be rented ([`Error::BudgetExceeded`]).
    pub fn try_view_mut(&mut self) -> Result<ArrayViewMutD<'_, T>> {
        if self.node.is_some() {
            return Err(Error::WriteToGraph { op: "view_mut" });
        }
        if !self.is_writable() {
            // The copy is the same value, so it is owned where the original is.
            let owner = match &self.data {
                Data::Rented(storage) => storage.charged_to.borrow().clone(),
                Data::Bound(_) => self.rents_in.clone(),
            };
            let mut copy = Tensor::<T>::try_rent_in(&owner, self.shape())?;
            copy.copy_from(self);
            self.data = copy.data;
            self.strided = None;
        }
        Ok(self.unique_view_mut())
    }

    panicking! {
        /// A writable ndarray view.
        pub fn view_mut(&mut self) -> ArrayViewMutD<'_, T> = try_view_mut;
    }

    /// Copies the data out into an owned ndarray array (not pooled).
    pub fn to_array(&self) -> ArrayD<T> {
        self.view().to_owned()
    }

    /// Copies the data out into a `Vec` in row-major order.
    pub fn to_vec(&self) -> Vec<T> {
        match self.as_slice() {
            Some(values) => values.to_vec(),
            None => self.view().iter().copied().collect(),
        }
    }

    /// The steps of this tensor shown as `shape` (as many elements) without a copy, if it can be
    /// (always for a contiguous tensor; for a view, see [`view_steps`]).
    pub(crate) fn steps_as(&self, shape: &[usize]) -> Option<Dims> {
        match &self.strided {
            None => Some(Dims::row_major(shape)),
            Some(view) => view_steps(self.shape(), &view.steps, shape),
        }
    }

    /// An alias of the same buffer with another shape (checked by the caller), whose ops rent in
    /// `scope`: for a contiguous tensor, or a view whose axes `shape` only splits or joins within
    /// runs that lie contiguously (`steps` from [`Tensor::steps_as`]).
    pub(crate) fn reshaped<'t>(
        &self,
        scope: &State,
        shape: &[usize],
        steps: Dims,
    ) -> Tensor<'t, T> {
        let mut alias = self.alias_in(scope);
        alias.dim = Dims::from_slice(shape);
        if let Some(view) = &self.strided {
            alias.strided = Some(RecycledRc::new(Strided {
                offset: view.offset,
                steps,
            }));
        }
        alias
    }

    /// A copy converted to element type `U`: between floats, rounding to nearest (`f32` to `f16`
    /// loses precision and maps values beyond `f16`'s range to infinity); to an integer type,
    /// truncating toward zero and saturating at its bounds, NaN giving 0 (as Rust's `as`); from an
    /// integer, exact up to 2^53 (`ids.cast::<f32>()`, `mask.cast::<f32>()`). Fails only with a
    /// budget error. Gradients do not flow through a cast: a backward that reaches one fails with
    /// [`Error::NotDifferentiable`].
    pub fn try_cast<U: DType>(&self) -> Result<Tensor<'s, U>> {
        let mut out = Tensor::<U>::try_rent_in(&self.rents_in, self.shape())?;
        out.unique_view_mut()
            .zip_mut_with(&self.view(), |o, &x| *o = U::from_f64(x.to_f64()));
        // Gradients do not cross element types: backward through a cast is an error, not a zero.
        Ok(match self.node {
            Some(_) => autograd::barrier(out, "cast"),
            None => out,
        })
    }

    panicking! {
        /// A copy converted to element type `U`.
        pub fn cast<U: DType>(&self) -> Tensor<'s, U> = try_cast;
    }

    /// Bytes of the data itself, `len * size_of::<T>()` (the pool may hold a little more; see
    /// [`Tensor::allocated_bytes`]).
    pub fn data_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }

    /// Whether this handle is the only one on its buffer (so by-value ops write in place). A tensor
    /// bound to a parameter never is: its buffer is the parameter's.
    pub fn is_unique(&self) -> bool {
        match &self.data {
            Data::Rented(storage) => Rented::handles(storage) == 1,
            Data::Bound(_) => false,
        }
    }

    /// Whether `self` and `other` are handles on the same buffer.
    pub fn shares_buffer_with(&self, other: &Tensor<'_, T>) -> bool {
        match (&self.data, &other.data) {
            (Data::Rented(a), Data::Rented(b)) => Rented::ptr_eq(a, b),
            (Data::Bound(a), Data::Bound(b)) => RecycledArc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Bytes of pool budget the buffer takes (its size class).
    pub fn allocated_bytes(&self) -> usize {
        self.buf().allocated_bytes()
    }

    /// The tensor's values as a [`Param`], to keep past every scope (a result, a weight, a stored
    /// activation) or to send to another thread. No data is copied if this is the only handle on the
    /// buffer (the buffer moves, and its scope counts it as escaped) or a bound parameter's; otherwise
    /// the values are copied into a new buffer of the pool. Fails only if that copy cannot be rented.
    pub fn try_detach(self) -> Result<Param<T>> {
        if self.strided.is_some() {
            // A view's values, in a buffer of their own, row-major.
            let mut copy = Tensor::try_rent_in(&self.rents_in, self.shape())?;
            copy.copy_from(&self);
            return copy.try_detach();
        }
        match self.data {
            Data::Bound(buf) => Ok(Param::from_shared(buf, &self.dim)),
            Data::Rented(storage) => match storage.into_unique() {
                Ok(mut storage) => {
                    let bytes = storage.buf.allocated_bytes();
                    storage.charged_to.borrow().on_detach(bytes);
                    storage.detached = true;
                    let empty = PoolBuffer::empty(storage.buf.pool());
                    let buf = std::mem::replace(&mut storage.buf, empty);
                    Ok(Param::from_buffer(buf, &self.dim))
                }
                Err(storage) => {
                    let mut buf = storage.buf.pool().try_rent::<T>(&self.dim)?;
                    buf.copy_from_slice(&storage.buf);
                    Ok(Param::from_buffer(buf, &self.dim))
                }
            },
        }
    }

    /// The value of a tensor of one element. Fails with [`Error::InvalidShape`] for any other.
    pub fn try_item(&self) -> Result<T> {
        match (self.len(), self.view().iter().next()) {
            (1, Some(v)) => Ok(*v),
            _ => Err(Error::InvalidShape {
                op: "item",
                shape: Shape::from(self.shape()),
                reason: "only a tensor of one element has an item".into(),
            }),
        }
    }

    panicking! {
        /// The value of a tensor of one element (a loss, say).
        pub fn item(&self) -> T = try_item;
    }

    panicking! {
        /// The tensor's values as a [`Param`].
        pub fn detach(self) -> Param<T> = try_detach;
    }
}

impl<T: DType> Clone for Tensor<'_, T> {
    /// A zero-copy alias on the same buffer.
    fn clone(&self) -> Self {
        self.alias_in(&self.rents_in)
    }
}

impl<T: DType> fmt::Display for Tensor<'_, T> {
    /// The values nested in brackets by axis, then `Tensor[shape; dtype]`; see
    /// [Printing](Tensor#printing).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Read where the elements lie: a copy of an expanded view could be terabytes.
        let (data, offset) = self.buffer();
        let steps = self.strided.as_ref().map(|view| &view.steps[..]);
        let layout = crate::display::Layout { offset, steps };
        crate::display::fmt_values(f, "Tensor", self.shape(), data, layout)
    }
}

impl<T: DType> fmt::Debug for Tensor<'_, T> {
    /// As `Display`: ndarray's `Debug` recurses once per axis.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use crate::Pool;

    #[test]
    fn clone_is_an_alias_and_last_drop_returns_the_buffer() {
        let pool = Pool::with_max_memory_mb(8);
        pool.scope(|s| {
            let a = s.from_slice::<f32>(&[2, 2], &[1., 2., 3., 4.]);
            let b = a.clone();
            assert!(a.shares_buffer_with(&b));
            assert!(!a.is_unique());
            let r = b.reshape(&[4]);
            assert_eq!(r.shape(), &[4]);
            assert!(r.shares_buffer_with(&a));
            drop(a);
            drop(b);
            assert_eq!(pool.stats().returns, 0);
            drop(r);
            assert_eq!(pool.stats().returns, 1);
            assert_eq!(s.stats().released, 1);
        });
    }

    #[test]
    fn view_mut_copies_on_write_when_shared() {
        let pool = Pool::with_max_memory_mb(8);
        pool.scope(|s| {
            let a = s.from_slice::<f64>(&[3], &[1., 2., 3.]);
            let mut b = a.clone();
            b.view_mut()[[0]] = 10.;
            assert_eq!(a.to_vec(), vec![1., 2., 3.]);
            assert_eq!(b.to_vec(), vec![10., 2., 3.]);
            assert!(!a.shares_buffer_with(&b));
            let ptr = b.as_slice().unwrap().as_ptr();
            b.view_mut()[[1]] = 20.;
            assert_eq!(
                b.as_slice().unwrap().as_ptr(),
                ptr,
                "a unique tensor is written in place"
            );
        });
    }

    #[test]
    fn reshape_to_a_different_count_names_both_shapes() {
        let pool = Pool::with_max_memory_mb(8);
        pool.scope(|s| {
            let a = s.zeros::<f32>(&[2, 3]);
            let err = a.try_reshape(&[4, 2]).unwrap_err();
            assert_eq!(
                err.to_string(),
                "reshape: incompatible shapes [2, 3] and [4, 2]: 6 elements cannot be viewed as 8"
            );
        });
    }
}
