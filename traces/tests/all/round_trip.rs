//! Writing then reading gives back exactly what was written, byte-identically every time.

use std::collections::HashMap;
use std::io::{Cursor, Seek, Write};

use gearsim_traces::{
    Lane, LaneId, LaneKind, Record, StrId, TraceError, TraceFile, TraceFileWriter, TraceSink,
    TraceWriter,
};
use proptest::prelude::*;

use crate::{MemWriter, lane, sample_trace, scratch_dir, span, write_trace};

/// One call a producer might make on a sink.
#[derive(Debug, Clone)]
enum Op {
    Intern(String),
    Lane(String, String, usize),
    Meta(String, String),
    Record(RecordSpec),
}

/// A record in terms of indices into whatever strings and lanes exist when it is written.
#[derive(Debug, Clone)]
struct RecordSpec {
    kind: u8,
    lane: usize,
    to_lane: usize,
    name: usize,
    detail: usize,
    t0: u64,
    t1: u64,
    a: u32,
    b: u32,
    value: i64,
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["", "core0", "VECTOR", "vadd", "a\"b\\c", "é→\u{1}\n"])
            .prop_map(String::from),
        any::<String>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let spec = (
        (
            1u8..=4,
            any::<usize>(),
            any::<usize>(),
            any::<usize>(),
            any::<usize>(),
        ),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<i64>(),
        ),
    )
        .prop_map(
            |((kind, lane, to_lane, name, detail), (t0, t1, a, b, value))| RecordSpec {
                kind,
                lane,
                to_lane,
                name,
                detail,
                t0,
                t1,
                a,
                b,
                value,
            },
        );
    prop_oneof![
        1 => text().prop_map(Op::Intern),
        1 => (text(), text(), 0usize..LaneKind::ALL.len()).prop_map(|(p, t, k)| Op::Lane(p, t, k)),
        1 => (text(), text()).prop_map(|(k, v)| Op::Meta(k, v)),
        6 => spec.prop_map(Op::Record),
    ]
}

/// What a correct sink must end up holding after a sequence of calls.
#[derive(Debug, Default)]
struct Model {
    strings: Vec<String>,
    string_ids: HashMap<String, StrId>,
    lanes: Vec<Lane>,
    meta: Vec<(String, String)>,
    records: Vec<Record>,
}

impl Model {
    fn new() -> Model {
        let mut m = Model::default();
        m.intern("");
        m
    }

    fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = StrId(self.strings.len() as u32);
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    fn lane(&mut self, lane: Lane) -> LaneId {
        self.intern(&lane.process);
        self.intern(&lane.thread);
        if let Some(i) = self.lanes.iter().position(|l| *l == lane) {
            return LaneId(i as u16);
        }
        self.lanes.push(lane);
        LaneId(self.lanes.len() as u16 - 1)
    }

    fn meta(&mut self, key: &str, value: &str) {
        self.intern(key);
        self.intern(value);
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.to_owned(),
            None => self.meta.push((key.to_owned(), value.to_owned())),
        }
    }

    /// The record a spec stands for, given the current strings and lanes (none without lanes).
    fn record(&self, s: &RecordSpec) -> Option<Record> {
        if self.lanes.is_empty() {
            return None;
        }
        let lane = LaneId((s.lane % self.lanes.len()) as u16);
        let to_lane = LaneId((s.to_lane % self.lanes.len()) as u16);
        let name = StrId((s.name % self.strings.len()) as u32);
        let detail = StrId((s.detail % self.strings.len()) as u32);
        Some(match s.kind {
            1 => Record::Span {
                lane,
                name,
                start: s.t0.min(s.t1),
                end: s.t0.max(s.t1),
                pc: s.a,
                detail,
            },
            2 => Record::Instant {
                lane,
                name,
                at: s.t0,
                arg: s.a,
                detail,
            },
            3 => Record::Counter {
                lane,
                name,
                at: s.t0,
                value: s.value,
            },
            _ => Record::Flow {
                name,
                id: s.b,
                from_lane: lane,
                from_at: s.t0,
                to_lane,
                to_at: s.t1,
            },
        })
    }
}

/// Applies `ops` to a fresh writer and a model, checking the ids the writer hands out.
fn run(ops: &[Op]) -> (Vec<u8>, Model) {
    let mut model = Model::new();
    let bytes = write_trace(|w| {
        for op in ops {
            match op {
                Op::Intern(s) => assert_eq!(w.intern(s), model.intern(s)),
                Op::Lane(p, t, k) => {
                    let l = lane(p, t, LaneKind::ALL[*k]);
                    assert_eq!(w.lane(l.clone()), model.lane(l));
                }
                Op::Meta(k, v) => {
                    w.meta(k, v);
                    model.meta(k, v);
                }
                Op::Record(spec) => {
                    if let Some(r) = model.record(spec) {
                        w.record(r);
                        model.records.push(r);
                    }
                }
            }
        }
    });
    (bytes, model)
}

