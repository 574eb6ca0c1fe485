//! Fuzz targets of the `.om` readers: `OmFile::parse` with `desc()`, `ModelTasks::decode` and
//! `decode_kernels`, fed random bytes and damaged copies of a model that uses every section,
//! every task kind and a gear description. Damage is applied to the whole file (as found, and
//! with the size and checksums recomputed so the structural checks behind them are reached)
//! and to single sections rebuilt into a valid container, so every decoder meets it.
//!
//! Each case must return an error or a value that encodes back to exactly the bytes it came
//! from, never panic, and finish quickly. `PROPTEST_CASES=20000 cargo test -p gearsim-isa
//! --release fuzz_om` runs them longer.

use gearsim_isa::aicpu_op::AiCpuOp;
use gearsim_isa::gear::{MapIndexEngine, TableLayout};
use gearsim_isa::numeric::CastMode;
use gearsim_isa::om::{
    DynamicDesc, IoDesc, MemoryDesc, ModelDesc, OmError, OmFile, OmWriter, SectionKind, reseal,
};
use gearsim_isa::omtask::{
    Addr, GetNextSlot, KernelArg, KernelImage, ModelTasks, NamedTask, OmTask, Region,
    decode_kernels, encode_kernels,
};
use gearsim_isa::tensor::DataType;
use gearsim_isa::{Program, assemble};
use proptest::prelude::*;

use crate::mutate::{assert_same_bytes, fuzz_config, mutated, mutations, timed};

/// A description with two inputs, one output and three gears.
fn sample_desc() -> ModelDesc {
    let io = |name: &str, dims: Vec<i64>, max: Vec<i64>, bytes| IoDesc {
        name: name.into(),
        dtype: 1,
        format: "ND".into(),
        dims,
        max_dims: max,
        bytes,
    };
    ModelDesc {
        name: "sample".into(),
        soc_version: "ascend910".into(),
        inputs: vec![
            io("x", vec![-1, 4], vec![8, 4], 128),
            io("ascend_mbatch_shape_data", vec![1], vec![1], 4),
        ],
        outputs: vec![io("y", vec![-1, 4], vec![8, 4], 128)],
        dynamic: Some(DynamicDesc {
            mode: 1,
            gears: vec![vec![1], vec![4], vec![8]],
            shape_order: vec!["x".into()],
            getnext_sink: false,
            table_layout: TableLayout::GearMajor.code(),
            mapindex_engine: MapIndexEngine::AiCore.code(),
            input_dims: vec![
                vec![vec![1, 4], vec![1]],
                vec![vec![4, 4], vec![1]],
                vec![vec![8, 4], vec![1]],
            ],
            output_dims: vec![vec![vec![1, 4]], vec![vec![4, 4]], vec![vec![8, 4]]],
            output_bytes: vec![vec![16], vec![64], vec![128]],
        }),
        memory: MemoryDesc {
            weight_bytes: 64,
            feature_map_bytes: 512,
            root_feature_map_bytes: 64,
            per_gear_feature_map: vec![128, 320, 512],
            input_bytes: 132,
            output_bytes: 128,
        },
        build_options: vec![("precision_mode".into(), "force_fp16".into())],
    }
}

