//! ONNX import: decodes a `.onnx` file (the hand-written prost messages of [`proto`]) into an
//! [`ir::Model`] of `Data`, `Const`, operator and `NetOutput` nodes.
//!
//! ```text
//!   bytes ─ prost ─▶ ModelProto ─▶ opset (1..=27; per operator, `ops::first_opset`)
//!                        │
//!                        ▼
//!   graph inputs (not initializers) ─▶ Data {index}      (graph input order)
//!   initializers                     ─▶ Const {value}     (initializer order)
//!   Constant nodes                   ─▶ Const {value}
//!   other nodes                      ─▶ op_type, attributes, inputs resolved by name
//!   graph outputs                    ─▶ one NetOutput {output_names}, last
//! ```
//!
//! Operator output descriptors are placeholders (`f32[]`) that shape inference replaces; `Data`
//! dims the file leaves symbolic are `-1` until the command line's `--input_shape` fills them.
//! Everything the file says is checked before it is used: a truncated or corrupted file is an
//! [`OnnxError`] naming the file and the node, input, tensor or attribute at fault, never a
//! panic, and no allocation is sized by a length field the bytes do not back. The same bytes
//! always give the same model.

pub mod proto;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use gearsim_isa::numeric;
use prost::Message as _;

use super::ir::{self, Attr, DataType, Node, NodeId, Tensor, TensorDesc, Value};
use super::symbolic::Dim;
use proto::{AttributeProto, AttributeType, DataLocation, NodeProto, TensorProto};

/// Oldest default-domain opset the importer accepts.
pub const MIN_OPSET: i64 = 1;
/// Newest default-domain opset the importer accepts. Opsets 21 to 27 changed the supported
/// operators only by admitting new element types (bfloat16, int4, float8, ...; Range's float16
/// at 27, with `stash_type` for it), which the importer rejects by type, so their f32 / f16 /
/// integer semantics are those of the forms implemented (GroupNormalization's is 21's). Opset
/// 28 changes Cast and Celu.
pub const MAX_OPSET: i64 = 27;

/// A graph input the user feeds at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputInfo {
    /// Name in the ONNX file (and of its `Data` node).
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Sizes; `None` where the file gives a symbolic name (`dim_param`) or nothing.
    pub dims: Vec<Option<i64>>,
    /// Its `Data` node in the root graph.
    pub node: NodeId,
}

/// The result of an import: the model and its run-time inputs in graph input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// The model (root graph only; no subgraphs).
    pub model: ir::Model,
    /// The inputs, in the order of the `Data` nodes' `index` attributes.
    pub inputs: Vec<InputInfo>,
}