fn check_matches(trace: &TraceFile, model: &Model) {
    assert_eq!(trace.record_count(), model.records.len() as u64);
    assert!(trace.records().eq(model.records.iter().copied()));
    for (i, r) in model.records.iter().enumerate() {
        assert_eq!(trace.record(i as u64), Some(*r));
    }
    assert_eq!(trace.record(model.records.len() as u64), None);
    assert_eq!(trace.string_count() as usize, model.strings.len());
    for (i, s) in model.strings.iter().enumerate() {
        assert_eq!(trace.string(StrId(i as u32)), s);
    }
    assert_eq!(trace.try_string(StrId(model.strings.len() as u32)), None);
    assert_eq!(trace.lanes(), &model.lanes[..]);
    let meta: Vec<(String, String)> = trace
        .meta()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(meta, model.meta);
}

proptest! {
    #[test]
    fn arbitrary_call_sequences_round_trip(ops in prop::collection::vec(op(), 0..120)) {
        let (bytes, model) = run(&ops);
        let trace = TraceFile::from_bytes(bytes.clone()).unwrap();
        check_matches(&trace, &model);
        // The same calls give the same bytes.
        let (again, _) = run(&ops);
        prop_assert_eq!(bytes, again);
    }
}

#[test]
fn empty_trace_round_trips() {
    let bytes = write_trace(|_| {});
    assert_eq!(bytes.len(), 96 + 4, "header plus the empty string");
    let trace = TraceFile::from_bytes(bytes).unwrap();
    assert_eq!(trace.record_count(), 0);
    assert_eq!(trace.records().count(), 0);
    assert!(trace.lanes().is_empty());
    assert!(trace.meta().is_empty());
    assert_eq!(trace.string(StrId::EMPTY), "");
}

#[test]
fn empty_trace_matches_the_example_in_format_md() {
    let hex = "
        47 45 41 52 54 52 43 00  01 00 00 00  60 00 00 00  20 00 00 00  01 00 00 00
        00 00 00 00 00 00 00 00  60 00 00 00 00 00 00 00  00 00 00 00  00 00 00 00
        60 00 00 00 00 00 00 00  60 00 00 00 00 00 00 00  01 00 00 00  a9 61 67 b3
        04 00 00 00 00 00 00 00  64 00 00 00 00 00 00 00  ad 77 ec f5 fb 36 c0 90
        00 00 00 00";
    let expected: Vec<u8> = hex
        .split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    assert_eq!(write_trace(|_| {}), expected);
}

#[test]
fn format_md_example_is_what_the_writer_writes() {
    // Parse the dump in FORMAT.md, "Example" itself: `offset  bytes...  description` per line.
    let doc = include_str!("../../FORMAT.md");
    let example = doc.split("## Example").nth(1).unwrap();
    let dump = example.split("```text").nth(1).unwrap();
    let dump = dump.split("```").next().unwrap();
    let mut bytes = Vec::new();
    for line in dump.lines().filter(|l| !l.trim().is_empty()) {
        let mut tokens = line.split_whitespace();
        let offset = usize::from_str_radix(tokens.next().unwrap(), 16).unwrap();
        assert_eq!(offset, bytes.len(), "offset of line {line:?}");
        let is_byte = |t: &&str| t.len() == 2 && t.chars().all(|c| c.is_ascii_hexdigit());
        bytes.extend(
            tokens
                .take_while(is_byte)
                .map(|t| u8::from_str_radix(t, 16).unwrap()),
        );
    }
    assert_eq!(bytes.len(), 100);
    assert_eq!(write_trace(|_| {}), bytes);
}

#[test]
fn header_describes_the_layout() {
    let bytes = sample_trace();
    let trace = TraceFile::from_bytes(bytes.clone()).unwrap();
    let h = *trace.header();
    assert_eq!((h.version_major, h.version_minor), (1, 0));
    assert_eq!((h.header_size, h.record_size, h.flags), (96, 32, 1));
    assert_eq!(h.record_count, 5);
    assert_eq!(h.lanes_offset, 96 + 5 * 32);
    assert_eq!(h.lane_count, 3);
    assert_eq!(h.meta_offset, h.lanes_offset + 3 * 12);
    assert_eq!(h.meta_count, 2);
    assert_eq!(h.strings_offset, h.meta_offset + 2 * 8);
    assert_eq!(h.strings_offset + h.strings_bytes, h.file_size);
    assert_eq!(h.file_size, bytes.len() as u64);
    assert_eq!(h.checksum, gearsim_traces::format::checksum(&bytes[96..]));
    let header: &[u8; 96] = bytes[..96].try_into().unwrap();
    assert_eq!(
        h.header_checksum,
        gearsim_traces::format::header_checksum(header)
    );
    assert_eq!(&bytes[68..72], &h.header_checksum.to_le_bytes());
    assert_eq!(&bytes[..8], b"GEARTRC\0");
    assert_eq!(trace.meta_value("chip"), Some("demo \"npu\""));
    assert_eq!(trace.meta_value("nope"), None);
}

