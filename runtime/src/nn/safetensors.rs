//! Weights in and out of safetensors files (documented in the `nn` module's docs, where rustdoc
//! renders them).

mod header;
mod source;
#[cfg(test)]
mod tests;

use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use ndarray::{ArrayView2, ArrayViewD, ArrayViewMut2};
use safetensors::{Dtype, SafeTensorError, View};

use super::error::{close_names, suggest, NnError};
use super::params::ParamStore;
use crate::element::{is_integer, DType, Element};
use crate::error::Shape;
use crate::param::{Param, ParamPath, Parameters};
use crate::pool::{Pool, PoolBuffer};
use header::{Entry, Header};
use source::ReadAt;

/// The bytes of the header length that starts every safetensors file.
const HEADER_LENGTH_BYTES: usize = 8;

/// The most bytes of a tensor read at once to be converted to another type (a multiple of every
/// element size): the memory a conversion takes beyond the buffers it fills.
const SCRATCH_BYTES: usize = 1 << 16;

/// Errors of reading and writing safetensors files. Each names the file or the tensor at fault;
/// they reach users as [`NnError::SafeTensors`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SafeTensorsError {
    /// The file could not be read or written.
    #[error("cannot {action} {}: {message}", path.display())]
    Io {
        /// `"read"` or `"write"`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The kind of the I/O error.
        kind: std::io::ErrorKind,
        /// The I/O error's message.
        message: String,
    },
    /// The bytes are not a safetensors file: truncated, a header that is not the format's JSON, a
    /// tensor listed twice, byte ranges that do not hold their tensor's shape, overlap, leave bytes
    /// no tensor holds, or end past the file; or the file shrank after it was opened, so that the
    /// bytes of the tensor being read (which `reason` names) are gone.
    #[error("{} not a valid safetensors file: {reason}", describe_source(path))]
    Corrupt {
        /// The file, or `None` for bytes given to [`SafeTensorsFile::from_bytes`].
        path: Option<PathBuf>,
        /// What is wrong, naming the tensor at fault if there is one (`tensor "w" is listed twice
        /// in the header`).
        reason: String,
    },
    /// A read failed (the file shrank or could not be read) while a load was writing parameters in
    /// place: the parameters before the one named in `source` hold the file's values, that one may
    /// hold part of them (a read fills what the file still has), the others their old ones.
    /// Everything that can fail before the first write (names, shapes, dtypes, a value that does
    /// not fit, the budget, a file shorter than when it was opened) fails the load with nothing
    /// changed; only a file changed by another process during the load gets here.
    #[error(
        "{source}; the load stopped there: the first {loaded} parameters hold the file's values, \
         the next may hold part of them, the others hold their old values"
    )]
    LoadInterrupted {
        /// How many parameters (in the model's walk) were loaded before the failure.
        loaded: usize,
        /// What failed.
        source: Box<SafeTensorsError>,
    },
    /// A parameter's name is the key the format keeps for the file's string metadata
    /// (`"__metadata__"`): a file holding a tensor of that name could not be read back.
    #[error(
        "a parameter is named \"{name}\", the key a safetensors header keeps for its string \
         metadata; rename it to save it"
    )]
    ReservedName {
        /// The name.
        name: String,
    },
    /// The `safetensors` crate refused to write the tensors (a header beyond its 100 MB limit).
    #[error("cannot write {} as safetensors: {reason}", path.display())]
    Serialize {
        /// The file.
        path: PathBuf,
        /// What the `safetensors` crate refused.
        reason: String,
    },
    /// The file has no tensor of this name; `close` lists the file's names that look alike.
    #[error("no tensor named \"{name}\" in the file{}", suggest(close))]
    MissingTensor {
        /// The name asked for.
        name: String,
        /// The file's names within a small edit distance, closest first.
        close: Vec<String>,
    },
    /// The tensor's shape differs from the parameter's.
    #[error("{}", describe_shape_mismatch(name, file, param, *pytorch_linear))]
    ShapeMismatch {
        /// The tensor (and parameter) name.
        name: String,
        /// The tensor's shape as stored in the file.
        file: Shape,
        /// The parameter's shape.
        param: Shape,
        /// Whether the tensor is in PyTorch's Linear layout, so was compared transposed.
        pytorch_linear: bool,
    },
    /// The tensor's dtype cannot be read: a parameter takes `F32`, `F64`, `F16` or `BF16`, and
    /// [`SafeTensorsFile::param`] also `I64`, `I32` and `U8`.
    #[error(
        "tensor \"{name}\" has dtype {dtype}; {}",
        if *floats_only {
            "parameters load from F32, F64, F16 or BF16 only"
        } else {
            "tensorscope reads F32, F64, F16, BF16, I64, I32 and U8 only"
        }
    )]
    UnsupportedDType {
        /// The tensor.
        name: String,
        /// Its dtype in the file.
        dtype: FileDType,
        /// Whether it was read for a parameter, which takes floats only.
        floats_only: bool,
    },
    /// A tensor named as in PyTorch's Linear layout does not have two axes.
    #[error(
        "tensor \"{name}\" is marked as in PyTorch's Linear layout ([out, in]) but has shape \
         {shape}; only a tensor of 2 axes can be transposed"
    )]
    NotAMatrix {
        /// The tensor.
        name: String,
        /// Its shape (in the file on load, the parameter's on save).
        shape: Shape,
    },
    /// Two names of one parameter of the model (tied fields: clones of one `Param`) hold
    /// different values in the file, so a load cannot give both fields one parameter. The
    /// parameter's later names may be absent (it loads through its first); present, each must
    /// hold its first name's values bit for bit once converted.
    #[error(
        "tensors \"{first}\" and \"{name}\" are the names of one parameter of the model (tied \
         fields), but hold different values in the file (element {index}: {first_value:?} and \
         {value:?}); untie the fields (Param::duplicate) to load them apart"
    )]
    TiedTensorsDiffer {
        /// The later name.
        name: String,
        /// The parameter's first name in the model's walk.
        first: String,
        /// The first element (row-major) that differs.
        index: usize,
        /// Its value under `name`.
        value: f64,
        /// Its value under `first`.
        first_value: f64,
    },
    /// A load found several parameters that do not match the file: each problem (a
    /// [`SafeTensorsError::MissingTensor`], [`SafeTensorsError::ShapeMismatch`],
    /// [`SafeTensorsError::UnsupportedDType`], [`SafeTensorsError::NotAMatrix`],
    /// [`SafeTensorsError::TiedTensorsDiffer`]), in the model's
    /// order. A load with one problem fails with that problem itself.
    #[error("{} parameters do not match the file:{}", problems.len(), list(problems))]
    Mismatch {
        /// Every problem, in the order of the model's parameters.
        problems: Vec<SafeTensorsError>,
    },
    /// A value the target element type cannot hold: not an integer, or out of range, for an
    /// integer type; a finite value beyond the range of a float type.
    #[error("tensor \"{name}\": element {index} is {value}, which {target} cannot hold")]
    Unrepresentable {
        /// The tensor.
        name: String,
        /// The element's index in the tensor's row-major order as stored in the file.
        index: usize,
        /// The value, printed as its type in the file prints it.
        value: String,
        /// The element type it was converted to, e.g. `"i64"`.
        target: &'static str,
    },
}

