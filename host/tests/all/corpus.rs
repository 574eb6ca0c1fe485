//! The committed corpus of bad input (`tests/corpus/`, described in its `README.md`): every
//! file goes through its reader and through the `gearsim` command that reads it, which must
//! exit 1 (not 2, not a signal) within a deadline, with an error on stderr naming the file and
//! no panic text, and leave the output files that were there before byte-identical (and no
//! stray files) — `compile` an existing `NAME.om`, `run` an existing `output_0.npy`, `kernel
//! asm` an existing binary. Files named `extreme_*` are valid but extreme and have their own
//! expected exit codes (below).
//!
//! The corpus is made by [`generate`] from the committed models, the example kernels and a
//! compile of `gear_dims.onnx`; `GEARSIM_BLESS=1 cargo test -p gearsim-host corpus` rewrites
//! it, and a test checks that the committed files are the ones the generator makes (the `.om`
//! files by name only, since they follow the compiler's output).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gearsim_compiler::ir::Tensor;
use gearsim_compiler::onnx::{import, proto};
use gearsim_compiler::pipeline::compile;
use gearsim_host::npy;
use gearsim_host::runtime::{Runtime, RuntimeOptions};
use gearsim_isa::Program;
use gearsim_isa::om::{ModelDesc, OmFile, OmWriter, SectionKind, reseal};
use gearsim_isa::omtask::{ModelTasks, NamedTask, OmTask, decode_kernels, encode_kernels};
use gearsim_sim::ChipConfig;
use gearsim_traces::{
    Lane, LaneKind, NullSink, Record, StrId, TraceFile, TraceSink, TraceWriter, summary,
};
use prost::Message as _;

use crate::fuzz_onnx::{SEEDS, length_prefixes};
use crate::onnx_build::{f32_init, model, node};

/// The corpus directory.
fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus")
}

/// The kinds of file, by directory: each has its reader and its command.
const KINDS: [&str; 5] = ["onnx", "om", "gtrace", "npy", "s"];

/// What a command must do with an `extreme_*` file (the others must all exit 1).
fn extreme_exit(file: &str, command: &str) -> i32 {
    match (file, command) {
        // Valid models with many gears: described and run like any other.
        ("extreme_100_gears.om", _) => 0,
        // Valid traces with extreme times, values and many lanes: summarised.
        (f, "trace summary") if f.ends_with(".gtrace") => 0,
        // An empty source and a long but valid one assemble.
        ("extreme_empty.s" | "extreme_long_sum.s" | "extreme_many_instructions.s", _) => 0,
        // A stride past the padded input is the single window a stride equal to it gives:
        // compiled as that.
        ("extreme_huge_stride.onnx", _) => 0,
        // Everything else is rejected: an array the model's input cannot take, a model whose
        // shapes or window attributes are beyond what the compiler plans.
        _ => 1,
    }
}

/// `.om` files whose description is intact: `gearsim info` describes them; loading fails.
fn description_intact(file: &str) -> bool {
    ["bad_tasks_", "bad_kernels_", "bad_load_"]
        .iter()
        .any(|p| file.starts_with(p))
        || file.starts_with("extreme_")
}

// ---------------------------------------------------------------------------------------------
// The generator.

fn seed(name: &str) -> &'static [u8] {
    SEEDS.iter().find(|s| s.name == name).unwrap().bytes()
}

/// The sink-free gear_dims model, compiled with its seed options and optionally other gears.
fn gear_dims_om(gears: Option<&str>) -> Vec<u8> {
    let s = SEEDS.iter().find(|s| s.name == "gear_dims.onnx").unwrap();
    let mut o = s.options();
    if let Some(g) = gears {
        o.gear.dynamic_dims = Some(g.to_string());
    }
    compile(s.bytes(), s.name, &o).unwrap().om_bytes().unwrap()
}

/// The sections of a `.om`, edited by `edit`, in a valid container again.
fn rebuilt(om: &[u8], edit: impl FnOnce(&mut Vec<(SectionKind, Vec<u8>)>)) -> Vec<u8> {
    let file = OmFile::parse(om).unwrap();
    let mut parts: Vec<(SectionKind, Vec<u8>)> = SectionKind::ALL
        .iter()
        .filter_map(|k| file.section(*k).map(|b| (*k, b.to_vec())))
        .collect();
    edit(&mut parts);
    let mut w = OmWriter::new();
    for (kind, bytes) in parts {
        w.section(kind, bytes);
    }
    w.finish()
}

fn section(parts: &mut [(SectionKind, Vec<u8>)], kind: SectionKind) -> &mut Vec<u8> {
    &mut parts.iter_mut().find(|(k, _)| *k == kind).unwrap().1
}

