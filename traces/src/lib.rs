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

mod record;

pub use record::{Lane, LaneId, LaneKind, NullSink, Record, StrId, TraceSink};
