//! The `.om` model file: a versioned, checksummed container of sections, and the model
//! description section, defined here so that the compiler (which writes it) and the runtime
//! (which maps and validates it) share one definition.
//!
//! ```text
//! offset 0   header (64 bytes): magic "GEAROM\0\0", version 1.0, header size, section count,
//!            flags, file size, body checksum, header checksum
//! offset 64  section table: one 24-byte entry per section (kind, flags, offset, size)
//! then       the sections, each starting 64-byte aligned, zero padding between them
//! ```
//!
//! Everything is little-endian. The body checksum ([`crate::checksum`]) covers bytes 64..end;
//! the header checksum covers the header with its own field taken as zero. Since minor version
//! 4 a `Checksums` section also holds each other section's checksum (and one over the section
//! table and itself): a reader that finds it checks every section but the weights when it
//! parses and the weights only when something asks for them ([`OmFile::weights`]), so a
//! timing-only run of a large model never reads its weights; padding must be zero. An older
//! reader ignores the section and checks the body, which still covers everything. A reader rejects a
//! different major version, unknown flags, overlapping or out-of-range sections, a section
//! kind it does not know (for the same minor version) and a section given twice. Variable-size
//! data inside a section is read through [`Decoder`], which checks every length against the
//! bytes actually left before allocating.

use thiserror::Error;

use crate::checksum::checksum;

/// Magic bytes of a `.om` file.
pub const MAGIC: [u8; 8] = *b"GEAROM\0\0";
/// Major version: a reader refuses any other.
pub const VERSION_MAJOR: u16 = 1;
/// Minor version: a reader accepts a higher one and ignores section kinds it does not know.
pub const VERSION_MINOR: u16 = 4;
/// Header size in bytes.
pub const HEADER_BYTES: usize = 64;
/// Section table entry size in bytes.
pub const SECTION_ENTRY_BYTES: usize = 24;
/// Alignment of every section's start.
pub const SECTION_ALIGN: usize = 64;

/// The kinds of section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SectionKind {
    /// The model description ([`ModelDesc`]).
    Desc = 1,
    /// Weights, referenced by offset.
    Weights = 2,
    /// Kernel images, referenced by offset.
    Kernels = 3,
    /// Task streams.
    Tasks = 4,
    /// Label table.
    Labels = 5,
    /// The compiled graph (for the runtime's dynamic-shape fallback).
    Graph = 6,
    /// Per-kernel image flags (`task::KERNEL_NEEDS_VALUES`), one u32 per kernel; absent when
    /// no kernel has a flag (since minor version 2; an older reader ignores it).
    KernelFlags = 7,
    /// What profiles show of the operator behind each kernel task: its type and its input
    /// and output tensors ([`crate::omtask::OpInfo`]; since minor version 3; an older reader
    /// ignores it).
    OpInfo = 8,
    /// Every other section's checksum, in table order (kind u32, zero u32, checksum u64 each),
    /// then a checksum over the section table and those entries (since minor version 4; an
    /// older reader ignores it).
    Checksums = 9,
}

impl SectionKind {
    /// Every kind.
    pub const ALL: [SectionKind; 9] = [
        SectionKind::Desc,
        SectionKind::Weights,
        SectionKind::Kernels,
        SectionKind::Tasks,
        SectionKind::Labels,
        SectionKind::Graph,
        SectionKind::KernelFlags,
        SectionKind::OpInfo,
        SectionKind::Checksums,
    ];

    /// The kind with this number.
    pub fn from_u32(v: u32) -> Option<SectionKind> {
        SectionKind::ALL.iter().copied().find(|k| *k as u32 == v)
    }

    /// How messages name the section.
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Desc => "Desc section",
            SectionKind::Weights => "Weights section",
            SectionKind::Kernels => "Kernels section",
            SectionKind::Tasks => "Tasks section",
            SectionKind::Labels => "Labels section",
            SectionKind::Graph => "Graph section",
            SectionKind::KernelFlags => "KernelFlags section",
            SectionKind::OpInfo => "OpInfo section",
            SectionKind::Checksums => "Checksums section",
        }
    }
}

/// A `.om` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OmError {
    /// Shorter than its header or than it claims.
    #[error("truncated .om: {what} needs {needed} bytes, the file has {found}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes present.
        found: u64,
    },
    /// Not a `.om` file.
    #[error("not a gearsim .om file (bad magic {found:02x?})")]
    BadMagic {
        /// The first bytes.
        found: Vec<u8>,
    },
    /// A version this reader does not read.
    #[error(".om version {major}.{minor} is not supported (this build reads {VERSION_MAJOR}.x)")]
    Version {
        /// Major version found.
        major: u16,
        /// Minor version found.
        minor: u16,
    },
    /// A checksum does not match.
    #[error(
        ".om {which} checksum mismatch: stored {stored:#x}, computed {computed:#x} (the file is damaged)"
    )]
    Checksum {
        /// `header`, `body`, `section table` or the section's kind (e.g. `Weights section`).
        which: &'static str,
        /// Stored value.
        stored: u64,
        /// Computed value.
        computed: u64,
    },
    /// A structural problem.
    #[error("corrupt .om: {0}")]
    Corrupt(String),
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn header_checksum(header: &[u8]) -> u32 {
    let mut h = [0u8; HEADER_BYTES];
    h.copy_from_slice(&header[..HEADER_BYTES]);
    h[40..44].fill(0);
    let c = checksum(&h);
    (c ^ (c >> 32)) as u32
}

