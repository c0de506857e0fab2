//! Weights in and out of safetensors files (documented in the `nn` module's docs, where rustdoc
//! renders them).

mod header;
mod mapped;

use std::any::TypeId;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use ndarray::{ArrayView2, ArrayViewD, ArrayViewMut2};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensorError, SafeTensors, View};

use super::error::{close_names, suggest, NnError};
use super::params::ParamStore;
use crate::element::{is_integer, DType, Element};
use crate::error::Shape;
use crate::param::{Param, ParamPath, Parameters};
use crate::pool::{Pool, PoolBuffer};
use mapped::Bytes;

/// The bytes of the header length that starts every safetensors file.
const HEADER_LENGTH_BYTES: usize = 8;

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
    /// no tensor holds, or end past the file.
    #[error("{} not a valid safetensors file: {reason}", describe_source(path))]
    Corrupt {
        /// The file, or `None` for bytes given to [`SafeTensorsFile::from_bytes`].
        path: Option<PathBuf>,
        /// What is wrong, naming the tensor at fault if there is one (`tensor "w" is listed twice
        /// in the header`).
        reason: String,
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

/// A safetensors file read into memory, for tensors that are not parameters (token ids, labels,
/// reference values) or to look inside a checkpoint.
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
    /// Mapped by [`SafeTensorsFile::open`], owned from [`SafeTensorsFile::from_bytes`].
    bytes: Bytes,
    /// Where the data (after the header) starts in `bytes`.
    data_start: usize,
    header: Metadata,
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
    /// Where `data` lies in the file's bytes.
    range: std::ops::Range<usize>,
    data: &'a [u8],
}

impl SafeTensorsFile {
    /// Maps the file at `path` into memory (read-only: its pages are read as tensors are, not all
    /// at once) and parses its header. Fails with [`SafeTensorsError::Io`] if it cannot be read,
    /// and [`SafeTensorsError::Corrupt`] if it is not a safetensors file (truncated, a bad header,
    /// a tensor listed twice, byte ranges that do not fit).
    ///
    /// The file must not be written by another process while it is open: a mapped file's contents
    /// change under the reader (every mapped loader shares this condition). Where that cannot be
    /// ruled out, read the file and use [`SafeTensorsFile::from_bytes`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, NnError> {
        let path = path.as_ref();
        let read = |e| SafeTensorsError::io("read", path, &e);
        let file = std::fs::File::open(path).map_err(read)?;
        Self::parse(Bytes::map(&file).map_err(read)?, Some(path))
    }

    /// Parses `bytes` as a safetensors file (e.g. from `include_bytes!`). Fails with
    /// [`SafeTensorsError::Corrupt`] as [`SafeTensorsFile::open`] does.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, NnError> {
        Self::parse(Bytes::Owned(bytes), None)
    }

    fn parse(bytes: Bytes, path: Option<&Path>) -> Result<Self, NnError> {
        let corrupt = |reason| SafeTensorsError::Corrupt {
            path: path.map(Path::to_path_buf),
            reason,
        };
        // The crate can panic on a crafted header and keeps the last of two tensors of one name.
        header::check(&bytes).map_err(corrupt)?;
        let (header_len, header) =
            SafeTensors::read_metadata(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let mut names = header.offset_keys();
        names.sort();
        let metadata = header.metadata().clone().unwrap_or_default();
        Ok(SafeTensorsFile {
            data_start: HEADER_LENGTH_BYTES + header_len,
            bytes,
            header,
            names,
            metadata,
        })
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
        self.header.info(name).is_some()
    }

    /// The file's string metadata (the header's `__metadata__`; empty if it has none).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, SafeTensorsError> {
        self.header
            .info(name)
            .ok_or_else(|| SafeTensorsError::MissingTensor {
                name: name.to_string(),
                close: close_names(name, &self.names),
            })
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
    fn tensor<'a>(
        &'a self,
        name: &'a str,
        floats_only: bool,
        pytorch_linear: bool,
    ) -> Result<StoredTensor<'a>, SafeTensorsError> {
        let info = self.info(name)?;
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
        let (start, end) = info.data_offsets;
        Ok(StoredTensor {
            name,
            dtype: info.dtype,
            file_shape: &info.shape,
            shape,
            transposed: pytorch_linear,
            range: self.data_start + start..self.data_start + end,
            data: &self.bytes[self.data_start + start..self.data_start + end],
        })
    }

    /// The tensor a parameter of `shape` named `name` loads from, checked: readable as a float,
    /// in the layout `options` gives, of the parameter's shape.
    fn for_param<'a>(
        &'a self,
        name: &'a str,
        shape: &[usize],
        options: &LoadOptions,
    ) -> Result<StoredTensor<'a>, SafeTensorsError> {
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
        for name in &self.names {
            let info = self.header.info(name).expect("names come from the header");
            map.entry(name, &format_args!("{}{:?}", info.dtype, info.shape));
        }
        map.finish()
    }
}

