//! Tests of the compiler on its own (no chip): ONNX import, the op registry's shape inference
//! and folding, and atc's option checks with GE's E-codes. Lowerings and whole models are
//! tested in `gearsim-host`, which can run them on the simulator.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod onnx_import;
mod ops;
mod options;

/// ONNX models built in code (shared with `gearsim-host`'s tests, which use all of it).
#[allow(dead_code)]
#[path = "../support/onnx_build.rs"]
mod onnx_build;
