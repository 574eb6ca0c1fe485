//! The standard operator library: inferred shapes against hand-computed ones (odd sizes and
//! symbolic dims included), the errors bad attributes and inputs produce, and constant folding
//! of the shape computations PyTorch exports.

use gearsim_compiler::{infer, ir, ops, symbolic};
use ir::{Attr, DataType, Graph, Node, NodeId, Tensor, TensorDesc, Value, fixed_shape};
use symbolic::{Dim, Symbol};

/// The default opset of these tests.
const OPSET: i64 = 17;

fn sym(name: &str, lo: i64, hi: i64) -> Dim {
    Dim::symbol(&Symbol {
        name: name.into(),
        lo,
        hi,
    })
}

/// The batch symbol `N` in [1, 8].
fn n() -> Dim {
    sym("N", 1, 8)
}

fn fx(dims: &[i64]) -> Vec<Dim> {
    fixed_shape(dims)
}

/// One input of the node under test.
enum In {
    /// A run-time value.
    Data(TensorDesc),
    /// A constant.
    Const(Tensor),
    /// An absent optional input.
    Absent,
}

fn data(dtype: DataType, shape: Vec<Dim>) -> In {
    In::Data(TensorDesc::new(dtype, shape))
}

fn f32d(dims: &[i64]) -> In {
    data(DataType::F32, fx(dims))
}

/// A 1-D int64 constant.
fn ints(v: &[i64]) -> In {
    In::Const(Tensor::from_i64s(vec![v.len() as i64], v))
}

/// A scalar int64 constant.
fn int0(v: i64) -> In {
    In::Const(Tensor::from_i64s(vec![], &[v]))
}

fn ai(v: i64) -> Attr {
    Attr::Int(v)
}

