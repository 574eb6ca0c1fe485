//! The `.gtrace` reader: maps a file (or takes a byte buffer), validates all of it, then
//! decodes records lazily.

use std::collections::BTreeSet;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use zerocopy::FromBytes;

use crate::format::{
    FLAG_COMPLETE, HEADER_SIZE, Header, LANE_ENTRY_SIZE, MAGIC, MAX_LANES, META_ENTRY_SIZE,
    RECORD_SIZE, RawHeader, RawLane, RawMeta, RawRecord, VERSION_MAJOR, VERSION_MINOR, checksum,
};
use crate::{Lane, LaneKind, Record, StrId, TraceError};

/// The bytes of a trace: a read-only file mapping or an owned buffer.
enum Backing {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A validated `.gtrace` trace.
///
/// [`TraceFile::open`] and [`TraceFile::from_bytes`] check every byte of the file (the header
/// and its checksum, the body checksum, the tables and every record) before returning, so the
/// accessors never fail; records are decoded from the underlying bytes on demand by
/// [`TraceFile::records`].
pub struct TraceFile {
    path: PathBuf,
    data: Backing,
    header: Header,
    records: Range<usize>,
    lanes: Vec<Lane>,
    /// Byte range of each string, by id.
    strings: Vec<Range<usize>>,
    meta: Vec<(StrId, StrId)>,
}

impl std::fmt::Debug for TraceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceFile")
            .field("path", &self.path)
            .field("header", &self.header)
            .field("lanes", &self.lanes)
            .finish_non_exhaustive()
    }
}

