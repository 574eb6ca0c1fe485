//! Tests of the `gearsim` binary: outputs, exit codes and file handling.

mod cli;
