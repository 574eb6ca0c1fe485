//! Output files are written whole or not at all: to a temporary file next to the destination,
//! then renamed over it, so an error never leaves a half-written or clobbered file behind.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

fn temp_path(dest: &Path) -> PathBuf {
    let mut name = dest
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp-{}", std::process::id()));
    dest.with_file_name(name)
}

/// Writes `bytes` to `dest` atomically.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(dest);
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dest)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", dest.display()))
}
