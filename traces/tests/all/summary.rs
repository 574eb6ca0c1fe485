//! Summaries (busy time as the union of spans, per-name totals) and diffs of two summaries.

use gearsim_traces::{
    LaneId, LaneKind, LaneStats, Record, StrId, Summary, TraceFile, TraceSink, diff, summary,
};
use proptest::prelude::*;

use crate::{lane, sample_trace, span, write_trace};

/// Summarises a trace of spans `(lane, name, start, end)` on lanes `core0/P<n>`.
fn summarise(lanes: usize, spans: &[(u16, &str, u64, u64)]) -> Summary {
    let bytes = write_trace(|w| {
        for i in 0..lanes {
            w.lane(lane("core0", &format!("P{i}"), LaneKind::Pipe));
        }
        for &(l, name, start, end) in spans {
            let n = w.intern(name);
            w.record(span(LaneId(l), n, start, end));
        }
    });
    summary(&TraceFile::from_bytes(bytes).unwrap())
}

#[test]
fn busy_time_counts_overlaps_once() {
    // Overlapping, nested, adjacent and empty spans, in order of start.
    let s = summarise(
        1,
        &[
            (0, "a", 0, 10),
            (0, "a", 5, 15),
            (0, "b", 6, 7),
            (0, "a", 15, 20),
            (0, "c", 30, 30),
            (0, "b", 40, 50),
        ],
    );
    let l = &s.lanes[0];
    assert_eq!(l.spans, 6);
    assert_eq!(l.busy_ps, 20 + 10);
    assert_eq!((l.first_start, l.last_end), (Some(0), Some(50)));
    assert_eq!((s.start, s.end, s.window_ps()), (Some(0), Some(50), 50));
}

#[test]
fn busy_time_is_exact_for_spans_out_of_order() {
    let in_order = [
        (0, "a", 0, 10),
        (0, "a", 5, 15),
        (0, "a", 20, 30),
        (0, "a", 25, 26),
    ];
    let shuffled = [
        (0, "a", 20, 30),
        (0, "a", 5, 15),
        (0, "a", 25, 26),
        (0, "a", 0, 10),
    ];
    let a = summarise(1, &in_order);
    let b = summarise(1, &shuffled);
    assert_eq!(a.lanes[0].busy_ps, 25);
    assert_eq!(a, b);
}

#[test]
fn lanes_are_independent() {
    // Lane 1 goes out of order, lane 0 stays ordered; each keeps its own union.
    let s = summarise(
        3,
        &[
            (0, "x", 0, 4),
            (1, "y", 10, 20),
            (0, "x", 2, 8),
            (1, "y", 0, 5),
            (1, "y", 3, 12),
        ],
    );
    assert_eq!(s.lanes[0].busy_ps, 8);
    assert_eq!(s.lanes[1].busy_ps, 20);
    assert_eq!(s.lanes[2].busy_ps, 0);
    assert_eq!(s.lanes[2].spans, 0);
    assert_eq!((s.lanes[2].first_start, s.lanes[2].last_end), (None, None));
}

#[test]
fn names_are_totalled_and_ranked() {
    let s = summarise(
        2,
        &[
            (0, "small", 0, 1),
            (0, "big", 0, 100),
            (1, "big", 50, 150),
            (1, "mid", 0, 60),
            (1, "aaa", 0, 60),
        ],
    );
    let names: Vec<(&str, u64, u64)> = s
        .names
        .iter()
        .map(|n| (n.name.as_str(), n.count, n.total_ps))
        .collect();
    assert_eq!(
        names,
        vec![
            ("big", 2, 200),
            ("aaa", 1, 60),
            ("mid", 1, 60),
            ("small", 1, 1)
        ]
    );
}

#[test]
fn window_covers_every_record_kind() {
    let bytes = write_trace(|w| {
        let l = w.lane(lane("chip", "HBM", LaneKind::Counter));
        let n = w.intern("bw");
        w.record(Record::Counter {
            lane: l,
            name: n,
            at: 5,
            value: 1,
        });
        w.record(span(l, n, 10, 20));
        w.record(Record::Flow {
            name: n,
            id: 1,
            from_lane: l,
            from_at: 15,
            to_lane: l,
            to_at: 90,
        });
        w.record(Record::Instant {
            lane: l,
            name: n,
            at: 7,
            arg: 0,
            detail: StrId::EMPTY,
        });
    });
    let s = summary(&TraceFile::from_bytes(bytes).unwrap());
    assert_eq!((s.start, s.end), (Some(5), Some(90)));
    assert_eq!(
        (s.records, s.spans, s.instants, s.counters, s.flows),
        (4, 1, 1, 1, 1)
    );
    let empty = summary(&TraceFile::from_bytes(write_trace(|_| {})).unwrap());
    assert_eq!((empty.start, empty.end, empty.window_ps()), (None, None, 0));
    assert!(empty.to_string().contains("window: - to - (0 ps)"));
}

