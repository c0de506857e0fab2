//! Files that change while they are read: sources that truncate the file, or hand out other
//! bytes, at a chosen read, so that each timing is tested deterministically.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::source::ReadAt;
use super::{load_file, SafeTensorsError, SafeTensorsFile, SaveOptions, Weights};
use crate::nn::{LoadOptions, NnError, ParamStore};
use crate::pool::Pool;

/// A store of `a` = [1, 2, 3] and `b` = [4, 5, 6, 7] (f32), or of zeros of those shapes.
fn store(pool: &Pool, zeros: bool) -> ParamStore<f32> {
    let mut params = ParamStore::new(pool);
    let a: Vec<f32> = if zeros {
        vec![0.0; 3]
    } else {
        vec![1.0, 2.0, 3.0]
    };
    let b: Vec<f32> = if zeros {
        vec![0.0; 4]
    } else {
        vec![4.0, 5.0, 6.0, 7.0]
    };
    params
        .add("a", crate::Param::from_slice(pool, &[3], &a))
        .unwrap();
    params
        .add("b", crate::Param::from_slice(pool, &[4], &b))
        .unwrap();
    params
}

fn values(params: &ParamStore<f32>, name: &str) -> Vec<f32> {
    params.get(name).unwrap().to_vec()
}

/// The bytes of the file `store(pool, false)` saves.
fn saved_bytes(pool: &Pool, path: &Path) -> Vec<u8> {
    store(pool, false)
        .save_safetensors(path, &SaveOptions::new())
        .unwrap();
    std::fs::read(path).unwrap()
}

fn temp_path(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "tensorscope-unit-{test}-{}.safetensors",
        std::process::id()
    ))
}

/// The file at `path`, which another process truncates to `to` bytes just before this process's
/// read number `at` (0 is the first).
struct TruncatedAt {
    file: File,
    path: PathBuf,
    at: usize,
    to: u64,
    reads: AtomicUsize,
}

impl ReadAt for TruncatedAt {
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.reads.fetch_add(1, Ordering::Relaxed) == self.at {
            File::options()
                .write(true)
                .open(&self.path)?
                .set_len(self.to)?;
        }
        self.file.read_exact_at(buf, offset)
    }
}

#[test]
fn a_file_truncated_between_two_tensors_read_in_place_stops_the_load_saying_what_was_loaded() {
    let pool = Pool::with_max_memory_mb(16);
    let path = temp_path("truncated-under-load");
    let bytes = saved_bytes(&pool, &path);
    let len = bytes.len() as u64;
    // Reads 0 and 1 are the header's length and the header; `a`'s 12 bytes come first in the data
    // (the file orders tensors by name), then `b`'s 16: cut `b` in half.
    let to = len - 8;
    let source = TruncatedAt {
        file: File::open(&path).unwrap(),
        path: path.clone(),
        at: 2,
        to,
        reads: AtomicUsize::new(0),
    };
    let file = SafeTensorsFile::read(Box::new(source), Some(path.clone())).unwrap();
    let mut params = store(&pool, true);
    let err = load_file(&mut params, &file, &LoadOptions::new()).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    let (start, end) = (len - 16, len);
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a valid safetensors file: tensor \"b\": the file ends before bytes \
             [{start}, {end}) (it was {len} bytes when opened, and is {to} bytes now); the load \
             stopped there: the first 1 parameters hold the file's values, the next may hold part \
             of them, the others hold their old values",
            path.display()
        )
    );
    let NnError::SafeTensors(SafeTensorsError::LoadInterrupted { loaded: 1, source }) = err else {
        panic!("expected an interrupted load, got {err:?}");
    };
    assert!(matches!(
        *source,
        SafeTensorsError::Corrupt { path: Some(_), .. }
    ));
    // Both are read in place (one copy of the weights): `a` was, before `b` failed halfway
    // (a positioned read fills what the file still has).
    assert_eq!(values(&params, "a"), [1.0, 2.0, 3.0]);
    assert_eq!(values(&params, "b"), [4.0, 5.0, 0.0, 0.0]);
}

