//! Parameters: values kept across scopes, shared between threads, with no ops of their own.

use ndarray::{ArrayD, ArrayViewD, ArrayViewMutD, AsArray, Dimension, IxDyn};
use std::fmt;

use crate::element::{DType, Element};
use crate::error::{panicking, Result};
use crate::pool::{check_length, Pool, PoolBuffer};
use crate::recycle::{RecycledArc, RecycledVec};

/// A value kept outside every scope: a model's weights, an optimizer's state, a stored checkpoint, a
/// result the caller keeps. It has **no ops**: to compute with it, bind it into a scope
/// ([`Scope::bind`](crate::Scope::bind), zero-copy) or pass it as the second operand of an op beside a
/// scoped tensor (`x.matmul(&w)`, `&h + &b`), whose output rents in the tensor's scope. So everything
/// computed from a parameter belongs to some scope, and keeping it past that scope is a compile error
/// like any other scoped tensor.
///
/// - `Param` is `Send + Sync`: an `Arc<Model>` of parameters can be shared by threads, each running
///   forwards in its own scopes.
/// - `clone()` shares the data (a reference count); the buffer returns to its pool when the last
///   `Param` and the last tensor bound to it drop.
/// - Writes go through `&mut`: [`Param::try_view_mut`] writes in place when this handle is the only one
///   on the data, and copies first otherwise (copy on write), so a bound tensor or another clone never
///   sees the change. Ops on a bound tensor never write through to the parameter.
/// - `Display` prints the values and `Param[shape; dtype]`, as a [tensor prints](crate::Tensor#printing).
///
/// ```
/// use tensorscope::{Param, Pool, TensorOps};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let w = Param::from_slice(&pool, &[2, 2], &[1.0f32, 0.0, 0.0, 2.0]);
/// let b = Param::from_slice(&pool, &[2], &[0.5f32, -0.5]);
/// let y = pool.scope(|s| {
///     let x = s.ones::<f32>(&[3, 2]);
///     (x.matmul(&w) + &b).relu().detach() // a result kept past the scope is a `Param`
/// });
/// assert_eq!(y.to_vec(), vec![1.5, 1.5, 1.5, 1.5, 1.5, 1.5]);
/// std::thread::spawn(move || assert_eq!(y.shape(), &[3, 2])).join().unwrap();
/// ```
///
/// Copy on write:
///
/// ```
/// use tensorscope::{Param, Pool};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let mut w = Param::from_slice(&pool, &[2], &[1.0f32, 2.0]);
/// let before = w.clone(); // shares the data
/// w.view_mut()[[0]] = 10.0; // copies first: `before` keeps the old values
/// assert_eq!((w.to_vec(), before.to_vec()), (vec![10.0, 2.0], vec![1.0, 2.0]));
/// drop(before);
/// let stats = pool.stats();
/// w.view_mut()[[1]] = 20.0; // the only handle now: written in place, nothing rented
/// assert_eq!((w.to_vec(), pool.stats()), (vec![10.0, 20.0], stats));
/// ```
pub struct Param<T: DType = f32> {
    /// The data; its record is reused once the last handle drops (see `recycle`), so a
    /// checkpoint stored every step allocates nothing.
    buf: RecycledArc<PoolBuffer<T>>,
    dim: IxDyn,
    /// Identifies the parameter in [`Gradients`](crate::autograd::Gradients): kept by clones and
    /// by copy on write, new for every parameter made (and for [`Param::duplicate`]).
    key: u64,
    /// Identifies the values, as PyTorch's `_version` counter does: kept by clones until one is
    /// written, new at every write (in place or by copy on write, an optimizer's update, a load).
    /// A number from one process-wide counter rather than a count per parameter, so that two
    /// handles of one parameter written apart never meet with the same version; and rather than
    /// the buffer's address, which a recycled record would soon give to other values.
    version: u64,
}

