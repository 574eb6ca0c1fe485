//! L2 control (atc's `--buffer_optimize=l2_optimize`) end to end: launches carry keep and drop
//! sections inside the feature-map region, outputs are bit-identical to a compile without
//! them, and a memory-bound network writes less to device memory and runs no slower.

use gearsim_compiler::fusion::FusionSwitches;
use gearsim_compiler::memory::BufferOptimize;
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, compile};
use gearsim_compiler::precision::PrecisionMode;
use gearsim_host::calibrate::nets::{DType, Net};
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_isa::omtask::{OmTask, Region};
use gearsim_isa::task::{L2Action, MAX_L2_SECTIONS};
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

use super::device_run::{cnn_input, cnn_options, run_image_net_timing_only};

fn with(opts: &CompileOptions, b: BufferOptimize) -> CompileOptions {
    let mut o = opts.clone();
    o.target.buffer_optimize = b;
    o
}

#[test]
fn l2_control_changes_no_value_and_stays_in_the_feature_maps() {
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let base = cnn_options(&cfg, FusionSwitches::all_on(), PrecisionMode::default());
    let mut outputs = Vec::new();
    for b in [BufferOptimize::L2Optimize, BufferOptimize::OffOptimize] {
        let c = compile(gearsim_host::demo::CNN, "cnn.onnx", &with(&base, b)).unwrap();
        let (mut keeps, mut drops) = (0, 0);
        for t in c.emitted.tasks.streams.iter().flatten() {
            if let OmTask::AiCore { l2, .. } = &t.task {
                assert!(l2.len() <= MAX_L2_SECTIONS as usize, "{}", t.name);
                for s in l2 {
                    assert_eq!(s.addr.region, Region::FeatureMap, "{}", t.name);
                    match s.action {
                        L2Action::Keep => keeps += 1,
                        L2Action::Drop => drops += 1,
                    }
                }
            }
        }
        if b == BufferOptimize::L2Optimize {
            assert!(keeps > 0 && drops >= keeps, "{keeps} keeps, {drops} drops");
        } else {
            assert_eq!((keeps, drops), (0, 0));
        }
        let mut rt = Runtime::new(cfg.clone(), NullSink, RuntimeOptions::default()).unwrap();
        let m = rt.load(&c.om_bytes().unwrap()).unwrap();
        outputs.push(rt.run(m, &[cnn_input()]).unwrap().outputs);
    }
    assert_eq!(outputs[0].len(), outputs[1].len());
    for (a, b) in outputs[0].iter().zip(&outputs[1]) {
        assert!(a.dims == b.dims && a.data == b.data, "outputs differ");
    }
}

#[test]
fn kept_and_dropped_feature_maps_save_device_memory_traffic() {
    // ResNet-18 at batch 4 on the 310P: its 56x56 feature maps (1.6 MB) fit the kept half of
    // the 16 MB L2, so they pass from producer to reader without a write to DDR.
    let cfg = ChipConfig::preset("ascend310p").unwrap();
    let onnx = Net::ResNet18.onnx(4, DType::F16, 3);
    let mut opts = cnn_options(&cfg, FusionSwitches::all_on(), PrecisionMode::default());
    opts.gear = GearOptions::default();
    let run = |b| {
        let r = run_image_net_timing_only(&cfg, &onnx, &with(&opts, b), 4);
        let written: u64 = r.kernels.iter().map(|k| k.traffic.hbm_written).sum();
        (r.execute_ps, written)
    };
    let (on_ps, on_written) = run(BufferOptimize::L2Optimize);
    let (off_ps, off_written) = run(BufferOptimize::OffOptimize);
    assert!(
        on_written * 2 < off_written,
        "written to DDR: {on_written} B with L2 control, {off_written} B without"
    );
    assert!(
        on_ps <= off_ps,
        "{on_ps} ps with L2 control, {off_ps} ps without"
    );
}
