//! The gear study (`gearsim study gears`): what selecting a gear costs, swept over gear count,
//! gear vector length, table layout, MapIndex engine and where the table lives.
//!
//! ```text
//!  point (G, L, layout, engine) ─ workload: G gears of L dims ─ compile (wall time) ─ load
//!     ─ run 1: table read from HBM (cold L2)   ─┐ each run traced into a Timeline sink:
//!     ─ run 2: table L2-resident (steady state) ┘ dims H2D, MapIndex, LabelSwitch, branch
//!     ─ one row per table home: MapIndex cycles, gear-selection latency, end-to-end time,
//!       device memory (weights, table, feature maps) and compile time
//! ```
//!
//! The **synthetic workload** is a model with L one-dimensional inputs `x_i: [-1]` compiled
//! with `--dynamic_dims` of G generated gears (values 1..16, or up to the chip's gear limit for
//! one dim; unique; each count's gears a prefix of the next count's), whose every branch is one tiny `Add(x_0, x_0)`, so gear selection
//! dominates the run. A **model workload** sweeps a user's ONNX model with its own gear option:
//! prefixes of the given gear list, extended when a count asks for more by generated gears
//! whose values stay inside the range each gear axis spans in the list.
//!
//! **Where the table lives.** The compiler places the table in the weights region in HBM, as GE
//! does. The first run after load finds none of its lines in the L2 (the loader writes device
//! memory without touching the cache), so `hbm` rows measure a table read from HBM; the second,
//! identical run finds the lines the first one allocated, so `l2` rows measure the steady state
//! with the table L2-resident after first touch (a real model's branch traffic may evict it, and
//! then the second run shows that). The AI CPU reads outside the L2, so its two rows differ only
//! by what the rest of the run does. Keeping the table in UB across runs is not offered: UB
//! belongs to whichever kernel runs, and every branch kernel overwrites it.
//!
//! Runs are timing-only (MapIndex itself always computes values, so the branch chosen is real)
//! and the chosen branch is read back from the device and checked against the queried gear.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use gearsim_isa::gear::{MapIndexEngine, TableLayout};
use gearsim_sim::{ChipConfig, ExecMode};
use prost::Message as _;

use super::svg::{Figure, Panel, Series, render};
use super::timeline::{TaskSpan, Timeline};
use super::{Shard, StudyError, parallel_map};
use crate::runtime::session::{data_inputs, io_type};
use crate::runtime::{Runtime, RuntimeOptions};
use crate::target;
use gearsim_compiler::gear::{CASE, MAPINDEX};
use gearsim_compiler::ir::Tensor;
use gearsim_compiler::onnx::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto, tensor_shape_proto, type_proto,
};
use gearsim_compiler::options::{DynamicMode, GearOptions, check_options};
use gearsim_compiler::pipeline::{CompileOptions, compile};

/// Where the gear table is when MapIndex reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableHome {
    /// In the weights region in HBM, none of it in the L2 (the first run after load).
    Hbm,
    /// In the weights region, its lines L2-resident after the previous run touched them.
    L2,
}

impl TableHome {
    /// Both, in the order a point measures them.
    pub const ALL: [TableHome; 2] = [TableHome::Hbm, TableHome::L2];

    /// `hbm` or `l2`.
    pub fn name(self) -> &'static str {
        match self {
            TableHome::Hbm => "hbm",
            TableHome::L2 => "l2",
        }
    }

    /// The home with this name.
    pub fn parse(name: &str) -> Option<TableHome> {
        TableHome::ALL.into_iter().find(|h| h.name() == name)
    }
}

/// Which gear each run's inputs select.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryGear {
    /// Gear 0.
    First,
    /// Gear G/2.
    Middle,
    /// Gear G-1: the worst case of a scan in gear order.
    Last,
}

impl QueryGear {
    /// Every choice.
    pub const ALL: [QueryGear; 3] = [QueryGear::First, QueryGear::Middle, QueryGear::Last];

    /// `first`, `middle` or `last`.
    pub fn name(self) -> &'static str {
        match self {
            QueryGear::First => "first",
            QueryGear::Middle => "middle",
            QueryGear::Last => "last",
        }
    }

    /// The choice with this name.
    pub fn parse(name: &str) -> Option<QueryGear> {
        QueryGear::ALL.into_iter().find(|q| q.name() == name)
    }

    /// The gear index among `gears` gears.
    pub fn pick(self, gears: usize) -> usize {
        match self {
            QueryGear::First => 0,
            QueryGear::Middle => gears / 2,
            QueryGear::Last => gears.saturating_sub(1),
        }
    }
}

/// A user's model to sweep.
#[derive(Debug, Clone)]
pub struct ModelWorkload {
    /// The ONNX bytes.
    pub onnx: Vec<u8>,
    /// The file name (messages, the model's name).
    pub file: String,
    /// Its atc gear options (`--input_shape` and one gear option).
    pub gear: GearOptions,
}

