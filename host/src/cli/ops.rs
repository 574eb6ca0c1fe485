//! `gearsim ops`: the ONNX operators the compiler supports, one per line.

use super::Failure;

/// Lists the operators.
pub fn run() -> Result<(), Failure> {
    for op in gearsim_compiler::ops::onnx_ops(&gearsim_compiler::ops::standard()) {
        say!("{op}");
    }
    Ok(())
}
