//! Safetensors files: parameters saved and loaded in every float dtype, PyTorch's Linear layout, the
//! generic reader, and every error with its message. Files written by hand follow the format (an
//! 8-byte little-endian header length, a JSON header padded with spaces to 8 bytes, little-endian
//! data) as Python's safetensors writes it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorscope::nn::{
    FileDType, LoadOptions, NnError, ParamStore, SafeTensorsError, SafeTensorsFile, SaveOptions,
};
use tensorscope::prelude::*;
use tensorscope::{bf16, f16, Element};

/// A path in the temp directory unique to this process and call, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(test: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("tensorscope-{test}-{}-{n}.safetensors", std::process::id());
        TempFile(std::env::temp_dir().join(name))
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// The path as error messages print it.
    fn shown(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A safetensors file's bytes: `header` (JSON) padded with spaces to a multiple of 8, then `data`.
fn safetensors_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut header = header.as_bytes().to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header);
    bytes.extend(data);
    bytes
}

fn le_bytes<const N: usize, T>(values: &[T], to_le: impl Fn(&T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(to_le).collect()
}

/// A store of `w` = [[1, 2, 3], [4, 5, 6]] (in 2, out 3), `b` = [0.5, -0.25, 0.1] and a 2x2x2 `t`.
fn sample_store(pool: &Pool) -> ParamStore<f32> {
    let mut params = ParamStore::<f32>::new(pool);
    let w = Param::from_slice(pool, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    params.add("fc.weight", w).unwrap();
    let b = Param::from_slice(pool, &[3], &[0.5, -0.25, 0.1]);
    params.add("fc.bias", b).unwrap();
    let t = Param::from_slice(
        pool,
        &[2, 2, 2],
        &[1e-3, 1e3, -7.0, 0.3, 60000.0, 0.0, -0.0, 1.5],
    );
    params.add("t", t).unwrap();
    params
}

/// A store of zeros with the shapes of `sample_store`, in `T`.
fn zeros_like_sample<T: Element>(pool: &Pool) -> ParamStore<T> {
    let mut params = ParamStore::<T>::new(pool);
    params.zeros("fc.weight", &[2, 3]).unwrap();
    params.zeros("fc.bias", &[3]).unwrap();
    params.zeros("t", &[2, 2, 2]).unwrap();
    params
}

fn values<T: Element>(params: &ParamStore<T>, name: &str) -> Vec<T> {
    params.get(name).unwrap().to_vec()
}

fn safetensors_err(err: NnError) -> SafeTensorsError {
    match err {
        NnError::SafeTensors(e) => e,
        other => panic!("expected a safetensors error, got {other:?}"),
    }
}

#[test]
fn f32_round_trips_bit_for_bit() {
    let pool = Pool::with_max_memory_mb(16);
    let params = sample_store(&pool);
    let file = TempFile::new("f32");
    params
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let mut loaded = zeros_like_sample::<f32>(&pool);
    let report = loaded
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap();
    assert!(report.unused.is_empty());
    for (name, p) in params.iter() {
        let got: Vec<u32> = values(&loaded, name).iter().map(|x| x.to_bits()).collect();
        let want: Vec<u32> = p.to_vec().iter().map(|x| x.to_bits()).collect();
        assert_eq!(got, want, "{name}");
        assert_eq!(loaded.get(name).unwrap().shape(), p.shape());
    }
    let read = SafeTensorsFile::open(file.path()).unwrap();
    assert_eq!(read.names(), ["fc.bias", "fc.weight", "t"]);
    assert_eq!(read.dtype("t").unwrap(), FileDType::F32);
    assert_eq!(read.shape("fc.weight").unwrap(), &[2, 3]);
}

/// Saves the sample store as `U`, loads it into stores of each float type and checks every value
/// is the f32 value rounded to `U`, then to the store's type.
fn check_saved_as<U: Element>(dtype: FileDType) {
    let pool = Pool::with_max_memory_mb(16);
    let params = sample_store(&pool);
    let file = TempFile::new(U::NAME);
    params
        .save_safetensors(file.path(), &SaveOptions::new().dtype::<U>())
        .unwrap();
    assert_eq!(
        SafeTensorsFile::open(file.path())
            .unwrap()
            .dtype("t")
            .unwrap(),
        dtype
    );
    fn load_as<T: Element, U: Element>(pool: &Pool, path: &Path, params: &ParamStore<f32>) {
        let mut loaded = zeros_like_sample::<T>(pool);
        loaded.load_safetensors(path, &LoadOptions::new()).unwrap();
        for (name, p) in params.iter() {
            let want: Vec<T> = p
                .to_vec()
                .iter()
                .map(|&x| T::from_f64(U::from_f64(f64::from(x)).to_f64()))
                .collect();
            assert_eq!(
                values(&loaded, name),
                want,
                "{name} saved as {} loaded as {}",
                U::NAME,
                T::NAME
            );
        }
    }
    load_as::<f32, U>(&pool, file.path(), &params);
    load_as::<f64, U>(&pool, file.path(), &params);
    load_as::<f16, U>(&pool, file.path(), &params);
    load_as::<bf16, U>(&pool, file.path(), &params);
}

#[test]
fn every_float_dtype_round_trips_with_its_rounding() {
    check_saved_as::<f32>(FileDType::F32);
    check_saved_as::<f64>(FileDType::F64);
    check_saved_as::<f16>(FileDType::F16);
    check_saved_as::<bf16>(FileDType::BF16);
}

#[test]
fn f32_saved_as_f16_loads_back_rounded_to_f16() {
    let pool = Pool::with_max_memory_mb(16);
    let mut params = ParamStore::<f32>::new(&pool);
    params
        .add(
            "x",
            Param::from_slice(&pool, &[3], &[0.1f32, 1.0 / 3.0, 2049.0]),
        )
        .unwrap();
    let file = TempFile::new("f16");
    params
        .save_safetensors(file.path(), &SaveOptions::new().dtype::<f16>())
        .unwrap();
    let loaded =
        ParamStore::<f32>::from_safetensors(&pool, file.path(), &LoadOptions::new()).unwrap();
    // f16 has 11 significant bits: 0.1 and 1/3 round, 2049 rounds to even (2048).
    assert_eq!(values(&loaded, "x"), vec![0.099975586, 0.33325195, 2048.0]);
}

#[test]
fn metadata_is_written_and_read() {
    let pool = Pool::with_max_memory_mb(16);
    let params = sample_store(&pool);
    let file = TempFile::new("metadata");
    let options = SaveOptions::new()
        .metadata("format", "pt")
        .metadata("step", "1200");
    params.save_safetensors(file.path(), &options).unwrap();
    let read = SafeTensorsFile::open(file.path()).unwrap();
    let mut metadata: Vec<(&str, &str)> = read
        .metadata()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    metadata.sort();
    assert_eq!(metadata, [("format", "pt"), ("step", "1200")]);
    let plain = TempFile::new("no-metadata");
    params
        .save_safetensors(plain.path(), &SaveOptions::new())
        .unwrap();
    assert!(SafeTensorsFile::open(plain.path())
        .unwrap()
        .metadata()
        .is_empty());
}

#[test]
fn pytorch_linear_weights_are_transposed_on_save_and_load() {
    let pool = Pool::with_max_memory_mb(16);
    let params = sample_store(&pool);
    let file = TempFile::new("pytorch");
    let is_linear = |name: &str| name.ends_with(".weight");
    params
        .save_safetensors(file.path(), &SaveOptions::new().pytorch_linear(is_linear))
        .unwrap();

    // Stored as PyTorch's [out, in]: element [o][i] of the file is w[i][o].
    let read = SafeTensorsFile::open(file.path()).unwrap();
    assert_eq!(read.shape("fc.weight").unwrap(), &[3, 2]);
    let stored: Param<f32> = read.param(&pool, "fc.weight").unwrap();
    assert_eq!(stored.to_vec(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let w = params.get("fc.weight").unwrap().view();
    let s = stored.view();
    for i in 0..2 {
        for o in 0..3 {
            assert_eq!(
                s[[o, i]],
                w[[i, o]],
                "file [{o}, {i}] against parameter [{i}, {o}]"
            );
        }
    }
    assert_eq!(
        read.shape("fc.bias").unwrap(),
        &[3],
        "not named: stored as is"
    );

    // Loaded back transposed to [in, out], into a store or a new one.
    let mut loaded = zeros_like_sample::<f32>(&pool);
    loaded
        .load_safetensors(file.path(), &LoadOptions::new().pytorch_linear(is_linear))
        .unwrap();
    let made = ParamStore::<f32>::from_safetensors(
        &pool,
        file.path(),
        &LoadOptions::new().pytorch_linear(is_linear),
    )
    .unwrap();
    for store in [&loaded, &made] {
        assert_eq!(store.get("fc.weight").unwrap().shape(), &[2, 3]);
        for (name, p) in params.iter() {
            assert_eq!(values(store, name), p.to_vec(), "{name}");
        }
    }
}

#[test]
fn load_lists_the_tensors_no_parameter_took() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("unused");
    sample_store(&pool)
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let mut params = ParamStore::<f32>::new(&pool);
    params.zeros("fc.bias", &[3]).unwrap();
    let report = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap();
    assert_eq!(report.unused, ["fc.weight", "t"]);
    assert_eq!(values(&params, "fc.bias"), vec![0.5, -0.25, 0.1]);
}

#[test]
fn from_safetensors_registers_every_tensor_in_name_order() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("from");
    let mut params = ParamStore::<f32>::new(&pool);
    for (name, v) in [("layer.2", 2.0f32), ("layer.10", 10.0), ("a", 1.0)] {
        params
            .add(name, Param::from_slice(&pool, &[1], &[v]))
            .unwrap();
    }
    params
        .save_safetensors(file.path(), &SaveOptions::new().dtype::<f64>())
        .unwrap();
    let loaded =
        ParamStore::<f64>::from_safetensors(&pool, file.path(), &LoadOptions::new()).unwrap();
    let got: Vec<(&str, Vec<f64>)> = loaded.iter().map(|(n, p)| (n, p.to_vec())).collect();
    assert_eq!(
        got,
        [
            ("a", vec![1.0]),
            ("layer.10", vec![10.0]),
            ("layer.2", vec![2.0])
        ]
    );
}

/// A weight stored as the parameter's transpose (PyTorch's `[out, in]`, loaded without the option)
/// says which option loads it.
#[test]
fn a_transposed_weight_suggests_pytorch_linear() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("transposed");
    sample_store(&pool)
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let mut params = ParamStore::<f32>::new(&pool);
    params.ones("fc.weight", &[3, 2]).unwrap();
    let err = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"fc.weight\" has shape [2, 3] in the file, but the parameter has shape [3, 2]; it \
         is the parameter's transpose: a file in PyTorch's Linear layout ([out, in]) loads with \
         `LoadOptions::pytorch_linear`"
    );
    let options = LoadOptions::new().pytorch_linear(|name| name == "fc.weight");
    params.load_safetensors(file.path(), &options).unwrap();
    assert_eq!(
        values(&params, "fc.weight"),
        vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    );
}