fn describe_source(path: &Option<PathBuf>) -> String {
    match path {
        Some(path) => format!("{} is", path.display()),
        None => "the bytes are".to_string(),
    }
}

fn list(problems: &[SafeTensorsError]) -> String {
    problems.iter().map(|p| format!("\n  - {p}")).collect()
}

fn describe_shape_mismatch(
    name: &str,
    file: &Shape,
    param: &Shape,
    pytorch_linear: bool,
) -> String {
    let layout = if pytorch_linear {
        let transposed: Vec<usize> = file.0.iter().rev().copied().collect();
        format!(
            " (PyTorch's Linear layout [out, in], so transposed to {})",
            Shape(transposed)
        )
    } else {
        String::new()
    };
    let transposed = file.0.len() == 2 && file.0.iter().rev().eq(param.0.iter());
    let hint = if transposed && !pytorch_linear {
        "; it is the parameter's transpose: a file in PyTorch's Linear layout ([out, in]) loads \
         with `LoadOptions::pytorch_linear`"
    } else {
        ""
    };
    format!(
        "tensor \"{name}\" has shape {file} in the file{layout}, but the parameter has shape \
         {param}{hint}"
    )
}

impl SafeTensorsError {
    fn io(action: &'static str, path: &Path, error: &std::io::Error) -> Self {
        SafeTensorsError::Io {
            action,
            path: path.to_path_buf(),
            kind: error.kind(),
            message: error.to_string(),
        }
    }
}

/// The element type of a tensor in a safetensors file, printed as the format spells it (`"F32"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FileDType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// IEEE half-precision float.
    F16,
    /// bfloat16.
    BF16,
    /// 64-bit signed integer.
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit unsigned integer.
    U8,
    /// A dtype tensorscope does not read (`"BOOL"`, `"I8"`, `"F8_E4M3"`, ...), as the file spells it.
    Other(String),
}

impl FileDType {
    fn of(dtype: Dtype) -> Self {
        match dtype {
            Dtype::F32 => FileDType::F32,
            Dtype::F64 => FileDType::F64,
            Dtype::F16 => FileDType::F16,
            Dtype::BF16 => FileDType::BF16,
            Dtype::I64 => FileDType::I64,
            Dtype::I32 => FileDType::I32,
            Dtype::U8 => FileDType::U8,
            other => FileDType::Other(other.to_string()),
        }
    }

    /// The file's dtype for element type `T`.
    fn of_element<T: Element>() -> Dtype {
        match T::NAME {
            "f32" => Dtype::F32,
            "f64" => Dtype::F64,
            "f16" => Dtype::F16,
            "bf16" => Dtype::BF16,
            other => unreachable!("Element is sealed to the four floats, not {other}"),
        }
    }

    /// Whether this is a float type a parameter loads from: `F32`, `F64`, `F16` or `BF16`.
    pub fn is_float(&self) -> bool {
        matches!(
            self,
            FileDType::F32 | FileDType::F64 | FileDType::F16 | FileDType::BF16
        )
    }
}

impl fmt::Display for FileDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileDType::F32 => "F32",
            FileDType::F64 => "F64",
            FileDType::F16 => "F16",
            FileDType::BF16 => "BF16",
            FileDType::I64 => "I64",
            FileDType::I32 => "I32",
            FileDType::U8 => "U8",
            FileDType::Other(name) => name,
        })
    }
}

/// A predicate on tensor names.
type NamePredicate = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// Which tensors are stored in PyTorch's Linear layout.
#[derive(Default)]
struct Layout {
    pytorch_linear: Option<NamePredicate>,
}

impl Layout {
    fn is_pytorch_linear(&self, name: &str) -> bool {
        self.pytorch_linear.as_ref().is_some_and(|p| p(name))
    }
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = if self.pytorch_linear.is_some() {
            "Some(<predicate>)"
        } else {
            "None"
        };
        f.write_str(set)
    }
}

/// How [`Weights::load_safetensors`] and [`ParamStore::from_safetensors`] read a file.
#[derive(Debug, Default)]
pub struct LoadOptions {
    pytorch_linear: Layout,
}

impl LoadOptions {
    /// Loads every tensor as stored.
    pub fn new() -> Self {
        LoadOptions::default()
    }

    /// Names the tensors stored in PyTorch's Linear layout (`[out, in]`), e.g.
    /// `|name| name.ends_with(".weight") && !name.contains("norm")`: each is transposed to
    /// tensorscope's `[in, out]` on load. A tensor it names must have 2 axes, else the load fails
    /// with [`SafeTensorsError::NotAMatrix`].
    pub fn pytorch_linear(
        mut self,
        is_linear: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.pytorch_linear.pytorch_linear = Some(Box::new(is_linear));
        self
    }
}

/// How [`Weights::save_safetensors`] writes a file.
#[derive(Debug)]
pub struct SaveOptions {
    dtype: Dtype,
    metadata: HashMap<String, String>,
    pytorch_linear: Layout,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            dtype: Dtype::F32,
            metadata: HashMap::new(),
            pytorch_linear: Layout::default(),
        }
    }
}

