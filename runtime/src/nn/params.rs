//! Named parameters.

use std::collections::HashMap;

use crate::element::Element;
use crate::error::{Error, Shape};
use crate::param::{Param, Parameters};
use crate::pool::Pool;
use crate::tensor::Tensor;

/// Errors of the training path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum NnError {
    /// No parameter has this name; `close` lists registered names that look alike.
    #[error("no parameter named \"{name}\"{}", suggest(close))]
    UnknownParam {
        /// The name asked for.
        name: String,
        /// Registered names within a small edit distance, closest first.
        close: Vec<String>,
    },
    /// A second parameter with a name already registered.
    #[error("a parameter named \"{0}\" is already registered")]
    DuplicateParam(String),
    /// A layer was used with a [`ParamStore`] other than the one it registered its parameters in.
    #[error(
        "{layer}: parameter #{index} was registered in another ParamStore; use the layer with \
         the store it was built with"
    )]
    ForeignParam {
        /// The layer.
        layer: &'static str,
        /// The parameter's position in the store it came from.
        index: usize,
    },
    /// An optimizer was given a parameter set that lists one parameter twice (the parameter and a
    /// clone of it): it would update the parameter twice per step.
    #[error(
        "the parameter set lists parameter #{index} (shape {shape}) twice, as itself or a clone; \
         list each parameter once"
    )]
    ParamListedTwice {
        /// Its position in the set (the second listing).
        index: usize,
        /// Its shape.
        shape: Shape,
    },
    /// A backward pass was given a gradient whose shape is not the layer's output shape.
    #[error("{layer}: the gradient has shape {got} but the layer's output has shape {expected}")]
    GradShape {
        /// The layer.
        layer: &'static str,
        /// The shape of the layer's output (which the gradient must have).
        expected: Shape,
        /// The gradient's shape.
        got: Shape,
    },
    /// A backward pass popped a cache its forward did not fill.
    #[error("{layer}: backward found no cached forward values; run forward with a cache first")]
    CacheUnderflow {
        /// The layer.
        layer: &'static str,
    },
    /// A training step left values in the cache: some layer's backward popped less than its forward
    /// pushed (checked in debug builds).
    #[error("the cache holds {left} tensors after backward: a layer's backward pops less than its forward pushes")]
    CacheNotEmpty {
        /// Tensors left.
        left: usize,
    },
    /// An error of the checkpointer during a checkpointed step.
    #[error(transparent)]
    Checkpoint(Box<crate::checkpoint::CheckpointError>),
    /// An error of a tensor op (shapes, budgets).
    #[error(transparent)]
    Tensor(#[from] Error),
}