#[test]
fn a_failed_load_leaves_every_parameter_unchanged() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("atomic");
    sample_store(&pool)
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    // fc.weight and fc.bias would load; t has the wrong shape and comes last.
    let mut params = ParamStore::<f32>::new(&pool);
    params.ones("fc.weight", &[2, 3]).unwrap();
    params.ones("fc.bias", &[3]).unwrap();
    params.ones("t", &[2, 4]).unwrap();
    let kept = params.get("fc.weight").unwrap().clone();
    let err = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"t\" has shape [2, 2, 2] in the file, but the parameter has shape [2, 4]"
    );
    assert_eq!(values(&params, "fc.weight"), vec![1.0; 6]);
    assert_eq!(values(&params, "fc.bias"), vec![1.0; 3]);
    assert_eq!(values(&params, "t"), vec![1.0; 8]);
    assert!(params.get("fc.weight").unwrap().shares_buffer_with(&kept));

    // A load that succeeds gives the store new values; a handle cloned before keeps the old ones.
    params.take("t").unwrap();
    params.zeros("t", &[2, 2, 2]).unwrap();
    params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap();
    assert_eq!(
        values(&params, "fc.weight"),
        vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(kept.to_vec(), vec![1.0; 6]);
    drop((params, kept));
    assert_eq!(
        pool.stats().bytes_in_use,
        0,
        "every buffer went back to the pool"
    );
}