/// Rewrites the file size and the checksums (the sections', the body's and the header's) of a
/// `.om` after its bytes were edited, so that the structural checks behind the checksums see
/// the edit (tests and tools that build damaged files on purpose). A file shorter than its
/// header is left as it is.
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < HEADER_BYTES {
        return;
    }
    seal(bytes);
}

/// Builds a `.om` file from sections.
#[derive(Debug, Default)]
pub struct OmWriter {
    sections: Vec<(SectionKind, Vec<u8>)>,
}

impl OmWriter {
    /// An empty file.
    pub fn new() -> OmWriter {
        OmWriter::default()
    }

    /// Adds a section (each kind once; a second call replaces the first).
    pub fn section(&mut self, kind: SectionKind, bytes: Vec<u8>) -> &mut OmWriter {
        self.sections.retain(|(k, _)| *k != kind);
        self.sections.push((kind, bytes));
        self.sections.sort_by_key(|(k, _)| *k);
        self
    }

    /// The file's bytes, with a `Checksums` section after the others.
    pub fn finish(&self) -> Vec<u8> {
        let others = self
            .sections
            .iter()
            .filter(|(k, _)| *k != SectionKind::Checksums);
        let count = others.clone().count();
        let weight_len = others
            .clone()
            .find(|(k, _)| *k == SectionKind::Weights)
            .map_or(0, |(_, b)| b.len());
        let sums_bytes = checksums_bytes(count, weight_len);
        let table_end = HEADER_BYTES + SECTION_ENTRY_BYTES * (count + 1);
        let mut layout = Vec::new();
        let mut at = table_end.div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
        for (kind, b) in others.clone() {
            layout.push((*kind, at, b.len()));
            at = (at + b.len()).div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
        }
        layout.push((SectionKind::Checksums, at, sums_bytes));
        at = (at + sums_bytes).div_ceil(SECTION_ALIGN) * SECTION_ALIGN;
        let file_size = at;
        let mut out = vec![0u8; file_size];
        out[..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&VERSION_MAJOR.to_le_bytes());
        out[10..12].copy_from_slice(&VERSION_MINOR.to_le_bytes());
        out[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        out[16..20].copy_from_slice(&((count + 1) as u32).to_le_bytes());
        out[24..32].copy_from_slice(&(file_size as u64).to_le_bytes());
        for (i, (kind, off, len)) in layout.iter().enumerate() {
            let e = HEADER_BYTES + SECTION_ENTRY_BYTES * i;
            out[e..e + 4].copy_from_slice(&(*kind as u32).to_le_bytes());
            out[e + 8..e + 16].copy_from_slice(&(*off as u64).to_le_bytes());
            out[e + 16..e + 24].copy_from_slice(&(*len as u64).to_le_bytes());
        }
        for ((_, b), (_, off, _)) in others.zip(&layout) {
            out[*off..*off + b.len()].copy_from_slice(b);
        }
        seal(&mut out);
        out
    }
}

/// Bytes of one entry of the `Checksums` section.
const CHECKSUM_ENTRY_BYTES: usize = 16;

/// The weights are also checksummed in chunks of this many bytes, so that a run reading a
/// few of them (a gear table) checks only the chunks it reads ([`OmFile::weights_part`]).
pub const WEIGHT_CHUNK_BYTES: usize = 1 << 20;

/// Size of the `Checksums` section of a file of `others` other sections whose weights have
/// `weight_len` bytes: the entries, the chunk count and chunk checksums, the table checksum.
fn checksums_bytes(others: usize, weight_len: usize) -> usize {
    CHECKSUM_ENTRY_BYTES * others + 8 + 8 * weight_len.div_ceil(WEIGHT_CHUNK_BYTES) + 8
}

/// The section table's entries (kind, offset, size) where they lie inside `bytes`; None when
/// the table itself does not fit.
fn table_entries(bytes: &[u8]) -> Option<Vec<(u32, usize, usize)>> {
    let count = le_u32(bytes, 16) as usize;
    let end = count
        .checked_mul(SECTION_ENTRY_BYTES)?
        .checked_add(HEADER_BYTES)?;
    if end > bytes.len() {
        return None;
    }
    Some(
        (0..count)
            .map(|i| {
                let e = HEADER_BYTES + SECTION_ENTRY_BYTES * i;
                (
                    le_u32(bytes, e),
                    le_u64(bytes, e + 8) as usize,
                    le_u64(bytes, e + 16) as usize,
                )
            })
            .collect(),
    )
}

/// The checksum over the section table and the `Checksums` entries before it.
fn table_checksum(bytes: &[u8], table_end: usize, entries: &[u8]) -> u64 {
    let mut c = crate::checksum::Checksum::new();
    c.update(&bytes[HEADER_BYTES..table_end]);
    c.update(entries);
    c.finish()
}

/// Writes the `Checksums` section (when the table has a well-placed one), the file size and
/// the body and header checksums from the bytes as they are.
fn seal(bytes: &mut [u8]) {
    let len = bytes.len() as u64;
    bytes[24..32].copy_from_slice(&len.to_le_bytes());
    if let Some(entries) = table_entries(bytes) {
        let table_end = HEADER_BYTES + SECTION_ENTRY_BYTES * entries.len();
        let fits =
            |off: usize, size: usize| off.checked_add(size).is_some_and(|e| e <= bytes.len());
        let sums = entries
            .iter()
            .find(|(k, off, size)| *k == SectionKind::Checksums as u32 && fits(*off, *size));
        let others: Vec<_> = entries
            .iter()
            .filter(|(k, _, _)| *k != SectionKind::Checksums as u32)
            .collect();
        let weights = others
            .iter()
            .find(|(k, _, _)| *k == SectionKind::Weights as u32)
            .map(|(_, off, size)| (*off, *size));
        if let Some(&(_, at, size)) = sums
            && size == checksums_bytes(others.len(), weights.map_or(0, |w| w.1))
            && others.iter().all(|(_, off, size)| fits(*off, *size))
            && at >= table_end
        {
            let mut list = Vec::with_capacity(size);
            for (kind, off, size) in others {
                list.extend_from_slice(&kind.to_le_bytes());
                list.extend_from_slice(&0u32.to_le_bytes());
                list.extend_from_slice(&checksum(&bytes[*off..*off + *size]).to_le_bytes());
            }
            let (w_off, w_len) = weights.unwrap_or((0, 0));
            let chunks = w_len.div_ceil(WEIGHT_CHUNK_BYTES);
            list.extend_from_slice(&(chunks as u64).to_le_bytes());
            for c in bytes[w_off..w_off + w_len].chunks(WEIGHT_CHUNK_BYTES) {
                list.extend_from_slice(&checksum(c).to_le_bytes());
            }
            let t = table_checksum(bytes, table_end, &list);
            list.extend_from_slice(&t.to_le_bytes());
            bytes[at..at + size].copy_from_slice(&list);
        }
    }
    let body = checksum(&bytes[HEADER_BYTES..]);
    bytes[32..40].copy_from_slice(&body.to_le_bytes());
    let h = header_checksum(bytes);
    bytes[40..44].copy_from_slice(&h.to_le_bytes());
}

/// A validated `.om` file borrowed from its bytes.
#[derive(Debug, Clone)]
pub struct OmFile<'a> {
    bytes: &'a [u8],
    sections: Vec<(SectionKind, std::ops::Range<usize>)>,
    /// Minor version of the file.
    pub minor: u16,
    /// The weights' stored checksums (whole and by chunk) when they are checked on use, not
    /// at parse time.
    weights_sum: Option<WeightSums>,
}