/// One stream holding every task kind, in the shape the compiler writes them.
fn sample_tasks() -> ModelTasks {
    let fm = |o| Addr::new(Region::FeatureMap, o);
    let task = |name: &str, task| NamedTask {
        task,
        name: name.into(),
    };
    ModelTasks {
        streams: vec![
            vec![
                task(
                    "mapindex",
                    OmTask::MapIndex {
                        engine: MapIndexEngine::AiCore,
                        layout: TableLayout::GearMajor,
                        n: 1,
                        gears: 3,
                        x: Addr::new(Region::Input(1), 0),
                        table: Addr::new(Region::Weights, 0),
                        y: fm(0),
                    },
                ),
                task(
                    "case/LabelSwitch",
                    OmTask::LabelSwitch {
                        index: fm(0),
                        labels: vec![0, 1],
                    },
                ),
                task("case/LabelSet_0", OmTask::LabelSet { label: 0 }),
                task("case/StreamActive_0", OmTask::StreamActive { stream: None }),
                task(
                    "relu",
                    OmTask::AiCore {
                        kernel: 0,
                        block_dim: 2,
                        args: vec![
                            KernelArg {
                                addr: Addr::new(Region::Input(0), 0),
                                bytes: 128,
                            },
                            KernelArg {
                                addr: Addr::new(Region::Output(0), 0),
                                bytes: 128,
                            },
                        ],
                        l2: vec![],
                    },
                ),
                task(
                    "getnext",
                    OmTask::GetNext {
                        outputs: vec![GetNextSlot {
                            data: fm(64),
                            capacity: 128,
                            shape: fm(256),
                        }],
                    },
                ),
                task(
                    "dims",
                    OmTask::GetDynamicDims {
                        shape_info: vec![2, 1, -1],
                        shapes: vec![fm(256)],
                        out: fm(384),
                    },
                ),
                task(
                    "copy",
                    OmTask::Memcpy {
                        dst: fm(128),
                        src: fm(64),
                        size: 64,
                    },
                ),
                task(
                    "cast",
                    OmTask::AiCpu {
                        op: AiCpuOp::Cast {
                            from: DataType::F16,
                            to: DataType::BF16,
                            mode: CastMode::default(),
                        },
                        inputs: vec![KernelArg {
                            addr: fm(0),
                            bytes: 64,
                        }],
                        outputs: vec![KernelArg {
                            addr: fm(64),
                            bytes: 64,
                        }],
                    },
                ),
                task("record", OmTask::EventRecord { event: 0 }),
                task("wait", OmTask::StreamWaitEvent { event: 0 }),
                task("case/LabelGoto_0", OmTask::LabelGoto { label: 1 }),
                task(
                    "case/StreamActive_1",
                    OmTask::StreamActive { stream: Some(1) },
                ),
                task("case/LabelSet_1", OmTask::LabelSet { label: 1 }),
                task("end", OmTask::EndGraph),
            ],
            vec![],
        ],
        labels: 2,
        events: 1,
        feature_map_bytes: 512,
        dims_out: Some(fm(384)),
    }
}

/// A kernel image of a real (small) program.
fn sample_kernels() -> Vec<KernelImage> {
    let program = assemble(
        "    sreg x1, args\n    ld.gm.u64 x2, x1\nloop:\n    movi x3, 4\n    loop x3, loop\n    end\n",
        "relu.s",
    )
    .unwrap();
    vec![KernelImage {
        name: "Relu_f32_32".into(),
        tiling: vec![("tile".into(), 32), ("blocks".into(), 2)],
        code: program.encode().unwrap(),
    }]
}

fn sections() -> Vec<(SectionKind, Vec<u8>)> {
    vec![
        (SectionKind::Desc, sample_desc().encode()),
        (SectionKind::Weights, (0..64).collect()),
        (SectionKind::Kernels, encode_kernels(&sample_kernels())),
        (SectionKind::Tasks, sample_tasks().encode()),
        (SectionKind::Graph, b"onnx bytes".to_vec()),
    ]
}

fn build(sections: &[(SectionKind, Vec<u8>)]) -> Vec<u8> {
    let mut w = OmWriter::new();
    for (kind, bytes) in sections {
        w.section(*kind, bytes.clone());
    }
    w.finish()
}

/// The sample file.
fn sample_om() -> Vec<u8> {
    build(&sections())
}

/// Everything a reader does with a `.om`: the container, the description, the tasks and the
/// kernels, each checked to re-encode to the bytes it was decoded from.
fn read_everything(bytes: &[u8]) -> Result<(), OmError> {
    let file = OmFile::parse(bytes)?;
    let desc = file.desc()?;
    let desc_bytes = file.section(SectionKind::Desc).unwrap_or(&[]);
    assert_same_bytes(&desc.encode(), desc_bytes, "the description");
    let kernels = file.section(SectionKind::Kernels).unwrap_or(&[]);
    let images = check_kernels(kernels)?;
    let tasks = file.section(SectionKind::Tasks).unwrap_or(&[]);
    check_tasks(tasks, images.len() as u32)?;
    // The sections read back give a file that parses to the same sections (the checksums
    // are the writer's own).
    let present: Vec<(SectionKind, Vec<u8>)> = SectionKind::ALL
        .iter()
        .filter(|k| **k != SectionKind::Checksums)
        .filter_map(|k| file.section(*k).map(|b| (*k, b.to_vec())))
        .collect();
    let rebuilt = build(&present);
    let again = OmFile::parse(&rebuilt).unwrap();
    for (kind, bytes) in &present {
        assert_eq!(again.section(*kind), Some(bytes.as_slice()));
    }
    Ok(())
}