fn with_desc(om: &[u8], edit: impl FnOnce(&mut ModelDesc)) -> Vec<u8> {
    rebuilt(om, |parts| {
        let bytes = section(parts, SectionKind::Desc);
        let mut d = ModelDesc::decode(bytes).unwrap();
        edit(&mut d);
        *bytes = d.encode();
    })
}

fn with_tasks(om: &[u8], edit: impl FnOnce(&mut ModelTasks)) -> Vec<u8> {
    rebuilt(om, |parts| {
        let bytes = section(parts, SectionKind::Tasks);
        let mut t = ModelTasks::decode(bytes, u32::MAX).unwrap();
        edit(&mut t);
        *bytes = t.encode();
    })
}

fn with_section_bytes(om: &[u8], kind: SectionKind, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    rebuilt(om, |parts| edit(section(parts, kind)))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn onnx_files() -> Vec<(String, Vec<u8>)> {
    let base = seed("tiny_add.onnx").to_vec();
    let decoded = || proto::ModelProto::decode(base.as_slice()).unwrap();
    let encode = |m: &proto::ModelProto| m.encode_to_vec();
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| out.push((format!("onnx/{name}"), bytes));
    add("bad_empty.onnx", Vec::new());
    add("bad_text.onnx", b"this is not an ONNX model\n".to_vec());
    add(
        "bad_npy_bytes.onnx",
        npy::encode(&Tensor::from_f32s(vec![2], &[1.0, 2.0])),
    );
    add("bad_truncated_half.onnx", base[..base.len() / 2].to_vec());
    add(
        "bad_truncated_last_byte.onnx",
        base[..base.len() - 1].to_vec(),
    );
    let mut b = base.clone();
    b[0] |= 0x07; // the first tag's wire type becomes 7, which does not exist
    add("bad_bit_flipped_wire_type.onnx", b);
    for (name, which, value) in [
        ("bad_huge_length.onnx", 0usize, 1u64 << 62),
        (
            "bad_huge_nested_length.onnx",
            usize::MAX,
            u64::from(u32::MAX),
        ),
    ] {
        let prefixes = length_prefixes(&base);
        let (at, n) = prefixes[which.min(prefixes.len() - 1)];
        let mut b = base.clone();
        let mut v = value;
        let mut varint = Vec::new();
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                varint.push(byte);
                break;
            }
            varint.push(byte | 0x80);
        }
        b.splice(at..at + n, varint);
        add(name, b);
    }
    let mut m = decoded();
    m.opset_import[0].version = 99;
    add("bad_opset_99.onnx", encode(&m));
    let mut m = decoded();
    let g = m.graph.as_mut().unwrap();
    g.node[0].input[1] = "nothing_makes_this".into();
    add("bad_unknown_value.onnx", encode(&m));
    let mut m = decoded();
    let g = m.graph.as_mut().unwrap();
    if let Some(proto::type_proto::Value::TensorType(t)) =
        g.input[0].r#type.as_mut().and_then(|t| t.value.as_mut())
    {
        t.shape.as_mut().unwrap().dim[0].value =
            Some(proto::tensor_shape_proto::dimension::Value::DimValue(-5));
    }
    add("bad_negative_dim.onnx", encode(&m));
    let mut short = f32_init("c", &[1000], &[1.0]);
    short.dims = vec![1000];
    let m = model(
        17,
        vec![node("Add", "add", &["a", "c"], &["y"])],
        &[("a", &[Some(1000)])],
        &[("y", &[Some(1000)])],
        vec![short],
    );
    add("bad_raw_data_short.onnx", m.encode_to_vec());
    let big = Some(1i64 << 31);
    let m = model(
        17,
        vec![node("Relu", "relu", &["x"], &["y"])],
        &[("x", &[big, big])],
        &[("y", &[big, big])],
        Vec::new(),
    );
    add("extreme_huge_input_dims.onnx", m.encode_to_vec());
    let m = model(
        17,
        vec![node("Relu", "relu", &["x"], &["y"])],
        &[("x", &[Some(0), Some(1 << 62)])],
        &[("y", &[Some(0), Some(1 << 62)])],
        Vec::new(),
    );
    add("extreme_empty_but_huge_dims.onnx", m.encode_to_vec());
    let mut conv = node("Conv", "conv", &["x", "w"], &["y"]);
    conv.attribute.push(proto::AttributeProto {
        name: "strides".into(),
        ints: vec![1, 1 << 31],
        r#type: proto::AttributeType::Ints as i32,
        ..Default::default()
    });
    let m = model(
        17,
        vec![conv],
        &[("x", &[Some(1), Some(16), Some(8), Some(8)])],
        &[("y", &[Some(1), Some(16), Some(8), Some(1)])],
        vec![f32_init("w", &[16, 16, 1, 1], &[0.5; 256])],
    );
    add("extreme_huge_stride.onnx", m.encode_to_vec());
    // A Resize to two billion rows: refused before any sampling table is built.
    let sizes = proto::TensorProto {
        name: "sizes".into(),
        dims: vec![4],
        data_type: 7,
        raw_data: Some(
            [1i64, 1, 2_000_000_000, 4]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        ..Default::default()
    };
    let m = model(
        19,
        vec![node("Resize", "resize", &["x", "", "", "sizes"], &["y"])],
        &[("x", &[Some(1), Some(1), Some(2), Some(2)])],
        &[("y", &[None, None, None, None])],
        vec![sizes],
    );
    add("extreme_huge_resize.onnx", m.encode_to_vec());
    // Graph attributes nested far past the protobuf decoder's recursion limit.
    let mut g = proto::GraphProto::default();
    for _ in 0..200 {
        let mut n = node("If", "if", &[], &[]);
        n.attribute.push(proto::AttributeProto {
            name: "then_branch".into(),
            g: Some(g),
            r#type: proto::AttributeType::Graph as i32,
            ..Default::default()
        });
        g = proto::GraphProto {
            node: vec![n],
            ..Default::default()
        };
    }
    let mut m = decoded();
    m.graph.as_mut().unwrap().node.push(g.node.remove(0));
    add("extreme_deep_nesting.onnx", encode(&m));
    out
}