/// Why a file could not be imported. Every message starts with the file name.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The file could not be read.
    #[error("{file}: cannot read the file: {cause}")]
    Io {
        /// The file.
        file: String,
        /// What the operating system said (not a `source`: the message already carries it,
        /// and a source would print it twice).
        cause: std::io::Error,
    },
    /// The bytes are not a protobuf `ModelProto`.
    #[error("{file}: not a valid ONNX model (protobuf decoding failed: {message})")]
    Malformed {
        /// The file.
        file: String,
        /// The decoder's message.
        message: String,
    },
    /// The model has no graph, or a graph with no outputs.
    #[error("{file}: {problem}; export the model again with at least one graph output")]
    EmptyGraph {
        /// The file.
        file: String,
        /// What is missing.
        problem: &'static str,
    },
    /// The model imports no default-domain opset.
    #[error(
        "{file}: the model imports no default-domain opset (domain \"\" or \"ai.onnx\" in \
         opset_import); export it with an opset in {MIN_OPSET}..={MAX_OPSET}"
    )]
    NoOpset {
        /// The file.
        file: String,
    },
    /// The default-domain opset is outside the supported range.
    #[error(
        "{file}: opset {opset} is not supported ({MIN_OPSET}..={MAX_OPSET}); convert the model \
         with onnx.version_converter or export it with a supported opset"
    )]
    UnsupportedOpset {
        /// The file.
        file: String,
        /// The model's default-domain opset.
        opset: i64,
    },
    /// A graph input is unusable.
    #[error("{file}: graph input `{input}`: {message}")]
    Input {
        /// The file.
        file: String,
        /// The input's name.
        input: String,
        /// Expected vs got.
        message: String,
    },
    /// An initializer is unusable.
    #[error("{file}: initializer `{tensor}`: {message}")]
    Initializer {
        /// The file.
        file: String,
        /// The initializer's name.
        tensor: String,
        /// Expected vs got.
        message: String,
    },
    /// A node's operator comes from a domain other than the default one.
    #[error(
        "{file}: node `{node}` ({op}) is in domain `{domain}`; only the default ONNX domain \
         (\"\" or \"ai.onnx\") is supported"
    )]
    UnsupportedDomain {
        /// The file.
        file: String,
        /// The node.
        node: String,
        /// Its operator type.
        op: String,
        /// Its domain.
        domain: String,
    },
    /// A node reads a value nothing produces.
    #[error(
        "{file}: node `{node}` ({op}) input {index} `{name}` is not produced by any node, graph \
         input or initializer"
    )]
    UnknownValue {
        /// The file.
        file: String,
        /// The node.
        node: String,
        /// Its operator type.
        op: String,
        /// The input's position.
        index: usize,
        /// The value's name.
        name: String,
    },
    /// A node reads a value a later node produces: the file's nodes are not in topological
    /// order.
    #[error(
        "{file}: node `{node}` ({op}) reads `{name}`, which the later node `{producer}` \
         produces; the nodes must be in topological order (sort them with onnx's tools or \
         export the model again)"
    )]
    NotTopological {
        /// The file.
        file: String,
        /// The node.
        node: String,
        /// Its operator type.
        op: String,
        /// The value's name.
        name: String,
        /// The node that produces it (boxed to keep the error small).
        producer: Box<str>,
    },
    /// An attribute of a kind the compiler does not take (graphs, sparse tensors, types).
    #[error(
        "{file}: node `{node}` ({op}) attribute `{attr}` is of type {}, which is not \
         supported (expected FLOAT, INT, STRING, TENSOR, FLOATS, INTS or STRINGS)",
        kind.onnx_name()
    )]
    UnsupportedAttribute {
        /// The file.
        file: String,
        /// The node.
        node: String,
        /// Its operator type.
        op: String,
        /// The attribute.
        attr: String,
        /// Its ONNX type.
        kind: AttributeType,
    },
    /// Another problem with a node (its attributes, outputs or a constant it carries).
    #[error("{file}: node `{node}` ({op}): {message}")]
    Node {
        /// The file.
        file: String,
        /// The node.
        node: String,
        /// Its operator type.
        op: String,
        /// Expected vs got.
        message: String,
    },
    /// A graph output is unusable.
    #[error("{file}: graph output `{output}`: {message}")]
    Output {
        /// The file.
        file: String,
        /// The output's name.
        output: String,
        /// Expected vs got.
        message: String,
    },
    /// The imported graph failed the IR's consistency check (a bug of the importer).
    #[error("{file}: internal error: the imported graph is inconsistent: {message}")]
    Inconsistent {
        /// The file.
        file: String,
        /// What `Graph::check` said.
        message: String,
    },
}

/// Reads and imports a `.onnx` file.
pub fn import_file(path: impl AsRef<Path>) -> Result<Imported, OnnxError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|cause| OnnxError::Io {
        file: file.clone(),
        cause,
    })?;
    import(&bytes, &file)
}

/// Imports the bytes of a `.onnx` file; `file` names it in errors.
pub fn import(bytes: &[u8], file: &str) -> Result<Imported, OnnxError> {
    let model = proto::ModelProto::decode(bytes).map_err(|e| OnnxError::Malformed {
        file: file.to_string(),
        message: e.to_string(),
    })?;
    let opset = default_opset(&model, file)?;
    let Some(graph) = model.graph else {
        return Err(OnnxError::EmptyGraph {
            file: file.to_string(),
            problem: "the model has no graph",
        });
    };
    let mut b = Builder::new(
        file,
        if graph.name.is_empty() {
            "main"
        } else {
            &graph.name
        },
    );
    let inputs = b.inputs(&graph.input, &graph.initializer)?;
    b.initializers(graph.initializer)?;
    b.nodes(graph.node)?;
    b.outputs(&graph.output)?;
    b.graph.check().map_err(|message| OnnxError::Inconsistent {
        file: file.to_string(),
        message,
    })?;
    Ok(Imported {
        model: ir::Model {
            graph: b.graph,
            subgraphs: Vec::new(),
            opset,
        },
        inputs,
    })
}

