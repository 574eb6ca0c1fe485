//! The compile pipeline end to end: golden graph dumps of the three gear modes (and sink
//! mode), the structure GE builds, the memory rules (weights once, feature maps = max over
//! gears), `.om` round trips, and bad input through the command line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gearsim_compiler::gear;
use gearsim_compiler::ir::{Attr, Graph, Node};
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{
    CompileError, CompileOptions, Compiled, MapIndexEngine, TableLayout, compile,
};
use gearsim_host::atc;
use gearsim_isa::om::{ModelDesc, OmFile};
use gearsim_isa::omtask::Region;
use gearsim_sim::ChipConfig;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models")
}

fn model_bytes(name: &str) -> Vec<u8> {
    std::fs::read(models().join(name)).unwrap()
}

fn options(input_shape: &str, mode: &str, gears: &str) -> CompileOptions {
    let mut gear = GearOptions {
        input_shape: Some(input_shape.to_string()).filter(|s| !s.is_empty()),
        ..GearOptions::default()
    };
    let g = Some(gears.to_string());
    match mode {
        "batch" => gear.dynamic_batch_size = g,
        "image" => gear.dynamic_image_size = g,
        "dims" => gear.dynamic_dims = g,
        _ => {}
    }
    CompileOptions {
        gear,
        getnext_sink: false,
        table_layout: TableLayout::GearMajor,
        mapindex_engine: MapIndexEngine::AiCore,
        fusion: Default::default(),
        precision: gearsim_compiler::precision::PrecisionMode::MustKeepOriginDtype,
        target: atc::target(&ChipConfig::preset("ascend910").unwrap()),
    }
}

fn compiled(model: &str, opts: &CompileOptions) -> Compiled {
    match compile(&model_bytes(model), model, opts) {
        Ok(c) => c,
        Err(e) => panic!("{model} does not compile: {e}"),
    }
}

fn node<'a>(g: &'a Graph, name: &str) -> &'a Node {
    let id = g
        .find(name)
        .unwrap_or_else(|| panic!("no node {name} in\n{}", g.dump()));
    g.node(id)
}

fn strs(n: &Node, attr: &str) -> Vec<String> {
    match n.attr(attr) {
        Some(Attr::Strs(v)) => v.clone(),
        other => panic!("{}: {attr} is {other:?}", n.name),
    }
}

// ---------------------------------------------------------------------------------------------
// Golden dumps.

/// The dump a golden file holds: the command, the graph before and after, and the notes.
fn golden_text(args: &str, c: &Compiled) -> String {
    let mut s = format!(
        "# gearsim compile {args}\n\n# before\n{}\n# after\n{}",
        c.before.dump(),
        c.after.dump()
    );
    for n in &c.notes {
        s.push_str(&format!("# note: {n}\n"));
    }
    s
}

fn check_golden(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if std::env::var_os("GEARSIM_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run `GEARSIM_BLESS=1 cargo test -p gearsim-host`",
            path.display()
        )
    });
    if want != text {
        let line = want
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || want.lines().count().min(text.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "{} differs from the compiler's dump at line {line}:\n  golden: {}\n  now:    {}\nIf the \
             change is intended, run `GEARSIM_BLESS=1 cargo test -p gearsim-host` and review the diff.",
            path.display(),
            want.lines().nth(line - 1).unwrap_or("<end>"),
            text.lines().nth(line - 1).unwrap_or("<end>"),
        );
    }
}

#[test]
fn golden_dynamic_batch() {
    let o = options("x:-1,4,8,8", "batch", "1,2,4");
    let c = compiled("gear_batch.onnx", &o);
    check_golden(
        "dynamic_batch",
        &golden_text(
            "--model=gear_batch.onnx --input_shape=x:-1,4,8,8 --dynamic_batch_size=1,2,4",
            &c,
        ),
    );
}