fn ais(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn astr(s: &str) -> Attr {
    Attr::Str(s.into())
}

/// Builds inputs -> node -> NetOutput, infers it, and returns the graph, the node's id and the
/// known values (or the error's text).
fn build(
    op: &str,
    inputs: Vec<In>,
    attrs: &[(&str, Attr)],
    outputs: usize,
    opset: i64,
) -> Result<(Graph, NodeId, infer::Known), String> {
    let mut g = Graph::new("t");
    let mut ins = Vec::new();
    for (k, i) in inputs.into_iter().enumerate() {
        match i {
            In::Data(d) => {
                let id = g.add(Node::new(format!("in{k}"), "Data", vec![], vec![d]));
                ins.push(Some(Value {
                    node: id,
                    output: 0,
                }));
            }
            In::Const(t) => {
                let mut c = Node::new(format!("in{k}"), "Const", vec![], vec![TensorDesc::of(&t)]);
                c.attrs.insert("value".into(), Attr::Tensor(t));
                let id = g.add(c);
                ins.push(Some(Value {
                    node: id,
                    output: 0,
                }));
            }
            In::Absent => ins.push(None),
        }
    }
    let placeholder = TensorDesc::new(DataType::F32, vec![]);
    let mut node = Node::new("node", op, ins, vec![placeholder; outputs]);
    for (k, v) in attrs {
        node.attrs.insert((*k).to_string(), v.clone());
    }
    let id = g.add(node);
    let outs = (0..outputs as u32)
        .map(|o| {
            Some(Value {
                node: id,
                output: o,
            })
        })
        .collect();
    g.add(Node::new("out", "NetOutput", outs, vec![]));
    let known = infer::infer_graph(&mut g, &ops::standard(), opset).map_err(|e| e.to_string())?;
    Ok((g, id, known))
}

/// The node's inferred outputs, or the error's text.
fn run_with(
    op: &str,
    inputs: Vec<In>,
    attrs: &[(&str, Attr)],
    outputs: usize,
    opset: i64,
) -> Result<Vec<TensorDesc>, String> {
    build(op, inputs, attrs, outputs, opset).map(|(g, id, _)| g.node(id).outputs.clone())
}

/// The shape of the node's only output.
fn shape(op: &str, inputs: Vec<In>, attrs: &[(&str, Attr)]) -> Vec<Dim> {
    match run_with(op, inputs, attrs, 1, OPSET) {
        Ok(o) => o[0].shape.clone(),
        Err(e) => panic!("{op} failed: {e}"),
    }
}

/// The error text, checked to contain every fragment.
fn fails(op: &str, inputs: Vec<In>, attrs: &[(&str, Attr)], fragments: &[&str]) {
    fails_at(op, inputs, attrs, OPSET, fragments);
}

/// The same for a node without attributes.
fn fails0(op: &str, inputs: Vec<In>, fragments: &[&str]) {
    fails_at(op, inputs, &[], OPSET, fragments);
}

fn fails_at(op: &str, inputs: Vec<In>, attrs: &[(&str, Attr)], opset: i64, fragments: &[&str]) {
    match run_with(op, inputs, attrs, 1, opset) {
        Ok(o) => panic!("{op} should fail, inferred {o:?}"),
        Err(e) => {
            for f in fragments {
                assert!(e.contains(f), "error of {op} lacks {f:?}:\n{e}");
            }
        }
    }
}

/// The folded value of the node's output 0.
fn folded(op: &str, inputs: Vec<In>, attrs: &[(&str, Attr)]) -> Tensor {
    let (_, id, known) = build(op, inputs, attrs, 1, OPSET).unwrap();
    known
        .get(&Value {
            node: id,
            output: 0,
        })
        .cloned()
        .unwrap_or_else(|| panic!("{op} did not fold"))
}

#[test]
fn registry_lists_every_operator() {
    let want = [
        "Add",
        "AveragePool",
        "BatchNormalization",
        "Cast",
        "Clip",
        "Concat",
        "Constant",
        "Conv",
        "Div",
        "Equal",
        "Erf",
        "Expand",
        "Flatten",
        "Gather",
        "Gelu",
        "Gemm",
        "GlobalAveragePool",
        "Identity",
        "LayerNormalization",
        "MatMul",
        "MatMulInteger",
        "MaxPool",
        "Mul",
        "Pow",
        "ReduceMean",
        "ReduceSum",
        "Relu",
        "Reshape",
        "Shape",
        "Sigmoid",
        "Slice",
        "Softmax",
        "Split",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Tanh",
        "Transpose",
        "Unsqueeze",
        "Where",
        // Issue 16's operators.
        "Abs",
        "And",
        "Ceil",
        "Celu",
        "ConstantOfShape",
        "Elu",
        "Exp",
        "Floor",
        "Greater",
        "GreaterOrEqual",
        "HardSigmoid",
        "HardSwish",
        "IsInf",
        "IsNaN",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "Log",
        "Max",
        "Mean",
        "Min",
        "Mod",
        "Neg",
        "Not",
        "Or",
        "PRelu",
        "CastLike",
        "ConvTranspose",
        "GatherElements",
        "GatherND",
        "GroupNormalization",
        "InstanceNormalization",
        "Range",
        "Reciprocal",
        "ReduceMax",
        "ReduceMin",
        "Resize",
        "Round",
        "Selu",
        "Sign",
        "Size",
        "Softplus",
        "Softsign",
        "Sum",
        "ThresholdedRelu",
        "Trilu",
        "Xor",
    ];
    let mut want = want.to_vec();
    want.sort_unstable();
    assert_eq!(ops::onnx_ops(&ops::standard()), want);
    // The registry also knows the operators GE inserts.
    let mut all = want.clone();
    all.extend(ops::GE_INSERTED);
    all.sort_unstable();
    assert_eq!(ops::standard().ops(), all);
}

#[test]
fn unary_ops_keep_the_input_descriptor() {
    let x = || data(DataType::F32, vec![n(), Dim::Fixed(3)]);
    for op in [
        "Relu",
        "Sqrt",
        "Erf",
        "Sigmoid",
        "Tanh",
        "Gelu",
        "Identity",
        "Exp",
        "Log",
        "Abs",
        "Neg",
        "Reciprocal",
        "Floor",
        "Ceil",
        "Softplus",
        "Softsign",
        "LeakyRelu",
        "Elu",
        "Selu",
        "Celu",
        "HardSigmoid",
        "HardSwish",
        "ThresholdedRelu",
    ] {
        assert_eq!(shape(op, vec![x()], &[]), vec![n(), Dim::Fixed(3)], "{op}");
    }
    let g = run_with("Gelu", vec![x()], &[("approximate", astr("tanh"))], 1, 20).unwrap();
    assert_eq!(g[0].dtype, DataType::F32);
    fails(
        "Gelu",
        vec![x()],
        &[("approximate", astr("fast"))],
        &[
            "attribute `approximate`",
            "\"none\" or \"tanh\"",
            "\"fast\"",
        ],
    );
    assert_eq!(
        shape("Relu", vec![data(DataType::I32, fx(&[4]))], &[]),
        fx(&[4])
    );
    fails0(
        "Sqrt",
        vec![data(DataType::I64, fx(&[4]))],
        &["input 0", "a float tensor", "got i64", "Cast"],
    );
    let scalar = || In::Const(Tensor::from_f32s(vec![], &[0.0]));
    assert_eq!(
        shape("Clip", vec![x(), scalar(), In::Absent], &[]),
        vec![n(), Dim::Fixed(3)]
    );
    assert_eq!(
        shape("Clip", vec![x(), In::Absent, scalar()], &[]),
        vec![n(), Dim::Fixed(3)]
    );
    fails0(
        "Clip",
        vec![x(), f32d(&[3])],
        &["input 1", "a scalar min bound", "[3]"],
    );
    fails(
        "Clip",
        vec![x()],
        &[("min", Attr::Float(0.0))],
        &["attribute `min`", "since opset 11"],
    );
}

#[test]
fn binary_ops_broadcast_symbolic_dims() {
    let a = || data(DataType::F32, vec![n(), Dim::Fixed(3), Dim::Fixed(1)]);
    for op in ["Add", "Sub", "Mul", "Div"] {
        assert_eq!(
            shape(op, vec![a(), f32d(&[4])], &[]),
            vec![n(), Dim::Fixed(3), Dim::Fixed(4)],
            "{op}"
        );
    }
    let p = run_with(
        "Pow",
        vec![a(), data(DataType::I64, fx(&[1]))],
        &[],
        1,
        OPSET,
    )
    .unwrap();
    assert_eq!(p[0].dtype, DataType::F32);
    let e = run_with("Equal", vec![a(), f32d(&[3, 1])], &[], 1, OPSET).unwrap();
    assert_eq!(e[0].dtype, DataType::Bool);
    assert_eq!(e[0].shape, vec![n(), Dim::Fixed(3), Dim::Fixed(1)]);
    let w = run_with(
        "Where",
        vec![
            data(DataType::Bool, vec![n(), Dim::Fixed(1), Dim::Fixed(1)]),
            f32d(&[1, 3, 1]),
            f32d(&[4]),
        ],
        &[],
        1,
        OPSET,
    )
    .unwrap();
    assert_eq!(w[0].shape, vec![n(), Dim::Fixed(3), Dim::Fixed(4)]);
    fails0(
        "Add",
        vec![a(), data(DataType::F16, fx(&[4]))],
        &["input 1", "type f32 like input 0", "got f16", "Cast"],
    );
    fails0(
        "Mul",
        vec![data(DataType::F32, vec![n(), Dim::Fixed(3)]), f32d(&[2, 3])],
        &["input 1", "broadcasts with [N[1..8],3]", "axis 0: 2"],
    );
    fails0(
        "Where",
        vec![f32d(&[1]), f32d(&[1]), f32d(&[1])],
        &["input 0", "a bool condition", "got f32"],
    );
}

#[test]
fn cast_takes_its_type_from_to() {
    let c = run_with("Cast", vec![f32d(&[2, 3])], &[("to", ai(6))], 1, OPSET).unwrap();
    assert_eq!(c[0], TensorDesc::new(DataType::I32, fx(&[2, 3])));
    fails(
        "Cast",
        vec![f32d(&[2])],
        &[("to", ai(8))],
        &["attribute `to`", "a supported type code", "got 8"],
    );
    fails(
        "Cast",
        vec![f32d(&[2])],
        &[],
        &["attribute `to`", "set `to`"],
    );
}

#[test]
fn conv_output_sizes() {
    // 224 -> (224 + 6 - 7) / 2 + 1 = 112.
    assert_eq!(
        shape(
            "Conv",
            vec![f32d(&[1, 3, 224, 224]), f32d(&[64, 3, 7, 7]), f32d(&[64])],
            &[("strides", ais(&[2, 2])), ("pads", ais(&[3, 3, 3, 3]))],
        ),
        fx(&[1, 64, 112, 112])
    );
    // H: (11 + 1 + 0 - 3) / 2 + 1 = 5; W: dilated kernel (2 - 1) * 2 + 1 = 3,
    // (9 + 0 + 1 - 3) / 3 + 1 = 3.
    assert_eq!(
        shape(
            "Conv",
            vec![f32d(&[1, 1, 11, 9]), f32d(&[2, 1, 3, 2])],
            &[
                ("strides", ais(&[2, 3])),
                ("pads", ais(&[1, 0, 0, 1])),
                ("dilations", ais(&[1, 2])),
            ],
        ),
        fx(&[1, 2, 5, 3])
    );
    // Dilation 2 on a 3x3 kernel covers 5: 10 - 5 + 1 = 6.
    assert_eq!(
        shape(
            "Conv",
            vec![f32d(&[1, 2, 10, 10]), f32d(&[4, 2, 3, 3])],
            &[("dilations", ais(&[2, 2]))],
        ),
        fx(&[1, 4, 6, 6])
    );
    // Depthwise with SAME padding: ceil(15 / 2) = 8; the symbolic batch passes through.
    for mode in ["SAME_UPPER", "SAME_LOWER"] {
        assert_eq!(
            shape(
                "Conv",
                vec![
                    data(
                        DataType::F32,
                        vec![n(), Dim::Fixed(32), Dim::Fixed(15), Dim::Fixed(15)]
                    ),
                    f32d(&[32, 1, 3, 3]),
                ],
                &[
                    ("group", ai(32)),
                    ("auto_pad", astr(mode)),
                    ("strides", ais(&[2, 2])),
                ],
            ),
            vec![n(), Dim::Fixed(32), Dim::Fixed(8), Dim::Fixed(8)]
        );
    }
    // VALID: (7 - 3) / 2 + 1 = 3.
    assert_eq!(
        shape(
            "Conv",
            vec![f32d(&[1, 3, 7, 7]), f32d(&[8, 3, 3, 3])],
            &[("auto_pad", astr("VALID")), ("strides", ais(&[2, 2]))],
        ),
        fx(&[1, 8, 3, 3])
    );
    // 1-D grouped conv with kernel_shape given explicitly.
    assert_eq!(
        shape(
            "Conv",
            vec![f32d(&[2, 4, 10]), f32d(&[6, 2, 3])],
            &[("group", ai(2)), ("kernel_shape", ais(&[3]))],
        ),
        fx(&[2, 6, 8])
    );
    // A symbolic spatial dim with stride 1 and "same" pads stays itself.
    let h = sym("H", 8, 64);
    assert_eq!(
        shape(
            "Conv",
            vec![
                data(
                    DataType::F32,
                    vec![n(), Dim::Fixed(3), h.clone(), Dim::Fixed(16)]
                ),
                f32d(&[8, 3, 3, 3]),
            ],
            &[("pads", ais(&[1, 1, 1, 1]))],
        ),
        vec![n(), Dim::Fixed(8), h.clone(), Dim::Fixed(16)]
    );
    fails(
        "Conv",
        vec![
            data(DataType::F32, vec![n(), Dim::Fixed(3), h, Dim::Fixed(16)]),
            f32d(&[8, 3, 3, 3]),
        ],
        &[("strides", ais(&[2, 2])), ("pads", ais(&[1, 1, 1, 1]))],
        &[
            "input 0",
            "divisible by the stride 2",
            "H[8..64]",
            "floor division",
        ],
    );
}

#[test]
fn conv_rejects_bad_attributes_and_weights() {
    let x = || f32d(&[1, 4, 8, 8]);
    fails(
        "Conv",
        vec![x(), f32d(&[8, 3, 3, 3])],
        &[],
        &[
            "input 1",
            "W dim 1 = C_in / group = 4 / 1",
            "got 3",
            "depthwise",
        ],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 1, 3, 3])],
        &[("group", ai(3))],
        &[
            "attribute `group`",
            "a divisor of the input channel count 4",
            "got 3",
        ],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[5, 2, 3, 3])],
        &[("group", ai(2))],
        &["attribute `group`", "W dim 0 = 5", "multiple of group"],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 4, 3, 3])],
        &[("pads", ais(&[1, 1]))],
        &["attribute `pads`", "4 values", "got 2 values [1, 1]"],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 4, 3, 3])],
        &[("strides", ais(&[0, 1]))],
        &["attribute `strides`", "values >= 1", "[0, 1]"],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 4, 3])],
        &[],
        &["input 1", "rank 4 like X", "got rank 3"],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 4, 3, 3]), f32d(&[4])],
        &[],
        &["input 2", "a bias of shape [8]", "[4]"],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 4, 3, 3])],
        &[("auto_pad", astr("SAME")), ("pads", ais(&[0, 0, 0, 0]))],
        &["attribute `auto_pad`", "SAME_UPPER", "\"SAME\""],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 4, 3, 3])],
        &[("auto_pad", astr("VALID")), ("pads", ais(&[1, 1, 1, 1]))],
        &[
            "attribute `pads`",
            "no explicit pads together with auto_pad=Valid",
        ],
    );
    fails(
        "Conv",
        vec![x(), f32d(&[8, 4, 3, 3])],
        &[("kernel_shape", ais(&[5, 5]))],
        &[
            "attribute `kernel_shape`",
            "[3, 3], the spatial dims of W",
            "[5, 5]",
        ],
    );
    fails(
        "Conv",
        vec![f32d(&[1, 4, 2, 2]), f32d(&[8, 4, 3, 3])],
        &[],
        &["input 0", "spatial dim 2 of at least 3", "got 2"],
    );
}

