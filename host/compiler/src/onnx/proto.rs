//! The ONNX protobuf messages the importer reads, written by hand as `prost` derives.
//!
//! Only the subset the compiler needs is declared; prost skips fields it does not know, so a
//! model that uses the others (metadata, training info, sparse initializers, quantization
//! annotations) still decodes. Field numbers and wire types follow the public `onnx.proto`
//! numbering, which ONNX only ever extends and never renumbers. `onnx.proto` is a
//! proto2 file: its `TensorProto` data fields are declared packed, while `AttributeProto`'s
//! `floats` and `ints` are not, and encoders write them accordingly; a decoder accepts either
//! form, and the declarations below encode as ONNX's own tools do.

/// A model file: the graph and the operator sets it was written for.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// Version of the ONNX IR the file follows.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// The operator sets the graph's nodes bind against, one per domain.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// The tool that wrote the file.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// The tool's version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// Documentation.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// The computation.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
}

/// One operator set a model imports: a domain and its version.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// Domain; empty (or `ai.onnx`) for the default ONNX operators.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// Version of the operator set.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// A graph: nodes in topological order, its inputs, outputs and constant tensors.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// The nodes, sorted topologically.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// Name of the graph.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Constant tensors (weights), each named.
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// Documentation.
    #[prost(string, tag = "10")]
    pub doc_string: String,
    /// Inputs of the graph (older files also list the initializers here).
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// Outputs of the graph.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    /// Types of intermediate values, when the writer recorded them.
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// One operator application.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// Names of the values it reads; an empty name is an absent optional input.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Names of the values it produces; an empty name is an unused optional output.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// Name of the node (may be empty).
    #[prost(string, tag = "3")]
    pub name: String,
    /// Operator type, such as `Conv`.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// Attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    /// Documentation.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// Domain of the operator; empty for the default ONNX operators.
    #[prost(string, tag = "7")]
    pub domain: String,
}

/// Which value field of an [`AttributeProto`] is in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum AttributeType {
    /// No type given (only IR version 1 files).
    Undefined = 0,
    /// `f`.
    Float = 1,
    /// `i`.
    Int = 2,
    /// `s`.
    String = 3,
    /// `t`.
    Tensor = 4,
    /// `g`.
    Graph = 5,
    /// `floats`.
    Floats = 6,
    /// `ints`.
    Ints = 7,
    /// `strings`.
    Strings = 8,
    /// `tensors`.
    Tensors = 9,
    /// `graphs`.
    Graphs = 10,
    /// A sparse tensor.
    SparseTensor = 11,
    /// A list of sparse tensors.
    SparseTensors = 12,
    /// A type.
    TypeProto = 13,
    /// A list of types.
    TypeProtos = 14,
}

impl AttributeType {
    /// The name ONNX gives the type (`FLOAT`, `GRAPH`, ...).
    pub fn onnx_name(self) -> &'static str {
        match self {
            AttributeType::Undefined => "UNDEFINED",
            AttributeType::Float => "FLOAT",
            AttributeType::Int => "INT",
            AttributeType::String => "STRING",
            AttributeType::Tensor => "TENSOR",
            AttributeType::Graph => "GRAPH",
            AttributeType::Floats => "FLOATS",
            AttributeType::Ints => "INTS",
            AttributeType::Strings => "STRINGS",
            AttributeType::Tensors => "TENSORS",
            AttributeType::Graphs => "GRAPHS",
            AttributeType::SparseTensor => "SPARSE_TENSOR",
            AttributeType::SparseTensors => "SPARSE_TENSORS",
            AttributeType::TypeProto => "TYPE_PROTO",
            AttributeType::TypeProtos => "TYPE_PROTOS",
        }
    }
}

