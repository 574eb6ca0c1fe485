//! The trace vocabulary: lanes, interned strings, the four record kinds and the sink trait.

/// An interned string. `StrId(0)` is always the empty string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StrId(pub u32);

impl StrId {
    /// The empty string.
    pub const EMPTY: StrId = StrId(0);
}

/// A lane (one horizontal track in a trace viewer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneId(pub u16);

/// What a lane shows; viewers and analyses group and colour by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum LaneKind {
    /// One pipe of one AI core (`core<N>` / `SCALAR`, `VECTOR`, ...).
    Pipe = 1,
    /// Counters (bandwidth, occupancy).
    Counter = 2,
    /// The firmware task scheduler.
    Scheduler = 3,
    /// One hardware stream.
    Stream = 4,
    /// One AI CPU core.
    AiCpu = 5,
    /// The host link.
    Pcie = 6,
    /// Host API calls.
    Host = 7,
    /// A device data queue.
    Queue = 8,
    /// The memory system (DMA transfers as spans).
    Memory = 9,
    /// One core's kernels, one span per block (recorded at kernel level; format 1.1).
    Kernel = 10,
}

impl LaneKind {
    /// Every kind, in numeric order.
    pub const ALL: [LaneKind; 10] = [
        LaneKind::Pipe,
        LaneKind::Counter,
        LaneKind::Scheduler,
        LaneKind::Stream,
        LaneKind::AiCpu,
        LaneKind::Pcie,
        LaneKind::Host,
        LaneKind::Queue,
        LaneKind::Memory,
        LaneKind::Kernel,
    ];

    /// The kind with this number.
    pub fn from_u16(v: u16) -> Option<LaneKind> {
        LaneKind::ALL.iter().copied().find(|k| *k as u16 == v)
    }

    /// The format minor version that introduced the kind (a file using it says at least this).
    pub fn since_minor(self) -> u16 {
        match self {
            LaneKind::Kernel => 1,
            _ => 0,
        }
    }
}

/// How much a trace holds: chosen when recording (what producers write) and when exporting
/// (what a view shows of a trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Level {
    /// Streams, host, PCIe, scheduler, AI CPU, queues and memory: no core lanes; memory
    /// counters averaged over fixed windows.
    Task,
    /// Those, plus one span per kernel block on each core and each pipe's busy share as
    /// counters.
    #[default]
    Kernel,
    /// Every record, each instruction and flag included.
    Instruction,
}

impl Level {
    /// Parses `task`, `kernel` or `instruction`.
    pub fn parse(s: &str) -> Option<Level> {
        match s {
            "task" => Some(Level::Task),
            "kernel" => Some(Level::Kernel),
            "instruction" => Some(Level::Instruction),
            _ => None,
        }
    }

    /// `task`, `kernel` or `instruction`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Task => "task",
            Level::Kernel => "kernel",
            Level::Instruction => "instruction",
        }
    }
}

/// A lane's identity: the process (group) and thread (track) names a viewer shows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lane {
    /// Group name, e.g. `core3`, `chip`, `host`.
    pub process: String,
    /// Track name, e.g. `VECTOR`, `HBM`, `stream 0`.
    pub thread: String,
    /// What the lane shows.
    pub kind: LaneKind,
}

/// One trace record. Times are picoseconds since the start of the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Record {
    /// Something that occupied a lane from `start` to `end` (an instruction on a pipe, a task
    /// on a stream, a transfer on a link).
    Span {
        /// Lane.
        lane: LaneId,
        /// Short name (mnemonic, task kind).
        name: StrId,
        /// Start tick.
        start: u64,
        /// End tick (>= start).
        end: u64,
        /// Program counter, task id or other small integer the lane defines.
        pc: u32,
        /// Longer description (disassembly, task arguments), or empty.
        detail: StrId,
    },
    /// A point event (a flag set, a label jump).
    Instant {
        /// Lane.
        lane: LaneId,
        /// Name.
        name: StrId,
        /// Tick.
        at: u64,
        /// Small integer argument.
        arg: u32,
        /// Longer description, or empty.
        detail: StrId,
    },
    /// A counter's value from `at` until its next record.
    Counter {
        /// Lane.
        lane: LaneId,
        /// Counter name.
        name: StrId,
        /// Tick.
        at: u64,
        /// Value.
        value: i64,
    },
    /// An arrow from one lane and time to another (set_flag -> wait_flag, event record -> wait).
    Flow {
        /// Name.
        name: StrId,
        /// Flow id, unique within the trace.
        id: u32,
        /// Source lane.
        from_lane: LaneId,
        /// Source tick.
        from_at: u64,
        /// Destination lane.
        to_lane: LaneId,
        /// Destination tick.
        to_at: u64,
    },
}

/// Where producers send records. Implementations intern strings and lanes and store records.
pub trait TraceSink {
    /// The id of a string, interning it on first use.
    fn intern(&mut self, s: &str) -> StrId;
    /// The id of a lane, registering it on first use (same process, thread and kind -> same id).
    fn lane(&mut self, lane: Lane) -> LaneId;
    /// Stores one record.
    fn record(&mut self, record: Record);
    /// Attaches a key/value note to the trace (chip name, clock, mode); later values win.
    fn meta(&mut self, key: &str, value: &str);
    /// Whether records are kept at all; producers skip building records when this is false.
    fn enabled(&self) -> bool {
        true
    }
    /// How much producers record (instructions and flags only at [`Level::Instruction`]).
    fn level(&self) -> Level {
        Level::Instruction
    }
}

/// A sink that stores nothing (for callers that must pass one).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl TraceSink for NullSink {
    fn intern(&mut self, _s: &str) -> StrId {
        StrId::EMPTY
    }
    fn lane(&mut self, _lane: Lane) -> LaneId {
        LaneId(0)
    }
    fn record(&mut self, _record: Record) {}
    fn meta(&mut self, _key: &str, _value: &str) {}
    fn enabled(&self) -> bool {
        false
    }
}

impl<T: TraceSink> TraceSink for Option<T> {
    fn intern(&mut self, s: &str) -> StrId {
        self.as_mut().map_or(StrId::EMPTY, |t| t.intern(s))
    }
    fn lane(&mut self, lane: Lane) -> LaneId {
        self.as_mut().map_or(LaneId(0), |t| t.lane(lane))
    }
    fn record(&mut self, record: Record) {
        if let Some(t) = self.as_mut() {
            t.record(record);
        }
    }
    fn meta(&mut self, key: &str, value: &str) {
        if let Some(t) = self.as_mut() {
            t.meta(key, value);
        }
    }
    fn enabled(&self) -> bool {
        self.as_ref().is_some_and(|t| t.enabled())
    }
    fn level(&self) -> Level {
        self.as_ref().map_or(Level::Instruction, |t| t.level())
    }
}
