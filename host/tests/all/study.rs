//! `gearsim study gears`: a small sweep writes a well-formed CSV and SVG; shards and thread
//! counts change nothing but which process computes a row; every layout and engine selects
//! the queried gear; the sorted layout scans less than GE's gear-major one at many gears; a
//! model compiled with the sorted layout computes exactly what a gear-major one does.

use std::path::Path;
use std::process::Command;

use gearsim_compiler::ir::Tensor;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, MapIndexEngine, TableLayout, compile};
use gearsim_host::atc;
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_host::study::gears::{
    self, CSV_HEADER, GearStudy, ModelWorkload, QueryGear, Row, TableHome, Workload,
};
use gearsim_host::study::{Shard, StudyError};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

use super::device_run::rand_f32;

fn chip() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

fn small(counts: &[u32], dims: &[u32]) -> GearStudy {
    let mut s = GearStudy::default_sweep(chip());
    s.gear_counts = counts.to_vec();
    s.vector_lengths = dims.to_vec();
    s
}

fn run(study: &GearStudy, shard: Shard, threads: usize) -> Vec<Row> {
    gears::run(study, shard, threads, &|_, _, _, _| {}).unwrap()
}

/// The rows without the host's wall-clock compile time, which no two runs share.
fn deterministic(rows: &[Row]) -> Vec<Row> {
    rows.iter()
        .map(|r| Row {
            compile_ms: 0.0,
            ..r.clone()
        })
        .collect()
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("study")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn a_tiny_sweep_writes_a_well_formed_csv_and_svg() {
    let dir = scratch("tiny");
    let o = Command::new(env!("CARGO_BIN_EXE_gearsim"))
        .args([
            "study",
            "gears",
            "--gear_counts",
            "2,9",
            "--dims",
            "3",
            "--threads",
            "2",
        ])
        .arg("--output_dir")
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("24 row(s) of shard 0/1"), "{stdout}");
    assert!(stdout.contains("which layout wins where"), "{stdout}");
    assert!(stdout.contains("compile time"), "{stdout}");
    let csv = std::fs::read_to_string(dir.join("gears.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(CSV_HEADER));
    let columns = CSV_HEADER.split(',').count();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // 2 gear counts x 1 length x 3 layouts x 2 engines, each at 2 table homes.
    assert_eq!(rows.len(), 24);
    for r in &rows {
        assert_eq!(r.len(), columns, "{r:?}");
        assert_eq!(r[1], "synthetic");
        assert_eq!(r[7], r[8], "the queried gear is the one selected: {r:?}");
        for numeric in [9, 10, 11, 12, 13, 18, 20] {
            assert!(
                r[numeric].parse::<f64>().unwrap() > 0.0,
                "column {numeric}: {r:?}"
            );
        }
    }
    let svg = std::fs::read_to_string(dir.join("gears.svg")).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    // One panel per engine (L = 3 only), one line per layout and home in each.
    assert_eq!(svg.matches("<g>").count(), svg.matches("</g>").count());
    assert_eq!(svg.matches("<g>").count(), 2);
    assert_eq!(svg.matches("<polyline").count(), 2 * 3 * 2);
    assert!(svg.contains("sorted_binary, table in l2"));
    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn shards_and_thread_counts_change_nothing_but_who_computes_a_row() {
    let study = small(&[2, 5, 16], &[1, 6]);
    let whole = deterministic(&run(&study, Shard::ALL, 1));
    assert_eq!(whole.len(), 3 * 2 * 3 * 2 * 2);
    assert_eq!(deterministic(&run(&study, Shard::ALL, 3)), whole);
    let mut merged = Vec::new();
    for i in 0..4 {
        let shard = Shard::parse(&format!("{i}/4")).unwrap();
        let rows = run(&study, shard, 2);
        assert!(rows.iter().all(|r| r.point % 4 == i));
        merged.extend(deterministic(&rows));
    }
    // Concatenated shards sorted by point (stable, so the homes keep their order).
    merged.sort_by_key(|r| r.point);
    assert_eq!(merged, whole);
    // And their CSVs concatenate into the whole one, headers aside.
    assert_eq!(gears::csv(&merged), gears::csv(&whole));
}

#[test]
fn shard_specs_are_checked() {
    assert_eq!(
        Shard::parse("3/16").unwrap(),
        Shard {
            index: 3,
            count: 16
        }
    );
    for bad in ["16/16", "1", "a/2", "0/0", "-1/4"] {
        let e = Shard::parse(bad).unwrap_err();
        assert!(matches!(e, StudyError::Options(_)), "{bad}");
        assert!(e.to_string().contains("expected I/N"), "{e}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_gearsim"))
        .args(["study", "gears", "--shard", "4/4", "--output_dir"])
        .arg(scratch("bad_shard"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--shard `4/4`"));
    let mut study = small(&[1, 4], &[2]);
    let e = gears::run(&study, Shard::ALL, 1, &|_, _, _, _| {}).unwrap_err();
    assert!(
        e.to_string().contains("gear count 1 is outside [2, 100]"),
        "{e}"
    );
    study.gear_counts = vec![101];
    assert!(gears::run(&study, Shard::ALL, 1, &|_, _, _, _| {}).is_err());
}

#[test]
fn every_layout_and_engine_selects_the_queried_gear() {
    for query in QueryGear::ALL {
        let mut study = small(&[2, 7, 33], &[1, 5]);
        study.query = query;
        study.seed = 11;
        let rows = run(&study, Shard::ALL, 2);
        assert_eq!(rows.len(), 3 * 2 * 3 * 2 * 2);
        for r in &rows {
            assert_eq!(r.query_gear, query.pick(r.gears as usize));
            assert_eq!(r.selected, r.query_gear as i32, "{r:?}");
        }
        for layout in TableLayout::ALL {
            assert!(rows.iter().any(|r| r.layout == layout));
        }
    }
}

#[test]
fn on_an_a2_chip_map_index_runs_on_a_vector_core_within_its_smaller_ub() {
    // An AIV has 192 KiB of UB against the 910's 256 KiB: the largest tables (100 gears of 400
    // values, 160 KB) must be chunked or streamed within it, not overrun it.
    let mut study = GearStudy::default_sweep(ChipConfig::preset("ascend910b2").unwrap());
    study.gear_counts = vec![64, 100];
    study.vector_lengths = vec![400];
    let rows = run(&study, Shard::ALL, 2);
    assert_eq!(rows.len(), 2 * 3 * 2 * 2);
    for r in &rows {
        assert_eq!(r.selected, r.query_gear as i32, "{r:?}");
    }
    // The AIV's MapIndex beats the AI CPU's at a small table, as on the 910.
    let small = run(
        &{
            let mut s = study.clone();
            s.gear_counts = vec![8];
            s.vector_lengths = vec![4];
            s
        },
        Shard::ALL,
        2,
    );
    for layout in TableLayout::ALL {
        let at = |engine| {
            small
                .iter()
                .find(|r| r.engine == engine && r.layout == layout && r.home == TableHome::Hbm)
                .unwrap()
                .select_ps
        };
        assert!(
            at(MapIndexEngine::AiCore) < at(MapIndexEngine::AiCpu),
            "{layout:?}"
        );
    }
}

#[test]
fn sorted_binary_scans_fewer_cycles_than_gear_major_at_many_gears() {
    let mut study = small(&[100], &[4]);
    study.layouts = vec![TableLayout::GearMajor, TableLayout::SortedBinary];
    let rows = run(&study, Shard::ALL, 2);
    for engine in MapIndexEngine::ALL {
        for home in TableHome::ALL {
            let at = |layout| {
                rows.iter()
                    .find(|r| r.engine == engine && r.home == home && r.layout == layout)
                    .unwrap()
            };
            let (gm, sorted) = (at(TableLayout::GearMajor), at(TableLayout::SortedBinary));
            assert!(
                sorted.mapindex_cycles < gm.mapindex_cycles,
                "{engine:?} {home:?}: sorted {} vs gear-major {}",
                sorted.mapindex_cycles,
                gm.mapindex_cycles
            );
            assert!(sorted.select_ps < gm.select_ps);
        }
    }
    // The table read from L2 makes the AI core kernel faster; the AI CPU reads outside the L2.
    let cycles = |engine, home| {
        rows.iter()
            .find(|r| r.engine == engine && r.home == home && r.layout == TableLayout::GearMajor)
            .unwrap()
            .mapindex_cycles
    };
    assert!(
        cycles(MapIndexEngine::AiCore, TableHome::L2)
            < cycles(MapIndexEngine::AiCore, TableHome::Hbm)
    );
    assert_eq!(
        cycles(MapIndexEngine::AiCpu, TableHome::L2),
        cycles(MapIndexEngine::AiCpu, TableHome::Hbm)
    );
}

fn seed_model() -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models/gear_dims.onnx"))
        .unwrap()
}

fn seed_gear_options() -> GearOptions {
    GearOptions {
        input_shape: Some("data:1,1,40,-1;label:1,-1;mask:-1,-1".into()),
        dynamic_dims: Some("20,20,1,1;40,40,2,2;80,60,4,4".into()),
        ..GearOptions::default()
    }
}

#[test]
fn a_model_workload_sweeps_prefixes_of_its_gears_and_generated_ones() {
    let mut study = small(&[2, 3, 6], &[]);
    study.workload = Workload::Model(Box::new(ModelWorkload {
        onnx: seed_model(),
        file: "gear_dims.onnx".into(),
        gear: seed_gear_options(),
    }));
    study.engines = vec![MapIndexEngine::AiCore];
    let rows = run(&study, Shard::ALL, 2);
    assert_eq!(rows.len(), 3 * 3 * 2);
    for r in &rows {
        assert_eq!((r.workload.as_str(), r.dims), ("gear_dims", 4));
        assert_eq!(r.selected, r.query_gear as i32);
        assert!(r.weight_bytes >= r.table_bytes && r.feature_map_bytes > 0);
    }
    let mut counts: Vec<u32> = rows.iter().map(|r| r.gears).collect();
    counts.dedup();
    assert_eq!(counts, vec![2, 3, 6]);
}

/// Random inputs of the seed model at gear values [t, l, m, k].
fn seed_inputs(g: &[i64], seed: u64) -> Vec<Tensor> {
    let label = rand_f32(&[1, g[1]], -1000.0, 1000.0, seed + 1);
    let label: Vec<u8> = label
        .to_f64s()
        .iter()
        .flat_map(|v| (*v as i32).to_le_bytes())
        .collect();
    vec![
        rand_f32(&[1, 1, 40, g[0]], -1.0, 1.0, seed),
        Tensor::new(gearsim_compiler::ir::DataType::I32, vec![1, g[1]], label).unwrap(),
        rand_f32(&[g[2], g[3]], -1.0, 1.0, seed + 2),
    ]
}

#[test]
fn a_sorted_table_model_computes_what_a_gear_major_one_does_in_both_modes() {
    let compiled = |layout, engine, sink| {
        let opts = CompileOptions {
            gear: seed_gear_options(),
            getnext_sink: sink,
            table_layout: layout,
            mapindex_engine: engine,
            fusion: Default::default(),
            precision: Default::default(),
            target: atc::target(&chip()),
        };
        compile(&seed_model(), "gear_dims.onnx", &opts)
            .unwrap()
            .om_bytes()
            .unwrap()
    };
    let gears = [[20, 20, 1, 1], [40, 40, 2, 2], [80, 60, 4, 4]];
    let mut rt = Runtime::new(chip(), NullSink, RuntimeOptions::default()).unwrap();
    let base = rt
        .load(&compiled(
            TableLayout::GearMajor,
            MapIndexEngine::AiCore,
            false,
        ))
        .unwrap();
    for engine in MapIndexEngine::ALL {
        let plain = rt
            .load(&compiled(TableLayout::SortedBinary, engine, false))
            .unwrap();
        let sink = rt
            .load(&compiled(TableLayout::SortedBinary, engine, true))
            .unwrap();
        for (g, dims) in gears.iter().enumerate() {
            let x = seed_inputs(dims, 40 + g as u64);
            let want = rt.run(base, &x).unwrap();
            for r in [rt.run(plain, &x).unwrap(), rt.run_sink(sink, &x).unwrap()] {
                assert_eq!(r.gear, Some(g), "{engine:?}");
                assert_eq!(r.cur_dynamic_dims, dims.to_vec());
                for (a, b) in r.outputs.iter().zip(&want.outputs) {
                    assert_eq!(
                        (&a.dims, &a.data),
                        (&b.dims, &b.data),
                        "{engine:?} gear {g}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_batch_study_times_a_network_at_every_batch_and_rejects_bad_sweeps() {
    let dir = scratch("batch");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gearsim"))
            .args(["study", "batch", "--soc_version", "ascend910b2"])
            .args(args)
            .arg("--output_dir")
            .arg(&dir)
            .output()
            .unwrap()
    };
    let o = run(&["--nets", "resnet18", "--batches", "1,4"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let csv = std::fs::read_to_string(dir.join("batch.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(gearsim_host::study::batch::CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2);
    let num = |r: &[&str], i: usize| r[i].parse::<f64>().unwrap();
    for r in &rows {
        assert_eq!(
            (r[0], r[1], r[3]),
            ("resnet18", "ascend910b2", "force_fp16")
        );
        // 26 kernels: the fused network, as on the coupled chips.
        assert_eq!(r[7], "26", "{r:?}");
    }
    // Four images take longer than one, but less than four times as long.
    let (t1, t4) = (num(&rows[0], 4), num(&rows[1], 4));
    assert!(t4 > t1 && t4 < 4.0 * t1, "{t1} {t4}");
    assert!(num(&rows[1], 6) > num(&rows[0], 6));
    assert!(stdout.contains("2 row(s)"), "{stdout}");
    let svg = std::fs::read_to_string(dir.join("batch.svg")).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.contains("resnet18") && svg.contains("device us per item"));
    assert_eq!(svg.matches("<polyline").count(), 2);
    // Bad sweeps name the problem and leave the results in place.
    for (args, want) in [
        (
            &["--nets", "vgg16"][..],
            "--nets: expected some of resnet18",
        ),
        (
            &["--nets", "gemm8x8x8"][..],
            "--nets: expected some of resnet18",
        ),
        (
            &["--batches", "0"][..],
            "expected positive batch sizes, got 0",
        ),
        (&["--precision_mode", "fp8"][..], "E10001"),
    ] {
        let o = run(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
    assert_eq!(std::fs::read_to_string(dir.join("batch.csv")).unwrap(), csv);
}
