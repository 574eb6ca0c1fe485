//! ONNX import: the committed test models (`tests/models/*.onnx`, made by `make_models.py`)
//! import to the expected graphs, malformed models built here with the prost messages give the
//! expected errors, and no truncation or single-byte corruption of a file panics.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gearsim_compiler::ir::{Attr, DataType, Graph, Model, TensorDesc};
use gearsim_compiler::onnx::proto::{
    AttributeProto, AttributeType, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto,
};
use gearsim_compiler::onnx::{Imported, OnnxError, import, import_file};
use gearsim_compiler::symbolic::Dim;
use prost::Message as _;

use super::onnx_build::{f32_init, node, tensor_type, value_info};

fn model_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/models")
        .join(name)
}

fn model_bytes(name: &str) -> Vec<u8> {
    std::fs::read(model_path(name)).unwrap()
}

/// How many nodes of each operator type the graph has.
fn op_counts(g: &Graph) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for n in &g.nodes {
        *out.entry(n.op.clone()).or_insert(0) += 1;
    }
    out
}

fn counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn output_names(m: &Model) -> Vec<String> {
    let last = m.graph.nodes.last().unwrap();
    assert_eq!(last.op, "NetOutput");
    match last.attr("output_names") {
        Some(Attr::Strs(v)) => v.clone(),
        other => panic!("output_names is {other:?}"),
    }
}

#[test]
fn cnn_imports_with_its_layers_weights_and_dynamic_batch() {
    let imported = import_file(model_path("cnn.onnx")).unwrap();
    let Imported { model, inputs } = &imported;
    let g = &model.graph;
    g.check().unwrap();
    assert_eq!(model.opset, 17);
    assert!(model.subgraphs.is_empty());

    assert_eq!(inputs.len(), 1);
    assert_eq!(inputs[0].name, "input");
    assert_eq!(inputs[0].dtype, DataType::F32);
    assert_eq!(inputs[0].dims, vec![None, Some(3), Some(32), Some(32)]);
    let data = g.node(inputs[0].node);
    assert_eq!(data.op, "Data");
    assert_eq!(data.name, "input");
    assert_eq!(data.int("index"), Some(0));
    assert_eq!(
        data.outputs[0].shape,
        vec![
            Dim::Fixed(-1),
            Dim::Fixed(3),
            Dim::Fixed(32),
            Dim::Fixed(32)
        ]
    );

    assert_eq!(
        op_counts(g),
        counts(&[
            ("Add", 1),
            ("BatchNormalization", 4),
            ("Const", 24),
            ("Conv", 5),
            ("Data", 1),
            ("Flatten", 1),
            ("Gemm", 1),
            ("GlobalAveragePool", 1),
            ("MaxPool", 1),
            ("NetOutput", 1),
            ("Relu", 5),
        ])
    );
    assert_eq!(g.nodes.len(), 45);
    // Data first, then the initializers in file order, the operators, and NetOutput last.
    assert_eq!(g.nodes[0].op, "Data");
    assert!(g.nodes[1..25].iter().all(|n| n.op == "Const"));
    assert_eq!(g.nodes[1].name, "conv1.weight");
    assert_eq!(output_names(model), vec!["logits".to_string()]);

    let w = g.node(g.find("conv1.weight").unwrap());
    let t = w.tensor("value").unwrap();
    assert_eq!(t.dtype, DataType::F32);
    assert_eq!(t.dims, vec![16, 3, 3, 3]);
    assert_eq!(t.len(), 16 * 27);
    assert_eq!(w.outputs[0], TensorDesc::of(t));

    let dw = g.node(g.find("/dw/Conv").unwrap());
    assert_eq!(dw.int("group"), Some(16));
    assert_eq!(dw.ints("strides"), Some(&[2, 2][..]));
    assert_eq!(dw.ints("pads"), Some(&[1, 1, 1, 1][..]));
    assert_eq!(g.node(dw.inputs[1].unwrap().node).name, "dw.weight");
    // Operator outputs are placeholders until shape inference.
    assert_eq!(dw.outputs.len(), 1);
    assert!(dw.outputs[0].shape.is_empty());

    let gemm = g.node(g.find("/fc/Gemm").unwrap());
    assert_eq!(gemm.int("transB"), Some(1));
    assert_eq!(gemm.float("alpha"), Some(1.0));
    assert_eq!(gemm.inputs.len(), 3);

    let add = g.node(g.find("/layer1.0/Add").unwrap());
    assert_eq!(g.node(add.inputs[1].unwrap().node).name, "/relu/Relu");

    // The same file gives the same model.
    let again = import(&model_bytes("cnn.onnx"), "cnn.onnx").unwrap();
    assert_eq!(again, imported);
    assert_eq!(again.model.dump(), imported.model.dump());
}

