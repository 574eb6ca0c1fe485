//! Fuzz targets of the `.om` as the runtime meets it: real models compiled from
//! `tests/models/gear_dims.onnx` (non-sink, GetNext sink with the AI CPU MapIndex, hybrid with
//! its source graph), damaged as whole files (as found, and resealed: size and checksums
//! recomputed with `om::reseal` so the decoders behind them are reached) and section by section
//! (a damaged section rebuilt into a valid container), then read by `OmFile::parse` +
//! `desc()`, `ModelTasks::decode`, `decode_kernels` with `Program::decode`, and loaded with
//! `Runtime::load`.
//!
//! Each case must be an error or a model that loads with the description the file holds;
//! never a panic, an allocation the file does not back, or a long run. `PROPTEST_CASES=20000
//! cargo test -p gearsim-host fuzz_om` runs them longer.

use std::sync::OnceLock;

use gearsim_compiler::ir::Tensor;
use gearsim_compiler::pipeline::{MapIndexEngine, compile};
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_isa::Program;
use gearsim_isa::om::{ModelDesc, OmFile, OmWriter, SectionKind, reseal};
use gearsim_isa::omtask::{Addr, ModelTasks, OmTask, Region, decode_kernels};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;
use proptest::prelude::*;

use crate::fuzz_onnx::SEEDS;
use crate::mutate::{boundary_value, fuzz_config, mutated, mutations, timed};

/// The compiled seeds: gear_dims non-sink, sink with the AI CPU MapIndex, and hybrid.
pub fn compiled_oms() -> &'static [Vec<u8>] {
    static OMS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    OMS.get_or_init(|| {
        let seed = SEEDS.iter().find(|s| s.name == "gear_dims.onnx").unwrap();
        let plain = seed.options();
        let mut sink = seed.options();
        sink.getnext_sink = true;
        sink.mapindex_engine = MapIndexEngine::AiCpu;
        let c = |o| compile(seed.bytes(), seed.name, o).unwrap();
        vec![
            c(&plain).om_bytes().unwrap(),
            c(&sink).om_bytes().unwrap(),
            c(&plain).hybrid_om_bytes().unwrap(),
        ]
    })
}

/// The preset the seeds are compiled for, with a kernel timeout of 20 million cycles instead
/// of a billion: the seeds' kernels take a few thousand, and a damaged launch that never ends
/// (a kernel run with more blocks than it was tiled for loops until the timeout) then fails
/// in a fraction of a second instead of many.
fn chip() -> ChipConfig {
    static CFG: OnceLock<ChipConfig> = OnceLock::new();
    CFG.get_or_init(|| {
        let mut cfg = ChipConfig::preset("ascend910").unwrap();
        cfg.core.kernel_timeout_cycles = 20_000_000;
        cfg
    })
    .clone()
}

/// Everything the runtime reads of a `.om`; every decoder must fail cleanly or agree with the
/// loaded model.
fn read_and_load(bytes: &[u8]) {
    let Ok(file) = OmFile::parse(bytes) else {
        return;
    };
    let Ok(desc) = file.desc() else {
        return;
    };
    if let Ok(images) = decode_kernels(file.section(SectionKind::Kernels).unwrap_or(&[])) {
        for k in &images {
            let _ = Program::decode(Some(k.name.clone()), &k.code);
        }
        if let Some(tasks) = file.section(SectionKind::Tasks) {
            let _ = ModelTasks::decode(tasks, images.len() as u32);
        }
    }
    let mut rt = Runtime::new(chip(), NullSink, RuntimeOptions::default()).unwrap();
    if let Ok(m) = rt.load(bytes) {
        assert_eq!(rt.desc(m).unwrap(), &desc);
    }
}

/// The inputs of gear 0 of the gear_dims seed (data [1,1,40,20], label [1,20], mask [1,1]),
/// or `extra` more elements on the last axis, which matches no gear.
fn seed_inputs(extra: i64) -> Vec<Tensor> {
    let t = 20 + extra;
    vec![
        Tensor::from_f32s(vec![1, 1, 40, t], &vec![0.5; 40 * t as usize]),
        Tensor::from_i32s(vec![1, t], &vec![3; t as usize]),
        Tensor::from_f32s(vec![1, 1], &[1.0]),
    ]
}

/// Loads `bytes` and, if that works, runs it once on the seed's inputs in the mode it was
/// compiled for: an error or a run, never a panic.
fn load_and_run(bytes: &[u8], extra: i64) {
    let mut rt = Runtime::new(chip(), NullSink, RuntimeOptions::default()).unwrap();
    let Ok(m) = rt.load(bytes) else {
        return;
    };
    let inputs = seed_inputs(extra);
    let _ = if rt.is_sink(m).unwrap() {
        rt.run_sink(m, &inputs)
    } else {
        rt.run(m, &inputs)
    };
}

/// The sections of a `.om`, to damage one and rebuild the container.
fn sections(bytes: &[u8]) -> Vec<(SectionKind, Vec<u8>)> {
    let file = OmFile::parse(bytes).unwrap();
    SectionKind::ALL
        .iter()
        .filter_map(|k| file.section(*k).map(|b| (*k, b.to_vec())))
        .collect()
}