impl SaveOptions {
    /// Writes `F32`, no metadata, every tensor as the parameter is laid out.
    pub fn new() -> Self {
        SaveOptions::default()
    }

    /// Writes the tensors as `U` (`f32`, `f64`, `f16` or `bf16`), rounding to nearest. A finite value
    /// beyond `U`'s range fails the save with [`SafeTensorsError::Unrepresentable`].
    pub fn dtype<U: Element>(mut self) -> Self {
        self.dtype = FileDType::of_element::<U>();
        self
    }

    /// Adds a `key: value` entry to the file's string metadata (the header's `__metadata__`), replacing
    /// an earlier value of `key`.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Names the parameters to store in PyTorch's Linear layout (`[out, in]`): each is transposed
    /// from tensorscope's `[in, out]` on save. A parameter it names must have 2 axes, else the save
    /// fails with [`SafeTensorsError::NotAMatrix`].
    pub fn pytorch_linear(
        mut self,
        is_linear: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.pytorch_linear.pytorch_linear = Some(Box::new(is_linear));
        self
    }
}

/// What [`Weights::load_safetensors`] did not use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LoadReport {
    /// The file's tensors that no parameter took, sorted by name (an optimizer's state, a buffer, a
    /// head the model does not have, or a name misspelled on one side).
    pub unused: Vec<String>,
}

/// An open safetensors file whose header has been read and checked, for tensors that are not
/// parameters (token ids, labels, reference values) or to look inside a checkpoint. Each tensor is
/// read from the file when asked for.
///
/// ```
/// use tensorscope::nn::{FileDType, LoadOptions, ParamStore, SafeTensorsFile, SaveOptions, Weights};
/// use tensorscope::{Param, Pool};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let path = std::env::temp_dir().join(format!("tensorscope-file-{}.safetensors", std::process::id()));
/// let mut params = ParamStore::<f32>::new(&pool);
/// params.add("ids", Param::from_slice(&pool, &[3], &[7.0f32, 0.0, 2.0])).unwrap();
/// params.save_safetensors(&path, &SaveOptions::new().metadata("format", "pt")).unwrap();
///
/// let file = SafeTensorsFile::open(&path).unwrap();
/// assert_eq!(file.names(), ["ids"]);
/// assert_eq!((file.shape("ids").unwrap(), file.dtype("ids").unwrap()), (&[3][..], FileDType::F32));
/// assert_eq!(file.metadata()["format"], "pt");
/// let ids: Param<i64> = file.param(&pool, "ids").unwrap(); // integral floats convert exactly
/// assert_eq!(ids.to_vec(), vec![7, 0, 2]);
/// std::fs::remove_file(&path).unwrap();
/// ```
pub struct SafeTensorsFile {
    /// The open file, or the bytes given to [`SafeTensorsFile::from_bytes`].
    source: Box<dyn ReadAt>,
    /// The file's path, for errors (`None` for bytes).
    path: Option<PathBuf>,
    /// The length when the header was read.
    len: u64,
    /// Where the data (after the header) starts.
    data_start: u64,
    /// The header's tensors, sorted by name, as `names` is.
    tensors: Vec<Entry>,
    names: Vec<String>,
    metadata: HashMap<String, String>,
}

/// A tensor of the file checked for a read: its dtype is readable and, for PyTorch's Linear layout,
/// it has 2 axes.
struct StoredTensor<'a> {
    name: &'a str,
    dtype: Dtype,
    /// The shape as stored in the file.
    file_shape: &'a [usize],
    /// The shape it is read as (transposed for PyTorch's Linear layout).
    shape: Vec<usize>,
    transposed: bool,
    /// Where its bytes start in the file.
    start: u64,
    file: &'a SafeTensorsFile,
}

