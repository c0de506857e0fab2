//! A small training path: named parameters, losses with their gradients, and optimizers.
//!
//! Parameters live in a [`ParamStore`] under names like `"fc1.weight"`, each with its data and its
//! gradient, both [`Param`](crate::Param)s. [`Layer`]s have forward and backward passes over a shared
//! [`Cache`]; [`train_step`] runs one step, plain or with activation checkpointing.

mod layers;
mod loss;
mod optim;
mod params;
mod train;

pub use layers::{Activation, Cache, Layer, LayerNorm, Linear, Residual, Sequential};
pub use loss::{mse, softmax_cross_entropy};
pub use optim::{Adam, Optimizer, Sgd};
pub use params::{NnError, ParamEntry, ParamId, ParamStore};
pub use train::{train_step, StepReport};