impl TraceFile {
    /// Maps the file at `path` and validates it completely.
    pub fn open(path: impl AsRef<Path>) -> Result<TraceFile, TraceError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| TraceError::Io {
            path: path.clone(),
            action: "open",
            source,
        })?;
        #[allow(unsafe_code)]
        // SAFETY: `Mmap::map` is unsafe because the mapped bytes may change (or vanish) if the
        // file is modified while mapped. We open the file read-only and never write through
        // the mapping, and we validate every byte we later interpret before `open` returns;
        // all later accesses are bounds-checked slices of the mapping and every decode
        // re-checks what it reads, so changed contents cannot make this crate misbehave
        // beyond skipping records. Another process truncating or rewriting the file while it
        // is mapped is outside our control (and may raise SIGBUS on access); trace files are
        // written to a temporary name and renamed into place, so a finished trace is never
        // rewritten in place by gearsim itself.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| TraceError::Io {
            path: path.clone(),
            action: "map",
            source,
        })?;
        TraceFile::validate(path, Backing::Mapped(map))
    }

    /// Validates an in-memory trace (named `<memory>` in errors).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<TraceFile, TraceError> {
        TraceFile::validate(PathBuf::from("<memory>"), Backing::Owned(bytes))
    }

    /// The file this trace was read from (`<memory>` for [`TraceFile::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The lanes; a record's [`LaneId`](crate::LaneId) indexes this slice.
    pub fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    /// Number of strings (including the empty string 0).
    pub fn string_count(&self) -> u32 {
        u32::try_from(self.strings.len()).unwrap_or(u32::MAX)
    }

    /// The string with this id; the empty string for an id the trace does not have (every id
    /// inside a validated trace is in range).
    pub fn string(&self, id: StrId) -> &str {
        self.try_string(id).unwrap_or("")
    }

    /// The string with this id, if the trace has it.
    pub fn try_string(&self, id: StrId) -> Option<&str> {
        let range = self.strings.get(usize::try_from(id.0).ok()?)?;
        std::str::from_utf8(self.data.bytes().get(range.clone())?).ok()
    }

    /// The metadata entries as `(key, value)`, in the order the keys were first set.
    pub fn meta(&self) -> Vec<(&str, &str)> {
        self.meta
            .iter()
            .map(|&(k, v)| (self.string(k), self.string(v)))
            .collect()
    }

    /// The value of one metadata key.
    pub fn meta_value(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|&&(k, _)| self.string(k) == key)
            .map(|&(_, v)| self.string(v))
    }

    /// Number of records.
    pub fn record_count(&self) -> u64 {
        self.header.record_count
    }

    fn raw_records(&self) -> &[RawRecord] {
        let bytes = self.data.bytes().get(self.records.clone()).unwrap_or(&[]);
        <[RawRecord]>::ref_from_bytes(bytes).unwrap_or(&[])
    }

    /// The records in file order, decoded lazily.
    pub fn records(&self) -> Records<'_> {
        Records {
            raw: self.raw_records().iter(),
            lane_count: self.lanes.len(),
            string_count: self.string_count(),
        }
    }

    /// The record with this index.
    pub fn record(&self, index: u64) -> Option<Record> {
        let raw = self.raw_records().get(usize::try_from(index).ok()?)?;
        raw.decode(self.lanes.len(), self.string_count()).ok()
    }

    /// Checks everything; see `FORMAT.md`, "Validation".
    fn validate(path: PathBuf, data: Backing) -> Result<TraceFile, TraceError> {
        let bytes = data.bytes();
        let len = bytes.len() as u64;
        let corrupt = |what: String| TraceError::Corrupt {
            path: path.clone(),
            what,
        };

        // The fixed part of the header.
        if let Some(magic) = bytes.get(..8)
            && magic != MAGIC
        {
            let mut found = [0u8; 8];
            found.copy_from_slice(magic);
            return Err(TraceError::BadMagic { path, found });
        }
        let Ok((raw, _)) = RawHeader::read_from_prefix(bytes) else {
            return Err(TraceError::Truncated {
                path,
                expected: u64::from(HEADER_SIZE),
                found: len,
            });
        };
        let h = raw.decode();
        if h.version_major != VERSION_MAJOR {
            return Err(TraceError::UnsupportedVersion {
                path,
                major: h.version_major,
                minor: h.version_minor,
                detail: format!(
                    "expected major version {VERSION_MAJOR}, found {}",
                    h.version_major
                ),
            });
        }
        // Only the magic and the major version are trusted before the header checksum: they
        // decide whether this is a header of the kind this reader can check at all.
        let computed = raw.computed_header_checksum();
        if computed != h.header_checksum {
            return Err(TraceError::HeaderChecksumMismatch {
                path,
                expected: h.header_checksum,
                found: computed,
            });
        }
        let newer = h.version_minor > VERSION_MINOR;
        for (field, expected, found) in [
            ("header_size", HEADER_SIZE, h.header_size),
            ("record_size", RECORD_SIZE, h.record_size),
        ] {
            if found != expected {
                let what = format!("{field}: expected {expected}, found {found}");
                return Err(if newer {
                    TraceError::UnsupportedVersion {
                        path,
                        major: h.version_major,
                        minor: h.version_minor,
                        detail: what,
                    }
                } else {
                    corrupt(what)
                });
            }
        }
        if h.flags & FLAG_COMPLETE == 0 {
            return Err(TraceError::NotFinished { path });
        }
        let unknown_flags = h.flags & !FLAG_COMPLETE;
        if unknown_flags != 0 && !newer {
            return Err(corrupt(format!(
                "header flags: expected only bit 0 (complete) in a version \
                 {VERSION_MAJOR}.{VERSION_MINOR} file, found {:#010x}",
                h.flags
            )));
        }
        if h.file_size != len {
            return Err(if len < h.file_size {
                TraceError::Truncated {
                    path,
                    expected: h.file_size,
                    found: len,
                }
            } else {
                corrupt(format!(
                    "header file_size: expected the file's length {len}, found {} \
                     ({} unexpected trailing bytes)",
                    h.file_size,
                    len - h.file_size
                ))
            });
        }
        // Section layout: records, lanes, meta, strings, back to back up to the end.
        let records_end = h
            .record_count
            .checked_mul(u64::from(RECORD_SIZE))
            .and_then(|b| b.checked_add(u64::from(HEADER_SIZE)))
            .filter(|&end| end <= len)
            .ok_or_else(|| {
                corrupt(format!(
                    "record_count {} needs more bytes than the file's {len}",
                    h.record_count
                ))
            })?;
        let expect_offset = |field: &str, expected: u64, found: u64| {
            if expected == found {
                Ok(())
            } else {
                Err(corrupt(format!(
                    "{field}: expected {expected}, found {found}"
                )))
            }
        };
        expect_offset(
            "lanes_offset (end of the records)",
            records_end,
            h.lanes_offset,
        )?;
        // The counts are u32 and the offsets at most `len`, so none of these sums overflow.
        let lanes_end = h.lanes_offset + u64::from(h.lane_count) * u64::from(LANE_ENTRY_SIZE);
        if lanes_end > len {
            return Err(corrupt(format!(
                "lane table of {} entries at offset {} runs past the end of the file ({len} bytes)",
                h.lane_count, h.lanes_offset
            )));
        }
        expect_offset(
            "meta_offset (end of the lane table)",
            lanes_end,
            h.meta_offset,
        )?;
        let meta_end = h.meta_offset + u64::from(h.meta_count) * u64::from(META_ENTRY_SIZE);
        if meta_end > len {
            return Err(corrupt(format!(
                "metadata table of {} entries at offset {} runs past the end of the file \
                 ({len} bytes)",
                h.meta_count, h.meta_offset
            )));
        }
        expect_offset(
            "strings_offset (end of the metadata table)",
            meta_end,
            h.strings_offset,
        )?;
        expect_offset(
            "strings_offset + strings_bytes (the file size)",
            len,
            h.strings_offset.saturating_add(h.strings_bytes),
        )?;

        // The body checksum covers everything after the header.
        let body = bytes.get(HEADER_SIZE as usize..).unwrap_or(&[]);
        let found = checksum(body);
        if found != h.checksum {
            return Err(TraceError::ChecksumMismatch {
                path,
                expected: h.checksum,
                found,
            });
        }

        // From here on all offsets are known to lie within `bytes`, which is addressable.
        let at = |offset: u64| usize::try_from(offset).unwrap_or(usize::MAX);
        let section = |start: u64, end: u64| bytes.get(at(start)..at(end)).unwrap_or(&[]);

        // Strings.
        let strings = parse_strings(
            section(h.strings_offset, len),
            h.strings_offset,
            h.string_count,
        )
        .map_err(corrupt)?;
        let string_count = h.string_count;
        let text = |id: u32| {
            strings
                .get(id as usize)
                .and_then(|r| bytes.get(r.clone()))
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or("")
        };

        // Lanes.
        if h.lane_count as usize > MAX_LANES {
            return Err(corrupt(format!(
                "lane_count: expected at most {MAX_LANES}, found {}",
                h.lane_count
            )));
        }
        let raw_lanes = <[RawLane]>::ref_from_bytes(section(h.lanes_offset, lanes_end))
            .map_err(|_| corrupt("lane table is not a whole number of entries".into()))?;
        let mut lanes = Vec::with_capacity(raw_lanes.len());
        for (i, l) in raw_lanes.iter().enumerate() {
            let offset = h.lanes_offset + i as u64 * u64::from(LANE_ENTRY_SIZE);
            let fail = |what: String| corrupt(format!("lane {i} (at offset {offset}): {what}"));
            let kind = LaneKind::from_u16(l.kind.get())
                .filter(|k| k.since_minor() <= h.version_minor)
                .ok_or_else(|| {
                    let known = if h.version_minor == 0 { 9 } else { 10 };
                    fail(format!(
                        "unknown lane kind {} (expected 1 to {known} in a version {}.{} file)",
                        l.kind.get(),
                        h.version_major,
                        h.version_minor
                    ))
                })?;
            if l.reserved.get() != 0 {
                return Err(fail(format!(
                    "reserved field: expected 0, found {}",
                    l.reserved.get()
                )));
            }
            for (field, id) in [("process", l.process.get()), ("thread", l.thread.get())] {
                if id >= string_count {
                    return Err(fail(format!(
                        "{field} string id: expected < {string_count}, found {id}"
                    )));
                }
            }
            lanes.push(Lane {
                process: text(l.process.get()).to_owned(),
                thread: text(l.thread.get()).to_owned(),
                kind,
            });
        }

        // Metadata.
        let raw_meta = <[RawMeta]>::ref_from_bytes(section(h.meta_offset, meta_end))
            .map_err(|_| corrupt("metadata table is not a whole number of entries".into()))?;
        let mut meta = Vec::with_capacity(raw_meta.len());
        let mut keys = BTreeSet::new();
        for (i, m) in raw_meta.iter().enumerate() {
            let offset = h.meta_offset + i as u64 * u64::from(META_ENTRY_SIZE);
            let fail =
                |what: String| corrupt(format!("metadata entry {i} (at offset {offset}): {what}"));
            let (key, value) = (m.key.get(), m.value.get());
            for (field, id) in [("key", key), ("value", value)] {
                if id >= string_count {
                    return Err(fail(format!(
                        "{field} string id: expected < {string_count}, found {id}"
                    )));
                }
            }
            if !keys.insert(text(key)) {
                return Err(fail(format!("key {:?} appears twice", text(key))));
            }
            meta.push((StrId(key), StrId(value)));
        }

        // Records.
        let raw_records =
            <[RawRecord]>::ref_from_bytes(section(u64::from(HEADER_SIZE), records_end))
                .map_err(|_| corrupt("record area is not a whole number of records".into()))?;
        for (i, r) in raw_records.iter().enumerate() {
            if let Err(fault) = r.decode(lanes.len(), string_count) {
                let offset = u64::from(HEADER_SIZE) + i as u64 * u64::from(RECORD_SIZE);
                return Err(corrupt(format!("record {i} (at offset {offset}): {fault}")));
            }
        }

        let records = at(u64::from(HEADER_SIZE))..at(records_end);
        Ok(TraceFile {
            path,
            data,
            header: h,
            records,
            lanes,
            strings,
            meta,
        })
    }
}

