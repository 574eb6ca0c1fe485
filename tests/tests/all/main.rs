//! gearsim end-to-end tests, one module per behaviour.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod conformance;
mod cube_types;
mod determinism;
mod emergent;
mod faults;
mod kernels;
mod l2;
mod layering;
mod mutual_imports;
mod regression;
mod semantics;
mod separated;
mod tidy;
mod timing_only;
mod torch_models;
