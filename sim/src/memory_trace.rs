//! The chip's memory lane in a trace (`chip` / `HBM`): HBM read and write bandwidth, and the
//! L2's read hits on a chip with one, as counters in MB/s.
//!
//! At instruction level a counter record marks every change of rate (each DMA that starts or
//! ends). At task and kernel level each rate is averaged over fixed windows of [`WINDOW_PS`]
//! instead, so the lane grows with the length of the run, not with its number of DMAs — a
//! MobileNetV2 run at batch 4 changes rates six million times.

use gearsim_traces::{Lane, LaneId, LaneKind, Record, StrId, TraceSink};

use crate::hbm::Rates;

/// The averaging window of task- and kernel-level traces: 1 µs.
pub(crate) const WINDOW_PS: u64 = 1_000_000;

/// The memory lane's ids and what was last recorded on it.
pub(crate) struct MemoryLanes {
    lane: LaneId,
    /// HBM read, HBM write, L2 read hits (interned only on a chip with an L2, so traces of a
    /// chip without one are unchanged).
    names: [Option<StrId>; 3],
    /// The last value recorded per counter (bytes/s; windowed: MB/s).
    last: [Option<u64>; 3],
    /// Windowed recording's state; `None` records every change.
    window: Option<Window>,
}

/// The window being averaged.
struct Window {
    /// Its start, ps.
    start: u64,
    /// The time up to which `sum` is integrated, ps.
    at: u64,
    /// The rates since `at`, bytes/s.
    rates: [u64; 3],
    /// ∫ rate dt over `[start, at)`, in bytes/s · ps.
    sum: [u128; 3],
}

impl Window {
    fn integrate(&mut self, to: u64) {
        let dt = u128::from(to - self.at);
        for (s, r) in self.sum.iter_mut().zip(self.rates) {
            *s += u128::from(r) * dt;
        }
        self.at = to;
    }
}

fn values(r: Rates) -> [u64; 3] {
    [r.hbm_read, r.hbm_write, r.l2_read]
}

impl MemoryLanes {
    /// Registers the lane and its counter names; `windowed` averages over [`WINDOW_PS`].
    pub(crate) fn new<S: TraceSink>(sink: &mut S, l2: bool, windowed: bool) -> MemoryLanes {
        let lane = sink.lane(Lane {
            process: "chip".into(),
            thread: "HBM".into(),
            kind: LaneKind::Counter,
        });
        let read = sink.intern("HBM read MB/s");
        let write = sink.intern("HBM write MB/s");
        let l2_read = l2.then(|| sink.intern("L2 read hit MB/s"));
        MemoryLanes {
            lane,
            names: [Some(read), Some(write), l2_read],
            last: [None; 3],
            window: windowed.then_some(Window {
                start: 0,
                at: 0,
                rates: [0; 3],
                sum: [0; 3],
            }),
        }
    }

    /// The rates change to `rates` at `now` (ps).
    pub(crate) fn update<S: TraceSink>(&mut self, sink: &mut S, now: u64, rates: Rates) {
        let rates = values(rates);
        if self.window.is_none() {
            self.record(sink, now, rates);
            return;
        }
        self.close_windows(sink, now);
        if let Some(w) = self.window.as_mut() {
            w.rates = rates;
        }
    }

    /// Records the averages of the windows that end by `now`.
    fn close_windows<S: TraceSink>(&mut self, sink: &mut S, now: u64) {
        loop {
            let Some(w) = self.window.as_mut() else {
                return;
            };
            let end = w.start + WINDOW_PS;
            if now < end {
                w.integrate(now);
                return;
            }
            w.integrate(end);
            let (start, sum) = (w.start, w.sum);
            w.sum = [0; 3];
            w.start = end;
            w.at = end;
            let averages =
                sum.map(|s| u64::try_from(s / u128::from(WINDOW_PS)).unwrap_or(u64::MAX));
            self.record(sink, start, averages);
            // Whole windows at constant rates until `now`: one record for all of them.
            let Some(w) = self.window.as_mut() else {
                return;
            };
            if now >= w.start + WINDOW_PS {
                let (at, rates) = (w.start, w.rates);
                w.start += (now - w.start) / WINDOW_PS * WINDOW_PS;
                w.at = w.start;
                self.record(sink, at, rates);
            }
        }
    }

    /// Closes the window open at `now` (the end of the trace): its average over the part that
    /// passed, then the rates at `now`.
    pub(crate) fn finish<S: TraceSink>(&mut self, sink: &mut S, now: u64) {
        self.close_windows(sink, now);
        let Some(w) = self.window.as_mut() else {
            return;
        };
        if now > w.start {
            w.integrate(now);
            let len = u128::from(now - w.start);
            let (start, sum, rates) = (w.start, w.sum, w.rates);
            let averages = sum.map(|s| u64::try_from(s / len).unwrap_or(u64::MAX));
            self.record(sink, start, averages);
            self.record(sink, now, rates);
        }
    }

    /// Records each counter whose value (bytes/s) differs from the last one recorded (in
    /// windowed mode: whose MB/s figure does).
    fn record<S: TraceSink>(&mut self, sink: &mut S, at: u64, bytes_per_s: [u64; 3]) {
        let windowed = self.window.is_some();
        for ((name, last), v) in self.names.iter().zip(&mut self.last).zip(bytes_per_s) {
            let Some(name) = *name else { continue };
            let key = if windowed { v / 1_000_000 } else { v };
            if *last == Some(key) {
                continue;
            }
            *last = Some(key);
            sink.record(Record::Counter {
                lane: self.lane,
                name,
                at,
                value: (v / 1_000_000) as i64,
            });
        }
    }
}