/// The default-domain opset of the model, checked against the supported range.
fn default_opset(model: &proto::ModelProto, file: &str) -> Result<i64, OnnxError> {
    let mut found: Option<i64> = None;
    for entry in &model.opset_import {
        if !is_default_domain(&entry.domain) {
            continue;
        }
        match found {
            Some(v) if v != entry.version => {
                return Err(OnnxError::Malformed {
                    file: file.to_string(),
                    message: format!(
                        "opset_import lists the default domain twice, with versions {v} and {}",
                        entry.version
                    ),
                });
            }
            _ => found = Some(entry.version),
        }
    }
    let opset = found.ok_or_else(|| OnnxError::NoOpset {
        file: file.to_string(),
    })?;
    if !(MIN_OPSET..=MAX_OPSET).contains(&opset) {
        return Err(OnnxError::UnsupportedOpset {
            file: file.to_string(),
            opset,
        });
    }
    Ok(opset)
}

fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// The ONNX name of a `TensorProto.DataType` code, for messages.
fn onnx_type_name(code: i32) -> String {
    let name = match code {
        0 => "UNDEFINED",
        1 => "FLOAT",
        2 => "UINT8",
        3 => "INT8",
        4 => "UINT16",
        5 => "INT16",
        6 => "INT32",
        7 => "INT64",
        8 => "STRING",
        9 => "BOOL",
        10 => "FLOAT16",
        11 => "DOUBLE",
        12 => "UINT32",
        13 => "UINT64",
        14 => "COMPLEX64",
        15 => "COMPLEX128",
        16 => "BFLOAT16",
        17 => "FLOAT8E4M3FN",
        18 => "FLOAT8E4M3FNUZ",
        19 => "FLOAT8E5M2",
        20 => "FLOAT8E5M2FNUZ",
        21 => "UINT4",
        22 => "INT4",
        23 => "FLOAT4E2M1",
        24 => "FLOAT8E8M0",
        25 => "UINT2",
        26 => "INT2",
        _ => return format!("{code} (unknown)"),
    };
    format!("{code} ({name})")
}