#[test]
fn a_missing_tensor_names_the_file_names_that_look_alike() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("missing");
    sample_store(&pool)
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let mut params = ParamStore::<f32>::new(&pool);
    params.zeros("fc.weights", &[2, 3]).unwrap();
    let err = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "no tensor named \"fc.weights\" in the file; did you mean \"fc.weight\"?"
    );
    assert_eq!(
        safetensors_err(err),
        SafeTensorsError::MissingTensor {
            name: "fc.weights".into(),
            close: vec!["fc.weight".into()]
        }
    );
    let read = SafeTensorsFile::open(file.path()).unwrap();
    assert_eq!(
        read.shape("decoder").unwrap_err().to_string(),
        "no tensor named \"decoder\" in the file"
    );
}

#[test]
fn a_shape_mismatch_in_pytorch_layout_shows_the_stored_shape() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("shape");
    sample_store(&pool)
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let mut params = ParamStore::<f32>::new(&pool);
    params.zeros("fc.weight", &[2, 3]).unwrap();
    let options = LoadOptions::new().pytorch_linear(|name| name == "fc.weight");
    let err = params.load_safetensors(file.path(), &options).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"fc.weight\" has shape [2, 3] in the file (PyTorch's Linear layout [out, in], so \
         transposed to [3, 2]), but the parameter has shape [2, 3]"
    );
}