#[test]
fn transformer_imports_with_its_shape_chains_and_constants() {
    let Imported { model, inputs } = import_file(model_path("transformer.onnx")).unwrap();
    let g = &model.graph;
    g.check().unwrap();
    assert_eq!(model.opset, 20);
    assert_eq!(inputs.len(), 1);
    assert_eq!(inputs[0].name, "x");
    assert_eq!(inputs[0].dims, vec![Some(1), None, Some(64)]);
    assert_eq!(
        g.node(inputs[0].node).outputs[0].shape,
        vec![Dim::Fixed(1), Dim::Fixed(-1), Dim::Fixed(64)]
    );

    // 16 initializers and 10 Constant nodes become Const nodes.
    assert_eq!(
        op_counts(g),
        counts(&[
            ("Add", 8),
            ("Concat", 2),
            ("Const", 26),
            ("Data", 1),
            ("Div", 1),
            ("Gather", 2),
            ("Gelu", 1),
            ("LayerNormalization", 2),
            ("MatMul", 8),
            ("NetOutput", 1),
            ("Reshape", 4),
            ("Shape", 2),
            ("Softmax", 1),
            ("Transpose", 5),
            ("Unsqueeze", 2),
        ])
    );
    assert_eq!(g.nodes.len(), 66);
    assert_eq!(output_names(&model), vec!["y".to_string()]);

    let div = g.node(g.find("/attn/Div").unwrap());
    let scale = g.node(div.inputs[1].unwrap().node);
    assert_eq!(scale.op, "Const");
    assert_eq!(scale.name, "/attn/Constant");
    let t = scale.tensor("value").unwrap();
    assert_eq!(
        (t.dtype, t.dims.clone(), t.to_f64s()),
        (DataType::F32, vec![], vec![4.0])
    );

    let gather = g.node(g.find("/attn/split/Gather").unwrap());
    assert_eq!(g.node(gather.inputs[0].unwrap().node).op, "Shape");
    let index = g
        .node(gather.inputs[1].unwrap().node)
        .tensor("value")
        .unwrap();
    assert_eq!(
        (index.dtype, index.dims.clone(), index.to_i64s()),
        (DataType::I64, vec![], vec![1])
    );

    let concat = g.node(g.find("/attn/split/Concat").unwrap());
    assert_eq!(concat.inputs.len(), 4);
    let parts: Vec<&str> = concat
        .inputs
        .iter()
        .map(|v| g.node(v.unwrap().node).op.as_str())
        .collect();
    assert_eq!(parts, vec!["Const", "Unsqueeze", "Const", "Const"]);
    let reshape = g.node(g.find("/attn/q/Reshape").unwrap());
    assert_eq!(
        reshape.inputs[1].unwrap().node,
        g.find("/attn/split/Concat").unwrap()
    );

    let gelu = g.node(g.find("/ffn/Gelu").unwrap());
    assert_eq!(gelu.string("approximate"), Some("none"));
    let softmax = g.node(g.find("/attn/Softmax").unwrap());
    assert_eq!(softmax.int("axis"), Some(-1));
    let kt = g.node(g.find("/attn/k/Transpose_1").unwrap());
    assert_eq!(kt.ints("perm"), Some(&[0, 1, 3, 2][..]));
    let w1 = g.node(g.find("ffn.fc1.weight_t").unwrap());
    assert_eq!(w1.tensor("value").unwrap().dims, vec![64, 128]);
}