#[test]
fn pooling_output_sizes() {
    // (32 + 2 - 3) / 2 + 1 = 16.
    assert_eq!(
        shape(
            "MaxPool",
            vec![f32d(&[1, 3, 32, 32])],
            &[
                ("kernel_shape", ais(&[3, 3])),
                ("strides", ais(&[2, 2])),
                ("pads", ais(&[1, 1, 1, 1])),
            ],
        ),
        fx(&[1, 3, 16, 16])
    );
    // ceil_mode: 5 with k=2, s=2 gives ceil(3 / 2) + 1 = 3 instead of 2; with pads 1 on 4,
    // k=3, s=2: floor gives 2, ceil gives 3.
    let pool = |dims: &[i64], attrs: &[(&str, Attr)]| shape("MaxPool", vec![f32d(dims)], attrs);
    let k2 = [("kernel_shape", ais(&[2, 2])), ("strides", ais(&[2, 2]))];
    assert_eq!(pool(&[1, 1, 5, 5], &k2), fx(&[1, 1, 2, 2]));
    let mut k2c = k2.to_vec();
    k2c.push(("ceil_mode", ai(1)));
    assert_eq!(pool(&[1, 1, 5, 5], &k2c), fx(&[1, 1, 3, 3]));
    let k3p = [
        ("kernel_shape", ais(&[3])),
        ("strides", ais(&[2])),
        ("pads", ais(&[1, 1])),
    ];
    assert_eq!(pool(&[1, 1, 4], &k3p), fx(&[1, 1, 2]));
    let mut k3pc = k3p.to_vec();
    k3pc.push(("ceil_mode", ai(1)));
    assert_eq!(pool(&[1, 1, 4], &k3pc), fx(&[1, 1, 3]));
    // ceil_mode drops a last window that would start in the end padding (PyTorch's rule):
    // 5 with k=2, s=2, pads 1: ceil(5 / 2) + 1 = 4, but window 3 starts at 6 >= 5 + 1.
    let k2p = [
        ("kernel_shape", ais(&[2])),
        ("strides", ais(&[2])),
        ("pads", ais(&[1, 1])),
        ("ceil_mode", ai(1)),
    ];
    assert_eq!(pool(&[1, 1, 5], &k2p), fx(&[1, 1, 3]));
    // MaxPool's Indices output is int64 of the same shape.
    let two = run_with(
        "MaxPool",
        vec![data(
            DataType::F32,
            vec![n(), Dim::Fixed(3), Dim::Fixed(8), Dim::Fixed(8)],
        )],
        &[("kernel_shape", ais(&[2, 2])), ("strides", ais(&[2, 2]))],
        2,
        OPSET,
    )
    .unwrap();
    let want = vec![n(), Dim::Fixed(3), Dim::Fixed(4), Dim::Fixed(4)];
    assert_eq!(two[0], TensorDesc::new(DataType::F32, want.clone()));
    assert_eq!(two[1], TensorDesc::new(DataType::I64, want));
    // AveragePool with dilations (opset 19): the window covers 5, so 9 - 5 + 1 = 5.
    assert_eq!(
        run_with(
            "AveragePool",
            vec![f32d(&[1, 2, 9, 9])],
            &[
                ("kernel_shape", ais(&[3, 3])),
                ("dilations", ais(&[2, 2])),
                ("count_include_pad", ai(1)),
            ],
            1,
            19,
        )
        .unwrap()[0]
            .shape,
        fx(&[1, 2, 5, 5])
    );
    assert_eq!(
        shape(
            "AveragePool",
            vec![f32d(&[1, 2, 7, 7])],
            &[
                ("kernel_shape", ais(&[2, 2])),
                ("auto_pad", astr("SAME_UPPER")),
                ("strides", ais(&[2, 2])),
            ],
        ),
        fx(&[1, 2, 4, 4])
    );
    assert_eq!(
        shape(
            "GlobalAveragePool",
            vec![data(
                DataType::F32,
                vec![n(), Dim::Fixed(16), Dim::Fixed(7), Dim::Fixed(5)]
            )],
            &[],
        ),
        vec![n(), Dim::Fixed(16), Dim::Fixed(1), Dim::Fixed(1)]
    );
    fails(
        "MaxPool",
        vec![f32d(&[1, 1, 8, 8])],
        &[],
        &[
            "attribute `kernel_shape`",
            "got nothing",
            "set kernel_shape",
        ],
    );
    fails(
        "MaxPool",
        vec![f32d(&[1, 1, 8, 8])],
        &[("kernel_shape", ais(&[2, 2])), ("pads", ais(&[2, 0, 0, 0]))],
        &["attribute `pads`", "smaller than the window (2)"],
    );
    fails(
        "AveragePool",
        vec![f32d(&[1, 1, 8, 8])],
        &[("kernel_shape", ais(&[2, 2])), ("ceil_mode", ai(2))],
        &["attribute `ceil_mode`", "0 or 1", "got 2"],
    );
    fails(
        "AveragePool",
        vec![f32d(&[1, 8, 8])],
        &[("kernel_shape", ais(&[2, 2]))],
        &["attribute `kernel_shape`", "1 values >= 1"],
    );
    fails(
        "GlobalAveragePool",
        vec![f32d(&[8, 8])],
        &[],
        &["input 0", "rank 3 or more", "got rank 2"],
    );
}