#[test]
fn a_non_matrix_in_pytorch_layout_is_refused_on_load_and_save() {
    let pool = Pool::with_max_memory_mb(16);
    let params = sample_store(&pool);
    let file = TempFile::new("matrix");
    let err = params
        .save_safetensors(
            file.path(),
            &SaveOptions::new().pytorch_linear(|n| n.starts_with("fc.")),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"fc.bias\" is marked as in PyTorch's Linear layout ([out, in]) but has shape [3]; \
         only a tensor of 2 axes can be transposed"
    );
    assert!(!file.path().exists(), "a failed save writes nothing");

    params
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let mut loaded = zeros_like_sample::<f32>(&pool);
    let err = loaded
        .load_safetensors(
            file.path(),
            &LoadOptions::new().pytorch_linear(|n| n == "t"),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"t\" is marked as in PyTorch's Linear layout ([out, in]) but has shape [2, 2, 2]; \
         only a tensor of 2 axes can be transposed"
    );
}

/// A file of `ids` (I64 [2, 3]), `mask` (U8 [3]), `pos` (I32 [2]) and `q` (F8_E4M3 [2]).
fn mixed_file() -> Vec<u8> {
    let ids: [i64; 6] = [0, 5, 1 << 60, -3, 255, 256];
    let mut data = le_bytes(&ids, |x| x.to_le_bytes());
    data.extend([1u8, 0, 1]);
    data.extend(le_bytes(&[7i32, -1], |x| x.to_le_bytes()));
    data.extend([0x38u8, 0x40]);
    let header = r#"{"__metadata__":{"source":"hand"},"ids":{"dtype":"I64","shape":[2,3],"data_offsets":[0,48]},"mask":{"dtype":"U8","shape":[3],"data_offsets":[48,51]},"pos":{"dtype":"I32","shape":[2],"data_offsets":[51,59]},"q":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[59,61]}}"#;
    safetensors_bytes(header, &data)
}

#[test]
fn the_reader_converts_integer_tensors_exactly() {
    let pool = Pool::with_max_memory_mb(16);
    let file = SafeTensorsFile::from_bytes(mixed_file()).unwrap();
    assert_eq!(file.names(), ["ids", "mask", "pos", "q"]);
    assert_eq!(file.dtype("ids").unwrap(), FileDType::I64);
    assert_eq!(file.dtype("q").unwrap(), FileDType::Other("F8_E4M3".into()));
    assert_eq!(file.metadata()["source"], "hand");

    let ids: Param<i64> = file.param(&pool, "ids").unwrap();
    assert_eq!(ids.shape(), &[2, 3]);
    assert_eq!(
        ids.to_vec(),
        vec![0, 5, 1 << 60, -3, 255, 256],
        "2^60 kept exactly"
    );
    let pos: Param<i64> = file.param(&pool, "pos").unwrap();
    assert_eq!(pos.to_vec(), vec![7, -1]);
    let mask: Param<f32> = file.param(&pool, "mask").unwrap();
    assert_eq!(mask.to_vec(), vec![1.0, 0.0, 1.0]);
    let as_float: Param<f64> = file.param(&pool, "ids").unwrap();
    assert_eq!(
        as_float.to_vec(),
        vec![0.0, 5.0, 2f64.powi(60), -3.0, 255.0, 256.0]
    );

    let err = file.param::<u8>(&pool, "ids").unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"ids\": element 2 is 1152921504606846976, which u8 cannot hold"
    );
    let err = file.param::<f32>(&pool, "q").unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"q\" has dtype F8_E4M3; tensorscope reads F32, F64, F16, BF16, I64, I32 and U8 only"
    );
    assert_eq!(
        file.param::<i64>(&pool, "ids.0").unwrap_err().to_string(),
        "no tensor named \"ids.0\" in the file; did you mean \"ids\"?"
    );
}

#[test]
fn floats_convert_to_integers_only_when_integral_and_in_range() {
    let pool = Pool::with_max_memory_mb(16);
    let data = le_bytes(&[3.0f32, -2.0, 2.5], |x| x.to_le_bytes());
    let header = r#"{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}}"#;
    let file = SafeTensorsFile::from_bytes(safetensors_bytes(header, &data)).unwrap();
    let err = file.param::<i64>(&pool, "x").unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"x\": element 2 is 2.5, which i64 cannot hold"
    );
    assert_eq!(
        safetensors_err(err),
        SafeTensorsError::Unrepresentable {
            name: "x".into(),
            index: 2,
            value: "2.5".into(),
            target: "i64"
        }
    );
    let err = file.param::<u8>(&pool, "x").unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"x\": element 1 is -2, which u8 cannot hold"
    );
}

