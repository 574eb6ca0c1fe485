//! Chip configuration: every hardware parameter the simulator uses, loaded from a TOML preset.
//!
//! The presets in `sim/presets/*.toml` are compiled in; each value there carries a comment with
//! its source (see `spec/ascend-hardware.md`) or says that it is an assumption. Unknown keys are
//! errors, so a typo in a preset or an override file cannot silently fall back to a default.

use serde::Deserialize;
use thiserror::Error;

use gearsim_isa::{Pipe, TimingClass};

use crate::kind::{Architecture, CoreKind, CoreSlot};
use crate::time::Clock;

/// A configuration that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// No preset of that name.
    #[error(
        "unknown soc_version `{name}` (expected one of: {}, or atc's {}; case-insensitive)",
        known.join(", "),
        aliases.join(", ")
    )]
    UnknownPreset {
        /// Name asked for.
        name: String,
        /// Preset names.
        known: Vec<&'static str>,
        /// atc's names for the modelled parts.
        aliases: Vec<&'static str>,
    },
    /// The TOML does not parse or does not match the schema.
    #[error("{origin}: {message}")]
    Parse {
        /// Preset name or file name.
        origin: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// A value is out of its valid range.
    #[error("{origin}: `{field}` = {value}: {expected}")]
    Invalid {
        /// Preset name or file name.
        origin: String,
        /// Dotted field path.
        field: &'static str,
        /// The value found.
        value: String,
        /// What is expected.
        expected: &'static str,
    },
    /// A `section.key=value` setting that cannot be applied.
    #[error("setting `{setting}`: {message}")]
    Setting {
        /// The setting as given.
        setting: String,
        /// What is wrong with it.
        message: String,
    },
}

/// The whole chip.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChipConfig {
    /// Preset name (`ascend910`).
    pub name: String,
    /// AI core organisation and local buffers.
    pub core: CoreConfig,
    /// Scalar unit costs.
    pub scalar: ScalarConfig,
    /// Vector unit costs.
    pub vector: VectorConfig,
    /// Cube unit costs.
    pub cube: CubeConfig,
    /// Data-movement engine rates.
    pub mte: MteConfig,
    /// Device memory.
    pub memory: MemoryConfig,
    /// Host link.
    pub pcie: PcieConfig,
    /// AI CPU cores.
    pub aicpu: AiCpuConfig,
    /// Task scheduler limits and costs.
    pub scheduler: SchedulerConfig,
    /// Limits of the firmware's built-in kernels.
    pub kernels: KernelLimits,
    /// The runtime's own work on the host CPU.
    pub host: HostConfig,
}

/// AI core organisation and local buffers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoreConfig {
    /// Coupled AI cores, or separated cube and vector cores.
    pub architecture: Architecture,
    /// Number of AI cores (on a separated chip, of cube cores: an AI core is one cube core and
    /// its vector cores).
    pub count: u32,
    /// Vector cores per AI core on a separated chip (0 on a coupled one).
    pub vector_cores_per_core: u32,
    /// Core clock in MHz.
    pub clock_mhz: u64,
    /// Whether the cores have a FIXPIPE (L0C -> GM path); coupled-architecture chips do not.
    pub fixpipe: bool,
    /// Unified buffer bytes (per vector core on a separated chip).
    pub ub_bytes: u64,
    /// L1 bytes (per cube core on a separated chip).
    pub l1_bytes: u64,
    /// L0A bytes.
    pub l0a_bytes: u64,
    /// L0B bytes.
    pub l0b_bytes: u64,
    /// L0C bytes.
    pub l0c_bytes: u64,
    /// Bias table bytes (the cube core's accumulator initialiser; 0 where there is none).
    pub bt_bytes: u64,
    /// FIXPIPE buffer bytes (per-channel output parameters; 0 where there is none).
    pub fb_bytes: u64,
    /// UB address alignment.
    pub ub_align: u64,
    /// L1 address alignment.
    pub l1_align: u64,
    /// L0A address alignment.
    pub l0a_align: u64,
    /// L0B address alignment.
    pub l0b_align: u64,
    /// L0C address alignment.
    pub l0c_align: u64,
    /// Bias table address alignment.
    pub bt_align: u64,
    /// FIXPIPE buffer address alignment.
    pub fb_align: u64,
    /// Event ids per (source pipe, destination pipe) pair.
    pub event_ids: u8,
    /// Cross-core flag ids (0: no cross-core synchronisation, as on a coupled chip).
    pub cross_core_flag_ids: u8,
    /// Arrivals of one cross-core flag a core holds unconsumed; one more set overflows it.
    pub cross_core_max_pending: u32,
    /// Instructions a pipe queue holds before the scalar unit stalls on dispatch.
    pub pipe_queue_depth: u32,
    /// A block running longer than this many cycles stops with a timeout.
    pub kernel_timeout_cycles: u64,
}

