//! The workspace's one way to write a file whole or not at all: a temporary file in the
//! destination's directory, synced to stable storage, then renamed over the destination.
//!
//! ```text
//!   TempFile::create(dest) ──▶ <dest>.tmp-<pid>-<n> (created new, never truncating another's)
//!        write ──▶ sync (fsync) ──▶ persist: rename over dest
//!        any error, or a drop before persist ──▶ the temporary file is removed, dest untouched
//! ```
//!
//! Every file gearsim writes goes through here: traces (`TraceFileWriter`, the Perfetto
//! export), `.om` models, `.npy` tensors, kernel binaries, dumps, study CSVs and figures.
//! [`write_atomic`] writes bytes in one call; [`stage`] writes them without the rename, so a
//! command that writes several files renames them only once all are complete.
//!
//! ```
//! let dir = std::env::temp_dir().join(format!("gearsim-atomic-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let dest = dir.join("out.txt");
//! gearsim_traces::atomic::write_atomic(&dest, b"whole").unwrap();
//! assert_eq!(std::fs::read(&dest).unwrap(), b"whole");
//! // A destination that cannot be replaced: an error, and no temporary file left behind.
//! let blocked = dir.join("blocked");
//! std::fs::create_dir_all(&blocked).unwrap();
//! assert!(gearsim_traces::atomic::write_atomic(&blocked, b"x").is_err());
//! assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A counter that keeps two temporary files of one process apart.
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

/// How many names are tried when a temporary name is already taken (a stale file left by an
/// earlier process with the same id).
const NAME_ATTEMPTS: u32 = 64;

/// The step of an atomic write that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStep {
    /// Creating the temporary file.
    Create,
    /// Writing its contents.
    Write,
    /// Syncing it to stable storage.
    Sync,
    /// Renaming it over the destination.
    Rename,
}

impl WriteStep {
    /// The verb, as in "cannot create".
    pub fn verb(self) -> &'static str {
        match self {
            WriteStep::Create => "create",
            WriteStep::Write => "write",
            WriteStep::Sync => "sync",
            WriteStep::Rename => "rename",
        }
    }
}

/// Why a file could not be written. The destination is always left as it was, and the
/// temporary file is gone by the time this error is seen.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot write {}: cannot {} {}: {source}",
    dest.display(),
    step.verb(),
    temp.display()
)]
pub struct WriteError {
    /// The file that was to be written.
    pub dest: PathBuf,
    /// The temporary file (the destination itself when no temporary name could be formed).
    pub temp: PathBuf,
    /// What failed.
    pub step: WriteStep,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

impl WriteError {
    /// The operating system's error, for callers whose own error type names the file.
    pub fn into_io(self) -> io::Error {
        self.source
    }
}

/// A temporary file next to a destination; removed when dropped unless persisted.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    dest: PathBuf,
    armed: bool,
}

impl TempFile {
    /// Creates a new `<dest>.tmp-<pid>-<n>` for reading and writing and returns it with its open
    /// handle. The name is created new (`O_EXCL`), so a file someone else owns is never
    /// truncated; a taken name moves on to the next `n`.
    pub fn create(dest: &Path) -> Result<(TempFile, File), WriteError> {
        if dest.file_name().is_none() {
            return Err(WriteError {
                dest: dest.to_path_buf(),
                temp: dest.to_path_buf(),
                step: WriteStep::Create,
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "expected a path ending in a file name",
                ),
            });
        }
        let mut attempt = 0;
        loop {
            let mut name = OsString::from(dest.as_os_str());
            name.push(format!(
                ".tmp-{}-{}",
                std::process::id(),
                NEXT_TEMP.fetch_add(1, Ordering::Relaxed)
            ));
            let path = PathBuf::from(name);
            match OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    let temp = TempFile {
                        path,
                        dest: dest.to_path_buf(),
                        armed: true,
                    };
                    return Ok((temp, file));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < NAME_ATTEMPTS => {
                    attempt += 1;
                }
                Err(source) => {
                    return Err(WriteError {
                        dest: dest.to_path_buf(),
                        temp: path,
                        step: WriteStep::Create,
                        source,
                    });
                }
            }
        }
    }

    /// The temporary file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The destination it will replace.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// An error of `step` on this temporary file.
    pub fn error(&self, step: WriteStep, source: io::Error) -> WriteError {
        WriteError {
            dest: self.dest.clone(),
            temp: self.path.clone(),
            step,
            source,
        }
    }

    /// Flushes the finished contents written through `file` (this temporary file's handle) to
    /// stable storage and closes it.
    pub fn sync(&self, file: File) -> Result<(), WriteError> {
        file.sync_all()
            .map_err(|source| self.error(WriteStep::Sync, source))
    }

    /// Renames the temporary file over the destination. On failure the temporary file is
    /// removed (when `self` drops) and the destination is untouched.
    pub fn persist(mut self) -> Result<(), WriteError> {
        fs::rename(&self.path, &self.dest)
            .map_err(|source| self.error(WriteStep::Rename, source))?;
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

/// Writes `bytes` to a new temporary file next to `dest` and syncs it, without renaming it:
/// [`TempFile::persist`] puts it in place (dropping it instead removes it).
pub fn stage(dest: &Path, bytes: &[u8]) -> Result<TempFile, WriteError> {
    let (temp, mut file) = TempFile::create(dest)?;
    file.write_all(bytes)
        .map_err(|source| temp.error(WriteStep::Write, source))?;
    temp.sync(file)?;
    Ok(temp)
}

/// Writes `bytes` to `dest` whole or not at all.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    stage(dest, bytes)?.persist()
}
