//! Model files read through a memory map and validated before anything uses them. (Output
//! files are written whole or not at all by `gearsim_traces::atomic`, the workspace's one
//! atomic writer.)

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use gearsim_isa::om::OmFile;

/// A `.om` file mapped into memory and validated (header, section table, checksums over the
/// whole body, the model description) before anything uses it.
#[derive(Debug)]
pub struct OmMap {
    map: memmap2::Mmap,
}

impl OmMap {
    /// Maps and validates the file at `path`.
    pub fn open(path: &Path) -> Result<OmMap> {
        let om = OmMap::map(path)?;
        OmFile::parse(&om.map)
            .and_then(|f| f.desc())
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        Ok(om)
    }

    /// Maps the file at `path` without reading it: the caller validates it before using any
    /// byte, by parsing it with `OmFile::parse` (as `runner::OmModel::parse` does) — which
    /// saves the second pass over the body that [`OmMap::open`] followed by a parse costs.
    pub fn map(path: &Path) -> Result<OmMap> {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        #[allow(unsafe_code)]
        // SAFETY: `Mmap::map` is unsafe because the mapped bytes may change if the file is
        // modified while mapped. The file is opened read-only, never written through the
        // mapping, and every byte is validated (checksums over the whole body) before any is
        // used (by `open`, or by the caller's parse after `map`); later reads are
        // bounds-checked slices. gearsim writes `.om` files to a
        // temporary name and renames them into place, so it never rewrites a mapped file.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        Ok(OmMap { map })
    }

    /// The validated file.
    pub fn file(&self) -> Result<OmFile<'_>> {
        OmFile::parse(&self.map).map_err(|e| anyhow!("{e}"))
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
