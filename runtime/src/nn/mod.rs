//! Modules, optimizers and named parameters for training.
//!
//! [`Module`]s ([`Linear`] over any leading batch axes, [`Conv2d`], [`LayerNorm`],
//! [`GroupNorm`], [`Activation`]s, [`Dropout`], [`Residual`], [`Sequential`]) are forward passes over the [`Param`](crate::Param)s they own; in
//! a training scope their ops record a graph like any other ops, so [`Tensor::backward`](crate::Tensor::backward)
//! differentiates a model written with them, with tensor ops, or with both. [`Optimizer`]s update
//! any [`Parameters`](crate::Parameters) in place. A [`ParamStore`] keeps parameters by name, and
//! loads and saves them as safetensors files ([`Weights::load_safetensors`],
//! [`Weights::save_safetensors`]; [`SafeTensorsFile`] reads any tensor of a file).
//!
//! A training step is the loop written out: forward, loss, backward, step.
//!
//! ```
//! use tensorscope::nn::{Activation, Adam, Linear, Module, Optimizer, Sequential};
//! use tensorscope::{Pool, TensorOps};
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
//!
//! ## Weights: safetensors files
//!
//! Weights in and out of [safetensors](https://github.com/huggingface/safetensors) files, the format
//! of Hugging Face checkpoints and of PyTorch's `safetensors.torch.save_file`.
//!
//! A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's
//! name, dtype, shape and byte range (and optional string metadata), then the tensors' data,
//! little-endian and row-major. Reading and writing go through the `safetensors` crate, so files are
//! exactly those Python writes and reads.
//!
//! - [`Weights::save_safetensors`] writes every parameter, as `F32` or, by
//!   [`SaveOptions::dtype`], as `F64`, `F16` or `BF16`.
//! - [`Weights::load_safetensors`] fills every registered parameter from the tensor of its name,
//!   converting the file's `F32`, `F64`, `F16` or `BF16` to the store's element type. It is all or
//!   nothing: on any error the store is unchanged.
//! - [`ParamStore::from_safetensors`] makes a store holding every tensor of a file.
//! - [`SafeTensorsFile`] reads any tensor, integer ones too (token ids, labels, reference values), as a
//!   [`Param`](crate::Param) of any [`DType`](crate::DType).
//!
//! PyTorch's `nn.Linear` keeps its weight as `[out, in]`; [`Linear`] keeps `[in, out]`
//! (it computes `x @ w`). Name the tensors stored in PyTorch's layout with
//! [`LoadOptions::pytorch_linear`] and [`SaveOptions::pytorch_linear`]: they are transposed on load
//! and on save.
//!
//! ```
//! use tensorscope::nn::{LoadOptions, ParamStore, SaveOptions, Weights};
//! use tensorscope::{f16, Pool};
//!
//! let pool = Pool::with_max_memory_mb(16);
//! let path = std::env::temp_dir().join(format!("tensorscope-doc-{}.safetensors", std::process::id()));
//!
//! let mut params = ParamStore::<f32>::new(&pool);
//! params.randn("fc.weight", &[4, 2], 0.1, 1).unwrap();
//! params.zeros("fc.bias", &[2]).unwrap();
//! params.save_safetensors(&path, &SaveOptions::new()).unwrap();
//!
//! // Load into a store of the same names and shapes: every parameter is filled, bit for bit.
//! let mut copy = ParamStore::<f32>::new(&pool);
//! copy.zeros("fc.weight", &[4, 2]).unwrap();
//! copy.zeros("fc.bias", &[2]).unwrap();
//! let report = copy.load_safetensors(&path, &LoadOptions::new()).unwrap();
//! assert!(report.unused.is_empty());
//! assert_eq!(copy.get("fc.weight").unwrap().to_vec(), params.get("fc.weight").unwrap().to_vec());
//!
//! // Or make a store of the whole file, in another element type.
//! let half = ParamStore::<f16>::from_safetensors(&pool, &path, &LoadOptions::new()).unwrap();
//! let names: Vec<&str> = half.iter().map(|(name, _)| name).collect();
//! assert_eq!(names, ["fc.bias", "fc.weight"]); // sorted by name
//! std::fs::remove_file(&path).unwrap();
//! ```

mod error;
mod generate;
mod kv_cache;
mod layers;
mod optim;
mod params;
pub(crate) mod safetensors;
mod schedule;

pub use error::NnError;
pub use generate::{generate, CacheLayout, CausalLm, GenerateOptions, Generation, Sampling};
pub use kv_cache::KvCache;
pub use layers::{
    Activation, Conv2d, Dropout, GroupNorm, LayerNorm, Linear, Module, Residual, Sequential,
};
pub use optim::{Adam, Group, Optimizer, Sgd};
pub use params::ParamStore;
pub use safetensors::{
    FileDType, LoadOptions, LoadReport, SafeTensorsError, SafeTensorsFile, SaveOptions, Weights,
};
pub use schedule::{Constant, Schedule, StepDecay, WarmupCosine, WarmupLinear};