#[test]
fn a_file_truncated_before_the_first_write_fails_the_load_and_changes_nothing() {
    let pool = Pool::with_max_memory_mb(16);
    let path = temp_path("truncated-before-writes");
    let bytes = saved_bytes(&pool, &path);
    let len = bytes.len() as u64;
    // Read 1 is the header: cut the file right after it, so the load's check before its first
    // write sees it shorter than when it was opened.
    let source = TruncatedAt {
        file: File::open(&path).unwrap(),
        path: path.clone(),
        at: 1,
        to: len - 1,
        reads: AtomicUsize::new(0),
    };
    let file = SafeTensorsFile::read(Box::new(source), Some(path.clone())).unwrap();
    let mut params = store(&pool, true);
    let err = load_file(&mut params, &file, &LoadOptions::new()).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a valid safetensors file: the file is {} bytes, shorter than the {len} it \
             was when opened",
            path.display(),
            len - 1
        )
    );
    assert_eq!(values(&params, "a"), [0.0; 3]);
    assert_eq!(values(&params, "b"), [0.0; 4]);
}

/// A file's bytes in memory, of which every read after the first of the header's bytes sees
/// `later` instead (a header rewritten while the file is read); `header_reads` counts them.
struct Rewritten {
    first: Vec<u8>,
    later: Vec<u8>,
    header_reads: Arc<AtomicUsize>,
}