#[test]
fn a_parameter_refuses_integer_and_unknown_dtypes() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("dtype");
    std::fs::write(file.path(), mixed_file()).unwrap();
    let mut params = ParamStore::<f32>::new(&pool);
    params.zeros("ids", &[2, 3]).unwrap();
    let err = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"ids\" has dtype I64; parameters load from F32, F64, F16 or BF16 only"
    );
    let err = ParamStore::<f32>::from_safetensors(&pool, file.path(), &LoadOptions::new())
        .err()
        .unwrap();
    assert_eq!(
        safetensors_err(err),
        SafeTensorsError::UnsupportedDType {
            name: "ids".into(),
            dtype: FileDType::I64,
            floats_only: true
        }
    );
    let mut params = ParamStore::<f32>::new(&pool);
    params.zeros("q", &[2]).unwrap();
    let err = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"q\" has dtype F8_E4M3; parameters load from F32, F64, F16 or BF16 only"
    );
}

#[test]
fn a_value_beyond_the_saved_dtype_fails_the_save() {
    let pool = Pool::with_max_memory_mb(16);
    let mut params = ParamStore::<f32>::new(&pool);
    params
        .add("big", Param::from_slice(&pool, &[2], &[1.0f32, 1e5]))
        .unwrap();
    let file = TempFile::new("range");
    let err = params
        .save_safetensors(file.path(), &SaveOptions::new().dtype::<f16>())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor \"big\": element 1 is 100000, which f16 cannot hold"
    );
    // bf16 has f32's range.
    params
        .save_safetensors(file.path(), &SaveOptions::new().dtype::<bf16>())
        .unwrap();
    let loaded =
        ParamStore::<f32>::from_safetensors(&pool, file.path(), &LoadOptions::new()).unwrap();
    assert_eq!(values(&loaded, "big"), vec![1.0, 99840.0]);
}

#[test]
fn a_truncated_file_is_corrupt_and_names_the_path() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("truncated");
    sample_store(&pool)
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let bytes = std::fs::read(file.path()).unwrap();

    std::fs::write(file.path(), &bytes[..bytes.len() - 4]).unwrap();
    let mut params = zeros_like_sample::<f32>(&pool);
    let err = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a valid safetensors file: tensor \"t\": offsets [36, 68) end past the \
             data, which holds 64 bytes",
            file.shown()
        )
    );
    assert_eq!(values(&params, "fc.weight"), vec![0.0; 6]);

    std::fs::write(file.path(), &bytes[..20]).unwrap();
    let err = SafeTensorsFile::open(file.path()).unwrap_err();
    let header_length = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a valid safetensors file: the header length is {header_length} bytes, but \
             only 12 bytes follow it",
            file.shown()
        )
    );
    let err = SafeTensorsFile::from_bytes(bytes[..5].to_vec()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the bytes are not a valid safetensors file: the file is 5 bytes, too short for the 8-byte \
         header length"
    );
}

#[test]
fn io_errors_name_the_path() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("absent");
    let os_message = std::fs::read(file.path()).unwrap_err().to_string();
    let err = ParamStore::<f32>::from_safetensors(&pool, file.path(), &LoadOptions::new())
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        format!("cannot read {}: {os_message}", file.shown())
    );
    assert!(matches!(
        safetensors_err(err),
        SafeTensorsError::Io {
            action: "read",
            kind: std::io::ErrorKind::NotFound,
            ..
        }
    ));

    let dir = TempFile::new("no-such-dir");
    let path = dir.path().join("model.safetensors");
    let err = sample_store(&pool)
        .save_safetensors(&path, &SaveOptions::new())
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with(&format!("cannot write {}: ", path.display())),
        "{err}"
    );
    assert!(matches!(
        safetensors_err(err),
        SafeTensorsError::Io {
            action: "write",
            kind: std::io::ErrorKind::NotFound,
            ..
        }
    ));
}

/// A file written byte by byte: `header_length` as 8 little-endian bytes, then `header` and `data`
/// as given (no padding), so the length may disagree with the header.
fn crafted_file(header_length: u64, header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = header_length.to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    bytes
}

/// A file of `header` (its true length) and `data`.
fn file_with_header(header: &str, data: &[u8]) -> Vec<u8> {
    crafted_file(header.len() as u64, header, data)
}

