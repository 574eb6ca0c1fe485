//! gearsim end-to-end tests, one module per behaviour.

mod determinism;
mod emergent;
mod faults;
mod kernels;
mod layering;
