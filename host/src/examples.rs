//! The example kernels of `host/examples/kernels/`, compiled into the binary so that
//! `gearsim demo` works from any directory.

/// (file name, source) of every example kernel.
pub const KERNELS: &[(&str, &str)] = &[
    (
        "dma_stream.s",
        include_str!("../examples/kernels/dma_stream.s"),
    ),
    (
        "vadd_f16_db.s",
        include_str!("../examples/kernels/vadd_f16_db.s"),
    ),
    (
        "mmad_loop.s",
        include_str!("../examples/kernels/mmad_loop.s"),
    ),
    (
        "matmul_256.s",
        include_str!("../examples/kernels/matmul_256.s"),
    ),
];

/// The source of an example kernel by file name.
pub fn source(name: &str) -> Option<&'static str> {
    KERNELS.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}
