//! Every kind of damage to a trace is reported as an error, never a panic or a wrong answer.

use std::io::Cursor;

use gearsim_traces::{LaneKind, Record, TraceError, TraceFile, TraceSink, TraceWriter};

use crate::{
    fix_checksum, fix_header_checksum, header_u64, lane, sample_trace, scratch_dir, span,
    write_trace,
};

// Offsets in `sample_trace()`: 5 records, 3 lanes, 2 metadata entries.
const RECORDS: usize = 96;
const LANES: usize = 96 + 5 * 32;
const META: usize = LANES + 3 * 12;
const STRINGS: usize = META + 2 * 8;

fn open(bytes: Vec<u8>) -> Result<TraceFile, TraceError> {
    TraceFile::from_bytes(bytes)
}

/// Which checksums [`damaged`] recomputes after its edit.
#[derive(Debug, Clone, Copy)]
enum Fix {
    /// None: the edit meets every check, the checksums included.
    Nothing,
    /// The header checksum only, so that a header edit reaches the checks after it.
    Header,
    /// Both checksums, so that only the structural checks can catch the edit.
    Both,
}

/// Applies `edit` to the sample trace, recomputes the checksums `fix` says, and returns the
/// error opening it gives.
fn damaged(fix: Fix, edit: impl FnOnce(&mut Vec<u8>)) -> TraceError {
    let mut bytes = sample_trace();
    edit(&mut bytes);
    match fix {
        Fix::Nothing => {}
        Fix::Header => fix_header_checksum(&mut bytes),
        Fix::Both => fix_checksum(&mut bytes),
    }
    match open(bytes) {
        Ok(_) => panic!("damaged trace was accepted"),
        Err(e) => e,
    }
}

