//! Running one hand-written kernel: kernel argument specifications, buffer set-up, the launch,
//! and the report `gearsim kernel run` prints.

use std::fmt;
use std::path::PathBuf;

use gearsim_firmware::{Device, DeviceError, DevicePtr, LaunchReport};
use gearsim_isa::{Pipe, Program};
use gearsim_sim::ExecMode;
use gearsim_traces::TraceSink;
use half::f16;
use thiserror::Error;

/// Element type of a generated buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemType {
    /// IEEE binary16.
    F16,
    /// IEEE binary32.
    F32,
    /// 32-bit signed integer.
    I32,
    /// 16-bit signed integer.
    I16,
    /// Byte.
    U8,
}

impl ElemType {
    fn parse(s: &str) -> Option<ElemType> {
        Some(match s {
            "f16" => ElemType::F16,
            "f32" => ElemType::F32,
            "i32" => ElemType::I32,
            "i16" => ElemType::I16,
            "u8" => ElemType::U8,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            ElemType::F16 | ElemType::I16 => 2,
            ElemType::F32 | ElemType::I32 => 4,
            ElemType::U8 => 1,
        }
    }

    fn encode(self, v: f64, out: &mut Vec<u8>) {
        match self {
            ElemType::F16 => out.extend_from_slice(&f16::from_f64(v).to_bits().to_le_bytes()),
            ElemType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            ElemType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            ElemType::I16 => out.extend_from_slice(&(v as i16).to_le_bytes()),
            ElemType::U8 => out.push(v as u8),
        }
    }
}

/// How a kernel argument's device buffer is filled.
#[derive(Debug, Clone, PartialEq)]
pub enum BufferInit {
    /// `zeros:BYTES`.
    Zeros(u64),
    /// `rand:TYPE:COUNT[:SEED]`: uniform in [-1, 1) for floats, [-1000, 1000) for integers.
    Random {
        /// Element type.
        ty: ElemType,
        /// Elements.
        count: u64,
        /// Seed.
        seed: u64,
    },
    /// `seq:TYPE:COUNT`: 0, 1, 2, ...
    Seq {
        /// Element type.
        ty: ElemType,
        /// Elements.
        count: u64,
    },
    /// `fill:TYPE:COUNT:VALUE`.
    Fill {
        /// Element type.
        ty: ElemType,
        /// Elements.
        count: u64,
        /// Value.
        value: f64,
    },
    /// `file:PATH`: the file's bytes.
    File(PathBuf),
}

/// One kernel argument: a plain value or the address of a buffer.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgSpec {
    /// A 64-bit value.
    Value(u64),
    /// A device buffer, optionally named (named buffers can be saved after the run).
    Buffer {
        /// Name given as `NAME=SPEC`.
        name: Option<String>,
        /// Contents.
        init: BufferInit,
    },
}

/// A bad `--args` item.
#[derive(Debug, Error, PartialEq)]
#[error("--args item {index} `{item}`: {message}")]
pub struct ArgError {
    /// 1-based position in the list.
    pub index: usize,
    /// The item text.
    pub item: String,
    /// What was expected.
    pub message: String,
}

