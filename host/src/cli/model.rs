//! `gearsim model`: writes one of the built-in network structures (the calibration and study
//! workloads: ResNet-18/50, MobileNetV2, BERT-base) as an ONNX file with seeded random weights,
//! to compile, run or trace with the other commands.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;
use gearsim_host::calibrate::nets::{DType, Net};
use gearsim_traces::atomic::write_atomic;

use super::Failure;

#[derive(Args)]
pub struct ModelArgs {
    /// The network: resnet18, resnet50, mobilenetv2 or bertbase.
    #[arg(long = "net")]
    net: String,
    /// Images (sequences) per batch; -1 leaves the batch axis dynamic for gears.
    #[arg(long = "batch", default_value_t = 1, allow_negative_numbers = true)]
    batch: i64,
    /// Element type of inputs, weights and activations: f32 (as torch.onnx.export writes it;
    /// atc's default precision mode computes it in fp16) or f16 (converted beforehand).
    #[arg(long = "dtype", default_value = "f32")]
    dtype: String,
    /// Seed of the random weights.
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// Where to write the model.
    #[arg(long = "output", value_name = "FILE.onnx")]
    output: PathBuf,
}

/// Runs `gearsim model`.
pub fn run(a: &ModelArgs) -> Result<(), Failure> {
    let net = Net::network(&a.net).ok_or_else(|| {
        anyhow!(
            "--net: expected one of {}, got `{}`",
            Net::network_names(),
            a.net
        )
    })?;
    let dtype = match a.dtype.as_str() {
        "f16" => DType::F16,
        "f32" => DType::F32,
        other => return Err(anyhow!("--dtype: expected f16 or f32, got `{other}`").into()),
    };
    if a.batch == 0 || a.batch < -1 {
        return Err(anyhow!("--batch: expected a positive batch or -1, got {}", a.batch).into());
    }
    let bytes = net.onnx(a.batch, dtype, a.seed);
    write_atomic(&a.output, &bytes).with_context(|| format!("{}", a.output.display()))?;
    say!(
        "wrote {} ({}, batch {}, {}, {:.1} M MACs per item, {} bytes)",
        a.output.display(),
        net.name(),
        a.batch,
        a.dtype,
        net.macs_per_image() as f64 / 1e6,
        bytes.len()
    );
    Ok(())
}