impl SafeTensorsFile {
    /// Opens the file at `path` and reads its header; tensors are read from the file when asked
    /// for, so the file stays open. Fails with [`SafeTensorsError::Io`] if it cannot be read, and
    /// [`SafeTensorsError::Corrupt`] if it is not a safetensors file (truncated, a bad header, a
    /// tensor listed twice, byte ranges that do not fit).
    ///
    /// The file is read, never mapped, so another process changing it cannot crash this one: a
    /// tensor read after the file shrank fails with [`SafeTensorsError::Corrupt`] naming it, and
    /// one read after the file was rewritten holds the bytes the file held when it was read.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NnError> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| SafeTensorsError::io("read", path, &e))?;
        Ok(Self::read(Box::new(file), Some(path.to_path_buf()))?)
    }

    /// Parses `bytes` as a safetensors file (e.g. from `include_bytes!`). Fails with
    /// [`SafeTensorsError::Corrupt`] as [`SafeTensorsFile::open`] does.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, NnError> {
        Ok(Self::read(Box::new(bytes), None)?)
    }

    /// Reads and checks the header of `source` (the file at `path`). The header's bytes are read
    /// once, and parsed from that copy only.
    fn read(source: Box<dyn ReadAt>, path: Option<PathBuf>) -> Result<Self, SafeTensorsError> {
        let mut file = SafeTensorsFile {
            source,
            path,
            len: 0,
            data_start: 0,
            tensors: Vec::new(),
            names: Vec::new(),
            metadata: HashMap::new(),
        };
        file.len = file
            .source
            .len()
            .map_err(|e| file.read_error("the header", 0..0, &e))?;
        let corrupt = |reason| SafeTensorsError::Corrupt {
            path: file.path.clone(),
            reason,
        };
        let mut prefix = [0; HEADER_LENGTH_BYTES];
        let prefix = match file.len >= HEADER_LENGTH_BYTES as u64 {
            true => file
                .read_at("the header", &mut prefix, 0)
                .map(|()| Some(prefix))?,
            false => None,
        };
        let length = header::length(file.len, prefix).map_err(corrupt)?;
        let mut bytes = vec![0; length];
        file.read_at("the header", &mut bytes, HEADER_LENGTH_BYTES as u64)?;
        let data_start = (HEADER_LENGTH_BYTES + length) as u64;
        let Header { tensors, metadata } =
            header::read(&bytes, file.len - data_start).map_err(corrupt)?;
        file.names = tensors.iter().map(|t| t.name.clone()).collect();
        file.tensors = tensors;
        file.metadata = metadata;
        file.data_start = data_start;
        Ok(file)
    }

    /// Fails with [`SafeTensorsError::Corrupt`] if the file is shorter now than when it was opened
    /// (another process truncated it), before a load writes anything.
    fn check_length(&self) -> Result<(), SafeTensorsError> {
        match self.source.len() {
            Ok(now) if now < self.len => Err(SafeTensorsError::Corrupt {
                path: self.path.clone(),
                reason: format!(
                    "the file is {now} bytes, shorter than the {} it was when opened",
                    self.len
                ),
            }),
            Ok(_) => Ok(()),
            Err(e) => Err(self.read_error("the file's length", 0..0, &e)),
        }
    }

    /// Fills `buf` from the file's byte `offset` on; `what` names what is read, for errors.
    fn read_at(&self, what: &str, buf: &mut [u8], offset: u64) -> Result<(), SafeTensorsError> {
        self.source
            .read_exact_at(buf, offset)
            .map_err(|e| self.read_error(what, offset..offset + buf.len() as u64, &e))
    }

    /// The error of a read of the file's bytes `range` for `what`: the file ending before them is
    /// [`SafeTensorsError::Corrupt`] (it shrank after it was opened), any other failure
    /// [`SafeTensorsError::Io`].
    fn read_error(
        &self,
        what: &str,
        range: std::ops::Range<u64>,
        error: &std::io::Error,
    ) -> SafeTensorsError {
        let path = self.path.clone();
        match (error.kind(), path) {
            (std::io::ErrorKind::UnexpectedEof, path) => {
                let now = self.source.len().map_or_else(
                    |e| format!("of unknown length ({e})"),
                    |n| format!("{n} bytes"),
                );
                SafeTensorsError::Corrupt {
                    path,
                    reason: format!(
                        "{what}: the file ends before bytes [{}, {}) (it was {} bytes when opened, \
                         and is {now} now)",
                        range.start, range.end, self.len
                    ),
                }
            }
            (_, Some(path)) => SafeTensorsError::Io {
                action: "read",
                path,
                kind: error.kind(),
                message: format!("{what}: {error}"),
            },
            // Bytes in memory fail only by ending early.
            (_, None) => SafeTensorsError::Corrupt {
                path: None,
                reason: format!("{what}: {error}"),
            },
        }
    }

    /// The tensors' names, sorted (byte-wise, so `"layer.10"` comes before `"layer.2"`).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether the file holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether the file has a tensor named `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.names
            .binary_search_by(|n| n.as_str().cmp(name))
            .is_ok()
    }

    /// The file's string metadata (the header's `__metadata__`; empty if it has none).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    fn info(&self, name: &str) -> Result<&Entry, SafeTensorsError> {
        match self.names.binary_search_by(|n| n.as_str().cmp(name)) {
            Ok(index) => Ok(&self.tensors[index]),
            Err(_) => Err(SafeTensorsError::MissingTensor {
                name: name.to_string(),
                close: close_names(name, &self.names),
            }),
        }
    }

    /// The shape of the tensor `name` as stored. Fails with [`SafeTensorsError::MissingTensor`],
    /// listing the file's names that look alike.
    pub fn shape(&self, name: &str) -> Result<&[usize], NnError> {
        Ok(&self.info(name)?.shape)
    }

    /// The dtype of the tensor `name`. Fails as [`SafeTensorsFile::shape`] does.
    pub fn dtype(&self, name: &str) -> Result<FileDType, NnError> {
        Ok(FileDType::of(self.info(name)?.dtype))
    }

    /// The tensor `name` as a parameter of element type `T`, in a buffer rented from `pool`. Any of
    /// the file's `F32`, `F64`, `F16`, `BF16`, `I64`, `I32` and `U8` converts to any [`DType`]:
    ///
    /// - to the same type, bit for bit;
    /// - to a float type, rounding to nearest (an `I64` beyond 2^53 may round twice, through `f64`);
    /// - to an integer type, exactly: a value that is not an integer, or out of the type's range
    ///   (NaN and infinities included), fails with [`SafeTensorsError::Unrepresentable`] naming the
    ///   tensor, the element and its value.
    ///
    /// A finite value beyond a float type's range (`1e5` into `f16`) also fails with
    /// [`SafeTensorsError::Unrepresentable`]. Fails with [`SafeTensorsError::MissingTensor`] for a name
    /// the file does not have, [`SafeTensorsError::UnsupportedDType`] for another dtype, and with a
    /// budget error if the pool cannot hold it.
    pub fn param<T: DType>(&self, pool: &Pool, name: &str) -> Result<Param<T>, NnError> {
        let tensor = self.tensor(name, false, false)?;
        Ok(Param::from_buffer(tensor.to_buffer(pool)?, &tensor.shape))
    }

    /// The tensor `name` checked for a read as a parameter (`floats_only`) or any tensor, in
    /// PyTorch's Linear layout or not.
    fn tensor(
        &self,
        name: &str,
        floats_only: bool,
        pytorch_linear: bool,
    ) -> Result<StoredTensor<'_>, SafeTensorsError> {
        let info = self.info(name)?;
        let name = info.name.as_str();
        let readable = match info.dtype {
            Dtype::F32 | Dtype::F64 | Dtype::F16 | Dtype::BF16 => true,
            Dtype::I64 | Dtype::I32 | Dtype::U8 => !floats_only,
            _ => false,
        };
        if !readable {
            return Err(SafeTensorsError::UnsupportedDType {
                name: name.to_string(),
                dtype: FileDType::of(info.dtype),
                floats_only,
            });
        }
        let shape = match (pytorch_linear, &info.shape[..]) {
            (false, shape) => shape.to_vec(),
            (true, &[out, inp]) => vec![inp, out],
            (true, shape) => {
                return Err(SafeTensorsError::NotAMatrix {
                    name: name.to_string(),
                    shape: Shape::from(shape),
                })
            }
        };
        Ok(StoredTensor {
            name,
            dtype: info.dtype,
            file_shape: &info.shape,
            shape,
            transposed: pytorch_linear,
            start: self.data_start + info.offsets.0 as u64,
            file: self,
        })
    }

    /// The tensor a parameter of `shape` named `name` loads from, checked: readable as a float,
    /// in the layout `options` gives, of the parameter's shape.
    fn for_param(
        &self,
        name: &str,
        shape: &[usize],
        options: &LoadOptions,
    ) -> Result<StoredTensor<'_>, SafeTensorsError> {
        let linear = options.pytorch_linear.is_pytorch_linear(name);
        let tensor = self.tensor(name, true, linear)?;
        if tensor.shape != shape {
            return Err(SafeTensorsError::ShapeMismatch {
                name: name.to_string(),
                file: Shape::from(tensor.file_shape),
                param: Shape::from(shape),
                pytorch_linear: tensor.transposed,
            });
        }
        Ok(tensor)
    }
}