#[test]
fn matmul_and_gemm_shapes() {
    // Batch dims broadcast: [2, 1] with [5] gives [2, 5].
    assert_eq!(
        shape("MatMul", vec![f32d(&[2, 1, 3, 4]), f32d(&[5, 4, 6])], &[]),
        fx(&[2, 5, 3, 6])
    );
    assert_eq!(
        shape("MatMul", vec![f32d(&[4]), f32d(&[4, 6])], &[]),
        fx(&[6])
    );
    assert_eq!(
        shape("MatMul", vec![f32d(&[2, 3, 4]), f32d(&[4])], &[]),
        fx(&[2, 3])
    );
    assert_eq!(shape("MatMul", vec![f32d(&[4]), f32d(&[4])], &[]), fx(&[]));
    let s = sym("S", 1, 128);
    assert_eq!(
        shape(
            "MatMul",
            vec![
                data(DataType::F32, vec![n(), s.clone(), Dim::Fixed(64)]),
                f32d(&[64, 32]),
            ],
            &[],
        ),
        vec![n(), s, Dim::Fixed(32)]
    );
    fails0(
        "MatMul",
        vec![f32d(&[3, 4]), f32d(&[5, 6])],
        &[
            "input 1",
            "B's second-to-last dim = 4, A's last dim",
            "got 5",
        ],
    );
    fails0(
        "MatMul",
        vec![f32d(&[2, 3, 4]), f32d(&[3, 4, 5])],
        &["input 1", "batch dims that broadcast", "batch axis 0: 3"],
    );
    // transA makes A [4, 3] a [3, 4]; transB makes B [5, 4] a [4, 5].
    let t = [
        ("transA", ai(1)),
        ("transB", ai(1)),
        ("alpha", Attr::Float(0.5)),
    ];
    assert_eq!(
        shape("Gemm", vec![f32d(&[4, 3]), f32d(&[5, 4]), f32d(&[5])], &t),
        fx(&[3, 5])
    );
    assert_eq!(
        shape(
            "Gemm",
            vec![f32d(&[4, 3]), f32d(&[5, 4]), f32d(&[3, 1])],
            &t
        ),
        fx(&[3, 5])
    );
    assert_eq!(
        shape(
            "Gemm",
            vec![data(DataType::F32, vec![n(), Dim::Fixed(8)]), f32d(&[8, 2])],
            &[],
        ),
        vec![n(), Dim::Fixed(2)]
    );
    fails(
        "Gemm",
        vec![f32d(&[4, 3]), f32d(&[5, 4]), f32d(&[4, 5])],
        &t,
        &["input 2", "broadcasts to [M, N] = [3,5]", "[4,5]"],
    );
    fails(
        "Gemm",
        vec![f32d(&[4, 3]), f32d(&[5, 4])],
        &[],
        &["input 1", "K = 3 on B's dim 0", "transB=0", "got 5"],
    );
    fails(
        "Gemm",
        vec![f32d(&[2, 4, 3]), f32d(&[3, 4])],
        &[],
        &["input 0", "a matrix (rank 2)", "got rank 3"],
    );
    fails(
        "Gemm",
        vec![f32d(&[4, 3]), f32d(&[3, 4])],
        &[("transA", ai(2))],
        &["attribute `transA`", "0 or 1"],
    );
}

#[test]
fn normalizations_and_softmax() {
    let x = || {
        data(
            DataType::F32,
            vec![n(), Dim::Fixed(16), Dim::Fixed(8), Dim::Fixed(8)],
        )
    };
    let c = || f32d(&[16]);
    assert_eq!(
        shape("BatchNormalization", vec![x(), c(), c(), c(), c()], &[]),
        vec![n(), Dim::Fixed(16), Dim::Fixed(8), Dim::Fixed(8)]
    );
    fails(
        "BatchNormalization",
        vec![x(), c(), c(), c(), c()],
        &[("training_mode", ai(1))],
        &["attribute `training_mode`", "0 (inference", "model.eval()"],
    );
    fails(
        "BatchNormalization",
        vec![x(), c(), c(), f32d(&[8]), c()],
        &[],
        &["input 3", "input_mean of shape [16]", "[8]"],
    );
    let s = sym("S", 1, 128);
    let h = || data(DataType::F32, vec![n(), s.clone(), Dim::Fixed(64)]);
    let ln = run_with(
        "LayerNormalization",
        vec![h(), f32d(&[64]), f32d(&[64])],
        &[("epsilon", Attr::Float(1e-6))],
        3,
        OPSET,
    )
    .unwrap();
    assert_eq!(ln[0].shape, vec![n(), s.clone(), Dim::Fixed(64)]);
    let stat = TensorDesc::new(DataType::F32, vec![n(), s.clone(), Dim::Fixed(1)]);
    assert_eq!(ln[1], stat);
    assert_eq!(ln[2], stat);
    let ln1 = run_with(
        "LayerNormalization",
        vec![f32d(&[2, 3, 4]), f32d(&[3, 4])],
        &[("axis", ai(1))],
        2,
        OPSET,
    )
    .unwrap();
    assert_eq!(ln1[1].shape, fx(&[2, 1, 1]));
    fails(
        "LayerNormalization",
        vec![h(), f32d(&[32])],
        &[],
        &[
            "input 1",
            "Scale broadcastable to the normalized shape [64]",
            "[32]",
        ],
    );
    fails(
        "LayerNormalization",
        vec![h(), f32d(&[64])],
        &[("axis", ai(3))],
        &["attribute `axis`", "an axis in [-3, 2] for rank 3", "got 3"],
    );
    assert_eq!(
        shape("Softmax", vec![h()], &[]),
        vec![n(), s.clone(), Dim::Fixed(64)]
    );
    fails(
        "Softmax",
        vec![h()],
        &[("axis", ai(-4))],
        &["attribute `axis`", "an axis in [-3, 2]", "got -4"],
    );
}

