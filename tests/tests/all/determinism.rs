//! Determinism: the same kernel, inputs and configuration give byte-identical traces, and the
//! timing-only mode produces exactly the full mode's timeline.

use std::io::Cursor;

use gearsim_sim::ExecMode;
use gearsim_tests::*;
use gearsim_traces::{TraceFile, TraceWriter};

fn traced_vadd(mode: ExecMode) -> Vec<u8> {
    let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let mut dev = device("ascend910", sink);
    run_vadd(&mut dev, 1 << 21, 8, mode, 5);
    dev.into_sink().finish().unwrap().into_inner()
}

#[test]
fn two_runs_write_byte_identical_traces() {
    let a = traced_vadd(ExecMode::Full);
    let b = traced_vadd(ExecMode::Full);
    assert!(a.len() > 10_000);
    assert!(a == b, "two identical runs produced different traces");
}

#[test]
fn timing_only_has_the_full_mode_timeline() {
    let full = TraceFile::from_bytes(traced_vadd(ExecMode::Full)).unwrap();
    let timing = TraceFile::from_bytes(traced_vadd(ExecMode::TimingOnly)).unwrap();
    assert_eq!(full.record_count(), timing.record_count());
    assert!(full.record_count() > 1000);
    for (i, (a, b)) in full.records().zip(timing.records()).enumerate() {
        assert_eq!(a, b, "record {i} differs");
    }
    assert_eq!(full.lanes(), timing.lanes());
}
