//! Safetensors files truncated at random points, before they are opened and after: every read
//! gives the saved values or fails with `SafeTensorsError::Corrupt` (naming the tensor whose bytes
//! are gone, for a file truncated after it was opened), and a failed load changes no parameter.
//! None crashes, as a mapped file read past its new end did (SIGBUS).
//!
//! The tensors are saved as F32 or F16 and read as f32, so that both the reads straight into a
//! parameter's buffer and the reads converted through a scratch buffer are truncated.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use tensorscope::nn::{
    LoadOptions, NnError, ParamStore, SafeTensorsError, SafeTensorsFile, SaveOptions, Weights,
};
use tensorscope::{f16, Param, Pool};

/// A path in the temp directory unique to this process and case, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new() -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "tensorscope-truncated-{}-{n}.safetensors",
            std::process::id()
        );
        TempFile(std::env::temp_dir().join(name))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn truncate(file: &TempFile, len: u64) {
    std::fs::File::options()
        .write(true)
        .open(&file.0)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// The corruption reason of `err`, which must be a `Corrupt` naming the file.
fn corrupt_reason(err: NnError) -> String {
    match err {
        NnError::SafeTensors(SafeTensorsError::Corrupt {
            path: Some(_),
            reason,
        }) => reason,
        other => panic!("expected Corrupt naming the file, got {other:?}"),
    }
}

proptest! {
    // 64 cases unless `PROPTEST_CASES` says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_truncated_file_reads_whole_tensors_or_fails_naming_the_tensor(
        lens in prop::collection::vec(0usize..3000, 1..6),
        as_f16 in any::<bool>(),
        cut_fraction in 0.0f64..=1.0,
    ) {
        let pool = Pool::with_max_memory_mb(64);
        let file = TempFile::new();
        let mut saved = ParamStore::<f32>::new(&pool);
        for (k, &len) in lens.iter().enumerate() {
            // Values f16 holds exactly, so that both dtypes read back the same.
            let values: Vec<f32> = (0..len).map(|i| (k * 64 + i % 64) as f32 / 4.0).collect();
            saved.add(&format!("t{k}"), Param::from_slice(&pool, &[len], &values)).unwrap();
        }
        let options = match as_f16 {
            true => SaveOptions::new().dtype::<f16>(),
            false => SaveOptions::new(),
        };
        saved.save_safetensors(&file.0, &options).unwrap();
        let bytes = std::fs::read(&file.0).unwrap();
        let len = bytes.len() as u64;
        let cut = (len as f64 * cut_fraction) as u64;
        // The data follows the header in name order (one dtype): tensor k's bytes end at `ends[k]`.
        let data_start = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let element = if as_f16 { 2 } else { 4 };
        let ends: Vec<u64> = lens
            .iter()
            .scan(data_start, |end, &n| {
                *end += (n * element) as u64;
                Some(*end)
            })
            .collect();

        // Truncated after it was opened: each tensor reads whole or fails naming itself.
        let opened = SafeTensorsFile::open(&file.0).unwrap();
        truncate(&file, cut);
        for (k, &end) in ends.iter().enumerate() {
            let name = format!("t{k}");
            // A tensor of no bytes reads from none.
            let whole = lens[k] == 0 || end <= cut;
            match opened.param::<f32>(&pool, &name) {
                Ok(param) => {
                    prop_assert!(whole, "{name} ends at {end}, past the cut {cut}");
                    prop_assert_eq!(param.to_vec(), saved.get(&name).unwrap().to_vec());
                }
                Err(err) => {
                    prop_assert!(!whole, "{name} ends at {end}, within the cut {cut}: {err}");
                    let reason = corrupt_reason(err);
                    prop_assert!(
                        reason.starts_with(&format!("tensor \"{name}\": the file ends before bytes")),
                        "{}", reason
                    );
                }
            }
        }

        // Truncated before it is opened: a load gives every value or fails and changes nothing.
        let mut params = ParamStore::<f32>::new(&pool);
        for (k, &n) in lens.iter().enumerate() {
            params.zeros(&format!("t{k}"), &[n]).unwrap();
        }
        match params.load_safetensors(&file.0, &LoadOptions::new()) {
            Ok(_) => {
                prop_assert_eq!(cut, len);
                for (name, param) in params.iter() {
                    prop_assert_eq!(param.to_vec(), saved.get(name).unwrap().to_vec());
                }
            }
            Err(err) => {
                prop_assert!(cut < len);
                corrupt_reason(err);
                for (name, param) in params.iter() {
                    prop_assert!(param.to_vec().iter().all(|&v| v == 0.0), "{} changed", name);
                }
            }
        }
    }
}