fn om_files() -> Vec<(String, Vec<u8>)> {
    let base = gear_dims_om(None);
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| out.push((format!("om/{name}"), bytes));
    add("bad_empty.om", Vec::new());
    add("bad_truncated_header.om", base[..40].to_vec());
    add("bad_truncated_body.om", base[..base.len() / 2].to_vec());
    let mut b = base.clone();
    b[..8].copy_from_slice(b"GEAROX\0\0");
    add("bad_wrong_magic.om", b);
    add("bad_onnx_bytes.om", seed("tiny_add.onnx").to_vec());
    let mut b = base.clone();
    b[8] = 2;
    reseal(&mut b);
    add("bad_version_2.om", b);
    let mut b = base.clone();
    let mid = b.len() / 2;
    b[mid] ^= 0x10;
    add("bad_bit_flipped_body.om", b);
    let mut b = base.clone();
    b[12] ^= 0x01;
    add("bad_bit_flipped_header.om", b);
    let mut b = base.clone();
    put_u32(&mut b, 16, u32::MAX);
    reseal(&mut b);
    add("bad_section_count_huge.om", b);
    let mut b = base.clone();
    put_u64(&mut b, 64 + 16, u64::MAX);
    reseal(&mut b);
    add("bad_section_past_end.om", b);
    add(
        "bad_desc_huge_string_length.om",
        with_section_bytes(&base, SectionKind::Desc, |d| put_u32(d, 0, u32::MAX)),
    );
    add(
        "bad_desc_dynamic_flag.om",
        with_section_bytes(&base, SectionKind::Desc, |d| {
            let mut plain = ModelDesc::decode(d).unwrap();
            let per_gear = plain.memory.per_gear_feature_map.len();
            plain.dynamic = None;
            // The flag is the u32 just before the memory totals (and the build options,
            // a count and its strings, after them).
            let mut bare = plain.clone();
            bare.build_options.clear();
            let options = plain.encode().len() - bare.encode().len();
            let at = plain.encode().len() - options - 4 - (44 + 8 * per_gear);
            put_u32(d, at, 7);
        }),
    );
    add(
        "bad_load_inconsistent_input_bytes.om",
        with_desc(&base, |d| d.inputs[0].bytes = 1 << 40),
    );
    add(
        "bad_load_unknown_shape_order.om",
        with_desc(&base, |d| {
            d.dynamic.as_mut().unwrap().shape_order[0] = "nothing".into();
        }),
    );
    add(
        "bad_load_short_gear_table.om",
        with_desc(&base, |d| {
            d.dynamic.as_mut().unwrap().output_dims.pop();
        }),
    );
    add(
        "bad_tasks_unknown_kind.om",
        with_section_bytes(&base, SectionKind::Tasks, |t| {
            let decoded = ModelTasks::decode(t, u32::MAX).unwrap();
            let dims_out = if decoded.dims_out.is_some() { 16 } else { 0 };
            let name = decoded.streams[0][0].name.len();
            put_u32(t, 4 + 4 + 8 + 4 + dims_out + 4 + 4 + 4 + name, 99);
        }),
    );
    add(
        "bad_tasks_backward_jump.om",
        with_tasks(&base, |t| {
            let s = &mut t.streams[0];
            let set = s
                .iter()
                .position(|x| matches!(x.task, OmTask::LabelSet { .. }))
                .unwrap();
            let OmTask::LabelSet { label } = s[set].task else {
                unreachable!()
            };
            s.insert(
                set + 1,
                NamedTask {
                    task: OmTask::LabelGoto { label },
                    name: "loop_forever".into(),
                },
            );
        }),
    );
    add(
        "bad_tasks_huge_offset.om",
        with_tasks(&base, |t| {
            for task in t.streams.iter_mut().flatten() {
                if let OmTask::AiCore { args, .. } = &mut task.task {
                    args[0].addr.offset = u64::MAX;
                    return;
                }
            }
        }),
    );
    add(
        "bad_tasks_mapindex_huge.om",
        with_tasks(&base, |t| {
            for task in t.streams.iter_mut().flatten() {
                if let OmTask::MapIndex { gears, .. } = &mut task.task {
                    *gears = u32::MAX;
                }
            }
        }),
    );
    add(
        "bad_tasks_label_out_of_range.om",
        with_section_bytes(&base, SectionKind::Tasks, |t| {
            put_u32(t, 0, 0); // zero labels: every label task names one past the end
        }),
    );
    add(
        "bad_kernels_bad_opcode.om",
        with_section_bytes(&base, SectionKind::Kernels, |k| {
            let mut images = decode_kernels(k).unwrap();
            images[0].code[0] = 0xff;
            *k = encode_kernels(&images);
        }),
    );
    add(
        "bad_kernels_huge_code_length.om",
        with_section_bytes(&base, SectionKind::Kernels, |k| {
            let images = decode_kernels(k).unwrap();
            let tiling: usize = images[0].tiling.iter().map(|(n, _)| 4 + n.len() + 8).sum();
            put_u32(k, 4 + 4 + images[0].name.len() + 4 + tiling, 0x7fff_ffff);
        }),
    );
    add(
        "bad_kernels_spin_forever.om",
        with_section_bytes(&base, SectionKind::Kernels, |k| {
            let mut images = decode_kernels(k).unwrap();
            let spin = gearsim_isa::assemble("top:\n    jmp top\n", "spin.s").unwrap();
            for image in &mut images {
                image.code = spin.encode().unwrap();
            }
            *k = encode_kernels(&images);
        }),
    );
    let gears: Vec<String> = (1..=100).map(|g| format!("{g},{g},1,1")).collect();
    let mut hundred = gears;
    hundred[0] = "20,20,1,1".into();
    hundred[19] = "1,1,1,1".into();
    add(
        "extreme_100_gears.om",
        gear_dims_om(Some(&hundred.join(";"))),
    );
    out
}

