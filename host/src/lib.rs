//! gearsim host side: what runs on the user's machine. Today: running hand-written kernels on
//! the simulated device and the `gearsim` command line; the compiler (ONNX -> .om) and the
//! ACL-shaped runtime come next.
//!
//! ```text
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
pub mod compiler;
pub mod examples;
pub mod files;
pub mod kernel;
pub mod oprun;
