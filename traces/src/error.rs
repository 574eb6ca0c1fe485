//! The one error type of this crate: everything that can go wrong writing or reading a trace.

use std::io;
use std::path::PathBuf;

/// Why a trace could not be written, read or exported.
///
/// Every variant names the file concerned (`<memory>` for traces read from a byte buffer and
/// `<stream>` for a [`TraceWriter`](crate::TraceWriter) over an arbitrary writer).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// An operating-system level failure.
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`open`, `map`, `write`, ...).
        action: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Renaming a finished temporary file over its destination failed.
    #[error("cannot rename {} to {}: {source}", from.display(), to.display())]
    Rename {
        /// The temporary file (already removed again when this error is returned).
        from: PathBuf,
        /// The destination, left as it was.
        to: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its header says (or than a header).
    #[error("{}: truncated trace: expected {expected} bytes, found {found}", path.display())]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes the file should have.
        expected: u64,
        /// Bytes it has.
        found: u64,
    },
    /// The file does not start with `GEARTRC\0`.
    #[error(
        "{}: not a .gtrace file: expected magic \"GEARTRC\\0\", found \"{}\"",
        path.display(),
        found.escape_ascii()
    )]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// Its first eight bytes.
        found: [u8; 8],
    },
    /// The file's format version (or the sizes that version implies) is not one this reader
    /// understands.
    #[error(
        "{}: unsupported .gtrace version {major}.{minor} (this reader supports {}.0 to {}.x): \
         {detail}",
        path.display(),
        crate::format::VERSION_MAJOR,
        crate::format::VERSION_MAJOR
    )]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
        /// What exactly is not supported.
        detail: String,
    },
    /// The writer never finished the file (the "complete" flag is clear), typically because
    /// the producing process crashed or dropped the writer without calling `finish()`.
    #[error(
        "{}: unfinished trace: expected the \"complete\" header flag, found it clear \
         (the writer crashed or was dropped before finish())",
        path.display()
    )]
    NotFinished {
        /// The file.
        path: PathBuf,
    },
    /// The header checksum (offset 68) does not match the header's own bytes: the header is
    /// damaged, so none of its fields (other than the magic and the major version, checked
    /// before it) can be trusted.
    #[error(
        "{}: header checksum mismatch: header says {expected:#010x}, header bytes hash to \
         {found:#010x} (the 96-byte header is damaged)",
        path.display()
    )]
    HeaderChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The header checksum stored in the header.
        expected: u32,
        /// The header checksum of the header bytes actually present.
        found: u32,
    },
    /// The body checksum stored in the header (offset 88) does not match the file's contents
    /// after the header.
    #[error(
        "{}: checksum mismatch: header says {expected:#018x}, contents hash to {found:#018x}",
        path.display()
    )]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The body checksum stored in the header.
        expected: u64,
        /// The checksum of the bytes actually present after the header.
        found: u64,
    },
    /// The file is structurally invalid; `what` says where and how.
    #[error("{}: corrupt trace: {what}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, including the record index or byte offset where relevant.
        what: String,
    },
    /// A writer ran into a limit of the format (too many lanes or strings, a huge string).
    #[error("{}: cannot write trace: {what}", path.display())]
    Limit {
        /// The file.
        path: PathBuf,
        /// Which limit.
        what: String,
    },
}

impl From<crate::atomic::WriteError> for TraceError {
    /// A failed rename stays a [`TraceError::Rename`]; every other step is an
    /// [`TraceError::Io`] on the temporary file.
    fn from(e: crate::atomic::WriteError) -> TraceError {
        use crate::atomic::WriteStep;
        match e.step {
            WriteStep::Rename => TraceError::Rename {
                from: e.temp,
                to: e.dest,
                source: e.source,
            },
            step => TraceError::Io {
                path: e.temp,
                action: step.verb(),
                source: e.source,
            },
        }
    }
}