/// The trace the `.gtrace` files are made from: three lanes, metadata, every record kind.
fn sample_trace(extreme: bool) -> Vec<u8> {
    let mut w = TraceWriter::new(std::io::Cursor::new(Vec::new())).unwrap();
    let lanes = if extreme { 2000 } else { 3 };
    let ids: Vec<_> = (0..lanes)
        .map(|i| {
            w.lane(Lane {
                process: format!("core{} ✓", i % 40),
                thread: ["VECTOR", "CUBE", "MTE2"][i % 3].into(),
                kind: [LaneKind::Pipe, LaneKind::Memory, LaneKind::Pipe][i % 3],
            })
        })
        .collect();
    w.meta("chip", "corpus \"npu\"");
    let name = w.intern("vadd");
    let (t0, t1) = if extreme {
        (u64::MAX - 1_000, u64::MAX)
    } else {
        (1_000, 2_000)
    };
    for (i, lane) in ids.iter().enumerate() {
        w.record(Record::Span {
            lane: *lane,
            name,
            start: t0,
            end: t1,
            pc: i as u32,
            detail: StrId::EMPTY,
        });
    }
    w.record(Record::Counter {
        lane: ids[1],
        name,
        at: t1,
        value: if extreme { i64::MIN } else { 5 },
    });
    w.record(Record::Instant {
        lane: ids[0],
        name,
        at: 0,
        arg: u32::MAX,
        detail: StrId::EMPTY,
    });
    w.record(Record::Flow {
        name,
        id: u32::MAX,
        from_lane: ids[0],
        from_at: t0,
        to_lane: ids[2],
        to_at: t1,
    });
    w.finish().unwrap().into_inner()
}

/// Recomputes both checksums of a trace after an edit.
fn fix_trace_checksums(b: &mut [u8]) {
    let sum = gearsim_traces::format::checksum(&b[96..]);
    b[88..96].copy_from_slice(&sum.to_le_bytes());
    fix_trace_header_checksum(b);
}

