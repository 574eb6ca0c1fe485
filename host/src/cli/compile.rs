//! `gearsim compile`: an ONNX model compiled into a `.om` for a chip, as atc does (gear
//! options, GetNext sink, hybrid mode, graph and kernel dumps), verified before it is written.

use std::path::PathBuf;

use clap::Args;
use gearsim_host::options::AtcRequest;

use super::Failure;
use super::flags::{ChipArgs, GearArgs};

#[derive(Args)]
pub struct CompileArgs {
    /// The ONNX model.
    #[arg(long = "model", value_name = "FILE.onnx")]
    model: PathBuf,
    /// Output name: writes NAME.om.
    #[arg(long = "output", value_name = "NAME")]
    output: PathBuf,
    /// Source framework: 5 (ONNX) is the only one gearsim reads.
    #[arg(long = "framework", default_value_t = 5)]
    framework: u32,
    #[command(flatten)]
    chip: ChipArgs,
    #[command(flatten)]
    gear: GearArgs,
    /// GetNext sink mode: inputs come from a data queue and the gear vector from
    /// GetDynamicDims on the device (instead of the ascend_mbatch_shape_data input).
    #[arg(long = "getnext_sink")]
    getnext_sink: bool,
    /// Gear table layout in device memory: gear_major (GE's), dim_major8 (the TIK kernel's)
    /// or sorted_binary (gearsim's: rows sorted for a binary search).
    #[arg(long = "gear_table_layout", default_value = "gear_major")]
    gear_table_layout: String,
    /// Engine that runs MapIndex: aicore or aicpu.
    #[arg(long = "mapindex_engine", default_value = "aicore")]
    mapindex_engine: String,
    /// Write the graph before and after the gear passes as text into DIR.
    #[arg(long = "dump_graph", value_name = "DIR")]
    dump_graph: Option<PathBuf>,
    /// Write every kernel's tiling and disassembly into DIR (one .s file per kernel).
    #[arg(long = "dump_kernels", value_name = "DIR")]
    dump_kernels: Option<PathBuf>,
    /// Fusion passes to switch on or off (atc's format: {"Switch": {"GraphFusion": {"ALL":
    /// "off"}, "UBFusion": {...}}}); every pass runs by default. Passes:
    /// ConvActivationFusionPass, MatMulActivationFusionPass, ElemwiseActivationFusionPass,
    /// ConvResidualAddFusionPass, AippConvFusionPass, MatMulBiasAddFusionPass, GeluFusionPass.
    #[arg(long = "fusion_switch_file", value_name = "FILE.json")]
    fusion_switch_file: Option<PathBuf>,
    /// Which fp32 ops compute in fp16: force_fp16 (atc's default on these chips),
    /// allow_fp32_to_fp16, must_keep_origin_dtype or allow_mix_precision.
    #[arg(long = "precision_mode", default_value = "force_fp16")]
    precision_mode: String,
    /// L2 control: l2_optimize (atc's default: each launch keeps the feature maps it makes in
    /// L2 for their readers, within half the L2, and forgets dead ones without a write-back)
    /// or off_optimize (the L2 is a plain cache).
    #[arg(long = "buffer_optimize", default_value = "l2_optimize")]
    buffer_optimize: String,
    /// Hybrid mode: also store the source graph, so input shapes that match no gear run a
    /// dynamic-shape path (op by op, kernels cached by shape) instead of failing with E13025.
    #[arg(long = "hybrid")]
    hybrid: bool,
}

/// Compiles, verifies and writes the model, then reports its sizes and timings.
pub fn run(a: &CompileArgs) -> Result<(), Failure> {
    let r = AtcRequest {
        model: a.model.clone(),
        output: a.output.clone(),
        framework: a.framework,
        chip: a.chip.choice(),
        gear: a.gear.flags(),
        getnext_sink: a.getnext_sink,
        gear_table_layout: a.gear_table_layout.clone(),
        mapindex_engine: a.mapindex_engine.clone(),
        dump_graph: a.dump_graph.clone(),
        dump_kernels: a.dump_kernels.clone(),
        fusion_switch_file: a.fusion_switch_file.clone(),
        precision_mode: a.precision_mode.clone(),
        buffer_optimize: a.buffer_optimize.clone(),
        hybrid: a.hybrid,
    }
    .compile()?;
    for note in &r.compiled.notes {
        eprintln!("note: {note}");
    }
    let m = &r.compiled.desc.memory;
    let gears = r
        .compiled
        .desc
        .dynamic
        .as_ref()
        .map_or(0, |d| d.gears.len());
    say!(
        "{}: {} bytes, {} gear(s), {} kernel(s), weights {} B, feature maps {} B (largest gear), \
         inputs {} B, outputs {} B; compiled in {:.1} ms, verified in {:.1} ms ({} launches)",
        r.om.display(),
        r.om_bytes,
        gears,
        r.compiled.emitted.kernels.len(),
        m.weight_bytes,
        m.feature_map_bytes,
        m.input_bytes,
        m.output_bytes,
        r.elapsed.as_secs_f64() * 1e3,
        r.verify_elapsed.as_secs_f64() * 1e3,
        r.verified.launches
    );
    for n in &r.verified.notes {
        eprintln!("note: verifier: {n}");
    }
    for d in &r.dumps {
        say!("dump: {}", d.display());
    }
    Ok(())
}