#[test]
fn golden_dynamic_image_size() {
    let o = options("img:1,3,-1,-1", "image", "16,16;32,24");
    let c = compiled("gear_image.onnx", &o);
    check_golden(
        "dynamic_image_size",
        &golden_text(
            "--model=gear_image.onnx --input_shape=img:1,3,-1,-1 --dynamic_image_size=16,16;32,24",
            &c,
        ),
    );
}

const SEED_SHAPE: &str = "data:1,1,40,-1;label:1,-1;mask:-1,-1";
const SEED_DIMS: &str = "20,20,1,1;40,40,2,2;80,60,4,4";

#[test]
fn golden_dynamic_dims_seed_example() {
    let c = compiled("gear_dims.onnx", &options(SEED_SHAPE, "dims", SEED_DIMS));
    check_golden(
        "dynamic_dims",
        &golden_text(
            &format!(
                "--model=gear_dims.onnx --input_shape={SEED_SHAPE} --dynamic_dims={SEED_DIMS}"
            ),
            &c,
        ),
    );
}

#[test]
fn golden_dynamic_dims_getnext_sink() {
    let mut o = options(SEED_SHAPE, "dims", SEED_DIMS);
    o.getnext_sink = true;
    let c = compiled("gear_dims.onnx", &o);
    check_golden(
        "dynamic_dims_sink",
        &golden_text(
            &format!(
                "--model=gear_dims.onnx --input_shape={SEED_SHAPE} --dynamic_dims={SEED_DIMS} --getnext_sink"
            ),
            &c,
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// The structure spec §4 prescribes, checked directly (the goldens show it; these say why).

#[test]
fn seed_example_root_graph_is_ges() {
    let c = compiled("gear_dims.onnx", &options(SEED_SHAPE, "dims", SEED_DIMS));
    let root = &c.after.graph;
    // Root inputs at their max gear by element count: data 80, label 60, mask 4x4 (gear 2).
    assert_eq!(
        format!("{}", node(root, "data").outputs[0]),
        "f32[1,1,40,80] NCHW"
    );
    assert_eq!(format!("{}", node(root, "label").outputs[0]), "i32[1,60]");
    assert_eq!(format!("{}", node(root, "mask").outputs[0]), "f32[4,4]");
    assert_eq!(
        node(root, "mask").ints("_mbatch_origin_input_dims"),
        Some(&[-1i64, -1][..])
    );
    // The gear vector is the last input: index = number of user Data nodes.
    let sd = node(root, gear::SHAPE_DATA);
    assert_eq!((sd.op.as_str(), sd.int("index")), ("Data", Some(3)));
    assert_eq!(format!("{}", sd.outputs[0]), "i32[4]");
    assert_eq!(
        sd.ints("_dynamic_batch_unknown_data_index"),
        Some(&[0i64, 1, 2][..])
    );
    // The gear table, gear-major int32.
    let table = node(root, gear::SHAPE_CONST).tensor("value").unwrap();
    assert_eq!(
        table.to_i64s(),
        vec![20, 20, 1, 1, 40, 40, 2, 2, 80, 60, 4, 4]
    );
    assert_eq!(table.dtype.name(), "i32");
    // MapIndex reads (gear vector, table); the Case reads (index, data inputs, constants).
    let mi = node(root, gear::MAPINDEX);
    assert_eq!(root.node(mi.inputs[0].unwrap().node).name, gear::SHAPE_DATA);
    assert_eq!(
        root.node(mi.inputs[1].unwrap().node).name,
        gear::SHAPE_CONST
    );
    let case = node(root, gear::CASE);
    let case_inputs: Vec<&str> = case
        .inputs
        .iter()
        .map(|v| root.node(v.unwrap().node).name.as_str())
        .collect();
    // `axes` (ReduceSum's compile-time axes) is a kernel parameter in every branch: pruned.
    assert_eq!(
        case_inputs,
        [gear::MAPINDEX, "data", "label", "mask", "two"]
    );
    assert_eq!(case.int("_batch_num"), Some(3));
    assert_eq!(case.ints("_pred_value_2"), Some(&[80i64, 60, 4, 4][..]));
    assert_eq!(case.int("mbatch_dynamic_type"), Some(3));
    assert!(
        matches!(
            root.attrs.get("_enable_dynamic_batch"),
            Some(gearsim_compiler::ir::Attr::Bool(true))
        ),
        "the root is marked as GE marks it"
    );
    assert_eq!(
        strs(case, "user_designate_shape_order"),
        ["data", "label", "mask"]
    );
    assert_eq!(case.subgraphs, ["Batch_0", "Batch_1", "Batch_2"]);
    // `label` is a direct output: wired from the root Data, not through the Case.
    let net = node(root, "NetOutput");
    assert_eq!(root.node(net.inputs[2].unwrap().node).name, "label");
    assert_eq!(
        strs(net, "_dynamic_output_dims"),
        [
            "0,0,1,1,20,40",
            "1,0,1,1,40,40",
            "2,0,1,1,80,40",
            "0,1,1",
            "1,1,2",
            "2,1,4",
            "-1,2,1,60"
        ]
    );
}

#[test]
fn branches_are_renamed_labelled_and_static() {
    let c = compiled("gear_dims.onnx", &options(SEED_SHAPE, "dims", SEED_DIMS));
    assert_eq!(c.after.subgraphs.len(), 3);
    for (i, b) in c.after.subgraphs.iter().enumerate() {
        assert_eq!(b.name, format!("Batch_{i}"));
        for n in &b.nodes {
            assert!(
                n.name.ends_with(&format!("_ascend_mbatch_batch_{i}")),
                "{}",
                n.name
            );
            assert_eq!(
                n.string("_batch_label"),
                Some(format!("Batch_{i}").as_str()),
                "{}",
                n.name
            );
        }
    }
    let b1 = &c.after.subgraphs[1];
    assert_eq!(
        format!("{}", node(b1, "data_ascend_mbatch_batch_1").outputs[0]),
        "f32[1,1,40,40] NCHW"
    );
    assert_eq!(
        format!(
            "{}",
            node(b1, "/Transpose_ascend_mbatch_batch_1").outputs[0]
        ),
        "f32[1,1,40,40]"
    );
    // Constants are inputs of the branch, their values stay at the root.
    let two = node(b1, "two_ascend_mbatch_batch_1");
    assert_eq!(
        (two.op.as_str(), two.int("_parent_node_index")),
        ("Data", Some(4))
    );
    assert!(two.attr("value").is_none());
}

#[test]
fn sink_mode_uses_getnext_and_get_dynamic_dims() {
    let mut o = options(SEED_SHAPE, "dims", SEED_DIMS);
    o.getnext_sink = true;
    let c = compiled("gear_dims.onnx", &o);
    let root = &c.after.graph;
    assert!(root.find(gear::SHAPE_DATA).is_none());
    let gdd = node(root, gear::GET_DYNAMIC_DIMS);
    assert_eq!(gdd.op, "GetDynamicDims");
    assert_eq!(gdd.int("N"), Some(3));
    // shape_info: per input its rank then its dims with -1.
    assert_eq!(
        gdd.ints("shape_info"),
        Some(&[4i64, 1, 1, 40, -1, 2, 1, -1, 2, -1, -1][..])
    );
    let net = node(root, "NetOutput");
    assert_eq!(net.attr("getnext_sink_dynamic"), Some(&Attr::Bool(true)));
    assert_eq!(
        root.node(net.inputs.last().unwrap().unwrap().node).name,
        gear::GET_DYNAMIC_DIMS
    );
    let d = c.desc.dynamic.as_ref().unwrap();
    assert!(d.getnext_sink);
    // No gear-vector input, and the gear vector NetOutput reads is not a model output.
    assert!(c.desc.inputs.iter().all(|i| i.name != gear::SHAPE_DATA));
    let names: Vec<&str> = c.desc.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["feat", "mask_sum", "label"]);
    // GetNext's outputs are not Data: `label` goes through the branches with its gear's shape,
    // and the shape table has no `-1` entries.
    assert_eq!(d.output_dims[0][2], vec![1, 20]);
    assert!(
        strs(net, "_dynamic_output_dims")
            .iter()
            .all(|e| !e.starts_with("-1,"))
    );
}

/// In sink mode GetNext's outputs are bound to the gear vector by position, so a
/// `--input_shape` listed out of graph order must still make GetDynamicDims produce exactly the
/// gear's vector (the firmware's reference semantics decide).
#[test]
fn sink_mode_follows_the_input_shape_order() {
    let mut o = options(
        "mask:-1,-1;label:1,-1;data:1,1,40,-1",
        "dims",
        "1,1,20,20;2,2,40,40;4,4,60,80",
    );
    o.getnext_sink = true;
    let c = compiled("gear_dims.onnx", &o);
    let root = &c.after.graph;
    let getnext = node(root, gear::GETNEXT);
    assert_eq!(strs(getnext, "output_names"), ["mask", "label", "data"]);
    let gdd = node(root, gear::GET_DYNAMIC_DIMS);
    let shape_info = gdd.ints("shape_info").unwrap().to_vec();
    let d = c.desc.dynamic.as_ref().unwrap();
    for (i, gear) in d.gears.iter().enumerate() {
        let real: Vec<Vec<i64>> = d.input_dims[i].clone();
        let dims = gearsim_firmware::kernels::get_dynamic_dims(3, &shape_info, &real).unwrap();
        assert_eq!(&dims, gear, "gear {i}");
    }
    // Branch Data read the GetNext outputs in the same order.
    let b = &c.after.subgraphs[0];
    assert_eq!(
        node(b, "mask_ascend_mbatch_batch_0").int("_parent_node_index"),
        Some(1)
    );
    assert_eq!(
        node(b, "data_ascend_mbatch_batch_0").int("_parent_node_index"),
        Some(3)
    );
}

#[test]
fn batch_and_image_modes_share_one_gear_value_across_inputs() {
    let c = compiled(
        "gear_image.onnx",
        &options("img:1,3,-1,-1", "image", "16,16;32,24"),
    );
    let d = c.desc.dynamic.as_ref().unwrap();
    assert_eq!(d.mode, 2);
    assert_eq!(d.input_dims[1][0], vec![1, 3, 32, 24]);
    // act = Relu(Conv stride 2): H/2, W/2 per gear; feat is [1,4] in every gear.
    assert_eq!(d.output_dims[0], vec![vec![1, 4], vec![1, 4, 8, 8]]);
    assert_eq!(d.output_dims[1], vec![vec![1, 4], vec![1, 4, 16, 12]]);
    assert_eq!(c.desc.outputs[1].dims, vec![1, 4, -1, -1]);
    assert_eq!(c.desc.outputs[0].dims, vec![1, 4]);
}

// ---------------------------------------------------------------------------------------------
// Real models and the memory rules.

fn weights_of_initializers(c: &Compiled) -> u64 {
    // Every root constant once, each padded to the 512-byte block.
    c.after
        .graph
        .nodes
        .iter()
        .filter(|n| n.op == "Const" && n.name != gear::SHAPE_CONST)
        .map(|n| n.tensor("value").unwrap().data.len() as u64)
        .map(|b| b.max(1).div_ceil(512) * 512)
        .sum()
}

fn check_memory_rules(c: &Compiled) {
    let m = &c.desc.memory;
    let max = *m.per_gear_feature_map.iter().max().unwrap();
    let sum: u64 = m.per_gear_feature_map.iter().sum();
    assert_eq!(m.feature_map_bytes, max, "feature maps = max over gears");
    assert!(m.feature_map_bytes < sum, "not the sum");
    // Each branch's plan fits in the overlaid region, after the root's tensors.
    let e = &c.emitted;
    assert_eq!(e.root_feature_map, m.root_feature_map_bytes);
    for (i, bytes) in e.branch_feature_map.iter().enumerate() {
        assert_eq!(m.root_feature_map_bytes + bytes, m.per_gear_feature_map[i]);
    }
    for p in &e.placements {
        if p.addr.region == Region::FeatureMap {
            assert!(p.addr.offset + p.bytes <= m.feature_map_bytes, "{p:?}");
        }
    }
}

#[test]
fn cnn_compiles_for_batch_gears_with_weights_once_and_feature_maps_the_max() {
    let one = compiled("cnn.onnx", &options("input:-1,3,32,32", "batch", "1,2"));
    let c = compiled("cnn.onnx", &options("input:-1,3,32,32", "batch", "1,2,4,8"));
    check_memory_rules(&c);
    let m = &c.desc.memory;
    // Weights: stored once, the same whether there are 2 gears or 4.
    assert_eq!(m.weight_bytes, one.desc.memory.weight_bytes);
    // Every initializer is stored, the ones the cube multiplies as f16 (conv weights, packed
    // at compile time) at half their f32 size.
    assert!(m.weight_bytes >= weights_of_initializers(&c) / 2);
    // Feature maps grow with the batch: gear i needs about twice gear i-1.
    let fm = &m.per_gear_feature_map;
    for w in fm.windows(2) {
        assert!(w[1] > w[0], "{fm:?}");
    }
    assert_eq!(
        c.desc.dynamic.as_ref().unwrap().output_dims[3],
        vec![vec![8, 10]]
    );
    assert_eq!(c.desc.outputs[0].dims, vec![-1, 10]);
    assert_eq!(c.desc.inputs[0].max_dims, vec![8, 3, 32, 32]);
    assert_eq!(c.desc.inputs[0].bytes, 8 * 3 * 32 * 32 * 4);
}

#[test]
fn transformer_compiles_for_sequence_length_gears_and_folds_its_shape_chains() {
    let c = compiled(
        "transformer.onnx",
        &options("x:1,-1,64", "dims", "16;32;64;128"),
    );
    check_memory_rules(&c);
    let d = c.desc.dynamic.as_ref().unwrap();
    for (i, s) in [16, 32, 64, 128].iter().enumerate() {
        assert_eq!(d.output_dims[i], vec![vec![1, *s, 64]]);
    }
    // No shape computation survives in a branch: every Reshape reads a constant shape.
    for b in &c.after.subgraphs {
        for n in &b.nodes {
            assert!(
                !matches!(n.op.as_str(), "Shape" | "Gather" | "Unsqueeze" | "Concat"),
                "{} in {}",
                n.name,
                b.name
            );
            if n.op == "Reshape" {
                assert_eq!(b.node(n.inputs[1].unwrap().node).op, "Const", "{}", n.name);
            }
        }
    }
    // Weights once: the gear count does not change them.
    let two = compiled("transformer.onnx", &options("x:1,-1,64", "dims", "16;32"));
    assert_eq!(two.desc.memory.weight_bytes, c.desc.memory.weight_bytes);
}

#[test]
fn static_compile_has_no_case() {
    let c = compiled("cnn.onnx", &options("input:2,3,32,32", "", ""));
    assert!(c.desc.dynamic.is_none());
    assert!(c.after.subgraphs.is_empty());
    assert_eq!(c.desc.outputs[0].dims, vec![2, 10]);
    assert_eq!(c.desc.inputs[0].format, "NCHW");
}

#[test]
fn om_round_trips_the_description() {
    for layout in [TableLayout::GearMajor, TableLayout::DimMajor8] {
        let mut o = options(SEED_SHAPE, "dims", SEED_DIMS);
        o.table_layout = layout;
        o.mapindex_engine = MapIndexEngine::AiCpu;
        let c = compiled("gear_dims.onnx", &o);
        let bytes = c.om_bytes().unwrap();
        let om = OmFile::parse(&bytes).unwrap();
        let desc: ModelDesc = om.desc().unwrap();
        assert_eq!(desc, c.desc);
        let d = desc.dynamic.unwrap();
        assert_eq!((d.table_layout, d.mapindex_engine), (layout as u32, 1));
        assert_eq!(
            om.section(gearsim_isa::om::SectionKind::Weights).unwrap(),
            &c.emitted.weights.data[..]
        );
    }
}

#[test]
fn compiling_twice_gives_identical_bytes() {
    let o = options("input:-1,3,32,32", "batch", "1,2,4,8");
    let a = compiled("cnn.onnx", &o);
    let b = compiled("cnn.onnx", &o);
    assert_eq!(a.om_bytes(), b.om_bytes());
    assert_eq!(a.after.dump(), b.after.dump());
}

// ---------------------------------------------------------------------------------------------
// Errors from the pipeline.

fn compile_err(model: &[u8], o: &CompileOptions) -> CompileError {
    match compile(model, "m.onnx", o) {
        Ok(c) => panic!("expected an error, got\n{}", c.after.dump()),
        Err(e) => e,
    }
}

#[test]
fn option_errors_come_before_the_model_is_read() {
    // Garbage bytes, but the option error is reported (atc checks options first).
    let e = compile_err(b"not onnx", &options("x:-1,4,8,8", "batch", "1,a,8"));
    assert!(e.to_string().starts_with("E10"), "{e}");
}

#[test]
fn gear_count_is_limited_by_the_map_index_kernel() {
    let gears: Vec<String> = (1..=101).map(|g| g.to_string()).collect();
    let e = compile_err(
        &model_bytes("cnn.onnx"),
        &options("input:-1,3,32,32", "batch", &gears.join(",")),
    );
    let s = e.to_string();
    assert!(s.contains("at most 100 profiles"), "{s}");
    // 100 is fine.
    let gears: Vec<String> = (1..=100).map(|g| g.to_string()).collect();
    let c = compiled(
        "cnn.onnx",
        &options("input:-1,3,32,32", "batch", &gears.join(",")),
    );
    assert_eq!(c.after.subgraphs.len(), 100);
}

#[test]
fn an_unknown_input_without_gears_is_an_error_naming_it() {
    let e = compile_err(&model_bytes("cnn.onnx"), &options("", "", ""));
    let s = e.to_string();
    assert!(
        s.contains("input `input`") && s.contains("--input_shape"),
        "{s}"
    );
}

fn conflict_model() -> Vec<u8> {
    use super::onnx_build::{model, node};
    use prost::Message as _;
    // a [N,4] + b [N,5]: the trailing dims cannot broadcast in any gear.
    let m = model(
        17,
        vec![
            node("Relu", "relu_b", &["b"], &["rb"]),
            node("Add", "add", &["a", "rb"], &["y"]),
        ],
        &[("a", &[None, Some(4)]), ("b", &[None, Some(5)])],
        &[("y", &[None, Some(4)])],
        vec![],
    );
    m.encode_to_vec()
}

#[test]
fn a_shape_conflict_names_branch_gear_node_input_and_the_producing_chain() {
    let e = compile_err(&conflict_model(), &options("a:-1,4;b:-1,5", "batch", "1,2"));
    let s = e.to_string();
    assert!(s.contains("in branch Batch_0 (gear 1)"), "{s}");
    assert!(s.contains("node `add_ascend_mbatch_batch_0` (Add)"), "{s}");
    assert!(
        s.contains("relu_b_ascend_mbatch_batch_0 (Relu) : f32[1,5]"),
        "{s}"
    );
    assert!(s.contains("how to fix"), "{s}");
}

#[test]
fn an_unsupported_op_names_node_op_and_opset() {
    use super::onnx_build::{model, node};
    use prost::Message as _;
    let m = model(
        18,
        vec![node("NonZero", "nz", &["a"], &["y"])],
        &[("a", &[Some(2), Some(3)])],
        &[("y", &[Some(2), None])],
        vec![],
    );
    let e = compile_err(&m.encode_to_vec(), &options("", "", ""));
    let s = e.to_string();
    assert!(
        s.contains("`NonZero`") && s.contains("`nz`") && s.contains("opset 18"),
        "{s}"
    );
}

#[test]
fn an_input_of_rank_above_eight_is_refused_when_compiling() {
    // It used to compile and then fail every load.
    use super::onnx_build::{model, node};
    use prost::Message as _;
    let dims: &[Option<i64>] = &[
        Some(2),
        Some(1),
        Some(1),
        Some(1),
        Some(1),
        Some(1),
        Some(1),
        Some(1),
        Some(2),
    ];
    let m = model(
        13,
        vec![node("Relu", "r", &["x"], &["y"])],
        &[("x", dims)],
        &[("y", dims)],
        vec![],
    );
    let s = compile_err(&m.encode_to_vec(), &options("", "", "")).to_string();
    assert!(
        s.contains("input `x` of rank 9") && s.contains("at most 8 dims"),
        "{s}"
    );
}

// ---------------------------------------------------------------------------------------------
// The command line: outputs, exit codes, and no partial `.om` on error.

fn gearsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gearsim"))
        .args(args)
        .output()
        .expect("run gearsim")
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn model_arg(name: &str) -> String {
    format!("--model={}", models().join(name).display())
}

#[test]
fn compile_then_info_describes_gears_outputs_and_memory() {
    let out = scratch("gear_dims");
    let dumps = scratch("dumps");
    let o = gearsim(&[
        "compile",
        &model_arg("gear_dims.onnx"),
        &format!("--output={}", out.display()),
        "--framework=5",
        &format!("--input_shape={SEED_SHAPE}"),
        &format!("--dynamic_dims={SEED_DIMS}"),
        "--soc_version=Ascend910",
        &format!("--dump_graph={}", dumps.display()),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        dumps.join("gear_dims.before.txt").exists() && dumps.join("gear_dims.after.txt").exists()
    );
    let om = out.with_extension("om");
    let o = gearsim(&["info", &format!("--model={}", om.display())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["dynamic"]["type"], "dynamic_dims");
    assert_eq!(v["dynamic"]["gears"][2], serde_json::json!([80, 60, 4, 4]));
    assert_eq!(
        v["dynamic"]["shape_order"],
        serde_json::json!(["data", "label", "mask"])
    );
    assert_eq!(
        v["dynamic"]["per_gear"][1]["outputs"][0]["dims"],
        serde_json::json!([1, 1, 40, 40])
    );
    let per_gear = v["memory"]["per_gear_feature_map_bytes"]
        .as_array()
        .unwrap();
    let max = per_gear.iter().map(|x| x.as_u64().unwrap()).max().unwrap();
    assert_eq!(v["memory"]["feature_map_bytes"].as_u64().unwrap(), max);
    assert_eq!(v["inputs"][3]["name"], gear::SHAPE_DATA);
}

/// A failing compile exits 1 with a message and leaves an existing `.om` untouched.
fn assert_fails_keeping_om(model: &Path, extra: &[&str], expect: &str) {
    // One output per model and option set: the tests run in parallel.
    let tag = format!(
        "{}-{}",
        model.file_stem().unwrap().to_string_lossy(),
        extra.join("").len()
    );
    let out = scratch(&format!("kept-{tag}"));
    let om = out.with_extension("om");
    std::fs::write(&om, b"previous contents").unwrap();
    let mut args = vec![
        "compile".to_string(),
        format!("--model={}", model.display()),
        format!("--output={}", out.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = gearsim(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(expect), "expected `{expect}` in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(std::fs::read(&om).unwrap(), b"previous contents");
    let leftovers: Vec<_> = std::fs::read_dir(om.parent().unwrap())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("kept-{tag}.om.tmp-"))
        })
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn bad_models_fail_cleanly_without_touching_the_om() {
    let truncated = scratch("truncated.onnx");
    let bytes = model_bytes("cnn.onnx");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_fails_keeping_om(
        &truncated,
        &["--input_shape=input:1,3,32,32"],
        "not a valid ONNX model",
    );

    let junk = scratch("junk.onnx");
    std::fs::write(&junk, b"\xff\xff\xff\xff this is not protobuf").unwrap();
    assert_fails_keeping_om(&junk, &[], "junk.onnx");

    let conflict = scratch("conflict.onnx");
    std::fs::write(&conflict, conflict_model()).unwrap();
    assert_fails_keeping_om(
        &conflict,
        &["--input_shape=a:-1,4;b:-1,5", "--dynamic_batch_size=1,2"],
        "shape inference failed at node `add_ascend_mbatch_batch_0`",
    );

    assert_fails_keeping_om(&models().join("missing.onnx"), &[], "cannot read");
    assert_fails_keeping_om(
        &models().join("cnn.onnx"),
        &[
            "--input_shape=input:-1,3,32,32",
            "--dynamic_batch_size=1,2",
            "--dynamic_dims=1;2",
        ],
        "E10",
    );
    assert_fails_keeping_om(
        &models().join("cnn.onnx"),
        &[
            "--input_shape=input:-1,3,32,32",
            "--dynamic_batch_size=1,2",
            "--framework=3",
        ],
        "--framework",
    );
    assert_fails_keeping_om(
        &models().join("cnn.onnx"),
        &[
            "--input_shape=input:-1,3,32,32",
            "--dynamic_batch_size=1,2",
            "--gear_table_layout=rows",
        ],
        "expected one of gear_major, dim_major8, sorted_binary",
    );
}

#[test]
fn missing_initializer_and_bad_attribute_are_clear_errors() {
    use super::onnx_build::{model, node};
    use prost::Message as _;
    // Conv reading a weight no initializer provides.
    let m = model(
        17,
        vec![node("Conv", "conv", &["x", "w_missing"], &["y"])],
        &[("x", &[Some(1), Some(3), Some(8), Some(8)])],
        &[("y", &[Some(1), Some(4), Some(8), Some(8)])],
        vec![],
    );
    let p = scratch("missing_init.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    assert_fails_keeping_om(&p, &[], "w_missing");
    // Transpose with a perm that is not a permutation.
    let mut t = node("Transpose", "tr", &["x"], &["y"]);
    t.attribute
        .push(gearsim_compiler::onnx::proto::AttributeProto {
            name: "perm".into(),
            ints: vec![0, 1, 1, 5],
            r#type: gearsim_compiler::onnx::proto::AttributeType::Ints as i32,
            ..Default::default()
        });
    let m = model(
        17,
        vec![t],
        &[("x", &[Some(1), Some(3), Some(8), Some(8)])],
        &[("y", &[Some(1), Some(3), Some(8), Some(8)])],
        vec![],
    );
    let p = scratch("bad_perm.onnx");
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    assert_fails_keeping_om(&p, &[], "perm");
}

#[test]
fn info_refuses_a_damaged_om() {
    let c = compiled("gear_dims.onnx", &options(SEED_SHAPE, "dims", SEED_DIMS));
    let bytes = c.om_bytes().unwrap();
    let cut = scratch("cut.om");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).unwrap();
    let flipped = scratch("flipped.om");
    let mut b = bytes.clone();
    let last = b.len() - 100;
    b[last] ^= 0x10;
    std::fs::write(&flipped, &b).unwrap();
    for (path, expect) in [(&cut, "truncated"), (&flipped, "checksum")] {
        let o = gearsim(&["info", &format!("--model={}", path.display())]);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(expect) && stderr.contains(&path.display().to_string()),
            "{stderr}"
        );
    }
}
