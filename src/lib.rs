//! tensorscope facade (docs filled in with the README below).
pub use tensorscope_runtime::*;
