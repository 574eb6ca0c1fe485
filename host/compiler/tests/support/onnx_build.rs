//! ONNX models built in tests with the importer's prost messages (for inputs the committed
//! models do not cover: malformed files, unsupported ops, shape conflicts).

use gearsim_compiler::onnx::proto::{
    GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
    TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
};

/// A tensor type; `None` dims are the symbolic `N`.
pub fn tensor_type(elem: i32, dims: &[Option<i64>]) -> TypeProto {
    use tensor_shape_proto::dimension::Value as D;
    TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor {
            elem_type: elem,
            shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|d| tensor_shape_proto::Dimension {
                        value: Some(match d {
                            Some(v) => D::DimValue(*v),
                            None => D::DimParam("N".into()),
                        }),
                        denotation: String::new(),
                    })
                    .collect(),
            }),
        })),
    }
}

pub fn value_info(name: &str, dims: &[Option<i64>]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(tensor_type(1, dims)),
        doc_string: String::new(),
    }
}

pub fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: name.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

pub fn f32_init(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 1,
        raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        ..Default::default()
    }
}

/// A model of `nodes` with these float inputs, outputs and initializers, at `opset`.
pub fn model(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: &[(&str, &[Option<i64>])],
    outputs: &[(&str, &[Option<i64>])],
    initializers: Vec<TensorProto>,
) -> ModelProto {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        producer_name: "gearsim test".into(),
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: initializers,
            input: inputs.iter().map(|(n, d)| value_info(n, d)).collect(),
            output: outputs.iter().map(|(n, d)| value_info(n, d)).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}