/// Why [`SafeTensorsFile::from_bytes`] refuses `bytes`, checking it is `Corrupt` and that its
/// message is the format's sentence around the reason.
fn corrupt_reason(bytes: Vec<u8>) -> String {
    let err = safetensors_err(SafeTensorsFile::from_bytes(bytes).unwrap_err());
    let message = err.to_string();
    match err {
        SafeTensorsError::Corrupt { path: None, reason } => {
            assert_eq!(
                message,
                format!("the bytes are not a valid safetensors file: {reason}")
            );
            reason
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

/// A U8 tensor's entry in a header.
fn u8_entry(name: &str, len: usize, begin: usize, end: usize) -> String {
    format!(r#""{name}":{{"dtype":"U8","shape":[{len}],"data_offsets":[{begin},{end}]}}"#)
}

#[test]
fn offsets_that_end_near_usize_max_are_corrupt_not_a_panic() {
    // 8 tensors of 2^61 - 1 bytes each, tiling [0, 2^64 - 8): each one's offsets are consistent
    // with its shape and the next, and the `safetensors` crate, adding the header's length to the
    // end, overflowed (a panic in a debug build).
    let len = (1usize << 61) - 1;
    let entries: Vec<String> = (0..8)
        .map(|k| u8_entry(&format!("t{k}"), len, k * len, (k + 1) * len))
        .collect();
    let header = format!("{{{}}}", entries.join(","));
    let reason = corrupt_reason(file_with_header(&header, &[]));
    assert_eq!(
        reason,
        format!("tensor \"t0\": offsets [0, {len}) end past the data, which holds 0 bytes")
    );
}

#[test]
fn a_tensor_listed_twice_is_corrupt() {
    // The crate kept the last entry of a name silently: here an F32 scalar where the first says 4 U8.
    let header = format!(
        r#"{{{},"w":{{"dtype":"F32","shape":[],"data_offsets":[0,4]}}}}"#,
        u8_entry("w", 4, 0, 4)
    );
    let reason = corrupt_reason(file_with_header(&header, &[0; 4]));
    assert_eq!(reason, "tensor \"w\" is listed twice in the header");
}

#[test]
fn overlapping_offsets_are_corrupt() {
    let header = format!("{{{},{}}}", u8_entry("b", 4, 2, 6), u8_entry("a", 4, 0, 4));
    let reason = corrupt_reason(file_with_header(&header, &[0; 6]));
    assert_eq!(
        reason,
        "tensor \"b\": offsets [2, 6) overlap tensor \"a\"'s [0, 4)"
    );
}

#[test]
fn bytes_no_tensor_holds_are_corrupt() {
    let header = format!("{{{},{}}}", u8_entry("a", 2, 0, 2), u8_entry("b", 2, 4, 6));
    let reason = corrupt_reason(file_with_header(&header, &[0; 6]));
    assert_eq!(
        reason,
        "no tensor holds bytes [2, 4) of the data, between tensor \"a\" and tensor \"b\""
    );
    let header = format!("{{{}}}", u8_entry("b", 2, 2, 4));
    let reason = corrupt_reason(file_with_header(&header, &[0; 4]));
    assert_eq!(
        reason,
        "no tensor holds bytes [0, 2) of the data, before tensor \"b\""
    );
    let header = format!("{{{}}}", u8_entry("a", 2, 0, 2));
    let reason = corrupt_reason(file_with_header(&header, &[0; 5]));
    assert_eq!(
        reason,
        "no tensor holds bytes [2, 5) of the data, after tensor \"a\""
    );
}

#[test]
fn offsets_past_the_end_of_the_file_are_corrupt() {
    let header = format!("{{{},{}}}", u8_entry("a", 4, 0, 4), u8_entry("b", 8, 4, 12));
    let reason = corrupt_reason(file_with_header(&header, &[0; 8]));
    assert_eq!(
        reason,
        "tensor \"b\": offsets [4, 12) end past the data, which holds 8 bytes"
    );
}

#[test]
fn a_shape_whose_element_count_overflows_is_corrupt() {
    let header = format!(
        r#"{{"a":{{"dtype":"U8","shape":[{},2],"data_offsets":[0,0]}}}}"#,
        usize::MAX
    );
    let reason = corrupt_reason(file_with_header(&header, &[]));
    assert_eq!(
        reason,
        format!(
            "tensor \"a\": shape [{}, 2] has more elements than a usize can count",
            usize::MAX
        )
    );
}

#[test]
fn a_header_length_past_the_end_of_the_file_is_corrupt() {
    let header = format!("{{{}}}", u8_entry("a", 1, 0, 1));
    let bytes = crafted_file(1000, &header, &[7]);
    let follow = bytes.len() - 8;
    assert_eq!(
        corrupt_reason(bytes),
        format!("the header length is 1000 bytes, but only {follow} bytes follow it")
    );
    // Lengths that do not fit a usize on a 32-bit target, and u64::MAX.
    for length in [1 << 40, u64::MAX] {
        let reason = corrupt_reason(crafted_file(length, &header, &[7]));
        assert_eq!(
            reason,
            format!("the header length is {length} bytes, but only {follow} bytes follow it")
        );
    }
}

#[test]
fn every_other_fault_of_a_header_names_the_tensor_and_what_is_wrong() {
    let cases: [(String, usize, &str); 12] = [
        (
            format!("{{{}}}", u8_entry("a", 4, 4, 0)),
            4,
            "tensor \"a\": offsets [4, 0) end before they begin",
        ),
        (
            format!("{{{}}}", u8_entry("a", 3, 0, 4)),
            4,
            "tensor \"a\": shape [3] of U8 needs 3 bytes but its offsets [0, 4) hold 4",
        ),
        (
            r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#.to_string(),
            2,
            "tensor \"a\": shape [3] of F4 is 12 bits, not a whole number of bytes",
        ),
        (
            format!(
                r#"{{"a":{{"dtype":"U8","shape":[{}],"data_offsets":[0,0]}}}}"#,
                usize::MAX / 4
            ),
            0,
            "of U8 has more bits than a usize can count",
        ),
        (
            r#"{"a":{"dtype":"U8","data_offsets":[0,0]}}"#.to_string(),
            0,
            "tensor \"a\": missing field `shape` at line 1 column",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[],"dtype":"U8","data_offsets":[0,1]}}"#.to_string(),
            1,
            "tensor \"a\": duplicate field `dtype` at line 1 column",
        ),
        (
            r#"{"a":{"dtype":"U7","shape":[1],"data_offsets":[0,1]}}"#.to_string(),
            1,
            "tensor \"a\": unknown variant `U7`",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#.to_string(),
            1,
            "tensor \"a\": invalid value: integer `-1`, expected usize",
        ),
        (
            // Past serde_json's nesting limit (128), which the crate's reading of the header meets.
            format!(
                r#"{{"a":{{"dtype":"U8","shape":[],"data_offsets":[0,1],"x":{}{}}}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
            1,
            "tensor \"a\": recursion limit exceeded",
        ),
        (
            r#"{"__metadata__":{"k":"1","k":"2"}}"#.to_string(),
            0,
            "metadata key \"k\" is listed twice in the header",
        ),
        (
            r#"{"__metadata__":{"k":1}}"#.to_string(),
            0,
            "the header's \"__metadata__\" is not an object of strings: invalid type: integer `1`",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]}} x"#.to_string(),
            1,
            "the header is not a JSON object of tensors: trailing characters",
        ),
    ];
    for (header, data_len, want) in cases {
        let reason = corrupt_reason(file_with_header(&header, &vec![0; data_len]));
        assert!(reason.contains(want), "{header}: {reason}");
    }
    let mut bytes = crafted_file(2, "{", &[]);
    bytes.push(0xff);
    assert_eq!(
        corrupt_reason(bytes),
        "the header is not UTF-8: invalid utf-8 sequence of 1 bytes from index 1"
    );
    let reason = corrupt_reason(file_with_header("{}", &[0; 3]));
    assert_eq!(
        reason,
        "no tensor holds bytes [0, 3) of the data, and the header lists no tensor"
    );
}

