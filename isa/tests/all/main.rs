//! Integration tests of the instruction set: round trips, table consistency, error messages.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod arbitrary;
mod assembler_errors;
mod build_errors;
mod build_labels;
mod build_round_trip;
mod fuzz_asm;
mod fuzz_om;
mod reference_doc;
mod round_trip;
mod table_consistency;
mod tasks;
mod units;

/// Damage shared by the fuzz targets of every crate.
#[path = "../support/mutate.rs"]
mod mutate;
