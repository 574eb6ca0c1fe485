//! The `.gtrace` wire format: constants, the little-endian on-disk structs and the checksum.
//!
//! `FORMAT.md` next to this crate's `Cargo.toml` is the normative description; this module is
//! its executable form. Every multi-byte integer is little-endian and every struct is packed
//! (alignment 1), so the structs can be viewed directly over a memory-mapped file.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::{LaneId, Record, StrId};

/// The eight bytes every `.gtrace` file starts with.
pub const MAGIC: [u8; 8] = *b"GEARTRC\0";
/// The major format version this crate writes and reads; files with another major are rejected.
pub const VERSION_MAJOR: u16 = 1;
/// The newest minor format version this crate reads. A writer puts down the lowest minor its
/// file needs: 1 when it has a kernel lane ([`LaneKind::Kernel`](crate::LaneKind)), else 0.
pub const VERSION_MINOR: u16 = 1;
/// Size of the file header in bytes.
pub const HEADER_SIZE: u32 = 96;
/// Size of one record in bytes.
pub const RECORD_SIZE: u32 = 32;
/// Size of one lane table entry in bytes.
pub const LANE_ENTRY_SIZE: u32 = 12;
/// Size of one metadata table entry in bytes.
pub const META_ENTRY_SIZE: u32 = 8;
/// Header flag bit 0: set by the writer's `finish()`; a file without it is an unfinished trace.
pub const FLAG_COMPLETE: u32 = 1;
/// The largest number of lanes a trace can hold (a [`LaneId`] is 16 bits).
pub const MAX_LANES: usize = 1 << 16;

/// Record kind byte of a span.
pub const KIND_SPAN: u8 = 1;
/// Record kind byte of an instant.
pub const KIND_INSTANT: u8 = 2;
/// Record kind byte of a counter sample.
pub const KIND_COUNTER: u8 = 3;
/// Record kind byte of a flow arrow.
pub const KIND_FLOW: u8 = 4;

/// Byte range of the `header_checksum` field inside the header; these bytes count as zero when
/// the header checksum is computed (see [`header_checksum`]).
pub const HEADER_CHECKSUM_FIELD: std::ops::Range<usize> = 68..72;

pub use gearsim_isa::checksum::{CHECKSUM_PRIME, CHECKSUM_SEED};

/// The decoded file header (see `FORMAT.md` for the meaning of every field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// Major format version.
    pub version_major: u16,
    /// Minor format version.
    pub version_minor: u16,
    /// Header size in bytes (96).
    pub header_size: u32,
    /// Record size in bytes (32).
    pub record_size: u32,
    /// Flag bits; bit 0 is "complete".
    pub flags: u32,
    /// Number of records.
    pub record_count: u64,
    /// Byte offset of the lane table.
    pub lanes_offset: u64,
    /// Number of lanes.
    pub lane_count: u32,
    /// Number of metadata entries.
    pub meta_count: u32,
    /// Byte offset of the metadata table.
    pub meta_offset: u64,
    /// Byte offset of the string table.
    pub strings_offset: u64,
    /// Number of strings.
    pub string_count: u32,
    /// Checksum of the header itself (see [`header_checksum`]).
    pub header_checksum: u32,
    /// Size of the string table in bytes.
    pub strings_bytes: u64,
    /// Size of the whole file in bytes.
    pub file_size: u64,
    /// Body checksum: the [`checksum`] of bytes `[96, file_size)`.
    pub checksum: u64,
}

/// The header as it lies on disk.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct RawHeader {
    pub magic: [u8; 8],
    pub version_major: U16,
    pub version_minor: U16,
    pub header_size: U32,
    pub record_size: U32,
    pub flags: U32,
    pub record_count: U64,
    pub lanes_offset: U64,
    pub lane_count: U32,
    pub meta_count: U32,
    pub meta_offset: U64,
    pub strings_offset: U64,
    pub string_count: U32,
    pub header_checksum: U32,
    pub strings_bytes: U64,
    pub file_size: U64,
    pub checksum: U64,
}

