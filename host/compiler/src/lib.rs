//! The compiler: an ONNX model and atc-style options in, a `.om` model out.
//!
//! ```text
//!   options.rs ─ parse + validate (GE's rules and E-codes)
//!   onnx/      ─ read .onnx (prost message structs) ─▶ ir::Model (Data / Const / ops / NetOutput)
//!   infer.rs + ops/ ─ shape inference and constant folding with an op registry
//!   gear.rs    ─ MultiBatchClonePass: MapIndex + Case with one static branch per gear
//!   layout.rs  ─ which values stay in the fractal format NC1HWC0 between convolutions
//!   memory.rs  ─ memory plan: weights once, feature maps reused, branches overlaid
//!   om.rs      ─ the .om sections
//! ```
//!
//! The compiler produces bytes and never runs the chip: it depends on `isa` and `traces` only
//! (the layering test checks its `use` lines). What it needs to know about the target chip comes
//! in a [`Target`] the command line fills from the chip preset.

// Compile errors are rich diagnostics (expected vs got, the producing chain, how to fix), so
// `OpError` / `InferError` / `CompileError` are large; they are built only on failure, where
// their size costs nothing, and clippy's size lint would flag every function returning them.
#![allow(clippy::result_large_err)]

pub mod aipp;
pub mod emit;
pub mod eval;
pub mod fusion;
pub mod gear;
pub mod infer;
pub mod ir;
pub mod layout;
pub mod lower;
pub mod memory;
pub mod mix;
pub mod onnx;
pub mod ops;
pub mod options;
pub mod pipeline;
pub mod precision;
pub mod symbolic;

/// What the compiler needs to know about the target chip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Preset name (`soc_version`).
    pub soc_version: String,
    /// Most gears the MapIndex kernel accepts.
    pub map_index_max_gears: u32,
    /// Longest gear vector the MapIndex kernel accepts.
    pub map_index_max_dims: u32,
    /// The AI cores kernels are tiled for.
    pub core: CoreSpec,
    /// atc's `--buffer_optimize`: whether launches carry L2 control sections.
    pub buffer_optimize: memory::BufferOptimize,
}

/// The AI core resources kernel tiling depends on (and the L2 the cores share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoreSpec {
    /// AI cores (kernels spread their blocks over them); on a separated chip the cube cores
    /// (AIC), which the cube kernels are tiled for.
    pub cores: u32,
    /// Cores a vector-only kernel spreads its blocks over: the AI cores on a coupled chip, the
    /// vector cores (AIV, two per AI core on the 910B) on a separated one.
    pub vector_cores: u32,
    /// Largest `block_dim` a launch may use.
    pub max_block_dim: u32,
    /// Whether results can leave L0C straight to GM (FIXPIPE); otherwise through UB.
    pub fixpipe: bool,
    /// Unified buffer bytes.
    pub ub_bytes: u64,
    /// L1 bytes.
    pub l1_bytes: u64,
    /// L0A bytes.
    pub l0a_bytes: u64,
    /// L0B bytes.
    pub l0b_bytes: u64,
    /// L0C bytes.
    pub l0c_bytes: u64,
    /// Event ids per pipe pair (how many buffers a queue can rotate through).
    pub event_ids: u8,
    /// Whether the chip's cube and vector units are separate cores (Atlas A2): a kernel that
    /// uses both becomes a MIX kernel (`mix::split`).
    pub separated: bool,
    /// Bytes one core's MTE2 reads from GM per core cycle (tiling estimates only).
    pub gm_read_bytes_per_cycle: u64,
    /// Bytes one core's MTE2 reads per core cycle where the L2 serves them (tiling estimates
    /// only).
    pub l2_read_bytes_per_cycle: u64,
    /// Bytes per core cycle MTE1 writes into L0A by img2col (Load3D; tiling estimates only:
    /// what bounds a convolution whose fractals serve few output channels).
    pub img2col_bytes_per_cycle: u64,
    /// Bytes per core cycle MTE1 writes into L0A by Load2D (tiling estimates only).
    pub l1_to_l0a_bytes_per_cycle: u64,
    /// Bytes per core cycle MTE1 writes into L0B (tiling estimates only).
    pub l1_to_l0b_bytes_per_cycle: u64,
    /// Bytes per core cycle the whole chip reads from device memory (HBM / DDR; tiling
    /// estimates only).
    pub memory_bytes_per_cycle: u64,
    /// L2 bytes the cores share (kept feature-map sections are budgeted against it, and
    /// large products order their tiles for it; 0: no L2).
    pub l2_bytes: u64,
    /// Core cycles a kernel launch adds to the stream (the chip's `scheduler.kernel_launch_ns`;
    /// tiling estimates only: what a lowering that could emit one kernel or two weighs).
    pub launch_cycles: u64,
    /// Core cycles the scheduler takes to dispatch one block to a core
    /// (`scheduler.block_dispatch_ns`; tiling estimates only).
    pub block_dispatch_cycles: u64,
}

impl CoreSpec {
    /// Most blocks a cube kernel spreads over: one per AI core (cube core), within
    /// `max_block_dim`.
    pub fn cube_blocks(&self) -> u64 {
        u64::from(self.cores.min(self.max_block_dim)).max(1)
    }

    /// Most blocks a vector-only kernel spreads over: one per core with a vector unit, within
    /// `max_block_dim`.
    pub fn vector_blocks(&self) -> u64 {
        u64::from(self.vector_cores.min(self.max_block_dim)).max(1)
    }

    /// L2 bytes kept feature maps may fill at once ([`memory::L2_KEEP_SHARE`] of the L2).
    pub fn l2_keep_bytes(&self) -> u64 {
        let (num, den) = memory::L2_KEEP_SHARE;
        self.l2_bytes / den * num
    }
}
