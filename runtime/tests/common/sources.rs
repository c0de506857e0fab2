//! The Rust sources under a folder, for the tests that read the code itself (the layers' imports,
//! the `unsafe` list).

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively, appended to `out`.
pub(crate) fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a readable source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
