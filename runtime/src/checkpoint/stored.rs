//! Stored activations: parameters outside every scope, in the storage precision.

use half::{bf16, f16};

use super::{CheckpointError, Result};
use crate::element::{DType, Element};
use crate::param::Param;
use crate::recycle::RecycledVec;
use crate::scope::State;
use crate::tensor::Tensor;

/// A stored activation, in its storage precision, as a parameter (outside every scope).
#[derive(Clone)]
pub(crate) enum Stored<T: DType> {
    Full(Param<T>),
    F16(Param<f16>),
    Bf16(Param<bf16>),
}

/// Stored activations by layer id (or by position), in order: a short list searched by bisection,
/// whose buffer is reused from step to step (a map's nodes would be allocated at every forward).
pub(crate) struct ByLayer<T: DType>(RecycledVec<(usize, Stored<T>)>);

impl<T: DType> Default for ByLayer<T> {
    fn default() -> Self {
        ByLayer(RecycledVec::new())
    }
}

impl<T: DType> ByLayer<T> {
    fn find(&self, layer: usize) -> std::result::Result<usize, usize> {
        self.0.binary_search_by_key(&layer, |&(l, _)| l)
    }

    pub(crate) fn get(&self, layer: usize) -> Option<&Stored<T>> {
        self.find(layer).ok().map(|i| &self.0[i].1)
    }

    pub(crate) fn contains(&self, layer: usize) -> bool {
        self.find(layer).is_ok()
    }

    /// Stores `stored` for `layer`, replacing what was stored for it.
    pub(crate) fn insert(&mut self, layer: usize, stored: Stored<T>) {
        match self.find(layer) {
            Ok(i) => self.0[i].1 = stored,
            Err(i) => self.0.insert(i, (layer, stored)),
        }
    }

    pub(crate) fn remove(&mut self, layer: usize) -> Option<Stored<T>> {
        self.find(layer).ok().map(|i| self.0.remove(i).1)
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// The layers, in order, and what is stored for each.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &Stored<T>)> {
        self.0.iter().map(|(l, s)| (*l, s))
    }

    /// The layers, in order.
    pub(crate) fn layers(&self) -> Vec<usize> {
        self.iter().map(|(l, _)| l).collect()
    }
}

impl<T: DType> Stored<T> {
    pub(crate) fn data_bytes(&self) -> usize {
        match self {
            Stored::Full(p) => p.data_bytes(),
            Stored::F16(p) => p.data_bytes(),
            Stored::Bf16(p) => p.data_bytes(),
        }
    }
}

impl<T: Element> Stored<T> {
    /// The activation as `T`: the stored parameter at full precision, a converted copy otherwise.
    pub(crate) fn to_param(&self) -> Result<Param<T>> {
        Ok(match self {
            Stored::Full(p) => p.clone(),
            Stored::F16(p) => p.try_cast()?,
            Stored::Bf16(p) => p.try_cast()?,
        })
    }

    /// The activation as a tensor of `scope`: bound (no copy) at full precision, converted into a
    /// tensor rented there otherwise.
    pub(crate) fn restore<'s>(&self, scope: &State) -> Result<Tensor<'s, T>> {
        Ok(match self {
            Stored::Full(p) => Tensor::bound(scope, p),
            Stored::F16(p) => Tensor::bound(scope, p).try_cast()?,
            Stored::Bf16(p) => Tensor::bound(scope, p).try_cast()?,
        })
    }
}

/// `activation` converted to the narrower storage type `S`, detached. Fails with
/// [`CheckpointError::BadValue`] naming the first finite value that the conversion rounds to an
/// infinity (65520 in `f16`, say, whatever the source type: checking the converted values, not a
/// bound converted to the source type, which rounds too).
pub(crate) fn narrowed<T: Element, S: Element>(
    layer: usize,
    activation: &Tensor<'_, T>,
) -> Result<Param<S>> {
    let converted = activation.try_cast::<S>()?.try_detach()?;
    let values = activation.view();
    let overflow = values
        .iter()
        .zip(converted.as_slice())
        .find(|(_, c)| !c.is_finite());
    match overflow {
        Some((v, _)) => Err(CheckpointError::BadValue {
            layer,
            problem: format!("{v} is beyond the {} range (+-{})", S::NAME, S::max_value()),
        }),
        None => Ok(converted),
    }
}
