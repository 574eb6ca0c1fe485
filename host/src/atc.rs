//! What `gearsim compile`, `gearsim verify` and `gearsim info` do around the compiler: reading
//! the model, writing `NAME.om` (whole or not at all) and the graph dumps, verifying a `.om`
//! for a chip, and the JSON description of a `.om`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gearsim_isa::om::ModelDesc;
use gearsim_sim::ChipConfig;
use serde_json::{Value as Json, json};

use crate::files::OmMap;
use crate::verify::{ModelView, Report, verify};
use gearsim_compiler::fusion::{self, FusionSwitches};
use gearsim_compiler::ir::DataType;
use gearsim_compiler::options::DynamicMode;
use gearsim_compiler::pipeline::{CompileOptions, Compiled, MapIndexEngine, TableLayout, compile};

use gearsim_isa::Program;
use gearsim_isa::om::SectionKind;
use gearsim_isa::omtask::{ModelTasks, OmTask, decode_kernels};
use gearsim_traces::atomic::write_atomic;

/// The compiler's view of a chip configuration (defined in [`crate::target`]; re-exported
/// here for callers that build compile options).
pub use crate::target::for_chip as target;

/// The `.om` path atc writes for `--output=NAME`: `NAME.om` (an `.om` already there is kept).
pub fn om_path(output: &Path) -> PathBuf {
    if output.extension().is_some_and(|e| e == "om") {
        output.to_path_buf()
    } else {
        let mut s = output.as_os_str().to_os_string();
        s.push(".om");
        PathBuf::from(s)
    }
}

/// A finished compile.
pub struct CompileReport {
    /// Where the model went.
    pub om: PathBuf,
    /// Its size.
    pub om_bytes: u64,
    /// The compiled model.
    pub compiled: Compiled,
    /// Wall time of the compile itself (front, middle and back end, no file I/O).
    pub elapsed: Duration,
    /// Wall time of the verifier.
    pub verify_elapsed: Duration,
    /// What the verifier found (no violations, or the compile would have failed).
    pub verified: Report,
    /// Dump files written.
    pub dumps: Vec<PathBuf>,
}

/// Where `gearsim compile` writes its dumps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dumps<'a> {
    /// `--dump_graph DIR`: `<name>.before.txt` and `<name>.after.txt`.
    pub graph: Option<&'a Path>,
    /// `--dump_kernels DIR`: one file per kernel, its listing (tiling and comments included).
    pub kernels: Option<&'a Path>,
}

/// Compiles `model` for chip `cfg`, verifies the result and writes `om`. Dumps are written
/// even when verification fails (they are what one debugs it with); the `.om` only when
/// everything succeeded.
pub fn compile_file(
    model: &Path,
    om: &Path,
    opts: &CompileOptions,
    cfg: &ChipConfig,
    dumps: Dumps<'_>,
    hybrid: bool,
) -> Result<CompileReport> {
    let bytes = std::fs::read(model).with_context(|| format!("cannot read {}", model.display()))?;
    let start = Instant::now();
    let compiled = compile(&bytes, &model.display().to_string(), opts)?;
    let elapsed = start.elapsed();
    let mut written = Vec::new();
    if let Some(dir) = dumps.graph {
        create_dir(dir)?;
        let name = &compiled.desc.name;
        for (suffix, text) in [
            ("before", compiled.before.dump()),
            ("after", compiled.after.dump()),
        ] {
            let path = dir.join(format!("{name}.{suffix}.txt"));
            write_atomic(&path, text.as_bytes())?;
            written.push(path);
        }
    }
    if let Some(dir) = dumps.kernels {
        create_dir(dir)?;
        written.extend(dump_kernels(&compiled, dir)?);
    }
    let start = Instant::now();
    let programs: Vec<_> = compiled
        .emitted
        .kernels
        .iter()
        .map(|k| k.program.clone())
        .collect();
    let flags = compiled.emitted.kernel_flags().unwrap_or_default();
    let verified = verify(
        &ModelView {
            desc: &compiled.desc,
            tasks: &compiled.emitted.tasks,
            kernels: &programs,
            kernel_flags: &flags,
            weight_bytes: compiled.emitted.weights.bytes(),
        },
        cfg,
    );
    let verify_elapsed = start.elapsed();
    if !verified.is_ok() {
        anyhow::bail!(
            "{}: the compiled model fails verification (nothing written):\n{verified}",
            model.display()
        );
    }
    let om_data = if hybrid {
        compiled.hybrid_om_bytes()
    } else {
        compiled.om_bytes()
    }
    .map_err(anyhow::Error::msg)?;
    write_atomic(om, &om_data)?;
    Ok(CompileReport {
        om: om.to_path_buf(),
        om_bytes: om_data.len() as u64,
        compiled,
        elapsed,
        verify_elapsed,
        verified,
        dumps: written,
    })
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the dump directory {}", dir.display()))
}

