//! The runtime's errors, each with the code ACL or GE would give for the same mistake, so users
//! who know `aclmdl*` find the numbers they expect.

use gearsim_firmware::DeviceError;
use gearsim_isa::om::OmError;

use gearsim_compiler::infer::InferError;
use gearsim_compiler::lower::LowerError;
use gearsim_compiler::onnx::OnnxError;

use super::load::LoadError;

/// An error code as ACL / GE report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// A numeric ACL return code (`ACL_ERROR_*`, or a GE code ACL passes through).
    Acl(u32),
    /// A GE error-message code (`E13025`).
    Ge(&'static str),
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ErrorCode::Acl(n) => write!(f, "{n}"),
            ErrorCode::Ge(s) => f.write_str(s),
        }
    }
}

/// `ACL_ERROR_INVALID_PARAM`.
pub const ACL_ERROR_INVALID_PARAM: u32 = 100_000;
/// `ACL_ERROR_STORAGE_OVER_LIMIT`.
pub const ACL_ERROR_STORAGE_OVER_LIMIT: u32 = 300_000;
/// `ACL_ERROR_FAILURE`.
pub const ACL_ERROR_FAILURE: u32 = 500_001;
/// `ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID`.
pub const ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID: u32 = 145_011;
/// `ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID`.
pub const ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID: u32 = 145_012;
/// `ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID`.
pub const ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID: u32 = 145_013;

/// Why a runtime call failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A parameter is wrong (`ACL_ERROR_INVALID_PARAM`): a model id, an index, an input's
    /// count, type or static dims.
    #[error("[{code}] {0}", code = ACL_ERROR_INVALID_PARAM)]
    InvalidParam(String),
    /// A run's data inputs do not fit the model (`ACL_ERROR_INVALID_PARAM`): their count, or
    /// input `index`'s element type, rank or static dims.
    #[error("[{code}] {message}", code = ACL_ERROR_INVALID_PARAM)]
    BadInput {
        /// The data input at fault (None: the count is wrong).
        index: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// More entries than the caller's array holds (`ACL_ERROR_STORAGE_OVER_LIMIT`).
    #[error("[{code}] {0}", code = ACL_ERROR_STORAGE_OVER_LIMIT)]
    StorageOverLimit(String),
    /// A query the model cannot answer (`ACL_ERROR_FAILURE`).
    #[error("[{code}] {0}", code = ACL_ERROR_FAILURE)]
    Failure(String),
    /// The gear input's buffer is missing (`ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID`).
    #[error("[{code}] {0}", code = ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID)]
    DynamicInputAddr(String),
    /// The gear input's length or the dims' count is wrong
    /// (`ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID`).
    #[error("[{code}] {0}", code = ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID)]
    DynamicInputLength(String),
    /// The requested batch / size / dims are no gear (`ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID`).
    #[error("[{code}] {0}", code = ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID)]
    DynamicBatchSize(String),
    /// Non-sink execution with input shapes that match no gear (GE's E13025).
    #[error("[E13025] Input tensor is invalid. Reason: {0}")]
    NotAGear(String),
    /// The `.om` is unusable.
    #[error(transparent)]
    Om(#[from] OmError),
    /// The model could not be loaded or run.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The simulated device reported a fault.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The dynamic-shape path failed (hybrid mode).
    #[error("dynamic-shape path: {0}")]
    Dynamic(Box<DynamicError>),
}

// Boxed: the compiler's errors are rich diagnostics, too large to carry in every `Result`.
impl From<DynamicError> for RuntimeError {
    fn from(e: DynamicError) -> RuntimeError {
        RuntimeError::Dynamic(Box::new(e))
    }
}

impl RuntimeError {
    /// The ACL / GE code.
    pub fn code(&self) -> ErrorCode {
        match self {
            RuntimeError::InvalidParam(_) | RuntimeError::BadInput { .. } => {
                ErrorCode::Acl(ACL_ERROR_INVALID_PARAM)
            }
            RuntimeError::StorageOverLimit(_) => ErrorCode::Acl(ACL_ERROR_STORAGE_OVER_LIMIT),
            RuntimeError::DynamicInputAddr(_) => {
                ErrorCode::Acl(ACL_ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID)
            }
            RuntimeError::DynamicInputLength(_) => {
                ErrorCode::Acl(ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID)
            }
            RuntimeError::DynamicBatchSize(_) => {
                ErrorCode::Acl(ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID)
            }
            RuntimeError::NotAGear(_) => ErrorCode::Ge("E13025"),
            RuntimeError::Failure(_)
            | RuntimeError::Om(_)
            | RuntimeError::Load(_)
            | RuntimeError::Device(_)
            | RuntimeError::Dynamic(_) => ErrorCode::Acl(ACL_ERROR_FAILURE),
        }
    }
}

/// Why the dynamic-shape path failed: the compiler's own errors, kept typed (a caller can ask
/// which node and stage failed), or the path's checks of the graph it runs.
#[derive(Debug, thiserror::Error)]
pub enum DynamicError {
    /// The source graph the `.om` carries could not be imported.
    #[error(transparent)]
    Import(#[from] OnnxError),
    /// Shape inference for the actual input shapes failed.
    /// (No `#[from]`: a source would print the inner message a second time after this one.)
    #[error("shape inference: {0}")]
    Infer(InferError),
    /// A node could not be lowered for its shapes.
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// The graph does not fit the model's description or a value the path needs is missing.
    #[error("{0}")]
    Graph(String),
}