impl ReadAt for Rewritten {
    fn len(&self) -> io::Result<u64> {
        Ok(self.first.as_slice().len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let header_end = 8 + u64::from_le_bytes(self.first[..8].try_into().unwrap());
        let in_header = offset < header_end && offset + buf.len() as u64 > 8;
        let bytes = match in_header && self.header_reads.fetch_add(1, Ordering::Relaxed) > 0 {
            true => &self.later,
            false => &self.first,
        };
        bytes.read_exact_at(buf, offset)
    }
}

/// A file of `header` padded with spaces to `len` bytes, then `data`.
fn file_bytes(header: &str, len: usize, data: &[u8]) -> Vec<u8> {
    let mut bytes = (len as u64).to_le_bytes().to_vec();
    bytes.extend(format!("{header:len$}").as_bytes());
    bytes.extend(data);
    bytes
}

#[test]
fn a_header_rewritten_while_the_file_is_read_is_parsed_from_the_one_copy_checked() {
    let pool = Pool::with_max_memory_mb(16);
    // 8 tensors of 2^61 - 1 bytes each, tiling [0, 2^64 - 8): the `safetensors` crate, adding the
    // header's length to the end, overflows on these (a panic in a debug build).
    let len = (1usize << 61) - 1;
    let entries: Vec<String> = (0..8)
        .map(|k| {
            let (begin, end) = (k * len, (k + 1) * len);
            format!(r#""t{k}":{{"dtype":"U8","shape":[{len}],"data_offsets":[{begin},{end}]}}"#)
        })
        .collect();
    let crafted = format!("{{{}}}", entries.join(","));
    let header = r#"{"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let data: Vec<u8> = [4.0f32, 5.0, 6.0, 7.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let header_reads = Arc::new(AtomicUsize::new(0));
    let source = Rewritten {
        first: file_bytes(header, crafted.len(), &data),
        later: file_bytes(&crafted, crafted.len(), &data),
        header_reads: Arc::clone(&header_reads),
    };
    let file = SafeTensorsFile::read(Box::new(source), None).unwrap();
    assert_eq!(file.names(), ["b"]);
    let b: crate::Param<f32> = file.param(&pool, "b").unwrap();
    assert_eq!(b.to_vec(), [4.0, 5.0, 6.0, 7.0]);
    assert_eq!(header_reads.load(Ordering::Relaxed), 1);
}

/// A file's bytes in memory that shrink to `to` bytes just before read number `at`.
struct ShrinksAt {
    bytes: Vec<u8>,
    at: usize,
    to: usize,
    reads: AtomicUsize,
}

impl ReadAt for ShrinksAt {
    fn len(&self) -> io::Result<u64> {
        let shrunk = self.reads.load(Ordering::Relaxed) > self.at;
        Ok(if shrunk {
            self.to
        } else {
            self.bytes.as_slice().len()
        } as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let shrunk = self.reads.fetch_add(1, Ordering::Relaxed) >= self.at;
        let bytes = if shrunk {
            &self.bytes[..self.to]
        } else {
            &self.bytes[..]
        };
        // As a positioned read of a file does: what the file still has, then the error.
        let start = (offset as usize).min(bytes.len());
        let have = (bytes.len() - start).min(buf.len());
        buf[..have].copy_from_slice(&bytes[start..start + have]);
        bytes.to_vec().read_exact_at(buf, offset)
    }
}

proptest::proptest! {
    // 128 cases unless `PROPTEST_CASES` says otherwise.
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(128),
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// A file that shrinks at any read of a load, to any length. Shrunk while its header is read,
    /// the open fails naming the header if a read goes past the new length, else the load's
    /// check before its first write fails; either changes nothing. Shrunk while tensors are read
    /// in place, the load gives every value if no read goes past the new length, else stops at
    /// the tensor of the first read that does, the tensors before it loaded and the rest as they
    /// were.
    #[test]
    fn a_file_that_shrinks_at_any_read_of_a_load_fails_naming_the_read_and_what_it_loaded(
        at in 0usize..6,
        to_fraction in 0.0f64..1.0,
        as_f16: bool,
    ) {
        let pool = Pool::with_max_memory_mb(16);
        let path = temp_path(&format!("shrinks-{at}-{to_fraction}-{as_f16}"));
        let options = match as_f16 {
            true => SaveOptions::new().dtype::<half::f16>(),
            false => SaveOptions::new(),
        };
        store(&pool, false).save_safetensors(&path, &options).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let to = (bytes.len() as f64 * to_fraction) as usize;
        // The load's reads, in order, end at: the header's length, the header, `a`, `b`. The
        // first of those from read `at` on that ends past `to` fails, if any.
        let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let element = if as_f16 { 2 } else { 4 };
        let ends = [8, header_end, header_end + 3 * element, bytes.len()];
        let failing = (at..4).find(|&k| ends[k] > to);
        let source = ShrinksAt { bytes, at, to, reads: AtomicUsize::new(0) };
        let mut params = store(&pool, true);
        let loaded = SafeTensorsFile::read(Box::new(source), None)
            .map_err(NnError::from)
            .and_then(|file| load_file(&mut params, &file, &LoadOptions::new()));
        let file_values = [vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0, 7.0]];
        let old_values = [vec![0.0; 3], vec![0.0; 4]];
        let now = [values(&params, "a"), values(&params, "b")];
        let ends_with = |reason: &str, k: usize| {
            let what = ["the header", "the header", "tensor \"a\"", "tensor \"b\""][k];
            reason.starts_with(&format!("{what}: the file ends before bytes"))
        };
        match (loaded, failing) {
            (Ok(_), None) if at >= 2 => proptest::prop_assert_eq!(now, file_values),
            (Err(NnError::SafeTensors(SafeTensorsError::Corrupt { reason, .. })), Some(k))
                if k < 2 =>
            {
                proptest::prop_assert!(ends_with(&reason, k), "read {}: {}", k, reason);
                proptest::prop_assert_eq!(now, old_values);
            }
            (Err(NnError::SafeTensors(SafeTensorsError::Corrupt { reason, .. })), _) if at < 2 => {
                proptest::prop_assert!(reason.contains("shorter than the"), "{}", reason);
                proptest::prop_assert_eq!(now, old_values);
            }
            (
                Err(NnError::SafeTensors(SafeTensorsError::LoadInterrupted { loaded, source })),
                Some(k),
            ) if k >= 2 => {
                let SafeTensorsError::Corrupt { reason, .. } = *source else {
                    return Err(proptest::test_runner::TestCaseError::fail(format!("{source:?}")));
                };
                proptest::prop_assert!(ends_with(&reason, k), "read {}: {}", k, reason);
                proptest::prop_assert_eq!(loaded, k - 2);
                // Tensor `loaded` may hold part of the file's values: the others are whole.
                for (t, value) in now.iter().enumerate().filter(|&(t, _)| t != loaded) {
                    let want = if t < loaded { &file_values[t] } else { &old_values[t] };
                    proptest::prop_assert_eq!(value, want, "tensor {}", t);
                }
            }
            (loaded, failing) => proptest::prop_assert!(
                false,
                "expected a failure at read {:?}, got {:?}",
                failing,
                loaded
            ),
        }
    }
}