/// One file per kernel: its name, the tasks that launch it, and its listing (the disassembly
/// with the tiling and the lowering's comments), which assembles back to the same program.
fn dump_kernels(c: &Compiled, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut launches: Vec<Vec<String>> = vec![Vec::new(); c.emitted.kernels.len()];
    for tasks in &c.emitted.tasks.streams {
        for t in tasks {
            if let OmTask::AiCore {
                kernel, block_dim, ..
            } = &t.task
                && let Some(l) = launches.get_mut(*kernel as usize)
            {
                l.push(format!("{} (block_dim {block_dim})", t.name));
            }
        }
    }
    let mut out = Vec::new();
    for (i, k) in c.emitted.kernels.iter().enumerate() {
        let mut text = format!("# kernel {i}: {}\n", k.name);
        for l in &launches[i] {
            text.push_str(&format!("# launched by {l}\n"));
        }
        text.push_str(&format!("# {} instructions\n", k.program.instrs.len()));
        // The listing: the disassembly with the kernel's comments (its tiling first).
        text.push_str(&k.listing());
        let safe: String = k
            .name
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '_' {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("{i:03}_{safe}.s"));
        write_atomic(&path, text.as_bytes())?;
        out.push(path);
    }
    Ok(out)
}

/// Verifies a `.om` file for the chip `chip` returns given the preset the model was compiled
/// for.
pub fn verify_file(path: &Path, chip: impl FnOnce(&str) -> Result<ChipConfig>) -> Result<Report> {
    let om = OmMap::open(path)?;
    let file = om.file()?;
    let desc = file.desc()?;
    let cfg = chip(&desc.soc_version)?;
    let images = decode_kernels(file.section(SectionKind::Kernels).unwrap_or(&[]))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let tasks = ModelTasks::decode(
        file.section(SectionKind::Tasks).unwrap_or(&[]),
        images.len() as u32,
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let programs = images
        .iter()
        .map(|k| {
            Program::decode(Some(k.name.clone()), &k.code)
                .map_err(|e| anyhow::anyhow!("{}: kernel {}: {e}", path.display(), k.name))
        })
        .collect::<Result<Vec<_>>>()?;
    let weight_bytes = file.section_size(SectionKind::Weights).unwrap_or(0) as u64;
    let flags = match file.section(SectionKind::KernelFlags) {
        Some(bytes) => gearsim_isa::omtask::decode_kernel_flags(bytes, images.len())
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        None => Vec::new(),
    };
    Ok(verify(
        &ModelView {
            desc: &desc,
            tasks: &tasks,
            kernels: &programs,
            kernel_flags: &flags,
            weight_bytes,
        },
        &cfg,
    ))
}

/// Reads and validates a `.om`'s description.
pub fn load_desc(path: &Path) -> Result<(ModelDesc, u64)> {
    let om = OmMap::open(path)?;
    let desc = om.file()?.desc()?;
    Ok((desc, om.bytes().len() as u64))
}

fn dtype_name(code: u32) -> String {
    i32::try_from(code)
        .ok()
        .and_then(DataType::from_onnx)
        .map_or_else(|| format!("onnx:{code}"), |d| d.name().to_string())
}

fn io_json(io: &gearsim_isa::om::IoDesc) -> Json {
    json!({
        "name": io.name,
        "dtype": dtype_name(io.dtype),
        "format": io.format,
        "dims": io.dims,
        "max_dims": io.max_dims,
        "bytes": io.bytes,
    })
}

/// The JSON `gearsim info` prints.
pub fn info_json(desc: &ModelDesc, file_bytes: u64) -> Json {
    let m = &desc.memory;
    let mut out = json!({
        "name": desc.name,
        "soc_version": desc.soc_version,
        "build_options": desc
            .build_options
            .iter()
            .map(|(k, v)| (k.clone(), Json::String(v.clone())))
            .collect::<serde_json::Map<String, Json>>(),
        "file_bytes": file_bytes,
        "inputs": desc.inputs.iter().map(io_json).collect::<Vec<_>>(),
        "outputs": desc.outputs.iter().map(io_json).collect::<Vec<_>>(),
        "memory": {
            "weight_bytes": m.weight_bytes,
            "feature_map_bytes": m.feature_map_bytes,
            "root_feature_map_bytes": m.root_feature_map_bytes,
            "per_gear_feature_map_bytes": m.per_gear_feature_map,
            "input_bytes": m.input_bytes,
            "output_bytes": m.output_bytes,
        },
        "dynamic": null,
    });
    if let Some(d) = &desc.dynamic {
        let per_gear: Vec<Json> = d
            .gears
            .iter()
            .enumerate()
            .map(|(i, gear)| {
                let inputs: Vec<Json> = desc
                    .inputs
                    .iter()
                    .zip(d.input_dims.get(i).into_iter().flatten())
                    .map(|(io, dims)| json!({ "name": io.name, "dims": dims }))
                    .collect();
                let outputs: Vec<Json> = desc
                    .outputs
                    .iter()
                    .zip(d.output_dims.get(i).into_iter().flatten())
                    .zip(d.output_bytes.get(i).into_iter().flatten())
                    .map(|((io, dims), bytes)| json!({ "name": io.name, "dims": dims, "bytes": bytes }))
                    .collect();
                json!({
                    "branch": format!("Batch_{i}"),
                    "gear": gear,
                    "inputs": inputs,
                    "outputs": outputs,
                    "feature_map_bytes": m.per_gear_feature_map.get(i),
                })
            })
            .collect();
        out["dynamic"] = json!({
            "type": DynamicMode::from_mbatch_dynamic_type(d.mode).map_or("unknown", DynamicMode::option_name),
            "mbatch_dynamic_type": d.mode,
            "gear_count": d.gears.len(),
            "gears": d.gears,
            "shape_order": d.shape_order,
            "getnext_sink": d.getnext_sink,
            "gear_table_layout": TableLayout::from_code(d.table_layout).map_or("unknown", TableLayout::name),
            "mapindex_engine": MapIndexEngine::from_code(d.mapindex_engine).map_or("unknown", MapIndexEngine::name),
            "per_gear": per_gear,
        });
    }
    out
}

/// Pretty JSON with arrays of scalars kept on one line (`"dims": [1, 3, 224, 224]`), so a
/// description with many gears stays readable.
pub fn to_json_text(v: &Json) -> String {
    let mut out = String::new();
    write_json(&mut out, v, 0);
    out
}

fn write_json(out: &mut String, v: &Json, indent: usize) {
    let pad = |n: usize| "  ".repeat(n);
    let scalar = |v: &Json| !matches!(v, Json::Array(_) | Json::Object(_));
    match v {
        Json::Array(items) if items.iter().all(scalar) => {
            let parts: Vec<String> = items.iter().map(Json::to_string).collect();
            out.push('[');
            out.push_str(&parts.join(", "));
            out.push(']');
        }
        Json::Array(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                out.push_str(&pad(indent + 1));
                write_json(out, item, indent + 1);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(indent));
            out.push(']');
        }
        Json::Object(map) if map.is_empty() => out.push_str("{}"),
        Json::Object(map) => {
            out.push_str("{\n");
            for (i, (k, item)) in map.iter().enumerate() {
                out.push_str(&pad(indent + 1));
                out.push_str(&Json::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(out, item, indent + 1);
                out.push_str(if i + 1 < map.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(indent));
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// atc's `--fusion_switch_file`: a JSON object `{"Switch": {"GraphFusion": {...}, "UBFusion":
/// {...}}}` whose inner objects map a pass name, or `ALL`, to `"on"` or `"off"` (`ALL` first,
/// then the named passes). gearsim's passes are [`fusion::Pass::ALL`]; a name it does not
/// know is an error naming the file, the section and the known names.
pub fn fusion_switches(text: &str, file: &str) -> Result<FusionSwitches, String> {
    let doc: Json = serde_json::from_str(text).map_err(|e| {
        format!(
            "{file}:{}:{}: the fusion switch file is not valid JSON: {e}",
            e.line(),
            e.column()
        )
    })?;
    let switch = doc
        .get("Switch")
        .and_then(Json::as_object)
        .ok_or_else(|| format!("{file}: expected an object with a \"Switch\" object"))?;
    let mut s = FusionSwitches::all_on();
    for (section, passes) in switch {
        if section != "GraphFusion" && section != "UBFusion" {
            return Err(format!(
                "{file}: Switch.{section}: expected GraphFusion or UBFusion"
            ));
        }
        let passes = passes
            .as_object()
            .ok_or_else(|| format!("{file}: Switch.{section}: expected an object"))?;
        let value = |name: &str, v: &Json| -> Result<bool, String> {
            match v.as_str() {
                Some("on") => Ok(true),
                Some("off") => Ok(false),
                _ => Err(format!(
                    "{file}: Switch.{section}.{name}: expected \"on\" or \"off\", got {v}"
                )),
            }
        };
        if let Some(v) = passes.get("ALL") {
            let on = value("ALL", v)?;
            for p in fusion::Pass::ALL {
                s.set(p, on);
            }
        }
        for (name, v) in passes.iter().filter(|(n, _)| *n != "ALL") {
            let pass = fusion::Pass::parse(name).ok_or_else(|| {
                format!(
                    "{file}: Switch.{section}: unknown fusion pass `{name}` (gearsim's passes: ALL, {})",
                    fusion::Pass::ALL.map(fusion::Pass::name).join(", ")
                )
            })?;
            s.set(pass, value(name, v)?);
        }
    }
    Ok(s)
}