impl fmt::Debug for SafeTensorsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for tensor in &self.tensors {
            map.entry(
                &tensor.name,
                &format_args!("{}{:?}", tensor.dtype, tensor.shape),
            );
        }
        map.finish()
    }
}

impl StoredTensor<'_> {
    /// Whether a value may not fit in `T` (a conversion to a float as narrow or narrower than the
    /// file's dtype): such a tensor is read into a new buffer before anything changes, so that
    /// [`SafeTensorsError::Unrepresentable`] leaves the parameters as they were.
    fn may_not_fit<T: Element>(&self) -> bool {
        let width = |dtype: Dtype| match dtype {
            Dtype::F64 | Dtype::I64 => 8,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            _ => 1,
        };
        let same = FileDType::of_element::<T>() == self.dtype;
        !same && width(self.dtype) >= size_of::<T>()
    }

    /// The values converted to `T`, in a buffer of `pool` laid out as `self.shape`.
    fn to_buffer<T: DType>(&self, pool: &Pool) -> Result<PoolBuffer<T>, NnError> {
        let mut buf = pool.try_rent::<T>(&self.shape)?;
        self.write_to(&mut buf)?;
        Ok(buf)
    }

    /// The values converted to `T` into `out`, laid out as `self.shape`.
    fn write_to<T: DType>(&self, out: &mut [T]) -> Result<(), SafeTensorsError> {
        match (self.transposed, self.file_shape) {
            (true, &[rows, cols]) if !out.is_empty() => {
                let mut stored = vec![T::default(); out.len()];
                self.decode(&mut stored)?;
                let stored = ArrayView2::from_shape((rows, cols), &stored)
                    .expect("the file's shape holds the tensor");
                ArrayViewMut2::from_shape((cols, rows), out)
                    .expect("the output holds the transposed shape")
                    .assign(&stored.t());
                Ok(())
            }
            _ => self.decode(out),
        }
    }

    /// Reads the file's values, in their stored order, converted into `out`.
    fn decode<T: DType>(&self, out: &mut [T]) -> Result<(), SafeTensorsError> {
        match self.dtype {
            Dtype::F32 => self.read_as::<f32, T>(out),
            Dtype::F64 => self.read_as::<f64, T>(out),
            Dtype::F16 => self.read_as::<half::f16, T>(out),
            Dtype::BF16 => self.read_as::<half::bf16, T>(out),
            Dtype::I64 => self.read_as::<i64, T>(out),
            Dtype::I32 => self.read_as::<i32, T>(out),
            Dtype::U8 => self.read_as::<u8, T>(out),
            other => unreachable!("StoredTensor is made for readable dtypes only, not {other}"),
        }
    }

    /// Reads the file's values, stored as `S`, converted into `out`: straight into `out`'s bytes
    /// if `S` is `T`, else through a scratch buffer of at most [`SCRATCH_BYTES`].
    fn read_as<S: DType, T: DType>(&self, out: &mut [T]) -> Result<(), SafeTensorsError> {
        let what = format!("tensor \"{}\"", self.name);
        if TypeId::of::<S>() == TypeId::of::<T>() {
            let bytes = bytemuck::cast_slice_mut::<T, u8>(out);
            self.file.read_at(&what, bytes, self.start)?;
            if cfg!(target_endian = "big") {
                bytes
                    .chunks_exact_mut(size_of::<T>())
                    .for_each(<[u8]>::reverse);
            }
            return Ok(());
        }
        let per_read = SCRATCH_BYTES / size_of::<S>();
        let mut scratch = vec![0u8; per_read.min(out.len()) * size_of::<S>()];
        for (i, out) in out.chunks_mut(per_read).enumerate() {
            let scratch = &mut scratch[..out.len() * size_of::<S>()];
            let offset = self.start + (i * per_read * size_of::<S>()) as u64;
            self.file.read_at(&what, scratch, offset)?;
            convert(self.name, i * per_read, le_values::<S>(scratch), out)?;
        }
        Ok(())
    }
}

/// The values of little-endian `bytes` (the file's byte order, whatever the machine's), read
/// unaligned.
fn le_values<S: DType>(bytes: &[u8]) -> impl Iterator<Item = S> + '_ {
    bytes.chunks_exact(size_of::<S>()).map(|chunk| {
        let mut scratch = [0u8; 8];
        let scratch = &mut scratch[..chunk.len()];
        scratch.copy_from_slice(chunk);
        if cfg!(target_endian = "big") {
            scratch.reverse();
        }
        bytemuck::pod_read_unaligned(scratch)
    })
}

/// The little-endian bytes of `values`.
fn le_bytes<U: DType>(values: &[U]) -> Vec<u8> {
    let mut bytes = bytemuck::cast_slice::<U, u8>(values).to_vec();
    if cfg!(target_endian = "big") {
        bytes
            .chunks_exact_mut(size_of::<U>())
            .for_each(<[u8]>::reverse);
    }
    bytes
}

