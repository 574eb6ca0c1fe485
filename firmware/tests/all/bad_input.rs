//! Bad input is a typed error naming the stream, task index and field, never a panic: unknown
//! task kinds, labels out of range, limits of the preset, kernel pointers outside device memory.

use gearsim_firmware::DeviceError;
use gearsim_isa::task::*;
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

use crate::support::*;

#[test]
fn an_unknown_task_kind_names_stream_task_and_field() {
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    let buf = dev.alloc(64).unwrap();
    dev.submit(
        s,
        Task::Memset(Memset {
            dst: buf.0,
            size: 64,
            value: 1,
        }),
        None,
    )
    .unwrap();
    let mut desc = Task::LabelSet(LabelSet { label: 0 }).encode(0);
    desc.kind.set(999);
    dev.submit_descriptor(s, desc, None).unwrap();
    let e = dev.synchronize(s).unwrap_err();
    assert!(
        matches!(
            e,
            DeviceError::BadTask {
                kind: "descriptor",
                field: "kind",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "stream 0 task 1: descriptor: field `kind`: task 1: unknown task kind 999"
    );
    // A field holding no enum value.
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    let mut desc = Task::Memcpy(Memcpy {
        kind: MemcpyKind::HostToDevice,
        dst: 0,
        src: 0,
        size: 0,
    })
    .encode(0);
    desc.payload[0] = 9;
    dev.submit_descriptor(s, desc, None).unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert_eq!(
        e,
        "stream 0 task 0: Memcpy: field `kind`: task 0 (Memcpy): field `kind` = 9 is not valid"
    );
}

#[test]
fn labels_out_of_range_or_on_other_streams_are_errors() {
    let mut dev = device("ascend910", NullSink);
    let l = dev.create_label().unwrap();
    // A label id that was never created, at load time.
    let e = dev
        .load_model(vec![vec![(Task::LabelSet(LabelSet { label: 7 }), None)]])
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "stream 0 task 0: LabelSet: field `label`: label 7 was never created (1 labels exist)"
    );
    // A goto to a label set on another stream, at run time.
    let m = dev.model_count();
    let model = dev
        .load_model(vec![
            vec![
                (Task::LabelGoto(LabelGoto { label: l.0 }), None),
                (Task::ModelEndGraph(ModelEndGraph { model: m }), None),
            ],
            vec![(Task::LabelSet(LabelSet { label: l.0 }), None)],
        ])
        .unwrap();
    let s = dev.create_stream().unwrap();
    dev.submit(s, Task::ModelExecute(ModelExecute { model: model.0 }), None)
        .unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert!(
        e.contains(
            "LabelGoto: field `label`: label 0 is set on stream 2; a jump stays within its stream 1"
        ),
        "{e}"
    );
    // A switch index pointer outside device memory.
    let mut dev = device("ascend910", NullSink);
    let l = dev.create_label().unwrap();
    let list = upload(&mut dev, &l.0.to_le_bytes());
    let model = dev
        .load_model(vec![vec![
            (
                Task::LabelSwitchByIndex(LabelSwitchByIndex {
                    index_ptr: 1 << 40,
                    max: 1,
                    label_list: list.0,
                }),
                None,
            ),
            (Task::LabelSet(LabelSet { label: l.0 }), None),
        ]])
        .unwrap();
    let s = dev.create_stream().unwrap();
    dev.submit(s, Task::ModelExecute(ModelExecute { model: model.0 }), None)
        .unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert!(e.contains("LabelSwitchByIndex: field `index_ptr`: device range [0x10000000000, +4) is outside device memory"), "{e}");
}

#[test]
fn preset_limits_are_enforced() {
    let mut cfg = ChipConfig::preset("ascend910").unwrap();
    cfg.scheduler.max_streams = 2;
    cfg.scheduler.max_events = 1;
    cfg.scheduler.max_labels = 1;
    let mut dev = gearsim_firmware::Device::new(cfg, NullSink);
    dev.create_stream().unwrap();
    dev.create_stream().unwrap();
    assert_eq!(
        dev.create_stream().unwrap_err().to_string(),
        "streams: limit of 2 reached (ascend910 preset, `scheduler.max_streams`)"
    );
    dev.create_event().unwrap();
    assert!(
        dev.create_event()
            .unwrap_err()
            .to_string()
            .contains("`scheduler.max_events`")
    );
    dev.create_label().unwrap();
    assert!(
        dev.create_label()
            .unwrap_err()
            .to_string()
            .contains("`scheduler.max_labels`")
    );
    // An event id that was never created.
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    dev.submit(s, Task::EventRecord(EventRecord { event: 3 }), None)
        .unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert_eq!(
        e,
        "stream 0 task 0: EventRecord: field `event`: event 3 was never created"
    );
}

#[test]
fn kernel_pointers_must_point_at_kernel_images() {
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    dev.submit(
        s,
        Task::AiCoreKernel(AiCoreKernel {
            kernel: 1 << 40,
            args: 0,
            block_dim: 1,
            l2ctrl: 0,
            l2_sections: 0,
        }),
        None,
    )
    .unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert_eq!(
        e,
        "stream 0 task 0: AiCoreKernel: field `kernel`: kernel pointer 0x10000000000 is outside device memory (34359738368 bytes)"
    );
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    let junk = upload(&mut dev, &[0xab; 64]);
    dev.submit(
        s,
        Task::AiCoreKernel(AiCoreKernel {
            kernel: junk.0,
            args: 0,
            block_dim: 1,
            l2ctrl: 0,
            l2_sections: 0,
        }),
        None,
    )
    .unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert!(
        e.ends_with(&format!("no kernel image at {:#x} (bad magic)", junk.0)),
        "{e}"
    );
    // A valid image whose words do not decode.
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    let mut image = gearsim_firmware::KERNEL_MAGIC.to_vec();
    image.extend_from_slice(&1u32.to_le_bytes());
    image.extend_from_slice(&0u32.to_le_bytes());
    image.extend_from_slice(&[0xee; 16]);
    let p = upload(&mut dev, &image);
    dev.submit(
        s,
        Task::AiCoreKernel(AiCoreKernel {
            kernel: p.0,
            args: 0,
            block_dim: 1,
            l2ctrl: 0,
            l2_sections: 0,
        }),
        None,
    )
    .unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert!(e.contains("unknown opcode 0xee"), "{e}");
    // block_dim 0.
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    let k = dev
        .load_kernel(gearsim_isa::assemble("end", "e.s").unwrap())
        .unwrap();
    dev.submit(
        s,
        Task::AiCoreKernel(AiCoreKernel {
            kernel: k.addr.0,
            args: 0,
            block_dim: 0,
            l2ctrl: 0,
            l2_sections: 0,
        }),
        None,
    )
    .unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert_eq!(
        e,
        "stream 0 task 0: AiCoreKernel: field `block_dim`: 0 is outside [1, 65535]"
    );
}

#[test]
fn l2_control_sections_are_checked_before_any_applies() {
    use gearsim_isa::task::{L2Action, L2Section};
    let launch = |dev: &mut gearsim_firmware::Device<NullSink>, l2ctrl: u64, n: u32| {
        let s = dev.create_stream().unwrap();
        let k = dev
            .load_kernel(gearsim_isa::assemble("end", "e.s").unwrap())
            .unwrap();
        dev.submit(
            s,
            Task::AiCoreKernel(AiCoreKernel {
                kernel: k.addr.0,
                args: 0,
                block_dim: 1,
                l2ctrl,
                l2_sections: n,
            }),
            None,
        )
        .unwrap();
        dev.synchronize(s)
    };
    let section = |addr, bytes, action| {
        L2Section {
            addr,
            bytes,
            action,
        }
        .encode()
    };
    // Nine sections: more than rtL2Ctrl_t's eight.
    let mut dev = device("ascend310p", NullSink);
    let e = launch(&mut dev, 0, 9).unwrap_err().to_string();
    assert_eq!(
        e,
        "stream 0 task 0: AiCoreKernel: field `l2_sections`: 9 is outside [0, 8]"
    );
    // An unknown action.
    let mut dev = device("ascend310p", NullSink);
    let mut raw = section(0, 512, L2Action::Keep);
    raw[16] = 7;
    let p = upload(&mut dev, &raw);
    let e = launch(&mut dev, p.0, 1).unwrap_err().to_string();
    assert!(
        e.ends_with("L2 control section 0: action 7 is not 1 (keep) or 2 (drop)"),
        "{e}"
    );
    // A range outside device memory.
    let mut dev = device("ascend310p", NullSink);
    let p = upload(&mut dev, &section(1 << 40, 512, L2Action::Drop));
    let e = launch(&mut dev, p.0, 1).unwrap_err().to_string();
    assert!(
        e.contains("field `l2ctrl`: device range [0x10000000000, +512)"),
        "{e}"
    );
    // A valid keep and drop run.
    let mut dev = device("ascend310p", NullSink);
    let mut both = section(0, 4096, L2Action::Keep).to_vec();
    both.extend_from_slice(&section(0, 4096, L2Action::Drop));
    let p = upload(&mut dev, &both);
    launch(&mut dev, p.0, 2).unwrap();
}

/// An AI CPU operator's buffers are checked against device memory before anything is read or
/// allocated for them: a size the memory cannot hold is a parameter error naming the
/// operator, not an allocation of that size; sizes that disagree with the operator's dims are
/// refused too.
#[test]
fn an_ai_cpu_operator_with_impossible_buffers_is_a_parameter_error() {
    use gearsim_firmware::kernels::{AiCpuKernelId, AiCpuOpArgs};
    use gearsim_isa::aicpu_op::{AiCpuOp, ElementwiseOp, Operand};
    use gearsim_isa::tensor::DataType;
    let operand = |dims: &[i64]| Operand {
        dtype: DataType::U32,
        dims: dims.to_vec(),
    };
    let huge = 1i64 << 45;
    let cases = [
        // Consistent with its dims, but far beyond device memory.
        (
            AiCpuOp::Elementwise {
                op: ElementwiseOp::Add,
                inputs: vec![operand(&[huge]), operand(&[huge])],
                output: operand(&[huge]),
            },
            (huge * 4) as u64,
            "outside device memory",
        ),
        // Dims whose element count overflows do not wrap to the buffers' size.
        (
            AiCpuOp::Elementwise {
                op: ElementwiseOp::Add,
                inputs: vec![operand(&[1 << 62, 8]), operand(&[1])],
                output: operand(&[1 << 62, 8]),
            },
            0,
            "expected",
        ),
    ];
    for (op, bytes, want) in cases {
        // A fresh device each time: an error stops the one it happens on.
        let mut dev = device("ascend910", NullSink);
        let s = dev.create_stream().unwrap();
        let buf = dev.alloc(64).unwrap();
        let block = AiCpuOpArgs {
            op,
            inputs: vec![(buf.0, bytes), (buf.0, if bytes == 0 { 4 } else { bytes })],
            outputs: vec![(buf.0, bytes)],
        }
        .encode();
        let args = upload(&mut dev, &block);
        dev.submit(s, AiCpuKernelId::Op.task(args.0, block.len() as u32), None)
            .unwrap();
        let e = dev.synchronize(s).unwrap_err();
        assert!(
            matches!(&e, DeviceError::KernelParam { kernel: "Add", message, .. } if message.contains(want)),
            "{e:?}"
        );
    }
}
