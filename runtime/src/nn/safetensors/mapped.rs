//! A safetensors file's bytes: mapped from the file, or owned (bytes handed in).
//!
//! Mapping rather than reading keeps a large file out of the heap: loading a model touches each
//! tensor's pages once, as it converts them into pool buffers, and [`Bytes::release`] hands those
//! pages back to the page cache right after. Peak memory is then the model's buffers plus one
//! tensor, instead of the model plus the whole file (docs/benchmarks.md, "Loading by mapping").
#![allow(unsafe_code)]

use std::fs::File;
use std::ops::Deref;

use memmap2::{Advice, Mmap, UncheckedAdvice};

/// The bytes of a file.
pub(super) enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    /// The file's bytes, mapped read-only (an empty file is read, since it cannot be mapped).
    pub(super) fn map(file: &File) -> std::io::Result<Bytes> {
        if file.metadata()?.len() == 0 {
            return Ok(Bytes::Owned(Vec::new()));
        }
        // SAFETY: the mapping is read-only and shared, and the slices it gives live no longer than
        // `self`. Its contents are undefined only if another process truncates or writes the file
        // while it is mapped, which every mapped-file loader (candle's, safetensors' own) accepts
        // for a weights file; a reader that cannot rule that out uses `SafeTensorsFile::from_bytes`.
        let map = unsafe { Mmap::map(file)? };
        // Read once, front to back: the kernel may read ahead and drop pages behind.
        let _ = map.advise(Advice::Sequential);
        Ok(Bytes::Mapped(map))
    }

    /// Tells the kernel that the pages of `range` will not be read again soon, so they leave this
    /// process's resident set (they stay in the page cache, and a later read faults them back in
    /// with the same contents). A hint: nothing happens to owned bytes or if the kernel refuses.
    pub(super) fn release(&self, range: std::ops::Range<usize>) {
        if let Bytes::Mapped(map) = self {
            let page = 4096;
            // Whole pages inside the range only: a page shared with the next tensor stays.
            let start = range.start.div_ceil(page) * page;
            let end = range.end / page * page;
            if end > start {
                // SAFETY: MADV_DONTNEED on a read-only shared file mapping drops the pages from
                // this process's page tables only; any later read (through a slice of `self`,
                // which may still be alive) faults the same file contents back in, so no value
                // read through the mapping changes. The range lies within the mapping.
                let _ = unsafe {
                    map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)
                };
            }
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Owned(bytes) => bytes,
        }
    }
}