impl StoredTensor<'_> {
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

    /// Whether converting to `T` may fail: to a narrower float (`F32` into `f16`), where a finite
    /// value can be out of range.
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

    /// Converts the file's values, in their stored order, into `out`.
    fn decode<T: DType>(&self, out: &mut [T]) -> Result<(), SafeTensorsError> {
        let name = self.name;
        match self.dtype {
            Dtype::F32 => convert(name, le_values::<f32>(self.data), out),
            Dtype::F64 => convert(name, le_values::<f64>(self.data), out),
            Dtype::F16 => convert(name, le_values::<half::f16>(self.data), out),
            Dtype::BF16 => convert(name, le_values::<half::bf16>(self.data), out),
            Dtype::I64 => convert(name, le_values::<i64>(self.data), out),
            Dtype::I32 => convert(name, le_values::<i32>(self.data), out),
            Dtype::U8 => convert(name, le_values::<u8>(self.data), out),
            other => unreachable!("StoredTensor is made for readable dtypes only, not {other}"),
        }
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
/// one conversion of both loads and saves. `name` is the tensor's, for errors.
fn convert<S: DType, T: DType>(
    name: &str,
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
                index,
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
    convert(name, view.iter().copied(), &mut out)?;
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
    /// anything is written, and a failure changes nothing: see
    /// [`SafeTensorsError::Mismatch`](SafeTensorsError::Mismatch), which names every
    /// parameter at fault. The file is mapped, not read whole into memory; a parameter no other
    /// handle shares is written in place.
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
/// Three passes, so that a failure changes nothing: every parameter is checked against the file
/// (every problem is reported); then the tensors that need a buffer of their own are converted into
/// new ones (a parameter another handle shares, or a conversion to a narrower float, which can
/// fail); then the rest are converted in place, which cannot fail, and the new buffers are given
/// to their parameters. A parameter keeps its key (an optimizer keeps its state). Each tensor's
/// pages of the mapped file are released once it is converted.
pub(crate) fn load<T: Element, P: Parameters<T> + ?Sized>(
    params: &mut P,
    path: &Path,
    options: &LoadOptions,
) -> Result<LoadReport, NnError> {
    let file = SafeTensorsFile::open(path)?;
    let mut names: Vec<String> = Vec::new();
    let mut problems = Vec::new();
    let mut taken = HashSet::new();
    // Of every handle, the index of the parameter's first handle if it is a later one (a field
    // tied to an earlier one): it is filled through the first, and given the first's data.
    let mut ties: Vec<Option<usize>> = Vec::new();
    let mut firsts = HashMap::new();
    params.visit_params(&ParamPath::ROOT, &mut |path, p| {
        let name = path.to_string();
        let first = *firsts.entry(p.key()).or_insert(names.len());
        let tied_to = (first != names.len()).then_some(first);
        if !taken.insert(name.clone()) {
            problems.push(Err(NnError::DuplicateParam(name.clone())));
        } else if let Some(first) = tied_to {
            if let Err(e) = check_tie(&file, &names[first], &name, p, options) {
                problems.push(e);
            }
        } else if let Err(e) = file.for_param(&name, p.shape(), options) {
            problems.push(Ok(e));
        }
        ties.push(tied_to);
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
    let tensor = |i: usize, p: &Param<T>| {
        file.for_param(&names[i], p.shape(), options)
            .expect("checked above")
    };
    let mut fresh: Vec<Option<PoolBuffer<T>>> = Vec::with_capacity(names.len());
    let mut failure = None;
    params.visit_params(&ParamPath::ROOT, &mut |_, p| {
        let i = fresh.len();
        let buffer = match ties[i] {
            None if failure.is_none() => {
                let stored = tensor(i, p);
                (!p.is_unique() || stored.may_not_fit::<T>())
                    .then(|| stored.to_buffer::<T>(p.pool()))
                    .transpose()
                    .map_err(|e| failure = Some(e))
                    .ok()
                    .flatten()
            }
            _ => None,
        };
        fresh.push(buffer);
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let mut fresh = fresh.into_iter();
    let mut index = 0;
    // The loaded first handles of tied parameters, by index, for their later handles.
    let mut loaded: HashMap<usize, Param<T>> = HashMap::new();
    params.visit_params_mut(&ParamPath::ROOT, &mut |_, p| {
        let buffer = fresh.next().expect("one per parameter");
        if let Some(first) = ties[index] {
            *p = loaded[&first].clone();
        } else {
            let stored = tensor(index, p);
            match buffer {
                Some(buffer) => p.replace_buffer(buffer),
                None => stored
                    .write_to(p.unique_slice_mut())
                    .expect("a conversion to a type as wide cannot fail"),
            }
            file.bytes.release(stored.range.clone());
            if ties.contains(&Some(index)) {
                loaded.insert(index, p.clone());
            }
        }
        index += 1;
    });
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
            file.bytes.release(tensor.range.clone());
            store.add(name, param)?;
        }
        Ok(store)
    }
}
