//! Errors of the `nn` modules, and the "did you mean" of an error about a name.

use crate::error::{Error, Shape};

/// Errors of the `nn` modules, the parameter store and the optimizers.
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
    /// An optimizer was given a parameter set that holds one parameter (one gradient key) twice
    /// with different values: two handles of it that no longer share their data, because one was
    /// written apart from the other (a write through a handle another shares copies first). The
    /// step cannot tell which values to update. Two handles that share their data are not this
    /// error but a tie (an embedding and the output head it is tied to, or a list naming a
    /// parameter twice): the parameter is updated once and both handles hold the result.
    #[error(
        "the parameter set holds parameter #{first} again at #{index} (shape {shape}) with other \
         values: one of its handles was written apart from the other; tied fields must share \
         one parameter's data (a clone of the same Param, neither written alone)"
    )]
    ParamListedTwice {
        /// The position in the set of the handle whose values differ from the first's.
        index: usize,
        /// The position of the parameter's first handle.
        first: usize,
        /// Its shape.
        shape: Shape,
    },
    /// The walks of one optimizer step or one load
    /// ([`Weights::load_safetensors`](super::Weights::load_safetensors)) over a parameter set met
    /// different parameters, or the same ones with other values: a
    /// [`Parameters`](crate::Parameters) implementation must visit the same parameters in the same
    /// order on every call. Nothing was updated if `updated` is 0; else the first `updated`
    /// parameters (with a gradient, for a step) were, before the change was met.
    #[error(
        "the parameter set changed between the walks of one optimizer step or load at position \
         {index} (a Parameters implementation must visit the same parameters in the same order on \
         every call); {updated} parameters were updated before it was noticed"
    )]
    ParametersChanged {
        /// The position in the set where the walks differ.
        index: usize,
        /// How many parameters were updated before.
        updated: usize,
    },
    /// An optimizer's state file does not fit this optimizer or model.
    #[error("cannot load the optimizer state in {}: {reason}", path.display())]
    OptimizerState {
        /// The file.
        path: std::path::PathBuf,
        /// What does not fit, naming the tensor or key.
        reason: String,
    },
    /// An optimizer's state file holds a value the next step would spread to every weight as NaN
    /// or infinity: a moment that is NaN or infinite, a negative second moment (`exp_avg_sq`), a
    /// learning rate that is negative, NaN or infinite in the parameters' element type (`1e300`
    /// in `f32`), or a negative step count. Nothing was loaded.
    #[error(
        "cannot load the optimizer state in {}: {} is {value:?}; {rule}",
        path.display(),
        describe_state_value(key, *index)
    )]
    OptimizerStateValue {
        /// The file.
        path: std::path::PathBuf,
        /// The tensor (`h.0.attn.c_attn.weight.exp_avg_sq`) or metadata key (`lr`,
        /// `wte.step`) holding the value.
        key: String,
        /// The value's position in the tensor (row-major), or `None` for a metadata key.
        index: Option<usize>,
        /// The value, as a number.
        value: f64,
        /// What it must be.
        rule: &'static str,
    },
    /// An error of the checkpointer during a checkpointed forward.
    #[error(transparent)]
    Checkpoint(Box<crate::checkpoint::CheckpointError>),
    /// An error reading or writing a safetensors file: see [`SafeTensorsError`](super::SafeTensorsError).
    #[error(transparent)]
    SafeTensors(#[from] super::SafeTensorsError),
    /// An error of a tensor op (shapes, budgets).
    #[error(transparent)]
    Tensor(#[from] Error),
}

/// The names among `candidates` that look like `name` (a small edit distance, or containing it),
/// closest first, at most three: the "did you mean" of an error about a name.
pub(super) fn close_names(name: &str, candidates: &[String]) -> Vec<String> {
    let mut close: Vec<(usize, &String)> = candidates
        .iter()
        .map(|n| (strsim::levenshtein(name, n), n))
        .filter(|&(d, n)| d <= 3 || n.contains(name))
        .collect();
    close.sort();
    close.into_iter().take(3).map(|(_, n)| n.clone()).collect()
}

/// Where an optimizer state's refused value is: an element of a tensor, or a metadata key.
fn describe_state_value(key: &str, index: Option<usize>) -> String {
    match index {
        Some(i) => format!("element {i} of \"{key}\""),
        None => format!("\"{key}\""),
    }
}

/// `close` as the end of an error message: empty, or "; did you mean ...?".
pub(super) fn suggest(close: &[String]) -> String {
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