/// A fresh key of a gradient's leaf: a parameter's (kept by its clones), a marked tensor's, a
/// checkpointed region's inputs'. Unique in the process; parameters own the counter, since they are
/// what most keys name.
pub(crate) fn next_key() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A fresh [`Param::version`].
fn next_version() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl<T: DType> Param<T> {
    /// A parameter over `buf`, which holds exactly `shape`'s elements.
    pub(crate) fn from_buffer(buf: PoolBuffer<T>, shape: &[usize]) -> Self {
        Param::from_shared(RecycledArc::new(buf), shape)
    }

    /// A parameter over a buffer shared with others (a bound tensor's).
    pub(crate) fn from_shared(buf: RecycledArc<PoolBuffer<T>>, shape: &[usize]) -> Self {
        Param {
            buf,
            dim: IxDyn(shape),
            key: next_key(),
            version: next_version(),
        }
    }

    /// The key of this parameter's gradient.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// Identifies the values behind this handle: equal for clones until one is written, new after
    /// every write. A gradient records the version it was computed from, and an optimizer refuses
    /// it for any other ([`Error::StaleGradient`](crate::Error::StaleGradient)).
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// An independent parameter holding a copy of these values: a new buffer of the same pool and
    /// a new gradient key. A [`Clone`] is the same parameter (same key), so it is not a second
    /// parameter to train: a frozen teacher, an exponential moving average or any copy meant to
    /// differ from the original is made with this. Fails only with a budget error.
    pub fn try_duplicate(&self) -> Result<Param<T>> {
        Ok(Param::from_buffer(self.copied()?, self.shape()))
    }

    /// A new buffer of the same pool holding these values.
    fn copied(&self) -> Result<PoolBuffer<T>> {
        let mut buf = self.buf.pool().try_rent::<T>(self.shape())?;
        buf.copy_from_slice(self.as_slice());
        Ok(buf)
    }

    panicking! {
        /// An independent copy.
        pub fn duplicate(&self) -> Param<T> = try_duplicate;
    }

    /// Gives this parameter the values in `buf` (of its shape). It stays the same parameter (same
    /// gradient key, so an optimizer keeps its state); handles cloned before keep the old values, as
    /// after a copy on write.
    pub(crate) fn replace_buffer(&mut self, buf: PoolBuffer<T>) {
        assert_eq!(
            buf.len(),
            self.len(),
            "a replacement buffer holds the parameter's shape"
        );
        self.buf = RecycledArc::new(buf);
        self.version = next_version();
    }

    /// The shared buffer, for tensors bound to this parameter.
    pub(crate) fn buffer(&self) -> &RecycledArc<PoolBuffer<T>> {
        &self.buf
    }

    /// A parameter holding a copy of `array` (a reference to an ndarray array, or a view), in a buffer
    /// rented from `pool`. Fails with a budget error if the pool cannot hold it.
    pub fn try_from_array<'a, D: Dimension>(
        pool: &Pool,
        array: impl AsArray<'a, T, D>,
    ) -> Result<Self> {
        let array = array.into().into_dyn();
        let mut buf = pool.try_rent::<T>(array.shape())?;
        if !buf.is_empty() {
            ArrayViewMutD::from_shape(array.shape(), &mut buf)
                .expect("a buffer rented for the shape holds it")
                .assign(&array);
        }
        Ok(Param::from_buffer(buf, array.shape()))
    }

    panicking! {
        /// A parameter holding a copy of `array`.
        pub fn from_array<'a, D: Dimension>(pool: &Pool, array: impl AsArray<'a, T, D>) -> Self = Self::try_from_array;
    }

    /// A parameter of `shape` holding a copy of `data` in row-major order. Fails with
    /// [`Error::LengthMismatch`](crate::Error::LengthMismatch) if the lengths differ, [`Error::SizeOverflow`](crate::Error::SizeOverflow) for a shape too large to
    /// address, and with a budget error if the pool cannot hold it.
    pub fn try_from_slice(pool: &Pool, shape: &[usize], data: &[T]) -> Result<Self> {
        check_length("Param::from_slice", shape, data)?;
        let mut buf = pool.try_rent::<T>(shape)?;
        buf.copy_from_slice(data);
        Ok(Param::from_buffer(buf, shape))
    }

    panicking! {
        /// A parameter of `shape` holding a copy of `data`.
        pub fn from_slice(pool: &Pool, shape: &[usize], data: &[T]) -> Self = Self::try_from_slice;
    }

    /// A parameter of zeros. Fails with a shape or budget error.
    pub fn try_zeros(pool: &Pool, shape: &[usize]) -> Result<Self> {
        Ok(Param::from_buffer(pool.try_rent_zeroed::<T>(shape)?, shape))
    }

    panicking! {
        /// A parameter of zeros.
        pub fn zeros(pool: &Pool, shape: &[usize]) -> Self = Self::try_zeros;
    }

    /// The shape, one length per axis.
    pub fn shape(&self) -> &[usize] {
        self.dim.slice()
    }

    /// The number of axes.
    pub fn ndim(&self) -> usize {
        self.dim.ndim()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the parameter has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements in row-major order.
    pub fn as_slice(&self) -> &[T] {
        &self.buf
    }

    /// A read-only ndarray view.
    pub fn view(&self) -> ArrayViewD<'_, T> {
        ArrayViewD::from_shape(self.dim.clone(), self.as_slice())
            .expect("a parameter's buffer holds exactly its shape")
    }

    /// Copies the data out into an owned ndarray array (not pooled).
    pub fn to_array(&self) -> ArrayD<T> {
        self.view().to_owned()
    }

    /// Copies the data out into a `Vec` in row-major order.
    pub fn to_vec(&self) -> Vec<T> {
        self.as_slice().to_vec()
    }

    /// A writable view, in place if this handle is the only one on the data (no clone, no bound
    /// tensor alive), else on a copy made first in a buffer of the same pool (copy on write), which
    /// this handle keeps. Fails only if that copy cannot be rented.
    ///
    /// The values count as written whether or not the view is: gradients computed before are of
    /// other values from now on, and an optimizer refuses them
    /// ([`Error::StaleGradient`](crate::Error::StaleGradient)), as PyTorch refuses a backward
    /// through a tensor "modified by an inplace operation".
    pub fn try_view_mut(&mut self) -> Result<ArrayViewMutD<'_, T>> {
        let dim = self.dim.clone();
        Ok(ArrayViewMutD::from_shape(dim, self.try_slice_mut()?)
            .expect("a parameter's buffer holds exactly its shape"))
    }

    /// The elements of a parameter no other handle shares (checked, or made so by a copy the
    /// caller took first), written in place as a new version.
    pub(crate) fn unique_slice_mut(&mut self) -> &mut [T] {
        self.try_slice_mut()
            .expect("a parameter no other handle shares is written in place")
    }

    /// The elements, writable, as [`Param::try_view_mut`] gives them (a new version).
    pub(crate) fn try_slice_mut(&mut self) -> Result<&mut [T]> {
        if let Some(copy) = self.copy_for_write()? {
            self.buf = RecycledArc::new(copy);
        }
        self.version = next_version();
        Ok(self.buf.get_mut().expect("unique after the copy"))
    }

    /// A copy of the values to write into, if another handle shares them (`None` if this one is
    /// unique and can be written in place). Changes nothing: an optimizer rents every copy it
    /// needs before it writes any parameter.
    pub(crate) fn copy_for_write(&self) -> Result<Option<PoolBuffer<T>>> {
        match RecycledArc::handles(&self.buf) {
            1 => Ok(None),
            _ => self.copied().map(Some),
        }
    }

    /// Takes `copy`, a [`Param::copy_for_write`] of these values, as this handle's buffer, so that
    /// the next write is in place; the values, and so the version, are the same.
    pub(crate) fn take_copy(&mut self, copy: PoolBuffer<T>) {
        debug_assert_eq!(copy.len(), self.len());
        self.buf = RecycledArc::new(copy);
    }

    panicking! {
        /// A writable view.
        pub fn view_mut(&mut self) -> ArrayViewMutD<'_, T> = try_view_mut;
    }

    /// A copy converted to element type `U`, by the rules of [`Tensor::try_cast`](crate::Tensor::try_cast)
    /// (between floats rounding to nearest, beyond `f16`'s range infinity; to integers truncating
    /// and saturating), in a buffer of the same pool. Fails only with a budget error.
    pub fn try_cast<U: DType>(&self) -> Result<Param<U>> {
        let mut buf = self.buf.pool().try_rent::<U>(self.shape())?;
        buf.iter_mut()
            .zip(self.as_slice())
            .for_each(|(o, &x)| *o = U::from_f64(x.to_f64()));
        Ok(Param::from_buffer(buf, self.shape()))
    }

    /// Whether this handle is the only one on the data (so [`Param::try_view_mut`] writes in place).
    pub fn is_unique(&self) -> bool {
        RecycledArc::handles(&self.buf) == 1
    }

    /// Whether `self` and `other` share their data.
    pub fn shares_buffer_with(&self, other: &Param<T>) -> bool {
        RecycledArc::ptr_eq(&self.buf, &other.buf)
    }

    /// Bytes of the data, `len * size_of::<T>()`.
    pub fn data_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }

    /// Bytes of pool budget the buffer takes (its size class).
    pub fn allocated_bytes(&self) -> usize {
        self.buf.allocated_bytes()
    }

    /// The pool the data came from and returns to.
    pub fn pool(&self) -> &Pool {
        self.buf.pool()
    }
}

