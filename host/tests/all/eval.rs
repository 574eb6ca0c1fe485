//! The reference evaluator (`compiler::eval`): every fixture in `tests/models/eval/` (one tiny
//! model per op configuration, expected outputs from `onnx.reference.ReferenceEvaluator`, made
//! by `make_eval_cases.py`) evaluated after import and inference, and again after constant
//! folding; compiled gear models evaluated through MapIndex and Case against the original
//! graph; the f16 rounding; the errors; and the test CNN's speed and batch consistency.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gearsim_compiler::eval::{EvalError, eval_graph, eval_model, eval_node, f64_to_f16_bits};
use gearsim_compiler::ir::{Attr, DataType, Graph, Model, Node, Tensor, TensorDesc, fixed_shape};
use gearsim_compiler::options::GearOptions;
use gearsim_compiler::pipeline::{CompileOptions, Compiled, MapIndexEngine, TableLayout, compile};
use gearsim_compiler::{gear, infer, onnx, ops};
use gearsim_host::atc;
use gearsim_sim::ChipConfig;
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng};
use serde_json::Value as Json;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models")
}

// ---------------------------------------------------------------------------------------------
// Fixtures against the ONNX reference implementation.

/// One tensor of a fixture.
struct Named {
    name: String,
    tensor: Tensor,
}

fn dtype_of(name: &str) -> DataType {
    DataType::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .unwrap_or_else(|| panic!("unknown dtype {name}"))
}