/// The stored checksums of weights checked on use.
#[derive(Debug, Clone)]
struct WeightSums {
    whole: u64,
    /// Offset in the file of the chunk checksums (u64 each; their count was checked against
    /// the weights' size at parse time).
    chunks_at: usize,
}

impl<'a> OmFile<'a> {
    /// Validates `bytes` as a `.om` file.
    pub fn parse(bytes: &'a [u8]) -> Result<OmFile<'a>, OmError> {
        let len = bytes.len() as u64;
        if bytes.len() < 8 || bytes[..8] != MAGIC {
            return Err(OmError::BadMagic {
                found: bytes[..bytes.len().min(8)].to_vec(),
            });
        }
        if bytes.len() < HEADER_BYTES {
            return Err(OmError::Truncated {
                what: "the header".into(),
                needed: HEADER_BYTES as u64,
                found: len,
            });
        }
        let (major, minor) = (le_u16(bytes, 8), le_u16(bytes, 10));
        if major != VERSION_MAJOR {
            return Err(OmError::Version { major, minor });
        }
        let stored_h = le_u32(bytes, 40);
        let computed_h = header_checksum(bytes);
        if stored_h != computed_h {
            return Err(OmError::Checksum {
                which: "header",
                stored: u64::from(stored_h),
                computed: u64::from(computed_h),
            });
        }
        if le_u32(bytes, 12) as usize != HEADER_BYTES {
            return Err(OmError::Corrupt(format!(
                "header size {} (expected {HEADER_BYTES})",
                le_u32(bytes, 12)
            )));
        }
        if le_u32(bytes, 20) != 0 || bytes[44..HEADER_BYTES].iter().any(|b| *b != 0) {
            return Err(OmError::Corrupt(
                "reserved header bytes or flags are not zero".into(),
            ));
        }
        let file_size = le_u64(bytes, 24);
        if file_size != len {
            return Err(OmError::Truncated {
                what: "the file size in the header".into(),
                needed: file_size,
                found: len,
            });
        }
        let count = le_u32(bytes, 16) as usize;
        let table_end = count
            .checked_mul(SECTION_ENTRY_BYTES)
            .and_then(|t| t.checked_add(HEADER_BYTES))
            .filter(|e| *e <= bytes.len())
            .ok_or_else(|| OmError::Corrupt(format!("{count} sections do not fit in the file")))?;
        let mut sections: Vec<(SectionKind, std::ops::Range<usize>)> = Vec::with_capacity(count);
        let mut ranges: Vec<(u32, std::ops::Range<usize>)> = Vec::with_capacity(count);
        for i in 0..count {
            let e = HEADER_BYTES + SECTION_ENTRY_BYTES * i;
            let (kind, flags, off, size) = (
                le_u32(bytes, e),
                le_u32(bytes, e + 4),
                le_u64(bytes, e + 8),
                le_u64(bytes, e + 16),
            );
            if flags != 0 {
                return Err(OmError::Corrupt(format!(
                    "section {i} has flags {flags:#x}"
                )));
            }
            let end = off.checked_add(size).filter(|end| *end <= len);
            let Some(end) = end else {
                return Err(OmError::Corrupt(format!(
                    "section {i} [{off}, +{size}) runs past the end of the file ({len} bytes)"
                )));
            };
            if (off as usize) < table_end || !(off as usize).is_multiple_of(SECTION_ALIGN) {
                return Err(OmError::Corrupt(format!(
                    "section {i} starts at {off}, inside the header or unaligned"
                )));
            }
            let range = off as usize..end as usize;
            ranges.push((kind, range.clone()));
            if let Some((_, r)) = ranges[..i]
                .iter()
                .find(|(_, r)| r.start < range.end && range.start < r.end)
            {
                return Err(OmError::Corrupt(format!(
                    "section {i} overlaps the section at {}",
                    r.start
                )));
            }
            match SectionKind::from_u32(kind) {
                Some(k) => {
                    if sections.iter().any(|(s, _)| *s == k) {
                        return Err(OmError::Corrupt(format!(
                            "section kind {kind} appears twice"
                        )));
                    }
                    sections.push((k, range));
                }
                None if minor > VERSION_MINOR => {}
                None => {
                    return Err(OmError::Corrupt(format!(
                        "section {i} has unknown kind {kind}"
                    )));
                }
            }
        }
        let sums = sections
            .iter()
            .find(|(k, _)| *k == SectionKind::Checksums)
            .map(|(_, r)| r.clone());
        let weights_sum = match sums {
            Some(sums) => check_sections(bytes, table_end, &ranges, sums)?,
            None => {
                let stored = le_u64(bytes, 32);
                let computed = checksum(&bytes[HEADER_BYTES..]);
                if stored != computed {
                    return Err(OmError::Checksum {
                        which: "body",
                        stored,
                        computed,
                    });
                }
                None
            }
        };
        Ok(OmFile {
            bytes,
            sections,
            minor,
            weights_sum,
        })
    }

    /// The bytes of a section, if present. The weights of a file with per-section checksums
    /// are checked here, on each call, and a damaged weights section reads as absent: use
    /// [`OmFile::weights`], which says why.
    pub fn section(&self, kind: SectionKind) -> Option<&'a [u8]> {
        if kind == SectionKind::Weights {
            return self.weights().ok().and(self.raw_section(kind));
        }
        self.raw_section(kind)
    }

