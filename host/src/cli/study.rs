//! `gearsim study gears | advise | batch`: parameter sweeps run in parallel (and shardable),
//! written as CSV (and an SVG figure): what gear selection costs, which gears to compile, and
//! what a network's execution takes at every batch size.

use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use gearsim_compiler::options::DynamicMode;
use gearsim_compiler::pipeline::{MapIndexEngine, TableLayout};

use super::Failure;
use super::flags::{ChipArgs, GearArgs};
use super::output::say_raw;
use gearsim_host::study::Shard;
use gearsim_traces::atomic::write_atomic;

#[derive(Subcommand)]
pub enum StudyCommand {
    /// What gear selection costs: sweeps gear count, gear vector length, table layout,
    /// MapIndex engine and where the table lives on a synthetic table-only model (or --model);
    /// writes gears.csv and gears.svg into --output_dir and prints which layout wins where.
    Gears(Box<StudyGearsArgs>),
    /// Which gears to compile: from a file of observed input shapes (with counts), proposes
    /// the gear set that minimises the expected simulated time per request under a gear and a
    /// memory budget (padding batches up where the model allows it, the hybrid dynamic path
    /// otherwise); writes advise.csv, advise_candidates.csv and advise.svg (the trade-off
    /// curve) into --output_dir.
    Advise(Box<StudyAdviseArgs>),
    /// What a network's execution takes at every batch size on one chip: builds the
    /// calibration table's networks (resnet18, resnet50, bertbase: BERT-base's encoder at
    /// sequence 128), runs each batch timing-only and writes batch.csv and batch.svg into
    /// --output_dir; the prediction for chips no public measurement covers.
    Batch(Box<StudyBatchArgs>),
}

#[derive(Args)]
pub struct StudyBatchArgs {
    /// Write batch.csv and batch.svg here (created if missing).
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: PathBuf,
    /// Networks, comma-separated: resnet18, resnet50, bertbase.
    #[arg(
        long = "nets",
        value_delimiter = ',',
        default_value = "resnet18,bertbase"
    )]
    nets: Vec<String>,
    /// Batch sizes, comma-separated.
    #[arg(
        long = "batches",
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64",
        allow_hyphen_values = true
    )]
    batches: Vec<i64>,
    /// atc's --precision_mode the networks are compiled with.
    #[arg(long = "precision_mode", default_value = "force_fp16")]
    precision_mode: String,
    /// Run the points on this many threads (default: one per host core).
    #[arg(long = "threads")]
    threads: Option<usize>,
    #[command(flatten)]
    chip: ChipArgs,
}

#[derive(Args)]
pub struct StudyAdviseArgs {
    /// The ONNX model.
    #[arg(long = "model", value_name = "FILE.onnx")]
    model: PathBuf,
    /// Input shapes, "name:d0,d1,...;..." with -1 on the axes the gears set (as atc).
    #[arg(long = "input_shape", allow_hyphen_values = true)]
    input_shape: String,
    /// Observed shapes: one request per line in --input_shape form with the real values,
    /// then an optional count, e.g. "input:3,3,32,32 120"; `#` starts a comment.
    #[arg(long = "shapes", value_name = "FILE")]
    shapes: PathBuf,
    /// The gear option to propose: dynamic_batch_size, dynamic_image_size or dynamic_dims
    /// (default: batch when every -1 is an axis 0, image size when they are H and W of one
    /// NCHW input, dims otherwise).
    #[arg(long = "gear_option")]
    gear_option: Option<String>,
    /// With --model: layout of the inputs (NCHW, NHWC or ND).
    #[arg(long = "input_format")]
    input_format: Option<String>,
    /// Most gears in a set (the curve runs from 2 to this).
    #[arg(long = "gear_budget", default_value_t = 8)]
    gear_budget: u32,
    /// Most device bytes the compiled model may hold (weights, gear table, feature maps,
    /// inputs and outputs): a number with an optional K, M or G (KiB, MiB, GiB) suffix.
    #[arg(long = "memory_budget")]
    memory_budget: Option<String>,
    /// Padding a batch up to a larger gear: auto (dynamic batch models whose rows the padding
    /// check shows independent) or never.
    #[arg(long = "pad", default_value = "auto")]
    pad: String,
    /// Host time charged per op a dynamic-path run executes (shape inference, tiling, launch),
    /// in microseconds: the study's parameter, added to the simulated device time.
    #[arg(long = "host_us_per_op", default_value_t = 5.0)]
    host_us_per_op: f64,
    /// Write advise.csv, advise_candidates.csv and advise.svg here (created if missing).
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: PathBuf,
    /// Simulate on this many threads (default: one per host core).
    #[arg(long = "threads")]
    threads: Option<usize>,
    /// Measure only shard I of N of the candidates (the observed gear vectors p with
    /// p % N == I) and write them as advise_candidates.csv, e.g.
    /// $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT; then --candidates with every shard's
    /// file gives the whole run's advice.
    #[arg(long = "shard", value_name = "I/N", default_value = "0/1")]
    shard: String,
    /// Candidates measured by the shards of a sharded run (their advise_candidates.csv
    /// files): the advice is computed from them instead of measuring each candidate again.
    #[arg(long = "candidates", value_name = "FILE.csv", num_args = 1.., conflicts_with = "shard")]
    candidates: Vec<PathBuf>,
    #[command(flatten)]
    chip: ChipArgs,
}

