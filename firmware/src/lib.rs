//! gearsim firmware: the code that runs the simulated chip the way the device's task scheduler
//! (HWTS) and runtime firmware do.
//!
//! ```text
//!   host ──submit──▶ stream SQ (descriptors in device memory)      load_model ──▶ model streams
//!                          │ fetch (task_fetch_ns, one at a time)                   ▲
//!                          ▼                                         ModelExecute / StreamActive
//!   AiCoreKernel ──blocks──▶ cores (waves)     AiCpuKernel ──▶ AI CPUs (MapIndex, GetDynamicDims, GetNext)
//!   Memcpy H2D/D2H ──▶ PCIe link   Memcpy D2D / Memset ──▶ SDMA   (all through the chip's HBM model)
//!   EventRecord / StreamWaitEvent, LabelSet / LabelGoto / LabelSwitchByIndex, ModelEndGraph
//! ```
//!
//! Every cost comes from the chip preset and shows in the trace: a scheduler lane with each
//! descriptor fetch, a lane per stream with each task, AI CPU and PCIe lanes, queue depths.
//!
//! ```
//! use gearsim_firmware::Device;
//! use gearsim_sim::{ChipConfig, ExecMode};
//! use gearsim_traces::NullSink;
//!
//! let mut dev = Device::new(ChipConfig::preset("ascend910").unwrap(), NullSink);
//! let k = dev.load_kernel(gearsim_isa::assemble("end", "k.s").unwrap()).unwrap();
//! let report = dev.launch(k, 64, &[], ExecMode::Full).unwrap();
//! assert_eq!(report.blocks, 64);
//! ```

mod aicpu;
mod context;
mod control;
mod copy;
mod device;
mod dispatch;
mod effect;
mod error;
mod firmware;
pub mod kernels;
mod lanes;
mod memory;
mod queues;
mod scheduler;
mod streams;
mod timers;

pub use device::{
    Device, DevicePtr, EventId, HostPtr, HostTensor, KernelHandle, LabelId, LaunchReport, ModelId,
    QueueId, StreamId,
};
pub use dispatch::{
    KERNEL_HEADER_BYTES, KERNEL_MAGIC, KERNEL_NEEDS_VALUES, KernelProfile, MAX_KERNEL_INSTRUCTIONS,
    core_kind_of,
};
pub use error::{BlockedTask, DeviceError, TaskRef};
pub use memory::{ALLOC_ALIGN, HOST_BASE, RESERVED_LOW};
pub use streams::TaskSpan;