    fn raw_section(&self, kind: SectionKind) -> Option<&'a [u8]> {
        self.sections
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, r)| &self.bytes[r.clone()])
    }

    /// The size of a section, if present, without reading it.
    pub fn section_size(&self, kind: SectionKind) -> Option<usize> {
        self.raw_section(kind).map(<[u8]>::len)
    }

    /// The weights (empty when the file has none), checked against their stored checksum
    /// first when the parse left them unread.
    pub fn weights(&self) -> Result<&'a [u8], OmError> {
        let w = self.raw_section(SectionKind::Weights).unwrap_or(&[]);
        if let Some(sums) = &self.weights_sum {
            let computed = checksum(w);
            if computed != sums.whole {
                return Err(OmError::Checksum {
                    which: "Weights section",
                    stored: sums.whole,
                    computed,
                });
            }
        }
        Ok(w)
    }

    /// Bytes `range` of the weights, checked first (the chunks of
    /// [`WEIGHT_CHUNK_BYTES`] it touches) when the parse left them unread.
    pub fn weights_part(&self, range: std::ops::Range<usize>) -> Result<&'a [u8], OmError> {
        let w = self.raw_section(SectionKind::Weights).unwrap_or(&[]);
        if range.start > range.end || range.end > w.len() {
            return Err(OmError::Corrupt(format!(
                "weight bytes [{}, {}) are outside the {}-byte weights section",
                range.start,
                range.end,
                w.len()
            )));
        }
        if let Some(sums) = &self.weights_sum
            && range.start < range.end
        {
            for c in range.start / WEIGHT_CHUNK_BYTES..range.end.div_ceil(WEIGHT_CHUNK_BYTES) {
                let stored = le_u64(self.bytes, sums.chunks_at + 8 * c);
                let part = &w[c * WEIGHT_CHUNK_BYTES..((c + 1) * WEIGHT_CHUNK_BYTES).min(w.len())];
                let computed = checksum(part);
                if computed != stored {
                    return Err(OmError::Checksum {
                        which: "Weights section",
                        stored,
                        computed,
                    });
                }
            }
        }
        Ok(&w[range])
    }

    /// The model description.
    pub fn desc(&self) -> Result<ModelDesc, OmError> {
        let b = self
            .section(SectionKind::Desc)
            .ok_or_else(|| OmError::Corrupt("no model description section".into()))?;
        ModelDesc::decode(b)
    }
}

