//! Element types and constant tensor data, shared by the compiler (weights, folded shape values)
//! and the runtime (inputs, outputs, `.npy` files): what a `.om` model's inputs and outputs
//! hold. Element types carry their ONNX `TensorProto.DataType` codes, which the `.om` model
//! description stores.

use std::fmt::Write as _;
use std::sync::Arc;

use crate::numeric;

pub use crate::dtype::DataType;

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

    /// Elements as i64 (integers and bools exactly, u64 wrapped, floats truncated).
    pub fn to_i64s(&self) -> Vec<i64> {
        (0..self.len())
            .map(|i| match numeric::decode(self.dtype, &self.data, i) {
                numeric::Scalar::Int(v) => v as i64,
                numeric::Scalar::Float(x) => x as i64,
            })
            .collect()
    }

    /// Elements as f64 (floats exactly, integers rounded once beyond 2^53).
    pub fn to_f64s(&self) -> Vec<f64> {
        (0..self.len())
            .map(|i| numeric::decode(self.dtype, &self.data, i).to_f64())
            .collect()
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
