//! Fuzz targets of the `.gtrace` reader and of everything that reads a parsed trace (records,
//! `summary` with its text, `diff`, the Perfetto export): random bytes, damaged copies of the
//! sample trace (as found, with the header checksum recomputed, and with both checksums
//! recomputed so the structural checks are reached), and valid traces with extreme contents
//! written through the writer (times at the ends of the u64 range, huge counters, many lanes,
//! odd strings).
//!
//! A damaged trace must be an error or a trace whose every record decodes, and every analysis
//! of a trace the reader accepted must finish without a panic. `PROPTEST_CASES=20000 cargo test
//! -p gearsim-traces --release fuzz` runs them longer.

use gearsim_traces::{
    LaneId, LaneKind, Record, StrId, TraceFile, TraceSink, diff, export_perfetto, summary,
};
use proptest::prelude::*;

use crate::mutate::{boundary_value, fuzz_config, mutated, mutations, timed};
use crate::{fix_checksum, fix_header_checksum, lane, sample_trace, write_trace};

/// Reads `bytes` and, if the reader accepts them, runs every consumer of a parsed trace.
fn read_and_analyse(bytes: Vec<u8>) {
    let Ok(trace) = TraceFile::from_bytes(bytes) else {
        return;
    };
    analyse(&trace);
}

/// Everything that reads a parsed trace, with the consistency the reader promises.
fn analyse(trace: &TraceFile) {
    let records: Vec<Record> = trace.records().collect();
    assert_eq!(records.len() as u64, trace.record_count());
    for (i, r) in records.iter().enumerate() {
        assert_eq!(trace.record(i as u64).as_ref(), Some(r));
    }
    for l in trace.lanes() {
        let _ = (&l.process, &l.thread);
    }
    let _ = trace.meta();
    let s = summary(trace);
    let _ = s.to_string();
    let _ = s.window_ps();
    let _ = diff(&s, &s).to_string();
    let mut json = Vec::new();
    export_perfetto(trace, &mut json).unwrap();
}

/// What a writer may be asked to record.
#[derive(Debug, Clone)]
enum Call {
    Lane(String, String, u8),
    Meta(String, String),
    Span(u16, u64, u64, u32),
    Instant(u16, u64, u32),
    Counter(u16, u64, i64),
    Flow(u16, u64, u16, u64, u32),
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9 ]{0,8}",
        Just(String::new()),
        Just("\"quoted\" \\ back\nslash\t\u{7f}".to_string()),
        Just("ünïcödé ✓ 𝄞".to_string()),
        "\\PC{0,6}",
    ]
}

fn time() -> impl Strategy<Value = u64> {
    prop_oneof![boundary_value(), 0u64..10_000]
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        1 => (text(), text(), 0u8..12).prop_map(|(p, t, k)| Call::Lane(p, t, k)),
        1 => (text(), text()).prop_map(|(k, v)| Call::Meta(k, v)),
        3 => (any::<u16>(), time(), time(), any::<u32>()).prop_map(|(l, a, b, pc)| Call::Span(l, a, b, pc)),
        1 => (any::<u16>(), time(), any::<u32>()).prop_map(|(l, t, arg)| Call::Instant(l, t, arg)),
        1 => (any::<u16>(), time(), any::<i64>()).prop_map(|(l, t, v)| Call::Counter(l, t, v)),
        1 => (any::<u16>(), time(), any::<u16>(), time(), any::<u32>())
            .prop_map(|(a, t0, b, t1, id)| Call::Flow(a, t0, b, t1, id)),
    ]
}

/// The trace a sequence of calls writes; records naming a lane that does not exist yet name
/// lane 0 (created first), spans are ordered, so every call is one a producer could make.
fn written(calls: &[Call]) -> Vec<u8> {
    write_trace(|w| {
        let first = w.lane(lane("chip", "HBM", LaneKind::Memory));
        let mut lanes = vec![first];
        let name = w.intern("op");
        let pick = |lanes: &[LaneId], l: u16| lanes[usize::from(l) % lanes.len()];
        for c in calls {
            match c {
                Call::Lane(p, t, k) => {
                    let kind = LaneKind::from_u16(u16::from(*k) % 9 + 1).unwrap();
                    lanes.push(w.lane(lane(p, t, kind)));
                }
                Call::Meta(k, v) => w.meta(k, v),
                Call::Span(l, a, b, pc) => {
                    let detail = w.intern(&format!("pc {pc}"));
                    w.record(Record::Span {
                        lane: pick(&lanes, *l),
                        name,
                        start: *a.min(b),
                        end: *a.max(b),
                        pc: *pc,
                        detail,
                    });
                }
                Call::Instant(l, at, arg) => w.record(Record::Instant {
                    lane: pick(&lanes, *l),
                    name,
                    at: *at,
                    arg: *arg,
                    detail: StrId::EMPTY,
                }),
                Call::Counter(l, at, value) => w.record(Record::Counter {
                    lane: pick(&lanes, *l),
                    name,
                    at: *at,
                    value: *value,
                }),
                Call::Flow(a, t0, b, t1, id) => w.record(Record::Flow {
                    name,
                    id: *id,
                    from_lane: pick(&lanes, *a),
                    from_at: *t0,
                    to_lane: pick(&lanes, *b),
                    to_at: *t1,
                }),
            }
        }
    })
}

/// Which checksums a damaged trace gets recomputed.
fn reseal(bytes: &mut [u8], how: u8) {
    if bytes.len() < 96 {
        return;
    }
    match how % 3 {
        0 => {}
        1 => fix_header_checksum(bytes),
        _ => fix_checksum(bytes),
    }
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn random_bytes_are_rejected(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        timed("random trace bytes", || read_and_analyse(bytes));
    }

    #[test]
    fn random_bodies_behind_a_valid_header_are_rejected(
        body in proptest::collection::vec(any::<u8>(), 0..400),
        how in 0u8..3,
    ) {
        let mut bytes = sample_trace()[..96].to_vec();
        bytes.extend_from_slice(&body);
        reseal(&mut bytes, how);
        timed("random trace body", || read_and_analyse(bytes));
    }

    #[test]
    fn damaged_traces_are_rejected_or_read_consistently(
        damage in mutations(),
        how in 0u8..3,
    ) {
        let mut bytes = mutated(&sample_trace(), &damage);
        reseal(&mut bytes, how);
        timed("damaged trace", || read_and_analyse(bytes));
    }

    #[test]
    fn extreme_traces_are_read_and_analysed(calls in proptest::collection::vec(call(), 0..40)) {
        let bytes = written(&calls);
        timed("extreme trace", || {
            let trace = TraceFile::from_bytes(bytes).expect("the writer's own output reads back");
            analyse(&trace);
        });
    }

    #[test]
    fn damaged_extreme_traces_are_rejected_or_read_consistently(
        calls in proptest::collection::vec(call(), 0..20),
        damage in mutations(),
        how in 0u8..3,
    ) {
        let mut bytes = mutated(&written(&calls), &damage);
        reseal(&mut bytes, how);
        timed("damaged extreme trace", || read_and_analyse(bytes));
    }
}