impl<T: DType> Clone for Param<T> {
    /// Another handle on the same parameter: the same data (no copy) and the same gradient key. A
    /// handle written after cloning gets its own copy of the data (copy on write) but stays the same
    /// parameter; for an independent one, use [`Param::duplicate`].
    fn clone(&self) -> Self {
        Param {
            buf: self.buf.clone(),
            dim: self.dim.clone(),
            key: self.key,
            version: self.version,
        }
    }
}

/// Implemented by no type: the bound of the methods below, named like the ops users try on a
/// `Param`, so that calling one is a compile error that says what to write instead, not "no method
/// named `t` found".
#[diagnostic::on_unimplemented(
    message = "a `Param` has no ops: bind it into a scope first",
    label = "`Param` is not a tensor of any scope",
    note = "`s.bind(&w)` (or `x.bind(&w)`, from a tensor `x` of the scope) is the parameter as a \
            tensor of that scope, with no copy: `s.bind(&w).t()`",
    note = "an op also takes a parameter as its second operand directly: `x.matmul(&w)`, `&h + &b`"
)]
pub trait BindFirst {}

/// Names of ops a `Param` does not have (see [`BindFirst`]).
macro_rules! bind_first {
    ($($op:ident($($arg:ident),*);)*) => {
        #[doc(hidden)]
        #[allow(clippy::unused_self, missing_docs)]
        impl<T: DType> Param<T> {
            $(
                pub fn $op<$($arg),*>(&self, $(_: $arg),*) -> !
                where
                    Self: BindFirst,
                {
                    unreachable!("no type implements BindFirst")
                }
            )*
        }
    };
}