#[test]
fn tiny_add_imports_two_data_nodes_in_input_order() {
    let Imported { model, inputs } = import_file(model_path("tiny_add.onnx")).unwrap();
    let g = &model.graph;
    assert_eq!(
        g.nodes.iter().map(|n| n.op.as_str()).collect::<Vec<_>>(),
        vec!["Data", "Data", "Add", "NetOutput"]
    );
    assert_eq!(inputs.len(), 2);
    for (k, (info, name)) in inputs.iter().zip(["a", "b"]).enumerate() {
        assert_eq!(info.name, name);
        assert_eq!(info.dims, vec![Some(2), Some(3)]);
        assert_eq!(g.node(info.node).int("index"), Some(k as i64));
    }
    let add = &g.nodes[2];
    assert_eq!(add.name, "add");
    assert_eq!(add.inputs.len(), 2);
    assert_eq!(add.inputs[0].unwrap().node, inputs[0].node);
    assert_eq!(add.inputs[1].unwrap().node, inputs[1].node);
    assert_eq!(
        g.nodes[3].inputs,
        vec![Some(gearsim_compiler::ir::Value {
            node: gearsim_compiler::ir::NodeId(2),
            output: 0
        })]
    );
}

/// The typed fields as the reference `onnx.helper` writes them decode to the right bytes.
#[test]
fn tiny_typed_decodes_every_typed_field_and_names_nodes_uniquely() {
    let Imported { model, .. } = import_file(model_path("tiny_typed.onnx")).unwrap();
    let g = &model.graph;
    g.check().unwrap();
    let value = |name: &str| {
        g.node(g.find(name).unwrap_or_else(|| panic!("no node {name}")))
            .tensor("value")
            .unwrap()
            .clone()
    };
    let f32_typed = value("f32_typed");
    assert_eq!(f32_typed, value("f32_raw"));
    assert_eq!(f32_typed.to_f64s(), vec![1.5, -2.0, 0.25, 8.0]);
    let f16 = value("f16_typed");
    assert_eq!(f16.dtype, DataType::F16);
    assert_eq!(f16.to_f64s(), vec![1.0, -0.5, 65504.0]);
    assert_eq!(value("i8_typed").to_i64s(), vec![-128, 0, 127]);
    assert_eq!(value("u8_typed").to_i64s(), vec![0, 1, 255]);
    assert_eq!(value("i16_typed").to_i64s(), vec![-32768, 32767]);
    let b = value("bool_typed");
    assert_eq!(
        (b.dtype, b.data.as_slice()),
        (DataType::Bool, &[1u8, 0, 1][..])
    );
    assert_eq!(value("i32_typed").to_i64s(), vec![-7, 2147483647]);
    assert_eq!(value("i64_typed").to_i64s(), vec![-9, 9007199254740993]);
    assert_eq!(value("f64_typed").to_f64s(), vec![0.1, -3.0]);
    let scalar = value("scalar_i64");
    assert_eq!((scalar.dims.clone(), scalar.to_i64s()), (vec![], vec![42]));

    // The unnamed Constant and Add get `<op>_<k>`; the second `add` becomes `add_1`.
    let c = value("Constant_0");
    assert_eq!(
        (c.dims.clone(), c.to_f64s()),
        (vec![4], vec![0.5, 1.0, 2.0, 4.0])
    );
    assert_eq!(g.node(g.find("Add_0").unwrap()).op, "Add");
    assert_eq!(g.node(g.find("Add_1").unwrap()).op, "Add");
    assert!(g.find("add").is_some() && g.find("add_1").is_some());
    let clip = g.node(g.find("clip").unwrap());
    assert_eq!(clip.inputs.len(), 3);
    assert!(clip.inputs[0].is_some() && clip.inputs[1].is_none() && clip.inputs[2].is_some());
    assert_eq!(
        output_names(&model),
        vec!["out".to_string(), "out_again".to_string()]
    );
}