/// A fixture tensor: floats are decimal strings that read back exactly in their own type.
fn tensor_of(j: &Json) -> Named {
    let dtype = dtype_of(j["dtype"].as_str().unwrap());
    let dims: Vec<i64> = j["dims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_i64().unwrap())
        .collect();
    let values = j["values"].as_array().unwrap();
    let mut bytes = Vec::with_capacity(values.len() * dtype.size());
    for v in values {
        match dtype {
            DataType::F32 => {
                let x: f32 = v.as_str().unwrap().parse().unwrap();
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            DataType::F64 => {
                let x: f64 = v.as_str().unwrap().parse().unwrap();
                bytes.extend_from_slice(&x.to_le_bytes());
            }
            DataType::F16 => {
                let x: f64 = v.as_str().unwrap().parse().unwrap();
                bytes.extend_from_slice(&f64_to_f16_bits(x).to_le_bytes());
            }
            _ => {
                let x = v.as_i64().unwrap();
                match dtype.size() {
                    8 => bytes.extend_from_slice(&x.to_le_bytes()),
                    4 => bytes.extend_from_slice(&(x as i32).to_le_bytes()),
                    2 => bytes.extend_from_slice(&(x as i16).to_le_bytes()),
                    _ => bytes.push(x as u8),
                }
            }
        }
    }
    Named {
        name: j["name"].as_str().unwrap().to_string(),
        tensor: Tensor::new(dtype, dims, bytes).unwrap(),
    }
}

/// Where `got` first differs from `want` beyond the tolerance of the type, if anywhere:
/// f32 within 1e-6 + 1e-5 * |want|, f64 within 1e-15 + 1e-12 * |want|; f16 (every f16 fixture
/// is a single correctly rounded operation or a cast), integers and bools exactly. `exact`
/// makes floats exact too (Cast, whose whole point is the rounding).
fn first_mismatch(want: &Tensor, got: &Tensor, exact: bool) -> Option<String> {
    if want.dtype != got.dtype || want.dims != got.dims {
        return Some(format!(
            "expected {}, got {}",
            want.summary(),
            got.summary()
        ));
    }
    let (w, g) = (want.to_f64s(), got.to_f64s());
    let (atol, rtol) = match want.dtype {
        _ if exact => (0.0, 0.0),
        DataType::F32 => (1e-6, 1e-5),
        DataType::F64 => (1e-15, 1e-12),
        _ => (0.0, 0.0),
    };
    for (i, (a, b)) in w.iter().zip(&g).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * a.abs();
        if !same {
            return Some(format!("element {i}: expected {a:e}, got {b:e}"));
        }
    }
    None
}

/// Imports a fixture model with its inputs' shapes set from the feeds, as `--input_shape`
/// would, and infers it.
fn prepared(
    model: &Path,
    feeds: &BTreeMap<String, Tensor>,
) -> Result<(Model, infer::Known), String> {
    let mut m = onnx::import_file(model).map_err(|e| e.to_string())?.model;
    for n in &mut m.graph.nodes {
        if let (true, Some(t)) = (n.op == "Data", feeds.get(&n.name)) {
            n.outputs[0].shape = fixed_shape(&t.dims);
        }
    }
    let known =
        infer::infer_graph(&mut m.graph, &ops::standard(), m.opset).map_err(|e| e.to_string())?;
    Ok((m, known))
}

/// Runs one fixture: the evaluation of the inferred graph must match the reference outputs,
/// and the evaluation after constant folding must match the first bit for bit.
fn run_fixture(dir: &Path, doc: &Json) -> Result<(), String> {
    let inputs: Vec<Named> = doc["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(tensor_of)
        .collect();
    let outputs: Vec<Named> = doc["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(tensor_of)
        .collect();
    let feeds: BTreeMap<String, Tensor> = inputs.into_iter().map(|n| (n.name, n.tensor)).collect();
    let (model, known) = prepared(&dir.join(doc["model"].as_str().unwrap()), &feeds)?;
    let op = doc["op"].as_str().unwrap();
    // A Constant is imported as a Const; every other fixture must really contain its op.
    if op != "model" && op != "Constant" && model.graph.of_type(op).is_empty() {
        return Err(format!("the model has no {op} node"));
    }
    let got = eval_graph(&model.graph, &feeds, model.opset).map_err(|e| e.to_string())?;
    if got.len() != outputs.len() {
        return Err(format!("{} outputs, expected {}", got.len(), outputs.len()));
    }
    for (want, g) in outputs.iter().zip(&got) {
        if let Some(m) = first_mismatch(&want.tensor, g, op == "Cast") {
            return Err(format!("output `{}`: {m}", want.name));
        }
    }
    let mut folded = model.graph.clone();
    infer::fold_constants(&mut folded, &known);
    let again = eval_graph(&folded, &feeds, model.opset).map_err(|e| e.to_string())?;
    if again != got {
        return Err("the constant-folded graph evaluates differently".into());
    }
    Ok(())
}

#[test]
fn fixtures_match_the_onnx_reference_implementation() {
    let dir = models().join("eval");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut failures = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    for f in &files {
        let doc: Json = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let op = doc["op"].as_str().unwrap().to_string();
        let name = doc["name"].as_str().unwrap().to_string();
        match run_fixture(&dir, &doc) {
            Ok(()) => {
                covered.insert(op);
            }
            Err(e) => failures.push(format!("{op} / {name}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures fail:\n  {}",
        failures.len(),
        files.len(),
        failures.join("\n  ")
    );
    assert!(files.len() >= 80, "only {} fixtures", files.len());
    let missing: Vec<&str> = ops::onnx_ops(&ops::standard())
        .into_iter()
        .filter(|op| !covered.contains(*op))
        .collect();
    assert!(missing.is_empty(), "no passing fixture covers {missing:?}");
}

// ---------------------------------------------------------------------------------------------
// Compiled gear models.

const SEED_SHAPE: &str = "data:1,1,40,-1;label:1,-1;mask:-1,-1";
const SEED_DIMS: &str = "20,20,1,1;40,40,2,2;80,60,4,4";
/// The seed example's gears: data's T, label's L, mask's M and K.
const GEARS: [[i64; 4]; 3] = [[20, 20, 1, 1], [40, 40, 2, 2], [80, 60, 4, 4]];

fn seed_options(sink: bool) -> CompileOptions {
    CompileOptions {
        gear: GearOptions {
            input_shape: Some(SEED_SHAPE.into()),
            dynamic_dims: Some(SEED_DIMS.into()),
            ..GearOptions::default()
        },
        getnext_sink: sink,
        table_layout: TableLayout::GearMajor,
        mapindex_engine: MapIndexEngine::AiCore,
        fusion: Default::default(),
        precision: gearsim_compiler::precision::PrecisionMode::MustKeepOriginDtype,
        target: atc::target(&ChipConfig::preset("ascend910").unwrap()),
    }
}

fn compiled_seed(sink: bool) -> (Compiled, Model) {
    let bytes = std::fs::read(models().join("gear_dims.onnx")).unwrap();
    let c = compile(&bytes, "gear_dims.onnx", &seed_options(sink)).unwrap();
    let original = onnx::import(&bytes, "gear_dims.onnx").unwrap().model;
    (c, original)
}

fn random_f32(rng: &mut StdRng, dims: &[i64]) -> Tensor {
    let n: i64 = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect();
    Tensor::from_f32s(dims.to_vec(), &v)
}

/// The user inputs of the seed model at gear `[t, l, m, k]`.
fn seed_feeds(rng: &mut StdRng, g: [i64; 4]) -> BTreeMap<String, Tensor> {
    let [t, l, m, k] = g;
    let label: Vec<i32> = (0..l).map(|_| rng.random_range(-100..100)).collect();
    BTreeMap::from([
        ("data".to_string(), random_f32(rng, &[1, 1, 40, t])),
        ("label".to_string(), Tensor::from_i32s(vec![1, l], &label)),
        ("mask".to_string(), random_f32(rng, &[m, k])),
    ])
}

fn with_gear_vector(feeds: &BTreeMap<String, Tensor>, v: [i64; 4]) -> BTreeMap<String, Tensor> {
    let mut f = feeds.clone();
    let v: Vec<i32> = v.iter().map(|x| *x as i32).collect();
    f.insert(gear::SHAPE_DATA.into(), Tensor::from_i32s(vec![4], &v));
    f
}

#[test]
fn every_gear_of_a_compiled_model_evaluates_like_the_original_graph() {
    let (c, original) = compiled_seed(false);
    let mut rng = StdRng::seed_from_u64(7);
    for g in GEARS {
        let feeds = seed_feeds(&mut rng, g);
        let want = eval_graph(&original.graph, &feeds, original.opset).unwrap();
        let got = eval_model(&c.after, &with_gear_vector(&feeds, g)).unwrap();
        assert_eq!(got, want, "gear {g:?}");
        // feat = Transpose(Relu(data * 2)) is [1,1,T,40]; mask_sum is [M]; label comes back.
        assert_eq!(got[0].dims, vec![1, 1, g[0], 40]);
        assert_eq!(got[1].dims, vec![g[2]]);
        assert_eq!(got[2], feeds["label"]);
    }
}

#[test]
fn a_gear_vector_matching_no_gear_runs_the_last_branch() {
    let (c, original) = compiled_seed(false);
    let mut rng = StdRng::seed_from_u64(8);
    // MapIndex itself says -1 for a vector that is no gear, and the first match otherwise.
    let map = c
        .after
        .graph
        .node(c.after.graph.find(gear::MAPINDEX).unwrap());
    let table = c
        .after
        .graph
        .node(c.after.graph.find(gear::SHAPE_CONST).unwrap());
    let table = table.tensor("value").unwrap();
    for (v, want) in [
        ([80, 60, 4, 5], -1),
        ([40, 40, 2, 2], 1),
        ([20, 20, 1, 1], 0),
    ] {
        let q = Tensor::from_i32s(vec![4], &v);
        let out = eval_node(map, &[Some(&q), Some(table)], &map.outputs, c.after.opset).unwrap();
        assert_eq!(out[0].to_i64s(), vec![want], "MapIndex of {v:?}");
    }
    // With the last gear's shapes, an unknown vector gives the last gear's results.
    let last = GEARS[2];
    let feeds = seed_feeds(&mut rng, last);
    let want = eval_graph(&original.graph, &feeds, original.opset).unwrap();
    let got = eval_model(&c.after, &with_gear_vector(&feeds, [80, 60, 4, 5])).unwrap();
    assert_eq!(got, want);
    // With another gear's shapes, the last branch refuses them, naming itself and the input.
    let small = seed_feeds(&mut rng, GEARS[0]);
    match eval_model(&c.after, &with_gear_vector(&small, [1, 2, 3, 4])) {
        Err(EvalError::Branch {
            branch,
            index,
            error,
            ..
        }) => {
            assert_eq!((branch.as_str(), index), ("Batch_2", 2));
            assert!(
                matches!(*error, EvalError::Feed { ref input, .. } if input.starts_with("data")),
                "{error}"
            );
        }
        other => panic!("expected a branch feed error, got {other:?}"),
    }
}

#[test]
fn sink_mode_is_a_clear_error() {
    let (c, _) = compiled_seed(true);
    let mut rng = StdRng::seed_from_u64(9);
    let feeds = seed_feeds(&mut rng, GEARS[0]);
    match eval_model(&c.after, &feeds) {
        Err(EvalError::Unsupported { op, what, .. }) => {
            assert_eq!(op, "GetNext");
            assert!(what.contains("original graph"), "{what}");
        }
        other => panic!("expected GetNext to be unsupported, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Feeds, nodes and errors.

#[test]
fn feeds_are_checked_by_name_type_and_shape() {
    let (_, original) = compiled_seed(false);
    let g = &original.graph;
    let mut rng = StdRng::seed_from_u64(10);
    let good = seed_feeds(&mut rng, GEARS[1]);
    let feed_error = |feeds: &BTreeMap<String, Tensor>| match eval_graph(g, feeds, 17) {
        Err(EvalError::Feed { input, problem, .. }) => (input, problem),
        other => panic!("expected a feed error, got {other:?}"),
    };
    let mut missing = good.clone();
    missing.remove("mask");
    let (input, problem) = feed_error(&missing);
    assert_eq!(input, "mask");
    assert!(problem.contains("no feed"), "{problem}");
    let mut wrong_rank = good.clone();
    wrong_rank.insert("data".into(), random_f32(&mut rng, &[1, 40, 20]));
    assert_eq!(feed_error(&wrong_rank).0, "data");
    let mut wrong_dim = good.clone();
    wrong_dim.insert("data".into(), random_f32(&mut rng, &[1, 1, 41, 20]));
    assert_eq!(feed_error(&wrong_dim).0, "data");
    let mut wrong_type = good.clone();
    wrong_type.insert("label".into(), random_f32(&mut rng, &[1, 40]));
    assert_eq!(feed_error(&wrong_type).0, "label");
    let mut extra = good.clone();
    extra.insert("labels".into(), random_f32(&mut rng, &[1]));
    assert_eq!(feed_error(&extra).0, "labels");
    assert!(eval_graph(g, &good, 17).is_ok());
}

/// A node for `eval_node`, which takes its input values directly (the node's edges are not read).
fn op_node(op: &str, outputs: Vec<TensorDesc>) -> Node {
    Node::new(format!("my_{}", op.to_lowercase()), op, vec![], outputs)
}

fn desc(dtype: DataType, dims: &[i64]) -> TensorDesc {
    TensorDesc::new(dtype, fixed_shape(dims))
}

#[test]
fn node_errors_name_the_node_and_what_is_wrong() {
    // Integer division by zero is an error of the values, not a value.
    let div = op_node("Div", vec![desc(DataType::I32, &[3])]);
    let a = Tensor::from_i32s(vec![3], &[6, 7, 8]);
    let b = Tensor::from_i32s(vec![3], &[2, 0, 4]);
    match eval_node(&div, &[Some(&a), Some(&b)], &div.outputs, 17) {
        Err(e @ EvalError::Value { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("my_div") && text.contains("element 1"),
                "{text}"
            );
        }
        other => panic!("expected a value error, got {other:?}"),
    }
    // Output descriptors that disagree with the inputs.
    let add = op_node("Add", vec![desc(DataType::F32, &[2, 2])]);
    let x = Tensor::from_f32s(vec![2, 3], &[1.0; 6]);
    match eval_node(&add, &[Some(&x), Some(&x)], &add.outputs, 17) {
        Err(EvalError::OutputDesc { index, node, .. }) => {
            assert_eq!((index, node.as_str()), (0, "my_add"))
        }
        other => panic!("expected an output descriptor error, got {other:?}"),
    }
    // Inputs the operator's checks refuse (shapes that do not broadcast).
    let y = Tensor::from_f32s(vec![4], &[1.0; 4]);
    assert!(matches!(
        eval_node(&add, &[Some(&x), Some(&y)], &add.outputs, 17),
        Err(EvalError::Infer { .. })
    ));
    // Unknown operators and the gear nodes that need more than a node.
    for op in ["LSTM", "Case", "GetDynamicDims"] {
        let n = op_node(op, vec![desc(DataType::F32, &[1])]);
        match eval_node(&n, &[], &n.outputs, 17) {
            Err(EvalError::Unsupported { op: o, .. }) => assert_eq!(o, op),
            other => panic!("{op}: expected unsupported, got {other:?}"),
        }
    }
}

#[test]
fn a_constant_node_takes_its_value_from_the_registry() {
    // The importer turns ONNX Constants into Const nodes, so only a hand-built graph has one.
    let mut n = op_node("Constant", vec![desc(DataType::F32, &[3])]);
    n.attrs
        .insert("value_floats".into(), Attr::Floats(vec![1.5, -2.0, 0.25]));
    let out = eval_node(&n, &[], &n.outputs, 17).unwrap();
    assert_eq!(out, vec![Tensor::from_f32s(vec![3], &[1.5, -2.0, 0.25])]);
    n.attrs.clear();
    n.attrs.insert("value_int".into(), Attr::Int(-7));
    n.outputs = vec![desc(DataType::I64, &[])];
    let out = eval_node(&n, &[], &n.outputs, 17).unwrap();
    assert_eq!(out, vec![Tensor::from_i64s(vec![], &[-7])]);
}

#[test]
fn softmax_before_opset_13_normalizes_the_flattened_trailing_dims() {
    let n = op_node("Softmax", vec![desc(DataType::F32, &[2, 2, 2])]);
    let v: Vec<f32> = (0..8).map(|i| i as f32 * 0.5).collect();
    let x = Tensor::from_f32s(vec![2, 2, 2], &v);
    let old = eval_node(&n, &[Some(&x)], &n.outputs, 12).unwrap()[0].to_f64s();
    let new = eval_node(&n, &[Some(&x)], &n.outputs, 13).unwrap()[0].to_f64s();
    // Opset 12, axis 1: each image's four values sum to one; opset 13, axis -1: each pair.
    for img in old.chunks(4) {
        assert!((img.iter().sum::<f64>() - 1.0).abs() < 1e-6, "{old:?}");
    }
    let e = |d: f64| d.exp();
    let first = e(0.0) / (e(0.0) + e(0.5) + e(1.0) + e(1.5));
    assert!((old[0] - first).abs() < 1e-7, "{old:?}");
    let pair = e(0.0) / (e(0.0) + e(0.5));
    assert!((new[0] - pair).abs() < 1e-7, "{new:?}");
}

#[test]
fn f16_conversion_rounds_once_to_nearest_even() {
    let f16 = |bits: u16| half::f16::from_bits(bits).to_f64();
    // Every finite f16 reads back; between neighbours, the midpoint goes to the even one and
    // anything off the midpoint (however slightly) to the nearer.
    for bits in 0u16..0x7c00 {
        for sign in [0, 0x8000] {
            let b = bits | sign;
            assert_eq!(f64_to_f16_bits(f16(b)), b, "{b:#06x}");
        }
    }
    for bits in 0u16..0x7bff {
        let (lo, hi) = (f16(bits), f16(bits + 1));
        let mid = (lo + hi) / 2.0;
        let even = if bits % 2 == 0 { bits } else { bits + 1 };
        assert_eq!(f64_to_f16_bits(mid), even, "midpoint above {bits:#06x}");
        assert_eq!(
            f64_to_f16_bits(mid.next_up()),
            bits + 1,
            "above {bits:#06x}"
        );
        assert_eq!(f64_to_f16_bits(mid.next_down()), bits, "below {bits:#06x}");
        assert_eq!(
            f64_to_f16_bits(-mid),
            even | 0x8000,
            "-midpoint {bits:#06x}"
        );
    }
    // Past the largest finite value (65504, odd): the tie at 65520 goes to infinity.
    assert_eq!(f64_to_f16_bits(65520f64.next_down()), 0x7bff);
    assert_eq!(f64_to_f16_bits(65520.0), 0x7c00);
    assert_eq!(f64_to_f16_bits(f64::INFINITY), 0x7c00);
    assert_eq!(f64_to_f16_bits(f64::NEG_INFINITY), 0xfc00);
    assert!(half::f16::from_bits(f64_to_f16_bits(f64::NAN)).is_nan());
    // Below half the smallest subnormal everything is zero; exactly half is a tie to zero.
    assert_eq!(f64_to_f16_bits(2f64.powi(-25)), 0);
    assert_eq!(f64_to_f16_bits(2f64.powi(-25).next_up()), 1);
}

// ---------------------------------------------------------------------------------------------
// The test CNN: speed, and a batch evaluates as its images one at a time.

fn cnn() -> Model {
    onnx::import_file(models().join("cnn.onnx")).unwrap().model
}

#[test]
fn the_cnn_batch_evaluates_fast_and_like_its_images() {
    let model = cnn();
    let mut rng = StdRng::seed_from_u64(11);
    let x = random_f32(&mut rng, &[8, 3, 32, 32]);
    let feeds = BTreeMap::from([("input".to_string(), x.clone())]);
    let start = Instant::now();
    let out = eval_graph(&model.graph, &feeds, model.opset).unwrap();
    let took = start.elapsed();
    assert_eq!(out[0].dims, vec![8, 10]);
    // A guard against quadratic blowups, loose enough for a loaded machine; the figure is
    // printed for the record (`--nocapture`). Unoptimised builds are not timed.
    eprintln!("cnn.onnx batch 8 evaluated in {took:?}");
    if !cfg!(debug_assertions) {
        assert!(took.as_secs_f64() < 2.0, "took {took:?}");
    }
    let image = 3 * 32 * 32 * 4;
    for i in 0..8 {
        let one = Tensor::new(
            DataType::F32,
            vec![1, 3, 32, 32],
            x.data[i * image..(i + 1) * image].to_vec(),
        )
        .unwrap();
        let single = eval_graph(
            &model.graph,
            &BTreeMap::from([("input".to_string(), one)]),
            model.opset,
        )
        .unwrap();
        assert_eq!(
            single[0].data[..],
            out[0].data[i * 40..(i + 1) * 40],
            "image {i}"
        );
    }
}

/// A graph whose NetOutput reads nothing evaluates to no outputs; one without a NetOutput is a
/// graph error.
#[test]
fn graphs_need_exactly_one_net_output() {
    let mut g = Graph::new("empty");
    g.add(Node::new("out", "NetOutput", vec![], vec![]));
    assert_eq!(
        eval_graph(&g, &BTreeMap::new(), 17).unwrap(),
        Vec::<Tensor>::new()
    );
    let g = Graph::new("none");
    assert!(matches!(
        eval_graph(&g, &BTreeMap::new(), 17),
        Err(EvalError::Graph { .. })
    ));
}

/// u64 values beyond i64's range compare, divide and take maxima as unsigned numbers (the
/// evaluator uses the AI CPU's element-wise code for them, as the device runs them there).
#[test]
fn u64_values_beyond_i64_stay_unsigned() {
    let u64s = |v: &[u64]| {
        Tensor::new(
            DataType::U64,
            vec![v.len() as i64],
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
        .unwrap()
    };
    let (a, b) = (u64s(&[u64::MAX, 7, 1 << 63]), u64s(&[3, 2, 1]));
    let desc = |t: DataType| vec![TensorDesc::new(t, fixed_shape(&[3]))];
    let less = eval_node(
        &op_node("Less", desc(DataType::Bool)),
        &[Some(&a), Some(&b)],
        &desc(DataType::Bool),
        18,
    )
    .unwrap();
    assert_eq!(less[0].to_i64s(), [0, 0, 0]);
    let div = eval_node(
        &op_node("Div", desc(DataType::U64)),
        &[Some(&a), Some(&b)],
        &desc(DataType::U64),
        18,
    )
    .unwrap();
    assert_eq!(div[0], u64s(&[u64::MAX / 3, 3, 1 << 63]));
    let max = eval_node(
        &op_node("Max", desc(DataType::U64)),
        &[Some(&a), Some(&b)],
        &desc(DataType::U64),
        18,
    )
    .unwrap();
    assert_eq!(max[0], a);
}