/// The supported element types, for messages.
fn supported_types() -> String {
    DataType::ALL
        .iter()
        .map(|d| d.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The element type of a `TensorProto.DataType` code, or a message saying why not.
fn element_type(code: i32) -> Result<DataType, String> {
    DataType::from_onnx(code).ok_or_else(|| {
        if code == 8 {
            "element type 8 (STRING): string tensors are not supported".to_string()
        } else {
            format!(
                "element type {} is not supported (expected one of {})",
                onnx_type_name(code),
                supported_types()
            )
        }
    })
}

/// Decodes a serialized `TensorProto` (an ONNX test-data `input_0.pb`, say) into its name and
/// an IR tensor, with the same checks as an initializer; the error is a message without
/// context.
pub fn decode_tensor_proto(bytes: &[u8]) -> Result<(String, Tensor), String> {
    let t = TensorProto::decode(bytes).map_err(|e| format!("not a TensorProto: {e}"))?;
    let name = t.name.clone();
    Ok((name, decode_tensor(t)?))
}

/// Decodes a tensor's data into an IR tensor; the error is a message without context.
///
/// The element count is computed from the dims with overflow checks, in the same order as
/// [`Tensor::new`] does, and compared with the data actually present before anything is
/// allocated, so a dims field claiming a huge tensor costs nothing.
fn decode_tensor(t: TensorProto) -> Result<Tensor, String> {
    if t.data_location == DataLocation::External as i32 || !t.external_data.is_empty() {
        return Err(
            "external data is not supported; save the model with the weights inside the file \
             (onnx.save_model(..., save_as_external_data=False))"
                .to_string(),
        );
    }
    let dtype = element_type(t.data_type)?;
    let mut count: i64 = 1;
    for (k, &d) in t.dims.iter().enumerate() {
        if d < 0 {
            return Err(format!("dim {k} is {d}; expected a size >= 0"));
        }
        count = count
            .checked_mul(d)
            .ok_or_else(|| format!("dims {:?} give more elements than fit in 64 bits", t.dims))?;
    }
    let what = format!("{} tensor of dims {:?}", dtype.name(), t.dims);
    let count = usize::try_from(count).map_err(|_| format!("{what} is too large"))?;
    // Sub-byte types are packed in the proto (the first element in the low bits) and held
    // one per byte in memory.
    let bytes = match dtype.packed_bits() {
        Some(bits) => count.div_ceil(8 / bits),
        None => count
            .checked_mul(dtype.size())
            .ok_or_else(|| format!("{what} is too large"))?,
    };
    let typed_fields = [
        ("float_data", t.float_data.len()),
        ("int32_data", t.int32_data.len()),
        ("string_data", t.string_data.len()),
        ("int64_data", t.int64_data.len()),
        ("double_data", t.double_data.len()),
        ("uint64_data", t.uint64_data.len()),
    ];
    let data = if let Some(raw) = t.raw_data {
        if let Some((field, _)) = typed_fields.iter().find(|(_, n)| *n > 0) {
            return Err(format!(
                "data is given twice, in raw_data and in {field}; expected one of them"
            ));
        }
        if raw.len() != bytes {
            return Err(format!(
                "raw_data holds {} bytes; the {what} needs {bytes}",
                raw.len()
            ));
        }
        raw
    } else {
        let field = typed_field(dtype);
        if let Some((other, _)) = typed_fields
            .iter()
            .find(|(name, n)| *n > 0 && *name != field)
        {
            return Err(format!(
                "the {what} has data in {other}; expected raw_data or {field}"
            ));
        }
        let present = typed_fields
            .iter()
            .find(|(name, _)| *name == field)
            .map_or(0, |(_, n)| *n);
        // Packed types keep one packed byte per int32_data value.
        let want = if dtype.packed_bits().is_some() {
            bytes
        } else {
            count
        };
        if present != want {
            return Err(format!(
                "{field} holds {present} values; the {what} needs {want}"
            ));
        }
        let mut out = Vec::with_capacity(bytes);
        match dtype {
            DataType::F32 => t
                .float_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            DataType::F64 => t
                .double_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            DataType::I64 => t
                .int64_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            DataType::U32 | DataType::U64 => {
                for (k, &v) in t.uint64_data.iter().enumerate() {
                    if dtype == DataType::U32 && u32::try_from(v).is_err() {
                        return Err(format!(
                            "uint64_data[{k}] is {v}, which is not a valid u32 element"
                        ));
                    }
                    out.extend_from_slice(&v.to_le_bytes()[..dtype.size()]);
                }
            }
            DataType::I32 => t
                .int32_data
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            _ => {
                let unit = if dtype.packed_bits().is_some() {
                    1
                } else {
                    dtype.size()
                };
                for (k, &v) in t.int32_data.iter().enumerate() {
                    let narrow = narrow_int32(dtype, v).ok_or_else(|| {
                        format!(
                            "int32_data[{k}] is {v}, which is not a valid {} element",
                            dtype.name()
                        )
                    })?;
                    out.extend_from_slice(&narrow[..unit]);
                }
            }
        }
        out
    };
    let data = match dtype.packed_bits() {
        Some(bits) => numeric::unpack(&data, bits, count, dtype.is_signed_int()),
        None => data,
    };
    Tensor::new(dtype, t.dims, data)
}

/// The typed field of `TensorProto` that holds `dtype`'s elements when `raw_data` does not.
fn typed_field(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F32 => "float_data",
        DataType::F64 => "double_data",
        DataType::I64 => "int64_data",
        DataType::U32 | DataType::U64 => "uint64_data",
        _ => "int32_data",
    }
}

/// The little-endian bytes (first `dtype.size()` of the array; one packed byte for sub-byte
/// types) of an `int32_data` element of a narrow type, or `None` when the value does not fit.
fn narrow_int32(dtype: DataType, v: i32) -> Option<[u8; 2]> {
    if dtype.packed_bits().is_some() {
        return u8::try_from(v).ok().map(|x| [x, 0]);
    }
    match dtype {
        // 16-bit floats are their bit patterns as an unsigned 16-bit value.
        DataType::F16 | DataType::BF16 | DataType::U16 => {
            u16::try_from(v).ok().map(u16::to_le_bytes)
        }
        DataType::I16 => i16::try_from(v).ok().map(i16::to_le_bytes),
        DataType::I8 => i8::try_from(v).ok().map(|x| [x.to_le_bytes()[0], 0]),
        DataType::Bool => match v {
            0 | 1 => Some([v as u8, 0]),
            _ => None,
        },
        // One-byte types, float8 bit patterns among them.
        _ if dtype.size() == 1 => u8::try_from(v).ok().map(|x| [x, 0]),
        _ => None,
    }
}

/// Builds the root graph, keeping the names of values and nodes.
struct Builder<'f> {
    file: &'f str,
    graph: ir::Graph,
    /// ONNX value name -> the output that holds it.
    values: BTreeMap<String, Value>,
    /// Node names in use.
    names: BTreeSet<String>,
    /// Per operator type, how many unnamed nodes have been named `<op>_<k>`.
    unnamed: BTreeMap<String, usize>,
    /// Per repeated name, the next suffix `unique_name` tries.
    suffixes: BTreeMap<String, usize>,
}

