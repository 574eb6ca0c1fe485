//! gearsim end-to-end tests, one module per behaviour.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod determinism;
mod emergent;
mod faults;
mod kernels;
mod layering;
mod semantics;
