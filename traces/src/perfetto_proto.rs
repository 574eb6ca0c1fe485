//! Export to Perfetto's native protobuf trace (`Trace { repeated TracePacket packet = 1 }`),
//! streamed packet by packet from a [`View`]. The messages are written here with prost, with the
//! field numbers of Perfetto's public schema (`protos/perfetto/trace/...`).
//!
//! One packet sequence (id 1): the first packet clears the incremental state; every track is
//! described before its first event (a process track per lane process, a child track per
//! lane, a counter track per lane and counter name); event names, categories and detail
//! strings are interned on first use. Spans become begin / end slice pairs; spans that
//! overlap on one lane go to extra child tracks (`VECTOR (2)`), so every track's slices nest.
//! Times are nanoseconds, rounded from picoseconds; each slice and counter track has a
//! sequence of its own with an incremental clock, so a packet carries the nanoseconds since
//! the previous one on its track (an event out of order goes on the global sequence with an
//! absolute time). Instructions keep their pc; their operand text stays in the `.gtrace` and
//! the JSON.

use std::collections::HashMap;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use prost::Message;

use crate::atomic::TempFile;
use crate::view::{Event, Filter, View};
use crate::{LaneKind, TraceError, TraceFile};

/// The schema's messages, only the fields gearsim writes.
#[allow(missing_docs)]
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TracePacket {
        #[prost(message, optional, tag = "6")]
        pub clock_snapshot: Option<ClockSnapshot>,
        #[prost(uint64, optional, tag = "8")]
        pub timestamp: Option<u64>,
        #[prost(uint32, optional, tag = "10")]
        pub trusted_packet_sequence_id: Option<u32>,
        #[prost(message, optional, tag = "11")]
        pub track_event: Option<TrackEvent>,
        #[prost(message, optional, tag = "12")]
        pub interned_data: Option<InternedData>,
        #[prost(uint32, optional, tag = "13")]
        pub sequence_flags: Option<u32>,
        #[prost(message, optional, tag = "59")]
        pub trace_packet_defaults: Option<TracePacketDefaults>,
        #[prost(message, optional, tag = "60")]
        pub track_descriptor: Option<TrackDescriptor>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ClockSnapshot {
        #[prost(message, repeated, tag = "1")]
        pub clocks: Vec<Clock>,
        #[prost(int32, optional, tag = "2")]
        pub primary_trace_clock: Option<i32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Clock {
        #[prost(uint32, optional, tag = "1")]
        pub clock_id: Option<u32>,
        #[prost(uint64, optional, tag = "2")]
        pub timestamp: Option<u64>,
        #[prost(bool, optional, tag = "3")]
        pub is_incremental: Option<bool>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TracePacketDefaults {
        #[prost(message, optional, tag = "11")]
        pub track_event_defaults: Option<TrackEventDefaults>,
        #[prost(uint32, optional, tag = "58")]
        pub timestamp_clock_id: Option<u32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackEventDefaults {
        #[prost(uint64, optional, tag = "11")]
        pub track_uuid: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackEvent {
        #[prost(uint64, repeated, packed = "false", tag = "3")]
        pub category_iids: Vec<u64>,
        #[prost(message, repeated, tag = "4")]
        pub debug_annotations: Vec<DebugAnnotation>,
        #[prost(int32, optional, tag = "9")]
        pub r#type: Option<i32>,
        #[prost(uint64, optional, tag = "10")]
        pub name_iid: Option<u64>,
        #[prost(uint64, optional, tag = "11")]
        pub track_uuid: Option<u64>,
        #[prost(int64, optional, tag = "30")]
        pub counter_value: Option<i64>,
        #[prost(int64, repeated, packed = "false", tag = "12")]
        pub extra_counter_values: Vec<i64>,
        #[prost(uint64, repeated, packed = "false", tag = "31")]
        pub extra_counter_track_uuids: Vec<u64>,
        #[prost(fixed64, repeated, packed = "false", tag = "47")]
        pub flow_ids: Vec<u64>,
        #[prost(fixed64, repeated, packed = "false", tag = "48")]
        pub terminating_flow_ids: Vec<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DebugAnnotation {
        #[prost(uint64, optional, tag = "1")]
        pub name_iid: Option<u64>,
        #[prost(uint64, optional, tag = "3")]
        pub uint_value: Option<u64>,
        #[prost(uint64, optional, tag = "17")]
        pub string_value_iid: Option<u64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TrackDescriptor {
        #[prost(uint64, optional, tag = "1")]
        pub uuid: Option<u64>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
        #[prost(message, optional, tag = "3")]
        pub process: Option<ProcessDescriptor>,
        #[prost(uint64, optional, tag = "5")]
        pub parent_uuid: Option<u64>,
        #[prost(message, optional, tag = "8")]
        pub counter: Option<CounterDescriptor>,
        #[prost(int32, optional, tag = "11")]
        pub child_ordering: Option<i32>,
        #[prost(int32, optional, tag = "12")]
        pub sibling_order_rank: Option<i32>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProcessDescriptor {
        #[prost(int32, optional, tag = "1")]
        pub pid: Option<i32>,
        #[prost(string, optional, tag = "6")]
        pub process_name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CounterDescriptor {
        #[prost(string, optional, tag = "6")]
        pub unit_name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InternedData {
        #[prost(message, repeated, tag = "1")]
        pub event_categories: Vec<Interned>,
        #[prost(message, repeated, tag = "2")]
        pub event_names: Vec<Interned>,
        #[prost(message, repeated, tag = "3")]
        pub debug_annotation_names: Vec<Interned>,
        #[prost(message, repeated, tag = "29")]
        pub debug_annotation_string_values: Vec<InternedBytes>,
    }

    /// EventCategory, EventName and DebugAnnotationName: `iid = 1`, `name = 2`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Interned {
        #[prost(uint64, optional, tag = "1")]
        pub iid: Option<u64>,
        #[prost(string, optional, tag = "2")]
        pub name: Option<String>,
    }

    /// InternedString: `iid = 1`, `str = 2` (bytes).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InternedBytes {
        #[prost(uint64, optional, tag = "1")]
        pub iid: Option<u64>,
        #[prost(bytes = "vec", optional, tag = "2")]
        pub str: Option<Vec<u8>>,
    }
}

/// The sequence of track descriptors, counters, instants and flows (absolute timestamps).
const GLOBAL: usize = 0;
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
const TYPE_SLICE_BEGIN: i32 = 1;
const TYPE_SLICE_END: i32 = 2;
const TYPE_INSTANT: i32 = 3;
const TYPE_COUNTER: i32 = 4;
/// `TrackDescriptor.ChildTracksOrdering.EXPLICIT`: children in `sibling_order_rank` order.
const CHILD_ORDERING_EXPLICIT: i32 = 3;
/// `BuiltinClock.BOOTTIME`: the trace clock every other clock maps to.
const BOOTTIME: u32 = 6;
/// The sequence-scoped clock of a slice track's sequence (user-defined clocks are 64..127):
/// incremental, so each packet carries the nanoseconds since the previous one.
const SLICE_CLOCK: u32 = 64;

/// Interning tables of one kind: text -> iid (from 1).
#[derive(Default)]
struct Table {
    ids: HashMap<String, u64>,
}

impl Table {
    /// The iid of `s`, and whether it is new (to be sent in this packet's interned data).
    fn get(&mut self, s: &str) -> (u64, bool) {
        if let Some(id) = self.ids.get(s) {
            return (*id, false);
        }
        let id = self.ids.len() as u64 + 1;
        self.ids.insert(s.to_string(), id);
        (id, true)
    }
}

/// One packet sequence: its interning tables and, for a slice track's, the last timestamp
/// (its clock is incremental).
#[derive(Default)]
struct Sequence {
    names: Table,
    cats: Table,
    keys: Table,
    strings: Table,
    /// `Some(last ns)` on an incremental sequence.
    last_ns: Option<u64>,
}

/// The exporter's state while streaming.
struct Writer<W: Write> {
    out: BufWriter<W>,
    /// Sequence `k` has trusted_packet_sequence_id `k + 1`.
    seqs: Vec<Sequence>,
    /// Per view lane: its slice tracks (one per row of overlapping spans): when the row is
    /// free again, its uuid and its sequence.
    rows: Vec<Vec<(u64, u64, usize)>>,
    /// Per (view lane, counter name): its counter track and that track's sequence.
    counters: HashMap<(usize, String), (u64, usize)>,
    next_uuid: u64,
    /// Per view lane: its process track.
    process_of: Vec<u64>,
    lane_names: Vec<String>,
    /// Per view lane: its kind.
    kinds: Vec<LaneKind>,
    packets: u64,
}

/// What a track event says.
struct EventFields<'e> {
    kind: i32,
    name: Option<&'e str>,
    cat: Option<&'e str>,
    annotations: Vec<(&'e str, Annotation<'e>)>,
    flows: (Vec<u64>, Vec<u64>),
    counter: Option<i64>,
    /// Values of counter tracks taken at the event's time: (track uuid, value).
    extra_counters: Vec<(u64, i64)>,
}

impl<'e> EventFields<'e> {
    fn new(kind: i32) -> EventFields<'e> {
        EventFields {
            kind,
            name: None,
            cat: None,
            annotations: Vec::new(),
            flows: (Vec::new(), Vec::new()),
            counter: None,
            extra_counters: Vec::new(),
        }
    }
}

/// Counter values carried by an event: (counter track uuid, value).
type CounterValues = Vec<(u64, i64)>;

/// A kernel span held back until the busy counters that follow it (set at its start, cleared
/// at its end, on a counter lane of the same core) are known: they ride on its begin and end
/// packets as extra counter values instead of a packet each.
struct HeldKernel<'a> {
    span: Event<'a>,
    at_start: CounterValues,
    at_end: CounterValues,
}

impl HeldKernel<'_> {
    /// The span's lane, start and end.
    fn bounds(&self) -> (usize, u64, u64) {
        match self.span {
            Event::Span {
                lane, start, end, ..
            } => (lane, start, end),
            _ => (usize::MAX, 0, 0),
        }
    }
}

impl<W: Write> Writer<W> {
    fn packet(&mut self, p: &pb::TracePacket) -> io::Result<()> {
        // Trace.packet = 1, length-delimited: key 0x0A, the length, the packet.
        self.out.write_all(&[0x0A])?;
        let mut buf = Vec::with_capacity(p.encoded_len() + 10);
        p.encode_length_delimited(&mut buf)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.packets += 1;
        self.out.write_all(&buf)
    }

    fn uuid(&mut self) -> u64 {
        self.next_uuid += 1;
        self.next_uuid
    }

    fn describe(&mut self, d: pb::TrackDescriptor) -> io::Result<()> {
        self.packet(&pb::TracePacket {
            trusted_packet_sequence_id: Some(GLOBAL as u32 + 1),
            track_descriptor: Some(d),
            ..Default::default()
        })
    }

    /// The slice track of view lane `lane` free at `start` (a new child track, with its own
    /// sequence, when every one is busy then), marked busy until `end`: (uuid, sequence).
    fn slice_track(&mut self, lane: usize, start: u64, end: u64) -> io::Result<(u64, usize)> {
        if let Some(row) = self.rows[lane].iter_mut().find(|r| r.0 <= start) {
            row.0 = end;
            return Ok((row.1, row.2));
        }
        let n = self.rows[lane].len();
        let uuid = self.uuid();
        let name = if n == 0 {
            self.lane_names[lane].clone()
        } else {
            format!("{} ({})", self.lane_names[lane], n + 1)
        };
        self.describe(pb::TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: Some(self.process_of[lane]),
            name: Some(name),
            sibling_order_rank: Some((lane * 16 + n.min(14)) as i32),
            ..Default::default()
        })?;
        let seq = self.incremental_sequence(uuid)?;
        self.rows[lane].push((end, uuid, seq));
        Ok((uuid, seq))
    }

    /// The counter track of `name` on view lane `lane` and its sequence (a new incremental
    /// one when `own_sequence`, else the global one: for values carried by other events).
    fn counter_track(
        &mut self,
        lane: usize,
        name: &str,
        own_sequence: bool,
    ) -> io::Result<(u64, usize)> {
        if let Some(t) = self.counters.get(&(lane, name.to_string())) {
            return Ok(*t);
        }
        let uuid = self.uuid();
        self.describe(pb::TrackDescriptor {
            uuid: Some(uuid),
            parent_uuid: Some(self.process_of[lane]),
            name: Some(format!("{} {name}", self.lane_names[lane])),
            counter: Some(pb::CounterDescriptor::default()),
            sibling_order_rank: Some((lane * 16 + 15) as i32),
            ..Default::default()
        })?;
        let seq = if own_sequence {
            self.incremental_sequence(uuid)?
        } else {
            GLOBAL
        };
        self.counters.insert((lane, name.to_string()), (uuid, seq));
        Ok((uuid, seq))
    }

    /// Writes a span event: begin and end on a free slice track of its lane, with counter
    /// values at each end.
    fn span(
        &mut self,
        e: Event<'_>,
        (at_start, at_end): (CounterValues, CounterValues),
    ) -> io::Result<()> {
        let Event::Span {
            lane,
            name,
            cat,
            start,
            end,
            pc,
            detail,
        } = e
        else {
            return Ok(());
        };
        let (track, seq) = self.slice_track(lane, start, end)?;
        let mut begin = EventFields::new(TYPE_SLICE_BEGIN);
        begin.name = Some(&name);
        // An instruction keeps its pc, not its text (the operands, interned per pc and per
        // core, would double the file), and no category (its track is a pipe); other spans
        // keep their category and detail.
        let instruction = self.kinds[lane] == LaneKind::Pipe && pc.is_some();
        if !instruction {
            begin.cat = Some(&cat);
        }
        if let Some(pc) = pc.filter(|_| instruction || detail.is_empty()) {
            begin
                .annotations
                .push(("pc", Annotation::Uint(u64::from(pc))));
        }
        if !instruction && !detail.is_empty() {
            begin.annotations.push(("detail", Annotation::Text(detail)));
        }
        begin.extra_counters = at_start;
        self.event(seq, start, track, begin)?;
        let mut finish = EventFields::new(TYPE_SLICE_END);
        finish.extra_counters = at_end;
        self.event(seq, end, track, finish)
    }

    /// Writes the held kernel span, if any.
    fn release(&mut self, held: &mut Option<HeldKernel<'_>>) -> io::Result<()> {
        let Some(k) = held.take() else { return Ok(()) };
        self.span(k.span, (k.at_start, k.at_end))
    }

    /// A new sequence for the events of track `uuid`: cleared state, an incremental clock
    /// starting at 0 ns of the trace clock, and the track as every event's default.
    fn incremental_sequence(&mut self, uuid: u64) -> io::Result<usize> {
        self.seqs.push(Sequence {
            last_ns: Some(0),
            ..Sequence::default()
        });
        let seq = self.seqs.len() - 1;
        self.packet(&pb::TracePacket {
            trusted_packet_sequence_id: Some(seq as u32 + 1),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE),
            clock_snapshot: Some(pb::ClockSnapshot {
                clocks: vec![
                    pb::Clock {
                        clock_id: Some(BOOTTIME),
                        timestamp: Some(0),
                        is_incremental: None,
                    },
                    pb::Clock {
                        clock_id: Some(SLICE_CLOCK),
                        timestamp: Some(0),
                        is_incremental: Some(true),
                    },
                ],
                primary_trace_clock: None,
            }),
            trace_packet_defaults: Some(pb::TracePacketDefaults {
                timestamp_clock_id: Some(SLICE_CLOCK),
                track_event_defaults: Some(pb::TrackEventDefaults {
                    track_uuid: Some(uuid),
                }),
            }),
            ..Default::default()
        })?;
        Ok(seq)
    }

    /// Sequence `seq` when an event at `at` ps keeps its timestamps in order, else the global
    /// sequence (whose timestamps are absolute).
    fn in_order(&self, seq: usize, at: u64) -> usize {
        match self.seqs[seq].last_ns {
            Some(last) if ns(at) >= last => seq,
            _ => GLOBAL,
        }
    }

    /// A track event packet at `at` ps on sequence `seq` (the track is the sequence's default
    /// on a slice track's sequence, `track` on the global one), interning its strings.
    fn event(&mut self, seq: usize, at: u64, track: u64, e: EventFields<'_>) -> io::Result<()> {
        let sq = &mut self.seqs[seq];
        let mut interned = pb::InternedData::default();
        let intern = |t: &mut Table, s: &str, list: &mut Vec<pb::Interned>| {
            let (id, fresh) = t.get(s);
            if fresh {
                list.push(pb::Interned {
                    iid: Some(id),
                    name: Some(s.to_string()),
                });
            }
            id
        };
        let name_iid = e
            .name
            .map(|n| intern(&mut sq.names, n, &mut interned.event_names));
        let cat_iid = e
            .cat
            .map(|c| intern(&mut sq.cats, c, &mut interned.event_categories));
        let mut debug = Vec::new();
        for (key, value) in &e.annotations {
            let key_iid = intern(&mut sq.keys, key, &mut interned.debug_annotation_names);
            let mut a = pb::DebugAnnotation {
                name_iid: Some(key_iid),
                ..Default::default()
            };
            match value {
                Annotation::Uint(v) => a.uint_value = Some(*v),
                Annotation::Text(s) => {
                    let (id, fresh) = sq.strings.get(s);
                    if fresh {
                        interned
                            .debug_annotation_string_values
                            .push(pb::InternedBytes {
                                iid: Some(id),
                                str: Some(s.as_bytes().to_vec()),
                            });
                    }
                    a.string_value_iid = Some(id);
                }
            }
            debug.push(a);
        }
        let t = ns(at);
        let sq_incremental = sq.last_ns.is_some();
        let (timestamp, track_uuid) = match sq.last_ns.as_mut() {
            Some(last) => {
                let delta = t.saturating_sub(*last);
                *last = t.max(*last);
                (delta, None)
            }
            None => (t, Some(track)),
        };
        let new = interned != pb::InternedData::default();
        // A sequence with defaults needs the flag on every packet; the global one only where
        // a packet refers to interned strings.
        let needs = sq_incremental || name_iid.is_some() || cat_iid.is_some() || !debug.is_empty();
        self.packet(&pb::TracePacket {
            timestamp: Some(timestamp),
            trusted_packet_sequence_id: Some(seq as u32 + 1),
            sequence_flags: needs.then_some(SEQ_NEEDS_INCREMENTAL_STATE),
            interned_data: new.then_some(interned),
            track_event: Some(pb::TrackEvent {
                category_iids: cat_iid.into_iter().collect(),
                debug_annotations: debug,
                r#type: Some(e.kind),
                name_iid,
                track_uuid,
                counter_value: e.counter,
                extra_counter_values: e.extra_counters.iter().map(|c| c.1).collect(),
                extra_counter_track_uuids: e.extra_counters.iter().map(|c| c.0).collect(),
                flow_ids: e.flows.0,
                terminating_flow_ids: e.flows.1,
            }),
            ..Default::default()
        })
    }
}

/// A debug annotation's value.
enum Annotation<'a> {
    Uint(u64),
    Text(&'a str),
}

/// Picoseconds to the nearest nanosecond.
fn ns(ps: u64) -> u64 {
    (ps + 500) / 1000
}

/// What an export wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProtoStats {
    /// Trace packets.
    pub packets: u64,
    /// Slices (begin / end pairs).
    pub slices: u64,
}

