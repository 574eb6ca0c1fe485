//! Integration tests of the firmware: device kernels, the task scheduler's control flow,
//! streams and events, data queues, and bad input.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bad_input;
mod control_flow;
mod get_next;
mod map_index;
mod streams;
mod support;
