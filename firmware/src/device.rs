//! A device: a chip plus device-memory allocation and kernel launch with wave dispatch.

use gearsim_isa::Program;
use gearsim_sim::{
    BlockLaunch, Chip, ChipConfig, ChipError, CoreStats, ExecMode, Kernel, LANES, OutOfRange,
    RunEvent, StopReason, Tick,
};
use gearsim_traces::TraceSink;
use thiserror::Error;

/// A device address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

/// Errors of the device API.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// Device memory is exhausted.
    #[error(
        "out of device memory: {requested} bytes requested, {available} bytes free of {capacity}"
    )]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes left.
        available: u64,
        /// Capacity.
        capacity: u64,
    },
    /// An access outside device memory.
    #[error("device memory access [{:#x}, +{}) is outside the {} bytes of device memory", .0.addr, .0.len, .0.capacity)]
    OutOfRange(OutOfRange),
    /// A launch parameter is invalid.
    #[error("invalid launch: {0}")]
    InvalidLaunch(String),
    /// The chip refused a request.
    #[error(transparent)]
    Chip(#[from] ChipError),
    /// The simulated hardware faulted.
    #[error("{0}")]
    Fault(StopReason),
}

impl From<OutOfRange> for DeviceError {
    fn from(e: OutOfRange) -> DeviceError {
        DeviceError::OutOfRange(e)
    }
}

/// What a kernel launch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchReport {
    /// Blocks run.
    pub blocks: u32,
    /// Distinct cores used.
    pub cores_used: u32,
    /// When the launch was submitted.
    pub submitted: Tick,
    /// When the first block started.
    pub first_start: Tick,
    /// When the last block finished.
    pub end: Tick,
    /// Per-core statistics accumulated during this launch (cores the launch did not use are zero).
    pub core_stats: Vec<CoreStats>,
}

impl LaunchReport {
    /// Busy cycles of each pipe (in [`gearsim_isa::Pipe::EXECUTING`] order) summed over cores.
    pub fn busy_cycles(&self) -> [u64; LANES] {
        let mut out = [0; LANES];
        for s in &self.core_stats {
            for (o, p) in out.iter_mut().zip(&s.pipes) {
                *o += p.busy_cycles;
            }
        }
        out
    }

    /// Instructions executed, summed over pipes and cores.
    pub fn instructions(&self) -> u64 {
        self.core_stats
            .iter()
            .flat_map(|s| s.pipes.iter())
            .map(|p| p.instructions)
            .sum()
    }

    /// Cube multiply-accumulates, summed over cores.
    pub fn cube_macs(&self) -> u64 {
        self.core_stats.iter().map(|s| s.cube_macs).sum()
    }
}

/// Alignment of every allocation (the runtime's 512-byte device alignment with room to spare).
pub const ALLOC_ALIGN: u64 = 512;
/// Device memory kept back at address 0 so that a null pointer is never a valid buffer.
pub const RESERVED_LOW: u64 = 2 << 20;

/// A simulated device.
pub struct Device<S: TraceSink> {
    chip: Chip<S>,
    next_free: u64,
}

impl<S: TraceSink> Device<S> {
    /// A device over a fresh chip.
    pub fn new(cfg: ChipConfig, sink: S) -> Device<S> {
        Device {
            chip: Chip::new(cfg, sink),
            next_free: RESERVED_LOW,
        }
    }

    /// The chip.
    pub fn chip(&self) -> &Chip<S> {
        &self.chip
    }

    /// The chip, mutably.
    pub fn chip_mut(&mut self) -> &mut Chip<S> {
        &mut self.chip
    }

    /// Gives back the trace sink.
    pub fn into_sink(self) -> S {
        self.chip.into_sink()
    }