/// A named attribute of a node; `type` says which value field holds its value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// A float value.
    #[prost(float, tag = "2")]
    pub f: f32,
    /// An integer value.
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// A string value (UTF-8 bytes).
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    /// A tensor value.
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    /// A graph value (the body of `If`, `Loop`, `Scan`).
    #[prost(message, optional, tag = "6")]
    pub g: Option<GraphProto>,
    /// A list of floats.
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    /// A list of integers.
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    /// A list of strings (UTF-8 bytes each).
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    /// A list of tensors.
    #[prost(message, repeated, tag = "10")]
    pub tensors: Vec<TensorProto>,
    /// A list of graphs.
    #[prost(message, repeated, tag = "11")]
    pub graphs: Vec<GraphProto>,
    /// Documentation.
    #[prost(string, tag = "13")]
    pub doc_string: String,
    /// Which value field is in use (an [`AttributeType`] code).
    #[prost(enumeration = "AttributeType", tag = "20")]
    pub r#type: i32,
    /// In a function body, the name of the caller's attribute this one refers to.
    #[prost(string, tag = "21")]
    pub ref_attr_name: String,
}

/// Where a tensor's data is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum DataLocation {
    /// In the message (`raw_data` or a typed field).
    Default = 0,
    /// In another file named by `external_data`.
    External = 1,
}

/// A tensor value: shape, element type and data, in `raw_data` (little-endian) or in the typed
/// field for its element type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// Sizes.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// Element type (a `TensorProto.DataType` code).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// Elements of float tensors.
    #[prost(float, repeated, tag = "4")]
    pub float_data: Vec<f32>,
    /// Elements of int32, int16, int8, uint16, uint8 and bool tensors, and the bits of float16
    /// elements.
    #[prost(int32, repeated, tag = "5")]
    pub int32_data: Vec<i32>,
    /// Elements of string tensors.
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub string_data: Vec<Vec<u8>>,
    /// Elements of int64 tensors.
    #[prost(int64, repeated, tag = "7")]
    pub int64_data: Vec<i64>,
    /// Name (initializers are referred to by it).
    #[prost(string, tag = "8")]
    pub name: String,
    /// Elements as fixed-width little-endian bytes; present (even empty) means it is used.
    #[prost(bytes = "vec", optional, tag = "9")]
    pub raw_data: Option<Vec<u8>>,
    /// Elements of double tensors.
    #[prost(double, repeated, tag = "10")]
    pub double_data: Vec<f64>,
    /// Elements of uint32 and uint64 tensors.
    #[prost(uint64, repeated, tag = "11")]
    pub uint64_data: Vec<u64>,
    /// Documentation.
    #[prost(string, tag = "12")]
    pub doc_string: String,
    /// Where the data lives when it is outside the file (`location`, `offset`, `length`).
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// Where the data is stored (a [`DataLocation`] code).
    #[prost(enumeration = "DataLocation", tag = "14")]
    pub data_location: i32,
}

/// A key and a value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// Key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A named value and its type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
    /// Documentation.
    #[prost(string, tag = "3")]
    pub doc_string: String,
}

/// The type of a value; only tensor types are declared (sequence, map, optional and sparse
/// types decode as `value: None`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// The kind of type.
    #[prost(oneof = "type_proto::Value", tags = "1")]
    pub value: Option<type_proto::Value>,
}

/// Messages nested in [`TypeProto`].
pub mod type_proto {
    /// The kinds of type the importer knows.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        /// A tensor type.
        #[prost(message, tag = "1")]
        TensorType(Tensor),
    }

    /// A tensor type: element type and (optionally) shape.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Tensor {
        /// Element type (a `TensorProto.DataType` code).
        #[prost(int32, tag = "1")]
        pub elem_type: i32,
        /// Shape; absent when even the rank is unknown.
        #[prost(message, optional, tag = "2")]
        pub shape: Option<super::TensorShapeProto>,
    }
}

/// A shape: one entry per dimension.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// The dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<tensor_shape_proto::Dimension>,
}

/// Messages nested in [`TensorShapeProto`].
pub mod tensor_shape_proto {
    /// One dimension: a size, a symbolic name, or neither (unknown).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Dimension {
        /// The size or its name.
        #[prost(oneof = "dimension::Value", tags = "1, 2")]
        pub value: Option<dimension::Value>,
        /// Standard meaning of the dimension (`DATA_BATCH`, ...).
        #[prost(string, tag = "3")]
        pub denotation: String,
    }

    /// Messages nested in [`Dimension`].
    pub mod dimension {
        /// A dimension's size or name.
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            /// A known size.
            #[prost(int64, tag = "1")]
            DimValue(i64),
            /// A symbolic name (`N`, `batch`).
            #[prost(string, tag = "2")]
            DimParam(String),
        }
    }
}
