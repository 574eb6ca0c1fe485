//! Flag groups several subcommands share, each flag defined once with its help: the chip
//! (`--soc_version`, `--chip_config`, `--clock_mhz`, `--set`, flattened into every subcommand that builds
//! a chip), the trace file (`--trace`) and atc's gear options.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use gearsim_compiler::options::GearOptions;
use gearsim_host::options::{ChipChoice, GearFlags};
use gearsim_sim::{ChipConfig, ExecMode, Setting};
use gearsim_traces::{Level, TraceFileWriter};

use super::output::open_trace;

pub use gearsim_host::options::DEFAULT_SOC;

/// The chip to simulate.
#[derive(Args)]
pub struct ChipArgs {
    /// Chip preset, as atc's --soc_version (ascend910, ascend310p, ascend910b1-b4; case-insensitive). Default:
    /// ascend910; for a command that reads a compiled model, the chip it was compiled for.
    #[arg(long = "soc_version")]
    soc_version: Option<String>,
    /// A chip configuration TOML file to use instead of the preset (same schema as sim/presets).
    #[arg(long = "chip_config", value_name = "FILE")]
    chip_config: Option<PathBuf>,
    /// Override the AI core clock in MHz (the clock is a per-run parameter on real chips).
    #[arg(long = "clock_mhz")]
    clock_mhz: Option<u64>,
    /// Change one value of the chip, `section.key=value` as in the preset's TOML (e.g.
    /// scheduler.kernel_launch_ns=2000); repeatable. The key must exist and the value have its
    /// type. --clock_mhz applies after it.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_setting)]
    set: Vec<Setting>,
}

/// `--set`'s value.
pub fn parse_setting(s: &str) -> Result<Setting, String> {
    Setting::parse(s).map_err(|e| e.to_string())
}

impl ChipArgs {
    /// The chip: `--chip_config`'s file, else the `--soc_version` preset, else ascend910; with
    /// `--set` and `--clock_mhz` applied.
    pub fn config(&self) -> Result<ChipConfig> {
        self.config_or(DEFAULT_SOC)
    }

    /// The chip, with `preset` (a compiled model's `soc_version`) as the default preset.
    pub fn config_or(&self, preset: &str) -> Result<ChipConfig> {
        self.choice().config_or(preset)
    }

    /// The flags as the library takes them.
    pub fn choice(&self) -> ChipChoice {
        ChipChoice {
            soc_version: self.soc_version.clone(),
            chip_config: self.chip_config.clone(),
            clock_mhz: self.clock_mhz,
            settings: self.set.clone(),
        }
    }
}

/// Where to write a trace of the command's simulation.
#[derive(Args)]
pub struct TraceArgs {
    /// Write a trace of the run (tasks, host, DMA, and per core its kernels or instructions)
    /// to this .gtrace file.
    #[arg(long = "trace", value_name = "FILE.gtrace")]
    trace: Option<PathBuf>,
    /// What the trace records: task (streams, host, PCIe, AI CPU, memory counters), kernel
    /// (those plus one span per kernel block on each core and its pipes' busy shares) or
    /// instruction (every instruction, flag and DMA on every pipe) [default: kernel for models,
    /// instruction for hand-written kernels].
    #[arg(long = "trace_level", value_name = "LEVEL", requires = "trace", value_parser = parse_level)]
    trace_level: Option<Level>,
}

impl TraceArgs {
    /// Starts the trace file, if one was asked for, at `--trace_level` or else `default`.
    pub fn open(
        &self,
        cfg: &ChipConfig,
        what: &str,
        mode: ExecMode,
        default: Level,
    ) -> Result<Option<TraceFileWriter>> {
        let level = self.trace_level.unwrap_or(default);
        open_trace(self.trace.as_deref(), cfg, what, mode, level)
    }
}

fn parse_level(s: &str) -> Result<Level, String> {
    Level::parse(s).ok_or_else(|| format!("expected task, kernel or instruction, got `{s}`"))
}

/// atc's gear options: input shapes with `-1` for the axes gears set, and one gear list.
#[derive(Args)]
pub struct GearArgs {
    /// Input shapes: "name:d0,d1,...;name2:..." with -1 for gear axes.
    #[arg(long = "input_shape", allow_hyphen_values = true)]
    input_shape: Option<String>,
    /// Batch gears: "1,2,4,8".
    #[arg(long = "dynamic_batch_size", allow_hyphen_values = true)]
    dynamic_batch_size: Option<String>,
    /// Image size gears: "h1,w1;h2,w2".
    #[arg(long = "dynamic_image_size", allow_hyphen_values = true)]
    dynamic_image_size: Option<String>,
    /// Dims gears: "d0,d1,...;d0,d1,..." (one value per -1 of --input_shape, in order).
    #[arg(long = "dynamic_dims", allow_hyphen_values = true)]
    dynamic_dims: Option<String>,
    /// Layout of the inputs: NCHW (default), NHWC or ND.
    #[arg(long = "input_format")]
    input_format: Option<String>,
    /// Static AIPP configuration (protobuf text, `aipp_op { ... }`): the input it names
    /// becomes an 8-bit NHWC image pre-processed on the AI core in front of the first layer.
    #[arg(long = "insert_op_conf", value_name = "FILE")]
    insert_op_conf: Option<std::path::PathBuf>,
    /// 1: a first convolution of at most 4 input channels behind AIPP loads the image as C04
    /// (4 channels a pixel, GE's small-channel optimisation); 0 (default): 16 channels a pixel.
    #[arg(long = "enable_small_channel", value_name = "0|1")]
    enable_small_channel: Option<String>,
}

impl GearArgs {
    /// The flags as the library takes them.
    pub fn flags(&self) -> GearFlags {
        GearFlags {
            input_shape: self.input_shape.clone(),
            dynamic_batch_size: self.dynamic_batch_size.clone(),
            dynamic_image_size: self.dynamic_image_size.clone(),
            dynamic_dims: self.dynamic_dims.clone(),
            input_format: self.input_format.clone(),
            insert_op_conf: self.insert_op_conf.clone(),
            enable_small_channel: self.enable_small_channel.clone(),
        }
    }

    /// The compiler's gear options (the AIPP configuration file read).
    pub fn options(&self) -> Result<GearOptions> {
        self.flags().options()
    }

    /// Whether any shape or gear option was given (`--input_format` alone is not).
    pub fn any_shape(&self) -> bool {
        self.flags().any_shape()
    }
}