/// Checks a file with a `Checksums` section (at `sums`): zero padding around every section,
/// the checksum over the table and the entries, and each section's own checksum but the
/// weights', which it returns to be checked on use.
fn check_sections(
    bytes: &[u8],
    table_end: usize,
    ranges: &[(u32, std::ops::Range<usize>)],
    sums: std::ops::Range<usize>,
) -> Result<Option<WeightSums>, OmError> {
    let mut placed: Vec<&std::ops::Range<usize>> = ranges.iter().map(|(_, r)| r).collect();
    placed.sort_by_key(|r| r.start);
    let mut at = table_end;
    for r in placed
        .iter()
        .copied()
        .chain(std::iter::once(&(bytes.len()..bytes.len())))
    {
        if let Some(i) = bytes[at..r.start].iter().position(|b| *b != 0) {
            return Err(OmError::Corrupt(format!(
                "padding byte at {} is {:#04x}, not zero",
                at + i,
                bytes[at + i]
            )));
        }
        at = r.end;
    }
    let others: Vec<&(u32, std::ops::Range<usize>)> = ranges
        .iter()
        .filter(|(k, _)| *k != SectionKind::Checksums as u32)
        .collect();
    let list = &bytes[sums.clone()];
    let weight_len = others
        .iter()
        .find(|(k, _)| *k == SectionKind::Weights as u32)
        .map_or(0, |(_, r)| r.len());
    let expected = checksums_bytes(others.len(), weight_len);
    if list.len() != expected {
        return Err(OmError::Corrupt(format!(
            "the checksums section has {} bytes (expected {expected} for {} sections and {weight_len} bytes of weights)",
            list.len(),
            others.len()
        )));
    }
    let (before, tail) = list.split_at(list.len() - 8);
    let stored = le_u64(tail, 0);
    let computed = table_checksum(bytes, table_end, before);
    if stored != computed {
        return Err(OmError::Checksum {
            which: "section table",
            stored,
            computed,
        });
    }
    let entries = &before[..CHECKSUM_ENTRY_BYTES * others.len()];
    let chunks_field = CHECKSUM_ENTRY_BYTES * others.len();
    let chunks = le_u64(before, chunks_field);
    if chunks != weight_len.div_ceil(WEIGHT_CHUNK_BYTES) as u64 {
        return Err(OmError::Corrupt(format!(
            "the checksums section lists {chunks} weight chunks for {weight_len} bytes of weights"
        )));
    }
    let chunks_at = sums.start + chunks_field + 8;
    let mut weights = None;
    for (i, (kind, range)) in others.into_iter().enumerate() {
        let e = CHECKSUM_ENTRY_BYTES * i;
        let (listed, zero, stored) = (
            le_u32(entries, e),
            le_u32(entries, e + 4),
            le_u64(entries, e + 8),
        );
        if listed != *kind || zero != 0 {
            return Err(OmError::Corrupt(format!(
                "checksum entry {i} is for kind {listed} (flags {zero:#x}), the table has kind {kind} there"
            )));
        }
        if *kind == SectionKind::Weights as u32 {
            weights = Some(WeightSums {
                whole: stored,
                chunks_at,
            });
            continue;
        }
        let computed = checksum(&bytes[range.clone()]);
        if stored != computed {
            return Err(OmError::Checksum {
                which: SectionKind::from_u32(*kind).map_or("unknown section", SectionKind::name),
                stored,
                computed,
            });
        }
    }
    Ok(weights)
}

/// Writes the variable-size values of a section.
#[derive(Debug, Default)]
pub struct Encoder {
    /// The bytes written.
    pub bytes: Vec<u8>,
}

impl Encoder {
    /// A u32.
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    /// A u64.
    pub fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    /// An i64.
    pub fn i64(&mut self, v: i64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.bytes.extend_from_slice(s.as_bytes());
    }
    /// A length-prefixed list of i64.
    pub fn i64s(&mut self, v: &[i64]) {
        self.u32(v.len() as u32);
        for x in v {
            self.i64(*x);
        }
    }
    /// A length-prefixed list of u64.
    pub fn u64s(&mut self, v: &[u64]) {
        self.u32(v.len() as u32);
        for x in v {
            self.u64(*x);
        }
    }
    /// A length prefix.
    pub fn len(&mut self, n: usize) {
        self.u32(n as u32);
    }
}

/// Reads the values [`Encoder`] wrote, checking every length against what is left.
#[derive(Debug)]
pub struct Decoder<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Decoder<'a> {
    /// A decoder over a section's bytes; `what` names the section in errors.
    pub fn new(bytes: &'a [u8], what: &'static str) -> Decoder<'a> {
        Decoder { bytes, at: 0, what }
    }

    fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8], OmError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| {
                OmError::Corrupt(format!(
                    "{}: `{field}` at byte {} needs {n} bytes, {} left",
                    self.what,
                    self.at,
                    self.bytes.len() - self.at
                ))
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// A u32.
    pub fn u32(&mut self, field: &str) -> Result<u32, OmError> {
        let b = self.take(4, field)?;
        Ok(le_u32(b, 0))
    }
    /// A u64.
    pub fn u64(&mut self, field: &str) -> Result<u64, OmError> {
        let b = self.take(8, field)?;
        Ok(le_u64(b, 0))
    }
    /// An i64.
    pub fn i64(&mut self, field: &str) -> Result<i64, OmError> {
        Ok(self.u64(field)? as i64)
    }
    /// A length prefix for items of at least `item_bytes` each (checked against what is left).
    pub fn len(&mut self, field: &str, item_bytes: usize) -> Result<usize, OmError> {
        let n = self.u32(field)? as usize;
        if n.saturating_mul(item_bytes.max(1)) > self.bytes.len() - self.at {
            return Err(OmError::Corrupt(format!(
                "{}: `{field}` claims {n} items, more than the {} bytes left hold",
                self.what,
                self.bytes.len() - self.at
            )));
        }
        Ok(n)
    }
    /// A string.
    pub fn str(&mut self, field: &str) -> Result<String, OmError> {
        let n = self.len(field, 1)?;
        let b = self.take(n, field)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| OmError::Corrupt(format!("{}: `{field}` is not UTF-8", self.what)))
    }
    /// A flag written as the u32 0 or 1; any other value is an error, so every accepted byte
    /// has one meaning.
    pub fn flag(&mut self, field: &str) -> Result<bool, OmError> {
        match self.u32(field)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(OmError::Corrupt(format!(
                "{}: `{field}` is {v} (expected 0 or 1)",
                self.what
            ))),
        }
    }
    /// A list of i64.
    pub fn i64s(&mut self, field: &str) -> Result<Vec<i64>, OmError> {
        let n = self.len(field, 8)?;
        (0..n).map(|_| self.i64(field)).collect()
    }
    /// `n` raw bytes.
    pub fn bytes(&mut self, n: usize, field: &str) -> Result<&'a [u8], OmError> {
        self.take(n, field)
    }
    /// A list of u64.
    pub fn u64s(&mut self, field: &str) -> Result<Vec<u64>, OmError> {
        let n = self.len(field, 8)?;
        (0..n).map(|_| self.u64(field)).collect()
    }
    /// Whether every byte was read.
    pub fn at_end(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// Fails unless every byte was read.
    pub fn finish(&self) -> Result<(), OmError> {
        if self.at != self.bytes.len() {
            return Err(OmError::Corrupt(format!(
                "{}: {} unexpected bytes at the end",
                self.what,
                self.bytes.len() - self.at
            )));
        }
        Ok(())
    }
}