fn parse_count(s: &str) -> Option<u64> {
    let (num, mul) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    parse_u64(num)?.checked_mul(mul)
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.replace('_', "");
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

const SPEC_HELP: &str = "expected a number (k/m/g suffixes allowed), or [NAME=]zeros:BYTES | rand:TYPE:COUNT[:SEED] | seq:TYPE:COUNT | fill:TYPE:COUNT:VALUE | file:PATH (TYPE is f16, f32, i32, i16 or u8; counts take k/m/g suffixes)";

/// Parses a comma-separated `--args` list.
pub fn parse_args(list: &str) -> Result<Vec<ArgSpec>, ArgError> {
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    list.split(',')
        .enumerate()
        .map(|(i, item)| parse_arg(i + 1, item.trim()))
        .collect()
}

fn parse_arg(index: usize, item: &str) -> Result<ArgSpec, ArgError> {
    let err = |message: String| ArgError {
        index,
        item: item.to_string(),
        message,
    };
    if let Some(v) = parse_count(item) {
        return Ok(ArgSpec::Value(v));
    }
    if let Some(neg) = item.strip_prefix('-').and_then(parse_u64) {
        return Ok(ArgSpec::Value((neg as i64).wrapping_neg() as u64));
    }
    let (name, spec) = match item.split_once('=') {
        Some((n, s)) => {
            let ok = !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(err(format!(
                    "buffer name `{n}` must be letters, digits, `_` or `-`"
                )));
            }
            (Some(n.to_string()), s)
        }
        None => (None, item),
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let ty = |s: &str| {
        ElemType::parse(s).ok_or_else(|| {
            err(format!(
                "unknown element type `{s}` (expected f16, f32, i32, i16 or u8)"
            ))
        })
    };
    let count = |s: &str| parse_count(s).ok_or_else(|| err(format!("`{s}` is not a count")));
    let init = match parts.as_slice() {
        ["zeros", n] => BufferInit::Zeros(count(n)?),
        ["rand", t, n] => BufferInit::Random {
            ty: ty(t)?,
            count: count(n)?,
            seed: 0,
        },
        ["rand", t, n, s] => BufferInit::Random {
            ty: ty(t)?,
            count: count(n)?,
            seed: parse_u64(s).ok_or_else(|| err(format!("seed `{s}` is not a number")))?,
        },
        ["seq", t, n] => BufferInit::Seq {
            ty: ty(t)?,
            count: count(n)?,
        },
        ["fill", t, n, v] => BufferInit::Fill {
            ty: ty(t)?,
            count: count(n)?,
            value: v
                .parse()
                .map_err(|_| err(format!("fill value `{v}` is not a number")))?,
        },
        ["file", ..] if spec.len() > 5 => BufferInit::File(PathBuf::from(&spec[5..])),
        _ => return Err(err(SPEC_HELP.to_string())),
    };
    Ok(ArgSpec::Buffer { name, init })
}

/// Largest buffer `gearsim kernel run` creates from a spec (the chip's memory still bounds it).
pub const MAX_GENERATED_BYTES: u64 = 4 << 30;

fn buffer_bytes(init: &BufferInit) -> Result<Vec<u8>, String> {
    let generated = |ty: ElemType, count: u64, f: &mut dyn FnMut(u64) -> f64| {
        let bytes = count
            .checked_mul(ty.size())
            .filter(|b| *b <= MAX_GENERATED_BYTES)
            .ok_or_else(|| {
                format!(
                    "{count} elements of {} bytes exceed the {MAX_GENERATED_BYTES}-byte limit",
                    ty.size()
                )
            })?;
        let mut out = Vec::with_capacity(bytes as usize);
        for i in 0..count {
            ty.encode(f(i), &mut out);
        }
        Ok(out)
    };
    match init {
        BufferInit::Zeros(n) => {
            if *n > MAX_GENERATED_BYTES {
                return Err(format!(
                    "{n} bytes exceed the {MAX_GENERATED_BYTES}-byte limit"
                ));
            }
            Ok(vec![0; *n as usize])
        }
        BufferInit::Random { ty, count, seed } => {
            let mut state = *seed ^ 0x5eed_0f9e_a551_u64;
            let float = matches!(ty, ElemType::F16 | ElemType::F32);
            generated(*ty, *count, &mut |_| {
                state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^= z >> 31;
                let u = (z >> 11) as f64 / (1u64 << 53) as f64;
                if float {
                    2.0 * u - 1.0
                } else {
                    (2000.0 * u - 1000.0).floor()
                }
            })
        }
        BufferInit::Seq { ty, count } => generated(*ty, *count, &mut |i| i as f64),
        BufferInit::Fill { ty, count, value } => generated(*ty, *count, &mut |_| *value),
        BufferInit::File(path) => {
            let meta = std::fs::metadata(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if meta.len() > MAX_GENERATED_BYTES {
                return Err(format!(
                    "{} is {} bytes, more than the {MAX_GENERATED_BYTES}-byte limit",
                    path.display(),
                    meta.len()
                ));
            }
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
        }
    }
}

/// A buffer created for a kernel argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgBuffer {
    /// Its name, if it has one.
    pub name: Option<String>,
    /// Device address.
    pub ptr: DevicePtr,
    /// Size in bytes.
    pub len: u64,
}

/// Why a kernel run failed.
#[derive(Debug, Error)]
pub enum RunError {
    /// A buffer could not be created.
    #[error("--args item {index}: {message}")]
    Buffer {
        /// 1-based argument position.
        index: usize,
        /// Why.
        message: String,
    },
    /// The device refused or the hardware faulted.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl RunError {
    /// Whether a block ran past the kernel timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            RunError::Device(DeviceError::Fault(gearsim_sim::StopReason::Timeout { .. }))
        )
    }
}

/// What `gearsim kernel run` reports.
#[derive(Debug, Clone)]
pub struct KernelRunReport {
    /// Kernel name.
    pub kernel: String,
    /// Preset name.
    pub chip: String,
    /// Core clock in MHz.
    pub clock_mhz: u64,
    /// The chip's cores, as a phrase (`32 cores`, or a separated chip's cube and vector cores).
    pub chip_cores: String,
    /// Execution mode.
    pub mode: ExecMode,
    /// The launch.
    pub launch: LaunchReport,
    /// Bytes read from / written to device memory by DMAs.
    pub traffic: (u64, u64),
    /// Buffers created for the arguments.
    pub buffers: Vec<ArgBuffer>,
}