fn suggest(close: &[String]) -> String {
    match close {
        [] => String::new(),
        names => format!(
            "; did you mean {}?",
            names
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

/// A parameter's handle in its store, for fast access by layers. It knows its store: used with
/// another store it gives [`NnError::ForeignParam`], never another store's parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamId {
    store: u64,
    index: usize,
}

/// Distinct ids for stores, so a [`ParamId`] can tell which store it belongs to.
static NEXT_STORE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Named parameters in registration order.
///
/// ```
/// use tensorscope_runtime::nn::ParamStore;
/// use tensorscope_runtime::Pool;
///
/// let pool = Pool::with_max_memory_mb(16);
/// let mut params = ParamStore::<f32>::new(&pool);
/// params.randn("fc1.weight", &[4, 2], 0.1, 1).unwrap();
/// params.zeros("fc1.bias", &[2]).unwrap();
/// assert_eq!(params.get("fc1.bias").unwrap().to_vec(), vec![0.0, 0.0]);
/// let err = params.get("fc1.weights").unwrap_err();
/// assert_eq!(err.to_string(), "no parameter named \"fc1.weights\"; did you mean \"fc1.weight\"?");
/// ```
pub struct ParamStore<T: Element = f32> {
    id: u64,
    pool: Pool,
    names: Vec<String>,
    params: Vec<Param<T>>,
    index: HashMap<String, usize>,
}

impl<T: Element> ParamStore<T> {
    /// An empty store whose parameters are rented from `pool`.
    pub fn new(pool: &Pool) -> Self {
        ParamStore {
            id: NEXT_STORE.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            pool: pool.clone(),
            names: Vec::new(),
            params: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Registers `data` under `name` (no copy). Fails with [`NnError::DuplicateParam`].
    pub fn add(&mut self, name: &str, data: Param<T>) -> Result<ParamId, NnError> {
        if self.index.contains_key(name) {
            return Err(NnError::DuplicateParam(name.to_string()));
        }
        let id = self.params.len();
        self.params.push(data);
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), id);
        Ok(self.id_at(id))
    }

    /// Registers a parameter of normal samples with standard deviation `std` (reproducible from
    /// `seed`).
    pub fn randn(
        &mut self,
        name: &str,
        shape: &[usize],
        std: f64,
        seed: u64,
    ) -> Result<ParamId, NnError> {
        let data = self.pool.scope(|s| {
            s.try_randn::<T>(shape, seed)
                .and_then(|t| (t * T::from_f64(std)).try_detach())
        })?;
        self.add(name, data)
    }

    /// Registers a parameter of zeros.
    pub fn zeros(&mut self, name: &str, shape: &[usize]) -> Result<ParamId, NnError> {
        let data = Param::try_zeros(&self.pool, shape)?;
        self.add(name, data)
    }

    /// Registers a parameter of ones.
    pub fn ones(&mut self, name: &str, shape: &[usize]) -> Result<ParamId, NnError> {
        let data = self.pool.scope(|s| {
            s.try_full::<T>(shape, T::one())
                .and_then(Tensor::try_detach)
        })?;
        self.add(name, data)
    }

    fn id_at(&self, index: usize) -> ParamId {
        ParamId {
            store: self.id,
            index,
        }
    }

    /// The id of `name`; see [`ParamStore::get`] for the error.
    pub fn id(&self, name: &str) -> Result<ParamId, NnError> {
        self.index
            .get(name)
            .map(|&i| self.id_at(i))
            .ok_or_else(|| self.unknown(name))
    }

    /// The parameter named `name`. Fails with [`NnError::UnknownParam`] listing the registered names
    /// that look alike.
    pub fn get(&self, name: &str) -> Result<&Param<T>, NnError> {
        self.id(name).map(|id| &self.params[id.index])
    }

    /// The parameter named `name`, writable.
    pub fn get_mut(&mut self, name: &str) -> Result<&mut Param<T>, NnError> {
        let id = self.id(name)?;
        Ok(&mut self.params[id.index])
    }

    /// The position of `id` in this store, or [`NnError::ForeignParam`] naming `layer` if `id`
    /// belongs to another store.
    fn position(&self, id: ParamId, layer: &'static str) -> Result<usize, NnError> {
        if id.store == self.id {
            Ok(id.index)
        } else {
            Err(NnError::ForeignParam {
                layer,
                index: id.index,
            })
        }
    }

    /// The parameter `id`, for `layer`. Fails with [`NnError::ForeignParam`] naming the layer if
    /// `id` was registered in another store.
    pub fn param(&self, id: ParamId, layer: &'static str) -> Result<&Param<T>, NnError> {
        Ok(&self.params[self.position(id, layer)?])
    }

    /// The parameter `id`, writable; see [`ParamStore::param`].
    pub fn param_mut(
        &mut self,
        id: ParamId,
        layer: &'static str,
    ) -> Result<&mut Param<T>, NnError> {
        let i = self.position(id, layer)?;
        Ok(&mut self.params[i])
    }

    fn unknown(&self, name: &str) -> NnError {
        let mut close: Vec<(usize, &String)> = self
            .names
            .iter()
            .map(|n| (strsim::levenshtein(name, n), n))
            .filter(|&(d, n)| d <= 3 || n.contains(name))
            .collect();
        close.sort();
        NnError::UnknownParam {
            name: name.to_string(),
            close: close.into_iter().take(3).map(|(_, n)| n.clone()).collect(),
        }
    }

    /// Names and parameters, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Param<T>)> {
        self.names.iter().map(String::as_str).zip(&self.params)
    }

    /// Names and parameters in registration order, writable (what optimizers walk).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut Param<T>)> {
        self.names.iter().map(String::as_str).zip(&mut self.params)
    }

    /// The number of parameters.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether no parameter is registered.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// The pool the parameters are rented from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

/// `store[id]`; panics with [`NnError::ForeignParam`]'s message if `id` is another store's (the
/// layers use [`ParamStore::param`], which returns the error).
impl<T: Element> std::ops::Index<ParamId> for ParamStore<T> {
    type Output = Param<T>;
    #[track_caller]
    fn index(&self, id: ParamId) -> &Param<T> {
        self.param(id, "ParamStore[id]")
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<T: Element> std::ops::IndexMut<ParamId> for ParamStore<T> {
    #[track_caller]
    fn index_mut(&mut self, id: ParamId) -> &mut Param<T> {
        self.param_mut(id, "ParamStore[id]")
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

impl<T: Element> Parameters<T> for ParamStore<T> {
    /// Every parameter, in registration order.
    fn for_each_param(&mut self, f: &mut dyn FnMut(&mut Param<T>)) {
        self.params.iter_mut().for_each(f)
    }
}