/// A number somewhere in a decoded section, to be set to another value.
enum Num<'a> {
    I64(&'a mut i64),
    U64(&'a mut u64),
    U32(&'a mut u32),
}

impl Num<'_> {
    fn set(self, v: u64) {
        match self {
            Num::I64(x) => *x = v as i64,
            Num::U64(x) => *x = v,
            Num::U32(x) => *x = v as u32,
        }
    }
}

/// Every number of a model description: dims, sizes, types, gear values, modes.
fn desc_numbers(d: &mut ModelDesc) -> Vec<Num<'_>> {
    let mut out = Vec::new();
    for io in d.inputs.iter_mut().chain(d.outputs.iter_mut()) {
        out.push(Num::U32(&mut io.dtype));
        out.push(Num::U64(&mut io.bytes));
        out.extend(io.dims.iter_mut().map(Num::I64));
        out.extend(io.max_dims.iter_mut().map(Num::I64));
    }
    if let Some(dy) = &mut d.dynamic {
        out.push(Num::U32(&mut dy.mode));
        out.push(Num::U32(&mut dy.table_layout));
        out.push(Num::U32(&mut dy.mapindex_engine));
        out.extend(dy.gears.iter_mut().flatten().map(Num::I64));
        out.extend(dy.input_dims.iter_mut().flatten().flatten().map(Num::I64));
        out.extend(dy.output_dims.iter_mut().flatten().flatten().map(Num::I64));
        out.extend(dy.output_bytes.iter_mut().flatten().map(Num::U64));
    }
    let m = &mut d.memory;
    out.extend(
        [
            &mut m.weight_bytes,
            &mut m.feature_map_bytes,
            &mut m.root_feature_map_bytes,
            &mut m.input_bytes,
            &mut m.output_bytes,
        ]
        .into_iter()
        .map(Num::U64),
    );
    out.extend(m.per_gear_feature_map.iter_mut().map(Num::U64));
    out
}

fn addr_numbers(a: &mut Addr) -> Vec<Num<'_>> {
    let mut out = vec![Num::U64(&mut a.offset)];
    if let Region::Input(i) | Region::Output(i) = &mut a.region {
        out.push(Num::U32(i));
    }
    out
}

/// Every number of the task streams: offsets and sizes, kernel, label and stream numbers,
/// block dims, MapIndex shapes, shape_info values.
fn task_numbers(t: &mut ModelTasks) -> Vec<Num<'_>> {
    let mut out = vec![
        Num::U32(&mut t.labels),
        Num::U32(&mut t.events),
        Num::U64(&mut t.feature_map_bytes),
    ];
    if let Some(a) = &mut t.dims_out {
        out.extend(addr_numbers(a));
    }
    for task in t.streams.iter_mut().flatten() {
        match &mut task.task {
            OmTask::AiCore {
                kernel,
                block_dim,
                args,
                l2,
            } => {
                out.push(Num::U32(kernel));
                out.push(Num::U32(block_dim));
                for a in args {
                    out.push(Num::U64(&mut a.bytes));
                    out.extend(addr_numbers(&mut a.addr));
                }
                for c in l2 {
                    out.push(Num::U64(&mut c.bytes));
                    out.extend(addr_numbers(&mut c.addr));
                }
            }
            OmTask::MapIndex {
                n,
                gears,
                x,
                table,
                y,
                ..
            } => {
                out.push(Num::U32(n));
                out.push(Num::U32(gears));
                for a in [x, table, y] {
                    out.extend(addr_numbers(a));
                }
            }
            OmTask::AiCpu {
                inputs, outputs, ..
            } => {
                for a in inputs.iter_mut().chain(outputs.iter_mut()) {
                    out.push(Num::U64(&mut a.bytes));
                    out.extend(addr_numbers(&mut a.addr));
                }
            }
            OmTask::GetNext { outputs } => {
                for o in outputs {
                    out.push(Num::U64(&mut o.capacity));
                    out.extend(addr_numbers(&mut o.data));
                    out.extend(addr_numbers(&mut o.shape));
                }
            }
            OmTask::GetDynamicDims {
                shape_info,
                shapes,
                out: o,
            } => {
                out.extend(shape_info.iter_mut().map(Num::I64));
                for a in shapes {
                    out.extend(addr_numbers(a));
                }
                out.extend(addr_numbers(o));
            }
            OmTask::LabelSwitch { index, labels } => {
                out.extend(addr_numbers(index));
                out.extend(labels.iter_mut().map(Num::U32));
            }
            OmTask::LabelSet { label } | OmTask::LabelGoto { label } => {
                out.push(Num::U32(label));
            }
            OmTask::StreamActive { stream: Some(s) } => out.push(Num::U32(s)),
            OmTask::EventRecord { event } | OmTask::StreamWaitEvent { event } => {
                out.push(Num::U32(event));
            }
            OmTask::Memcpy { dst, src, size } => {
                out.push(Num::U64(size));
                out.extend(addr_numbers(dst));
                out.extend(addr_numbers(src));
            }
            OmTask::StreamActive { stream: None } | OmTask::EndGraph => {}
        }
    }
    out
}

