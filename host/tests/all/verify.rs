//! The verifier: a compiled model passes; broken task streams and kernels give every violation
//! with its task, kernel, block, pc and buffer.

use gearsim_compiler::ir::DataType;
use gearsim_host::verify::{ModelView, Report, verify};
use gearsim_isa::om::{IoDesc, ModelDesc};
use gearsim_isa::omtask::{Addr, KernelArg, ModelTasks, NamedTask, OmTask, Region};
use gearsim_isa::{Program, assemble};
use gearsim_sim::ChipConfig;

fn cfg() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

fn io(name: &str, bytes: u64) -> IoDesc {
    IoDesc {
        name: name.into(),
        dtype: DataType::F32.onnx_code() as u32,
        format: "ND".into(),
        dims: vec![bytes as i64 / 4],
        max_dims: vec![bytes as i64 / 4],
        bytes,
    }
}

fn desc() -> ModelDesc {
    ModelDesc {
        name: "m".into(),
        soc_version: "ascend910".into(),
        inputs: vec![io("x", 4096)],
        outputs: vec![io("y", 4096)],
        ..Default::default()
    }
}

fn task(task: OmTask, name: &str) -> NamedTask {
    NamedTask {
        task,
        name: name.into(),
    }
}

fn arg(region: Region, offset: u64, bytes: u64) -> KernelArg {
    KernelArg {
        addr: Addr::new(region, offset),
        bytes,
    }
}

fn run(kernel: &str, args: Vec<KernelArg>, block_dim: u32, extra: Vec<NamedTask>) -> Report {
    let program: Program = assemble(kernel, "k.s").unwrap();
    let mut stream = vec![task(
        OmTask::AiCore {
            kernel: 0,
            block_dim,
            args,
            l2: vec![],
        },
        "node",
    )];
    stream.extend(extra);
    stream.push(task(OmTask::EndGraph, "EndGraph"));
    let tasks = ModelTasks {
        streams: vec![stream],
        labels: 2,
        events: 0,
        feature_map_bytes: 8192,
        dims_out: None,
    };
    let d = desc();
    verify(
        &ModelView {
            desc: &d,
            tasks: &tasks,
            kernels: &[program],
            kernel_flags: &[],
            weight_bytes: 0,
        },
        &cfg(),
    )
}

/// Copies 4 KiB from argument 0 to argument 1 through UB, with a flag handshake.
const COPY: &str = "
.kernel copy
    sreg      x1, args
    ld.gm.u64 x2, x1
    ld.gm.u64 x3, x1, off=8
    movi      x4, 0
    copy_gm_to_ub x4, x2, 1, 128
    set_flag  MTE2, MTE3, 0
    wait_flag MTE2, MTE3, 0
    copy_ub_to_gm x3, x4, 1, 128
    end
";

#[test]
fn a_correct_kernel_passes() {
    let r = run(
        COPY,
        vec![
            arg(Region::Input(0), 0, 4096),
            arg(Region::Output(0), 0, 4096),
        ],
        4,
        Vec::new(),
    );
    assert!(r.is_ok(), "{r}");
    assert_eq!((r.launches, r.blocks), (1, 4));
}

#[test]
fn a_buffer_smaller_than_the_kernel_reads_is_named() {
    let r = run(
        COPY,
        vec![
            arg(Region::FeatureMap, 0, 1000),
            arg(Region::Output(0), 0, 4096),
        ],
        1,
        Vec::new(),
    );
    let v = &r.violations;
    assert_eq!(v.len(), 1, "{r}");
    assert!(
        v[0].at.contains("kernel `copy`") && v[0].at.contains("pc 4"),
        "{r}"
    );
    assert!(
        v[0].message
            .contains("argument 0, whose buffer has 1000 bytes"),
        "{r}"
    );
}

#[test]
fn every_violation_of_a_kernel_is_reported() {
    // UB past its end, a wait nothing set, a flag left set, an unaligned UB address.
    let k = "
.kernel broken
    sreg      x1, args
    ld.gm.u64 x2, x1
    movi      x4, 261120
    copy_gm_to_ub x4, x2, 1, 128
    wait_flag V, MTE3, 1
    set_flag  MTE2, V, 2
    movi      x5, 16
    copy_gm_to_ub x5, x2, 1, 1
    end
";
    let r = run(k, vec![arg(Region::Input(0), 0, 4096)], 1, Vec::new());
    let text = r.to_string();
    assert_eq!(r.violations.len(), 4, "{text}");
    assert!(
        text.contains("pc 3") && text.contains("past its 262144 bytes"),
        "{text}"
    );
    assert!(
        text.contains("pc 4") && text.contains("wait_flag on a flag nothing has set"),
        "{text}"
    );
    assert!(text.contains("flags left set at end: MTE2->V #2"), "{text}");
    assert!(
        text.contains("pc 7") && text.contains("not 32-byte aligned"),
        "{text}"
    );
}

#[test]
fn stream_problems_are_reported_with_the_task() {
    let extra = vec![
        task(OmTask::LabelGoto { label: 1 }, "goto"),
        task(
            OmTask::Memcpy {
                dst: Addr::new(Region::Output(0), 4000),
                src: Addr::new(Region::Input(0), 0),
                size: 200,
            },
            "copy",
        ),
    ];
    let r = run(
        COPY,
        vec![
            arg(Region::Input(0), 0, 4096),
            arg(Region::Output(0), 0, 4096),
        ],
        1,
        extra,
    );
    let text = r.to_string();
    assert_eq!(r.violations.len(), 2, "{text}");
    assert!(
        text.contains("task 1 (`goto`)") && text.contains("label 1 is never set"),
        "{text}"
    );
    assert!(
        text.contains("task 2 (`copy`)")
            && text.contains("runs past the end of its region (4096 bytes)"),
        "{text}"
    );
}
