//! gearsim end-to-end tests, one module per behaviour.

mod kernels;