#[derive(Args)]
pub struct StudyGearsArgs {
    /// Write gears.csv and gears.svg here (created if missing).
    #[arg(long = "output_dir", value_name = "DIR")]
    output_dir: PathBuf,
    /// Sweep this ONNX model instead of the synthetic one (needs --input_shape and a gear
    /// option; gear counts take prefixes of its gear list, extended by generated gears).
    #[arg(long = "model", value_name = "FILE.onnx")]
    model: Option<PathBuf>,
    // With --model: its input shapes, one gear option and the layout of the inputs.
    #[command(flatten)]
    gear: GearArgs,
    /// Gear counts, comma-separated (default: 2, 3, 4, 6, 8, 12, ... and the chip's MapIndex
    /// limit).
    #[arg(long = "gear_counts", value_delimiter = ',')]
    gear_counts: Vec<u32>,
    /// Gear vector lengths of the synthetic model, comma-separated (default: 1, 4, 16, 64
    /// and the chip's MapIndex limit).
    #[arg(long = "dims", value_delimiter = ',')]
    dims: Vec<u32>,
    /// Table layouts, comma-separated: gear_major, dim_major8, sorted_binary.
    #[arg(
        long = "layouts",
        value_delimiter = ',',
        default_value = "gear_major,dim_major8,sorted_binary"
    )]
    layouts: Vec<String>,
    /// MapIndex engines, comma-separated: aicore, aicpu.
    #[arg(
        long = "engines",
        value_delimiter = ',',
        default_value = "aicore,aicpu"
    )]
    engines: Vec<String>,
    /// Where the table is when MapIndex reads it, comma-separated: hbm (cold L2, the first run
    /// after load), l2 (resident after the first run touched it).
    #[arg(long = "table_homes", value_delimiter = ',', default_value = "hbm,l2")]
    table_homes: Vec<String>,
    /// The gear the inputs select: first, middle or last (a scan's worst case).
    #[arg(long = "query_gear", default_value = "last")]
    query_gear: String,
    /// Seed of the generated gears.
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// Run the points on this many threads (default: one per host core).
    #[arg(long = "threads")]
    threads: Option<usize>,
    /// Run only shard I of N (the points p with p % N == I), e.g. $SLURM_ARRAY_TASK_ID/16;
    /// the shards' CSVs concatenate (one header) into the whole sweep's.
    #[arg(long = "shard", value_name = "I/N", default_value = "0/1")]
    shard: String,
    #[command(flatten)]
    chip: ChipArgs,
}

/// Runs a `gearsim study` subcommand.
pub fn run(c: StudyCommand) -> Result<(), Failure> {
    match c {
        StudyCommand::Gears(a) => gears(&a),
        StudyCommand::Advise(a) => advise(&a),
        StudyCommand::Batch(a) => batch(&a),
    }
}