bind_first! {
    t();
    transpose(A, B);
    matmul(A);
    reshape(A);
    narrow(A, B, C);
    sum(A);
    mean(A);
    softmax(A);
    relu();
    gelu();
    tanh();
    exp();
}

impl<T: DType> fmt::Display for Param<T> {
    /// The values nested in brackets by axis, then `Param[shape; dtype]`, as a
    /// [`Tensor`](crate::Tensor#printing) prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layout = crate::display::Layout::ROW_MAJOR;
        crate::display::fmt_values(f, "Param", self.shape(), self.as_slice(), layout)
    }
}

impl<T: DType> fmt::Debug for Param<T> {
    /// As `Display`: ndarray's `Debug` recurses once per axis.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Where a parameter sits in a model: the path of fields and indices that leads to it, printed
/// with dots (`blocks.3.mlp.w1`, the names of PyTorch's `state_dict()`). A path is built on the
/// stack as a walk descends ([`ParamPath::field`], [`ParamPath::index`]), so walking a model
/// allocates nothing; `to_string()` gives the name.
///
/// ```
/// use tensorscope::ParamPath;
///
/// let root = ParamPath::ROOT;
/// let blocks = root.field("blocks");
/// let third = blocks.index(3);
/// assert_eq!(third.field("mlp.w1").to_string(), "blocks.3.mlp.w1");
/// assert_eq!(root.to_string(), "");
/// ```
#[derive(Clone, Copy)]
pub struct ParamPath<'a> {
    parent: Option<&'a ParamPath<'a>>,
    segment: Segment<'a>,
}

#[derive(Clone, Copy)]
enum Segment<'a> {
    Root,
    Field(&'a str),
    Index(usize),
}