fn fix_trace_header_checksum(b: &mut [u8]) {
    let header: &[u8; 96] = b[..96].try_into().unwrap();
    let sum = gearsim_traces::format::header_checksum(header);
    b[68..72].copy_from_slice(&sum.to_le_bytes());
}

fn gtrace_files() -> Vec<(String, Vec<u8>)> {
    let base = sample_trace(false);
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| out.push((format!("gtrace/{name}"), bytes));
    add("bad_empty.gtrace", Vec::new());
    add("bad_truncated_header.gtrace", base[..50].to_vec());
    add(
        "bad_truncated_records.gtrace",
        base[..base.len() - 10].to_vec(),
    );
    let mut b = base.clone();
    b[..8].copy_from_slice(b"GEARTRX\0");
    add("bad_wrong_magic.gtrace", b);
    add("bad_om_bytes.gtrace", gear_dims_om(None)[..2048].to_vec());
    let mut b = base.clone();
    b[8] = 2;
    fix_trace_header_checksum(&mut b);
    add("bad_version_2.gtrace", b);
    let mut b = base.clone();
    let mid = b.len() / 2;
    b[mid] ^= 0x04;
    add("bad_bit_flipped_body.gtrace", b);
    let mut b = base.clone();
    b[40] ^= 0x01;
    add("bad_bit_flipped_header.gtrace", b);
    let mut b = base.clone();
    put_u64(&mut b, 24, 1 << 60);
    fix_trace_checksums(&mut b);
    add("bad_huge_record_count.gtrace", b);
    let mut b = base.clone();
    let strings = u64::from_le_bytes(b[56..64].try_into().unwrap()) as usize;
    put_u32(&mut b, strings + 4, u32::MAX); // string 1's length (string 0 is empty)
    fix_trace_checksums(&mut b);
    add("bad_huge_string_length.gtrace", b);
    let mut b = base.clone();
    b[20] &= !1;
    fix_trace_header_checksum(&mut b);
    add("bad_unfinished.gtrace", b);
    let mut b = base.clone();
    put_u64(&mut b, 96 + 8, 5_000); // record 0 starts after it ends
    fix_trace_checksums(&mut b);
    add("bad_backwards_span.gtrace", b);
    let mut b = base.clone();
    b[98..100].copy_from_slice(&999u16.to_le_bytes());
    fix_trace_checksums(&mut b);
    add("bad_lane_out_of_range.gtrace", b);
    add("extreme_max_times_many_lanes.gtrace", sample_trace(true));
    out
}

fn npy_files() -> Vec<(String, Vec<u8>)> {
    let good = npy::encode(&Tensor::from_f32s(vec![2, 2], &[1.0, 2.0, 3.0, 4.0]));
    let header = |version: u8, dict: &str, data: &[u8]| {
        let mut b = npy::MAGIC.to_vec();
        let text = format!("{dict}\n");
        if version == 1 {
            b.extend_from_slice(&[1, 0]);
            b.extend_from_slice(&(text.len() as u16).to_le_bytes());
        } else {
            b.extend_from_slice(&[version, 0]);
            b.extend_from_slice(&(text.len() as u32).to_le_bytes());
        }
        b.extend_from_slice(text.as_bytes());
        b.extend_from_slice(data);
        b
    };
    let dict = |descr: &str, fortran: &str, shape: &str| {
        format!("{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}")
    };
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| out.push((format!("npy/{name}"), bytes));
    add("bad_empty.npy", Vec::new());
    add(
        "bad_wrong_magic.npy",
        b"PK\x03\x04 a zip, not an npy".to_vec(),
    );
    add("bad_truncated_magic.npy", good[..4].to_vec());
    add("bad_truncated_header.npy", good[..40].to_vec());
    add("bad_truncated_data.npy", good[..good.len() - 3].to_vec());
    let mut b = good.clone();
    b[6] = 9;
    add("bad_version_9.npy", b);
    let mut b = npy::MAGIC.to_vec();
    b.extend_from_slice(&[2, 0]);
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    b.extend_from_slice(b"{'descr': '<f4'");
    add("bad_huge_header_length.npy", b);
    let f4 = "'<f4'";
    add(
        "bad_huge_shape.npy",
        header(
            1,
            &dict(f4, "False", "(4611686018427387904, 4611686018427387904)"),
            &[],
        ),
    );
    add(
        "bad_shape_claims_more_data.npy",
        header(1, &dict(f4, "False", "(1000000000,)"), &[0; 4]),
    );
    add(
        "bad_negative_dim.npy",
        header(1, &dict(f4, "False", "(-3,)"), &[]),
    );
    add(
        "bad_big_endian.npy",
        header(1, &dict("'>f4'", "False", "(1,)"), &[0; 4]),
    );
    add(
        "bad_fortran_order.npy",
        header(1, &dict(f4, "True", "(1, 1)"), &[0; 4]),
    );
    add(
        "bad_unknown_dtype.npy",
        header(1, &dict("'<c16'", "False", "(1,)"), &[0; 16]),
    );
    let deep = format!("{}1,{}", "(".repeat(10_000), ")".repeat(10_000));
    add(
        "bad_deep_nesting.npy",
        header(2, &dict(f4, "False", &deep), &[0; 4]),
    );
    add("bad_not_a_dict.npy", header(1, "['descr', '<f4']", &[]));
    add(
        "bad_bool_value_2.npy",
        header(1, &dict("'|b1'", "False", "(2,)"), &[1, 2]),
    );
    let mut b = header(3, &dict(f4, "False", "(1,)"), &[0; 4]);
    let at = b.iter().position(|&c| c == b'<').unwrap();
    b[at] = 0xff; // not UTF-8, which a version 3.0 header must be
    add("bad_v3_header_not_utf8.npy", b);
    add(
        "extreme_empty_array.npy",
        npy::encode(&Tensor::from_f32s(vec![0], &[])),
    );
    add(
        "extreme_scalar.npy",
        npy::encode(&Tensor::from_f32s(vec![], &[7.0])),
    );
    out
}

