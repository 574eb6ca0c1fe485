//! The compiler's view of a chip: the `compiler::Target` (buffer sizes, cores, MapIndex limits)
//! read off a simulator `ChipConfig`. Shared by the compile path, the runtime's dynamic-shape
//! path, the studies and the benches; it sits here, below the CLI, so none of them reaches up
//! into command-line code.

use gearsim_sim::ChipConfig;

use gearsim_compiler::{CoreSpec, Target};

/// The compiler's view of a chip configuration.
pub fn for_chip(cfg: &ChipConfig) -> Target {
    Target {
        soc_version: cfg.name.clone(),
        map_index_max_gears: cfg.kernels.map_index_max_gears,
        map_index_max_dims: cfg.kernels.map_index_max_dims,
        core: CoreSpec {
            cores: cfg.core.count,
            vector_cores: cfg.cores_with(gearsim_isa::Pipe::V),
            max_block_dim: cfg.scheduler.max_block_dim,
            fixpipe: cfg.core.fixpipe,
            ub_bytes: cfg.core.ub_bytes,
            // A separated chip's split kernels stage bias rows at the top of L1.
            l1_bytes: if cfg.core.architecture == gearsim_sim::Architecture::Separated {
                cfg.core.l1_bytes - gearsim_compiler::mix::BIAS_L1_BYTES
            } else {
                cfg.core.l1_bytes
            },
            l0a_bytes: cfg.core.l0a_bytes,
            l0b_bytes: cfg.core.l0b_bytes,
            l0c_bytes: cfg.core.l0c_bytes,
            event_ids: cfg.core.event_ids,
            separated: cfg.core.architecture == gearsim_sim::Architecture::Separated,
            gm_read_bytes_per_cycle: cfg.mte.gm_read_bytes_per_cycle,
            l2_read_bytes_per_cycle: cfg.mte.l2_read_bytes_per_cycle,
            img2col_bytes_per_cycle: cfg.mte.img2col_bytes_per_cycle,
            l1_to_l0a_bytes_per_cycle: cfg.mte.l1_to_l0a_bytes_per_cycle,
            l1_to_l0b_bytes_per_cycle: cfg.mte.l1_to_l0b_bytes_per_cycle,
            memory_bytes_per_cycle: (cfg.memory.hbm_bytes_per_second
                / (cfg.core.clock_mhz * 1_000_000))
                .max(1),
            l2_bytes: cfg.memory.l2_bytes,
            launch_cycles: cfg.scheduler.kernel_launch_ns * cfg.core.clock_mhz / 1000,
            block_dispatch_cycles: cfg.scheduler.block_dispatch_ns * cfg.core.clock_mhz / 1000,
        },
        buffer_optimize: Default::default(),
    }
}