impl<'a> ParamPath<'a> {
    /// The empty path: where a walk over a whole model starts.
    pub const ROOT: ParamPath<'static> = ParamPath {
        parent: None,
        segment: Segment::Root,
    };

    /// This path followed by `name` (which may hold dots of its own: a renamed field's
    /// `"c_fc.weight"`).
    pub fn field<'b>(&'b self, name: &'b str) -> ParamPath<'b> {
        self.child(Segment::Field(name))
    }

    /// This path followed by the index `i` of an element of a `Vec` or an array.
    pub fn index(&self, i: usize) -> ParamPath<'_> {
        self.child(Segment::Index(i))
    }

    fn child<'b>(&'b self, segment: Segment<'b>) -> ParamPath<'b> {
        ParamPath {
            parent: Some(self),
            segment,
        }
    }

    /// Whether this is [`ParamPath::ROOT`].
    pub fn is_root(&self) -> bool {
        matches!(self.segment, Segment::Root)
    }
}

impl fmt::Display for ParamPath<'_> {
    /// The segments joined by dots; the root prints nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent.filter(|p| !p.is_root()) {
            write!(f, "{parent}.")?;
        }
        match self.segment {
            Segment::Root => Ok(()),
            Segment::Field(name) => f.write_str(name),
            Segment::Index(i) => write!(f, "{i}"),
        }
    }
}

impl fmt::Debug for ParamPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ParamPath(\"{self}\")")
    }
}

/// A set of named parameters: a model struct, a [`Param`], a
/// [`ParamStore`](crate::nn::ParamStore), a `Vec`, array, slice or `Option` of parameter sets.
/// Optimizers update it in place, and it saves and loads itself by its parameters' names
/// ([`nn::Weights`](crate::nn::Weights), in the prelude).
///
/// A model struct derives it: each field is walked under its name, the elements of a `Vec` or an
/// array under their index, an `Option` when it holds a value, so the names are the field paths
/// (`blocks.3.w1`). `#[param(rename = "c_fc.weight")]` gives a field another name (a file's, say
/// PyTorch's), and `#[param(skip)]` leaves out a field that holds no parameters or frozen ones.
///
/// ```
/// use tensorscope::nn::{LayerNorm, Linear};
/// use tensorscope::{Param, Parameters, Pool};
///
/// #[derive(Parameters)]
/// struct Block {
///     norm: LayerNorm,
///     #[param(rename = "c_fc")]
///     fc: Linear,
/// }
///
/// #[derive(Parameters)]
/// struct Mlp {
///     blocks: Vec<Block>,
///     head: Option<Param>,
///     #[param(skip)]
///     width: usize,
/// }
///
/// let pool = Pool::with_max_memory_mb(16);
/// let block = |seed| Block {
///     norm: LayerNorm::new(&pool, 4, 1e-5).unwrap(),
///     fc: Linear::new(&pool, 4, 4, seed).unwrap(),
/// };
/// let mlp = Mlp { blocks: vec![block(1), block(2)], head: Some(Param::zeros(&pool, &[4])), width: 4 };
/// let names: Vec<String> = mlp.named_params().into_iter().map(|(name, _)| name).collect();
/// assert_eq!(names, [
///     "blocks.0.norm.weight", "blocks.0.norm.bias", "blocks.0.c_fc.weight", "blocks.0.c_fc.bias",
///     "blocks.1.norm.weight", "blocks.1.norm.bias", "blocks.1.c_fc.weight", "blocks.1.c_fc.bias",
///     "head",
/// ]);
/// assert_eq!(mlp.param_count(), 2 * (4 + 4 + 16 + 4) + 4);
/// ```
///
/// The model must own its parameters: an optimizer writes a parameter that another handle shares
/// (a clone kept elsewhere) by copying it first, and the other handle keeps the old values.
///
/// # Tied parameters
///
/// Two fields may hold one parameter (a clone: the same gradient key), as GPT-2 ties its output
/// head to its token embedding. The model then has one parameter under two names:
/// [`Parameters::visit_params`] meets it under each (a save writes both names, as PyTorch's
/// `state_dict()` keeps both keys, and a load checks that both hold the same values and keeps
/// the tie); [`Parameters::for_each_param`], [`Parameters::named_params`] and
/// [`Parameters::param_count`] see it once, at its first name; an optimizer updates it once,
/// from the gradients of both uses summed, and leaves both fields holding the new values. As
/// its handles share the data, its update is written into a copy (one copy of that parameter
/// per step); one `Param` used in both places (`h.matmul(&x.bind(&self.wte).t())`) avoids it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a set of parameters of element type `{T}`",
    label = "not a set of `Param<{T}>`",
    note = "a model struct gets the impl from `#[derive(Parameters)]`; a field that holds no \
            parameters is marked `#[param(skip)]`"
)]
pub trait Parameters<T: Element> {
    /// Calls `f` on every parameter with its path below `path`, in the same order on every call.
    /// A parameter held by several fields (an embedding tied to the output head: clones of one
    /// [`Param`], one gradient key) is met once under each of its names, as a file holds it; the
    /// other walks below see it once.
    fn visit_params(&self, path: &ParamPath<'_>, f: &mut dyn FnMut(&ParamPath<'_>, &Param<T>));

    /// The same walk as [`Parameters::visit_params`], with the parameters writable.
    fn visit_params_mut(
        &mut self,
        path: &ParamPath<'_>,
        f: &mut dyn FnMut(&ParamPath<'_>, &mut Param<T>),
    );

    /// Calls `f` once on every parameter, in the same order on every call: a parameter held by
    /// several fields at the first of them, after which the others are given its data, so that a
    /// write through `f` reaches every field and the tie holds (as PyTorch's `parameters()`,
    /// which lists a tied weight once). Allocates nothing once this thread has walked a set as
    /// large.
    fn for_each_param(&mut self, f: &mut dyn FnMut(&mut Param<T>)) {
        // The handles met so far, sorted by key: a walk usually meets keys in the order they
        // were made, so an insertion is at the end.
        let mut firsts = RecycledVec::<Param<T>>::new();
        self.visit_params_mut(&ParamPath::ROOT, &mut |_, p| match firsts
            .binary_search_by_key(&p.key(), Param::key)
        {
            Ok(i) => *p = firsts[i].clone(),
            Err(i) => {
                f(p);
                firsts.insert(i, p.clone());
            }
        })
    }

    /// Every parameter once, under the first of its names (a tied parameter's later names are left
    /// out, as PyTorch's `named_parameters()` leaves them), in the walk's order: handles sharing
    /// the data (no copy).
    fn named_params(&self) -> Vec<(String, Param<T>)> {
        let mut named = Vec::new();
        visit_once(self, &mut |path, p| {
            named.push((path.to_string(), p.clone()))
        });
        named
    }

    /// The parameter named `name` (a handle sharing its data), if there is one, under any of its
    /// names: to read it, or its gradient (`grads.get(&model.param("h.0.attn.c_attn.weight").unwrap())`).
    fn param(&self, name: &str) -> Option<Param<T>> {
        let mut found = None;
        self.visit_params(&ParamPath::ROOT, &mut |path, p| {
            if found.is_none() && path.to_string() == name {
                found = Some(p.clone());
            }
        });
        found
    }

    /// The number of elements of all the parameters, a tied parameter counted once. Allocates
    /// nothing once this thread has walked a set as large.
    fn param_count(&self) -> usize {
        let mut count = 0;
        visit_once(self, &mut |_, p| count += p.len());
        count
    }
}