#[test]
fn identical_call_sequences_give_identical_bytes() {
    assert_eq!(sample_trace(), sample_trace());
}

#[test]
fn interning_and_lanes_are_deduplicated_and_meta_replaces_in_place() {
    let bytes = write_trace(|w| {
        assert_eq!(w.intern(""), StrId::EMPTY);
        let a = w.intern("a");
        assert_eq!(w.intern("a"), a);
        let l0 = w.lane(lane("p", "t", LaneKind::Pipe));
        let l1 = w.lane(lane("p", "t", LaneKind::Stream));
        assert_ne!(l0, l1);
        assert_eq!(w.lane(lane("p", "t", LaneKind::Pipe)), l0);
        w.meta("k1", "v1");
        w.meta("k2", "v2");
        w.meta("k1", "v3");
    });
    let trace = TraceFile::from_bytes(bytes).unwrap();
    assert_eq!(trace.lanes().len(), 2);
    assert_eq!(trace.meta(), vec![("k1", "v3"), ("k2", "v2")]);
}

#[test]
fn many_records_cross_the_flush_buffer() {
    const N: u64 = 50_000;
    let bytes = write_trace(|w| {
        let l = w.lane(lane("core0", "VECTOR", LaneKind::Pipe));
        let n = w.intern("op");
        for i in 0..N {
            w.record(span(l, n, i * 10, i * 10 + 5));
        }
    });
    assert_eq!(
        bytes.len() as u64,
        96 + N * 32 + 12 + 4 + (4 + 5) + (4 + 6) + (4 + 2)
    );
    let trace = TraceFile::from_bytes(bytes).unwrap();
    assert_eq!(trace.records().count() as u64, N);
    assert_eq!(
        trace.record(N - 1),
        Some(span(LaneId(0), StrId(3), (N - 1) * 10, (N - 1) * 10 + 5))
    );
}

#[test]
fn writer_starting_mid_stream_uses_offsets_relative_to_its_header() {
    let mut cursor = Cursor::new(Vec::new());
    cursor.write_all(b"prefix").unwrap();
    let mut w = TraceWriter::new(cursor).unwrap();
    let l = w.lane(lane("p", "t", LaneKind::Host));
    let n = w.intern("call");
    w.record(span(l, n, 1, 2));
    let mut cursor = w.finish().unwrap();
    assert_eq!(
        cursor.stream_position().unwrap(),
        cursor.get_ref().len() as u64
    );
    let bytes = cursor.into_inner();
    assert_eq!(&bytes[..6], b"prefix");
    let trace = TraceFile::from_bytes(bytes[6..].to_vec()).unwrap();
    assert_eq!(trace.records().collect::<Vec<_>>(), vec![span(l, n, 1, 2)]);
}

#[test]
fn file_writer_output_opens_through_mmap() {
    let dir = scratch_dir("round_trip_mmap");
    let dest = dir.join("run.gtrace");
    let mut w = TraceFileWriter::create(&dest).unwrap();
    let l = w.lane(lane("core1", "MTE2", LaneKind::Pipe));
    let n = w.intern("copy");
    for i in 0..1000 {
        w.record(span(l, n, i, i + 1));
    }
    w.finish().unwrap();
    let trace = TraceFile::open(&dest).unwrap();
    assert_eq!(trace.path(), dest);
    assert_eq!(trace.records().count(), 1000);
    assert_eq!(trace.lanes()[0].thread, "MTE2");
    assert_eq!(std::fs::read(&dest).unwrap(), {
        let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        let l = w.lane(lane("core1", "MTE2", LaneKind::Pipe));
        let n = w.intern("copy");
        for i in 0..1000 {
            w.record(span(l, n, i, i + 1));
        }
        w.finish().unwrap().into_inner()
    });
}