/// Like [`damaged`] with both checksums fixed, for damage the structural checks must find;
/// returns the `Corrupt` message.
fn corrupt(edit: impl FnOnce(&mut Vec<u8>)) -> String {
    match damaged(Fix::Both, edit) {
        TraceError::Corrupt { what, .. } => what,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn put_u16(bytes: &mut [u8], at: usize, v: u16) {
    bytes[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn sample_offsets_are_as_assumed() {
    let bytes = sample_trace();
    assert_eq!(header_u64(&bytes, 32), LANES as u64);
    assert_eq!(header_u64(&bytes, 48), META as u64);
    assert_eq!(header_u64(&bytes, 56), STRINGS as u64);
}

#[test]
fn every_truncation_is_rejected() {
    let bytes = sample_trace();
    for len in 0..bytes.len() {
        match open(bytes[..len].to_vec()) {
            Err(TraceError::Truncated {
                expected, found, ..
            }) => {
                assert_eq!(found, len as u64);
                let want = if len < 96 { 96 } else { bytes.len() as u64 };
                assert_eq!(expected, want, "truncated to {len}");
            }
            other => panic!("truncated to {len}: expected Truncated, got {other:?}"),
        }
    }
}

#[test]
fn truncations_of_a_large_trace_are_rejected() {
    let bytes = write_trace(|w| {
        let l = w.lane(lane("core0", "CUBE", LaneKind::Pipe));
        let n = w.intern("mmad");
        for i in 0..20_000 {
            w.record(span(l, n, i, i + 3));
        }
    });
    let lens = (0..bytes.len())
        .step_by(997)
        .chain(bytes.len() - 300..bytes.len());
    for len in lens {
        assert!(
            matches!(
                open(bytes[..len].to_vec()),
                Err(TraceError::Truncated { .. })
            ),
            "truncated to {len}"
        );
    }
}

#[test]
fn every_single_bit_flip_is_rejected() {
    for (name, bytes) in [("sample", sample_trace()), ("empty", write_trace(|_| {}))] {
        open(bytes.clone()).unwrap();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut flipped = bytes.clone();
                flipped[i] ^= 1 << bit;
                let err = match open(flipped) {
                    Ok(_) => panic!("{name}: flip of byte {i} bit {bit} was accepted"),
                    Err(e) => e,
                };
                // The checks come in the order of FORMAT.md, "Validation": magic, major
                // version, header checksum, ..., body checksum. The 32-bit header checksum can
                // miss a flip in its last words, `file_size` and the body `checksum` (FORMAT.md,
                // "Header checksum"; in this sample bit 0 of byte 91 slips through), but those
                // fields are cross-checked against the file itself (see the next test).
                let expected = match i {
                    0..=7 => matches!(err, TraceError::BadMagic { .. }),
                    8..=9 => matches!(err, TraceError::UnsupportedVersion { .. }),
                    10..=79 => matches!(err, TraceError::HeaderChecksumMismatch { .. }),
                    80..=95 => true,
                    _ => matches!(err, TraceError::ChecksumMismatch { .. }),
                };
                assert!(expected, "{name}: flip of byte {i} bit {bit}: got {err:?}");
            }
        }
    }
}

#[test]
fn header_bit_flips_behind_a_valid_header_checksum_are_still_caught() {
    // Defence in depth: every header field except the minor version is also cross-checked
    // against the rest of the file, so a flip that somehow kept the header checksum valid would
    // still be rejected, and a flipped minor reads the same contents as a newer-minor file.
    let bytes = sample_trace();
    let records: Vec<Record> = open(bytes.clone()).unwrap().records().collect();
    for i in 0..96 {
        for bit in 0..8 {
            let mut flipped = bytes.clone();
            flipped[i] ^= 1 << bit;
            fix_header_checksum(&mut flipped);
            let result = open(flipped);
            match i {
                // The header checksum field itself: recomputing it undoes the flip.
                68..=71 => assert!(result.is_ok(), "flip {i}.{bit}"),
                // The minor version: a genuine newer minor, accepted with the same contents.
                10..=11 => {
                    let trace = result.unwrap_or_else(|e| panic!("minor flip {i}.{bit}: {e}"));
                    assert!(trace.header().version_minor > 0);
                    assert!(trace.records().eq(records.iter().copied()));
                }
                _ => assert!(result.is_err(), "flip of byte {i} bit {bit} was accepted"),
            }
        }
    }
}

#[test]
fn unfinished_traces_are_rejected() {
    // Dropped before any record reached the output: just the placeholder header.
    let mut out = Cursor::new(Vec::new());
    {
        let mut w = TraceWriter::new(&mut out).unwrap();
        let l = w.lane(lane("p", "t", LaneKind::Pipe));
        let n = w.intern("x");
        w.record(span(l, n, 0, 1));
    }
    assert!(matches!(
        open(out.into_inner()),
        Err(TraceError::NotFinished { .. })
    ));

    // Dropped after records were flushed.
    let mut out = Cursor::new(Vec::new());
    {
        let mut w = TraceWriter::new(&mut out).unwrap();
        let l = w.lane(lane("p", "t", LaneKind::Pipe));
        let n = w.intern("x");
        for i in 0..100_000 {
            w.record(span(l, n, i, i + 1));
        }
    }
    let bytes = out.into_inner();
    assert!(bytes.len() > 1_000_000);
    let err = open(bytes).unwrap_err();
    assert!(matches!(err, TraceError::NotFinished { .. }), "{err:?}");
    assert!(err.to_string().contains("unfinished trace"), "{err}");

    // And the flag itself (behind a valid header checksum; without one the header is damaged).
    assert!(matches!(
        damaged(Fix::Header, |b| b[20] = 0),
        TraceError::NotFinished { .. }
    ));
    assert!(matches!(
        damaged(Fix::Nothing, |b| b[20] = 0),
        TraceError::HeaderChecksumMismatch { .. }
    ));
}

#[test]
fn header_damage_is_named() {
    // The magic and the major version are checked before the header checksum, so they are
    // reported as such whether or not the header checksum still matches.
    for fix in [Fix::Nothing, Fix::Header] {
        match damaged(fix, |b| b[0] = b'X') {
            TraceError::BadMagic { found, .. } => assert_eq!(&found, b"XEARTRC\0"),
            other => panic!("{other:?}"),
        }
        match damaged(fix, |b| put_u16(b, 8, 2)) {
            TraceError::UnsupportedVersion {
                major: 2, minor: 0, ..
            } => {}
            other => panic!("{other:?}"),
        }
    }
    let msg = damaged(Fix::Nothing, |b| b[..8].copy_from_slice(b"{\"json\":")).to_string();
    assert!(
        msg.contains("expected magic \"GEARTRC\\0\", found \"{\\\"json\\\":\""),
        "{msg}"
    );

    // Any other header change without a matching header checksum is header damage; in
    // particular a changed minor version is not mistaken for a newer file.
    let good = sample_trace();
    let stored = u32::from_le_bytes(good[68..72].try_into().unwrap());
    match damaged(Fix::Nothing, |b| put_u16(b, 10, 1)) {
        TraceError::HeaderChecksumMismatch {
            expected, found, ..
        } => {
            assert_eq!(expected, stored);
            assert_ne!(found, stored);
        }
        other => panic!("{other:?}"),
    }
    match damaged(Fix::Nothing, |b| put_u32(b, 68, 0x1234)) {
        TraceError::HeaderChecksumMismatch {
            expected, found, ..
        } => assert_eq!((expected, found), (0x1234, stored)),
        other => panic!("{other:?}"),
    }
    let msg = damaged(Fix::Nothing, |b| put_u32(b, 68, 0x1234)).to_string();
    assert_eq!(
        msg,
        format!(
            "<memory>: header checksum mismatch: header says 0x00001234, header bytes hash to \
             {stored:#010x} (the 96-byte header is damaged)"
        )
    );

    // A newer minor that changed the record size is not readable by this version.
    match damaged(Fix::Header, |b| {
        put_u16(b, 10, 2);
        put_u32(b, 16, 64);
    }) {
        TraceError::UnsupportedVersion {
            major: 1,
            minor: 2,
            detail,
            ..
        } => {
            assert_eq!(detail, "record_size: expected 32, found 64");
        }
        other => panic!("{other:?}"),
    }
    // The same sizes in a 1.0 file are plain corruption.
    assert_eq!(
        corrupt(|b| put_u32(b, 16, 64)),
        "record_size: expected 32, found 64"
    );
    assert_eq!(
        corrupt(|b| put_u32(b, 12, 95)),
        "header_size: expected 96, found 95"
    );
    assert!(corrupt(|b| put_u32(b, 20, 3)).contains("expected only bit 0"));
}

#[test]
fn newer_minor_with_unknown_flags_is_accepted() {
    let mut bytes = sample_trace();
    put_u16(&mut bytes, 10, 7);
    put_u32(&mut bytes, 20, 1 | 1 << 5);
    fix_header_checksum(&mut bytes);
    let trace = open(bytes).unwrap();
    assert_eq!(trace.header().version_minor, 7);
    assert_eq!(trace.records().count(), 5);
}

#[test]
fn inconsistent_sizes_and_counts_are_rejected_without_huge_allocations() {
    let len = sample_trace().len();
    assert!(corrupt(|b| put_u64(b, 24, u64::MAX)).contains("record_count"));
    assert_eq!(
        corrupt(|b| put_u64(b, 24, 6)),
        format!(
            "lanes_offset (end of the records): expected {}, found {LANES}",
            LANES + 32
        )
    );
    assert!(corrupt(|b| put_u64(b, 32, 0)).contains("lanes_offset"));
    assert!(corrupt(|b| put_u32(b, 40, u32::MAX)).contains("lane table of 4294967295 entries"));
    assert!(corrupt(|b| put_u32(b, 40, 2)).contains("meta_offset"));
    assert!(corrupt(|b| put_u32(b, 44, u32::MAX)).contains("metadata table"));
    assert!(corrupt(|b| put_u64(b, 48, u64::MAX)).contains("meta_offset"));
    assert!(corrupt(|b| put_u64(b, 56, 3)).contains("strings_offset"));
    assert!(corrupt(|b| put_u32(b, 64, u32::MAX)).contains("cannot fit"));
    assert!(corrupt(|b| put_u32(b, 64, 0)).contains("expected at least 1"));
    assert!(corrupt(|b| put_u32(b, 64, 3)).contains("left over"));
    assert!(corrupt(|b| put_u64(b, 72, u64::MAX)).contains("strings_bytes"));
    let msg = corrupt(|b| b.extend_from_slice(&[0; 3]));
    assert_eq!(
        msg,
        format!(
            "header file_size: expected the file's length {}, found {len} (3 unexpected \
             trailing bytes)",
            len + 3
        )
    );
    match damaged(Fix::Header, |b| put_u64(b, 88, 0x1234)) {
        TraceError::ChecksumMismatch {
            expected, found, ..
        } => {
            assert_eq!(expected, 0x1234);
            assert_ne!(found, expected);
        }
        other => panic!("{other:?}"),
    }
    // The header checksum covers the body checksum field.
    assert!(matches!(
        damaged(Fix::Nothing, |b| put_u64(b, 88, 0x1234)),
        TraceError::HeaderChecksumMismatch { .. }
    ));
    // Body damage behind valid checksums in the header is a body checksum mismatch.
    assert!(matches!(
        damaged(Fix::Nothing, |b| b[RECORDS] ^= 1),
        TraceError::ChecksumMismatch { .. }
    ));
}

#[test]
fn bad_records_are_rejected_with_their_index() {
    let rec = |i: usize| RECORDS + 32 * i;
    // Record 0 span, 1 instant, 2 counter, 3 flow, 4 span.
    let m = corrupt(|b| b[rec(2)] = 9);
    assert!(
        m.starts_with("record 2 (at offset 160): unknown record kind 9"),
        "{m}"
    );
    let m = corrupt(|b| b[rec(4)] = 0);
    assert!(
        m.starts_with("record 4 (at offset 224): unknown record kind 0"),
        "{m}"
    );
    let m = corrupt(|b| put_u64(b, rec(0) + 16, 999));
    assert_eq!(
        m,
        "record 0 (at offset 96): span ends before it starts (expected end >= start 1000, \
         found end 999)"
    );
    let m = corrupt(|b| put_u16(b, rec(1) + 2, 3));
    assert!(
        m.starts_with("record 1 (at offset 128): lane 3 out of range"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, rec(0) + 4, 100));
    assert!(
        m.contains("record 0") && m.contains("name string id 100 out of range"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, rec(0) + 28, 100));
    assert!(
        m.contains("record 0") && m.contains("detail string id 100"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, rec(1) + 28, 100));
    assert!(
        m.contains("record 1") && m.contains("detail string id 100"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, rec(3) + 24, 3));
    assert!(
        m.contains("record 3") && m.contains("flow destination lane 3"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, rec(3) + 24, 0x1_0000));
    assert!(
        m.contains("record 3") && m.contains("flow destination lane 65536"),
        "{m}"
    );
    let m = corrupt(|b| b[rec(0) + 1] = 1);
    assert!(
        m.contains("record 0") && m.contains("reserved field byte 1"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, rec(2) + 24, 1));
    assert!(
        m.contains("record 2") && m.contains("a of a counter"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, rec(2) + 28, 1));
    assert!(
        m.contains("record 2") && m.contains("b of a counter"),
        "{m}"
    );
    let m = corrupt(|b| put_u64(b, rec(1) + 16, 1));
    assert!(
        m.contains("record 1") && m.contains("t1 of an instant"),
        "{m}"
    );
}

#[test]
fn bad_tables_are_rejected_with_their_position() {
    let lane_at = |i: usize| LANES + 12 * i;
    let m = corrupt(|b| put_u16(b, lane_at(1) + 8, 0));
    assert_eq!(
        m,
        format!(
            "lane 1 (at offset {}): unknown lane kind 0 (expected 1 to 9 in a version 1.0 file)",
            lane_at(1)
        )
    );
    // Kind 10 (a core's kernels) came with version 1.1: a 1.0 file may not use it.
    assert!(corrupt(|b| put_u16(b, lane_at(1) + 8, 10)).contains("unknown lane kind 10"));
    assert!(corrupt(|b| put_u16(b, lane_at(0) + 10, 1)).contains("lane 0"));
    let m = corrupt(|b| put_u32(b, lane_at(2), 1000));
    assert!(
        m.contains("lane 2") && m.contains("process string id: expected < "),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, lane_at(2) + 4, 1000));
    assert!(
        m.contains("lane 2") && m.contains("thread string id"),
        "{m}"
    );

    let m = corrupt(|b| put_u32(b, META + 8 + 4, 1000));
    assert!(
        m.contains("metadata entry 1") && m.contains("value string id"),
        "{m}"
    );
    let m = corrupt(|b| put_u32(b, META + 8, 1000));
    assert!(
        m.contains("metadata entry 1") && m.contains("key string id"),
        "{m}"
    );
    let m = corrupt(|b| {
        let key0 = b[META..META + 4].to_vec();
        b[META + 8..META + 12].copy_from_slice(&key0);
    });
    assert!(
        m.contains("metadata entry 1") && m.contains("\"chip\" appears twice"),
        "{m}"
    );

    // Strings: 0 is "", 1 is "core0".
    let m = corrupt(|b| b[STRINGS + 8] = 0xff);
    assert!(
        m.starts_with(&format!(
            "string 1 (at offset {}): invalid UTF-8",
            STRINGS + 4
        )),
        "{m}"
    );
    assert!(corrupt(|b| put_u32(b, STRINGS, 5)).contains("string 0: expected the empty string"));
    let m = corrupt(|b| put_u32(b, STRINGS + 4, u32::MAX));
    assert!(
        m.contains("string 1") && m.contains("runs past the end"),
        "{m}"
    );
}

#[test]
fn too_many_lanes_is_rejected() {
    // A hand-built file: no records, 65537 lanes, no metadata, the empty string only.
    let lanes = 65_537u32;
    let mut body = Vec::new();
    for _ in 0..lanes {
        body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    }
    body.extend_from_slice(&[0; 4]);
    let mut bytes = vec![0u8; 96];
    bytes[..8].copy_from_slice(b"GEARTRC\0");
    put_u16(&mut bytes, 8, 1);
    put_u32(&mut bytes, 12, 96);
    put_u32(&mut bytes, 16, 32);
    put_u32(&mut bytes, 20, 1);
    put_u64(&mut bytes, 32, 96);
    put_u32(&mut bytes, 40, lanes);
    let meta = 96 + 12 * u64::from(lanes);
    put_u64(&mut bytes, 48, meta);
    put_u64(&mut bytes, 56, meta);
    put_u32(&mut bytes, 64, 1);
    put_u64(&mut bytes, 72, 4);
    put_u64(&mut bytes, 80, meta + 4);
    bytes.extend_from_slice(&body);
    fix_checksum(&mut bytes);
    match open(bytes) {
        Err(TraceError::Corrupt { what, .. }) => {
            assert_eq!(what, "lane_count: expected at most 65536, found 65537");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn errors_name_the_file() {
    let dir = scratch_dir("corrupt_names");
    let path = dir.join("bad.gtrace");
    let mut bytes = sample_trace();
    put_u64(&mut bytes, 88, 1);
    std::fs::write(&path, &bytes).unwrap();
    let msg = TraceFile::open(&path).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{}: header checksum mismatch", path.display())),
        "{msg}"
    );
    fix_header_checksum(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    let msg = TraceFile::open(&path).unwrap_err().to_string();
    assert!(
        msg.starts_with(&format!("{}: checksum mismatch", path.display())),
        "{msg}"
    );

    let missing = dir.join("missing.gtrace");
    match TraceFile::open(&missing) {
        Err(TraceError::Io {
            path,
            action: "open",
            ..
        }) => assert_eq!(path, missing),
        other => panic!("{other:?}"),
    }

    let empty = dir.join("empty.gtrace");
    std::fs::write(&empty, b"").unwrap();
    match TraceFile::open(&empty) {
        Err(TraceError::Truncated {
            expected: 96,
            found: 0,
            path,
        }) => assert_eq!(path, empty),
        other => panic!("{other:?}"),
    }

    let msg = open(Vec::new()).unwrap_err().to_string();
    assert_eq!(msg, "<memory>: truncated trace: expected 96 bytes, found 0");
}