/// Splits the string table into byte ranges (absolute file offsets), checking bounds, UTF-8,
/// the exact size and that string 0 is empty.
fn parse_strings(table: &[u8], base: u64, count: u32) -> Result<Vec<Range<usize>>, String> {
    if count == 0 {
        return Err("string_count: expected at least 1 (the empty string 0), found 0".into());
    }
    // Every entry takes at least its 4-byte length, which bounds the allocation below.
    if u64::from(count) > table.len() as u64 / 4 {
        return Err(format!(
            "string_count {count} cannot fit in a {}-byte string table (4 bytes per length)",
            table.len()
        ));
    }
    let base = usize::try_from(base).map_err(|_| "string table offset too large".to_string())?;
    let mut ranges = Vec::with_capacity(count as usize);
    let mut pos = 0usize;
    for i in 0..count {
        let offset = base + pos;
        let Some(len_bytes) = table.get(pos..pos + 4) else {
            return Err(format!(
                "string {i} (at offset {offset}): expected a 4-byte length, found the end of \
                 the string table"
            ));
        };
        let mut word = [0u8; 4];
        word.copy_from_slice(len_bytes);
        let n = u32::from_le_bytes(word) as usize;
        let start = pos + 4;
        let Some(text) = start.checked_add(n).and_then(|end| table.get(start..end)) else {
            return Err(format!(
                "string {i} (at offset {offset}): length {n} runs past the end of the string \
                 table ({} bytes left)",
                table.len() - start
            ));
        };
        if let Err(e) = std::str::from_utf8(text) {
            return Err(format!(
                "string {i} (at offset {offset}): invalid UTF-8: {e}"
            ));
        }
        if i == 0 && n != 0 {
            return Err(format!(
                "string 0: expected the empty string, found {n} bytes"
            ));
        }
        ranges.push(base + start..base + start + n);
        pos = start + n;
    }
    if pos != table.len() {
        return Err(format!(
            "string table: expected {count} strings to fill all {} bytes, found {} bytes \
             left over at offset {}",
            table.len(),
            table.len() - pos,
            base + pos
        ));
    }
    Ok(ranges)
}

/// The records of a [`TraceFile`], decoded one at a time from the file's bytes.
///
/// Every record was validated when the trace was opened. Should a mapped file be modified by
/// another process afterwards, records that no longer decode are skipped rather than panicking.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    raw: std::slice::Iter<'a, RawRecord>,
    lane_count: usize,
    string_count: u32,
}

impl Iterator for Records<'_> {
    type Item = Record;

    #[inline]
    fn next(&mut self) -> Option<Record> {
        loop {
            if let Ok(r) = self.raw.next()?.decode(self.lane_count, self.string_count) {
                return Some(r);
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.raw.len()))
    }
}
