//! The user's options as plain values, turned into the chip and the compiler's options in one
//! place, so that the command line and the Python package check them the same way and give
//! the same errors (E-codes included).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use gearsim_compiler::memory::BufferOptimize;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, MapIndexEngine, TableLayout};
use gearsim_compiler::precision::PrecisionMode;
use gearsim_sim::{ChipConfig, Setting};

use crate::atc::{self, CompileReport, Dumps};

/// The preset a command uses when neither a preset nor a chip file is given and no compiled
/// model names one.
pub const DEFAULT_SOC: &str = "ascend910";

/// Which chip to simulate: a preset, or a chip file, and a clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChipChoice {
    /// atc's `--soc_version` (a preset name).
    pub soc_version: Option<String>,
    /// A chip configuration TOML file instead of the preset.
    pub chip_config: Option<PathBuf>,
    /// The AI core clock in MHz instead of the preset's.
    pub clock_mhz: Option<u64>,
    /// `section.key=value` changes to the file's or the preset's values (sensitivity runs).
    pub settings: Vec<Setting>,
}

impl ChipChoice {
    /// The chip, with `preset` (a compiled model's `soc_version`) as the default preset. The
    /// one function that turns the options into a `ChipConfig`.
    pub fn config_or(&self, preset: &str) -> Result<ChipConfig> {
        let mut cfg = match &self.chip_config {
            Some(path) => read_chip_config(path, &self.settings)?,
            None => ChipConfig::preset_with(
                self.soc_version.as_deref().unwrap_or(preset),
                &self.settings,
            )?,
        };
        if let Some(mhz) = self.clock_mhz {
            cfg.core.clock_mhz = mhz;
            cfg.validate("--clock_mhz")?;
        }
        Ok(cfg)
    }
}

/// A chip configuration TOML file (the schema of `sim/presets`) with `settings` applied to its
/// values, validated; errors name it.
pub fn read_chip_config(path: &Path, settings: &[Setting]) -> Result<ChipConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(ChipConfig::from_toml_with(
        &text,
        &path.display().to_string(),
        settings,
    )?)
}

/// atc's gear and input options as the user spells them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GearFlags {
    /// `--input_shape`.
    pub input_shape: Option<String>,
    /// `--dynamic_batch_size`.
    pub dynamic_batch_size: Option<String>,
    /// `--dynamic_image_size`.
    pub dynamic_image_size: Option<String>,
    /// `--dynamic_dims`.
    pub dynamic_dims: Option<String>,
    /// `--input_format`.
    pub input_format: Option<String>,
    /// `--insert_op_conf` (a file).
    pub insert_op_conf: Option<PathBuf>,
    /// `--enable_small_channel` (`0` or `1`).
    pub enable_small_channel: Option<String>,
}

impl GearFlags {
    /// The compiler's gear options (the AIPP configuration file read).
    pub fn options(&self) -> Result<GearOptions> {
        let (conf, text) = match &self.insert_op_conf {
            None => (None, None),
            Some(p) => {
                let bytes = std::fs::read(p)
                    .with_context(|| format!("--insert_op_conf {}: cannot read", p.display()))?;
                // Sample configurations carry a byte-order mark or comments in a local code
                // page; the fields are ASCII, so anything else only ever reaches an error.
                let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&bytes);
                let text = String::from_utf8_lossy(bytes).into_owned();
                (Some(p.display().to_string()), Some(text))
            }
        };
        Ok(GearOptions {
            input_shape: self.input_shape.clone(),
            dynamic_batch_size: self.dynamic_batch_size.clone(),
            dynamic_image_size: self.dynamic_image_size.clone(),
            dynamic_dims: self.dynamic_dims.clone(),
            input_format: self.input_format.clone(),
            insert_op_conf: conf,
            insert_op_conf_text: text,
            enable_small_channel: match &self.enable_small_channel {
                None => false,
                Some(v) => gearsim_compiler::options::parse_small_channel(v)?,
            },
            ..GearOptions::default()
        })
    }

    /// Whether any shape or gear option was given (`input_format` alone is not).
    pub fn any_shape(&self) -> bool {
        self.input_shape.is_some()
            || self.dynamic_batch_size.is_some()
            || self.dynamic_image_size.is_some()
            || self.dynamic_dims.is_some()
    }
}