fn batch(a: &StudyBatchArgs) -> Result<(), Failure> {
    use gearsim_compiler::precision::PrecisionMode;
    use gearsim_host::calibrate::nets::Net;
    use gearsim_host::study::batch;
    let chip = a.chip.config()?;
    let nets = a
        .nets
        .iter()
        .map(|n| {
            Net::network(n).ok_or_else(|| {
                anyhow!(
                    "--nets: expected some of {}, got `{n}`",
                    Net::network_names()
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let precision = PrecisionMode::parse(&a.precision_mode)?;
    let threads = a
        .threads
        .unwrap_or_else(gearsim_host::study::host_threads)
        .max(1);
    let started = std::time::Instant::now();
    let rows = batch::run(&chip, &nets, &a.batches, precision, threads, &|_, _| {})?;
    std::fs::create_dir_all(&a.output_dir)
        .with_context(|| format!("cannot create {}", a.output_dir.display()))?;
    let (csv, svg) = (
        a.output_dir.join("batch.csv"),
        a.output_dir.join("batch.svg"),
    );
    gearsim_traces::atomic::write_atomic(&csv, batch::csv(&rows).as_bytes())
        .with_context(|| format!("cannot write {}", csv.display()))?;
    gearsim_traces::atomic::write_atomic(&svg, batch::svg(&rows).as_bytes())
        .with_context(|| format!("cannot write {}", svg.display()))?;
    say_raw(&batch::table(&rows));
    say!(
        "{} row(s) in {:.1} s on {threads} thread(s): {} and {}",
        rows.len(),
        started.elapsed().as_secs_f64(),
        csv.display(),
        svg.display()
    );
    Ok(())
}

fn gears(a: &StudyGearsArgs) -> Result<(), Failure> {
    use gearsim_host::study::gears::{
        self, GearStudy, ModelWorkload, QueryGear, TableHome, Workload,
    };
    use gearsim_host::study::{Shard, host_threads};
    let chip = a.chip.config()?;
    let mut study = GearStudy::default_sweep(chip);
    if let Some(path) = &a.model {
        let onnx =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        study.workload = Workload::Model(Box::new(ModelWorkload {
            onnx,
            file: path.display().to_string(),
            gear: a.gear.options()?,
        }));
    } else if a.gear.any_shape() {
        return Err(anyhow!(
            "--input_shape and the gear options describe --model; the synthetic study makes its own"
        )
        .into());
    }
    if !a.gear_counts.is_empty() {
        study.gear_counts = a.gear_counts.clone();
    }
    if !a.dims.is_empty() {
        if a.model.is_some() {
            return Err(anyhow!(
                "--dims sets the synthetic model's gear vector length; --model's is fixed by its \
                 --input_shape"
            )
            .into());
        }
        study.vector_lengths = a.dims.clone();
    }
    study.layouts = a
        .layouts
        .iter()
        .map(|l| {
            TableLayout::parse(l).ok_or_else(|| {
                anyhow!(
                    "--layouts: expected some of {}, got `{l}`",
                    TableLayout::names()
                )
            })
        })
        .collect::<Result<_>>()?;
    study.engines = a
        .engines
        .iter()
        .map(|e| {
            MapIndexEngine::parse(e)
                .ok_or_else(|| anyhow!("--engines: expected aicore or aicpu, got `{e}`"))
        })
        .collect::<Result<_>>()?;
    study.homes = a
        .table_homes
        .iter()
        .map(|h| {
            TableHome::parse(h)
                .ok_or_else(|| anyhow!("--table_homes: expected hbm or l2, got `{h}`"))
        })
        .collect::<Result<_>>()?;
    study.query = QueryGear::parse(&a.query_gear).ok_or_else(|| {
        anyhow!(
            "--query_gear: expected first, middle or last, got `{}`",
            a.query_gear
        )
    })?;
    study.seed = a.seed;
    let shard = Shard::parse(&a.shard)?;
    let threads = a.threads.unwrap_or_else(host_threads).max(1);
    let started = std::time::Instant::now();
    // Points finish out of order on several threads; the counter numbers them as they end.
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let progress = |_: usize, total: usize, p: &gears::Point, r: &Result<Vec<gears::Row>, _>| {
        let n = finished.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if r.is_ok() {
            eprintln!("[{n}/{total}] point {} {p}", p.index);
        }
    };
    let rows = gears::run(&study, shard, threads, &progress)?;
    let (csv, svg) = gears::write_outputs(&a.output_dir, &rows, &study.chip.name)?;
    say!(
        "{} row(s) of shard {shard} on {threads} thread(s) in {:.1} s: {} and {}",
        rows.len(),
        started.elapsed().as_secs_f64(),
        csv.display(),
        svg.display()
    );
    say_raw(&gears::summary(&rows));
    Ok(())
}

fn advise(a: &StudyAdviseArgs) -> Result<(), Failure> {
    use gearsim_compiler::options::parse_input_shape;
    use gearsim_host::study::advise::{
        self, AdviseOptions, PadPolicy, default_mode, parse_bytes, parse_shapes,
    };
    let chip = a.chip.config()?;
    let onnx =
        std::fs::read(&a.model).with_context(|| format!("cannot read {}", a.model.display()))?;
    let inputs =
        parse_input_shape(&a.input_shape, true).map_err(|e| anyhow!("--input_shape: {e}"))?;
    let mode = match a.gear_option.as_deref() {
        None => default_mode(&inputs),
        Some("dynamic_batch_size") => DynamicMode::Batch,
        Some("dynamic_image_size") => DynamicMode::ImageSize,
        Some("dynamic_dims") => DynamicMode::Dims,
        Some(other) => {
            return Err(anyhow!(
                "--gear_option: expected dynamic_batch_size, dynamic_image_size or dynamic_dims, \
                 got `{other}`"
            )
            .into());
        }
    };
    let text = std::fs::read_to_string(&a.shapes)
        .with_context(|| format!("cannot read {}", a.shapes.display()))?;
    let shapes = parse_shapes(&text, &a.shapes.display().to_string(), &inputs, mode)?;
    let memory_budget = match &a.memory_budget {
        None => None,
        Some(s) => Some(parse_bytes(s).ok_or_else(|| {
            anyhow!("--memory_budget: expected bytes with an optional K, M or G suffix, got `{s}`")
        })?),
    };
    let pad = PadPolicy::parse(&a.pad)
        .ok_or_else(|| anyhow!("--pad: expected auto or never, got `{}`", a.pad))?;
    let threads = a
        .threads
        .unwrap_or_else(gearsim_host::study::host_threads)
        .max(1);
    let started = std::time::Instant::now();
    let options = AdviseOptions {
        onnx,
        file: a.model.display().to_string(),
        input_shape: a.input_shape.clone(),
        input_format: a.input_format.clone(),
        mode: Some(mode),
        shapes,
        gear_budget: a.gear_budget,
        memory_budget,
        pad,
        host_us_per_op: a.host_us_per_op,
        chip,
        threads,
    };
    let shard = Shard::parse(&a.shard)?;
    if shard != Shard::ALL {
        let measured = advise::measure_shard(&options, shard)?;
        std::fs::create_dir_all(&a.output_dir)
            .with_context(|| format!("cannot create {}", a.output_dir.display()))?;
        let path = a.output_dir.join("advise_candidates.csv");
        let text = advise::candidates_csv_of(
            mode,
            &measured,
            options.shapes.total(),
            (options.host_us_per_op * 1e6).round() as u64,
        );
        write_atomic(&path, text.as_bytes()).with_context(|| format!("{}", path.display()))?;
        say!(
            "shard {shard}: {} of {} candidates measured in {:.1} s on {threads} thread(s): {} \
             (give every shard's file to --candidates for the advice)",
            measured.len(),
            options.shapes.vectors.len(),
            started.elapsed().as_secs_f64(),
            path.display()
        );
        return Ok(());
    }
    let adv = if a.candidates.is_empty() {
        advise::advise(&options)?
    } else {
        let mut measured = Vec::new();
        for f in &a.candidates {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            measured.extend(advise::parse_candidates(&text, &f.display().to_string())?);
        }
        advise::advise_measured(&options, measured)?
    };
    let files = advise::write_outputs(&a.output_dir, &adv)?;
    say_raw(&advise::summary(&adv));
    let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    say!(
        "{} in {:.1} s on {threads} thread(s)",
        names.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