    /// Allocates `bytes` of device memory.
    pub fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let capacity = self.chip.config().memory.hbm_bytes;
        let size = bytes.max(1).div_ceil(ALLOC_ALIGN) * ALLOC_ALIGN;
        let available = capacity.saturating_sub(self.next_free);
        if size > available {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                available,
                capacity,
            });
        }
        let ptr = DevicePtr(self.next_free);
        self.next_free += size;
        Ok(ptr)
    }

    /// Copies host bytes into device memory (zero time; the timed copy is the runtime's job).
    pub fn write(&mut self, ptr: DevicePtr, data: &[u8]) -> Result<(), DeviceError> {
        Ok(self.chip.write_mem(ptr.0, data)?)
    }

    /// Fills device memory with a byte value (zero time).
    pub fn fill(&mut self, ptr: DevicePtr, len: u64, byte: u8) -> Result<(), DeviceError> {
        Ok(self.chip.fill_mem(ptr.0, len, byte)?)
    }

    /// Copies device memory to host bytes (zero time).
    pub fn read(&self, ptr: DevicePtr, buf: &mut [u8]) -> Result<(), DeviceError> {
        Ok(self.chip.read_mem(ptr.0, buf)?)
    }

    /// Loads a kernel program.
    pub fn load_kernel(&mut self, program: Program) -> Result<usize, DeviceError> {
        Ok(self.chip.load_kernel(Kernel::new(program))?)
    }

    /// Launches a kernel of `block_dim` blocks with the given argument values and runs the chip
    /// until every block has finished.
    pub fn launch(
        &mut self,
        kernel: usize,
        block_dim: u32,
        args: &[u64],
        mode: ExecMode,
    ) -> Result<LaunchReport, DeviceError> {
        let cfg = self.chip.config().clone();
        if block_dim == 0 || block_dim > cfg.scheduler.max_block_dim {
            return Err(DeviceError::InvalidLaunch(format!(
                "block_dim {block_dim} is outside [1, {}]",
                cfg.scheduler.max_block_dim
            )));
        }
        let args_ptr = if args.is_empty() {
            0
        } else {
            let bytes: Vec<u8> = args.iter().flat_map(|a| a.to_le_bytes()).collect();
            let p = self.alloc(bytes.len() as u64)?;
            self.write(p, &bytes)?;
            p.0
        };
        let cores = self.chip.core_count();
        let before: Vec<CoreStats> = (0..cores).filter_map(|c| self.chip.core_stats(c)).collect();
        let ns = |n: u64| Tick(n * 1000);
        let submitted = self.chip.now();
        let mut slot = submitted + ns(cfg.scheduler.kernel_launch_ns);
        let mut next = 0u32;
        let mut first_start = None;
        let mut used = vec![false; cores as usize];
        let launch = |block_idx| BlockLaunch {
            kernel,
            block_idx,
            block_dim,
            args: args_ptr,
            mode,
        };
        for core in 0..cores.min(block_dim) {
            let at = slot.max(self.chip.core_free_at(core).unwrap_or(slot));
            self.chip.start_block(core, launch(next), at)?;
            first_start.get_or_insert(at);
            used[core as usize] = true;
            slot = at + ns(cfg.scheduler.block_dispatch_ns);
            next += 1;
        }
        let mut finished = 0u32;
        let mut end = slot;
        while finished < block_dim {
            match self.chip.run_until_event().map_err(DeviceError::Fault)? {
                RunEvent::BlockFinished { core, at } => {
                    finished += 1;
                    end = end.max(at);
                    if next < block_dim {
                        let start = at.max(slot);
                        self.chip.start_block(core, launch(next), start)?;
                        used[core as usize] = true;
                        slot = start + ns(cfg.scheduler.block_dispatch_ns);
                        next += 1;
                    }
                }
                RunEvent::Timer { .. } => {}
                RunEvent::Idle { at } => {
                    return Err(DeviceError::InvalidLaunch(format!(
                        "chip went idle at {at} with {} of {block_dim} blocks unfinished",
                        block_dim - finished
                    )));
                }
            }
        }
        let core_stats = (0..cores)
            .map(|c| {
                let now = self.chip.core_stats(c).unwrap_or_default();
                let was = before[c as usize];
                let mut d = CoreStats::default();
                for i in 0..LANES {
                    d.pipes[i].busy_cycles = now.pipes[i].busy_cycles - was.pipes[i].busy_cycles;
                    d.pipes[i].instructions = now.pipes[i].instructions - was.pipes[i].instructions;
                }
                d.cube_macs = now.cube_macs - was.cube_macs;
                d
            })
            .collect();
        Ok(LaunchReport {
            blocks: block_dim,
            cores_used: used.iter().filter(|u| **u).count() as u32,
            submitted,
            first_start: first_start.unwrap_or(submitted),
            end,
            core_stats,
        })
    }
}