/// What the study compiles and runs.
#[derive(Debug, Clone)]
pub enum Workload {
    /// The generated table-only model (see the module doc).
    Synthetic,
    /// A user's model.
    Model(Box<ModelWorkload>),
}

/// A sweep.
#[derive(Debug, Clone)]
pub struct GearStudy {
    /// What runs.
    pub workload: Workload,
    /// Gear counts (2 up to the chip's MapIndex limit).
    pub gear_counts: Vec<u32>,
    /// Gear vector lengths (synthetic workload only; a model's is fixed by its inputs).
    pub vector_lengths: Vec<u32>,
    /// Table layouts.
    pub layouts: Vec<TableLayout>,
    /// MapIndex engines.
    pub engines: Vec<MapIndexEngine>,
    /// Table homes reported (both need the same two runs; this only selects rows).
    pub homes: Vec<TableHome>,
    /// The gear the inputs select.
    pub query: QueryGear,
    /// The chip.
    pub chip: ChipConfig,
    /// Seed of the generated gears.
    pub seed: u64,
}

/// The default gear counts for a chip whose MapIndex takes at most `limit` gears: 2, 3, 4, 6,
/// 8, 12, ... (powers of two and the midpoints between them) below 90% of the limit, then the
/// limit itself.
pub fn default_gear_counts(limit: u32) -> Vec<u32> {
    let mut counts: Vec<u32> = (1..16)
        .flat_map(|p| [1u32 << p, 3u32 << (p - 1)])
        .filter(|c| u64::from(*c) * 10 < u64::from(limit) * 9)
        .collect();
    counts.push(limit.max(2));
    counts
}

/// The default vector lengths of the synthetic workload for a chip whose MapIndex takes
/// queries of at most `max_dims` values: 1, 4, 16, 64 (those below the limit), then the limit.
pub fn default_vector_lengths(max_dims: u32) -> Vec<u32> {
    let mut lengths: Vec<u32> = [1, 4, 16, 64]
        .into_iter()
        .filter(|l| *l < max_dims)
        .collect();
    lengths.push(max_dims.max(1));
    lengths
}

impl GearStudy {
    /// The default sweep on `chip`: the synthetic workload, [`default_gear_counts`],
    /// [`default_vector_lengths`], every layout, both engines, both homes, the last gear.
    pub fn default_sweep(chip: ChipConfig) -> GearStudy {
        GearStudy {
            workload: Workload::Synthetic,
            gear_counts: default_gear_counts(chip.kernels.map_index_max_gears),
            vector_lengths: default_vector_lengths(chip.kernels.map_index_max_dims),
            layouts: TableLayout::ALL.to_vec(),
            engines: MapIndexEngine::ALL.to_vec(),
            homes: TableHome::ALL.to_vec(),
            query: QueryGear::Last,
            chip,
            seed: 1,
        }
    }

    /// Checks the axes against each other and the chip.
    pub fn validate(&self) -> Result<(), StudyError> {
        let bad = |m: String| Err(StudyError::Options(m));
        if self.gear_counts.is_empty()
            || self.layouts.is_empty()
            || self.engines.is_empty()
            || self.homes.is_empty()
        {
            return bad("every axis of the sweep needs at least one value".into());
        }
        let limit = self.chip.kernels.map_index_max_gears;
        if let Some(c) = self.gear_counts.iter().find(|c| **c < 2 || **c > limit) {
            return bad(format!(
                "gear count {c} is outside [2, {limit}] (GE needs two gears; {limit} is {}'s \
                 MapIndex limit, kernels.map_index_max_gears)",
                self.chip.name
            ));
        }
        if matches!(self.workload, Workload::Synthetic) {
            let max = self.chip.kernels.map_index_max_dims;
            if self.vector_lengths.is_empty() {
                return bad("the synthetic workload needs at least one vector length".into());
            }
            if let Some(l) = self.vector_lengths.iter().find(|l| **l == 0 || **l > max) {
                return bad(format!(
                    "vector length {l} is outside [1, {max}] (kernels.map_index_max_dims)"
                ));
            }
        }
        Ok(())
    }

    fn workload_name(&self) -> String {
        match &self.workload {
            Workload::Synthetic => "synthetic".into(),
            Workload::Model(m) => Path::new(&m.file)
                .file_stem()
                .map_or_else(|| m.file.clone(), |s| s.to_string_lossy().into_owned()),
        }
    }
}

/// One simulation: a model compiled for one combination and run twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Point {
    /// Its number in the whole sweep (the CSV's `point`).
    pub index: usize,
    /// Gears.
    pub gears: u32,
    /// Gear vector length.
    pub dims: u32,
    /// Table layout.
    pub layout: TableLayout,
    /// MapIndex engine.
    pub engine: MapIndexEngine,
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "G={} L={} {} {}",
            self.gears,
            self.dims,
            self.layout.name(),
            self.engine.name()
        )
    }
}