/// A model input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoDesc {
    /// Name.
    pub name: String,
    /// Element type (ONNX code).
    pub dtype: u32,
    /// Layout name (`ND`, `NCHW`, `NHWC`).
    pub format: String,
    /// Dims as declared, `-1` for gear-controlled axes.
    pub dims: Vec<i64>,
    /// Dims of the largest gear (the buffer's shape).
    pub max_dims: Vec<i64>,
    /// Buffer size in bytes (the largest gear's).
    pub bytes: u64,
}

/// The gear configuration of a dynamic model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicDesc {
    /// `mbatch_dynamic_type`: 1 batch, 2 image size, 3 dims.
    pub mode: u32,
    /// The gears, in the order written (gear i is branch `Batch_i`).
    pub gears: Vec<Vec<i64>>,
    /// Input names in gear-vector order (`user_designate_shape_order`).
    pub shape_order: Vec<String>,
    /// Whether the inputs come from GetNext (sink mode).
    pub getnext_sink: bool,
    /// Gear table layout: 0 gear-major, 1 dim-major padded to 8, 2 sorted for binary search.
    pub table_layout: u32,
    /// MapIndex engine: 0 AI core, 1 AI CPU.
    pub mapindex_engine: u32,
    /// Per gear, per model input: the real dims.
    pub input_dims: Vec<Vec<Vec<i64>>>,
    /// Per gear, per model output: the real dims.
    pub output_dims: Vec<Vec<Vec<i64>>>,
    /// Per gear, per model output: the real byte size.
    pub output_bytes: Vec<Vec<u64>>,
}

/// The memory plan's totals.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryDesc {
    /// Weights, stored once.
    pub weight_bytes: u64,
    /// Feature-map region: the largest gear's plan (branches are overlaid).
    pub feature_map_bytes: u64,
    /// The part of the feature-map region every gear shares (the root graph's tensors: the gear
    /// vector, MapIndex's result); the branches are overlaid after it.
    pub root_feature_map_bytes: u64,
    /// Per gear, the feature-map bytes it needs (root part included).
    pub per_gear_feature_map: Vec<u64>,
    /// Model inputs (largest gear), including the gear vector.
    pub input_bytes: u64,
    /// Model outputs (largest gear).
    pub output_bytes: u64,
}

/// The model description section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelDesc {
    /// Model name.
    pub name: String,
    /// The chip preset it was compiled for.
    pub soc_version: String,
    /// Inputs in model-input order.
    pub inputs: Vec<IoDesc>,
    /// Outputs in order.
    pub outputs: Vec<IoDesc>,
    /// Gear configuration, for a dynamic model.
    pub dynamic: Option<DynamicDesc>,
    /// Memory totals.
    pub memory: MemoryDesc,
    /// The atc options the model was built with that change what it computes or how fast
    /// (`precision_mode`, `fusion_switch`), as name and value; empty in files written before
    /// they were recorded.
    pub build_options: Vec<(String, String)>,
}

fn encode_io(e: &mut Encoder, io: &IoDesc) {
    e.str(&io.name);
    e.u32(io.dtype);
    e.str(&io.format);
    e.i64s(&io.dims);
    e.i64s(&io.max_dims);
    e.u64(io.bytes);
}

fn decode_io(d: &mut Decoder<'_>) -> Result<IoDesc, OmError> {
    Ok(IoDesc {
        name: d.str("io name")?,
        dtype: d.u32("io dtype")?,
        format: d.str("io format")?,
        dims: d.i64s("io dims")?,
        max_dims: d.i64s("io max_dims")?,
        bytes: d.u64("io bytes")?,
    })
}

fn encode_nested(e: &mut Encoder, v: &[Vec<Vec<i64>>]) {
    e.len(v.len());
    for g in v {
        e.len(g.len());
        for dims in g {
            e.i64s(dims);
        }
    }
}

fn decode_nested(d: &mut Decoder<'_>, field: &str) -> Result<Vec<Vec<Vec<i64>>>, OmError> {
    let n = d.len(field, 4)?;
    (0..n)
        .map(|_| {
            let m = d.len(field, 4)?;
            (0..m).map(|_| d.i64s(field)).collect()
        })
        .collect()
}