/// Scalar unit costs in core cycles.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalarConfig {
    /// ALU operation.
    pub alu_cycles: u64,
    /// Multiply.
    pub mul_cycles: u64,
    /// Divide / remainder.
    pub div_cycles: u64,
    /// Branch, not taken.
    pub branch_cycles: u64,
    /// Extra cycles of a taken branch.
    pub branch_taken_penalty: u64,
    /// Special-register read or write.
    pub spr_cycles: u64,
    /// Dispatching one instruction into a pipe queue.
    pub dispatch_cycles: u64,
    /// Scalar load from GM (through the data cache, modelled as a fixed latency).
    pub gm_load_cycles: u64,
    /// Scalar store to GM.
    pub gm_store_cycles: u64,
    /// Scalar load or store to UB or L1.
    pub local_access_cycles: u64,
}

/// Vector unit costs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorConfig {
    /// Cycles from the last repeat issued to the result being visible.
    pub latency: u64,
    /// Cycles per repeat of add/sub/max/min/abs/relu/move/dup/compare/select/bitwise.
    pub simple_cycles_per_repeat: u64,
    /// Cycles per repeat of multiply and multiply-add.
    pub mul_cycles_per_repeat: u64,
    /// Cycles per repeat of divide and reciprocal.
    pub div_cycles_per_repeat: u64,
    /// Cycles per repeat of exp/ln/sqrt/rsqrt.
    pub transcend_cycles_per_repeat: u64,
    /// Cycles per repeat of reductions.
    pub reduce_cycles_per_repeat: u64,
    /// Cycles per repeat of conversions.
    pub conv_cycles_per_repeat: u64,
    /// L0C -> UB (coupled) or L0C -> L1 (FIXPIPE) move rate in bytes of L0C read per cycle.
    pub l0c_to_ub_bytes_per_cycle: u64,
}

/// Cube unit costs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CubeConfig {
    /// Cycles per 16x16x16 fractal multiply-accumulate.
    pub cycles_per_fractal: u64,
    /// Cycles from the last fractal to the result being visible in L0C.
    pub latency: u64,
}

/// Data-movement engine rates and latencies.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MteConfig {
    /// MTE2 GM read rate cap per core, bytes per cycle, for bytes device memory serves.
    pub gm_read_bytes_per_cycle: u64,
    /// MTE2 read rate cap per core, bytes per cycle, for bytes the L2 serves: a read's cap
    /// is the harmonic mix of the two by its hit share.
    pub l2_read_bytes_per_cycle: u64,
    /// MTE3 GM write rate cap per core, bytes per cycle.
    pub gm_write_bytes_per_cycle: u64,
    /// FIXPIPE GM write rate cap per core, bytes per cycle.
    pub fix_write_bytes_per_cycle: u64,
    /// MTE1 L1 -> L0A rate, bytes per cycle.
    pub l1_to_l0a_bytes_per_cycle: u64,
    /// MTE1 L1 -> L0B rate, bytes per cycle.
    pub l1_to_l0b_bytes_per_cycle: u64,
    /// MTE1 img2col output rate, bytes per cycle.
    pub img2col_bytes_per_cycle: u64,
    /// Latency of an MTE1 move.
    pub local_latency: u64,
}