/// Imports without panicking; an import that succeeds gives a consistent graph.
fn import_never_panics(bytes: &[u8], what: &str) {
    let result = std::panic::catch_unwind(|| import(bytes, "fuzz.onnx"));
    match result {
        Ok(Ok(imported)) => {
            if let Err(e) = imported.model.graph.check() {
                panic!("{what}: imported graph fails its check: {e}");
            }
        }
        Ok(Err(e)) => {
            let msg = e.to_string();
            assert!(msg.starts_with("fuzz.onnx: "), "{what}: {msg}");
        }
        Err(_) => panic!("{what}: import panicked"),
    }
}

#[test]
fn truncated_and_corrupted_files_give_errors_not_panics() {
    let bytes = model_bytes("tiny_add.onnx");
    import(&bytes, "tiny_add.onnx").unwrap();
    for len in 0..bytes.len() {
        import_never_panics(&bytes[..len], &format!("truncated to {len} bytes"));
    }
    let r = import(&bytes[..bytes.len() / 2], "tiny_add.onnx");
    assert!(matches!(r, Err(OnnxError::Malformed { .. })), "{r:?}");
    let mut copy = bytes.clone();
    for pos in 0..bytes.len() {
        for v in 0..=255u8 {
            if v == bytes[pos] {
                continue;
            }
            copy[pos] = v;
            import_never_panics(&copy, &format!("byte {pos} set to {v:#04x}"));
        }
        copy[pos] = bytes[pos];
    }
    // The file with tensors in every typed field, with fewer corruptions per byte.
    let bytes = model_bytes("tiny_typed.onnx");
    let mut copy = bytes.clone();
    for pos in 0..bytes.len() {
        for mask in [0x01u8, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff] {
            copy[pos] = bytes[pos] ^ mask;
            import_never_panics(&copy, &format!("tiny_typed byte {pos} xor {mask:#04x}"));
        }
        copy[pos] = bytes[pos];
    }
    for len in 0..bytes.len() {
        import_never_panics(
            &bytes[..len],
            &format!("tiny_typed truncated to {len} bytes"),
        );
    }
}

// Builders for malformed models.

