//! Shared helpers for gearsim's end-to-end tests and benches: example kernels, deterministic
//! random data, a device set up for one kernel launch, and the provisioning of the ONNX node
//! tests ([`onnx_node_tests`]).

pub mod onnx_node_tests;

use std::path::{Path, PathBuf};

use gearsim_firmware::{Device, DevicePtr, LaunchReport};
use gearsim_isa::Program;
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::TraceSink;
use half::f16;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Assembles one of `host/examples/kernels/<name>.s`.
pub fn example_kernel(name: &str) -> Program {
    let path = workspace_root()
        .join("host/examples/kernels")
        .join(format!("{name}.s"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    gearsim_isa::assemble(&text, &path.display().to_string()).unwrap_or_else(|e| panic!("{e}"))
}

/// A small deterministic generator (SplitMix64), so test data is the same everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform value in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }

    /// `n` fp16 values uniform in [lo, hi).
    pub fn f16s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f32(self.uniform(lo, hi)))
            .collect()
    }
}

/// Little-endian bytes of fp16 values.
pub fn f16_bytes(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect()
}

/// fp16 values from little-endian bytes.
pub fn f16_from_bytes(b: &[u8]) -> Vec<f16> {
    b.chunks_exact(2)
        .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

/// f32 values from little-endian bytes.
pub fn f32_from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A device for a preset.
pub fn device<S: TraceSink>(preset: &str, sink: S) -> Device<S> {
    Device::new(
        ChipConfig::preset(preset).unwrap_or_else(|e| panic!("{e}")),
        sink,
    )
}

/// Allocates and fills a device buffer.
pub fn upload<S: TraceSink>(dev: &mut Device<S>, data: &[u8]) -> DevicePtr {
    let p = dev
        .alloc(data.len() as u64)
        .unwrap_or_else(|e| panic!("{e}"));
    dev.write(p, data).unwrap_or_else(|e| panic!("{e}"));
    p
}

/// Reads a device buffer.
pub fn download<S: TraceSink>(dev: &mut Device<S>, p: DevicePtr, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    dev.read(p, &mut buf).unwrap_or_else(|e| panic!("{e}"));
    buf
}

/// Runs the double-buffered vector add over `n` random fp16 values on `block_dim` blocks and
/// returns (x, y, z, report).
pub fn run_vadd<S: TraceSink>(
    dev: &mut Device<S>,
    n: usize,
    block_dim: u32,
    mode: ExecMode,
    seed: u64,
) -> (Vec<f16>, Vec<f16>, Vec<f16>, LaunchReport) {
    let mut rng = Rng::new(seed);
    let x = rng.f16s(n, -100.0, 100.0);
    let y = rng.f16s(n, -100.0, 100.0);
    let px = upload(dev, &f16_bytes(&x));
    let py = upload(dev, &f16_bytes(&y));
    let pz = dev.alloc(2 * n as u64).unwrap_or_else(|e| panic!("{e}"));
    let k = dev
        .load_kernel(example_kernel("vadd_f16_db"))
        .unwrap_or_else(|e| panic!("{e}"));
    let report = dev
        .launch(k, block_dim, &[px.0, py.0, pz.0, n as u64], mode)
        .unwrap_or_else(|e| panic!("{e}"));
    let z = f16_from_bytes(&download(dev, pz, 2 * n));
    (x, y, z, report)
}