/// Device memory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Capacity in bytes.
    pub hbm_bytes: u64,
    /// Chip-level bandwidth cap shared by all reads and writes, bytes per second.
    pub hbm_bytes_per_second: u64,
    /// Read latency from DDR in core cycles (added once per DMA instruction).
    pub read_latency_cycles: u64,
    /// Write latency to DDR in core cycles, added once per DMA instruction that writes HBM
    /// (every write without an L2 or with a write-through one).
    pub write_latency_cycles: u64,
    /// L2 cache size in bytes; 0 turns the L2 off (every DMA byte is served by HBM).
    pub l2_bytes: u64,
    /// L2 line size in bytes: the unit the L2 allocates and looks up.
    pub l2_line_bytes: u64,
    /// L2 associativity (ways per set).
    pub l2_ways: u64,
    /// Chip-level cap on bytes per second served from L2 (read hits).
    pub l2_bytes_per_second: u64,
    /// Read latency of a DMA served from L2, in core cycles; a DMA that partly hits waits the
    /// byte-weighted mix of this and `read_latency_cycles`.
    pub l2_read_latency_cycles: u64,
    /// Whether the L2 is write-back (a write stays in L2 and reaches HBM when its line is
    /// evicted) or write-through (every written byte goes to HBM).
    pub l2_write_back: bool,
    /// Write latency of a DMA a write-back L2 absorbs, in core cycles (the lines it evicts go
    /// to HBM on their own, so no write waits for them).
    pub l2_write_latency_cycles: u64,
}

/// Host link.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcieConfig {
    /// Bandwidth per direction, bytes per second.
    pub bytes_per_second: u64,
    /// Fixed cost of one transfer, nanoseconds.
    pub latency_ns: u64,
}

/// The runtime's own work on the host CPU: what each ACL call costs the calling thread while
/// the device runs whatever it was given (ascend-hardware.md §6.4; most values are parameters).
/// Times in nanoseconds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// A call that only updates host state (`aclmdlSetDynamicBatchSize`, ...).
    pub api_call_ns: u64,
    /// Submitting one task to a stream (a kernel launch, a copy, `aclmdlExecute`'s submission).
    pub submit_ns: u64,
    /// From a stream's last task ending to `aclrtSynchronizeStream` (or a synchronous
    /// `aclrtMemcpy`) returning.
    pub sync_ns: u64,
    /// Host memory copies into and out of pinned staging buffers, bytes per second.
    pub staging_bytes_per_second: u64,
    /// Handing one item to a device data queue (`acltdtSendTensor`).
    pub queue_send_ns: u64,
    /// Dynamic-shape path: one node's shape inference (`update_shape`).
    pub infer_shape_ns: u64,
    /// Dynamic-shape path: one kernel's tiling, computed on the host (`update_impl`).
    pub tiling_ns: u64,
    /// Dynamic-shape path: choosing and loading the kernels of an op configuration not seen
    /// before (an `update_impl` cache miss).
    pub kernel_select_ns: u64,
    /// One device allocation (`aclrtMalloc`; `realloc_if_needed` growing a buffer).
    pub alloc_ns: u64,
}

/// AI CPU cores.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AiCpuConfig {
    /// Number of AI CPU cores.
    pub count: u32,
    /// Clock in MHz.
    pub clock_mhz: u64,
    /// Starting an AI CPU kernel, nanoseconds.
    pub launch_ns: u64,
    /// Device-memory read rate of one AI CPU core, bytes per AI CPU cycle.
    pub mem_bytes_per_cycle: u64,
    /// Cycles of a kernel's inner loop per element it processes.
    pub cycles_per_element: u64,
}

/// Limits of the firmware's built-in kernels.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelLimits {
    /// Most gears (table rows) MapIndex accepts.
    pub map_index_max_gears: u32,
    /// Longest query vector MapIndex accepts.
    pub map_index_max_dims: u32,
}

/// Task scheduler limits and costs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Streams per device.
    pub max_streams: u32,
    /// Submission queue depth (task descriptors) per stream.
    pub sq_depth: u32,
    /// Events per device.
    pub max_events: u32,
    /// Labels per model.
    pub max_labels: u32,
    /// Largest block_dim of a kernel launch.
    pub max_block_dim: u32,
    /// Fetching one task descriptor, nanoseconds.
    pub task_fetch_ns: u64,
    /// Device-side start of a kernel (scheduler to cores), nanoseconds.
    pub kernel_launch_ns: u64,
    /// Extra start-up of a MIX kernel (cube and vector cores started together), nanoseconds.
    pub mix_launch_ns: u64,
    /// Dispatching one block to an idle core, nanoseconds.
    pub block_dispatch_ns: u64,
    /// A label, event or stream-control task, nanoseconds.
    pub control_task_ns: u64,
    /// Device-to-device copy and memset rate of the SDMA engine, bytes per second.
    pub sdma_bytes_per_second: u64,
}