fn asm_files() -> Vec<(String, Vec<u8>)> {
    let base = include_str!("../../examples/kernels/vadd_f16_db.s");
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut add = |name: &str, bytes: Vec<u8>| out.push((format!("s/{name}"), bytes));
    add("bad_not_utf8.s", vec![0xff, 0xfe, b'\n', 0x80, 0x81]);
    add("bad_om_bytes.s", gear_dims_om(None)[..1024].to_vec());
    let cut = base.find("ld.gm.u64 x3").unwrap() + "ld.gm.u64 x3".len();
    add("bad_truncated_mid_line.s", base.as_bytes()[..cut].to_vec());
    let mut b = base.as_bytes().to_vec();
    let at = base.find("vadd.f16").unwrap() + 3;
    b[at] ^= 0x02; // vadd -> vadf
    add("bad_bit_flipped_mnemonic.s", b);
    let deep = 20_000;
    add(
        "bad_deep_nesting.s",
        format!(
            "    movi x1, {}1{}\n    end\n",
            "(".repeat(deep),
            ")".repeat(deep)
        )
        .into_bytes(),
    );
    add(
        "bad_deep_unary_minus.s",
        format!("    movi x1, {}1\n    end\n", "-".repeat(deep)).into_bytes(),
    );
    for (name, text) in [
        (
            "bad_huge_immediate.s",
            "    movi x1, 99999999999999999999999\n    end\n",
        ),
        ("bad_shift_overflow.s", "    movi x1, 1 << 64\n    end\n"),
        (
            "bad_division_by_zero.s",
            ".equ Z, 0\n    movi x1, 8 / Z\n    end\n",
        ),
        ("bad_unknown_label.s", "    jmp nowhere\n    end\n"),
        ("bad_label_twice.s", "a:\na:\n    end\n"),
        ("bad_branch_past_end.s", "    jmp @100\n    end\n"),
        ("bad_non_ascii.s", "    movi x1, 1 ✓\n    end\n"),
        ("bad_register_99.s", "    movi x99, 1\n    end\n"),
        ("bad_unknown_directive.s", ".include \"other.s\"\n    end\n"),
    ] {
        add(name, text.as_bytes().to_vec());
    }
    add("extreme_empty.s", Vec::new());
    add(
        "extreme_long_sum.s",
        format!("    movi x1, 1{}\n    end\n", " + 1".repeat(5_000)).into_bytes(),
    );
    add(
        "extreme_many_instructions.s",
        format!("{}    end\n", "    movi x1, 1\n".repeat(5_000)).into_bytes(),
    );
    out
}