#[test]
fn tensors_of_no_bytes_may_share_an_offset_as_the_format_allows() {
    // The `safetensors` crate reads these; so must the check before it.
    let header = format!(
        "{{{},{},{},{}}}",
        u8_entry("z", 0, 4, 4),
        u8_entry("b", 4, 0, 4),
        u8_entry("e", 0, 0, 0),
        u8_entry("c", 0, 4, 4)
    );
    let file = SafeTensorsFile::from_bytes(file_with_header(&header, &[1, 2, 3, 4])).unwrap();
    assert_eq!(file.names(), ["b", "c", "e", "z"]);
    assert_eq!(file.shape("e").unwrap(), &[0]);
    let pool = Pool::with_max_memory_mb(16);
    assert_eq!(
        file.param::<i32>(&pool, "b").unwrap().to_vec(),
        [1, 2, 3, 4]
    );
    assert!(file.param::<i32>(&pool, "z").unwrap().to_vec().is_empty());
}

/// A store of `tensors` parameters `p00`, `p01`, ... of `len` f32 each, parameter `k` holding
/// `k + i / len` at `i`, or zeros.
fn numbered_store(pool: &Pool, tensors: usize, len: usize, zeros: bool) -> ParamStore<f32> {
    let mut params = ParamStore::<f32>::new(pool);
    for k in 0..tensors {
        let values: Vec<f32> = (0..len)
            .map(|i| {
                if zeros {
                    0.0
                } else {
                    k as f32 + i as f32 / len as f32
                }
            })
            .collect();
        let param = Param::from_slice(pool, &[len], &values);
        params.add(&format!("p{k:02}"), param).unwrap();
    }
    params
}

