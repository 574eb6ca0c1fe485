//! Whole compiled models on the simulated device: compile, write the `.om`, load it, run every
//! gear in non-sink and sink mode, and check outputs, the selected branch and
//! `cur_dynamic_dims`.

use std::collections::BTreeMap;

use gearsim_compiler::ir::Tensor;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, Compiled, compile};
use gearsim_firmware::{Device, DevicePtr, HostTensor};
use gearsim_host::atc;
use gearsim_host::runtime::LoadedModel;
use gearsim_isa::om::OmFile;
use gearsim_isa::omtask::OmTask;
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;
use prost::Message as _;

use super::device_run::{assert_close, f32s, rand_f32};
use super::onnx_build::{f32_init, model, node};

/// y = Relu(x * 2 - 1), then PyTorch's flatten (Shape → Gather → Unsqueeze → Concat →
/// Reshape) to [N, 5] → [N*5]; `x` is also returned as is (a direct output).
fn scalar_model() -> Vec<u8> {
    let nodes = vec![
        node("Mul", "mul", &["x", "two"], &["m"]),
        node("Sub", "sub", &["m", "one"], &["s"]),
        node("Relu", "relu", &["s"], &["y"]),
        node("Shape", "shape", &["y"], &["sh"]),
        node("Gather", "gather", &["sh", "zero"], &["n"]),
        node("Unsqueeze", "unsq", &["n", "axes"], &["n1"]),
        node("Mul", "mul5", &["n1", "five"], &["n5"]),
        node("Reshape", "reshape", &["y", "n5"], &["flat"]),
    ];
    let i64_init =
        |name: &str, dims: &[i64], v: &[i64]| gearsim_compiler::onnx::proto::TensorProto {
            name: name.into(),
            dims: dims.to_vec(),
            data_type: 7,
            raw_data: Some(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
            ..Default::default()
        };
    let m = model(
        17,
        nodes,
        &[("x", &[None, Some(5)])],
        &[("flat", &[None]), ("x", &[None, Some(5)])],
        vec![
            f32_init("two", &[], &[2.0]),
            f32_init("one", &[], &[1.0]),
            i64_init("zero", &[], &[0]),
            i64_init("axes", &[1], &[0]),
            i64_init("five", &[1], &[5]),
        ],
    );
    m.encode_to_vec()
}

fn options(sink: bool) -> CompileOptions {
    CompileOptions {
        gear: GearOptions {
            input_shape: Some("x:-1,5".into()),
            dynamic_batch_size: Some("1,3,8".into()),
            ..GearOptions::default()
        },
        getnext_sink: sink,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        fusion: Default::default(),
        precision: gearsim_compiler::precision::PrecisionMode::MustKeepOriginDtype,
        target: atc::target(&cfg()),
    }
}

fn cfg() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

fn reference(x: &Tensor) -> Vec<f64> {
    x.to_f64s()
        .iter()
        .map(|v| (v * 2.0 - 1.0).max(0.0))
        .collect()
}

fn read(dev: &mut Device<NullSink>, p: DevicePtr, bytes: usize) -> Vec<u8> {
    let mut b = vec![0u8; bytes];
    dev.read(p, &mut b).unwrap();
    b
}

fn compiled(sink: bool) -> (Compiled, Vec<u8>) {
    let c = compile(&scalar_model(), "scalar.onnx", &options(sink)).unwrap();
    let om = c.om_bytes().unwrap();
    (c, om)
}

#[test]
fn case_lowering_follows_ges_label_layout() {
    let (c, _) = compiled(false);
    let names: Vec<&str> = c.emitted.tasks.streams[0]
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    let case = "ascend_mbatch_shape_case";
    let expect_prefix = [
        "ascend_mbatch_shape_mapindex",
        &format!("{case}/LabelSwitch"),
    ];
    assert_eq!(
        &names[..2],
        &expect_prefix
            .map(String::from)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()[..]
    );
    for i in 0..3 {
        let set = format!("{case}/LabelSet_{i}");
        let pos = names
            .iter()
            .position(|n| *n == set)
            .unwrap_or_else(|| panic!("no {set} in {names:?}"));
        assert_eq!(names[pos + 1], format!("{case}/StreamActive_{i}"));
    }
    assert!(names.contains(&"ascend_mbatch_shape_case/LabelGoto_0"));
    assert!(names.contains(&"ascend_mbatch_shape_case/LabelGoto_1"));
    assert!(!names.contains(&"ascend_mbatch_shape_case/LabelGoto_2"));
    let last = names
        .iter()
        .position(|n| *n == "ascend_mbatch_shape_case/LabelSet_Last")
        .unwrap();
    assert_eq!(*names.last().unwrap(), "EndGraph");
    // The direct output's copy runs after the Case.
    assert!(
        names[last + 1..]
            .iter()
            .any(|n| n.contains("copy_output_1")),
        "{names:?}"
    );
    // LabelSwitch lists L_0..L_2 = labels 1..3; L_exit is label 0.
    let sw = &c.emitted.tasks.streams[0][1].task;
    assert_eq!(
        *sw,
        OmTask::LabelSwitch {
            index: match sw {
                OmTask::LabelSwitch { index, .. } => *index,
                _ => unreachable!(),
            },
            labels: vec![1, 2, 3]
        }
    );
    assert_eq!(c.emitted.tasks.labels, 4);
}

#[test]
fn the_compiled_model_passes_the_verifier() {
    for sink in [false, true] {
        let (c, _) = compiled(sink);
        let programs: Vec<_> = c
            .emitted
            .kernels
            .iter()
            .map(|k| k.program.clone())
            .collect();
        let r = gearsim_host::verify::verify(
            &gearsim_host::verify::ModelView {
                desc: &c.desc,
                tasks: &c.emitted.tasks,
                kernels: &programs,
                kernel_flags: &c.emitted.kernel_flags().unwrap_or_default(),
                weight_bytes: c.emitted.weights.bytes(),
            },
            &cfg(),
        );
        assert!(r.is_ok() && r.notes.is_empty(), "{r}");
        assert!(r.launches >= 3 && r.blocks >= 3, "{r}");
    }
}

#[test]
fn every_gear_runs_its_branch_in_non_sink_mode() {
    let (c, om) = compiled(false);
    let file = OmFile::parse(&om).unwrap();
    let mut dev = Device::new(cfg(), NullSink);
    let m = LoadedModel::load(&mut dev, &file).unwrap();
    let stream = dev.create_stream().unwrap();
    for (gear, n) in [1i64, 3, 8].iter().enumerate() {
        let x = rand_f32(&[*n, 5], -2.0, 2.0, gear as u64);
        dev.write(m.inputs[0], &x.data).unwrap();
        dev.write(m.inputs[1], &(*n as i32).to_le_bytes()).unwrap();
        m.execute(&mut dev, stream).unwrap();
        assert_eq!(m.selected_branch(&mut dev).unwrap(), Some(gear as i32));
        let d = c.desc.dynamic.as_ref().unwrap();
        let out_dims = &d.output_dims[gear][0];
        assert_eq!(out_dims, &vec![n * 5]);
        let bytes = read(&mut dev, m.outputs[0], (n * 5 * 4) as usize);
        let y = Tensor::new(gearsim_compiler::ir::DataType::F32, vec![n * 5], bytes).unwrap();
        assert_close(
            &f32s(&y),
            &reference(&x),
            1e-6,
            0.0,
            &format!("gear {gear}"),
        );
        // The direct output is the input, copied (at its max-gear size).
        let back = read(&mut dev, m.outputs[1], x.data.len());
        assert_eq!(back, x.data.to_vec());
    }
    // A vector that is no gear: MapIndex gives -1 and the device runs the last branch.
    dev.write(m.inputs[1], &5i32.to_le_bytes()).unwrap();
    m.execute(&mut dev, stream).unwrap();
    assert_eq!(m.selected_branch(&mut dev).unwrap(), Some(-1));
}

#[test]
fn sink_mode_reads_dims_back_from_the_device() {
    let (_, om) = compiled(true);
    let file = OmFile::parse(&om).unwrap();
    let mut dev = Device::new(cfg(), NullSink);
    let m = LoadedModel::load(&mut dev, &file).unwrap();
    let stream = dev.create_stream().unwrap();
    let q = m.queue.unwrap();
    let mut xs = BTreeMap::new();
    for (gear, n) in [3i64, 1, 8].iter().enumerate() {
        let x = rand_f32(&[*n, 5], -2.0, 2.0, 100 + gear as u64);
        dev.enqueue(
            q,
            vec![HostTensor {
                data: x.data.to_vec(),
                dims: vec![*n, 5],
            }],
        )
        .unwrap();
        xs.insert(gear, (x, *n));
    }
    for gear in 0..3 {
        let (x, n) = &xs[&gear];
        m.execute(&mut dev, stream).unwrap();
        let dims = read(&mut dev, m.dims_out.unwrap(), 4);
        assert_eq!(
            i32::from_le_bytes(dims.try_into().unwrap()),
            *n as i32,
            "cur_dynamic_dims"
        );
        let bytes = read(&mut dev, m.outputs[0], (n * 5 * 4) as usize);
        let y = Tensor::new(gearsim_compiler::ir::DataType::F32, vec![n * 5], bytes).unwrap();
        assert_close(
            &f32s(&y),
            &reference(x),
            1e-6,
            0.0,
            &format!("sink item {gear}"),
        );
    }
}
