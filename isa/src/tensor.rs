//! Element types and constant tensor data, shared by the compiler (weights, folded shape values)
//! and the runtime (inputs, outputs, `.npy` files): what a `.om` model's inputs and outputs
//! hold. Element types carry their ONNX `TensorProto.DataType` codes, which the `.om` model
//! description stores.

use std::fmt::Write as _;
use std::sync::Arc;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DataType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// IEEE binary64.
    F64,
    /// Signed 8-bit.
    I8,
    /// Signed 16-bit.
    I16,
    /// Signed 32-bit.
    I32,
    /// Signed 64-bit.
    I64,
    /// Unsigned 8-bit.
    U8,
    /// Boolean (one byte).
    Bool,
}

impl DataType {
    /// Every type.
    pub const ALL: [DataType; 9] = [
        DataType::F32,
        DataType::F16,
        DataType::F64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::U8,
        DataType::Bool,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 => 8,
            DataType::F32 | DataType::I32 => 4,
            DataType::F16 | DataType::I16 => 2,
            DataType::I8 | DataType::U8 | DataType::Bool => 1,
        }
    }

    /// ONNX `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        match self {
            DataType::F32 => 1,
            DataType::U8 => 2,
            DataType::I8 => 3,
            DataType::I16 => 5,
            DataType::I32 => 6,
            DataType::I64 => 7,
            DataType::Bool => 9,
            DataType::F16 => 10,
            DataType::F64 => 11,
        }
    }

    /// The type of an ONNX code, if supported.
    pub fn from_onnx(code: i32) -> Option<DataType> {
        DataType::ALL
            .iter()
            .copied()
            .find(|d| d.onnx_code() == code)
    }

    /// Short name (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F16 => "f16",
            DataType::F64 => "f64",
            DataType::I8 => "i8",
            DataType::I16 => "i16",
            DataType::I32 => "i32",
            DataType::I64 => "i64",
            DataType::U8 => "u8",
            DataType::Bool => "bool",
        }
    }

    /// GE's name of the type (`TypeUtils::DataTypeToSerialString`), as in graph attributes.
    pub fn ge_name(self) -> &'static str {
        match self {
            DataType::F16 => "DT_FLOAT16",
            DataType::F32 => "DT_FLOAT",
            DataType::F64 => "DT_DOUBLE",
            DataType::I8 => "DT_INT8",
            DataType::I16 => "DT_INT16",
            DataType::I32 => "DT_INT32",
            DataType::I64 => "DT_INT64",
            DataType::U8 => "DT_UINT8",
            DataType::Bool => "DT_BOOL",
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DataType::F32 | DataType::F16 | DataType::F64)
    }
}

/// Constant tensor data (weights, folded shape values), shared cheaply between graph copies.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Element type.
    pub dtype: DataType,
    /// Sizes.
    pub dims: Vec<i64>,
    /// Little-endian element bytes.
    pub data: Arc<Vec<u8>>,
}

impl Tensor {
    /// A tensor from raw little-endian bytes (checked against the element count).
    pub fn new(dtype: DataType, dims: Vec<i64>, data: Vec<u8>) -> Result<Tensor, String> {
        let count: i64 = dims.iter().product();
        let want = count.max(0) as usize * dtype.size();
        if data.len() != want {
            return Err(format!(
                "{} tensor of shape {dims:?} needs {want} bytes, got {}",
                dtype.name(),
                data.len()
            ));
        }
        Ok(Tensor {
            dtype,
            dims,
            data: Arc::new(data),
        })
    }

    /// An int64 tensor.
    pub fn from_i64s(dims: Vec<i64>, values: &[i64]) -> Tensor {
        Tensor {
            dtype: DataType::I64,
            dims,
            data: Arc::new(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        }
    }

    /// An int32 tensor.
    pub fn from_i32s(dims: Vec<i64>, values: &[i32]) -> Tensor {
        Tensor {
            dtype: DataType::I32,
            dims,
            data: Arc::new(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        }
    }

    /// A float32 tensor.
    pub fn from_f32s(dims: Vec<i64>, values: &[f32]) -> Tensor {
        Tensor {
            dtype: DataType::F32,
            dims,
            data: Arc::new(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.size()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Elements as i64 (integers and bools exactly, floats truncated).
    pub fn to_i64s(&self) -> Vec<i64> {
        let b = &self.data;
        match self.dtype {
            DataType::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            DataType::I32 => b
                .chunks_exact(4)
                .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4]))))
                .collect(),
            DataType::I16 => b
                .chunks_exact(2)
                .map(|c| i64::from(i16::from_le_bytes([c[0], c[1]])))
                .collect(),
            DataType::I8 => b.iter().map(|v| i64::from(*v as i8)).collect(),
            DataType::U8 | DataType::Bool => b.iter().map(|v| i64::from(*v)).collect(),
            DataType::F32 | DataType::F16 | DataType::F64 => {
                self.to_f64s().iter().map(|v| *v as i64).collect()
            }
        }
    }

    /// Elements as f64.
    pub fn to_f64s(&self) -> Vec<f64> {
        let b = &self.data;
        match self.dtype {
            DataType::F32 => b
                .chunks_exact(4)
                .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))))
                .collect(),
            DataType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
            DataType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DataType::I64
            | DataType::I32
            | DataType::I16
            | DataType::I8
            | DataType::U8
            | DataType::Bool => self.to_i64s().iter().map(|v| *v as f64).collect(),
        }
    }

    /// A short description for dumps: type, shape and (for small tensors) the values.
    pub fn summary(&self) -> String {
        let mut s = format!("{}{:?}", self.dtype.name(), self.dims);
        // Small float tensors and integer tensors up to a gear table's size show their values.
        if self.dtype.is_float() && self.len() <= 8 {
            // Printed at the element type's own precision (the shortest form that reads back).
            let v = self.to_f64s();
            let _ = match self.dtype {
                DataType::F64 => write!(s, "={v:?}"),
                _ => write!(s, "={:?}", v.iter().map(|x| *x as f32).collect::<Vec<_>>()),
            };
        } else if !self.dtype.is_float() && self.len() <= 64 {
            let _ = write!(s, "={:?}", self.to_i64s());
        } else {
            let _ = write!(s, " ({} bytes)", self.data.len());
        }
        s
    }
}
