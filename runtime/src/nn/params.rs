//! Named parameters.

use std::collections::HashMap;

use crate::element::Element;
use crate::param::{Param, ParamPath, Parameters};
use crate::pool::Pool;
use crate::tensor::Tensor;

use super::error::{close_names, NnError};

/// Named parameters in registration order: for weights loaded or saved by name. A model's modules
/// own their parameters; take them out of a store ([`ParamStore::take`]) to build one, so that each
/// parameter has one owner and optimizers update it in place.
///
/// ```
/// use tensorscope::nn::ParamStore;
/// use tensorscope::Pool;
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
    pool: Pool,
    names: Vec<String>,
    params: Vec<Param<T>>,
    index: HashMap<String, usize>,
}

impl<T: Element> ParamStore<T> {
    /// An empty store whose parameters are rented from `pool`.
    pub fn new(pool: &Pool) -> Self {
        ParamStore {
            pool: pool.clone(),
            names: Vec::new(),
            params: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Registers `data` under `name` (no copy). Fails with [`NnError::DuplicateParam`].
    pub fn add(&mut self, name: &str, data: Param<T>) -> Result<(), NnError> {
        if self.index.contains_key(name) {
            return Err(NnError::DuplicateParam(name.to_string()));
        }
        self.index.insert(name.to_string(), self.params.len());
        self.params.push(data);
        self.names.push(name.to_string());
        Ok(())
    }

    /// Registers a parameter of normal samples with standard deviation `std` (reproducible from
    /// `seed`).
    pub fn randn(
        &mut self,
        name: &str,
        shape: &[usize],
        std: f64,
        seed: u64,
    ) -> Result<(), NnError> {
        let data = self.pool.scope(|s| {
            s.try_randn::<T>(shape, seed)
                .and_then(|t| (t * T::from_f64(std)).try_detach())
        })?;
        self.add(name, data)
    }

    /// Registers a parameter of zeros.
    pub fn zeros(&mut self, name: &str, shape: &[usize]) -> Result<(), NnError> {
        let data = Param::try_zeros(&self.pool, shape)?;
        self.add(name, data)
    }

    /// Registers a parameter of ones.
    pub fn ones(&mut self, name: &str, shape: &[usize]) -> Result<(), NnError> {
        let data = self.pool.scope(|s| {
            s.try_full::<T>(shape, T::one())
                .and_then(Tensor::try_detach)
        })?;
        self.add(name, data)
    }

    fn position(&self, name: &str) -> Result<usize, NnError> {
        self.index
            .get(name)
            .copied()
            .ok_or_else(|| self.unknown(name))
    }

    /// The parameter named `name`. Fails with [`NnError::UnknownParam`] listing the registered names
    /// that look alike.
    pub fn get(&self, name: &str) -> Result<&Param<T>, NnError> {
        Ok(&self.params[self.position(name)?])
    }

    /// The parameter named `name`, writable.
    pub fn get_mut(&mut self, name: &str) -> Result<&mut Param<T>, NnError> {
        let i = self.position(name)?;
        Ok(&mut self.params[i])
    }

    /// Removes the parameter named `name` and returns it, to give it to a module. Fails as
    /// [`ParamStore::get`] does.
    pub fn take(&mut self, name: &str) -> Result<Param<T>, NnError> {
        let i = self.position(name)?;
        self.index.remove(name);
        self.names.remove(i);
        let param = self.params.remove(i);
        for p in self.index.values_mut().filter(|p| **p > i) {
            *p -= 1;
        }
        Ok(param)
    }

    fn unknown(&self, name: &str) -> NnError {
        NnError::UnknownParam {
            name: name.to_string(),
            close: close_names(name, &self.names),
        }
    }

    /// Names and parameters, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Param<T>)> {
        self.names.iter().map(String::as_str).zip(&self.params)
    }

    /// Names and parameters in registration order, writable.
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

/// Every parameter under its registered name, in registration order.
impl<T: Element> Parameters<T> for ParamStore<T> {
    fn visit_params(&self, path: &ParamPath<'_>, f: &mut dyn FnMut(&ParamPath<'_>, &Param<T>)) {
        for (name, p) in self.iter() {
            f(&path.field(name), p)
        }
    }

    fn visit_params_mut(
        &mut self,
        path: &ParamPath<'_>,
        f: &mut dyn FnMut(&ParamPath<'_>, &mut Param<T>),
    ) {
        for (name, p) in self.iter_mut() {
            f(&path.field(name), p)
        }
    }
}