#[test]
fn reductions_with_axes_as_inputs_or_attributes() {
    let x = || data(DataType::F32, vec![n(), Dim::Fixed(3), Dim::Fixed(4)]);
    assert_eq!(
        shape("ReduceSum", vec![x(), ints(&[1])], &[]),
        vec![n(), Dim::Fixed(1), Dim::Fixed(4)]
    );
    assert_eq!(
        shape("ReduceSum", vec![x(), ints(&[-2])], &[("keepdims", ai(0))]),
        vec![n(), Dim::Fixed(4)]
    );
    assert_eq!(shape("ReduceSum", vec![x()], &[]), fx(&[1, 1, 1]));
    assert_eq!(
        shape("ReduceSum", vec![x(), ints(&[])], &[("keepdims", ai(0))]),
        fx(&[])
    );
    assert_eq!(
        shape("ReduceSum", vec![x()], &[("noop_with_empty_axes", ai(1))]),
        vec![n(), Dim::Fixed(3), Dim::Fixed(4)]
    );
    // ReduceMean: an attribute up to opset 17, an input from 18 on.
    assert_eq!(
        shape("ReduceMean", vec![x()], &[("axes", ais(&[-1]))]),
        vec![n(), Dim::Fixed(3), Dim::Fixed(1)]
    );
    assert_eq!(
        run_with("ReduceMean", vec![x(), ints(&[2])], &[], 1, 18).unwrap()[0].shape,
        vec![n(), Dim::Fixed(3), Dim::Fixed(1)]
    );
    fails_at(
        "ReduceMean",
        vec![x()],
        &[("axes", ais(&[1]))],
        18,
        &["attribute `axes`", "since opset 18 the axes are input 1"],
    );
    fails(
        "ReduceMean",
        vec![x(), ints(&[1])],
        &[],
        &["input 1", "no axes input at opset 17", "attribute"],
    );
    fails(
        "ReduceSum",
        vec![x(), ints(&[1, -2])],
        &[],
        &["input 1", "distinct axes", "axis 1 appears twice"],
    );
    fails(
        "ReduceSum",
        vec![x(), ints(&[3])],
        &[],
        &["input 1", "an axis in [-3, 2] for rank 3", "got 3"],
    );
    fails(
        "ReduceSum",
        vec![x(), data(DataType::I64, fx(&[1]))],
        &[],
        &[
            "input 1",
            "the axes known at compile time",
            "computed at run time",
        ],
    );
}

#[test]
fn reshape_and_flatten_with_zero_minus_one_and_symbols() {
    let r = |x: In, t: &[i64]| shape("Reshape", vec![x, ints(t)], &[]);
    assert_eq!(r(f32d(&[2, 3, 4]), &[0, -1]), fx(&[2, 12]));
    // 0 copies dim 1 (3), so -1 = 24 / (4 * 3) = 2.
    assert_eq!(r(f32d(&[2, 3, 4]), &[4, 0, -1]), fx(&[4, 3, 2]));
    let x = || data(DataType::F32, vec![n(), Dim::Fixed(3), Dim::Fixed(4)]);
    assert_eq!(r(x(), &[0, -1]), vec![n(), Dim::Fixed(12)]);
    assert_eq!(
        r(x(), &[-1, 4]),
        vec![n().mul(&Dim::Fixed(3)), Dim::Fixed(4)]
    );
    assert_eq!(
        r(x(), &[-1, 6]),
        vec![n().mul(&Dim::Fixed(2)), Dim::Fixed(6)]
    );
    assert_eq!(r(x(), &[0, 2, 6]), vec![n(), Dim::Fixed(2), Dim::Fixed(6)]);
    let a0 = run_with(
        "Reshape",
        vec![f32d(&[0, 3]), ints(&[3, 0])],
        &[("allowzero", ai(1))],
        1,
        OPSET,
    )
    .unwrap();
    assert_eq!(a0[0].shape, fx(&[3, 0]));
    fails(
        "Reshape",
        vec![f32d(&[2, 3]), ints(&[-1, -1])],
        &[],
        &["input 1", "at most one -1", "positions 0 and 1"],
    );
    fails(
        "Reshape",
        vec![f32d(&[2, 3, 5]), ints(&[-1, 4])],
        &[],
        &["input 1", "30 elements, which 4 does not divide"],
    );
    fails(
        "Reshape",
        vec![f32d(&[2, 3]), ints(&[4, 2])],
        &[],
        &[
            "input 1",
            "as many elements as the input [2,3] (6)",
            "(8 elements)",
        ],
    );
    fails(
        "Reshape",
        vec![
            data(DataType::F32, vec![n(), Dim::Fixed(3)]),
            ints(&[-1, 2]),
        ],
        &[],
        &[
            "input 1",
            "3*N[3..24] elements divided by 2",
            "not an exact dim expression",
        ],
    );
    fails(
        "Reshape",
        vec![f32d(&[2, 3]), data(DataType::I64, fx(&[2]))],
        &[],
        &[
            "input 1",
            "the target shape known at compile time",
            "gear branch",
        ],
    );
    fails(
        "Reshape",
        vec![f32d(&[2, 3]), ints(&[0, 6, 0])],
        &[],
        &[
            "input 1",
            "only at positions below the input rank 2",
            "0 at position 2",
        ],
    );
    let f = |axis: i64| {
        shape(
            "Flatten",
            vec![data(
                DataType::F32,
                vec![n(), Dim::Fixed(3), Dim::Fixed(4), Dim::Fixed(5)],
            )],
            &[("axis", ai(axis))],
        )
    };
    assert_eq!(f(2), vec![n().mul(&Dim::Fixed(3)), Dim::Fixed(20)]);
    assert_eq!(f(0), vec![Dim::Fixed(1), n().mul(&Dim::Fixed(60))]);
    assert_eq!(f(-1), vec![n().mul(&Dim::Fixed(12)), Dim::Fixed(5)]);
    assert_eq!(f(4), vec![n().mul(&Dim::Fixed(60)), Dim::Fixed(1)]);
    fails(
        "Flatten",
        vec![f32d(&[2, 3])],
        &[("axis", ai(3))],
        &["attribute `axis`", "an axis in [-2, 2]", "got 3"],
    );
}

#[test]
fn transpose_and_concat() {
    let x = || data(DataType::F32, vec![n(), Dim::Fixed(3), Dim::Fixed(4)]);
    assert_eq!(
        shape("Transpose", vec![x()], &[]),
        vec![Dim::Fixed(4), Dim::Fixed(3), n()]
    );
    assert_eq!(
        shape("Transpose", vec![x()], &[("perm", ais(&[0, 2, 1]))]),
        vec![n(), Dim::Fixed(4), Dim::Fixed(3)]
    );
    for bad in [&[0, 0, 1][..], &[0, 1], &[0, 1, 3]] {
        fails(
            "Transpose",
            vec![x()],
            &[("perm", ais(bad))],
            &["attribute `perm`", "a permutation of 0..3"],
        );
    }
    let s = sym("S", 1, 16);
    let cat = shape(
        "Concat",
        vec![
            data(DataType::F32, vec![n(), Dim::Fixed(4)]),
            data(DataType::F32, vec![s.clone(), Dim::Fixed(4)]),
            f32d(&[2, 4]),
        ],
        &[("axis", ai(0))],
    );
    assert_eq!(cat, vec![n().add(&s).add(&Dim::Fixed(2)), Dim::Fixed(4)]);
    assert_eq!(cat[0].to_string(), "N+S+2[4..26]");
    assert_eq!(
        shape(
            "Concat",
            vec![
                data(DataType::F32, vec![n(), Dim::Fixed(3)]),
                data(DataType::F32, vec![n(), Dim::Fixed(5)]),
            ],
            &[("axis", ai(-1))],
        ),
        vec![n(), Dim::Fixed(8)]
    );
    fails(
        "Concat",
        vec![data(DataType::F32, vec![n(), Dim::Fixed(3)]), f32d(&[2, 3])],
        &[("axis", ai(1))],
        &["input 1", "dim 0 = N[1..8] like input 0", "got 2"],
    );
    fails(
        "Concat",
        vec![f32d(&[2, 3]), f32d(&[2, 3])],
        &[],
        &["attribute `axis`", "has no default"],
    );
    fails(
        "Concat",
        vec![f32d(&[2, 3]), f32d(&[2, 3, 1])],
        &[("axis", ai(0))],
        &["input 1", "rank 2 like input 0", "got rank 3"],
    );
}

