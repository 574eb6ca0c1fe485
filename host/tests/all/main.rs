//! Tests of the `gearsim` binary: outputs, exit codes and file handling.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod advise;
mod aipp;
mod calibrate;
mod cli;
mod cli_flags;
mod compile;
mod corpus;
mod device_run;
mod eval;
mod fusion;
mod fuzz_npy;
mod fuzz_om;
mod fuzz_onnx;
mod fuzz_options;
mod l2_control;
mod lower_conv;
mod lower_cube;
mod lower_elementwise;
mod lower_movement;
mod lower_pool;
mod lower_reduce;
mod lower_sweep;
mod model_numerics;
mod model_run;
mod npy;
/// ONNX models built in code (shared with the compiler crate's tests).
#[path = "../../compiler/tests/support/onnx_build.rs"]
mod onnx_build;
mod pad;
mod precision;
mod profile;
mod readme;
mod runtime;
mod separated;
mod study;
mod trace_level;
mod verify;

/// Damage shared by the fuzz targets of every crate (written once, in `isa`).
#[path = "../../../isa/tests/support/mutate.rs"]
mod mutate;
