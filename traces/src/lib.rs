//! gearsim traces: typed trace records, the sink the simulator writes them into, and (in the
//! modules below) the versioned binary `.gtrace` file, its reader, exporters and analyses.
//!
//! ```text
//!  sim / firmware / host ──Record──▶ TraceSink ──▶ TraceWriter ──▶ file.gtrace
//!                                                                       │ memmap2
//!                                    Perfetto JSON ◀── export ◀── TraceFile ──▶ summary / diff
//! ```
//!
//! Only this crate serialises trace data; producers only see [`TraceSink`]. Time is an integer
//! number of picoseconds ("ticks") everywhere in a trace.
//!
//! - [`TraceWriter`] / [`TraceFileWriter`] implement [`TraceSink`] and produce a `.gtrace`
//!   file: a 96-byte header, fixed 32-byte records streamed out as they arrive, then the lane,
//!   metadata and string tables. The format is specified in `FORMAT.md` (next to this crate's
//!   `Cargo.toml`) and implemented in [`format`](mod@format).
//! - [`TraceFile`] maps a file (or takes a byte buffer), validates all of it including the
//!   header and body checksums, and then decodes records lazily.
//! - [`export_perfetto`] streams a trace as Chrome / Perfetto JSON; [`summary`] and [`diff`]
//!   compute per-lane busy time and compare two runs.
//!
//! ```
//! use gearsim_traces::{Lane, LaneKind, Record, TraceFile, TraceSink, TraceWriter};
//!
//! let mut w = TraceWriter::new(std::io::Cursor::new(Vec::new()))?;
//! let core0 = Lane { process: "core0".into(), thread: "VECTOR".into(), kind: LaneKind::Pipe };
//! let lane = w.lane(core0);
//! let vadd = w.intern("vadd");
//! w.meta("chip", "demo");
//! for i in 0..3u64 {
//!     w.record(Record::Span {
//!         lane,
//!         name: vadd,
//!         start: i * 1_000,
//!         end: i * 1_000 + 800,
//!         pc: i as u32,
//!         detail: gearsim_traces::StrId::EMPTY,
//!     });
//! }
//! let bytes = w.finish()?.into_inner();
//!
//! let trace = TraceFile::from_bytes(bytes)?;
//! assert_eq!(trace.record_count(), 3);
//! assert_eq!(trace.records().count(), 3);
//! assert_eq!(trace.lanes()[0].thread, "VECTOR");
//! assert_eq!(trace.meta_value("chip"), Some("demo"));
//! assert_eq!(gearsim_traces::summary(&trace).lanes[0].busy_ps, 2_400);
//! # Ok::<(), gearsim_traces::TraceError>(())
//! ```

mod analysis;
pub mod atomic;
mod error;
pub mod format;
mod perfetto;
mod perfetto_proto;
mod reader;
mod record;
mod view;
mod writer;

pub use analysis::{
    Diff, KernelTask, LaneDiff, LaneStats, LaneSummary, NameTotal, Phase, PhaseDiff, PhaseTotal,
    Summary, diff, format_ps, kernel_tasks, kind_name, summary,
};
pub use error::TraceError;
pub use format::Header;
pub use perfetto::{
    export_perfetto, export_perfetto_file, export_perfetto_file_filtered, export_perfetto_filtered,
};
pub use perfetto_proto::{ProtoStats, export_perfetto_proto, export_perfetto_proto_file};
pub use reader::{Records, TraceFile};
pub use record::{Lane, LaneId, LaneKind, Level, NullSink, Record, StrId, TraceSink};
pub use view::{BUSY_THREAD, Event, Filter, KERNELS_THREAD, View, busy_counter_name};
pub use writer::{TraceFileWriter, TraceWriter};
