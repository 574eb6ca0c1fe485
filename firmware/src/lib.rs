//! gearsim firmware: the code that runs the simulated chip the way the device's task scheduler
//! and runtime do. Today it manages device memory and launches AI core kernels, splitting them
//! into `block_dim` blocks dispatched to idle cores in waves; streams, events, labels and the
//! gear kernels build on this.
//!
//! ```text
//!   host ──▶ Device::launch(kernel, block_dim, args)
//!               │  args array written to device memory
//!               │  blocks 0..N dispatched to the lowest free core, one per dispatch slot
//!               ▼
//!            sim::Chip ── BlockFinished ──▶ next block to the freed core ──▶ LaunchReport
//! ```
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

mod device;

pub use device::{Device, DeviceError, DevicePtr, LaunchReport};
