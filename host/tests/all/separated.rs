//! Whole networks on a separated chip (ascend910b2): the compiler splits each cube kernel that
//! needs vector work into a MIX kernel (its convolutions' bias fills and drains crossing
//! between the cube and vector cores through GM) and leaves a plain product to the cube core
//! and its FIXPIPE; the outputs are bit-identical to the coupled chip's.

use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_host::atc;
use gearsim_host::calibrate::nets::{DType, Net};
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

/// atc's defaults for `cfg`.
fn options(cfg: &ChipConfig) -> CompileOptions {
    CompileOptions {
        gear: Default::default(),
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        target: atc::target(cfg),
        fusion: Default::default(),
        precision: Default::default(),
    }
}

fn outputs_on(chip: &str, model: &[u8], input: &Tensor) -> (Vec<Tensor>, u64, usize) {
    let cfg = ChipConfig::preset(chip).unwrap();
    let opts = options(&cfg);
    let compiled = compile(model, "net.onnx", &opts).unwrap_or_else(|e| panic!("{chip}: {e}"));
    let mixes = compiled
        .emitted
        .kernels
        .iter()
        .filter(|k| k.mix.is_some())
        .count();
    let om = compiled.om_bytes().unwrap();
    let mut rt = Runtime::new(cfg, NullSink, RuntimeOptions::default()).unwrap();
    let m = rt.load(&om).unwrap();
    let r = rt
        .run(m, std::slice::from_ref(input))
        .unwrap_or_else(|e| panic!("{chip}: {e}"));
    (r.outputs, r.execute_ps, mixes)
}

#[test]
fn resnet18_on_ascend910b2_computes_the_bits_it_computes_on_ascend910() {
    let model = Net::ResNet18.onnx(1, DType::F32, 7);
    let data: Vec<u8> = (0..3 * 224 * 224)
        .flat_map(|i| (((i * 37 % 101) as f32) / 50.0 - 1.0).to_le_bytes())
        .collect();
    let x = Tensor::new(DataType::F32, vec![1, 3, 224, 224], data).unwrap();
    let (coupled, _, none) = outputs_on("ascend910", &model, &x);
    let (separated, time, mixes) = outputs_on("ascend910b2", &model, &x);
    assert_eq!(none, 0, "a coupled chip has no MIX kernels");
    // The 20 convolutions and the classifier are cube work with a vector drain (kernels of the
    // same code are stored once: 19 distinct).
    assert!(mixes >= 15, "{mixes} MIX kernels");
    assert!(time > 0);
    assert_eq!(coupled.len(), separated.len());
    for (a, b) in coupled.iter().zip(&separated) {
        assert_eq!(a.dims, b.dims);
        assert!(a.data == b.data, "outputs differ between the chips");
    }
}

/// A product whose result needs no vector work is the cube core's alone on a 910B: its FIXPIPE
/// converts each L0C group to fp16 and writes it row-major (`copy_l0c_to_gm`), no vector
/// instruction and no MIX kernel, with the bits the coupled 910's UB drain gives; a product
/// with a bias stays a MIX kernel (its AIV adds the bias).
#[test]
fn a_plain_product_leaves_l0c_through_the_fixpipe_on_a_910b() {
    use gearsim_isa::{Instruction, Pipe};
    let (m, n, k) = (100i64, 72i64, 48i64);
    let model = Net::Gemm {
        m: m as u32,
        n: n as u32,
        k: k as u32,
    }
    .onnx(1, DType::F16, 1);
    let f16s = |len: i64, seed: i64| -> Tensor {
        let data: Vec<u8> = (0..len)
            .flat_map(|i| {
                half::f16::from_f32(((i * 37 + seed) % 19) as f32 / 8.0 - 1.0).to_le_bytes()
            })
            .collect();
        Tensor::new(DataType::F16, vec![len], data).unwrap()
    };
    let shaped = |t: Tensor, dims: Vec<i64>| Tensor::new(t.dtype, dims, t.data.to_vec()).unwrap();
    let inputs = [
        shaped(f16s(m * k, 3), vec![m, k]),
        shaped(f16s(k * n, 5), vec![k, n]),
    ];
    let run = |chip: &str, model: &[u8], inputs: &[Tensor]| {
        let cfg = ChipConfig::preset(chip).unwrap();
        let c = compile(model, "net.onnx", &options(&cfg)).unwrap();
        let kernels = c.emitted.kernels.clone();
        let mut rt = Runtime::new(cfg, NullSink, RuntimeOptions::default()).unwrap();
        let h = rt.load(&c.om_bytes().unwrap()).unwrap();
        (rt.run(h, inputs).unwrap().outputs, kernels)
    };
    let (coupled, _) = run("ascend910", &model, &inputs);
    let (separated, kernels) = run("ascend910b2", &model, &inputs);
    assert_eq!(kernels.len(), 1);
    let p = &kernels[0];
    assert!(p.mix.is_none(), "a plain product is not a MIX kernel");
    assert!(
        p.program
            .instrs
            .iter()
            .any(|i| matches!(i, Instruction::CopyL0cToGm(_))),
        "the FIXPIPE writes the result"
    );
    assert!(
        p.program.instrs.iter().all(|i| i.pipe() != Pipe::V),
        "no vector instruction"
    );
    assert!(
        coupled[0].data == separated[0].data,
        "the chips' bits differ"
    );
    // With a bias the product needs its AIV.
    let (_, kernels) = run(
        "ascend910b2",
        &Net::MixStartup.onnx(1, DType::F16, 1),
        &[
            shaped(f16s(64 * 64, 1), vec![64, 64]),
            shaped(f16s(64 * 64, 2), vec![64, 64]),
        ],
    );
    assert_eq!(kernels.iter().filter(|k| k.mix.is_some()).count(), 1);
}