/// What the importer knows of a node while converting it, for error messages.
struct NodeCtx<'a> {
    file: &'a str,
    name: &'a str,
    op: &'a str,
}

impl NodeCtx<'_> {
    fn error(&self, message: impl Into<String>) -> OnnxError {
        OnnxError::Node {
            file: self.file.to_string(),
            node: self.name.to_string(),
            op: self.op.to_string(),
            message: message.into(),
        }
    }
}

impl<'f> Builder<'f> {
    fn new(file: &'f str, name: &str) -> Builder<'f> {
        Builder {
            file,
            graph: ir::Graph::new(name),
            values: BTreeMap::new(),
            names: BTreeSet::new(),
            unnamed: BTreeMap::new(),
            suffixes: BTreeMap::new(),
        }
    }

    /// `base` if no node has that name yet, else `base_1`, `base_2`, ... whichever is free.
    /// The next suffix to try is remembered per base, so a file repeating one name many times
    /// costs linear time.
    fn unique_name(&mut self, base: &str) -> String {
        if self.names.insert(base.to_string()) {
            return base.to_string();
        }
        let next = self.suffixes.entry(base.to_string()).or_insert(1);
        loop {
            let candidate = format!("{base}_{next}");
            *next += 1;
            if self.names.insert(candidate.clone()) {
                return candidate;
            }
        }
    }

    /// The `Data` nodes of the graph inputs that are not initializers.
    fn inputs(
        &mut self,
        inputs: &[proto::ValueInfoProto],
        initializers: &[TensorProto],
    ) -> Result<Vec<InputInfo>, OnnxError> {
        let constant: BTreeSet<&str> = initializers.iter().map(|t| t.name.as_str()).collect();
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for vi in inputs {
            let error = |message: String| OnnxError::Input {
                file: self.file.to_string(),
                input: vi.name.clone(),
                message,
            };
            if vi.name.is_empty() {
                return Err(error("the input has no name".to_string()));
            }
            if !seen.insert(vi.name.as_str()) {
                return Err(error(
                    "the name is listed twice among the graph inputs; expected unique names"
                        .to_string(),
                ));
            }
            if constant.contains(vi.name.as_str()) {
                // An input with an initializer of the same name is a constant with a default
                // value; the compiler treats it as the constant.
                continue;
            }
            let tensor = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(proto::type_proto::Value::TensorType(t)) => t,
                None => {
                    return Err(error(
                        "expected a tensor type, got no type or a non-tensor type (sequence, \
                         map, optional and sparse inputs are not supported)"
                            .to_string(),
                    ));
                }
            };
            let dtype = element_type(tensor.elem_type).map_err(error)?;
            let Some(shape) = &tensor.shape else {
                return Err(error(
                    "the input has no shape; expected at least its rank (export the model with \
                     input shapes, using dim_param names for the dynamic dims)"
                        .to_string(),
                ));
            };
            let mut dims = Vec::with_capacity(shape.dim.len());
            for (k, d) in shape.dim.iter().enumerate() {
                use proto::tensor_shape_proto::dimension::Value as D;
                dims.push(match &d.value {
                    Some(D::DimValue(v)) if *v >= 0 => Some(*v),
                    Some(D::DimValue(v)) => {
                        return Err(error(format!(
                            "dim {k} is {v}; expected a size >= 0 or a dim_param name"
                        )));
                    }
                    Some(D::DimParam(_)) | None => None,
                });
            }
            let shape: ir::Shape = dims.iter().map(|d| Dim::Fixed(d.unwrap_or(-1))).collect();
            let name = self.unique_name(&vi.name);
            let mut node = Node::new(
                name,
                "Data",
                Vec::new(),
                vec![TensorDesc::new(dtype, shape)],
            );
            node.attrs
                .insert("index".to_string(), Attr::Int(out.len() as i64));
            let id = self.graph.add(node);
            self.values.insert(
                vi.name.clone(),
                Value {
                    node: id,
                    output: 0,
                },
            );
            out.push(InputInfo {
                name: vi.name.clone(),
                dtype,
                dims,
                node: id,
            });
        }
        Ok(out)
    }