/// Writes `trace` through `filter` as a Perfetto protobuf trace to `out`, streaming.
pub fn export_perfetto_proto(
    trace: &TraceFile,
    filter: Filter,
    out: &mut impl Write,
) -> io::Result<ProtoStats> {
    let view = View::new(trace, filter);
    let mut w = Writer {
        out: BufWriter::with_capacity(1 << 16, out),
        seqs: vec![Sequence::default()],
        rows: vec![Vec::new(); view.lanes.len()],
        counters: HashMap::new(),
        next_uuid: 0,
        process_of: Vec::with_capacity(view.lanes.len()),
        lane_names: view.lanes.iter().map(|l| l.thread.clone()).collect(),
        kinds: view.lanes.iter().map(|l| l.kind).collect(),
        packets: 0,
    };
    // The global sequence's first packet clears its state and makes BOOTTIME the trace
    // clock; the process tracks follow (in lane order, children ordered explicitly).
    w.packet(&pb::TracePacket {
        trusted_packet_sequence_id: Some(GLOBAL as u32 + 1),
        sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED | SEQ_NEEDS_INCREMENTAL_STATE),
        clock_snapshot: Some(pb::ClockSnapshot {
            clocks: vec![pb::Clock {
                clock_id: Some(BOOTTIME),
                timestamp: Some(0),
                is_incremental: None,
            }],
            primary_trace_clock: Some(BOOTTIME as i32),
        }),
        ..Default::default()
    })?;
    let mut processes: HashMap<String, u64> = HashMap::new();
    for lane in &view.lanes {
        let uuid = match processes.get(&lane.process) {
            Some(u) => *u,
            None => {
                let u = w.uuid();
                let pid = processes.len() as i32 + 1;
                w.describe(pb::TrackDescriptor {
                    uuid: Some(u),
                    process: Some(pb::ProcessDescriptor {
                        pid: Some(pid),
                        process_name: Some(lane.process.clone()),
                    }),
                    child_ordering: Some(CHILD_ORDERING_EXPLICIT),
                    ..Default::default()
                })?;
                processes.insert(lane.process.clone(), u);
                u
            }
        };
        w.process_of.push(uuid);
    }
    let mut slices = 0u64;
    let process: Vec<String> = view.lanes.iter().map(|l| l.process.clone()).collect();
    let mut held: Option<HeldKernel<'_>> = None;
    view.for_each(|e| -> io::Result<()> {
        // A busy counter of the held kernel's core at its start or end joins the kernel's
        // packets; anything else first writes the held kernel out.
        if let (
            Event::Counter {
                lane,
                name,
                at,
                value,
            },
            Some(k),
        ) = (&e, held.as_ref())
        {
            let (k_lane, start, end) = k.bounds();
            if process[*lane] == process[k_lane] && (*at == start || *at == end) {
                let (track, _) = w.counter_track(*lane, name, false)?;
                if let Some(k) = held.as_mut() {
                    // A zero-length block's first value of a track is its start's.
                    let at_start =
                        *at == start && (start != end || k.at_start.iter().all(|c| c.0 != track));
                    if at_start {
                        k.at_start.push((track, *value));
                    } else {
                        k.at_end.push((track, *value));
                    }
                }
                return Ok(());
            }
        }
        w.release(&mut held)?;
        match e {
            Event::Span { lane, .. } => {
                slices += 1;
                if w.kinds[lane] == LaneKind::Kernel {
                    held = Some(HeldKernel {
                        span: e,
                        at_start: Vec::new(),
                        at_end: Vec::new(),
                    });
                    return Ok(());
                }
                w.span(e, (Vec::new(), Vec::new()))?;
            }
            Event::Instant {
                lane,
                name,
                cat,
                at,
                arg,
                detail,
            } => {
                let (track, seq) = w.slice_track(lane, at, at)?;
                let mut f = EventFields::new(TYPE_INSTANT);
                f.name = Some(name);
                if w.kinds[lane] != LaneKind::Pipe {
                    f.cat = Some(cat);
                }
                if arg != 0 {
                    f.annotations
                        .push(("arg", Annotation::Uint(u64::from(arg))));
                }
                if !detail.is_empty() && w.kinds[lane] != LaneKind::Pipe {
                    f.annotations.push(("detail", Annotation::Text(detail)));
                }
                let seq = w.in_order(seq, at);
                w.event(seq, at, track, f)?;
            }
            Event::Counter {
                lane,
                name,
                at,
                value,
            } => {
                let (track, seq) = w.counter_track(lane, &name, true)?;
                let mut f = EventFields::new(TYPE_COUNTER);
                f.counter = Some(value);
                let seq = w.in_order(seq, at);
                w.event(seq, at, track, f)?;
            }
            Event::Flow { name, id, from, to } => {
                // A flow joins two instants: one on each end's lane.
                let id = u64::from(id) + 1;
                for (end, (lane, at)) in [(false, from), (true, to)] {
                    let track = w.slice_track(lane, at, at)?.0;
                    let mut f = EventFields::new(TYPE_INSTANT);
                    f.name = Some(name);
                    f.cat = Some("flow");
                    f.flows = if end {
                        (Vec::new(), vec![id])
                    } else {
                        (vec![id], Vec::new())
                    };
                    w.event(GLOBAL, at, track, f)?;
                }
            }
        }
        Ok(())
    })?;
    w.release(&mut held)?;
    w.out.flush()?;
    Ok(ProtoStats {
        packets: w.packets,
        slices,
    })
}

