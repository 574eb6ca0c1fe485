//! gearsim's simulated chip: AI cores with scalar, vector, cube and MTE pipes, their local
//! buffers, device memory with a shared bandwidth model, all driven by one deterministic event
//! queue.
//!
//! ```text
//!            +-------------------------- Chip ---------------------------+
//!            |  EventQueue (tick, priority, seq)                          |
//!            |     |                                                      |
//!            |     v                                                      |
//!  firmware  |  AiCore 0..N:  scalar unit --dispatch--> V | M | MTE1 |     |
//!  --------->|                 (in order)               MTE2 | MTE3 | FIX  |
//!  start     |                 flags, UB / L1 / L0A / L0B / L0C          |
//!  blocks    |                        |  DMA (MTE2/MTE3/FIX)              |
//!            |                        v                                   |
//!            |  L2 (lines) -> Hbm: fluid max-min sharing <-> DeviceMemory |
//!            +------------------------------------------------------------+
//! ```
//!
//! `sim` does no file IO and has no global state: a [`Chip`] is built from a [`ChipConfig`] and
//! a trace sink, then stepped. Faults of the simulated hardware are [`StopReason`] values.
//!
//! ```
//! use gearsim_sim::{BlockLaunch, Chip, ChipConfig, ExecMode, Kernel, Tick};
//! use gearsim_traces::NullSink;
//!
//! let program = gearsim_isa::assemble("movi x1, 10\nl: loop x1, l\nend\n", "k.s").unwrap();
//! let mut chip = Chip::new(ChipConfig::preset("ascend910").unwrap(), NullSink);
//! let k = chip.load_kernel(Kernel::new(program)).unwrap();
//! let launch = BlockLaunch::single(k, 0, ExecMode::Full);
//! chip.start_block(0, launch, Tick::ZERO).unwrap();
//! let done = chip.run_to_idle().unwrap();
//! assert_eq!(done.len(), 1);
//! ```

mod chip;
mod config;
mod core;
mod cross;
mod event;
mod exec;
mod hbm;
mod kernel;
mod kind;
mod l2;
mod memory;
mod memory_trace;
mod setting;
mod stop;
#[cfg(test)]
mod testing;
mod time;
mod values;

pub use chip::{Chip, ChipError, RunEvent, Traffic};
pub use config::{
    AiCpuConfig, ChipConfig, ConfigError, CoreConfig, CubeConfig, HostConfig, KernelLimits,
    MemoryConfig, MteConfig, PRESETS, PcieConfig, ScalarConfig, SchedulerConfig, VectorConfig,
};
pub use core::buffers::local_buffer_bytes;
pub use core::{BlockLaunch, CoreStats, LANES, PipeStats};
pub use cross::CrossGroup;
pub use exec::{MaskState, Touch, scalar, touches};
pub use kernel::{ExecMode, Kernel};
pub use kind::{Architecture, CoreKind, CoreSlot};
pub use memory::{DeviceMemory, Guard, OutOfRange};
pub use setting::Setting;
pub use stop::{Blocked, Buffer, FlagId, StopReason};
pub use time::{Clock, Cycles, Tick};