    /// One `Const` node per initializer, named after it.
    fn initializers(&mut self, initializers: Vec<TensorProto>) -> Result<(), OnnxError> {
        for t in initializers {
            let name = t.name.clone();
            let error = |message: String| OnnxError::Initializer {
                file: self.file.to_string(),
                tensor: name.clone(),
                message,
            };
            if name.is_empty() {
                return Err(error("the initializer has no name".to_string()));
            }
            if self.values.contains_key(&name) {
                return Err(error(
                    "the name is used by two initializers; expected unique names".to_string(),
                ));
            }
            let tensor = decode_tensor(t).map_err(error)?;
            let node_name = self.unique_name(&name);
            self.add_const(node_name, tensor, &name);
        }
        Ok(())
    }

    fn add_const(&mut self, node_name: String, tensor: Tensor, value_name: &str) {
        let mut node = Node::new(
            node_name,
            "Const",
            Vec::new(),
            vec![TensorDesc::of(&tensor)],
        );
        node.attrs.insert("value".to_string(), Attr::Tensor(tensor));
        let id = self.graph.add(node);
        if !value_name.is_empty() {
            self.values.insert(
                value_name.to_string(),
                Value {
                    node: id,
                    output: 0,
                },
            );
        }
    }

    /// The file's nodes, in order.
    fn nodes(&mut self, nodes: Vec<NodeProto>) -> Result<(), OnnxError> {
        // Which node first produces each value (its position, and how to call it), so that a
        // node reading a value produced later gets a precise message.
        let mut producers: BTreeMap<&str, (usize, String)> = BTreeMap::new();
        for (k, n) in nodes.iter().enumerate() {
            for o in &n.output {
                if !o.is_empty() && !producers.contains_key(o.as_str()) {
                    let what = if n.name.is_empty() {
                        format!("{} (node {k} of the file)", n.op_type)
                    } else {
                        n.name.clone()
                    };
                    producers.insert(o, (k, what));
                }
            }
        }
        let later: BTreeMap<String, (usize, String)> = producers
            .into_iter()
            .map(|(name, p)| (name.to_string(), p))
            .collect();
        for (k, n) in nodes.into_iter().enumerate() {
            let name = if n.op_type.is_empty() {
                self.unique_name(&format!("node_{k}"))
            } else if n.name.is_empty() {
                let counter = self.unnamed.entry(n.op_type.clone()).or_insert(0);
                let base = format!("{}_{}", n.op_type, counter);
                *counter += 1;
                self.unique_name(&base)
            } else {
                self.unique_name(&n.name)
            };
            let ctx = NodeCtx {
                file: self.file,
                name: &name,
                op: &n.op_type,
            };
            if n.op_type.is_empty() {
                return Err(ctx.error("the node has no op_type"));
            }
            if !is_default_domain(&n.domain) {
                return Err(OnnxError::UnsupportedDomain {
                    file: self.file.to_string(),
                    node: name.clone(),
                    op: n.op_type.clone(),
                    domain: n.domain.clone(),
                });
            }
            let mut inputs = Vec::with_capacity(n.input.len());
            for (index, iname) in n.input.iter().enumerate() {
                if iname.is_empty() {
                    inputs.push(None);
                    continue;
                }
                match self.values.get(iname) {
                    Some(v) => inputs.push(Some(*v)),
                    None => match later.get(iname) {
                        Some((p, producer)) if *p >= k => {
                            return Err(OnnxError::NotTopological {
                                file: self.file.to_string(),
                                node: name.clone(),
                                op: n.op_type.clone(),
                                name: iname.clone(),
                                producer: producer.as_str().into(),
                            });
                        }
                        _ => {
                            return Err(OnnxError::UnknownValue {
                                file: self.file.to_string(),
                                node: name.clone(),
                                op: n.op_type.clone(),
                                index,
                                name: iname.clone(),
                            });
                        }
                    },
                }
            }
            let mut attrs = BTreeMap::new();
            for a in n.attribute {
                let attr_name = a.name.clone();
                if attr_name.is_empty() {
                    return Err(ctx.error("an attribute has no name"));
                }
                let value = convert_attr(a, &ctx)?;
                if attrs.insert(attr_name.clone(), value).is_some() {
                    return Err(ctx.error(format!(
                        "attribute `{attr_name}` is given twice; expected it once"
                    )));
                }
            }
            if n.op_type == "Constant" {
                self.constant_node(&ctx, &n.output, &inputs, attrs)?;
                continue;
            }
            let mut node = Node::new(
                name.clone(),
                n.op_type.clone(),
                inputs,
                n.output
                    .iter()
                    .map(|_| TensorDesc::new(DataType::F32, Vec::new()))
                    .collect(),
            );
            node.attrs = attrs;
            let id = self.graph.add(node);
            self.define_outputs(&ctx, &n.output, id)?;
        }
        Ok(())
    }

