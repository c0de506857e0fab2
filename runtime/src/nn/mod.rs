//! A small training path: named parameters, losses with their gradients, and optimizers.
//!
//! Parameters live in a [`ParamStore`] under names like `"fc1.weight"`, as [`Param`](crate::Param)s.
//! Gradients are [`Gradients`](crate::Gradients), from [`Tensor::backward`](crate::Tensor::backward)
//! or from the hand-written backward passes of [`Layer`]s over a shared [`Cache`];
//! [`Optimizer`]s apply them. [`train_step`] runs one step of a [`Sequential`] model, plain or with
//! activation checkpointing.

mod layers;
mod loss;
mod optim;
mod params;
mod train;

pub use layers::{Activation, Cache, Layer, LayerNorm, Linear, Residual, Sequential};
pub use loss::{mse, softmax_cross_entropy};
pub use optim::{Adam, Optimizer, Sgd};
pub use params::{NnError, ParamId, ParamStore};
pub use train::{backward_step, train_step, StepReport};