#[test]
fn slice_clamps_and_steps_backwards() {
    let sl = |x: In, s: &[i64], e: &[i64], a: &[i64], st: &[i64]| {
        shape("Slice", vec![x, ints(s), ints(e), ints(a), ints(st)], &[])
    };
    let x = || f32d(&[10, 20, 30]);
    // Ends past the dim clamp to it.
    assert_eq!(sl(x(), &[1], &[1000], &[0], &[1]), fx(&[9, 20, 30]));
    assert_eq!(sl(x(), &[-3], &[i64::MAX], &[0], &[1]), fx(&[3, 20, 30]));
    // Reversal: start -1 is 19, end INT64_MIN clamps to -1.
    assert_eq!(sl(x(), &[-1], &[i64::MIN], &[1], &[-1]), fx(&[10, 20, 30]));
    // 8, 6, 4.
    assert_eq!(sl(x(), &[8], &[2], &[0], &[-2]), fx(&[3, 20, 30]));
    // 0, 3, 6, 9.
    assert_eq!(sl(x(), &[0], &[10], &[0], &[3]), fx(&[4, 20, 30]));
    assert_eq!(sl(x(), &[5], &[2], &[0], &[1]), fx(&[0, 20, 30]));
    assert_eq!(sl(x(), &[0], &[-1], &[-1], &[1]), fx(&[10, 20, 29]));
    // Axis 0 keeps 1, 3, 5, 7; axis 2 starts at 29 (100 clamped) and keeps 29, 22, 15, 8, 1.
    assert_eq!(
        sl(x(), &[1, 100], &[-1, -100], &[0, 2], &[2, -7]),
        fx(&[4, 20, 5])
    );
    // Axes and steps are optional.
    assert_eq!(
        shape("Slice", vec![x(), ints(&[2]), ints(&[5])], &[]),
        fx(&[3, 20, 30])
    );
    // Symbolic dims: bounds that clamp the same way for every N pass through.
    let y = || data(DataType::F32, vec![n(), Dim::Fixed(20)]);
    assert_eq!(
        sl(y(), &[0], &[i64::MAX], &[0], &[1]),
        vec![n(), Dim::Fixed(20)]
    );
    assert_eq!(
        sl(y(), &[1], &[i64::MAX], &[0], &[1]),
        vec![n().sub(&Dim::Fixed(1)), Dim::Fixed(20)]
    );
    assert_eq!(
        sl(y(), &[-1], &[i64::MAX], &[0], &[1]),
        vec![Dim::Fixed(1), Dim::Fixed(20)]
    );
    assert_eq!(
        sl(y(), &[-1], &[i64::MIN], &[0], &[-1]),
        vec![n(), Dim::Fixed(20)]
    );
    fails(
        "Slice",
        vec![y(), ints(&[2]), ints(&[i64::MAX]), ints(&[0])],
        &[],
        &[
            "input 1",
            "does not depend on the symbolic dim N[1..8]",
            "start 2",
        ],
    );
    fails(
        "Slice",
        vec![x(), ints(&[0]), ints(&[5]), ints(&[0]), ints(&[0])],
        &[],
        &["input 4", "non-zero steps"],
    );
    fails(
        "Slice",
        vec![x(), ints(&[0, 1]), ints(&[5])],
        &[],
        &["input 2", "2 ends, one per start", "got 1"],
    );
    fails(
        "Slice",
        vec![x(), ints(&[0]), ints(&[5]), ints(&[3])],
        &[],
        &["input 3", "an axis in [-3, 2]"],
    );
}

#[test]
fn gather_with_negative_and_nd_indices() {
    let x = || f32d(&[5, 6, 7]);
    assert_eq!(shape("Gather", vec![x(), ints(&[-1])], &[]), fx(&[1, 6, 7]));
    assert_eq!(
        shape("Gather", vec![x(), int0(-6)], &[("axis", ai(1))]),
        fx(&[5, 7])
    );
    assert_eq!(
        shape(
            "Gather",
            vec![x(), data(DataType::I32, fx(&[2, 3]))],
            &[("axis", ai(-2))],
        ),
        fx(&[5, 2, 3, 7])
    );
    assert_eq!(
        shape(
            "Gather",
            vec![data(DataType::F32, vec![n(), Dim::Fixed(6)]), int0(2)],
            &[("axis", ai(1))],
        ),
        vec![n()]
    );
    fails(
        "Gather",
        vec![x(), ints(&[6])],
        &[("axis", ai(1))],
        &["input 1", "indices in [-6, 5] (dim 1 of the data)", "got 6"],
    );
    fails(
        "Gather",
        vec![x(), ints(&[0])],
        &[("axis", ai(3))],
        &["attribute `axis`", "an axis in [-3, 2]"],
    );
    fails(
        "Gather",
        vec![x(), f32d(&[1])],
        &[],
        &["input 1", "integer indices", "got f32"],
    );
}

#[test]
fn squeeze_and_unsqueeze() {
    assert_eq!(
        shape("Squeeze", vec![f32d(&[1, 3, 1, 5]), ints(&[0, -2])], &[]),
        fx(&[3, 5])
    );
    assert_eq!(
        shape("Squeeze", vec![f32d(&[1, 3, 1, 5])], &[]),
        fx(&[3, 5])
    );
    assert_eq!(
        shape(
            "Squeeze",
            vec![data(DataType::F32, vec![sym("B", 2, 8), Dim::Fixed(1)])],
            &[],
        ),
        vec![sym("B", 2, 8)]
    );
    fails(
        "Squeeze",
        vec![data(DataType::F32, vec![n(), Dim::Fixed(1)])],
        &[],
        &[
            "input 0",
            "dim 0 = N[1..8], which may be 1",
            "explicit axes",
        ],
    );
    fails(
        "Squeeze",
        vec![f32d(&[1, 3]), ints(&[1])],
        &[],
        &["input 1", "axes of size 1", "axis 1 of size 3"],
    );
    assert_eq!(
        shape("Unsqueeze", vec![f32d(&[3, 5]), ints(&[0, -1])], &[]),
        fx(&[1, 3, 5, 1])
    );
    assert_eq!(
        shape(
            "Unsqueeze",
            vec![data(DataType::F32, vec![n()]), ints(&[1])],
            &[],
        ),
        vec![n(), Dim::Fixed(1)]
    );
    assert_eq!(shape("Unsqueeze", vec![int0(7), ints(&[0])], &[]), fx(&[1]));
    fails(
        "Unsqueeze",
        vec![f32d(&[3]), ints(&[0, 0])],
        &[],
        &["input 1", "distinct axes"],
    );
    fails(
        "Unsqueeze",
        vec![f32d(&[3])],
        &[("axes", ais(&[0]))],
        &["attribute `axes`", "since opset 13 the axes are input 1"],
    );
    fails(
        "Unsqueeze",
        vec![f32d(&[3]), ints(&[3])],
        &[],
        &["input 1", "an axis in [-2, 1] for rank 2"],
    );
}