/// A number of the description or of the tasks set to another value, the file rebuilt with a
/// valid container, so the runtime's own checks meet a well-formed but inconsistent model.
fn with_number(om: &[u8], in_tasks: bool, which: usize, value: u64) -> Vec<u8> {
    let mut parts = sections(om);
    for (kind, bytes) in &mut parts {
        match (kind, in_tasks) {
            (SectionKind::Desc, false) => {
                let mut d = ModelDesc::decode(bytes).unwrap();
                let mut nums = desc_numbers(&mut d);
                let k = which % nums.len();
                nums.swap_remove(k).set(value);
                *bytes = d.encode();
            }
            (SectionKind::Tasks, true) => {
                let mut t = ModelTasks::decode(bytes, u32::MAX).unwrap();
                let mut nums = task_numbers(&mut t);
                let k = which % nums.len();
                nums.swap_remove(k).set(value);
                *bytes = t.encode();
            }
            _ => {}
        }
    }
    let mut w = OmWriter::new();
    for (kind, b) in parts {
        w.section(kind, b);
    }
    w.finish()
}

#[test]
fn the_compiled_seeds_load_and_run() {
    for om in compiled_oms() {
        let mut rt = Runtime::new(chip(), NullSink, RuntimeOptions::default()).unwrap();
        let m = rt.load(om).unwrap();
        let inputs = seed_inputs(0);
        if rt.is_sink(m).unwrap() {
            rt.run_sink(m, &inputs).unwrap();
        } else {
            rt.run(m, &inputs).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(fuzz_config(48))]

    #[test]
    fn damaged_models_are_rejected_or_load_consistently(
        which in 0usize..3,
        damage in mutations(),
        reseal_after in any::<bool>(),
    ) {
        let mut bytes = mutated(&compiled_oms()[which], &damage);
        if reseal_after {
            reseal(&mut bytes);
        }
        timed("damaged .om load", || read_and_load(&bytes));
    }

    #[test]
    fn inconsistent_numbers_are_rejected_or_load_consistently(
        which in 0usize..3,
        in_tasks in any::<bool>(),
        number in any::<usize>(),
        value in prop_oneof![boundary_value(), 0u64..64, (1i64..1 << 20).prop_map(|v| (-v) as u64)],
    ) {
        let bytes = with_number(&compiled_oms()[which], in_tasks, number, value);
        timed("inconsistent .om load", || read_and_load(&bytes));
    }

    #[test]
    fn inconsistent_models_are_rejected_or_run(
        which in 0usize..3,
        in_tasks in any::<bool>(),
        number in any::<usize>(),
        value in prop_oneof![boundary_value(), 0u64..64, (1i64..1 << 20).prop_map(|v| (-v) as u64)],
        extra in prop_oneof![Just(0i64), 1i64..4],
    ) {
        let bytes = with_number(&compiled_oms()[which], in_tasks, number, value);
        timed("inconsistent .om run", || load_and_run(&bytes, extra));
    }

    #[test]
    fn damaged_sections_are_rejected_or_load_consistently(
        which in 0usize..3,
        section in any::<prop::sample::Index>(),
        damage in mutations(),
    ) {
        let mut parts = sections(&compiled_oms()[which]);
        let k = section.index(parts.len());
        parts[k].1 = mutated(&parts[k].1, &damage);
        let mut w = OmWriter::new();
        for (kind, b) in parts {
            w.section(kind, b);
        }
        let bytes = w.finish();
        timed("damaged .om section load", || read_and_load(&bytes));
    }
}

/// Regression (fuzzing): a device-to-device copy task whose size was set to u32::MAX loaded,
/// and its run moved 4 GiB through the simulator's memory (half a minute, gigabytes of host
/// memory); a copy reaching past its region is now a load error naming the task.
#[test]
fn a_copy_past_its_region_is_a_load_error() {
    let om = &compiled_oms()[2];
    let mut parts = sections(om);
    let mut copies = 0;
    for (kind, bytes) in &mut parts {
        if *kind == SectionKind::Tasks {
            let mut t = ModelTasks::decode(bytes, u32::MAX).unwrap();
            for task in t.streams.iter_mut().flatten() {
                if let OmTask::Memcpy { size, .. } = &mut task.task {
                    if copies == 0 {
                        *size = 4294967295;
                    }
                    copies += 1;
                }
            }
            *bytes = t.encode();
        }
    }
    assert!(copies > 0, "the hybrid seed has a device-to-device copy");
    let mut w = OmWriter::new();
    for (kind, b) in parts {
        w.section(kind, b);
    }
    let bytes = w.finish();
    let mut rt = Runtime::new(chip(), NullSink, RuntimeOptions::default()).unwrap();
    let e = rt.load(&bytes).unwrap_err().to_string();
    assert!(
        e.contains("4294967295 bytes at") && e.contains("reach past"),
        "{e}"
    );
}
