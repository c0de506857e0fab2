//! Modules, optimizers and named parameters for training.
//!
//! [`Module`]s ([`Linear`] over any leading batch axes, [`LayerNorm`], [`Activation`]s,
//! [`Residual`], [`Sequential`]) are forward passes over the [`Param`](crate::Param)s they own; in
//! a training scope their ops record a graph like any other ops, so [`Tensor::backward`](crate::Tensor::backward)
//! differentiates a model written with them, with tensor ops, or with both. [`Optimizer`]s update
//! any [`Parameters`](crate::Parameters) in place. A [`ParamStore`] keeps parameters by name, and
//! loads and saves them as safetensors files ([`ParamStore::load_safetensors`],
//! [`ParamStore::save_safetensors`]; [`SafeTensorsFile`] reads any tensor of a file).
//!
//! A training step is the loop written out: forward, loss, backward, step.
//!
//! ```
//! use tensorscope_runtime::nn::{Activation, Adam, Linear, Module, Optimizer, Sequential};
//! use tensorscope_runtime::{Pool, TensorOps};
//!
//! let pool = Pool::with_max_memory_mb(64);
//! let mut model = Sequential::new()
//!     .push(Linear::new(&pool, 4, 16, 1).unwrap())
//!     .push(Activation::gelu())
//!     .push(Linear::new(&pool, 16, 1, 2).unwrap());
//! let mut adam = Adam::new(1e-2);
//! let mut losses = Vec::new();
//! for _ in 0..30 {
//!     losses.push(pool.train(|s| {
//!         let x = s.randn::<f32>(&[32, 4], 7);
//!         let target = x.sum(1).reshape(&[32, 1]).tanh();
//!         let loss = model.forward(&x).unwrap().mse(&target);
//!         adam.step(&mut model, &loss.backward().unwrap()).unwrap();
//!         loss.item()
//!     }));
//! }
//! assert!(losses[29] < losses[0] / 2.0);
//! ```

mod error;
mod layers;
mod optim;
mod params;
mod safetensors;

pub use error::NnError;
pub use layers::{Activation, LayerNorm, Linear, Module, Residual, Sequential};
pub use optim::{Adam, Optimizer, Sgd};
pub use params::ParamStore;
pub use safetensors::{
    FileDType, LoadOptions, LoadReport, SafeTensorsError, SafeTensorsFile, SaveOptions,
};