    /// Registers a node's output names, refusing a name that is already defined.
    fn define_outputs(
        &mut self,
        ctx: &NodeCtx<'_>,
        outputs: &[String],
        id: NodeId,
    ) -> Result<(), OnnxError> {
        for (k, o) in outputs.iter().enumerate() {
            if o.is_empty() {
                continue;
            }
            if let Some(prev) = self.values.get(o) {
                return Err(ctx.error(format!(
                    "output {k} `{o}` is already produced by `{}`; expected every value to be \
                     produced once",
                    self.graph.node(prev.node).name
                )));
            }
            self.values.insert(
                o.clone(),
                Value {
                    node: id,
                    output: k as u32,
                },
            );
        }
        Ok(())
    }

    /// A `Constant` node becomes a `Const` node carrying its value.
    fn constant_node(
        &mut self,
        ctx: &NodeCtx<'_>,
        outputs: &[String],
        inputs: &[Option<Value>],
        attrs: BTreeMap<String, Attr>,
    ) -> Result<(), OnnxError> {
        if !inputs.is_empty() {
            return Err(ctx.error(format!("expected no inputs, got {}", inputs.len())));
        }
        let [out] = outputs else {
            return Err(ctx.error(format!("expected 1 output, got {}", outputs.len())));
        };
        if attrs.len() != 1 {
            let names: Vec<&str> = attrs.keys().map(String::as_str).collect();
            return Err(ctx.error(format!(
                "expected exactly one of the attributes value, value_float, value_floats, \
                 value_int, value_ints; got {names:?}"
            )));
        }
        let mut tensor = None;
        for (key, value) in attrs {
            tensor = Some(match (key.as_str(), value) {
                ("value", Attr::Tensor(t)) => t,
                ("value_float", Attr::Float(f)) => Tensor::from_f32s(Vec::new(), &[f]),
                ("value_floats", Attr::Floats(v)) => Tensor::from_f32s(vec![v.len() as i64], &v),
                ("value_int", Attr::Int(i)) => Tensor::from_i64s(Vec::new(), &[i]),
                ("value_ints", Attr::Ints(v)) => Tensor::from_i64s(vec![v.len() as i64], &v),
                (key, value) => {
                    return Err(ctx.error(format!(
                        "attribute `{key}` = {value} is not supported; expected a `value` \
                         tensor, value_float, value_floats, value_int or value_ints"
                    )));
                }
            });
        }
        let Some(tensor) = tensor else {
            return Err(ctx.error("the Constant has no value"));
        };
        if let Some(prev) = self.values.get(out) {
            return Err(ctx.error(format!(
                "output 0 `{out}` is already produced by `{}`; expected every value to be \
                 produced once",
                self.graph.node(prev.node).name
            )));
        }
        self.add_const(ctx.name.to_string(), tensor, out);
        Ok(())
    }

