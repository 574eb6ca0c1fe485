//! Temporary files that replace their destination only when complete (write, sync, rename).

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::TraceError;

/// A counter that keeps two temporary files of one process apart.
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// A temporary file next to a destination; removed when dropped unless persisted.
#[derive(Debug)]
pub(crate) struct TempFile {
    path: PathBuf,
    armed: bool,
}

impl TempFile {
    /// Creates `<dest>.tmp-<pid>-<n>` for writing and returns it with its open handle.
    pub(crate) fn create(dest: &Path) -> Result<(TempFile, File), TraceError> {
        if dest.file_name().is_none() {
            return Err(TraceError::Io {
                path: dest.to_path_buf(),
                action: "create a file at",
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "expected a path ending in a file name",
                ),
            });
        }
        let mut name = OsString::from(dest.as_os_str());
        name.push(format!(
            ".tmp-{}-{}",
            std::process::id(),
            NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
        ));
        let path = PathBuf::from(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|source| TraceError::Io {
                path: path.clone(),
                action: "create",
                source,
            })?;
        Ok((TempFile { path, armed: true }, file))
    }

    /// The temporary file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Renames the temporary file over `dest`. On failure the temporary file is removed (when
    /// `self` drops) and `dest` is untouched.
    pub(crate) fn persist(mut self, dest: &Path) -> Result<(), TraceError> {
        fs::rename(&self.path, dest).map_err(|source| TraceError::Rename {
            from: self.path.clone(),
            to: dest.to_path_buf(),
            source,
        })?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: there is nobody to report a failure to while dropping, and the
            // destination is intact either way.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Flushes a finished temporary file to stable storage before it is renamed into place.
pub(crate) fn sync(file: &File, path: &Path) -> Result<(), TraceError> {
    file.sync_all().map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        action: "sync",
        source,
    })
}
