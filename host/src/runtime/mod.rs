//! The runtime: loads a `.om` onto a simulated device and runs it.
//!
//! ```text
//!   load.rs  ─ .om sections ─▶ device memory (weights, feature maps, input/output buffers,
//!              kernel images, argument arrays, label lists) ─▶ firmware model streams
//! ```
//!
//! Loading resolves every relocatable address of the task streams ([`gearsim_isa::omtask`]),
//! creates the model's labels, loads its kernels (the built-in MapIndex kernel comes from the
//! firmware for the model's table layout), writes the AI CPU argument blocks, and hands the
//! streams to `firmware::Device::load_model`. Running a model is a `ModelExecute` task on a
//! user stream.
//!
//! ```text
//!   session.rs ─ Runtime: the ACL-shaped API, the gear path (non-sink / sink)
//!      │  └──────────────▶ dynamic.rs ─ hybrid mode's op-by-op path
//!      ▼                        │
//!   copy.rs ◀───────────────────┘  host<->device copies as Memcpy tasks, counted
//!      │
//!   host_work.rs ─ what each call costs the host, on the device's timeline
//! ```

mod copy;
pub mod dynamic;
pub mod error;
mod host_work;
pub mod load;
pub mod profile;
pub mod session;

pub use dynamic::{DynamicModel, DynamicStats};
pub use error::{DynamicError, ErrorCode, RuntimeError};
pub use load::{LoadError, LoadedModel};
pub use profile::{OpRow, Phase, PipeRatios, RunProfile, TaskRow};
pub use session::{ModelId, RunPath, RunReport, Runtime, RuntimeOptions};