#[test]
fn a_file_truncated_after_it_is_opened_fails_the_read_naming_the_tensor() {
    // The tensors span several pages: those of a mapped file wholly past its new end raised
    // SIGBUS when read (and the rest of the last page read as zeros).
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("truncated-after-open");
    numbered_store(&pool, 2, 4096, false)
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let len = std::fs::metadata(file.path()).unwrap().len();
    let opened = SafeTensorsFile::open(file.path()).unwrap();
    let (start, end) = (len - 2 * 4 * 4096, len - 4 * 4096);
    let cut = start + 100;
    std::fs::File::options()
        .write(true)
        .open(file.path())
        .unwrap()
        .set_len(cut)
        .unwrap();
    let err = opened.param::<f32>(&pool, "p00").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a valid safetensors file: tensor \"p00\": the file ends before bytes \
             [{start}, {end}) (it was {len} bytes when opened, and is {cut} bytes now)",
            file.shown()
        )
    );
    assert!(matches!(
        safetensors_err(err),
        SafeTensorsError::Corrupt { path: Some(_), .. }
    ));
    // The same file, once opened again, is corrupt from its header.
    let mut params = numbered_store(&pool, 2, 4096, true);
    let err = params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a valid safetensors file: tensor \"p00\": offsets [0, 16384) end past the \
             data, which holds 100 bytes",
            file.shown()
        )
    );
    assert_eq!(values(&params, "p00"), vec![0.0; 4096]);
}

#[test]
fn a_file_truncated_by_another_thread_during_loads_fails_or_loads_but_never_crashes() {
    // 32 tensors of 64 KiB. Each round truncates the file to a quarter of its length or more, at a
    // fifth of a load's time or more after the load starts. Every load gives every value, fails as
    // corrupt before its first write and changes nothing, or stops where a read in place failed,
    // saying how many parameters it loaded; none kills the process, as a mapped file's SIGBUS did.
    const TENSORS: usize = 32;
    const LEN: usize = 1 << 14;
    let pool = Pool::with_max_memory_mb(64);
    let file = TempFile::new("truncated-during-load");
    let saved = numbered_store(&pool, TENSORS, LEN, false);
    saved
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap();
    let len = std::fs::metadata(file.path()).unwrap().len();
    let started = std::time::Instant::now();
    let mut params = numbered_store(&pool, TENSORS, LEN, true);
    params
        .load_safetensors(file.path(), &LoadOptions::new())
        .unwrap();
    let load_time = started.elapsed();
    for round in 0..16u32 {
        saved
            .save_safetensors(file.path(), &SaveOptions::new())
            .unwrap();
        let cut = len * u64::from(round % 4) / 4;
        let delay = load_time * (round / 4 + 1) / 5;
        let path = file.path().to_path_buf();
        let mut params = numbered_store(&pool, TENSORS, LEN, true);
        let truncate = std::thread::spawn(move || {
            std::thread::sleep(delay);
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_len(cut)
                .unwrap();
        });
        let loaded = params.load_safetensors(file.path(), &LoadOptions::new());
        truncate.join().unwrap();
        // How many parameters, in the walk's order, hold the file's values: all of them, none
        // (it failed before its first write), or those before the one whose read failed while
        // the load wrote in place (which may hold part of them).
        let (whole, torn) = match loaded {
            Ok(ref report) => {
                assert!(report.unused.is_empty());
                (TENSORS, None)
            }
            Err(err) => match safetensors_err(err) {
                SafeTensorsError::Corrupt { path: Some(_), .. } => (0, None),
                SafeTensorsError::LoadInterrupted { loaded, source } => {
                    assert!(
                        matches!(*source, SafeTensorsError::Corrupt { path: Some(_), .. }),
                        "round {round}: {source:?}"
                    );
                    (loaded, Some(loaded))
                }
                other => panic!("round {round}: {other:?}"),
            },
        };
        for (k, (name, param)) in params.iter().enumerate() {
            let expected = match k < whole {
                true => saved.get(name).unwrap().to_vec(),
                false => vec![0.0; LEN],
            };
            if torn != Some(k) {
                assert_eq!(param.to_vec(), expected, "round {round}, {name}");
            }
        }
    }
}

#[test]
fn a_parameter_named_like_the_header_metadata_is_refused_at_save() {
    let pool = Pool::with_max_memory_mb(16);
    let file = TempFile::new("metadata-name");
    let mut params = ParamStore::<f32>::new(&pool);
    params.ones("w", &[2]).unwrap();
    params.ones("__metadata__", &[2]).unwrap();
    let err = params
        .save_safetensors(file.path(), &SaveOptions::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "a parameter is named \"__metadata__\", the key a safetensors header keeps for its \
         string metadata; rename it to save it"
    );
    assert_eq!(
        safetensors_err(err),
        SafeTensorsError::ReservedName {
            name: "__metadata__".to_string()
        }
    );
    assert!(!file.path().exists(), "nothing was written");
}
