//! Integration tests of the instruction set: round trips, table consistency, error messages.

mod arbitrary;
mod assembler_errors;
mod reference_doc;
mod round_trip;
mod table_consistency;
mod tasks;