#[test]
fn shape_expand_and_constant() {
    let x = || data(DataType::F32, vec![n(), Dim::Fixed(3), Dim::Fixed(5)]);
    let s = run_with("Shape", vec![x()], &[], 1, OPSET).unwrap();
    assert_eq!(s[0], TensorDesc::new(DataType::I64, fx(&[3])));
    assert_eq!(shape("Shape", vec![x()], &[("start", ai(1))]), fx(&[2]));
    assert_eq!(shape("Shape", vec![x()], &[("start", ai(-1))]), fx(&[1]));
    assert_eq!(shape("Shape", vec![x()], &[("end", ai(-1))]), fx(&[2]));
    assert_eq!(
        shape("Shape", vec![x()], &[("start", ai(2)), ("end", ai(1))]),
        fx(&[0])
    );
    fails_at(
        "Shape",
        vec![x()],
        &[("start", ai(1))],
        14,
        &["attribute `start`", "from opset 15 on"],
    );
    assert_eq!(
        shape("Expand", vec![f32d(&[3, 1]), ints(&[2, 1, 6])], &[]),
        fx(&[2, 3, 6])
    );
    assert_eq!(
        shape(
            "Expand",
            vec![data(DataType::F32, vec![n(), Dim::Fixed(1)]), ints(&[1, 4])],
            &[],
        ),
        vec![n(), Dim::Fixed(4)]
    );
    fails(
        "Expand",
        vec![f32d(&[3, 2]), ints(&[4])],
        &[],
        &["input 1", "broadcasts with the input [3,2]", "axis 1: 4"],
    );
    fails(
        "Expand",
        vec![f32d(&[3, 1]), data(DataType::I64, fx(&[2]))],
        &[],
        &["input 1", "the target shape known at compile time"],
    );
    let c = run_with(
        "Constant",
        vec![],
        &[("value_ints", ais(&[1, 2]))],
        1,
        OPSET,
    )
    .unwrap();
    assert_eq!(c[0], TensorDesc::new(DataType::I64, fx(&[2])));
    let c = run_with(
        "Constant",
        vec![],
        &[("value_float", Attr::Float(2.5))],
        1,
        OPSET,
    )
    .unwrap();
    assert_eq!(c[0], TensorDesc::new(DataType::F32, fx(&[])));
    fails(
        "Constant",
        vec![],
        &[],
        &[
            "exactly one of the attributes value, value_float",
            "got none",
        ],
    );
    fails(
        "Constant",
        vec![],
        &[("value_string", astr("a"))],
        &[
            "attribute `value_string`",
            "string and sparse constants are not supported",
        ],
    );
}

#[test]
fn wrong_input_counts_and_attribute_types_are_reported() {
    fails(
        "Add",
        vec![f32d(&[1])],
        &[],
        &["expected 2 inputs, got 1", "ONNX operator definition"],
    );
    fails(
        "Softmax",
        vec![f32d(&[2, 3])],
        &[("axis", ais(&[1]))],
        &["attribute `axis`", "an integer", "the integer list [1]"],
    );
    fails(
        "Conv",
        vec![f32d(&[1, 1, 4, 4]), f32d(&[1, 1, 3, 3])],
        &[("strides", ai(2))],
        &["attribute `strides`", "a list of integers", "the integer 2"],
    );
}

#[test]
fn folding_keeps_dtypes_exact() {
    let i32s = |v: &[i32]| In::Const(Tensor::from_i32s(vec![v.len() as i64], v));
    let t = folded("Add", vec![i32s(&[i32::MAX, 1]), i32s(&[1])], &[]);
    assert_eq!(t.dtype, DataType::I32);
    assert_eq!(t.to_i64s(), vec![i64::from(i32::MIN), 2]);
    let t = folded("Div", vec![ints(&[7, -7]), ints(&[2])], &[]);
    assert_eq!(t.to_i64s(), vec![3, -3]);
    let t = folded("Sub", vec![ints(&[5]), ints(&[1, 2, 3])], &[]);
    assert_eq!((t.dims.clone(), t.to_i64s()), (vec![3], vec![4, 3, 2]));
    let t = folded(
        "Mul",
        vec![
            In::Const(Tensor::from_f32s(vec![2, 1], &[0.1, 2.0])),
            In::Const(Tensor::from_f32s(vec![2], &[3.0, 0.5])),
        ],
        &[],
    );
    assert_eq!(t.dtype, DataType::F32);
    assert_eq!(t.dims, vec![2, 2]);
    assert_eq!(
        t.to_f64s(),
        [0.1f32 * 3.0, 0.1 * 0.5, 6.0, 1.0].map(f64::from).to_vec()
    );
    let t = folded("Equal", vec![ints(&[1, 2, 3]), int0(2)], &[]);
    assert_eq!((t.dtype, t.to_i64s()), (DataType::Bool, vec![0, 1, 0]));
    let cond = In::Const(Tensor::new(DataType::Bool, vec![3], vec![1, 0, 1]).unwrap());
    let t = folded("Where", vec![cond, ints(&[1, 2, 3]), int0(-1)], &[]);
    assert_eq!((t.dtype, t.to_i64s()), (DataType::I64, vec![1, -1, 3]));
    let t = folded(
        "Cast",
        vec![In::Const(Tensor::from_f32s(vec![3], &[-1.7, 2.9, 300.0]))],
        &[("to", ai(DataType::I32.onnx_code().into()))],
    );
    assert_eq!((t.dtype, t.to_i64s()), (DataType::I32, vec![-1, 2, 300]));
    let t = folded("Cast", vec![ints(&[0, 3])], &[("to", ai(9))]);
    assert_eq!((t.dtype, t.to_i64s()), (DataType::Bool, vec![0, 1]));
    let t = folded("Cast", vec![ints(&[1, 2049])], &[("to", ai(10))]);
    assert_eq!((t.dtype, t.to_f64s()), (DataType::F16, vec![1.0, 2048.0]));
    let t = folded("Identity", vec![ints(&[4, 5])], &[]);
    assert_eq!(t.to_i64s(), vec![4, 5]);
    let t = folded("Constant", vec![], &[("value_int", ai(9))]);
    assert_eq!((t.dims.clone(), t.to_i64s()), (vec![], vec![9]));
    let e = build("Div", vec![ints(&[1, 2]), ints(&[1, 0])], &[], 1, OPSET).unwrap_err();
    assert!(
        e.contains("input 1") && e.contains("a non-zero integer divisor"),
        "{e}"
    );
}