/// Names of the compiled-in presets.
pub const PRESETS: &[(&str, &str)] = &[
    ("ascend910", include_str!("../presets/ascend910.toml")),
    ("ascend310p", include_str!("../presets/ascend310p.toml")),
    ("ascend910b1", include_str!("../presets/ascend910b1.toml")),
    ("ascend910b2", include_str!("../presets/ascend910b2.toml")),
    ("ascend910b3", include_str!("../presets/ascend910b3.toml")),
    ("ascend910b4", include_str!("../presets/ascend910b4.toml")),
];

/// atc's `--soc_version` spellings of the parts a preset models (matched case-insensitively):
/// the 310P3 is the 8-core 310P (the 10-core 310P1 is not modelled), the 910A the first 910.
pub const SOC_ALIASES: &[(&str, &str)] =
    &[("Ascend310P3", "ascend310p"), ("Ascend910A", "ascend910")];

impl ChipConfig {
    /// A compiled-in preset by name (case-insensitive, so `Ascend910` works as in atc).
    pub fn preset(name: &str) -> Result<ChipConfig, ConfigError> {
        let (key, text) = ChipConfig::preset_toml(name)?;
        ChipConfig::from_toml(text, key)
    }

    /// A compiled-in preset's name and TOML text (the name as [`ChipConfig::preset`] takes it).
    pub(crate) fn preset_toml(name: &str) -> Result<(&'static str, &'static str), ConfigError> {
        let name_or_alias = SOC_ALIASES
            .iter()
            .find(|(alias, _)| alias.eq_ignore_ascii_case(name))
            .map_or(name, |(_, preset)| preset);
        PRESETS
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name_or_alias))
            .copied()
            .ok_or_else(|| ConfigError::UnknownPreset {
                name: name.to_string(),
                known: PRESETS.iter().map(|(n, _)| *n).collect(),
                aliases: SOC_ALIASES.iter().map(|(a, _)| *a).collect(),
            })
    }

    /// Parses and validates a configuration; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<ChipConfig, ConfigError> {
        let cfg: ChipConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Checks every value's range.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |field: &'static str, value: String, expected: &'static str| {
            Err(ConfigError::Invalid {
                origin: origin.to_string(),
                field,
                value,
                expected,
            })
        };
        let c = &self.core;
        if c.count == 0 || c.count > 4096 {
            return bad("core.count", c.count.to_string(), "expected 1..=4096");
        }
        if c.clock_mhz == 0 || c.clock_mhz > 100_000 {
            return bad(
                "core.clock_mhz",
                c.clock_mhz.to_string(),
                "expected 1..=100000",
            );
        }
        for (field, v) in [
            ("core.ub_bytes", c.ub_bytes),
            ("core.l1_bytes", c.l1_bytes),
            ("core.l0a_bytes", c.l0a_bytes),
            ("core.l0b_bytes", c.l0b_bytes),
            ("core.l0c_bytes", c.l0c_bytes),
        ] {
            if v == 0 || v > (1 << 30) || v % 32 != 0 {
                return bad(
                    field,
                    v.to_string(),
                    "expected a multiple of 32 in 32..=1 GiB",
                );
            }
        }
        for (field, v) in [
            ("core.ub_align", c.ub_align),
            ("core.l1_align", c.l1_align),
            ("core.l0a_align", c.l0a_align),
            ("core.l0b_align", c.l0b_align),
            ("core.l0c_align", c.l0c_align),
            ("core.bt_align", c.bt_align),
            ("core.fb_align", c.fb_align),
        ] {
            if !v.is_power_of_two() || v > 4096 {
                return bad(field, v.to_string(), "expected a power of two up to 4096");
            }
        }
        if c.event_ids == 0 || c.event_ids > 16 {
            return bad("core.event_ids", c.event_ids.to_string(), "expected 1..=16");
        }
        match c.architecture {
            Architecture::Coupled => {
                if c.vector_cores_per_core != 0 {
                    return bad(
                        "core.vector_cores_per_core",
                        c.vector_cores_per_core.to_string(),
                        "expected 0 on a coupled chip (its vector unit is in the AI core)",
                    );
                }
                if c.cross_core_flag_ids != 0 {
                    return bad(
                        "core.cross_core_flag_ids",
                        c.cross_core_flag_ids.to_string(),
                        "expected 0 on a coupled chip (no cross-core flags)",
                    );
                }
            }
            Architecture::Separated => {
                if !(1..=4).contains(&c.vector_cores_per_core) {
                    return bad(
                        "core.vector_cores_per_core",
                        c.vector_cores_per_core.to_string(),
                        "expected 1..=4 on a separated chip",
                    );
                }
                if c.cross_core_flag_ids == 0
                    || c.cross_core_flag_ids > gearsim_isa::operand::CROSS_CORE_FLAG_IDS
                {
                    return bad(
                        "core.cross_core_flag_ids",
                        c.cross_core_flag_ids.to_string(),
                        "expected 1..=11 on a separated chip (the ISA's flag ids 0-10)",
                    );
                }
                if c.cross_core_max_pending == 0 || c.cross_core_max_pending > 1 << 20 {
                    return bad(
                        "core.cross_core_max_pending",
                        c.cross_core_max_pending.to_string(),
                        "expected 1..=1048576",
                    );
                }
                if !c.fixpipe {
                    return bad(
                        "core.fixpipe",
                        "false".into(),
                        "expected true on a separated chip (its cube core writes L0C out through the FIXPIPE)",
                    );
                }
            }
        }
        for (field, v) in [("core.bt_bytes", c.bt_bytes), ("core.fb_bytes", c.fb_bytes)] {
            if v > (1 << 20) || v % 32 != 0 {
                return bad(
                    field,
                    v.to_string(),
                    "expected a multiple of 32 up to 1 MiB",
                );
            }
        }
        if c.fb_bytes > 0 && !c.fixpipe {
            return bad(
                "core.fb_bytes",
                c.fb_bytes.to_string(),
                "expected 0 without a FIXPIPE (the buffer is the FIXPIPE's)",
            );
        }
        if c.pipe_queue_depth == 0 || c.pipe_queue_depth > 4096 {
            return bad(
                "core.pipe_queue_depth",
                c.pipe_queue_depth.to_string(),
                "expected 1..=4096",
            );
        }
        if c.kernel_timeout_cycles == 0 {
            return bad(
                "core.kernel_timeout_cycles",
                "0".into(),
                "expected at least 1",
            );
        }
        for (field, v) in [
            (
                "vector.simple_cycles_per_repeat",
                self.vector.simple_cycles_per_repeat,
            ),
            (
                "vector.mul_cycles_per_repeat",
                self.vector.mul_cycles_per_repeat,
            ),
            (
                "vector.div_cycles_per_repeat",
                self.vector.div_cycles_per_repeat,
            ),
            (
                "vector.transcend_cycles_per_repeat",
                self.vector.transcend_cycles_per_repeat,
            ),
            (
                "vector.reduce_cycles_per_repeat",
                self.vector.reduce_cycles_per_repeat,
            ),
            (
                "vector.conv_cycles_per_repeat",
                self.vector.conv_cycles_per_repeat,
            ),
            (
                "vector.l0c_to_ub_bytes_per_cycle",
                self.vector.l0c_to_ub_bytes_per_cycle,
            ),
            ("cube.cycles_per_fractal", self.cube.cycles_per_fractal),
            (
                "mte.gm_read_bytes_per_cycle",
                self.mte.gm_read_bytes_per_cycle,
            ),
            (
                "mte.l2_read_bytes_per_cycle",
                self.mte.l2_read_bytes_per_cycle,
            ),
            (
                "mte.gm_write_bytes_per_cycle",
                self.mte.gm_write_bytes_per_cycle,
            ),
            (
                "mte.fix_write_bytes_per_cycle",
                self.mte.fix_write_bytes_per_cycle,
            ),
            (
                "mte.l1_to_l0a_bytes_per_cycle",
                self.mte.l1_to_l0a_bytes_per_cycle,
            ),
            (
                "mte.l1_to_l0b_bytes_per_cycle",
                self.mte.l1_to_l0b_bytes_per_cycle,
            ),
            (
                "mte.img2col_bytes_per_cycle",
                self.mte.img2col_bytes_per_cycle,
            ),
            (
                "memory.hbm_bytes_per_second",
                self.memory.hbm_bytes_per_second,
            ),
            ("pcie.bytes_per_second", self.pcie.bytes_per_second),
            (
                "host.staging_bytes_per_second",
                self.host.staging_bytes_per_second,
            ),
            ("aicpu.clock_mhz", self.aicpu.clock_mhz),
            ("aicpu.mem_bytes_per_cycle", self.aicpu.mem_bytes_per_cycle),
            (
                "scheduler.sdma_bytes_per_second",
                self.scheduler.sdma_bytes_per_second,
            ),
        ] {
            if v == 0 {
                return bad(field, "0".into(), "expected a positive rate");
            }
        }
        let m = &self.memory;
        if m.hbm_bytes < (1 << 20)
            || m.hbm_bytes > (1 << 44)
            || !m.hbm_bytes.is_multiple_of(1 << 16)
        {
            return bad(
                "memory.hbm_bytes",
                m.hbm_bytes.to_string(),
                "expected a multiple of 64 KiB between 1 MiB and 16 TiB",
            );
        }
        if m.l2_bytes != 0 {
            if !m.l2_line_bytes.is_power_of_two() || !(32..=4096).contains(&m.l2_line_bytes) {
                return bad(
                    "memory.l2_line_bytes",
                    m.l2_line_bytes.to_string(),
                    "expected a power of two in 32..=4096",
                );
            }
            if !(1..=crate::l2::MAX_WAYS as u64).contains(&m.l2_ways) {
                return bad("memory.l2_ways", m.l2_ways.to_string(), "expected 1..=32");
            }
            // The model keeps one tag per block of 16 lines (see `l2.rs`).
            let set_bytes = m.l2_line_bytes * crate::l2::LINES_PER_BLOCK * m.l2_ways;
            if m.l2_bytes > (1 << 36)
                || !m.l2_bytes.is_multiple_of(set_bytes)
                || !(m.l2_bytes / set_bytes).is_power_of_two()
            {
                return bad(
                    "memory.l2_bytes",
                    m.l2_bytes.to_string(),
                    "expected 0 (no L2) or 16 x l2_line_bytes x l2_ways x a power of two, \
                     up to 64 GiB",
                );
            }
            if m.l2_bytes_per_second == 0 {
                return bad(
                    "memory.l2_bytes_per_second",
                    "0".into(),
                    "expected a positive rate",
                );
            }
        }
        if self.aicpu.count == 0 {
            return bad("aicpu.count", "0".into(), "expected at least 1");
        }
        let s = &self.scheduler;
        for (field, v) in [
            ("scheduler.max_streams", s.max_streams),
            ("scheduler.sq_depth", s.sq_depth),
            ("scheduler.max_events", s.max_events),
            ("scheduler.max_labels", s.max_labels),
            ("scheduler.max_block_dim", s.max_block_dim),
            (
                "kernels.map_index_max_gears",
                self.kernels.map_index_max_gears,
            ),
            (
                "kernels.map_index_max_dims",
                self.kernels.map_index_max_dims,
            ),
        ] {
            if v == 0 {
                return bad(field, "0".into(), "expected at least 1");
            }
        }
        Ok(())
    }

    /// Every core of the chip in chip order: a coupled chip's AI cores, or a separated chip's
    /// cube cores followed by its vector cores (AI core `i`'s at `count + v·i + sub`).
    pub fn core_slots(&self) -> Vec<CoreSlot> {
        let c = &self.core;
        match c.architecture {
            Architecture::Coupled => (0..c.count)
                .map(|i| CoreSlot {
                    kind: CoreKind::Coupled,
                    number: i,
                    ai_core: i,
                    sub: 0,
                })
                .collect(),
            Architecture::Separated => {
                let v = c.vector_cores_per_core;
                let cubes = (0..c.count).map(|i| CoreSlot {
                    kind: CoreKind::Cube,
                    number: i,
                    ai_core: i,
                    sub: 0,
                });
                let vectors = (0..c.count * v).map(|j| CoreSlot {
                    kind: CoreKind::Vector,
                    number: j,
                    ai_core: j / v,
                    sub: (j % v) as u8,
                });
                cubes.chain(vectors).collect()
            }
        }
    }

    /// Cores that have `pipe`: every AI core of a coupled chip; on a separated chip the cube
    /// cores for the cube side's pipes, the vector cores for the vector side's, all for the
    /// scalar unit and MTE2.
    pub fn cores_with(&self, pipe: Pipe) -> u32 {
        self.core_slots()
            .iter()
            .filter(|s| s.kind.has_pipe(pipe))
            .count() as u32
    }

    /// Number of cores of every kind (the chip's core ids are `0..total_cores()`).
    pub fn total_cores(&self) -> u32 {
        self.core.count * (1 + self.core.vector_cores_per_core)
    }

    /// The chip id of vector core `sub` of AI core `ai_core` on a separated chip.
    pub fn vector_core_id(&self, ai_core: u32, sub: u32) -> u32 {
        self.core.count + ai_core * self.core.vector_cores_per_core + sub
    }

    /// The AI core clock.
    pub fn core_clock(&self) -> Clock {
        Clock::from_mhz(self.core.clock_mhz)
    }

    /// Cycles the scalar unit spends executing an instruction of a timing class (the class
    /// comes from the ISA table). A branch costs `branch_cycles`, plus `branch_taken_penalty`
    /// when taken; a scalar access costs `local_access_cycles` here and its GM latency where
    /// the space is known (`gm_load_cycles`, `gm_store_cycles`); a `set_flag` or one-pipe
    /// `pipe_barrier` the scalar unit executes costs an ALU operation; `end` costs nothing
    /// itself (it waits for the pipes to drain). The pipe classes cost the scalar unit only
    /// their dispatch, `dispatch_cycles`.
    #[inline]
    pub fn scalar_cycles(&self, class: TimingClass) -> u64 {
        let s = &self.scalar;
        match class {
            TimingClass::Alu | TimingClass::Sync => s.alu_cycles,
            TimingClass::Mul => s.mul_cycles,
            TimingClass::Div => s.div_cycles,
            TimingClass::Branch => s.branch_cycles,
            TimingClass::ScalarMem => s.local_access_cycles,
            TimingClass::Spr => s.spr_cycles,
            TimingClass::End => 0,
            TimingClass::VecSimple
            | TimingClass::VecMul
            | TimingClass::VecDiv
            | TimingClass::VecTranscend
            | TimingClass::VecReduce
            | TimingClass::VecConv
            | TimingClass::L0cMove
            | TimingClass::DmaRead
            | TimingClass::DmaWrite
            | TimingClass::Load2d
            | TimingClass::Img2col
            | TimingClass::Cube => s.dispatch_cycles,
        }
    }

    /// Cycles per repeat of a vector timing class.
    pub fn vector_cycles_per_repeat(&self, class: TimingClass) -> u64 {
        let v = &self.vector;
        match class {
            TimingClass::VecSimple => v.simple_cycles_per_repeat,
            TimingClass::VecMul => v.mul_cycles_per_repeat,
            TimingClass::VecDiv => v.div_cycles_per_repeat,
            TimingClass::VecTranscend => v.transcend_cycles_per_repeat,
            TimingClass::VecReduce => v.reduce_cycles_per_repeat,
            TimingClass::VecConv => v.conv_cycles_per_repeat,
            TimingClass::Alu
            | TimingClass::Mul
            | TimingClass::Div
            | TimingClass::Branch
            | TimingClass::ScalarMem
            | TimingClass::Spr
            | TimingClass::L0cMove
            | TimingClass::DmaRead
            | TimingClass::DmaWrite
            | TimingClass::Load2d
            | TimingClass::Img2col
            | TimingClass::Cube
            | TimingClass::Sync
            | TimingClass::End => 1,
        }
    }

    /// Peak cube multiply-accumulates per cycle per core (16x16x16 fractals).
    pub fn cube_macs_per_cycle(&self) -> u64 {
        4096 / self.cube.cycles_per_fractal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(cfg: &ChipConfig) -> Option<&'static str> {
        match cfg.validate("test") {
            Ok(()) => None,
            Err(ConfigError::Invalid { field, .. }) => Some(field),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    #[test]
    fn atc_spellings_of_a_modelled_part_name_its_preset() {
        for (spelling, preset) in [("Ascend310P3", "ascend310p"), ("ASCEND910A", "ascend910")] {
            assert_eq!(ChipConfig::preset(spelling).unwrap().name, preset);
        }
        assert!(matches!(
            ChipConfig::preset("Ascend310P1"),
            Err(ConfigError::UnknownPreset { .. })
        ));
        // atc spells the A2 parts as the presets are named, in capitals.
        for (spelling, cubes) in [
            ("Ascend910B1", 24),
            ("Ascend910B2", 24),
            ("ASCEND910B3", 20),
            ("ascend910b4", 20),
        ] {
            let cfg = ChipConfig::preset(spelling).unwrap();
            assert_eq!(cfg.name, spelling.to_ascii_lowercase());
            assert_eq!(cfg.core.architecture, Architecture::Separated);
            assert_eq!(cfg.core.count, cubes);
            assert_eq!(cfg.total_cores(), 3 * cubes);
        }
    }

    #[test]
    fn a_separated_chip_lists_its_cube_cores_then_their_vector_cores() {
        let cfg = ChipConfig::preset("ascend910b2").unwrap();
        let slots = cfg.core_slots();
        assert_eq!(slots.len(), 72);
        assert_eq!(slots[0].to_string(), "aic0");
        assert_eq!(slots[23].to_string(), "aic23");
        let v = cfg.vector_core_id(5, 1) as usize;
        assert_eq!((v, slots[v].to_string()), (35, "aiv11".to_string()));
        assert_eq!((slots[v].ai_core, slots[v].sub), (5, 1));
        assert!(slots.iter().all(|s| s.kind != CoreKind::Coupled));
        let coupled = ChipConfig::preset("ascend310p").unwrap().core_slots();
        assert_eq!(coupled.len(), 8);
        assert_eq!(coupled[7].to_string(), "core7");
    }

    #[test]
    fn the_architecture_and_its_core_counts_must_agree() {
        let mut cfg = ChipConfig::preset("ascend910b2").unwrap();
        cfg.core.vector_cores_per_core = 0;
        assert_eq!(field_of(&cfg), Some("core.vector_cores_per_core"));
        let mut cfg = ChipConfig::preset("ascend910b2").unwrap();
        cfg.core.cross_core_flag_ids = 12;
        assert_eq!(field_of(&cfg), Some("core.cross_core_flag_ids"));
        let mut cfg = ChipConfig::preset("ascend910b2").unwrap();
        cfg.core.fixpipe = false;
        assert_eq!(field_of(&cfg), Some("core.fixpipe"));
        let mut cfg = ChipConfig::preset("ascend910").unwrap();
        cfg.core.cross_core_flag_ids = 11;
        assert_eq!(field_of(&cfg), Some("core.cross_core_flag_ids"));
        for name in ["ascend910b1", "ascend910b2", "ascend910b3", "ascend910b4"] {
            assert_eq!(field_of(&ChipConfig::preset(name).unwrap()), None, "{name}");
        }
    }

    #[test]
    fn the_l2_geometry_is_checked_unless_the_l2_is_off() {
        let base = ChipConfig::preset("ascend910").unwrap();
        assert_eq!(field_of(&base), None);
        type Change = fn(&mut MemoryConfig);
        let cases: [(Change, Option<&str>); 7] = [
            (|m| m.l2_ways = 0, Some("memory.l2_ways")),
            (|m| m.l2_ways = 33, Some("memory.l2_ways")),
            (|m| m.l2_line_bytes = 384, Some("memory.l2_line_bytes")),
            (|m| m.l2_line_bytes = 8192, Some("memory.l2_line_bytes")),
            // 3 x 16 lines x 512 B x 16 ways: not a power-of-two number of sets.
            (|m| m.l2_bytes = 3 << 17, Some("memory.l2_bytes")),
            (
                |m| m.l2_bytes_per_second = 0,
                Some("memory.l2_bytes_per_second"),
            ),
            // Off: the other L2 values are not used, so they are not checked.
            (
                |m| {
                    m.l2_bytes = 0;
                    m.l2_ways = 0;
                    m.l2_bytes_per_second = 0;
                },
                None,
            ),
        ];
        for (change, want) in cases {
            let mut cfg = base.clone();
            change(&mut cfg.memory);
            assert_eq!(field_of(&cfg), want, "{:?}", cfg.memory);
        }
        assert_eq!(field_of(&ChipConfig::preset("ascend310p").unwrap()), None);
    }
}
