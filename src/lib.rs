#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub use tensorscope_macros::{checkpoint, dispose_scope, Escape};
pub use tensorscope_runtime::*;

/// The names a forward function usually needs: `use tensorscope::prelude::*;`.
pub mod prelude {
    pub use tensorscope_macros::{checkpoint, dispose_scope, Escape};
    pub use tensorscope_runtime::{scope, Escape, Param, Pool, Scope, Tensor, TensorOps};
}