#[test]
fn summary_prints_an_aligned_table() {
    let s = summarise(
        2,
        &[(0, "vadd", 0, 1_500_000), (1, "vmul", 1_000_000, 2_000_000)],
    );
    let text = s.to_string();
    let expected = "\
records: 2 (2 spans, 0 instants, 0 counters, 0 flows); lanes: 2
window: 0 ps to 2 us (2 us)

process  thread  kind  spans    busy  busy%  first    last
core0    P0      pipe      1  1.5 us  75.0%   0 ps  1.5 us
core0    P1      pipe      1    1 us  50.0%   1 us    2 us

top span names by total duration:
name  count   total  share
vadd      1  1.5 us  60.0%
vmul      1    1 us  40.0%
";
    assert_eq!(text, expected, "\n{text}");
}

#[test]
fn sample_summary_is_consistent() {
    let s = summary(&TraceFile::from_bytes(sample_trace()).unwrap());
    assert_eq!(s.lanes.len(), 3);
    assert_eq!(s.lanes[0].busy_ps, 1_234_567 - 1_000);
    assert_eq!(s.lanes[2].spans, 1);
    assert_eq!(s.lanes[2].busy_ps, 0);
    assert_eq!((s.start, s.end), (Some(0), Some(1_234_567)));
}

#[test]
fn diff_matches_lanes_by_process_and_thread() {
    let bytes_a = write_trace(|w| {
        let v = w.lane(lane("core0", "VECTOR", LaneKind::Pipe));
        let s = w.lane(lane("core0", "SCALAR", LaneKind::Pipe));
        let old = w.lane(lane("core1", "VECTOR", LaneKind::Pipe));
        let n = w.intern("op");
        w.record(span(v, n, 0, 1_000));
        w.record(span(s, n, 0, 500));
        w.record(span(old, n, 0, 10));
    });
    let bytes_b = write_trace(|w| {
        // Different lane order and a new lane; SCALAR changes kind but still matches.
        let new = w.lane(lane("core2", "CUBE", LaneKind::Pipe));
        let s = w.lane(lane("core0", "SCALAR", LaneKind::Stream));
        let v = w.lane(lane("core0", "VECTOR", LaneKind::Pipe));
        let n = w.intern("op");
        w.record(span(v, n, 0, 600));
        w.record(span(v, n, 700, 1_200));
        w.record(span(s, n, 0, 500));
        w.record(span(new, n, 0, 7));
    });
    let a = summary(&TraceFile::from_bytes(bytes_a).unwrap());
    let b = summary(&TraceFile::from_bytes(bytes_b).unwrap());
    let d = diff(&a, &b);

    let matched: Vec<(&str, &str, i128, i128)> = d
        .matched()
        .map(|l| {
            (
                l.process.as_str(),
                l.thread.as_str(),
                l.busy_delta(),
                l.span_delta(),
            )
        })
        .collect();
    assert_eq!(
        matched,
        vec![("core0", "VECTOR", 100, 1), ("core0", "SCALAR", 0, 0)]
    );
    let only_a: Vec<_> = d
        .only_in_base()
        .map(|l| (l.process.as_str(), l.base))
        .collect();
    assert_eq!(
        only_a,
        vec![(
            "core1",
            Some(LaneStats {
                spans: 1,
                busy_ps: 10
            })
        )]
    );
    let only_b: Vec<_> = d
        .only_in_other()
        .map(|l| (l.process.as_str(), l.other))
        .collect();
    assert_eq!(
        only_b,
        vec![(
            "core2",
            Some(LaneStats {
                spans: 1,
                busy_ps: 7
            })
        )]
    );
    assert_eq!((d.base_window_ps, d.other_window_ps), (1_000, 1_200));

    let text = d.to_string();
    let expected = "\
window: base 1 ns, other 1.2 ns (+200 ps, +20.0%)

process  thread  base busy  other busy  busy delta  busy delta%  base spans  other spans  span delta
core0    VECTOR       1 ns      1.1 ns     +100 ps       +10.0%           1            2          +1
core0    SCALAR     500 ps      500 ps        0 ps        +0.0%           1            1           0

only in base:
process  thread   busy  spans
core1    VECTOR  10 ps      1

only in other:
process  thread  busy  spans
core2    CUBE    7 ps      1
";
    assert_eq!(text, expected, "\n{text}");

    // A summary compared with itself has no differences.
    let same = diff(&a, &a);
    assert!(
        same.matched()
            .all(|l| l.busy_delta() == 0 && l.span_delta() == 0)
    );
    assert_eq!(
        same.only_in_base().count() + same.only_in_other().count(),
        0
    );
}

/// Busy time by brute force: the number of unit time steps some span covers.
fn brute_force_busy(spans: &[(u64, u64)]) -> u64 {
    (0..300u64)
        .filter(|&t| spans.iter().any(|&(s, e)| s <= t && t < e))
        .count() as u64
}

proptest! {
    #[test]
    fn busy_union_matches_brute_force(
        spans in prop::collection::vec((0u64..250, 0u64..50, 0u16..2), 0..40)
    ) {
        let spans: Vec<(u16, &str, u64, u64)> =
            spans.iter().map(|&(s, len, l)| (l, "s", s, s + len)).collect();
        let s = summarise(2, &spans);
        for lane in 0..2u16 {
            let mine: Vec<(u64, u64)> =
                spans.iter().filter(|x| x.0 == lane).map(|x| (x.2, x.3)).collect();
            prop_assert_eq!(s.lanes[lane as usize].busy_ps, brute_force_busy(&mine));
            prop_assert_eq!(s.lanes[lane as usize].spans, mine.len() as u64);
        }
    }
}