/// The sweep's points, in order: vector length, gear count, layout, engine.
pub fn points(study: &GearStudy) -> Result<Vec<Point>, StudyError> {
    let lengths = match &study.workload {
        Workload::Synthetic => study.vector_lengths.clone(),
        Workload::Model(m) => vec![model_gears(m)?.1.first().map_or(0, Vec::len) as u32],
    };
    let mut out = Vec::new();
    for &dims in &lengths {
        for &gears in &study.gear_counts {
            for &layout in &study.layouts {
                for &engine in &study.engines {
                    out.push(Point {
                        index: out.len(),
                        gears,
                        dims,
                        layout,
                        engine,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// One CSV row: one point at one table home.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The point's number in the whole sweep.
    pub point: usize,
    /// `synthetic` or the model's file stem.
    pub workload: String,
    /// Gears (G).
    pub gears: u32,
    /// Gear vector length (L).
    pub dims: u32,
    /// Table layout.
    pub layout: TableLayout,
    /// MapIndex engine.
    pub engine: MapIndexEngine,
    /// Where the table was.
    pub home: TableHome,
    /// The gear the inputs selected.
    pub query_gear: usize,
    /// The branch MapIndex chose, read back from the device.
    pub selected: i32,
    /// MapIndex's own work in AI core clock cycles, launch overhead excluded: on the AI core
    /// from its first to its last pipe activity, on the AI CPU its memory and compute phases.
    pub mapindex_cycles: u64,
    /// The MapIndex task on the model stream, launch overhead included (ps).
    pub mapindex_task_ps: u64,
    /// Gear-selection latency (ps): from the end of the gear-dims H2D copy to the start of
    /// the selected branch's first task after its LabelSet / StreamActive head.
    pub select_ps: u64,
    /// The whole run (ps): first input copy to last output copy.
    pub end_to_end_ps: u64,
    /// Gear table bytes.
    pub table_bytes: u64,
    /// Weights region bytes (the table included).
    pub weight_bytes: u64,
    /// Feature-map region bytes (the largest gear's plan; branches are overlaid).
    pub feature_map_bytes: u64,
    /// The selected gear's own feature-map bytes.
    pub gear_feature_map_bytes: u64,
    /// Input and output buffer bytes (largest gear).
    pub io_bytes: u64,
    /// Host wall time of `compile` and `.om` encoding (ms); not deterministic.
    pub compile_ms: f64,
}

impl Row {
    /// Device bytes the model holds: weights, feature maps, inputs and outputs.
    pub fn device_bytes(&self) -> u64 {
        self.weight_bytes + self.feature_map_bytes + self.io_bytes
    }

    /// [`Row::device_bytes`] shared out per gear.
    pub fn bytes_per_gear(&self) -> u64 {
        self.device_bytes().div_ceil(u64::from(self.gears.max(1)))
    }
}

/// The CSV header; `README.md` describes every column.
pub const CSV_HEADER: &str = "point,workload,gears,dims,layout,engine,table_home,query_gear,\
selected,mapindex_cycles,mapindex_task_ns,select_ns,end_to_end_ns,table_bytes,weight_bytes,\
feature_map_bytes,gear_feature_map_bytes,io_bytes,device_bytes,bytes_per_gear,compile_ms";

/// Picoseconds as nanoseconds with three decimals (exact).
fn ns(ps: u64) -> String {
    format!("{}.{:03}", ps / 1000, ps % 1000)
}

/// The rows as CSV, header first.
pub fn csv(rows: &[Row]) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{CSV_HEADER}");
    for r in rows {
        let _ = writeln!(
            o,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3}",
            r.point,
            r.workload,
            r.gears,
            r.dims,
            r.layout.name(),
            r.engine.name(),
            r.home.name(),
            r.query_gear,
            r.selected,
            r.mapindex_cycles,
            ns(r.mapindex_task_ps),
            ns(r.select_ps),
            ns(r.end_to_end_ps),
            r.table_bytes,
            r.weight_bytes,
            r.feature_map_bytes,
            r.gear_feature_map_bytes,
            r.io_bytes,
            r.device_bytes(),
            r.bytes_per_gear(),
            r.compile_ms
        );
    }
    o
}

// ---- workloads ------------------------------------------------------------------------------

/// A deterministic generator (64-bit LCG, high bits out).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// `count` unique gears of `dims` values, value `i` of each in `lo[i]..=hi[i]`, continuing
/// `start` (whose gears are kept as they are). The same seed gives the same sequence, so the
/// gears for a smaller count are a prefix of those for a larger one.
fn extend_gears(
    start: &[Vec<i64>],
    count: usize,
    lo: &[i64],
    hi: &[i64],
    seed: u64,
) -> Result<Vec<Vec<i64>>, String> {
    let mut gears: Vec<Vec<i64>> = start.iter().take(count).cloned().collect();
    let mut rng = Lcg(seed ^ 0x9e37_79b9_7f4a_7c15);
    let space: f64 = lo
        .iter()
        .zip(hi)
        .map(|(l, h)| (h - l + 1).max(1) as f64)
        .product();
    if space < count as f64 {
        return Err(format!(
            "only {space} distinct gears fit the value ranges {lo:?}..={hi:?}; {count} were asked for"
        ));
    }
    let mut tries = 0u64;
    while gears.len() < count {
        let g: Vec<i64> = lo
            .iter()
            .zip(hi)
            .map(|(l, h)| l + rng.below((h - l + 1) as u64) as i64)
            .collect();
        if !gears.contains(&g) {
            gears.push(g);
        }
        tries += 1;
        if tries > 1_000_000 {
            return Err(format!("could not draw {count} distinct gears"));
        }
    }
    Ok(gears)
}

/// The synthetic workload's gears: values 1..16, or 1..`limit` (the chip's most gears) for
/// one dim so that `limit` distinct gears exist; the range does not depend on `gears`, so a
/// smaller count's gears are a prefix of a larger one's.
fn synthetic_gears(gears: u32, dims: u32, limit: u32, seed: u64) -> Result<Vec<Vec<i64>>, String> {
    let top = if dims == 1 {
        i64::from(limit.max(16))
    } else {
        16
    };
    let d = dims as usize;
    extend_gears(
        &[],
        gears as usize,
        &vec![1; d],
        &vec![top; d],
        seed ^ u64::from(dims),
    )
}

fn value_info(name: &str) -> ValueInfoProto {
    use tensor_shape_proto::dimension::Value as D;
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1, // float
                shape: Some(TensorShapeProto {
                    dim: vec![tensor_shape_proto::Dimension {
                        value: Some(D::DimParam(format!("{name}_len"))),
                        denotation: String::new(),
                    }],
                }),
            })),
        }),
        doc_string: String::new(),
    }
}