/// Calls `f` on every parameter of `params` once, at the first of its names (a tied parameter's
/// later fields are passed over), in the walk's order. The keys met so far are kept sorted in a
/// recycled list (a walk usually meets keys in the order they were made, so an insertion is at
/// the end): no allocation once this thread has walked a set as large.
fn visit_once<T: Element, P: Parameters<T> + ?Sized>(
    params: &P,
    f: &mut dyn FnMut(&ParamPath<'_>, &Param<T>),
) {
    let mut seen = RecycledVec::<u64>::new();
    params.visit_params(&ParamPath::ROOT, &mut |path, p| {
        if let Err(i) = seen.binary_search(&p.key()) {
            seen.insert(i, p.key());
            f(path, p);
        }
    });
}

impl<T: Element> Parameters<T> for Param<T> {
    fn visit_params(&self, path: &ParamPath<'_>, f: &mut dyn FnMut(&ParamPath<'_>, &Param<T>)) {
        f(path, self)
    }

    fn visit_params_mut(
        &mut self,
        path: &ParamPath<'_>,
        f: &mut dyn FnMut(&ParamPath<'_>, &mut Param<T>),
    ) {
        f(path, self)
    }
}

/// Elements under their index: `layers.0`, `layers.1`, ...
impl<T: Element, P: Parameters<T>> Parameters<T> for [P] {
    fn visit_params(&self, path: &ParamPath<'_>, f: &mut dyn FnMut(&ParamPath<'_>, &Param<T>)) {
        for (i, p) in self.iter().enumerate() {
            p.visit_params(&path.index(i), f)
        }
    }

    fn visit_params_mut(
        &mut self,
        path: &ParamPath<'_>,
        f: &mut dyn FnMut(&ParamPath<'_>, &mut Param<T>),
    ) {
        for (i, p) in self.iter_mut().enumerate() {
            p.visit_params_mut(&path.index(i), f)
        }
    }
}

/// The parameters of what a pointer or a list holds, under the same path: one walk through
/// `**self` (`&mut P`, `Box<P>`) or through the slice (`Vec<P>`, `[P; N]`).
macro_rules! walk_through {
    ($([$($generics:tt)*] $ty:ty, $this:ident => $target:expr;)*) => {$(
        impl<$($generics)*> Parameters<T> for $ty {
            fn visit_params(
                &self,
                path: &ParamPath<'_>,
                f: &mut dyn FnMut(&ParamPath<'_>, &Param<T>),
            ) {
                let $this = self;
                $target.visit_params(path, f)
            }

            fn visit_params_mut(
                &mut self,
                path: &ParamPath<'_>,
                f: &mut dyn FnMut(&ParamPath<'_>, &mut Param<T>),
            ) {
                let $this = self;
                $target.visit_params_mut(path, f)
            }
        }
    )*};
}

walk_through! {
    [T: Element, P: Parameters<T> + ?Sized] &mut P, this => (**this);
    [T: Element, P: Parameters<T> + ?Sized] Box<P>, this => (**this);
    [T: Element, P: Parameters<T>] Vec<P>, this => this[..];
    [T: Element, P: Parameters<T>, const N: usize] [P; N], this => this[..];
}

/// The value's parameters under the same path, if there is a value.
impl<T: Element, P: Parameters<T>> Parameters<T> for Option<P> {
    fn visit_params(&self, path: &ParamPath<'_>, f: &mut dyn FnMut(&ParamPath<'_>, &Param<T>)) {
        if let Some(p) = self {
            p.visit_params(path, f)
        }
    }

    fn visit_params_mut(
        &mut self,
        path: &ParamPath<'_>,
        f: &mut dyn FnMut(&ParamPath<'_>, &mut Param<T>),
    ) {
        if let Some(p) = self {
            p.visit_params_mut(path, f)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_send_sync_and_copy_on_write() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Param<f32>>();
        let pool = Pool::with_max_memory_mb(8);
        let mut a = Param::from_slice(&pool, &[3], &[1.0f64, 2.0, 3.0]);
        let b = a.clone();
        assert!(a.shares_buffer_with(&b) && !a.is_unique());
        a.view_mut()[[0]] = 10.0;
        assert_eq!(
            (a.to_vec(), b.to_vec()),
            (vec![10.0, 2.0, 3.0], vec![1.0, 2.0, 3.0])
        );
        let ptr = a.as_slice().as_ptr();
        a.view_mut()[[1]] = 20.0;
        assert_eq!(
            a.as_slice().as_ptr(),
            ptr,
            "a unique parameter is written in place"
        );
        drop((a, b));
        assert_eq!(pool.stats().bytes_in_use, 0);
    }

    #[test]
    fn walks_that_need_each_parameter_once_see_a_tied_one_once() {
        let pool = Pool::with_max_memory_mb(8);
        let a = Param::from_slice(&pool, &[2], &[1.0f32, 2.0]);
        let mut set = vec![a.clone(), Param::zeros(&pool, &[3]), a];
        assert_eq!(set.param_count(), 5);
        let names: Vec<String> = set.named_params().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["0", "1"]);
        let mut all = Vec::new();
        set.visit_params(&ParamPath::ROOT, &mut |path, _| all.push(path.to_string()));
        assert_eq!(all, ["0", "1", "2"], "the plain walk meets every name");
        // A write through the walk (a copy on write, the handles sharing the data) reaches
        // the later field: the tie holds.
        let mut visits = 0;
        set.for_each_param(&mut |p| {
            visits += 1;
            p.view_mut().fill(7.0);
        });
        assert_eq!(visits, 2);
        assert_eq!(set[2].to_vec(), [7.0, 7.0]);
        assert!(set[2].shares_buffer_with(&set[0]));
        assert_eq!(set[2].version(), set[0].version());
    }
}
