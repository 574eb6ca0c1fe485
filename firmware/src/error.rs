//! Errors of the device: misuse of its API by the host, bad task streams, kernel parameter
//! errors, and faults of the simulated hardware.

use gearsim_sim::{ChipError, OutOfRange, StopReason};
use thiserror::Error;

/// Where in a task stream something went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRef {
    /// Stream id.
    pub stream: u32,
    /// Index of the task in its stream (submission order; position in a model stream).
    pub index: u32,
}

impl std::fmt::Display for TaskRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream {} task {}", self.stream, self.index)
    }
}

/// A task that can never proceed, in a deadlock report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedTask {
    /// The task.
    pub task: TaskRef,
    /// Its kind.
    pub kind: &'static str,
    /// What it waits for.
    pub waits_for: String,
}

impl std::fmt::Display for BlockedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}) waits for {}",
            self.task, self.kind, self.waits_for
        )
    }
}

/// Everything that can go wrong on the device.
#[derive(Debug, Clone, Error)]
pub enum DeviceError {
    /// Device memory is exhausted.
    #[error(
        "out of device memory: {requested} bytes requested, largest free block {largest} bytes"
    )]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Largest free block.
        largest: u64,
    },
    /// Host memory (the simulated host's pinned buffers) is exhausted or a host address is bad.
    #[error("host memory: {0}")]
    HostMemory(String),
    /// An access outside device memory.
    #[error("device memory access [{:#x}, +{}) is outside the {} bytes of device memory", .0.addr, .0.len, .0.capacity)]
    OutOfRange(OutOfRange),
    /// A free of an address that is not the start of an allocation.
    #[error("free of {addr:#x}, which is not an allocated device buffer")]
    BadFree {
        /// The address.
        addr: u64,
    },
    /// A limit of the preset was hit (streams, events, labels, queues, SQ depth).
    #[error("{what}: limit of {limit} reached ({preset} preset, `{field}`)")]
    Limit {
        /// What ran out.
        what: &'static str,
        /// The limit.
        limit: u64,
        /// Preset name.
        preset: String,
        /// The configuration field that sets it.
        field: &'static str,
    },
    /// An id that names nothing.
    #[error("{what} {id} does not exist")]
    NoSuch {
        /// Kind of object.
        what: &'static str,
        /// The id.
        id: u64,
    },
    /// A task descriptor or its fields are invalid.
    #[error("{task}: {kind}: field `{field}`: {message}")]
    BadTask {
        /// The task.
        task: TaskRef,
        /// Task kind (or `descriptor` when the kind itself is unknown).
        kind: &'static str,
        /// Field at fault.
        field: &'static str,
        /// What is wrong, with expected and found values.
        message: String,
    },
    /// A kernel's parameters are invalid (the AI CPU kernels' KERNEL_STATUS_PARAM_INVALID).
    #[error("{task}: {kernel}: {message}")]
    KernelParam {
        /// The task.
        task: TaskRef,
        /// Kernel name.
        kernel: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A data queue is full.
    #[error("data queue {queue} is full ({capacity} items)")]
    QueueFull {
        /// Queue id.
        queue: u32,
        /// Its capacity.
        capacity: u32,
    },
    /// GetNext waited longer than its timeout.
    #[error("{task}: GetNext: data queue {queue} stayed empty for {waited_us} us (timeout)")]
    GetNextTimeout {
        /// The task.
        task: TaskRef,
        /// Queue id.
        queue: u32,
        /// How long it waited.
        waited_us: u64,
    },
    /// Streams wait for something that will never happen.
    #[error("deadlock: {}", .blocked.iter().map(|b| b.to_string()).collect::<Vec<_>>().join("; "))]
    Deadlock {
        /// Every blocked task.
        blocked: Vec<BlockedTask>,
    },
    /// The host asked the simulation to stop (the flag given to `Device::set_interrupt` was
    /// set); the device is stopped.
    #[error("interrupted at {at} ps: the host asked the simulation to stop")]
    Interrupted {
        /// Simulated time when it stopped, in picoseconds.
        at: u64,
    },
    /// A launch parameter is invalid.
    #[error("invalid launch: {0}")]
    InvalidLaunch(String),
    /// The chip refused a request.
    #[error(transparent)]
    Chip(#[from] ChipError),
    /// The simulated hardware faulted.
    #[error("{0}")]
    Fault(StopReason),
    /// A call after an error stopped the device: that error, kept whole.
    #[error("invalid launch: the device stopped earlier: {0}")]
    Stopped(Box<DeviceError>),
}

impl From<OutOfRange> for DeviceError {
    fn from(e: OutOfRange) -> DeviceError {
        DeviceError::OutOfRange(e)
    }
}
