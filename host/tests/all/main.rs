//! Tests of the `gearsim` binary: outputs, exit codes and file handling.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli;
mod compile;
mod device_run;
mod lower;
mod onnx_build;
mod onnx_import;
mod ops;
mod options;
