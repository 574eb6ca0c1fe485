//! Whole networks on a separated chip (ascend910b2): the compiler splits each cube kernel into
//! a MIX kernel (its convolutions' bias fills and drains crossing between the cube and vector
//! cores through GM), and the outputs are bit-identical to the coupled chip's.

use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_host::atc;
use gearsim_host::calibrate::nets::{DType, Net};
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

fn outputs_on(chip: &str, model: &[u8], input: &Tensor) -> (Vec<Tensor>, u64, usize) {
    let cfg = ChipConfig::preset(chip).unwrap();
    let opts = CompileOptions {
        gear: Default::default(),
        getnext_sink: false,
        table_layout: Default::default(),
        mapindex_engine: Default::default(),
        target: atc::target(&cfg),
        fusion: Default::default(),
        precision: Default::default(),
    };
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