/// Everything `gearsim compile` (atc) is told, as the user spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AtcRequest {
    /// The ONNX model.
    pub model: PathBuf,
    /// Output name (writes `NAME.om`).
    pub output: PathBuf,
    /// `--framework` (5, ONNX, is the only one read).
    pub framework: u32,
    /// The chip.
    pub chip: ChipChoice,
    /// Gear and input options.
    pub gear: GearFlags,
    /// `--getnext_sink`.
    pub getnext_sink: bool,
    /// `--gear_table_layout`.
    pub gear_table_layout: String,
    /// `--mapindex_engine`.
    pub mapindex_engine: String,
    /// `--dump_graph DIR`.
    pub dump_graph: Option<PathBuf>,
    /// `--dump_kernels DIR`.
    pub dump_kernels: Option<PathBuf>,
    /// `--fusion_switch_file`.
    pub fusion_switch_file: Option<PathBuf>,
    /// `--precision_mode`.
    pub precision_mode: String,
    /// `--buffer_optimize`.
    pub buffer_optimize: String,
    /// `--hybrid`.
    pub hybrid: bool,
}

impl AtcRequest {
    /// A request with atc's defaults for everything but the model and the output.
    pub fn new(model: PathBuf, output: PathBuf) -> AtcRequest {
        AtcRequest {
            model,
            output,
            framework: 5,
            chip: ChipChoice::default(),
            gear: GearFlags::default(),
            getnext_sink: false,
            gear_table_layout: "gear_major".into(),
            mapindex_engine: "aicore".into(),
            dump_graph: None,
            dump_kernels: None,
            fusion_switch_file: None,
            precision_mode: "force_fp16".into(),
            buffer_optimize: "l2_optimize".into(),
            hybrid: false,
        }
    }

    /// Checks every option, compiles, verifies and writes the model (nothing is written when
    /// any step fails).
    pub fn compile(&self) -> Result<CompileReport> {
        if self.framework != 5 {
            bail!(
                "E10001: Value {} for parameter --framework is invalid. Reason: gearsim reads \
                 ONNX models only (--framework=5)",
                self.framework
            );
        }
        let table_layout = TableLayout::parse(&self.gear_table_layout).ok_or_else(|| {
            anyhow!(
                "--gear_table_layout: expected one of {}, got `{}`",
                TableLayout::names(),
                self.gear_table_layout
            )
        })?;
        let mapindex_engine = MapIndexEngine::parse(&self.mapindex_engine).ok_or_else(|| {
            anyhow!(
                "--mapindex_engine: expected aicore or aicpu, got `{}`",
                self.mapindex_engine
            )
        })?;
        let chip = self.chip.config_or(DEFAULT_SOC)?;
        let fusion = match &self.fusion_switch_file {
            None => Default::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("--fusion_switch_file {}", p.display()))?;
                atc::fusion_switches(&text, &p.display().to_string()).map_err(|e| anyhow!(e))?
            }
        };
        let precision = PrecisionMode::parse(&self.precision_mode)?;
        let mut target = crate::target::for_chip(&chip);
        target.buffer_optimize = BufferOptimize::parse(&self.buffer_optimize)?;
        let opts = CompileOptions {
            gear: self.gear.options()?,
            getnext_sink: self.getnext_sink,
            table_layout,
            mapindex_engine,
            target,
            fusion,
            precision,
        };
        if self.hybrid && self.getnext_sink {
            bail!(
                "--hybrid and --getnext_sink exclude each other: in sink mode the device picks \
                 the branch, so there is no host-side fallback to take"
            );
        }
        let om = atc::om_path(&self.output);
        let dumps = Dumps {
            graph: self.dump_graph.as_deref(),
            kernels: self.dump_kernels.as_deref(),
        };
        atc::compile_file(&self.model, &om, &opts, &chip, dumps, self.hybrid)
    }
}
