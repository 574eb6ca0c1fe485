//! Operators the AI CPU runs for the graph: GE places an operator on the AI CPU engine when
//! the AI core has no kernel for it (a Cast to or from float64, bfloat16, float8 or int4 on
//! these chips). The operator is stored in the `.om` task and in the AI CPU kernel's argument
//! block in one encoding, and its effect is written here once, for the firmware's AI CPU
//! model; what it costs is the firmware's business.

use crate::dtype::DataType;
use crate::numeric::{self, CastMode, RoundMode};
use crate::om::{Decoder, Encoder, OmError};

/// An operator run on the AI CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AiCpuOp {
    /// ONNX Cast of one tensor (see [`numeric`] for the conversions).
    Cast {
        /// The input's element type.
        from: DataType,
        /// The output's element type.
        to: DataType,
        /// Saturation and rounding.
        mode: CastMode,
    },
}

impl AiCpuOp {
    /// The operator's name (its trace span).
    pub fn name(&self) -> &'static str {
        match self {
            AiCpuOp::Cast { .. } => "Cast",
        }
    }

    /// How many of the node's inputs it reads (CastLike's second input only gives the type).
    pub fn input_count(&self) -> usize {
        match self {
            AiCpuOp::Cast { .. } => 1,
        }
    }

    /// A one-line description for listings.
    pub fn describe(&self) -> String {
        match self {
            AiCpuOp::Cast { from, to, mode } => format!(
                "Cast {} -> {} (saturate {}, round {})",
                from.name(),
                to.name(),
                u8::from(mode.saturate),
                mode.round.name()
            ),
        }
    }

    /// Writes the operator.
    pub fn encode(&self, e: &mut Encoder) {
        match self {
            AiCpuOp::Cast { from, to, mode } => {
                e.u32(1);
                e.u32(from.onnx_code() as u32);
                e.u32(to.onnx_code() as u32);
                e.u32(u32::from(mode.saturate));
                e.u32(mode.round.code());
            }
        }
    }

    /// Reads an operator [`AiCpuOp::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<AiCpuOp, OmError> {
        let dtype = |d: &mut Decoder<'_>, field: &str| -> Result<DataType, OmError> {
            let code = d.u32(field)?;
            i32::try_from(code)
                .ok()
                .and_then(DataType::from_onnx)
                .ok_or_else(|| {
                    OmError::Corrupt(format!(
                        "AI CPU op: `{field}` is element type code {code}, which is unknown"
                    ))
                })
        };
        match d.u32("AI CPU op kind")? {
            1 => {
                let from = dtype(d, "from")?;
                let to = dtype(d, "to")?;
                let saturate = d.flag("saturate")?;
                let round = d.u32("round_mode")?;
                let round = RoundMode::from_code(round).ok_or_else(|| {
                    OmError::Corrupt(format!(
                        "AI CPU op: round_mode {round} is unknown (expected 0 up, 1 down, 2 \
                         nearest)"
                    ))
                })?;
                Ok(AiCpuOp::Cast {
                    from,
                    to,
                    mode: CastMode { saturate, round },
                })
            }
            k => Err(OmError::Corrupt(format!(
                "AI CPU op: kind {k} is unknown (expected 1 Cast)"
            ))),
        }
    }

    /// Checks the byte sizes of the buffers a launch gives the operator: as many inputs and
    /// outputs as it has, each holding a whole number of elements, and outputs as long as
    /// the inputs imply.
    pub fn check(&self, inputs: &[u64], outputs: &[u64]) -> Result<(), String> {
        match self {
            AiCpuOp::Cast { from, to, .. } => {
                let ([x], [y]) = (inputs, outputs) else {
                    return Err(format!(
                        "Cast takes 1 input and 1 output, got {} and {}",
                        inputs.len(),
                        outputs.len()
                    ));
                };
                let n = x / from.size() as u64;
                if x % from.size() as u64 != 0 || *y != n * to.size() as u64 {
                    return Err(format!(
                        "Cast {} -> {}: the input is {x} bytes and the output {y}; expected \
                         the output to hold {n} {} elements",
                        from.name(),
                        to.name(),
                        to.name()
                    ));
                }
                Ok(())
            }
        }
    }

    /// Elements the operator processes (its inner loop's trip count).
    pub fn elements(&self, inputs: &[u64]) -> u64 {
        match self {
            AiCpuOp::Cast { from, .. } => inputs.first().map_or(0, |b| b / from.size() as u64),
        }
    }

    /// The outputs computed from the inputs' bytes (sizes checked by [`AiCpuOp::check`]).
    pub fn run(&self, inputs: &[&[u8]]) -> Vec<Vec<u8>> {
        match self {
            AiCpuOp::Cast { from, to, mode } => {
                vec![numeric::cast(
                    *from,
                    *to,
                    inputs.first().copied().unwrap_or(&[]),
                    *mode,
                )]
            }
        }
    }
}