/// Exports to the file `dest` through a temporary file renamed into place when complete.
pub fn export_perfetto_proto_file(
    trace: &TraceFile,
    filter: Filter,
    dest: &Path,
) -> Result<ProtoStats, TraceError> {
    let (temp, file) = TempFile::create(dest)?;
    let mut out = &file;
    let stats =
        export_perfetto_proto(trace, filter, &mut out).map_err(|source| TraceError::Io {
            path: temp.path().to_path_buf(),
            action: "write",
            source,
        })?;
    temp.sync(file)?;
    temp.persist()?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Cursor;

    use super::*;
    use crate::{Lane, LaneKind, Record, StrId, TraceSink, TraceWriter};

    /// Every slice of a protobuf trace as (track name, slice name, start ns, end ns), read
    /// back with the schema: interning per sequence, defaults, incremental clocks.
    fn slices(bytes: &[u8]) -> Vec<(String, String, u64, u64)> {
        let mut rest = bytes;
        let mut tracks: BTreeMap<u64, String> = BTreeMap::new();
        let mut names: BTreeMap<(u32, u64), String> = BTreeMap::new();
        let mut default_track: BTreeMap<u32, u64> = BTreeMap::new();
        let mut clock: BTreeMap<u32, u64> = BTreeMap::new();
        let mut open: BTreeMap<u64, Vec<(String, u64)>> = BTreeMap::new();
        let mut out = Vec::new();
        while !rest.is_empty() {
            assert_eq!(rest[0], 0x0A, "Trace.packet");
            rest = &rest[1..];
            let p = pb::TracePacket::decode_length_delimited(&mut rest).unwrap();
            let seq = p.trusted_packet_sequence_id.unwrap();
            if let Some(d) = p.trace_packet_defaults {
                default_track.insert(seq, d.track_event_defaults.unwrap().track_uuid.unwrap());
                clock.insert(seq, 0);
            }
            if let Some(d) = p.track_descriptor {
                let name = d
                    .name
                    .or(d.process.and_then(|p| p.process_name))
                    .unwrap_or_default();
                tracks.insert(d.uuid.unwrap(), name);
            }
            if let Some(i) = p.interned_data {
                for n in i.event_names {
                    names.insert((seq, n.iid.unwrap()), n.name.unwrap());
                }
            }
            let Some(e) = p.track_event else { continue };
            let t = match clock.get_mut(&seq) {
                Some(last) => {
                    *last += p.timestamp.unwrap();
                    *last
                }
                None => p.timestamp.unwrap(),
            };
            let track = e.track_uuid.or(default_track.get(&seq).copied()).unwrap();
            match e.r#type {
                Some(TYPE_SLICE_BEGIN) => {
                    let name = names[&(seq, e.name_iid.unwrap())].clone();
                    open.entry(track).or_default().push((name, t));
                }
                Some(TYPE_SLICE_END) => {
                    let (name, start) = open.get_mut(&track).unwrap().pop().unwrap();
                    out.push((tracks[&track].clone(), name, start, t));
                }
                _ => {}
            }
        }
        assert!(open.values().all(Vec::is_empty), "every slice ends");
        out.sort();
        out
    }

    #[test]
    fn the_protobuf_holds_the_json_s_spans() {
        let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        let lane = |w: &mut TraceWriter<Cursor<Vec<u8>>>, p: &str, t: &str, k| {
            w.lane(Lane {
                process: p.into(),
                thread: t.into(),
                kind: k,
            })
        };
        let vec = lane(&mut w, "core0", "VECTOR", LaneKind::Pipe);
        let dma = lane(&mut w, "chip", "DMA", LaneKind::Memory);
        let stream = lane(&mut w, "streams", "stream 1 (model 0)", LaneKind::Stream);
        let hbm = lane(&mut w, "chip", "HBM", LaneKind::Counter);
        let vadd = w.intern("vadd");
        let detail = w.intern("k: vadd v0, v1");
        let copy = w.intern("copy");
        let kernel = w.intern("AiCoreKernel");
        let task = w.intern("stream 1 task 4: AiCoreKernel /layer1/conv1/Conv");
        let bw = w.intern("bw");
        for i in 0..50u64 {
            w.record(Record::Span {
                lane: vec,
                name: vadd,
                start: i * 2_000,
                end: i * 2_000 + 1_499,
                pc: i as u32,
                detail,
            });
        }
        // Overlapping copies on one lane, out of order.
        for (s, e) in [
            (0, 10_000),
            (5_000, 20_000),
            (2_000, 3_000),
            (30_000, 31_000),
        ] {
            w.record(Record::Span {
                lane: dma,
                name: copy,
                start: s,
                end: e,
                pc: 0,
                detail: StrId::EMPTY,
            });
        }
        w.record(Record::Span {
            lane: stream,
            name: kernel,
            start: 0,
            end: 100_000,
            pc: 4,
            detail: task,
        });
        for (at, v) in [(0, 5), (50_000, 9), (20_000, 7)] {
            w.record(Record::Counter {
                lane: hbm,
                name: bw,
                at,
                value: v,
            });
        }
        let bytes = w.finish().unwrap().into_inner();
        let trace = TraceFile::from_bytes(bytes).unwrap();
        let mut proto = Vec::new();
        let stats = export_perfetto_proto(&trace, Filter::all(), &mut proto).unwrap();
        assert_eq!(stats.slices, 55);
        let mut json = Vec::new();
        crate::export_perfetto(&trace, &mut json).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let thread = |pid: &serde_json::Value, tid: &serde_json::Value| {
            events
                .iter()
                .find(|e| e["name"] == "thread_name" && e["pid"] == *pid && e["tid"] == *tid)
                .unwrap()["args"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let ps = |v: &serde_json::Value| (v.as_f64().unwrap() * 1e6).round() as u64;
        let mut expected: Vec<(String, String, u64, u64)> = events
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| {
                let (s, d) = (ps(&e["ts"]), ps(&e["dur"]));
                (
                    thread(&e["pid"], &e["tid"]),
                    e["name"].as_str().unwrap().to_string(),
                    ns(s),
                    ns(s + d),
                )
            })
            .collect();
        expected.sort();
        let mut got: Vec<(String, String, u64, u64)> = slices(&proto)
            .into_iter()
            // Overlaps went to child tracks `DMA (2)`: the lane is the name before the suffix.
            .map(|(t, n, s, e)| {
                let lane = match t.rsplit_once(" (") {
                    Some((l, k)) if k.trim_end_matches(')').parse::<u32>().is_ok() => l.to_string(),
                    _ => t,
                };
                (lane, n, s, e)
            })
            .collect();
        got.sort();
        assert_eq!(got, expected);
        assert!(
            got.iter().any(|(_, n, ..)| n == "/layer1/conv1/Conv"),
            "task spans carry their op's name"
        );
    }

    /// A recorded kernel span's busy counters ride on its begin and end packets: no packet of
    /// their own, each value on its counter track, set at the start and cleared at the end.
    #[test]
    fn busy_counters_ride_on_their_kernel_span() {
        let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        let mut lane = |t: &str, kind| {
            w.lane(Lane {
                process: "core0".into(),
                thread: t.into(),
                kind,
            })
        };
        let (kernels, busy) = (
            lane("kernels", LaneKind::Kernel),
            lane("busy", LaneKind::Counter),
        );
        let conv = w.intern("conv");
        let names = [w.intern("CUBE busy %"), w.intern("MTE2 busy %")];
        for (i, (start, end)) in [(1_000u64, 9_000u64), (9_000, 9_000)]
            .into_iter()
            .enumerate()
        {
            w.record(Record::Span {
                lane: kernels,
                name: conv,
                start,
                end,
                pc: i as u32,
                detail: StrId::EMPTY,
            });
            for (at, values) in [(start, [60, 30 + i as i64]), (end, [0, 0])] {
                for (name, value) in names.iter().zip(values) {
                    w.record(Record::Counter {
                        lane: busy,
                        name: *name,
                        at,
                        value,
                    });
                }
            }
        }
        let trace = TraceFile::from_bytes(w.finish().unwrap().into_inner()).unwrap();
        let mut proto = Vec::new();
        export_perfetto_proto(&trace, Filter::all(), &mut proto).unwrap();
        let mut rest = proto.as_slice();
        let mut tracks = BTreeMap::new();
        let mut carried = Vec::new();
        while !rest.is_empty() {
            rest = &rest[1..];
            let p = pb::TracePacket::decode_length_delimited(&mut rest).unwrap();
            if let Some(d) = p.track_descriptor {
                tracks.insert(d.uuid.unwrap(), d.name.unwrap_or_default());
            }
            let Some(e) = p.track_event else { continue };
            assert_ne!(e.r#type, Some(TYPE_COUNTER), "no counter packet of its own");
            assert_eq!(
                e.extra_counter_values.len(),
                e.extra_counter_track_uuids.len()
            );
            let values: Vec<(String, i64)> = e
                .extra_counter_track_uuids
                .iter()
                .zip(&e.extra_counter_values)
                .map(|(t, v)| (tracks[t].clone(), *v))
                .collect();
            carried.push((e.r#type.unwrap(), values));
        }
        let pair = |a: i64, b: i64| {
            vec![
                ("busy CUBE busy %".to_string(), a),
                ("busy MTE2 busy %".to_string(), b),
            ]
        };
        assert_eq!(
            carried,
            vec![
                (TYPE_SLICE_BEGIN, pair(60, 30)),
                (TYPE_SLICE_END, pair(0, 0)),
                // A zero-length block: its start values, then its end values.
                (TYPE_SLICE_BEGIN, pair(60, 31)),
                (TYPE_SLICE_END, pair(0, 0)),
            ]
        );
    }
}