impl KernelRunReport {
    /// Kernel time (first block start to last block end) in core cycles.
    pub fn cycles(&self) -> u64 {
        let ps = self.launch.end.0.saturating_sub(self.launch.first_start.0);
        (u128::from(ps) * u128::from(self.clock_mhz)).div_ceil(1_000_000) as u64
    }

    /// Busy share of each pipe over the kernel time, averaged over the cores the launch used.
    pub fn busy_percent(&self) -> [f64; 7] {
        let cycles = self.cycles().max(1) as f64 * f64::from(self.launch.cores_used.max(1));
        self.launch.busy_cycles().map(|b| 100.0 * b as f64 / cycles)
    }
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / f64::from(1 << 20))
}

impl fmt::Display for KernelRunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.mode {
            ExecMode::Full => "full",
            ExecMode::TimingOnly => "timing-only",
        };
        writeln!(
            f,
            "kernel {} on {} ({} @ {} MHz), block_dim {}, {mode} mode",
            self.kernel, self.chip, self.chip_cores, self.clock_mhz, self.launch.blocks
        )?;
        let us = |ps: u64| ps as f64 / 1e6;
        writeln!(
            f,
            "total cycles: {} ({:.3} us at {} MHz); submit to end {:.3} us",
            self.cycles(),
            us(self.launch.end.0 - self.launch.first_start.0),
            self.clock_mhz,
            us(self.launch.end.0 - self.launch.submitted.0)
        )?;
        writeln!(
            f,
            "blocks: {} on {} cores; instructions: {}",
            self.launch.blocks,
            self.launch.cores_used,
            self.launch.instructions()
        )?;
        writeln!(f, "pipe busy (% of kernel time, mean over the cores used):")?;
        for (p, pct) in Pipe::EXECUTING.iter().zip(self.busy_percent()) {
            writeln!(f, "  {:<7} {pct:6.2}%", p.lane_name())?;
        }
        if self.launch.cube_macs() > 0 {
            let peak = 4096.0 * self.cycles() as f64 * f64::from(self.launch.cores_used.max(1));
            writeln!(
                f,
                "cube: {} MACs, {:.1}% of the f16 peak on the cores used (i8 peaks at 200%)",
                self.launch.cube_macs(),
                100.0 * self.launch.cube_macs() as f64 / peak
            )?;
        }
        write!(
            f,
            "device memory traffic: read {}, written {}",
            mib(self.traffic.0),
            mib(self.traffic.1)
        )
    }
}

/// Creates the argument buffers, launches the kernel and runs it to completion.
pub fn run_kernel<S: TraceSink>(
    dev: &mut Device<S>,
    program: Program,
    block_dim: u32,
    args: &[ArgSpec],
    mode: ExecMode,
) -> Result<KernelRunReport, RunError> {
    let mut values = Vec::with_capacity(args.len());
    let mut buffers = Vec::new();
    for (i, a) in args.iter().enumerate() {
        match a {
            ArgSpec::Value(v) => values.push(*v),
            ArgSpec::Buffer {
                name,
                init: BufferInit::Zeros(len),
            } => {
                // Zeros need no host copy: fill the device range directly.
                let ptr = dev.alloc(*len)?;
                dev.fill(ptr, *len, 0)?;
                values.push(ptr.0);
                buffers.push(ArgBuffer {
                    name: name.clone(),
                    ptr,
                    len: *len,
                });
            }
            ArgSpec::Buffer { name, init } => {
                let bytes = buffer_bytes(init).map_err(|message| RunError::Buffer {
                    index: i + 1,
                    message,
                })?;
                let ptr = dev.alloc(bytes.len() as u64)?;
                dev.write(ptr, &bytes)?;
                values.push(ptr.0);
                buffers.push(ArgBuffer {
                    name: name.clone(),
                    ptr,
                    len: bytes.len() as u64,
                });
            }
        }
    }
    let kernel_name = program.display_name().to_string();
    let kernel = dev.load_kernel(program)?;
    let before = dev.chip().memory_traffic();
    let launch = dev.launch(kernel, block_dim, &values, mode)?;
    let after = dev.chip().memory_traffic();
    let cfg = dev.chip().config();
    Ok(KernelRunReport {
        kernel: kernel_name,
        chip: cfg.name.clone(),
        clock_mhz: cfg.core.clock_mhz,
        chip_cores: match cfg.core.architecture {
            gearsim_sim::Architecture::Coupled => format!("{} cores", cfg.core.count),
            gearsim_sim::Architecture::Separated => format!(
                "{} AI cores: {} cube + {} vector cores",
                cfg.core.count,
                cfg.core.count,
                cfg.cores_with(gearsim_isa::Pipe::V)
            ),
        },
        mode,
        launch,
        traffic: (after.0 - before.0, after.1 - before.1),
        buffers,
    })
}