impl RawHeader {
    /// The header a writer puts down first: magic and versions set, not complete, no content,
    /// and a valid header checksum (so that readers report it as an unfinished trace).
    pub(crate) fn placeholder() -> RawHeader {
        let mut header = RawHeader {
            magic: MAGIC,
            version_major: VERSION_MAJOR.into(),
            version_minor: 0.into(),
            header_size: HEADER_SIZE.into(),
            record_size: RECORD_SIZE.into(),
            flags: 0.into(),
            record_count: 0.into(),
            lanes_offset: 0.into(),
            lane_count: 0.into(),
            meta_count: 0.into(),
            meta_offset: 0.into(),
            strings_offset: 0.into(),
            string_count: 0.into(),
            header_checksum: 0.into(),
            strings_bytes: 0.into(),
            file_size: 0.into(),
            checksum: 0.into(),
        };
        header.seal();
        header
    }

    /// The header checksum these header bytes should carry (the stored field is ignored).
    pub(crate) fn computed_header_checksum(&self) -> u32 {
        let mut bytes = [0u8; HEADER_SIZE as usize];
        bytes.copy_from_slice(self.as_bytes());
        header_checksum(&bytes)
    }

    /// Stores the header checksum of the current field values; call after the last field edit.
    pub(crate) fn seal(&mut self) {
        self.header_checksum = self.computed_header_checksum().into();
    }

    /// The header's fields as native integers.
    pub(crate) fn decode(&self) -> Header {
        Header {
            version_major: self.version_major.get(),
            version_minor: self.version_minor.get(),
            header_size: self.header_size.get(),
            record_size: self.record_size.get(),
            flags: self.flags.get(),
            record_count: self.record_count.get(),
            lanes_offset: self.lanes_offset.get(),
            lane_count: self.lane_count.get(),
            meta_count: self.meta_count.get(),
            meta_offset: self.meta_offset.get(),
            strings_offset: self.strings_offset.get(),
            string_count: self.string_count.get(),
            header_checksum: self.header_checksum.get(),
            strings_bytes: self.strings_bytes.get(),
            file_size: self.file_size.get(),
            checksum: self.checksum.get(),
        }
    }
}

/// One record as it lies on disk.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct RawRecord {
    pub kind: u8,
    pub reserved: u8,
    pub lane: U16,
    pub name: U32,
    pub t0: U64,
    pub t1: U64,
    pub a: U32,
    pub b: U32,
}

impl RawRecord {
    /// The on-disk form of a record.
    #[inline]
    pub(crate) fn encode(record: &Record) -> RawRecord {
        let (kind, lane, name, t0, t1, a, b) = match *record {
            Record::Span {
                lane,
                name,
                start,
                end,
                pc,
                detail,
            } => (KIND_SPAN, lane, name, start, end, pc, detail.0),
            Record::Instant {
                lane,
                name,
                at,
                arg,
                detail,
            } => (KIND_INSTANT, lane, name, at, 0, arg, detail.0),
            Record::Counter {
                lane,
                name,
                at,
                value,
            } => (
                KIND_COUNTER,
                lane,
                name,
                at,
                u64::from_le_bytes(value.to_le_bytes()),
                0,
                0,
            ),
            Record::Flow {
                name,
                id,
                from_lane,
                from_at,
                to_lane,
                to_at,
            } => (
                KIND_FLOW,
                from_lane,
                name,
                from_at,
                to_at,
                u32::from(to_lane.0),
                id,
            ),
        };
        RawRecord {
            kind,
            reserved: 0,
            lane: lane.0.into(),
            name: name.0.into(),
            t0: t0.into(),
            t1: t1.into(),
            a: a.into(),
            b: b.into(),
        }
    }