#[test]
fn folding_moves_and_reorders_elements() {
    let seq = |dims: &[i64]| {
        let n: i64 = dims.iter().product();
        In::Const(Tensor::from_i64s(
            dims.to_vec(),
            &(0..n).collect::<Vec<_>>(),
        ))
    };
    let t = folded(
        "Slice",
        vec![seq(&[10]), ints(&[8]), ints(&[2]), ints(&[0]), ints(&[-2])],
        &[],
    );
    assert_eq!(t.to_i64s(), vec![8, 6, 4]);
    let t = folded(
        "Slice",
        vec![
            seq(&[10]),
            ints(&[3]),
            ints(&[10]),
            ints(&[0]),
            ints(&[i64::MAX]),
        ],
        &[],
    );
    assert_eq!(t.to_i64s(), vec![3]);
    let t = folded(
        "Slice",
        vec![
            seq(&[3, 4]),
            ints(&[-1, 1]),
            ints(&[i64::MIN, 100]),
            ints(&[0, 1]),
            ints(&[-1, 2]),
        ],
        &[],
    );
    assert_eq!(
        (t.dims.clone(), t.to_i64s()),
        (vec![3, 2], vec![9, 11, 5, 7, 1, 3])
    );
    let t = folded(
        "Gather",
        vec![seq(&[2, 3]), ints(&[-1, 0])],
        &[("axis", ai(1))],
    );
    assert_eq!(
        (t.dims.clone(), t.to_i64s()),
        (vec![2, 2], vec![2, 0, 5, 3])
    );
    let t = folded("Gather", vec![ints(&[2, 3, 5]), int0(-1)], &[]);
    assert_eq!((t.dims.clone(), t.to_i64s()), (vec![], vec![5]));
    let t = folded(
        "Concat",
        vec![seq(&[2, 1]), seq(&[2, 2])],
        &[("axis", ai(1))],
    );
    assert_eq!(
        (t.dims.clone(), t.to_i64s()),
        (vec![2, 3], vec![0, 0, 1, 1, 2, 3])
    );
    let t = folded("Expand", vec![seq(&[2]), ints(&[3, 1])], &[]);
    assert_eq!(
        (t.dims.clone(), t.to_i64s()),
        (vec![3, 2], vec![0, 1, 0, 1, 0, 1])
    );
    let t = folded("Unsqueeze", vec![int0(4), ints(&[0])], &[]);
    assert_eq!((t.dims.clone(), t.to_i64s()), (vec![1], vec![4]));
    let t = folded("Squeeze", vec![seq(&[1, 3]), ints(&[0])], &[]);
    assert_eq!((t.dims.clone(), t.to_i64s()), (vec![3], vec![0, 1, 2]));
    let t = folded("Reshape", vec![seq(&[2, 3]), ints(&[-1])], &[]);
    assert_eq!(
        (t.dims.clone(), t.to_i64s()),
        (vec![6], vec![0, 1, 2, 3, 4, 5])
    );
    let t = folded("Flatten", vec![seq(&[2, 3, 1])], &[]);
    assert_eq!(t.dims, vec![2, 3]);
    let t = folded("Shape", vec![seq(&[2, 3, 5])], &[("start", ai(1))]);
    assert_eq!((t.dtype, t.to_i64s()), (DataType::I64, vec![3, 5]));
}

#[test]
fn shape_folds_from_the_descriptor_alone() {
    let registry = ops::standard();
    let fold = registry.get("Shape").unwrap().fold.unwrap();
    let node = Node::new("s", "Shape", vec![None], vec![]);
    let fixed = TensorDesc::new(DataType::F32, fx(&[2, 3, 5]));
    let ctx = infer::OpCtx {
        node: &node,
        inputs: vec![Some(&fixed)],
        values: vec![None],
        opset: OPSET,
    };
    let t = fold(&ctx).unwrap();
    assert_eq!(t, vec![Tensor::from_i64s(vec![3], &[2, 3, 5])]);
    // With a symbolic dim the value is not known, so nothing is folded.
    let dynamic = TensorDesc::new(DataType::F32, vec![n(), Dim::Fixed(3), Dim::Fixed(5)]);
    let ctx = infer::OpCtx {
        node: &node,
        inputs: vec![Some(&dynamic)],
        values: vec![None],
        opset: OPSET,
    };
    assert_eq!(fold(&ctx).unwrap(), vec![]);
    // Past the symbolic dim it is.
    let mut tail = node.clone();
    tail.attrs.insert("start".into(), ai(1));
    let ctx = infer::OpCtx {
        node: &tail,
        inputs: vec![Some(&dynamic)],
        values: vec![None],
        opset: OPSET,
    };
    assert_eq!(
        fold(&ctx).unwrap(),
        vec![Tensor::from_i64s(vec![2], &[3, 5])]
    );
}

/// PyTorch's `x.view(-1, x.size(2))`: Shape -> Gather(2) -> Unsqueeze -> Concat([-1], .) ->
/// Reshape. The shape is read from a weight here, because the engine folds a node only when
/// every input value is known (see `shape_folds_from_the_descriptor_alone` for `Data`).
#[test]
fn pytorch_shape_chain_folds_to_a_constant() {
    let mut g = Graph::new("chain");
    let add = |g: &mut Graph, name: &str, op: &str, ins: &[Value], attrs: &[(&str, Attr)]| {
        let mut node = Node::new(
            name,
            op,
            ins.iter().map(|v| Some(*v)).collect(),
            vec![TensorDesc::new(DataType::F32, vec![])],
        );
        for (k, v) in attrs {
            node.attrs.insert((*k).to_string(), v.clone());
        }
        Value {
            node: g.add(node),
            output: 0,
        }
    };
    let konst = |g: &mut Graph, name: &str, t: Tensor| {
        add(g, name, "Const", &[], &[("value", Attr::Tensor(t))])
    };
    let x = {
        let id = g.add(Node::new(
            "x",
            "Data",
            vec![],
            vec![TensorDesc::new(DataType::F32, fx(&[2, 3, 5]))],
        ));
        Value {
            node: id,
            output: 0,
        }
    };
    let w = konst(&mut g, "w", Tensor::from_f32s(vec![2, 3, 5], &[0.0; 30]));
    let shape = add(&mut g, "shape", "Shape", &[w], &[]);
    let two = konst(&mut g, "two", Tensor::from_i64s(vec![], &[2]));
    let dim = add(
        &mut g,
        "gather",
        "Gather",
        &[shape, two],
        &[("axis", ai(0))],
    );
    let zero = konst(&mut g, "zero", Tensor::from_i64s(vec![1], &[0]));
    let dim1 = add(&mut g, "unsqueeze", "Unsqueeze", &[dim, zero], &[]);
    let minus = konst(&mut g, "minus_one", Tensor::from_i64s(vec![1], &[-1]));
    let target = add(
        &mut g,
        "concat",
        "Concat",
        &[minus, dim1],
        &[("axis", ai(0))],
    );
    let y = add(&mut g, "reshape", "Reshape", &[x, target], &[]);
    g.add(Node::new("out", "NetOutput", vec![Some(y)], vec![]));

    let known = infer::infer_graph(&mut g, &ops::standard(), OPSET).unwrap();
    let folded = infer::fold_constants(&mut g, &known);
    assert_eq!(folded.nodes, 4, "{}", g.dump());
    let ops_left: Vec<&str> = g.nodes.iter().map(|n| n.op.as_str()).collect();
    assert_eq!(
        ops_left,
        ["Data", "Const", "Reshape", "NetOutput"],
        "{}",
        g.dump()
    );
    let reshape = g.node(g.find("reshape").unwrap());
    assert_eq!(
        reshape.outputs,
        vec![TensorDesc::new(DataType::F32, fx(&[6, 5]))]
    );
    let target = g.node(reshape.inputs[1].unwrap().node);
    assert_eq!(target.name, "concat");
    assert_eq!(
        target.tensor("value"),
        Some(&Tensor::from_i64s(vec![2], &[-1, 5]))
    );
}

/// Models of any opset from 1 import; an operator whose older form differs from the one
/// implemented is refused as unsupported at inference, naming both opsets.
#[test]
fn older_opsets_run_the_operators_whose_form_is_unchanged() {
    let b = || data(DataType::Bool, fx(&[2, 3]));
    assert!(run_with("And", vec![b(), b()], &[], 1, 7).is_ok());
    assert!(run_with("Not", vec![b()], &[], 1, 1).is_ok());
    let x = || f32d(&[2, 3]);
    assert!(run_with("Relu", vec![x()], &[], 1, 6).is_ok());
    let e = run_with("Softmax", vec![x()], &[], 1, 12).unwrap_err();
    assert!(
        e.contains("the form Softmax has from opset 13 on")
            && e.contains("opset 12")
            && e.contains("not supported"),
        "{e}"
    );
    let e = run_with("Add", vec![x(), x()], &[], 1, 6).unwrap_err();
    assert!(e.contains("from opset 7 on"), "{e}");
}
