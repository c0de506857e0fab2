//! Stored activations: parameters outside every scope, in the storage precision.

use half::{bf16, f16};

use super::{CheckpointError, Result};
use crate::element::Element;
use crate::param::Param;
use crate::scope::State;
use crate::tensor::Tensor;

/// A stored activation, in its storage precision, as a parameter (outside every scope).
#[derive(Clone)]
pub(crate) enum Stored<T: Element> {
    Full(Param<T>),
    F16(Param<f16>),
    Bf16(Param<bf16>),
}

impl<T: Element> Stored<T> {
    pub(crate) fn data_bytes(&self) -> usize {
        match self {
            Stored::Full(p) => p.data_bytes(),
            Stored::F16(p) => p.data_bytes(),
            Stored::Bf16(p) => p.data_bytes(),
        }
    }

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
    let overflow = activation
        .as_slice()
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