/// A writer whose output is on a thread of its own writes the bytes of one writing in place,
/// over many buffers, with lanes, strings and metadata added between the flushes.
#[test]
fn a_writer_thread_writes_the_bytes_of_writing_in_place() {
    let fill = |w: &mut MemWriter| {
        let mut l = w.lane(lane("core0", "CUBE", LaneKind::Pipe));
        for i in 0..200_000u64 {
            if i % 50_000 == 0 {
                l = w.lane(lane(&format!("core{}", i / 50_000), "MTE2", LaneKind::Pipe));
                w.meta("phase", &format!("{i}"));
            }
            let n = w.intern(&format!("op{}", i % 97));
            w.record(span(l, n, i * 3, i * 3 + 2));
        }
    };
    let in_place = write_trace(fill);
    let mut w = TraceWriter::new(Cursor::new(Vec::new()))
        .unwrap()
        .off_thread();
    fill(&mut w);
    let threaded = w.finish().unwrap().into_inner();
    assert!(
        in_place.len() > 20 * (1 << 18),
        "{} bytes: too few flushes",
        in_place.len()
    );
    assert!(in_place == threaded, "the writer thread changed the file");
    assert_eq!(
        TraceFile::from_bytes(threaded).unwrap().records().count(),
        200_000
    );
}

/// An error met on the writer thread is the one `finish` returns, as in place.
#[test]
fn io_errors_on_the_writer_thread_are_returned_by_finish() {
    match filled_failing_sink(1_000_000, true) {
        Err(TraceError::Io { action, source, .. }) => {
            assert_eq!(action, "write");
            assert_eq!(source.to_string(), "disk full");
        }
        other => panic!("expected an Io error, got {other:?}"),
    }
}

/// 100 000 spans written to a [`FailingSink`] of `budget` bytes, in place or (`threaded`) by
/// the writer thread: what `finish` returns.
fn filled_failing_sink(budget: usize, threaded: bool) -> Result<FailingSink, TraceError> {
    let w = TraceWriter::new(FailingSink {
        inner: Cursor::new(Vec::new()),
        budget,
    })
    .unwrap();
    let mut w = if threaded { w.off_thread() } else { w };
    let l = w.lane(lane("p", "t", LaneKind::Pipe));
    let n = w.intern("x");
    for i in 0..100_000 {
        w.record(span(l, n, i, i));
    }
    w.finish()
}

/// A seekable sink that fails every write after the first `budget` bytes.
#[derive(Debug)]
struct FailingSink {
    inner: Cursor<Vec<u8>>,
    budget: usize,
}

impl Write for FailingSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.inner.get_ref().len() + buf.len() > self.budget {
            return Err(std::io::Error::other("disk full"));
        }
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Seek for FailingSink {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(pos)
    }
}

#[test]
fn io_errors_inside_the_sink_are_returned_by_finish() {
    match filled_failing_sink(100_000, false) {
        Err(TraceError::Io {
            path,
            action,
            source,
        }) => {
            assert_eq!(path.to_str(), Some("<stream>"));
            assert_eq!(action, "write");
            assert_eq!(source.to_string(), "disk full");
        }
        other => panic!("expected an Io error, got {other:?}"),
    }
    // Failing to write even the header is reported by `new`.
    let err = TraceWriter::new(FailingSink {
        inner: Cursor::new(Vec::new()),
        budget: 10,
    })
    .unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
}

#[test]
fn a_kernel_lane_makes_a_version_1_1_file_and_nothing_else_does() {
    let write = |kind: LaneKind| {
        let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        let l = w.lane(Lane {
            process: "core0".into(),
            thread: "kernels".into(),
            kind,
        });
        let name = w.intern("conv");
        w.record(Record::Span {
            lane: l,
            name,
            start: 0,
            end: 10,
            pc: 3,
            detail: StrId::EMPTY,
        });
        w.finish().unwrap().into_inner()
    };
    let minor = |b: &[u8]| u16::from_le_bytes([b[10], b[11]]);
    let plain = write(LaneKind::Pipe);
    assert_eq!(minor(&plain), 0);
    let kernels = write(LaneKind::Kernel);
    assert_eq!(minor(&kernels), 1);
    let t = TraceFile::from_bytes(kernels.clone()).unwrap();
    assert_eq!(t.header().version_minor, 1);
    assert_eq!(t.lanes()[0].kind, LaneKind::Kernel);
    assert_eq!(t.records().count(), 1);
    // A kind newer than 1.1 is still unknown in a 1.1 file.
    let mut bad = kernels;
    let lanes_at = t.header().lanes_offset as usize;
    bad[lanes_at + 8..lanes_at + 10].copy_from_slice(&11u16.to_le_bytes());
    crate::fix_checksum(&mut bad);
    let e = TraceFile::from_bytes(bad).unwrap_err().to_string();
    assert!(
        e.contains("unknown lane kind 11 (expected 1 to 10 in a version 1.1 file)"),
        "{e}"
    );
}
