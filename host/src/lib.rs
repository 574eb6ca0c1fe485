//! gearsim host side: what runs on the user's machine — the ACL-shaped runtime, what the
//! `gearsim` command line does around `gearsim-compiler` (ONNX → .om, atc's options), studies,
//! benches and conformance. The command line itself (`src/cli/`) is in the binary.
//!
//! ```text
//!   gearsim compile ──▶ atc ──▶ gearsim-compiler (import, gear passes, lower, emit) ──▶ verify ──▶ .om
//!   gearsim run     ──▶ runner ──▶ runtime (load, non-sink / sink / hybrid) ──▶ firmware::Device
//!   gearsim kernel run FILE.s ──▶ isa::assemble ──▶ kernel::run_kernel ──▶ firmware::Device
//!   gearsim trace export/summary/diff ──▶ traces::TraceFile
//! ```
//!
//! ```
//! use gearsim_host::kernel::{ArgSpec, parse_args};
//! let args = parse_args("x=rand:f16:1k,zeros:2048,1024").unwrap();
//! assert_eq!(args.len(), 3);
//! assert_eq!(args[2], ArgSpec::Value(1024));
//! ```

pub mod atc;
pub mod bench;
pub mod calibrate;
pub mod conformance;
pub mod demo;
pub mod examples;
pub mod files;
pub mod host_memory;
pub mod inputs;
pub mod kernel;
pub mod msprof;
pub mod npy;
pub mod oprun;
pub mod options;
pub mod pad;
pub mod runner;
pub mod runtime;
pub mod stats;
pub mod study;
pub mod target;
pub mod verify;