/// The synthetic model: inputs `x0..x{L-1}` (f32 `[-1]`), output `y = x0 + x0`.
pub fn synthetic_onnx(dims: u32) -> Vec<u8> {
    let inputs: Vec<String> = (0..dims).map(|i| format!("x{i}")).collect();
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "gearsim study gears".into(),
        graph: Some(GraphProto {
            node: vec![NodeProto {
                input: vec!["x0".into(), "x0".into()],
                output: vec!["y".into()],
                name: "add".into(),
                op_type: "Add".into(),
                ..Default::default()
            }],
            name: "gear_table_only".into(),
            input: inputs.iter().map(|n| value_info(n)).collect(),
            output: vec![value_info("y")],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn join(v: &[i64]) -> String {
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// A model workload's gear mode and the gears its options list.
fn model_gears(m: &ModelWorkload) -> Result<(DynamicMode, Vec<Vec<i64>>), StudyError> {
    let parsed = check_options(&m.gear)
        .map_err(|e| StudyError::Options(format!("{}: {e}", m.file)))?
        .ok_or_else(|| {
            StudyError::Options(format!(
                "{}: a model study needs a gear option (--dynamic_batch_size, \
                 --dynamic_image_size or --dynamic_dims) besides --input_shape",
                m.file
            ))
        })?;
    Ok((parsed.mode, parsed.gears))
}

/// A compile instance: ONNX bytes, file name, gear options and the gear list.
struct Instance {
    onnx: Vec<u8>,
    file: String,
    gear: GearOptions,
    gears: Vec<Vec<i64>>,
}

fn instance(study: &GearStudy, p: &Point) -> Result<Instance, String> {
    match &study.workload {
        Workload::Synthetic => {
            let limit = study.chip.kernels.map_index_max_gears;
            let gears = synthetic_gears(p.gears, p.dims, limit, study.seed)?;
            let shape: Vec<String> = (0..p.dims).map(|i| format!("x{i}:-1")).collect();
            let list: Vec<String> = gears.iter().map(|g| join(g)).collect();
            Ok(Instance {
                onnx: synthetic_onnx(p.dims),
                file: "gear_table_only.onnx".into(),
                gear: GearOptions {
                    input_shape: Some(shape.join(";")),
                    dynamic_dims: Some(list.join(";")),
                    ..GearOptions::default()
                },
                gears,
            })
        }
        Workload::Model(m) => {
            let (mode, given) = model_gears(m).map_err(|e| e.to_string())?;
            let n = given.first().map_or(0, Vec::len);
            let lo: Vec<i64> = (0..n)
                .map(|i| given.iter().map(|g| g[i]).min().unwrap_or(1))
                .collect();
            let hi: Vec<i64> = (0..n)
                .map(|i| given.iter().map(|g| g[i]).max().unwrap_or(1))
                .collect();
            let gears = extend_gears(&given, p.gears as usize, &lo, &hi, study.seed)
                .map_err(|e| format!("{}: extending its gear list: {e}", m.file))?;
            let mut gear = m.gear.clone();
            let list: Vec<String> = gears.iter().map(|g| join(g)).collect();
            match mode {
                DynamicMode::Batch => gear.dynamic_batch_size = Some(list.join(",")),
                DynamicMode::ImageSize => gear.dynamic_image_size = Some(list.join(";")),
                DynamicMode::Dims => gear.dynamic_dims = Some(list.join(";")),
            }
            Ok(Instance {
                onnx: m.onnx.clone(),
                file: m.file.clone(),
                gear,
                gears,
            })
        }
    }
}

// ---- one point ------------------------------------------------------------------------------

/// What one run measured.
struct Measured {
    mapindex_cycles: u64,
    mapindex_task_ps: u64,
    select_ps: u64,
}

/// Picoseconds to AI core cycles at `mhz`, rounded up.
fn cycles(ps: u64, mhz: u64) -> u64 {
    (u128::from(ps) * u128::from(mhz)).div_ceil(1_000_000) as u64
}

/// Finds the run's tasks (those starting at or after `from`) and measures them.
fn measure(
    tasks: &[TaskSpan],
    from: u64,
    engine: MapIndexEngine,
    chip: &ChipConfig,
) -> Result<Measured, String> {
    let run: Vec<&TaskSpan> = tasks.iter().filter(|t| t.start >= from).collect();
    let find = |name: &str| {
        run.iter()
            .find(|t| t.name == name)
            .copied()
            .ok_or_else(|| format!("the run has no task `{name}`"))
    };
    let dims = find("memcpy_h2d gear dims")?;
    let map_index = find(MAPINDEX)?;
    let switch = find(&format!("{CASE}/LabelSwitch"))?;
    let head = |name: &str| {
        (name.starts_with(&format!("{CASE}/LabelSet_")) && name != format!("{CASE}/LabelSet_Last"))
            || name.starts_with(&format!("{CASE}/StreamActive_"))
    };
    let first = run
        .iter()
        .filter(|t| t.start >= switch.end && !head(&t.name))
        .min_by_key(|t| t.start)
        .ok_or("the run has no task after the LabelSwitch")?;
    let work_ps = match engine {
        MapIndexEngine::AiCore => map_index
            .cores
            .map(|(s, e)| e - s)
            .ok_or("the AI core MapIndex task ran no pipe")?,
        MapIndexEngine::AiCpu => map_index
            .aicpu
            .map(|(s, e)| (e - s).saturating_sub(chip.aicpu.launch_ns * 1000))
            .ok_or("the AI CPU MapIndex task ran on no AI CPU")?,
    };
    Ok(Measured {
        mapindex_cycles: cycles(work_ps, chip.core.clock_mhz),
        mapindex_task_ps: map_index.end - map_index.start,
        select_ps: first.start.saturating_sub(dims.end),
    })
}

/// Zero-filled data inputs at gear `gear`'s shapes.
fn inputs_at(desc: &gearsim_isa::om::ModelDesc, gear: usize) -> Result<Vec<Tensor>, String> {
    let d = desc.dynamic.as_ref().ok_or("the model has no gears")?;
    let dims = d.input_dims.get(gear).ok_or("no input dims for the gear")?;
    (0..data_inputs(desc))
        .map(|i| {
            let io = &desc.inputs[i];
            let dtype = io_type(io).map_err(|e| e.to_string())?;
            let shape = dims.get(i).cloned().unwrap_or_else(|| io.max_dims.clone());
            let count: i64 = shape.iter().product();
            Tensor::new(dtype, shape, vec![0; count.max(0) as usize * dtype.size()])
        })
        .collect()
}

/// Compiles, loads and runs one point; one row per requested table home.
pub fn run_point(study: &GearStudy, p: &Point) -> Result<Vec<Row>, StudyError> {
    let what = p.to_string();
    let fail = |message: String| StudyError::Run {
        point: p.index,
        what: what.clone(),
        message,
    };
    let check = |message: String| StudyError::Check {
        point: p.index,
        what: what.clone(),
        message,
    };
    let inst = instance(study, p)
        .map_err(|message| StudyError::Options(format!("point {}: {message}", p.index)))?;
    let opts = CompileOptions {
        gear: inst.gear.clone(),
        getnext_sink: false,
        table_layout: p.layout,
        mapindex_engine: p.engine,
        fusion: Default::default(),
        precision: Default::default(),
        target: target::for_chip(&study.chip),
    };
    let started = Instant::now();
    let compiled = compile(&inst.onnx, &inst.file, &opts);
    let om = compiled
        .as_ref()
        .map_err(ToString::to_string)
        .and_then(|c| c.om_bytes());
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let om = om.map_err(|message| StudyError::Compile {
        point: p.index,
        what: what.clone(),
        message,
    })?;
    let opts = RuntimeOptions {
        exec_mode: ExecMode::TimingOnly,
        ..RuntimeOptions::default()
    };
    let mut rt = Runtime::new(study.chip.clone(), Timeline::default(), opts)
        .map_err(|e| fail(e.to_string()))?;
    let m = rt.load(&om).map_err(|e| fail(e.to_string()))?;
    let desc = rt.desc(m).map_err(|e| fail(e.to_string()))?.clone();
    let branch_index = rt
        .loaded(m)
        .map_err(|e| fail(e.to_string()))?
        .branch_index
        .ok_or_else(|| check("the model has no MapIndex result".into()))?;
    let query = study.query.pick(inst.gears.len());
    let inputs = inputs_at(&desc, query).map_err(&fail)?;
    let mut rows = Vec::new();
    // The first run finds the table in HBM only; the second finds what the first left in L2.
    for home in TableHome::ALL {
        let from = rt.device().now().0;
        let report = rt.run(m, &inputs).map_err(|e| fail(e.to_string()))?;
        let mut y = [0u8; 4];
        rt.device_mut()
            .read(branch_index, &mut y)
            .map_err(|e| fail(e.to_string()))?;
        let selected = i32::from_le_bytes(y);
        if selected != query as i32 || report.gear != Some(query) {
            return Err(check(format!(
                "MapIndex chose branch {selected} (the host derived {:?}) for gear {query} {:?}",
                report.gear, inst.gears[query]
            )));
        }
        if !study.homes.contains(&home) {
            continue;
        }
        let tasks = &rt.device_mut().chip_mut().sink_mut().tasks;
        let got = measure(tasks, from, p.engine, &study.chip).map_err(&check)?;
        let mem = &desc.memory;
        rows.push(Row {
            point: p.index,
            workload: study.workload_name(),
            gears: p.gears,
            dims: p.dims,
            layout: p.layout,
            engine: p.engine,
            home,
            query_gear: query,
            selected,
            mapindex_cycles: got.mapindex_cycles,
            mapindex_task_ps: got.mapindex_task_ps,
            select_ps: got.select_ps,
            end_to_end_ps: report.device_time_ps,
            table_bytes: p.layout.table_len(p.gears, p.dims) * 4,
            weight_bytes: mem.weight_bytes,
            feature_map_bytes: mem.feature_map_bytes,
            gear_feature_map_bytes: mem.per_gear_feature_map.get(query).copied().unwrap_or(0),
            io_bytes: mem.input_bytes + mem.output_bytes,
            compile_ms,
        });
    }
    Ok(rows)
}

/// What [`run`] reports as each point ends: its index among the shard's points, their
/// number, the point and its result.
pub type Progress<'a> = dyn Fn(usize, usize, &Point, &Result<Vec<Row>, StudyError>) + Sync + 'a;

/// Runs the points of `shard` on `threads` threads; `progress` sees each point as it ends.
/// Rows come back in point order. The first failing point stops the points not yet started
/// and is the error returned.
pub fn run(
    study: &GearStudy,
    shard: Shard,
    threads: usize,
    progress: &Progress<'_>,
) -> Result<Vec<Row>, StudyError> {
    study.validate()?;
    let mine: Vec<Point> = points(study)?
        .into_iter()
        .filter(|p| shard.takes(p.index))
        .collect();
    let failed = AtomicBool::new(false);
    let total = mine.len();
    let results = parallel_map(
        &mine,
        threads,
        |p| {
            if failed.load(Ordering::Relaxed) {
                return None;
            }
            let r = run_point(study, p);
            if r.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            Some(r)
        },
        |i, r| {
            if let Some(r) = r {
                progress(i, total, &mine[i], r);
            }
        },
    );
    let mut rows = Vec::new();
    for r in results.into_iter().flatten() {
        rows.extend(r?);
    }
    Ok(rows)
}

// ---- figure, summary and files --------------------------------------------------------------

const LAYOUT_COLORS: [(TableLayout, &str); 3] = [
    (TableLayout::GearMajor, "#1f77b4"),
    (TableLayout::DimMajor8, "#ff7f0e"),
    (TableLayout::SortedBinary, "#2ca02c"),
];

fn color(layout: TableLayout) -> String {
    LAYOUT_COLORS
        .iter()
        .find(|(l, _)| *l == layout)
        .map_or("#7f7f7f", |(_, c)| *c)
        .to_string()
}

fn distinct<T: PartialEq + Copy>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for t in items {
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// The figure: MapIndex cycles against gear count, one panel per engine (rows) and vector
/// length (columns), one line per layout (colour) and table home (solid HBM, dashed L2).
pub fn figure(rows: &[Row], chip: &str) -> Figure {
    let engines = distinct(rows.iter().map(|r| r.engine));
    let mut lengths = distinct(rows.iter().map(|r| r.dims));
    lengths.sort_unstable();
    let layouts = distinct(rows.iter().map(|r| r.layout));
    let homes = distinct(rows.iter().map(|r| r.home));
    let workload = rows.first().map_or("synthetic", |r| r.workload.as_str());
    let query = QueryGear::ALL
        .into_iter()
        .find(|q| {
            rows.iter()
                .all(|r| r.query_gear == q.pick(r.gears as usize))
        })
        .map_or("varies", QueryGear::name);
    let mut panels = Vec::new();
    for &engine in &engines {
        for &dims in &lengths {
            let mut series = Vec::new();
            for &layout in &layouts {
                for &home in &homes {
                    let points: Vec<(f64, f64)> = rows
                        .iter()
                        .filter(|r| {
                            r.engine == engine
                                && r.dims == dims
                                && r.layout == layout
                                && r.home == home
                        })
                        .map(|r| (f64::from(r.gears), r.mapindex_cycles as f64))
                        .collect();
                    if points.is_empty() {
                        continue;
                    }
                    series.push(Series {
                        label: format!("{}, table in {}", layout.name(), home.name()),
                        color: color(layout),
                        dashed: home == TableHome::L2,
                        points,
                    });
                }
            }
            panels.push(Panel {
                title: format!("MapIndex on {}, L = {dims}", engine.name()),
                y_label: None,
                series,
            });
        }
    }
    Figure {
        title: format!("MapIndex cycles vs gear count ({workload} workload, {chip})"),
        subtitle: format!(
            "AI core clock cycles of MapIndex's own work (kernel launch excluded), the inputs \
             selecting the {query} gear; one y scale per row"
        ),
        x_label: "gears (G)".into(),
        y_label: "MapIndex time (AI core cycles)".into(),
        columns: lengths.len().max(1),
        panels,
        shared_y: true,
        x_log_ticks: false,
        mark: None,
    }
}

/// Gear counts as compact ranges: `2-16, 64`.
fn ranges(counts: &[u32], all: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < all.len() {
        if !counts.contains(&all[i]) {
            i += 1;
            continue;
        }
        let start = all[i];
        while i + 1 < all.len() && counts.contains(&all[i + 1]) {
            i += 1;
        }
        parts.push(if start == all[i] {
            start.to_string()
        } else {
            format!("{start}-{}", all[i])
        });
        i += 1;
    }
    parts.join(", ")
}

/// The layouts with the lowest `key` at each gear count, as `layout at G ranges; ...`.
fn winners(rows: &[&Row], counts: &[u32], key: impl Fn(&Row) -> u64) -> String {
    let mut wins: Vec<(TableLayout, Vec<u32>)> = Vec::new();
    for &g in counts {
        // Ties go to the layout listed first (GE's own before gearsim's).
        let best = rows
            .iter()
            .filter(|r| r.gears == g)
            .min_by_key(|r| (key(r), TableLayout::ALL.iter().position(|l| *l == r.layout)));
        if let Some(b) = best {
            match wins.iter_mut().find(|(l, _)| *l == b.layout) {
                Some((_, gs)) => gs.push(g),
                None => wins.push((b.layout, vec![g])),
            }
        }
    }
    wins.iter()
        .map(|(l, gs)| format!("{} at G {}", l.name(), ranges(gs, counts)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Which layout wins where, per engine and vector length (the two table homes on one line
/// when they agree), for MapIndex cycles and for gear-selection latency; which engine selects
/// faster; the table sizes at the largest gear count; how compile time grows with gears.
pub fn summary(rows: &[Row]) -> String {
    let mut o = String::new();
    let mut counts = distinct(rows.iter().map(|r| r.gears));
    counts.sort_unstable();
    let mut lengths = distinct(rows.iter().map(|r| r.dims));
    lengths.sort_unstable();
    let engines = distinct(rows.iter().map(|r| r.engine));
    let homes = distinct(rows.iter().map(|r| r.home));
    let layouts = distinct(rows.iter().map(|r| r.layout));
    type Key = fn(&Row) -> u64;
    let keys: [(&str, Key); 2] = [
        ("fewest MapIndex cycles", |r| r.mapindex_cycles),
        (
            "shortest gear selection (dims ready -> first branch task)",
            |r| r.select_ps,
        ),
    ];
    let mut tables: Vec<Vec<String>> = Vec::new();
    for (_, key) in keys {
        let mut lines = Vec::new();
        for &engine in &engines {
            for &dims in &lengths {
                let per_home: Vec<(TableHome, String)> = homes
                    .iter()
                    .map(|&home| {
                        let at: Vec<&Row> = rows
                            .iter()
                            .filter(|r| r.engine == engine && r.dims == dims && r.home == home)
                            .collect();
                        (home, winners(&at, &counts, key))
                    })
                    .collect();
                let text = if per_home.windows(2).all(|w| w[0].1 == w[1].1) {
                    per_home.first().map(|(_, t)| t.clone()).unwrap_or_default()
                } else {
                    per_home
                        .iter()
                        .map(|(h, t)| format!("table in {}: {t}", h.name()))
                        .collect::<Vec<_>>()
                        .join(" | ")
                };
                lines.push(format!("  {:<6} L={dims:<4} {text}", engine.name()));
            }
        }
        tables.push(lines);
    }
    let _ = writeln!(o, "which layout wins where ({}):", keys[0].0);
    for l in &tables[0] {
        let _ = writeln!(o, "{l}");
    }
    if tables[1] == tables[0] {
        let _ = writeln!(o, "{}: the same winners", keys[1].0);
    } else {
        let _ = writeln!(o, "{}:", keys[1].0);
        for l in &tables[1] {
            let _ = writeln!(o, "{l}");
        }
    }
    if engines.len() > 1 {
        let mut wins: Vec<(MapIndexEngine, usize)> = engines.iter().map(|e| (*e, 0)).collect();
        for r in rows.iter().filter(|r| r.engine == engines[0]) {
            let best = rows
                .iter()
                .filter(|o| {
                    o.gears == r.gears
                        && o.dims == r.dims
                        && o.layout == r.layout
                        && o.home == r.home
                })
                .min_by_key(|o| o.select_ps);
            if let Some(w) = wins
                .iter_mut()
                .find(|(e, _)| Some(*e) == best.map(|b| b.engine))
            {
                w.1 += 1;
            }
        }
        let text: Vec<String> = wins
            .iter()
            .map(|(e, n)| format!("{} at {n}", e.name()))
            .collect();
        let _ = writeln!(
            o,
            "engine with the shorter gear selection, of {} (G, L, layout, home) combinations: {}",
            wins.iter().map(|w| w.1).sum::<usize>(),
            text.join(", ")
        );
    }
    if let Some(&g) = counts.last() {
        let _ = writeln!(
            o,
            "at G={g}, AI core, table in HBM (MapIndex cycles, table bytes):"
        );
        for &dims in &lengths {
            let text: Vec<String> = rows
                .iter()
                .filter(|r| {
                    r.gears == g
                        && r.dims == dims
                        && r.engine == MapIndexEngine::AiCore
                        && r.home == TableHome::Hbm
                })
                .map(|r| {
                    format!(
                        "{} {} / {} B",
                        r.layout.name(),
                        r.mapindex_cycles,
                        r.table_bytes
                    )
                })
                .collect();
            if !text.is_empty() {
                let _ = writeln!(o, "  L={dims:<4} {}", text.join(", "));
            }
        }
    }
    if let (Some(&lo), Some(&hi)) = (counts.first(), counts.last())
        && hi > lo
    {
        let mean = |g: u32, dims: u32| {
            let v: Vec<f64> = rows
                .iter()
                .filter(|r| r.gears == g && r.dims == dims && r.home == homes[0])
                .map(|r| r.compile_ms)
                .collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let _ = writeln!(
            o,
            "compile time (host wall clock, mean of {} layout(s) x {} engine(s)):",
            layouts.len(),
            engines.len()
        );
        for &dims in &lengths {
            let (a, b) = (mean(lo, dims), mean(hi, dims));
            let _ = writeln!(
                o,
                "  L={dims:<4} {a:.1} ms at G={lo} -> {b:.1} ms at G={hi} ({:.2} ms per added gear)",
                (b - a) / f64::from(hi - lo)
            );
        }
    }
    o
}

/// Writes `gears.csv` and `gears.svg` into `dir` (created if missing), each to a temporary
/// name first and then renamed, so an interrupted study never leaves a half-written file.
pub fn write_outputs(
    dir: &Path,
    rows: &[Row],
    chip: &str,
) -> Result<(PathBuf, PathBuf), StudyError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| StudyError::Io(format!("cannot create {}: {e}", dir.display())))?;
    let csv_path = dir.join("gears.csv");
    let svg_path = dir.join("gears.svg");
    let io = |e: gearsim_traces::atomic::WriteError| StudyError::Io(e.to_string());
    gearsim_traces::atomic::write_atomic(&csv_path, csv(rows).as_bytes()).map_err(io)?;
    gearsim_traces::atomic::write_atomic(&svg_path, render(&figure(rows, chip)).as_bytes())
        .map_err(io)?;
    Ok((csv_path, svg_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_gears_are_unique_prefixes_in_range() {
        let a = synthetic_gears(8, 4, 100, 1).unwrap();
        let b = synthetic_gears(100, 4, 100, 1).unwrap();
        assert_eq!(a[..], b[..8]);
        for (k, g) in b.iter().enumerate() {
            assert!(g.iter().all(|v| (1..=16).contains(v)));
            assert!(!b[..k].contains(g), "gear {k} repeats");
        }
        let one = synthetic_gears(100, 1, 100, 1).unwrap();
        assert_eq!(one.len(), 100);
        assert_eq!(synthetic_gears(20, 1, 100, 1).unwrap()[..], one[..20]);
        assert!(extend_gears(&[], 5, &[1, 1], &[2, 2], 0).is_err());
    }

    #[test]
    fn counts_ranges_and_picks() {
        assert_eq!(
            default_gear_counts(100),
            vec![2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 100]
        );
        assert_eq!(default_gear_counts(256).last(), Some(&256));
        assert!(!default_gear_counts(256).contains(&384));
        assert_eq!(default_gear_counts(2), vec![2]);
        assert_eq!(default_vector_lengths(400), vec![1, 4, 16, 64, 400]);
        assert_eq!(default_vector_lengths(48), vec![1, 4, 16, 48]);
        assert_eq!(ranges(&[2, 4, 8, 64], &[2, 4, 8, 16, 64]), "2-8, 64");
        assert_eq!(QueryGear::Last.pick(10), 9);
        assert_eq!(QueryGear::Middle.pick(10), 5);
        assert_eq!(ns(1_234_567), "1234.567");
    }
}