/// Converts `src` into `out` element by element (see [`SafeTensorsFile::param`] for the rules), the
/// one conversion of both loads and saves. `name` is the tensor's and `first` the index of `src`'s
/// first element in it, for errors.
fn convert<S: DType, T: DType>(
    name: &str,
    first: usize,
    src: impl Iterator<Item = S>,
    out: &mut [T],
) -> Result<(), SafeTensorsError> {
    if TypeId::of::<S>() == TypeId::of::<T>() {
        // Bit for bit: an i64 beyond 2^53 would not survive a trip through f64, nor a NaN's payload.
        out.iter_mut()
            .zip(src)
            .for_each(|(o, s)| *o = bytemuck::cast(s));
        return Ok(());
    }
    let integer_target = is_integer::<T>();
    for (index, (o, s)) in out.iter_mut().zip(src).enumerate() {
        let value = s.to_f64();
        let converted = T::from_f64(value);
        let back = converted.to_f64();
        let held = if integer_target {
            // Conversion saturates, and i64::MAX reads back as 2^63: so 2^63 itself would pass.
            back == value && value != 2f64.powi(63)
        } else {
            back.is_finite() || !value.is_finite()
        };
        if !held {
            return Err(SafeTensorsError::Unrepresentable {
                name: name.to_string(),
                index: first + index,
                value: s.to_string(),
                target: T::NAME,
            });
        }
        *o = converted;
    }
    Ok(())
}

