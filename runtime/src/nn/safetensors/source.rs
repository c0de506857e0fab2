//! Where a safetensors file's bytes are read from: the file itself, or bytes handed in.
//!
//! A file is read, not mapped: a mapped file that another process truncates kills the reader with
//! SIGBUS when it touches a page past the new end, and no safe API may crash because a file
//! changed. A positioned read of a file that shrank is a short read instead, which the loader turns
//! into an error naming the tensor. Each tensor is read straight into its buffer, so a load holds
//! one copy of the weights (the page cache's pages are the kernel's, not this process's); figures
//! in docs/benchmarks.md, "Loading by reading".

use std::fs::File;
use std::io;

/// Bytes read at an offset. Reads take `&self` (a [`SafeTensorsFile`](super::SafeTensorsFile) is
/// shared across threads), so a file is read with positioned reads, which move no shared cursor.
pub(super) trait ReadAt: Send + Sync {
    /// The length now, in bytes.
    fn len(&self) -> io::Result<u64>;

    /// Fills `buf` with the bytes from `offset` on, or fails with [`io::ErrorKind::UnexpectedEof`]
    /// if they end first.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    #[cfg(unix)]
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }

    #[cfg(not(unix))]
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        use std::sync::Mutex;
        // No positioned read in std here: the file's one cursor is moved under a lock, so that two
        // threads reading one file do not move it under each other.
        static CURSOR: Mutex<()> = Mutex::new(());
        let _moving = CURSOR
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut file = self;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }
}

impl ReadAt for Vec<u8> {
    fn len(&self) -> io::Result<u64> {
        Ok(self.as_slice().len() as u64)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| self.get(start..)?.get(..buf.len()))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}
