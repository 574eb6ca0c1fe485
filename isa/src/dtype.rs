//! Element types: what a tensor's elements are, with their ONNX `TensorProto.DataType` codes
//! (which the `.om` model description stores), sizes in memory and names.

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
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    BF16,
    /// Unsigned 16-bit.
    U16,
    /// Unsigned 32-bit.
    U32,
    /// Unsigned 64-bit.
    U64,
    /// float8 E4M3, finite (no infinity; one NaN pattern per sign).
    F8E4M3FN,
    /// float8 E4M3, finite, no negative zero (0x80 is NaN).
    F8E4M3FNUZ,
    /// float8 E5M2 (IEEE-like, with infinities).
    F8E5M2,
    /// float8 E5M2, finite, no negative zero (0x80 is NaN).
    F8E5M2FNUZ,
    /// Unsigned 4-bit (held one per byte; packed two per byte in ONNX tensors).
    U4,
    /// Signed 4-bit (held one per byte, sign-extended; packed in ONNX tensors).
    I4,
    /// float4 E2M1 (no infinity or NaN; held one per byte, packed in ONNX tensors).
    F4E2M1,
    /// float8 E8M0: a power of two `2^(bits - 127)`, 0xff NaN.
    F8E8M0,
    /// Unsigned 2-bit (held one per byte; packed four per byte in ONNX tensors).
    U2,
    /// Signed 2-bit (held one per byte, sign-extended; packed in ONNX tensors).
    I2,
}

impl DataType {
    /// Every type.
    pub const ALL: [DataType; 23] = [
        DataType::F32,
        DataType::F16,
        DataType::F64,
        DataType::I8,
        DataType::I16,
        DataType::I32,
        DataType::I64,
        DataType::U8,
        DataType::Bool,
        DataType::BF16,
        DataType::U16,
        DataType::U32,
        DataType::U64,
        DataType::F8E4M3FN,
        DataType::F8E4M3FNUZ,
        DataType::F8E5M2,
        DataType::F8E5M2FNUZ,
        DataType::U4,
        DataType::I4,
        DataType::F4E2M1,
        DataType::F8E8M0,
        DataType::U2,
        DataType::I2,
    ];

    /// Bytes per element in memory (sub-byte types take one byte each, as ml_dtypes holds
    /// them in numpy arrays; only ONNX tensors pack them, see [`DataType::packed_bits`]).
    pub fn size(self) -> usize {
        match self {
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::I16 | DataType::BF16 | DataType::U16 => 2,
            DataType::I8
            | DataType::U8
            | DataType::Bool
            | DataType::F8E4M3FN
            | DataType::F8E4M3FNUZ
            | DataType::F8E5M2
            | DataType::F8E5M2FNUZ
            | DataType::F8E8M0
            | DataType::U4
            | DataType::I4
            | DataType::F4E2M1
            | DataType::U2
            | DataType::I2 => 1,
        }
    }

    /// Bits per element in an ONNX tensor's packed data, for the sub-byte types.
    pub fn packed_bits(self) -> Option<usize> {
        match self {
            DataType::U4 | DataType::I4 | DataType::F4E2M1 => Some(4),
            DataType::U2 | DataType::I2 => Some(2),
            _ => None,
        }
    }

    /// Whether it is a signed integer type (held sign-extended).
    pub fn is_signed_int(self) -> bool {
        matches!(
            self,
            DataType::I8
                | DataType::I16
                | DataType::I32
                | DataType::I64
                | DataType::I4
                | DataType::I2
        )
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
            DataType::U16 => 4,
            DataType::U32 => 12,
            DataType::U64 => 13,
            DataType::BF16 => 16,
            DataType::F8E4M3FN => 17,
            DataType::F8E4M3FNUZ => 18,
            DataType::F8E5M2 => 19,
            DataType::F8E5M2FNUZ => 20,
            DataType::U4 => 21,
            DataType::I4 => 22,
            DataType::F4E2M1 => 23,
            DataType::F8E8M0 => 24,
            DataType::U2 => 25,
            DataType::I2 => 26,
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
            DataType::BF16 => "bf16",
            DataType::U16 => "u16",
            DataType::U32 => "u32",
            DataType::U64 => "u64",
            DataType::F8E4M3FN => "f8e4m3fn",
            DataType::F8E4M3FNUZ => "f8e4m3fnuz",
            DataType::F8E5M2 => "f8e5m2",
            DataType::F8E5M2FNUZ => "f8e5m2fnuz",
            DataType::U4 => "u4",
            DataType::I4 => "i4",
            DataType::F4E2M1 => "f4e2m1",
            DataType::F8E8M0 => "f8e8m0",
            DataType::U2 => "u2",
            DataType::I2 => "i2",
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
            DataType::BF16 => "DT_BF16",
            DataType::U16 => "DT_UINT16",
            DataType::U32 => "DT_UINT32",
            DataType::U64 => "DT_UINT64",
            DataType::F8E4M3FN => "DT_FLOAT8_E4M3FN",
            DataType::F8E4M3FNUZ => "DT_FLOAT8_E4M3FNUZ",
            DataType::F8E5M2 => "DT_FLOAT8_E5M2",
            DataType::F8E5M2FNUZ => "DT_FLOAT8_E5M2FNUZ",
            DataType::U4 => "DT_UINT4",
            DataType::I4 => "DT_INT4",
            DataType::F4E2M1 => "DT_FLOAT4_E2M1",
            DataType::F8E8M0 => "DT_FLOAT8_E8M0",
            DataType::U2 => "DT_UINT2",
            DataType::I2 => "DT_INT2",
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32
                | DataType::F16
                | DataType::F64
                | DataType::BF16
                | DataType::F8E4M3FN
                | DataType::F8E4M3FNUZ
                | DataType::F8E5M2
                | DataType::F8E5M2FNUZ
                | DataType::F4E2M1
                | DataType::F8E8M0
        )
    }
}