/// Every corpus file, by path under `tests/corpus`.
fn generate() -> BTreeMap<String, Vec<u8>> {
    [
        onnx_files(),
        om_files(),
        gtrace_files(),
        npy_files(),
        asm_files(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The run inputs of gear 0 of gear_dims (`tests/corpus/inputs/`, good files).
fn input_files() -> BTreeMap<String, Vec<u8>> {
    let t = 20;
    [
        (
            "inputs/data.npy",
            Tensor::from_f32s(vec![1, 1, 40, t], &vec![0.5; 40 * t as usize]),
        ),
        (
            "inputs/label.npy",
            Tensor::from_i32s(vec![1, t], &vec![3; t as usize]),
        ),
        ("inputs/mask.npy", Tensor::from_f32s(vec![1, 1], &[1.0])),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), npy::encode(&t)))
    .collect()
}

/// The committed files under `dir` (relative paths), `README.md` left out.
fn committed(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for sub in KINDS.iter().chain(&["inputs"]) {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        for e in entries {
            let e = e.unwrap();
            let name = format!("{sub}/{}", e.file_name().to_string_lossy());
            out.insert(name, std::fs::read(e.path()).unwrap());
        }
    }
    out
}

#[test]
fn the_committed_corpus_is_what_the_generator_makes() {
    let dir = corpus_dir();
    let mut want = generate();
    want.extend(input_files());
    if std::env::var_os("GEARSIM_BLESS").is_some() {
        for sub in KINDS.iter().chain(&["inputs"]) {
            let _ = std::fs::remove_dir_all(dir.join(sub));
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for (name, bytes) in &want {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let have = committed(&dir);
    let names = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        names(&have),
        names(&want),
        "tests/corpus differs from the generator; run `GEARSIM_BLESS=1 cargo test -p \
         gearsim-host corpus` and commit the result"
    );
    for (name, bytes) in &want {
        // `.om` files follow the compiler's output; the rest must match byte for byte.
        if !name.ends_with(".om") {
            assert!(
                have[name] == *bytes,
                "tests/corpus/{name} differs from the generator; run `GEARSIM_BLESS=1 cargo \
                 test -p gearsim-host corpus`"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The readers.

fn chip() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

/// Runs a file through its reader: `Err` for a bad file (an extreme one may read), never a
/// panic.
fn read(kind: &str, name: &str, bytes: &[u8]) -> Result<(), String> {
    let file = format!("tests/corpus/{kind}/{name}");
    match kind {
        "onnx" => {
            import(bytes, &file).map_err(|e| e.to_string())?;
            let s = SEEDS.iter().find(|s| s.name == "tiny_add.onnx").unwrap();
            compile(bytes, &file, &s.options()).map_err(|e| e.to_string())?;
            Ok(())
        }
        "om" => {
            let om = OmFile::parse(bytes).map_err(|e| e.to_string())?;
            om.desc().map_err(|e| e.to_string())?;
            let images = decode_kernels(om.section(SectionKind::Kernels).unwrap_or(&[]))
                .map_err(|e| e.to_string())?;
            for k in &images {
                Program::decode(None, &k.code).map_err(|e| e.to_string())?;
            }
            ModelTasks::decode(
                om.section(SectionKind::Tasks).unwrap_or(&[]),
                images.len() as u32,
            )
            .map_err(|e| e.to_string())?;
            let mut rt = Runtime::new(chip(), NullSink, RuntimeOptions::default()).unwrap();
            rt.load(bytes).map_err(|e| e.to_string())?;
            Ok(())
        }
        "gtrace" => {
            let t = TraceFile::from_bytes(bytes.to_vec()).map_err(|e| e.to_string())?;
            let _ = summary(&t).to_string();
            Ok(())
        }
        "npy" => npy::parse(bytes, Path::new(&file))
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "s" => {
            let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
            gearsim_isa::assemble(text, &file).map_err(|e| e.to_string())?;
            Ok(())
        }
        other => panic!("unknown corpus kind {other}"),
    }
}

#[test]
fn every_bad_file_is_rejected_by_its_reader() {
    let mut accepted = Vec::new();
    for (path, bytes) in committed(&corpus_dir()) {
        let (kind, name) = path.split_once('/').unwrap();
        if kind == "inputs" {
            continue;
        }
        let result = read(kind, name, &bytes);
        // The kernel that spins forever reads and loads; only running it fails.
        let loads = name == "bad_kernels_spin_forever.om";
        if name.starts_with("bad_") && !loads && result.is_ok() {
            accepted.push(path.clone());
        }
        if let Err(e) = &result {
            assert!(!e.is_empty(), "{path}: empty error");
        }
    }
    assert!(accepted.is_empty(), "bad files accepted: {accepted:?}");
}

// ---------------------------------------------------------------------------------------------
// The command line.

/// Longest a command may take on a corpus file (a debug build simulating a kernel that spins
/// until the chip's kernel timeout is the slowest).
const DEADLINE: Duration = Duration::from_secs(120);

/// What a finished command did.
struct Outcome {
    code: Option<i32>,
    stderr: String,
    took: Duration,
}

/// Runs `gearsim` with a deadline, killing it when the deadline passes.
fn gearsim(args: &[String]) -> Outcome {
    let start = Instant::now();
    let stderr_path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "gearsim-corpus-{}-{:?}.stderr",
        std::process::id(),
        std::thread::current().id()
    ));
    let stderr_file = std::fs::File::create(&stderr_path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gearsim"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(stderr_file)
        .spawn()
        .expect("run gearsim");
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    Outcome {
        code: status.and_then(|s| s.code()),
        stderr,
        took: start.elapsed(),
    }
}

/// The names and contents of the files in `dir`.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect()
}

/// One command on one corpus file, checked.
fn check_command(file: &Path, command: &str, args: Vec<String>, out_dir: &Path) -> Vec<String> {
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    let want = if name.starts_with("extreme_") {
        extreme_exit(&name, command)
    } else if command == "info" && description_intact(&name) {
        0
    } else {
        1
    };
    let before = snapshot(out_dir);
    let o = gearsim(&args);
    let mut problems = Vec::new();
    let what = format!("`gearsim {command}` on {name}");
    match o.code {
        None => problems.push(format!(
            "{what}: killed by a signal or the {DEADLINE:?} deadline after {:?}",
            o.took
        )),
        Some(code) if code != want => problems.push(format!(
            "{what}: exit {code}, expected {want}; stderr: {}",
            o.stderr.trim()
        )),
        Some(_) => {}
    }
    if o.stderr.contains("panicked") {
        problems.push(format!("{what}: panic text on stderr: {}", o.stderr.trim()));
    }
    if want == 1 {
        let shown = file.display().to_string();
        if o.stderr.trim().is_empty() || !o.stderr.contains(&shown) {
            problems.push(format!(
                "{what}: the error does not name {shown}: {}",
                o.stderr.trim()
            ));
        }
        if snapshot(out_dir) != before {
            problems.push(format!(
                "{what}: the output directory changed after a failed command"
            ));
        }
    }
    problems
}

/// A fresh output directory holding the files a failed command must not touch.
fn output_dir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.om"), b"an existing model").unwrap();
    std::fs::write(dir.join("output_0.npy"), b"an existing output").unwrap();
    std::fs::write(dir.join("out.bin"), b"an existing binary").unwrap();
    dir
}

/// Every command that reads `file`, with its arguments.
fn commands(
    kind: &str,
    file: &Path,
    out: &Path,
    model: &Path,
    inputs: &Path,
) -> Vec<(&'static str, Vec<String>)> {
    let f = file.display().to_string();
    let o = |n: &str| out.join(n).display().to_string();
    let input = |n: &str| inputs.join(n).display().to_string();
    let run = |model: String, first: String| {
        vec![
            "run".into(),
            "--model".into(),
            model,
            "--input".into(),
            format!("{first},{},{}", input("label.npy"), input("mask.npy")),
            "--output_dir".into(),
            out.display().to_string(),
        ]
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    match kind {
        "onnx" => vec![(
            "compile",
            vec![
                "compile".into(),
                "--model".into(),
                f,
                "--output".into(),
                o("model"),
            ],
        )],
        "om" => vec![
            ("info", s(&["info", "--model", &f])),
            ("run", run(f.clone(), input("data.npy"))),
        ],
        "gtrace" => vec![("trace summary", s(&["trace", "summary", &f]))],
        "npy" => vec![("run", run(model.display().to_string(), f))],
        "s" => vec![("kernel asm", s(&["kernel", "asm", &f, "-o", &o("out.bin")]))],
        other => panic!("unknown corpus kind {other}"),
    }
}

#[test]
fn every_corpus_file_fails_cleanly_through_the_command_line() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("corpus");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    // The model the `.npy` files are fed to, compiled now so it follows the compiler.
    let model = root.join("gear_dims.om");
    std::fs::write(&model, gear_dims_om(None)).unwrap();
    let dir = corpus_dir();
    let inputs = dir.join("inputs");
    let files: Vec<(String, PathBuf)> = committed(&dir)
        .into_keys()
        .filter(|p| !p.starts_with("inputs/"))
        .map(|p| (p.clone(), dir.join(&p)))
        .collect();
    assert!(files.len() >= 60, "only {} corpus files", files.len());
    let threads = std::thread::available_parallelism()
        .map_or(2, usize::from)
        .min(4);
    let problems: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (files, root, model, inputs) = (&files, &root, &model, &inputs);
                scope.spawn(move || {
                    let mut problems = Vec::new();
                    for (path, file) in files.iter().skip(t).step_by(threads) {
                        let kind = path.split('/').next().unwrap();
                        let out = output_dir(root, &path.replace('/', "_"));
                        for (command, args) in commands(kind, file, &out, model, inputs) {
                            problems.extend(check_command(file, command, args, &out));
                        }
                    }
                    problems
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