/// A tensor ready to write: the `safetensors` crate's view of it.
struct Encoded {
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for Encoded {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// `param` as the file stores it: in `dtype`, transposed if `pytorch_linear`.
fn encode<T: Element>(
    name: &str,
    param: &Param<T>,
    dtype: Dtype,
    pytorch_linear: bool,
) -> Result<Encoded, SafeTensorsError> {
    let view = match (pytorch_linear, param.ndim()) {
        (false, _) => param.view(),
        (true, 2) => param.view().reversed_axes(),
        (true, _) => {
            return Err(SafeTensorsError::NotAMatrix {
                name: name.to_string(),
                shape: Shape::from(param.shape()),
            })
        }
    };
    let data = match dtype {
        Dtype::F32 => encode_as::<T, f32>(name, &view),
        Dtype::F64 => encode_as::<T, f64>(name, &view),
        Dtype::F16 => encode_as::<T, half::f16>(name, &view),
        Dtype::BF16 => encode_as::<T, half::bf16>(name, &view),
        other => unreachable!("SaveOptions holds a float dtype only, not {other}"),
    }?;
    Ok(Encoded {
        dtype,
        shape: view.shape().to_vec(),
        data,
    })
}

/// The little-endian bytes of `view`'s values converted to `U`, in its (logical) row-major order.
fn encode_as<T: DType, U: DType>(
    name: &str,
    view: &ArrayViewD<'_, T>,
) -> Result<Vec<u8>, SafeTensorsError> {
    let mut out = vec![U::default(); view.len()];
    convert(name, 0, view.iter().copied(), &mut out)?;
    Ok(le_bytes(&out))
}

/// Saving and loading a set of parameters (a model with `#[derive(Parameters)]`, a
/// [`ParamStore`]) by its parameters' names, as safetensors files: implemented for every
/// [`Parameters`], and in the prelude.
///
/// ```
/// use tensorscope::nn::{Linear, SaveOptions};
/// use tensorscope::prelude::*;
///
/// #[derive(Parameters)]
/// struct Head {
///     #[param(rename = "lm_head")]
///     proj: Linear,
/// }
///
/// let pool = Pool::with_max_memory_mb(16);
/// let path = std::env::temp_dir().join(format!("tensorscope-weights-{}.safetensors", std::process::id()));
/// let saved = Head { proj: Linear::new(&pool, 4, 2, 1).unwrap() };
/// saved.save_safetensors(&path, &SaveOptions::new()).unwrap();
/// let mut loaded = Head { proj: Linear::new(&pool, 4, 2, 2).unwrap() };
/// loaded.load_safetensors(&path, &Default::default()).unwrap();
/// assert_eq!(loaded.proj.weight().to_vec(), saved.proj.weight().to_vec());
/// std::fs::remove_file(&path).unwrap();
/// ```
pub trait Weights<T: Element>: Parameters<T> {
    /// Writes every parameter under its name to a safetensors file at `path` (replacing it; the
    /// file is written beside it and renamed, so a failed save leaves an existing file whole), in
    /// [`SaveOptions::dtype`] (`F32` by default), with the options' metadata, and transposing the
    /// parameters [`SaveOptions::pytorch_linear`] names to PyTorch's `[out, in]`. A parameter two
    /// fields hold ([tied](crate::Parameters#tied-parameters)) is written under both names.
    ///
    /// Fails with [`NnError::DuplicateParam`] if two parameters have one name,
    /// [`SafeTensorsError::ReservedName`](SafeTensorsError::ReservedName) for a parameter named
    /// `"__metadata__"`,
    /// [`SafeTensorsError::NotAMatrix`](SafeTensorsError::NotAMatrix) for a parameter
    /// named as in PyTorch's layout without 2 axes,
    /// [`SafeTensorsError::Unrepresentable`](SafeTensorsError::Unrepresentable) for a
    /// finite value beyond the dtype's range (`1e5` as `F16`), and
    /// [`SafeTensorsError::Io`](SafeTensorsError::Io) if the file cannot be written.
    fn save_safetensors(
        &self,
        path: impl AsRef<Path>,
        options: &SaveOptions,
    ) -> Result<(), NnError> {
        save(self, path.as_ref(), options)
    }

    /// Fills every parameter from the tensor of its name in the safetensors file at `path`, and
    /// returns the file's tensors no parameter took. Every name, shape and dtype is checked before
    /// anything is read, and a failure changes nothing: see
    /// [`SafeTensorsError::Mismatch`](SafeTensorsError::Mismatch), which names every
    /// parameter at fault. A parameter no other handle shares is read from the file straight into
    /// its buffer (one copy of the weights in memory); one that others share, or whose values a
    /// conversion to a narrower type might not fit, is read into a new buffer first, before any
    /// parameter changes. A [`Parameters`] whose walks meet other parameters than the first fails
    /// with [`NnError::ParametersChanged`].
    ///
    /// A file that another process shrinks or rewrites during the load cannot crash it (it is read,
    /// not mapped): if it changed before anything was written, the load fails with
    /// [`SafeTensorsError::Corrupt`](SafeTensorsError::Corrupt) naming the tensor and changes
    /// nothing; if a read fails once parameters are being written in place, it fails with
    /// [`SafeTensorsError::LoadInterrupted`](SafeTensorsError::LoadInterrupted), which says how
    /// many parameters hold the file's values.
    ///
    /// A [tied](crate::Parameters#tied-parameters) parameter loads from its first name, and its
    /// later fields are then given the same data (the tie holds). Its later names may be absent
    /// from the file; present, each must hold the first's values, or the load fails with
    /// [`SafeTensorsError::TiedTensorsDiffer`](SafeTensorsError::TiedTensorsDiffer) naming both.
    fn load_safetensors(
        &mut self,
        path: impl AsRef<Path>,
        options: &LoadOptions,
    ) -> Result<LoadReport, NnError> {
        load(self, path.as_ref(), options)
    }
}

impl<T: Element, P: Parameters<T>> Weights<T> for P {}

/// Fills every parameter of `params` from the tensor of its name in the file at `path`: see
/// [`Weights::load_safetensors`].
///
/// Three steps, so that a failure of anything but the file changes nothing: every parameter is
/// checked against the file (every problem is reported); then the tensors that cannot be read in
/// place are read into new buffers of their parameters' pools (a conversion to a narrower float
/// can fail if a value does not fit, a rent if the pool is full); then each parameter is given its
/// buffer or read in place, which fails only if the file changed since it was opened. A
/// parameter keeps its key (an optimizer keeps its state). The last walk must meet the parameters
/// the first met, or the load stops there with [`NnError::ParametersChanged`].
pub(crate) fn load<T: Element, P: Parameters<T> + ?Sized>(
    params: &mut P,
    path: &Path,
    options: &LoadOptions,
) -> Result<LoadReport, NnError> {
    load_file(params, &SafeTensorsFile::open(path)?, options)
}

/// Fills every parameter of `params` from the tensor of its name in `file`: see [`load`].
fn load_file<T: Element, P: Parameters<T> + ?Sized>(
    params: &mut P,
    file: &SafeTensorsFile,
    options: &LoadOptions,
) -> Result<LoadReport, NnError> {
    /// How a handle gets its values, as the first walk planned it.
    enum Fill<'a> {
        /// Read straight into the parameter's buffer (no other handle shares it, and the
        /// conversion cannot fail).
        InPlace(StoredTensor<'a>),
        /// Read into a new buffer of the parameter's pool before anything changes.
        Fresh(StoredTensor<'a>, Pool),
        /// A later field of a tied parameter: given the data of the handle at this index.
        Tied(usize),
    }

    /// A handle, as the first walk met it.
    struct Planned<'a> {
        key: u64,
        version: u64,
        shape: Vec<usize>,
        fill: Fill<'a>,
    }

    let mut planned: Vec<Planned<'_>> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut problems = Vec::new();
    let mut taken = HashSet::new();
    // The index of every parameter's first handle, by key: a later one is a tied field.
    let mut firsts = HashMap::new();
    params.visit_params(&ParamPath::ROOT, &mut |path, p| {
        let name = path.to_string();
        let index = names.len();
        let first = *firsts.entry(p.key()).or_insert(index);
        let fill = if !taken.insert(name.clone()) {
            problems.push(Err(NnError::DuplicateParam(name.clone())));
            None
        } else if first != index {
            if let Err(e) = check_tie(file, &names[first], &name, p, options) {
                problems.push(e);
            }
            Some(Fill::Tied(first))
        } else {
            match file.for_param(&name, p.shape(), options) {
                Ok(tensor) if p.is_unique() && !tensor.may_not_fit::<T>() => {
                    Some(Fill::InPlace(tensor))
                }
                Ok(tensor) => Some(Fill::Fresh(tensor, p.pool().clone())),
                Err(e) => {
                    problems.push(Ok(e));
                    None
                }
            }
        };
        if let Some(fill) = fill {
            let (key, version, shape) = (p.key(), p.version(), p.shape().to_vec());
            planned.push(Planned {
                key,
                version,
                shape,
                fill,
            });
        }
        names.push(name);
    });
    if let Some(duplicate) = problems.iter().position(Result::is_err) {
        return Err(problems.swap_remove(duplicate).expect_err("found above"));
    }
    let mut problems: Vec<SafeTensorsError> = problems.into_iter().map(Result::unwrap).collect();
    match problems.len() {
        0 => {}
        1 => return Err(problems.remove(0).into()),
        _ => return Err(SafeTensorsError::Mismatch { problems }.into()),
    }
    let mut fresh = planned
        .iter()
        .map(|plan| match &plan.fill {
            Fill::Fresh(tensor, pool) => tensor.to_buffer::<T>(pool).map(Some),
            _ => Ok(None),
        })
        .collect::<Result<Vec<_>, NnError>>()?
        .into_iter();
    // What can be known before the first write: a file that shrank since it was opened.
    file.check_length()?;
    let tie_targets: HashSet<usize> = planned
        .iter()
        .filter_map(|planned| match planned.fill {
            Fill::Tied(first) => Some(first),
            _ => None,
        })
        .collect();
    let mut loaded: HashMap<usize, Param<T>> = HashMap::new();
    let mut index = 0;
    let mut failure = None;
    params.visit_params_mut(&ParamPath::ROOT, &mut |_, p| {
        if failure.is_some() {
            return;
        }
        let Some(plan) = planned.get(index).filter(|plan| {
            (plan.key, plan.version, &plan.shape[..]) == (p.key(), p.version(), p.shape())
        }) else {
            failure = Some(NnError::ParametersChanged {
                index,
                updated: index,
            });
            return;
        };
        let buffer = fresh.next().flatten();
        let filled = match (&plan.fill, buffer) {
            (Fill::Tied(first), _) => {
                *p = loaded[first].clone();
                Ok(())
            }
            (_, Some(buffer)) => {
                p.replace_buffer(buffer);
                Ok(())
            }
            (Fill::InPlace(tensor), None) => p
                .try_slice_mut()
                .map_err(NnError::from)
                .and_then(|out| Ok(tensor.write_to(out)?)),
            (Fill::Fresh(..), None) => unreachable!("read above"),
        };
        if let Err(e) = filled {
            failure = Some(match e {
                NnError::SafeTensors(source) => SafeTensorsError::LoadInterrupted {
                    loaded: index,
                    source: Box::new(source),
                }
                .into(),
                other => other,
            });
            return;
        }
        if tie_targets.contains(&index) {
            loaded.insert(index, p.clone());
        }
        index += 1;
    });
    if let Some(failure) = failure {
        return Err(failure);
    }
    if index != planned.len() {
        return Err(NnError::ParametersChanged {
            index,
            updated: index,
        });
    }
    let unused = file
        .names()
        .iter()
        .filter(|name| !taken.contains(name.as_str()))
        .cloned()
        .collect();
    Ok(LoadReport { unused })
}

/// Checks the tensor a later handle of a tied parameter (`name`, tied to the handle named
/// `first`) would load from: none (the parameter loads through its first name), or one that loads
/// as the parameter and holds the same values as `first`'s, bit for bit once converted, else
/// [`SafeTensorsError::TiedTensorsDiffer`]. A failure to rent the buffers compared is the
/// `Err` of the result, a problem of the file its `Ok`.
fn check_tie<T: Element>(
    file: &SafeTensorsFile,
    first: &str,
    name: &str,
    p: &Param<T>,
    options: &LoadOptions,
) -> Result<(), Result<SafeTensorsError, NnError>> {
    if !file.contains(name) {
        return Ok(());
    }
    let tensor = file.for_param(name, p.shape(), options).map_err(Ok)?;
    // A first name at fault is reported at it.
    let Ok(first_tensor) = file.for_param(first, p.shape(), options) else {
        return Ok(());
    };
    let read = |t: &StoredTensor<'_>| match t.to_buffer::<T>(p.pool()) {
        Ok(buffer) => Ok(buffer),
        Err(NnError::SafeTensors(e)) => Err(Ok(e)),
        Err(e) => Err(Err(e)),
    };
    let (values, first_values) = (read(&tensor)?, read(&first_tensor)?);
    let bits = |x: T| DType::to_f64(x).to_bits();
    match (values.iter().zip(first_values.iter())).position(|(&a, &b)| bits(a) != bits(b)) {
        None => Ok(()),
        Some(index) => Err(Ok(SafeTensorsError::TiedTensorsDiffer {
            name: name.to_string(),
            first: first.to_string(),
            index,
            value: DType::to_f64(values[index]),
            first_value: DType::to_f64(first_values[index]),
        })),
    }
}

/// Writes every parameter of `params` under its name: see [`Weights::save_safetensors`].
pub(crate) fn save<T: Element, P: Parameters<T> + ?Sized>(
    params: &P,
    path: &Path,
    options: &SaveOptions,
) -> Result<(), NnError> {
    // Every name, a tied parameter's under each (its values once per name, as PyTorch's
    // `state_dict()` keeps both keys), so that a reader of the file needs no tie of its own.
    let mut named = Vec::new();
    params.visit_params(&ParamPath::ROOT, &mut |path, p| {
        named.push((path.to_string(), p.clone()))
    });
    write_named(&named, path, options)
}

/// Writes `named` parameters under their names: see [`Weights::save_safetensors`].
pub(crate) fn write_named<T: Element>(
    named: &[(String, Param<T>)],
    path: &Path,
    options: &SaveOptions,
) -> Result<(), NnError> {
    let mut seen = HashSet::new();
    if let Some((name, _)) = named.iter().find(|(name, _)| !seen.insert(name)) {
        return Err(NnError::DuplicateParam(name.clone()));
    }
    if let Some((name, _)) = named.iter().find(|(name, _)| name == header::METADATA_KEY) {
        return Err(SafeTensorsError::ReservedName { name: name.clone() }.into());
    }
    let tensors = named
        .iter()
        .map(|(name, param)| {
            let linear = options.pytorch_linear.is_pytorch_linear(name);
            Ok((name, encode(name, param, options.dtype, linear)?))
        })
        .collect::<Result<Vec<_>, SafeTensorsError>>()?;
    let metadata = (!options.metadata.is_empty()).then(|| options.metadata.clone());
    safetensors::serialize_to_file(tensors, metadata, path).map_err(|e| match e {
        SafeTensorError::IoError(io) => SafeTensorsError::io("write", path, &io),
        other => SafeTensorsError::Serialize {
            path: path.to_path_buf(),
            reason: other.to_string(),
        },
    })?;
    Ok(())
}

impl<T: Element> ParamStore<T> {
    /// A store holding every tensor of the safetensors file at `path`, converted to `T` as
    /// [`Weights::load_safetensors`] converts, in buffers of `pool`. Parameters are registered in
    /// the order of their names, sorted byte-wise (the order of Python's `safe_open(..).keys()`;
    /// `"layer.10"` comes before `"layer.2"`).
    ///
    /// Every tensor must be a float: an integer one (a PyTorch BatchNorm's `num_batches_tracked`,
    /// say) fails with [`SafeTensorsError::UnsupportedDType`] naming it. To load a file that holds
    /// other tensors too, register the parameters and use [`Weights::load_safetensors`], which
    /// lists the rest, or read any tensor with [`SafeTensorsFile::param`]. Fails otherwise as
    /// [`Weights::load_safetensors`] does.
    pub fn from_safetensors(
        pool: &Pool,
        path: impl AsRef<Path>,
        options: &LoadOptions,
    ) -> Result<ParamStore<T>, NnError> {
        let file = SafeTensorsFile::open(path)?;
        let mut store = ParamStore::new(pool);
        for name in file.names() {
            let tensor = file.tensor(name, true, options.pytorch_linear.is_pytorch_linear(name))?;
            let param = Param::from_buffer(tensor.to_buffer::<T>(pool)?, &tensor.shape);
            store.add(name, param)?;
        }
        Ok(store)
    }
}