    /// Decodes and validates a record against the number of lanes and strings in its file.
    ///
    /// This is the single place that decides whether 32 bytes form a valid record; the reader
    /// runs it over every record at open and again while iterating.
    #[inline]
    pub(crate) fn decode(
        &self,
        lane_count: usize,
        string_count: u32,
    ) -> Result<Record, RecordFault> {
        if self.reserved != 0 {
            return Err(RecordFault::Reserved("byte 1", u64::from(self.reserved)));
        }
        let lane = self.lane.get();
        if usize::from(lane) >= lane_count {
            return Err(RecordFault::Lane(lane, lane_count));
        }
        let lane = LaneId(lane);
        let name = self.name.get();
        if name >= string_count {
            return Err(RecordFault::Str("name", name, string_count));
        }
        let name = StrId(name);
        let (t0, t1, a, b) = (self.t0.get(), self.t1.get(), self.a.get(), self.b.get());
        match self.kind {
            KIND_SPAN => {
                if b >= string_count {
                    return Err(RecordFault::Str("detail", b, string_count));
                }
                if t1 < t0 {
                    return Err(RecordFault::Backwards(t0, t1));
                }
                Ok(Record::Span {
                    lane,
                    name,
                    start: t0,
                    end: t1,
                    pc: a,
                    detail: StrId(b),
                })
            }
            KIND_INSTANT => {
                if b >= string_count {
                    return Err(RecordFault::Str("detail", b, string_count));
                }
                if t1 != 0 {
                    return Err(RecordFault::Reserved("t1 of an instant", t1));
                }
                Ok(Record::Instant {
                    lane,
                    name,
                    at: t0,
                    arg: a,
                    detail: StrId(b),
                })
            }
            KIND_COUNTER => {
                if a != 0 {
                    return Err(RecordFault::Reserved("a of a counter", u64::from(a)));
                }
                if b != 0 {
                    return Err(RecordFault::Reserved("b of a counter", u64::from(b)));
                }
                let value = i64::from_le_bytes(t1.to_le_bytes());
                Ok(Record::Counter {
                    lane,
                    name,
                    at: t0,
                    value,
                })
            }
            KIND_FLOW => {
                let to_lane = usize::try_from(a).unwrap_or(usize::MAX);
                if to_lane >= lane_count || a > u32::from(u16::MAX) {
                    return Err(RecordFault::ToLane(a, lane_count));
                }
                Ok(Record::Flow {
                    name,
                    id: b,
                    from_lane: lane,
                    from_at: t0,
                    // The bound check above guarantees `a` fits in 16 bits.
                    to_lane: LaneId(u16::try_from(a).unwrap_or(u16::MAX)),
                    to_at: t1,
                })
            }
            other => Err(RecordFault::Kind(other)),
        }
    }
}

/// Why 32 bytes are not a valid record (formatted into a `TraceError::Corrupt` message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordFault {
    /// Unknown kind byte.
    Kind(u8),
    /// A reserved field is not zero: which field, and the value found.
    Reserved(&'static str, u64),
    /// Lane out of range: lane found, lane count.
    Lane(u16, usize),
    /// Flow destination lane out of range: value found, lane count.
    ToLane(u32, usize),
    /// String id out of range: which field, id found, string count.
    Str(&'static str, u32, u32),
    /// Span ends before it starts: start, end.
    Backwards(u64, u64),
}

impl std::fmt::Display for RecordFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            RecordFault::Kind(k) => write!(
                f,
                "unknown record kind {k} (expected {KIND_SPAN} span, {KIND_INSTANT} instant, \
                 {KIND_COUNTER} counter or {KIND_FLOW} flow)"
            ),
            RecordFault::Reserved(field, v) => {
                write!(f, "reserved field {field} must be 0, found {v}")
            }
            RecordFault::Lane(l, n) => {
                write!(f, "lane {l} out of range (expected < {n}, the lane count)")
            }
            RecordFault::ToLane(l, n) => {
                write!(
                    f,
                    "flow destination lane {l} out of range (expected < {n}, the lane count)"
                )
            }
            RecordFault::Str(field, id, n) => write!(
                f,
                "{field} string id {id} out of range (expected < {n}, the string count)"
            ),
            RecordFault::Backwards(s, e) => {
                write!(
                    f,
                    "span ends before it starts (expected end >= start {s}, found end {e})"
                )
            }
        }
    }
}