/// A model around `nodes`: input `x` [2, 3], initializer `w` [3], output `y`, opset 17.
fn model_with(nodes: Vec<NodeProto>) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "onnx_import test".into(),
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: vec![f32_init("w", &[3], &[1.0, 2.0, 3.0])],
            input: vec![value_info("x", &[Some(2), Some(3)])],
            output: vec![value_info("y", &[Some(2), Some(3)])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn add_model() -> ModelProto {
    model_with(vec![node("Add", "add", &["x", "w"], &["y"])])
}

fn run(m: &ModelProto) -> Result<Imported, OnnxError> {
    import(&m.encode_to_vec(), "bad.onnx")
}

fn err(m: &ModelProto) -> OnnxError {
    match run(m) {
        Ok(i) => panic!("expected an error, got\n{}", i.model.dump()),
        Err(e) => e,
    }
}

#[test]
fn the_built_model_imports() {
    let i = run(&add_model()).unwrap();
    assert_eq!(
        i.model
            .graph
            .nodes
            .iter()
            .map(|n| n.op.as_str())
            .collect::<Vec<_>>(),
        vec!["Data", "Const", "Add", "NetOutput"]
    );
}

#[test]
fn unsupported_domain_names_the_node_op_and_domain() {
    let mut n = node("FusedThing", "fused", &["x", "w"], &["y"]);
    n.domain = "com.microsoft".into();
    let e = err(&model_with(vec![n]));
    assert!(
        matches!(&e, OnnxError::UnsupportedDomain { node, op, domain, .. }
            if node == "fused" && op == "FusedThing" && domain == "com.microsoft"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "bad.onnx: node `fused` (FusedThing) is in domain `com.microsoft`; only the default ONNX \
         domain (\"\" or \"ai.onnx\") is supported"
    );
    // `ai.onnx` is the default domain spelled out.
    let mut n = node("Add", "add", &["x", "w"], &["y"]);
    n.domain = "ai.onnx".into();
    run(&model_with(vec![n])).unwrap();
}

#[test]
fn a_missing_value_name_is_an_error_naming_node_input_and_value() {
    let e = err(&model_with(vec![node(
        "Add",
        "add",
        &["x", "nope"],
        &["y"],
    )]));
    assert_eq!(
        e.to_string(),
        "bad.onnx: node `add` (Add) input 1 `nope` is not produced by any node, graph input or \
         initializer"
    );
    let e = err(&model_with(vec![node("Add", "add", &["x", "w"], &["z"])]));
    assert!(
        matches!(&e, OnnxError::Output { output, .. } if output == "y"),
        "{e:?}"
    );
}

#[test]
fn nodes_out_of_topological_order_are_an_error() {
    let e = err(&model_with(vec![
        node("Relu", "second", &["t"], &["y"]),
        node("Neg", "first", &["x"], &["t"]),
    ]));
    assert!(
        matches!(&e, OnnxError::NotTopological { node, producer, name, .. }
            if node == "second" && &**producer == "first" && name == "t"),
        "{e:?}"
    );
    assert!(e.to_string().contains("topological order"), "{e}");
}

#[test]
fn graph_attributes_are_refused_with_node_and_attribute() {
    let mut n = node("If", "branch", &["x"], &["y"]);
    n.attribute.push(AttributeProto {
        name: "then_branch".into(),
        r#type: AttributeType::Graph as i32,
        g: Some(GraphProto::default()),
        ..Default::default()
    });
    let e = err(&model_with(vec![n]));
    assert!(
        matches!(&e, OnnxError::UnsupportedAttribute { node, op, attr, kind, .. }
            if node == "branch" && op == "If" && attr == "then_branch" && *kind == AttributeType::Graph),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("attribute `then_branch` is of type GRAPH"),
        "{e}"
    );
}

#[test]
fn opsets_outside_1_to_27_are_refused() {
    // Older forms of single operators are refused at inference (`ops::first_opset`).
    for (opset, ok) in [
        (0, false),
        (1, true),
        (12, true),
        (13, true),
        (25, true),
        (27, true),
        (28, false),
    ] {
        let mut m = add_model();
        m.opset_import = vec![
            OperatorSetIdProto {
                domain: "ai.onnx.ml".into(),
                version: 3,
            },
            OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            },
        ];
        match run(&m) {
            Ok(i) => {
                assert!(ok, "opset {opset} imported");
                assert_eq!(i.model.opset, opset);
            }
            Err(e) => {
                assert!(!ok, "opset {opset}: {e}");
                assert!(
                    matches!(e, OnnxError::UnsupportedOpset { opset: o, .. } if o == opset),
                    "{e:?}"
                );
                assert_eq!(
                    e.to_string().split(';').next().unwrap(),
                    format!("bad.onnx: opset {opset} is not supported (1..=27)")
                );
            }
        }
    }
    let mut m = add_model();
    m.opset_import.clear();
    assert!(matches!(err(&m), OnnxError::NoOpset { .. }));
}

#[test]
fn attributes_convert_to_ir_values() {
    let mut n = node("Custom", "", &["x", "", "w"], &["y", ""]);
    let attr = |name: &str, t: AttributeType| AttributeProto {
        name: name.into(),
        r#type: t as i32,
        ..Default::default()
    };
    n.attribute = vec![
        AttributeProto {
            f: 0.5,
            ..attr("f", AttributeType::Float)
        },
        AttributeProto {
            i: -3,
            ..attr("i", AttributeType::Int)
        },
        AttributeProto {
            s: b"same".to_vec(),
            ..attr("s", AttributeType::String)
        },
        AttributeProto {
            floats: vec![1.0, 2.5],
            ..attr("fs", AttributeType::Floats)
        },
        AttributeProto {
            ints: vec![1, -1],
            ..attr("is", AttributeType::Ints)
        },
        AttributeProto {
            strings: vec![b"a".to_vec(), b"bc".to_vec()],
            ..attr("ss", AttributeType::Strings)
        },
        AttributeProto {
            t: Some(f32_init("", &[2], &[7.0, 8.0])),
            ..attr("t", AttributeType::Tensor)
        },
    ];
    let i = run(&model_with(vec![n])).unwrap();
    let g = &i.model.graph;
    let c = g.node(g.find("Custom_0").unwrap());
    assert_eq!(c.inputs.len(), 3);
    assert!(c.inputs[1].is_none());
    assert_eq!(c.outputs.len(), 2);
    assert_eq!(c.float("f"), Some(0.5));
    assert_eq!(c.int("i"), Some(-3));
    assert_eq!(c.string("s"), Some("same"));
    assert_eq!(c.attr("fs"), Some(&Attr::Floats(vec![1.0, 2.5])));
    assert_eq!(c.ints("is"), Some(&[1, -1][..]));
    assert_eq!(
        c.attr("ss"),
        Some(&Attr::Strs(vec!["a".into(), "bc".into()]))
    );
    assert_eq!(c.tensor("t").unwrap().to_f64s(), vec![7.0, 8.0]);
}

#[test]
fn invalid_utf8_strings_are_errors_not_lossy() {
    let mut n = node("Gelu", "gelu", &["x"], &["y"]);
    n.attribute.push(AttributeProto {
        name: "approximate".into(),
        r#type: AttributeType::String as i32,
        s: vec![b'n', 0xff, b'e'],
        ..Default::default()
    });
    let e = err(&model_with(vec![n]));
    assert!(
        matches!(&e, OnnxError::Node { node, .. } if node == "gelu"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("`approximate` is not valid UTF-8"),
        "{e}"
    );
}

#[test]
fn constant_nodes_become_const_nodes() {
    let attr_node = |name: &str, a: AttributeProto| {
        let mut n = node("Constant", name, &[], &[name]);
        n.attribute.push(a);
        n
    };
    let nodes = vec![
        attr_node(
            "cf",
            AttributeProto {
                name: "value_float".into(),
                r#type: AttributeType::Float as i32,
                f: 2.0,
                ..Default::default()
            },
        ),
        attr_node(
            "ci",
            AttributeProto {
                name: "value_int".into(),
                r#type: AttributeType::Int as i32,
                i: 5,
                ..Default::default()
            },
        ),
        attr_node(
            "cis",
            AttributeProto {
                name: "value_ints".into(),
                r#type: AttributeType::Ints as i32,
                ints: vec![1, 2, 3],
                ..Default::default()
            },
        ),
        node("Add", "add", &["x", "cf"], &["y"]),
    ];
    let i = run(&model_with(nodes)).unwrap();
    let g = &i.model.graph;
    let cf = g.node(g.find("cf").unwrap());
    assert_eq!(cf.op, "Const");
    assert_eq!(cf.outputs[0], TensorDesc::of(cf.tensor("value").unwrap()));
    assert_eq!(cf.tensor("value").unwrap().to_f64s(), vec![2.0]);
    let ci = g.node(g.find("ci").unwrap()).tensor("value").unwrap();
    assert_eq!((ci.dtype, ci.dims.clone()), (DataType::I64, vec![]));
    let cis = g.node(g.find("cis").unwrap()).tensor("value").unwrap();
    assert_eq!((cis.dims.clone(), cis.to_i64s()), (vec![3], vec![1, 2, 3]));
    assert_eq!(
        g.node(g.find("add").unwrap()).inputs[1].unwrap().node,
        g.find("cf").unwrap()
    );

    let e = err(&model_with(vec![node("Constant", "empty", &[], &["y"])]));
    assert!(
        matches!(&e, OnnxError::Node { node, .. } if node == "empty"),
        "{e:?}"
    );
}

#[test]
fn bad_initializers_are_errors_before_any_allocation() {
    // External data.
    let mut m = add_model();
    let g = m.graph.as_mut().unwrap();
    g.initializer[0].raw_data = None;
    g.initializer[0].data_location = 1;
    g.initializer[0].external_data = vec![StringStringEntryProto {
        key: "location".into(),
        value: "weights.bin".into(),
    }];
    let e = err(&m);
    assert!(
        matches!(&e, OnnxError::Initializer { tensor, .. } if tensor == "w"),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("external data is not supported"),
        "{e}"
    );

    // String tensors.
    let mut m = add_model();
    let g = m.graph.as_mut().unwrap();
    g.initializer[0] = TensorProto {
        name: "w".into(),
        dims: vec![1],
        data_type: 8,
        string_data: vec![b"s".to_vec()],
        ..Default::default()
    };
    assert!(
        err(&m)
            .to_string()
            .contains("string tensors are not supported")
    );

    // Dims claiming far more than the bytes present, and dims that overflow.
    for dims in [vec![1 << 40, 1 << 20], vec![i64::MAX, 2], vec![-1, 3]] {
        let mut m = add_model();
        m.graph.as_mut().unwrap().initializer[0].dims = dims.clone();
        let e = err(&m);
        assert!(
            matches!(&e, OnnxError::Initializer { .. }),
            "{dims:?}: {e:?}"
        );
    }
    let mut m = add_model();
    m.graph.as_mut().unwrap().initializer[0].dims = vec![4];
    assert!(
        err(&m)
            .to_string()
            .contains("raw_data holds 12 bytes; the f32 tensor of dims [4] needs 16")
    );

    // Typed fields of the wrong kind or length, and int32_data out of range.
    let mut m = add_model();
    m.graph.as_mut().unwrap().initializer[0] = TensorProto {
        name: "w".into(),
        dims: vec![3],
        data_type: 1,
        int64_data: vec![1, 2, 3],
        ..Default::default()
    };
    assert!(err(&m).to_string().contains("has data in int64_data"));
    let mut m = add_model();
    m.graph.as_mut().unwrap().initializer[0] = TensorProto {
        name: "w".into(),
        dims: vec![2],
        data_type: 3,
        int32_data: vec![1, 300],
        ..Default::default()
    };
    assert!(err(&m).to_string().contains("int32_data[1] is 300"));

    // Unsupported element types (complex64).
    let mut m = add_model();
    m.graph.as_mut().unwrap().initializer[0].data_type = 14;
    assert!(
        err(&m)
            .to_string()
            .contains("14 (COMPLEX64) is not supported")
    );
}

#[test]
fn graph_level_problems_are_errors() {
    // No graph.
    let mut m = add_model();
    m.graph = None;
    assert!(matches!(err(&m), OnnxError::EmptyGraph { .. }));
    // No outputs.
    let mut m = add_model();
    m.graph.as_mut().unwrap().output.clear();
    assert!(matches!(err(&m), OnnxError::EmptyGraph { .. }));
    // Duplicate input names.
    let mut m = add_model();
    let g = m.graph.as_mut().unwrap();
    g.input.push(value_info("x", &[Some(1)]));
    let e = err(&m);
    assert!(
        matches!(&e, OnnxError::Input { input, .. } if input == "x"),
        "{e:?}"
    );
    assert!(e.to_string().contains("listed twice"), "{e}");
    // Unsupported input type.
    let mut m = add_model();
    m.graph.as_mut().unwrap().input[0].r#type = Some(tensor_type(15, &[Some(2)]));
    assert!(
        err(&m)
            .to_string()
            .contains("graph input `x`: element type 15 (COMPLEX128)")
    );
    // A value produced twice.
    let e = err(&model_with(vec![
        node("Relu", "a", &["x"], &["y"]),
        node("Relu", "b", &["x"], &["y"]),
    ]));
    assert!(e.to_string().contains("already produced by `a`"), "{e}");
    // Not a model at all.
    let e = import(b"\xff\xff\xff\xff", "junk.onnx").unwrap_err();
    assert!(
        matches!(&e, OnnxError::Malformed { file, .. } if file == "junk.onnx"),
        "{e:?}"
    );
    // A missing file.
    let e = import_file(model_path("no_such.onnx")).unwrap_err();
    assert!(matches!(e, OnnxError::Io { .. }));
}

#[test]
fn initializers_listed_as_inputs_are_constants_and_names_stay_unique() {
    let mut m = model_with(vec![
        node("Add", "w", &["x", "w"], &["t"]),
        node("Relu", "", &["t"], &["y"]),
    ]);
    let g = m.graph.as_mut().unwrap();
    g.input.push(value_info("w", &[Some(3)]));
    let i = run(&m).unwrap();
    assert_eq!(i.inputs.len(), 1);
    let g = &i.model.graph;
    // The Add named like the initializer becomes `w_1`; the unnamed Relu `Relu_0`.
    assert_eq!(
        g.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
        vec!["x", "w", "w_1", "Relu_0", "NetOutput"]
    );
}

#[test]
fn a_name_repeated_many_times_gets_suffixes_in_linear_time() {
    let mut nodes = vec![node("Relu", "r", &["x"], &["t0"])];
    for k in 1..5000 {
        let input = format!("t{}", k - 1);
        let output = if k == 4999 {
            "y".to_string()
        } else {
            format!("t{k}")
        };
        nodes.push(node("Relu", "r", &[&input], &[&output]));
    }
    let i = run(&model_with(nodes)).unwrap();
    let g = &i.model.graph;
    g.check().unwrap();
    assert_eq!(g.nodes[2].name, "r");
    assert_eq!(g.nodes[3].name, "r_1");
    assert_eq!(g.nodes[5001].name, "r_4999");
}

#[test]
fn deeply_nested_messages_are_a_decode_error_not_a_stack_overflow() {
    let mut g = GraphProto::default();
    for _ in 0..200 {
        let mut n = node("If", "", &[], &[]);
        n.attribute.push(AttributeProto {
            name: "then_branch".into(),
            r#type: AttributeType::Graph as i32,
            g: Some(g),
            ..Default::default()
        });
        g = GraphProto {
            node: vec![n],
            ..Default::default()
        };
    }
    let mut m = add_model();
    m.graph = Some(g);
    let e = err(&m);
    assert!(matches!(e, OnnxError::Malformed { .. }), "{e:?}");
}

/// Sub-byte tensors are packed in the proto (first element in the low bits) and held one per
/// byte, sign-extended when signed; a packed size that does not match the dims is an error.
#[test]
fn packed_sub_byte_tensors_unpack_one_element_per_byte() {
    use gearsim_compiler::onnx::decode_tensor_proto;
    let proto = |data_type: i32, dims: Vec<i64>, raw: Vec<u8>| {
        TensorProto {
            name: "t".into(),
            dims,
            data_type,
            raw_data: Some(raw),
            ..Default::default()
        }
        .encode_to_vec()
    };
    // INT4 [3]: 1, 2, -1 (0xf); the high nibble of the last byte is padding.
    let (_, t) = decode_tensor_proto(&proto(22, vec![3], vec![0x21, 0x0f])).unwrap();
    assert_eq!(t.data.as_slice(), &[1, 2, 0xff]);
    assert_eq!(t.to_i64s(), [1, 2, -1]);
    // UINT2 [5]: 3, 0, 1, 2 | 1.
    let (_, t) = decode_tensor_proto(&proto(25, vec![5], vec![0b1001_0011, 0b01])).unwrap();
    assert_eq!(t.to_i64s(), [3, 0, 1, 2, 1]);
    // int32_data holds one packed byte per value.
    let p = TensorProto {
        name: "t".into(),
        dims: vec![2],
        data_type: 21,
        int32_data: vec![0x5a],
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(decode_tensor_proto(&p).unwrap().1.to_i64s(), [10, 5]);
    let e = decode_tensor_proto(&proto(22, vec![3], vec![0x21])).unwrap_err();
    assert!(
        e.contains("raw_data holds 1 bytes; the i4 tensor of dims [3] needs 2"),
        "{e}"
    );
}
