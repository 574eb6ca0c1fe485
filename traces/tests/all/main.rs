//! Integration tests of the `.gtrace` writer, reader, Perfetto exporter and analyses.

// Test helpers may unwrap: a failure there is a test failure, which is what we want.
#![allow(clippy::unwrap_used)]

mod corrupt;
mod file_writer;
mod fuzz;
mod perfetto;
mod phases;
mod round_trip;
mod summary;

/// Damage shared by the fuzz targets of every crate (written once, in `isa`).
#[path = "../../../isa/tests/support/mutate.rs"]
mod mutate;

use std::io::Cursor;
use std::path::PathBuf;

use gearsim_traces::{Lane, LaneId, LaneKind, Record, StrId, TraceSink, TraceWriter};

/// A writer over an in-memory buffer.
pub type MemWriter = TraceWriter<Cursor<Vec<u8>>>;

/// Runs `f` against a fresh in-memory writer and returns the finished trace's bytes.
pub fn write_trace(f: impl FnOnce(&mut MemWriter)) -> Vec<u8> {
    let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    f(&mut w);
    w.finish().unwrap().into_inner()
}

/// A lane description.
pub fn lane(process: &str, thread: &str, kind: LaneKind) -> Lane {
    Lane {
        process: process.into(),
        thread: thread.into(),
        kind,
    }
}

/// A span record.
pub fn span(lane: LaneId, name: StrId, start: u64, end: u64) -> Record {
    Record::Span {
        lane,
        name,
        start,
        end,
        pc: 0,
        detail: StrId::EMPTY,
    }
}

/// A small trace with three lanes, metadata, awkward strings and every record kind.
pub fn sample_trace() -> Vec<u8> {
    write_trace(|w| {
        let vec = w.lane(lane("core0", "VECTOR", LaneKind::Pipe));
        let hbm = w.lane(lane("chip", "HBM", LaneKind::Memory));
        let sca = w.lane(lane("core0", "SCALAR", LaneKind::Pipe));
        w.meta("chip", "demo \"npu\"");
        w.meta("clock", "1 GHz");
        let vadd = w.intern("vadd");
        let detail = w.intern("vadd v0, v1, v2\n\t\\ tab");
        let bw = w.intern("bw");
        let flag = w.intern("set_flag");
        w.record(Record::Span {
            lane: vec,
            name: vadd,
            start: 1_000,
            end: 1_234_567,
            pc: 7,
            detail,
        });
        w.record(Record::Instant {
            lane: sca,
            name: flag,
            at: 2_000,
            arg: 3,
            detail: StrId::EMPTY,
        });
        w.record(Record::Counter {
            lane: hbm,
            name: bw,
            at: 0,
            value: -5,
        });
        w.record(Record::Flow {
            name: flag,
            id: 9,
            from_lane: sca,
            from_at: 2_000,
            to_lane: vec,
            to_at: 1_000_000,
        });
        w.record(span(sca, vadd, 500, 500));
    })
}

/// A fresh, empty directory under Cargo's per-target scratch directory.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("gearsim-traces")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The names of the files in `dir`, sorted.
pub fn dir_listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Rewrites both checksums (the body checksum, then the header checksum that covers it) after
/// a deliberate edit, so that the structural validation (rather than a checksum) must catch the
/// corruption.
pub fn fix_checksum(bytes: &mut [u8]) {
    let sum = gearsim_traces::format::checksum(&bytes[96..]);
    bytes[88..96].copy_from_slice(&sum.to_le_bytes());
    fix_header_checksum(bytes);
}

/// Rewrites only the header checksum after a deliberate header edit, leaving the body checksum
/// field as it is.
pub fn fix_header_checksum(bytes: &mut [u8]) {
    let header: &[u8; 96] = bytes[..96].try_into().unwrap();
    let sum = gearsim_traces::format::header_checksum(header);
    bytes[68..72].copy_from_slice(&sum.to_le_bytes());
}

/// Reads a little-endian u64 header field.
pub fn header_u64(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}