/// One lane table entry as it lies on disk.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct RawLane {
    pub process: U32,
    pub thread: U32,
    pub kind: U16,
    pub reserved: U16,
}

/// One metadata table entry as it lies on disk.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct RawMeta {
    pub key: U32,
    pub value: U32,
}

const _: () = assert!(size_of::<RawHeader>() == HEADER_SIZE as usize);
const _: () = assert!(size_of::<RawRecord>() == RECORD_SIZE as usize);
const _: () = assert!(size_of::<RawLane>() == LANE_ENTRY_SIZE as usize);
const _: () = assert!(size_of::<RawMeta>() == META_ENTRY_SIZE as usize);

/// The 64-bit checksum of `bytes` ([`gearsim_isa::checksum`], shared with the `.om` format);
/// the body checksum (header offset 88) is this over the bytes from offset 96 to the end of the
/// file.
///
/// The bytes are read as little-endian 64-bit words, the last one zero-padded;
/// `h = CHECKSUM_SEED`, then for every word `h = (h ^ w).wrapping_mul(CHECKSUM_PRIME)
/// .rotate_left(29)`, and finally `h ^= bytes.len()`.
pub fn checksum(bytes: &[u8]) -> u64 {
    gearsim_isa::checksum::checksum(bytes)
}

/// The header checksum (header offset 68) of a 96-byte header: [`checksum`], folded to 32
/// bits by xor of its halves, over the header with the `header_checksum` field itself
/// ([`HEADER_CHECKSUM_FIELD`]) taken as zero. Whatever that field holds does not matter.
pub fn header_checksum(header: &[u8; HEADER_SIZE as usize]) -> u32 {
    let mut bytes = *header;
    bytes[HEADER_CHECKSUM_FIELD].fill(0);
    let h = checksum(&bytes);
    (h ^ (h >> 32)) as u32
}

pub(crate) use gearsim_isa::checksum::Checksum;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_checksum_matches_one_shot() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let whole = checksum(&data);
        for split in [0, 1, 3, 7, 8, 9, 15, 16, 17, 500, 999, 1000] {
            let mut c = Checksum::new();
            let (a, b) = data.split_at(split);
            for piece in a.chunks(3) {
                c.update(piece);
            }
            c.update(b);
            assert_eq!(c.finish(), whole, "split at {split}");
        }
    }

    #[test]
    fn checksum_of_empty_body_is_the_seed() {
        assert_eq!(checksum(&[]), CHECKSUM_SEED);
    }

    #[test]
    fn checksum_known_value() {
        // One word 1: h = ((seed ^ 1) * prime).rotl(29) ^ 8.
        let expected = ((CHECKSUM_SEED ^ 1).wrapping_mul(CHECKSUM_PRIME)).rotate_left(29) ^ 8;
        assert_eq!(checksum(&1u64.to_le_bytes()), expected);
        // A partial word is zero-padded but the true length is mixed in at the end.
        let expected = ((CHECKSUM_SEED ^ 1).wrapping_mul(CHECKSUM_PRIME)).rotate_left(29) ^ 1;
        assert_eq!(checksum(&[1]), expected);
    }

    #[test]
    fn header_checksum_ignores_its_own_field() {
        let mut header = [0u8; HEADER_SIZE as usize];
        header[..8].copy_from_slice(&MAGIC);
        let sum = header_checksum(&header);
        let h = checksum(&header);
        assert_eq!(u64::from(sum), (h ^ (h >> 32)) & 0xffff_ffff);
        header[HEADER_CHECKSUM_FIELD].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(header_checksum(&header), sum);
        header[10] ^= 1;
        assert_ne!(header_checksum(&header), sum);
    }

    #[test]
    fn placeholder_is_sealed() {
        let placeholder = RawHeader::placeholder();
        assert_eq!(
            placeholder.header_checksum.get(),
            placeholder.computed_header_checksum()
        );
        assert_eq!(
            &placeholder.as_bytes()[HEADER_CHECKSUM_FIELD],
            &placeholder.header_checksum.get().to_le_bytes()
        );
    }
}