/// `decode_kernels`, checked to re-encode exactly; every program that decodes encodes back too.
fn check_kernels(bytes: &[u8]) -> Result<Vec<KernelImage>, OmError> {
    let images = decode_kernels(bytes)?;
    assert_same_bytes(&encode_kernels(&images), bytes, "the kernels section");
    for k in &images {
        if let Ok(p) = Program::decode(Some(k.name.clone()), &k.code) {
            assert_same_bytes(&p.encode().unwrap(), &k.code, "a kernel's code");
        }
    }
    Ok(images)
}

/// `ModelTasks::decode`, checked to re-encode exactly and to name only what exists.
fn check_tasks(bytes: &[u8], kernels: u32) -> Result<ModelTasks, OmError> {
    let tasks = ModelTasks::decode(bytes, kernels)?;
    assert_same_bytes(&tasks.encode(), bytes, "the tasks section");
    for t in tasks.streams.iter().flatten() {
        if let OmTask::AiCore { kernel, .. } = t.task {
            assert!(kernel < kernels);
        }
    }
    Ok(tasks)
}

#[test]
fn the_sample_reads_back() {
    read_everything(&sample_om()).unwrap();
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn random_bytes_are_rejected(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        timed("random .om bytes", || {
            let _ = read_everything(&bytes);
            let _ = ModelDesc::decode(&bytes);
            let _ = check_tasks(&bytes, 4);
            let _ = check_kernels(&bytes);
        });
    }

    #[test]
    fn random_bodies_behind_a_valid_header_are_rejected(
        body in proptest::collection::vec(any::<u8>(), 0..600),
        count in 0u32..8,
    ) {
        // A header that passes every check, so the section table and sections are what is
        // random.
        let mut bytes = sample_om()[..64].to_vec();
        bytes[16..20].copy_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&body);
        reseal(&mut bytes);
        timed("random .om body", || { let _ = read_everything(&bytes); });
    }

    #[test]
    fn damaged_files_are_rejected_or_read_consistently(
        damage in mutations(),
        reseal_after in any::<bool>(),
    ) {
        let mut bytes = mutated(&sample_om(), &damage);
        if reseal_after {
            reseal(&mut bytes);
        }
        timed("damaged .om", || { let _ = read_everything(&bytes); });
    }

    #[test]
    fn damaged_sections_are_rejected_or_read_consistently(
        which in 0usize..5,
        damage in mutations(),
    ) {
        let mut parts = sections();
        parts[which].1 = mutated(&parts[which].1, &damage);
        let bytes = build(&parts);
        timed("damaged .om section", || { let _ = read_everything(&bytes); });
    }

    #[test]
    fn damaged_descriptions_decode_to_what_they_encode(damage in mutations()) {
        let bytes = mutated(&sample_desc().encode(), &damage);
        timed("damaged description", || {
            if let Ok(desc) = ModelDesc::decode(&bytes) {
                assert_same_bytes(&desc.encode(), &bytes, "the description");
            }
        });
    }

    #[test]
    fn damaged_task_streams_decode_to_what_they_encode(
        damage in mutations(),
        kernels in 0u32..3,
    ) {
        let bytes = mutated(&sample_tasks().encode(), &damage);
        timed("damaged tasks", || { let _ = check_tasks(&bytes, kernels); });
    }

    #[test]
    fn damaged_kernel_sections_decode_to_what_they_encode(damage in mutations()) {
        let bytes = mutated(&encode_kernels(&sample_kernels()), &damage);
        timed("damaged kernels", || { let _ = check_kernels(&bytes); });
    }
}