impl ModelDesc {
    /// The section bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.str(&self.name);
        e.str(&self.soc_version);
        for list in [&self.inputs, &self.outputs] {
            e.len(list.len());
            for io in list {
                encode_io(&mut e, io);
            }
        }
        match &self.dynamic {
            None => e.u32(0),
            Some(dy) => {
                e.u32(1);
                e.u32(dy.mode);
                e.len(dy.gears.len());
                for g in &dy.gears {
                    e.i64s(g);
                }
                e.len(dy.shape_order.len());
                for s in &dy.shape_order {
                    e.str(s);
                }
                e.u32(u32::from(dy.getnext_sink));
                e.u32(dy.table_layout);
                e.u32(dy.mapindex_engine);
                encode_nested(&mut e, &dy.input_dims);
                encode_nested(&mut e, &dy.output_dims);
                e.len(dy.output_bytes.len());
                for g in &dy.output_bytes {
                    e.u64s(g);
                }
            }
        }
        let m = &self.memory;
        e.u64(m.weight_bytes);
        e.u64(m.feature_map_bytes);
        e.u64(m.root_feature_map_bytes);
        e.u64s(&m.per_gear_feature_map);
        e.u64(m.input_bytes);
        e.u64(m.output_bytes);
        // Written only when there are any, so a file from before they were recorded and its
        // re-encoding are the same bytes.
        if !self.build_options.is_empty() {
            e.len(self.build_options.len());
            for (k, v) in &self.build_options {
                e.str(k);
                e.str(v);
            }
        }
        e.bytes
    }

    /// Parses the section bytes.
    pub fn decode(bytes: &[u8]) -> Result<ModelDesc, OmError> {
        let mut d = Decoder::new(bytes, "model description");
        let name = d.str("name")?;
        let soc_version = d.str("soc_version")?;
        let mut lists = Vec::new();
        for field in ["inputs", "outputs"] {
            let n = d.len(field, 28)?;
            lists.push(
                (0..n)
                    .map(|_| decode_io(&mut d))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
        let outputs = lists.pop().unwrap_or_default();
        let inputs = lists.pop().unwrap_or_default();
        let dynamic = match d.u32("dynamic flag")? {
            0 => None,
            1 => {
                let mode = d.u32("mode")?;
                let n = d.len("gears", 4)?;
                let gears = (0..n)
                    .map(|_| d.i64s("gear"))
                    .collect::<Result<Vec<_>, _>>()?;
                let n = d.len("shape_order", 4)?;
                let shape_order = (0..n)
                    .map(|_| d.str("shape_order"))
                    .collect::<Result<Vec<_>, _>>()?;
                let getnext_sink = d.flag("getnext_sink")?;
                let table_layout = d.u32("table_layout")?;
                let mapindex_engine = d.u32("mapindex_engine")?;
                let input_dims = decode_nested(&mut d, "input_dims")?;
                let output_dims = decode_nested(&mut d, "output_dims")?;
                let n = d.len("output_bytes", 4)?;
                let output_bytes = (0..n)
                    .map(|_| d.u64s("output_bytes"))
                    .collect::<Result<Vec<_>, _>>()?;
                Some(DynamicDesc {
                    mode,
                    gears,
                    shape_order,
                    getnext_sink,
                    table_layout,
                    mapindex_engine,
                    input_dims,
                    output_dims,
                    output_bytes,
                })
            }
            v => {
                return Err(OmError::Corrupt(format!(
                    "model description: dynamic flag {v} (expected 0 or 1)"
                )));
            }
        };
        let memory = MemoryDesc {
            weight_bytes: d.u64("weight_bytes")?,
            feature_map_bytes: d.u64("feature_map_bytes")?,
            root_feature_map_bytes: d.u64("root_feature_map_bytes")?,
            per_gear_feature_map: d.u64s("per_gear_feature_map")?,
            input_bytes: d.u64("input_bytes")?,
            output_bytes: d.u64("output_bytes")?,
        };
        let mut build_options = Vec::new();
        if !d.at_end() {
            let n = d.len("build_options", 8)?;
            if n == 0 {
                return Err(OmError::Corrupt(
                    "model description: an empty build_options list (none is written as no list)"
                        .into(),
                ));
            }
            for _ in 0..n {
                build_options.push((d.str("build option")?, d.str("build option value")?));
            }
        }
        d.finish()?;
        Ok(ModelDesc {
            name,
            soc_version,
            inputs,
            outputs,
            dynamic,
            memory,
            build_options,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let desc = ModelDesc {
            name: "m".into(),
            soc_version: "ascend910".into(),
            inputs: vec![IoDesc {
                name: "x".into(),
                dtype: 1,
                format: "ND".into(),
                dims: vec![-1, 3],
                max_dims: vec![8, 3],
                bytes: 96,
            }],
            outputs: vec![],
            dynamic: Some(DynamicDesc {
                mode: 1,
                gears: vec![vec![1], vec![8]],
                shape_order: vec!["x".into()],
                getnext_sink: false,
                table_layout: 0,
                mapindex_engine: 0,
                input_dims: vec![vec![vec![1, 3]], vec![vec![8, 3]]],
                output_dims: vec![vec![], vec![]],
                output_bytes: vec![vec![], vec![]],
            }),
            memory: MemoryDesc {
                weight_bytes: 10,
                feature_map_bytes: 20,
                root_feature_map_bytes: 4,
                per_gear_feature_map: vec![5, 20],
                input_bytes: 96,
                output_bytes: 0,
            },
            build_options: vec![("precision_mode".into(), "force_fp16".into())],
        };
        let mut w = OmWriter::new();
        w.section(SectionKind::Desc, desc.encode());
        w.section(SectionKind::Weights, vec![7; 100]);
        w.finish()
    }

    #[test]
    fn round_trip() {
        let bytes = sample();
        let om = OmFile::parse(&bytes).unwrap();
        assert_eq!(om.section(SectionKind::Weights).unwrap(), &[7u8; 100][..]);
        assert_eq!(om.desc().unwrap().memory.per_gear_feature_map, vec![5, 20]);
        assert_eq!(om.section(SectionKind::Tasks), None);
    }

    /// The file without its `Checksums` section, as a minor-3 writer made it.
    fn older(bytes: &[u8]) -> Vec<u8> {
        let entries = table_entries(bytes).unwrap();
        let (kind, at, _) = *entries.last().unwrap();
        assert_eq!(kind, SectionKind::Checksums as u32);
        let mut b = bytes[..at].to_vec();
        b[10..12].copy_from_slice(&3u16.to_le_bytes());
        b[16..20].copy_from_slice(&((entries.len() - 1) as u32).to_le_bytes());
        let last = HEADER_BYTES + SECTION_ENTRY_BYTES * (entries.len() - 1);
        b[last..last + SECTION_ENTRY_BYTES].fill(0);
        reseal(&mut b);
        b
    }

    /// Parses and reads the weights: every byte of the file is checked by one or the other.
    fn parse_all(bytes: &[u8]) -> Result<(), OmError> {
        OmFile::parse(bytes).and_then(|f| f.weights().map(|_| ()))
    }

    #[test]
    fn every_truncation_and_bit_flip_is_an_error() {
        for bytes in [sample(), older(&sample())] {
            parse_all(&bytes).unwrap();
            for n in 0..bytes.len() {
                assert!(OmFile::parse(&bytes[..n]).is_err(), "truncated to {n}");
            }
            for i in 0..bytes.len() {
                for bit in 0..8 {
                    let mut b = bytes.clone();
                    b[i] ^= 1 << bit;
                    assert!(parse_all(&b).is_err(), "byte {i} bit {bit}");
                }
            }
        }
    }

    #[test]
    fn weights_are_checked_when_read_not_when_parsed() {
        let mut bytes = sample();
        let (_, at, _) = table_entries(&bytes).unwrap()[1];
        bytes[at + 5] ^= 4;
        let om = OmFile::parse(&bytes).unwrap();
        assert_eq!(om.section_size(SectionKind::Weights), Some(100));
        assert!(matches!(
            om.weights(),
            Err(OmError::Checksum {
                which: "Weights section",
                ..
            })
        ));
        assert_eq!(om.section(SectionKind::Weights), None);
        // Without per-section checksums the parse checks the weights with the body.
        let mut old = older(&sample());
        old[at + 5] ^= 4;
        assert!(matches!(
            OmFile::parse(&old),
            Err(OmError::Checksum { which: "body", .. })
        ));
    }

    /// Regression (fuzzing): `getnext_sink` was read as `!= 0`, so 255 decoded to `true` and
    /// the description encoded back to different bytes; a flag is now 0 or 1.
    #[test]
    fn flags_other_than_zero_and_one_are_errors() {
        let mut e = Encoder::default();
        e.u32(255);
        let mut d = Decoder::new(&e.bytes, "test");
        let err = d.flag("getnext_sink").unwrap_err().to_string();
        assert!(
            err.contains("`getnext_sink` is 255 (expected 0 or 1)"),
            "{err}"
        );
        let mut e = Encoder::default();
        e.u32(1);
        e.u32(0);
        let mut d = Decoder::new(&e.bytes, "test");
        assert_eq!((d.flag("a"), d.flag("b")), (Ok(true), Ok(false)));
    }

    #[test]
    fn a_part_of_the_weights_is_checked_by_its_chunks() {
        let mut w = OmWriter::new();
        w.section(
            SectionKind::Weights,
            (0..3 * WEIGHT_CHUNK_BYTES + 5).map(|i| i as u8).collect(),
        );
        let mut bytes = w.finish();
        let (_, at, _) = table_entries(&bytes).unwrap()[0];
        bytes[at + 2 * WEIGHT_CHUNK_BYTES + 7] ^= 1;
        let om = OmFile::parse(&bytes).unwrap();
        let c = WEIGHT_CHUNK_BYTES;
        assert_eq!(
            om.weights_part(10..20).unwrap(),
            &(10..20).map(|i| i as u8).collect::<Vec<_>>()[..]
        );
        om.weights_part(c - 4..2 * c).unwrap();
        om.weights_part(3 * c..3 * c + 5).unwrap();
        for bad in [2 * c..2 * c + 1, c..2 * c + 8, 0..3 * c + 5] {
            assert!(
                matches!(
                    om.weights_part(bad.clone()),
                    Err(OmError::Checksum {
                        which: "Weights section",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert!(om.weights().is_err());
        assert!(matches!(
            om.weights_part(0..3 * c + 6),
            Err(OmError::Corrupt(_))
        ));
    }

    #[test]
    fn reseal_makes_an_edited_file_pass_the_checksums() {
        for mut bytes in [sample(), older(&sample())] {
            let (_, desc, _) = table_entries(&bytes).unwrap()[0];
            bytes[desc] ^= 1; // the description's first length byte
            assert!(matches!(
                OmFile::parse(&bytes),
                Err(OmError::Checksum {
                    which: "Desc section" | "body",
                    ..
                })
            ));
            reseal(&mut bytes);
            // Past the checksums, the description's decoder sees the edit.
            let om = OmFile::parse(&bytes).unwrap();
            assert!(om.desc().is_err());
            let mut short = bytes[..10].to_vec();
            reseal(&mut short);
            assert_eq!(short, bytes[..10]);
        }
    }

    #[test]
    fn decoder_refuses_lengths_past_the_end() {
        let mut e = Encoder::default();
        e.u32(1_000_000);
        let mut d = Decoder::new(&e.bytes, "test");
        assert!(
            d.i64s("list")
                .unwrap_err()
                .to_string()
                .contains("claims 1000000 items")
        );
    }
}