    /// The `NetOutput` node reading the graph outputs in order.
    fn outputs(&mut self, outputs: &[proto::ValueInfoProto]) -> Result<(), OnnxError> {
        if outputs.is_empty() {
            return Err(OnnxError::EmptyGraph {
                file: self.file.to_string(),
                problem: "the graph has no outputs",
            });
        }
        let mut inputs = Vec::with_capacity(outputs.len());
        let mut names = Vec::with_capacity(outputs.len());
        for vi in outputs {
            let error = |message: &str| OnnxError::Output {
                file: self.file.to_string(),
                output: vi.name.clone(),
                message: message.to_string(),
            };
            if vi.name.is_empty() {
                return Err(error("the output has no name"));
            }
            if names.contains(&vi.name) {
                return Err(error(
                    "the name is listed twice among the graph outputs; expected unique names",
                ));
            }
            let Some(v) = self.values.get(&vi.name) else {
                return Err(error(
                    "it is not produced by any node, graph input or initializer",
                ));
            };
            inputs.push(Some(*v));
            names.push(vi.name.clone());
        }
        let name = self.unique_name("NetOutput");
        let mut node = Node::new(name, "NetOutput", inputs, Vec::new());
        node.attrs
            .insert("output_names".to_string(), Attr::Strs(names));
        self.graph.add(node);
        Ok(())
    }
}

/// Converts one attribute to its IR value.
fn convert_attr(a: AttributeProto, ctx: &NodeCtx<'_>) -> Result<Attr, OnnxError> {
    let name = a.name.clone();
    if !a.ref_attr_name.is_empty() {
        return Err(ctx.error(format!(
            "attribute `{name}` refers to the function attribute `{}`; expected a value \
             (references are only valid inside function bodies)",
            a.ref_attr_name
        )));
    }
    let kind = AttributeType::try_from(a.r#type).map_err(|_| {
        ctx.error(format!(
            "attribute `{name}` has type code {}, which is not an ONNX attribute type",
            a.r#type
        ))
    })?;
    let utf8 = |bytes: Vec<u8>, what: &str| {
        String::from_utf8(bytes).map_err(|e| {
            ctx.error(format!(
                "attribute `{name}`{what} is not valid UTF-8 (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
        })
    };
    Ok(match kind {
        AttributeType::Float => Attr::Float(a.f),
        AttributeType::Int => Attr::Int(a.i),
        AttributeType::String => Attr::Str(utf8(a.s, "")?),
        AttributeType::Tensor => {
            let Some(t) = a.t else {
                return Err(ctx.error(format!(
                    "attribute `{name}` is of type TENSOR but holds no tensor"
                )));
            };
            Attr::Tensor(
                decode_tensor(t).map_err(|m| ctx.error(format!("attribute `{name}`: {m}")))?,
            )
        }
        AttributeType::Floats => Attr::Floats(a.floats),
        AttributeType::Ints => Attr::Ints(a.ints),
        AttributeType::Strings => {
            let mut out = Vec::with_capacity(a.strings.len());
            for (k, s) in a.strings.into_iter().enumerate() {
                out.push(utf8(s, &format!("[{k}]"))?);
            }
            Attr::Strs(out)
        }
        AttributeType::Undefined => {
            return Err(ctx.error(format!(
                "attribute `{name}` has no type (UNDEFINED); expected FLOAT, INT, STRING, \
                 TENSOR, FLOATS, INTS or STRINGS (files of IR version 1 are not supported)"
            )));
        }
        AttributeType::Graph
        | AttributeType::Graphs
        | AttributeType::Tensors
        | AttributeType::SparseTensor
        | AttributeType::SparseTensors
        | AttributeType::TypeProto
        | AttributeType::TypeProtos => {
            return Err(OnnxError::UnsupportedAttribute {
                file: ctx.file.to_string(),
                node: ctx.name.to_string(),
                op: ctx.op.to_string(),
                attr: name,
                kind,
            });
        }
    })
}
