//! Operators the AI CPU runs for the graph: GE places an operator on the AI CPU engine when
//! the AI core has no kernel for its types (a Cast to or from float64, bfloat16, float8 or
//! int4; arithmetic or comparisons of int16, unsigned or 64-bit integers and float64 on these
//! chips; an 8-bit integer product the cube's int8 path does not take). The operator is stored in the `.om` task and in the AI CPU kernel's argument block
//! in one encoding, and its effect is written here once, for the firmware's AI CPU model; what
//! it costs is the firmware's business.

use crate::dtype::DataType;
use crate::numeric::{self, CastMode, RoundMode, Scalar};
use crate::om::{Decoder, Encoder, OmError};

/// Most dims of an element-wise operand.
pub const MAX_RANK: usize = 8;

/// An element-wise operator of [`AiCpuOp::Elementwise`], with ONNX's (numpy's) semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementwiseOp {
    /// `a + b` (integers wrap).
    Add,
    /// `a - b` (integers wrap).
    Sub,
    /// `a * b` (integers wrap).
    Mul,
    /// `a / b` (integers truncate toward zero; by zero gives 0, as numpy).
    Div,
    /// `a ^ b`: integer powers of integers (wrapping), otherwise in f64, cast to `a`'s type.
    Pow,
    /// ONNX Mod with `fmod=0`: the remainder with the divisor's sign (Python's `%`; integers
    /// only; by zero gives 0, as numpy).
    Mod,
    /// ONNX Mod with `fmod=1`: the remainder with the dividend's sign (C's `fmod`).
    Fmod,
    /// The largest input (a NaN wins).
    Max,
    /// The smallest input (a NaN wins).
    Min,
    /// The sum of the inputs.
    Sum,
    /// `a == b`.
    Equal,
    /// `a < b`.
    Less,
    /// `a <= b`.
    LessOrEqual,
    /// `a > b`.
    Greater,
    /// `a >= b`.
    GreaterOrEqual,
}

impl ElementwiseOp {
    const ALL: [ElementwiseOp; 15] = [
        ElementwiseOp::Add,
        ElementwiseOp::Sub,
        ElementwiseOp::Mul,
        ElementwiseOp::Div,
        ElementwiseOp::Pow,
        ElementwiseOp::Mod,
        ElementwiseOp::Fmod,
        ElementwiseOp::Max,
        ElementwiseOp::Min,
        ElementwiseOp::Sum,
        ElementwiseOp::Equal,
        ElementwiseOp::Less,
        ElementwiseOp::LessOrEqual,
        ElementwiseOp::Greater,
        ElementwiseOp::GreaterOrEqual,
    ];

    /// The ONNX operator's name.
    pub fn name(self) -> &'static str {
        match self {
            ElementwiseOp::Add => "Add",
            ElementwiseOp::Sub => "Sub",
            ElementwiseOp::Mul => "Mul",
            ElementwiseOp::Div => "Div",
            ElementwiseOp::Pow => "Pow",
            ElementwiseOp::Mod | ElementwiseOp::Fmod => "Mod",
            ElementwiseOp::Max => "Max",
            ElementwiseOp::Min => "Min",
            ElementwiseOp::Sum => "Sum",
            ElementwiseOp::Equal => "Equal",
            ElementwiseOp::Less => "Less",
            ElementwiseOp::LessOrEqual => "LessOrEqual",
            ElementwiseOp::Greater => "Greater",
            ElementwiseOp::GreaterOrEqual => "GreaterOrEqual",
        }
    }

    /// The operator of an ONNX node: its type, and for Mod its `fmod` attribute.
    pub fn of_node(op: &str, fmod: bool) -> Option<ElementwiseOp> {
        match op {
            "Mod" if fmod => Some(ElementwiseOp::Fmod),
            _ => ElementwiseOp::ALL.into_iter().find(|o| o.name() == op),
        }
    }

    /// Whether it takes any number of inputs (folded left to right) rather than two.
    pub fn variadic(self) -> bool {
        matches!(
            self,
            ElementwiseOp::Max | ElementwiseOp::Min | ElementwiseOp::Sum
        )
    }

    /// The result of one step on two values; `out` is the output's type.
    fn apply(self, a: Scalar, b: Scalar, out: DataType) -> Scalar {
        use ElementwiseOp as E;
        use Scalar::{Float, Int};
        let compare = |f: fn(std::cmp::Ordering) -> bool| -> Scalar {
            let r = match (a, b) {
                (Int(x), Int(y)) => Some(x.cmp(&y)),
                _ => a.to_f64().partial_cmp(&b.to_f64()),
            };
            Int(i128::from(r.is_some_and(f)))
        };
        match (self, a, b) {
            (E::Equal, ..) => compare(|o| o.is_eq()),
            (E::Less, ..) => compare(|o| o.is_lt()),
            (E::LessOrEqual, ..) => compare(|o| o.is_le()),
            (E::Greater, ..) => compare(|o| o.is_gt()),
            (E::GreaterOrEqual, ..) => compare(|o| o.is_ge()),
            (E::Add | E::Sum, Int(x), Int(y)) => Int(x.wrapping_add(y)),
            (E::Sub, Int(x), Int(y)) => Int(x.wrapping_sub(y)),
            (E::Mul, Int(x), Int(y)) => Int(x.wrapping_mul(y)),
            (E::Div, Int(x), Int(y)) => Int(if y == 0 { 0 } else { x.wrapping_div(y) }),
            (E::Max, Int(x), Int(y)) => Int(x.max(y)),
            (E::Min, Int(x), Int(y)) => Int(x.min(y)),
            (E::Pow, Int(x), Int(y)) => Int(int_pow(x, y, out)),
            (E::Mod | E::Fmod, Int(_), Int(0)) => Int(0),
            (E::Fmod, Int(x), Int(y)) => Int(x % y),
            (E::Mod, Int(x), Int(y)) => {
                // Python's `%`: the remainder in [0, y) for y > 0, in (y, 0] for y < 0.
                let r = x.rem_euclid(y);
                Int(if y < 0 && r != 0 { r + y } else { r })
            }
            _ => {
                let (x, y) = (a.to_f64(), b.to_f64());
                Float(match self {
                    E::Add | E::Sum => x + y,
                    E::Sub => x - y,
                    E::Mul => x * y,
                    E::Div => x / y,
                    E::Pow => x.powf(y),
                    // Rust's `%` of floats is C's fmod; a floored float Mod is refused by the
                    // operator's checks, and computed here the same way as Python's `%`.
                    E::Fmod => x % y,
                    E::Mod => x - y * (x / y).floor(),
                    E::Max if x.is_nan() || y.is_nan() => f64::NAN,
                    E::Max => x.max(y),
                    E::Min if x.is_nan() || y.is_nan() => f64::NAN,
                    E::Min => x.min(y),
                    _ => unreachable!("comparisons are handled above"),
                })
            }
        }
    }
}

/// `x^y` for integers, wrapping at the output's width (kept in 64 bits between steps); a
/// negative exponent gives the truncated quotient `1 / x^|y|`.
fn int_pow(x: i128, y: i128, out: DataType) -> i128 {
    if y < 0 {
        return match x {
            1 => 1,
            -1 if y % 2 == 0 => 1,
            -1 => -1,
            _ => 0,
        };
    }
    let mut acc: i128 = 1;
    let (mut base, mut e) = (x, y);
    while e > 0 {
        if e & 1 == 1 {
            acc = wrap(acc.wrapping_mul(base), out);
        }
        base = wrap(base.wrapping_mul(base), out);
        e >>= 1;
    }
    acc
}

/// An integer wrapped to `dtype`'s width.
fn wrap(v: i128, dtype: DataType) -> i128 {
    let mut b = Vec::with_capacity(8);
    numeric::encode(dtype, Scalar::Int(v), CastMode::default(), &mut b);
    match numeric::decode(dtype, &b, 0) {
        Scalar::Int(i) => i,
        Scalar::Float(f) => f as i128,
    }
}

/// One operand of an element-wise operator: its element type and dims.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// Element type.
    pub dtype: DataType,
    /// Dims.
    pub dims: Vec<i64>,
}

impl Operand {
    /// Elements (saturating, so absurd dims of a damaged file cannot wrap to a plausible size).
    fn count(&self) -> u64 {
        self.dims
            .iter()
            .fold(1u64, |acc, d| acc.saturating_mul(*d as u64))
    }

    fn bytes(&self) -> u64 {
        self.count().saturating_mul(self.dtype.size() as u64)
    }
}

/// An operator run on the AI CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// GatherElements (`nd` false, `attr` the axis) or GatherND (`nd` true, `attr`
    /// batch_dims) with indices computed at run time; an index out of range is an error of
    /// the kernel.
    Gather {
        /// GatherND rather than GatherElements.
        nd: bool,
        /// The axis (normalised), or batch_dims.
        attr: i64,
        /// The data.
        data: Operand,
        /// The indices (i32 or i64).
        indices: Operand,
        /// The output.
        output: Operand,
    },
    /// An element-wise operator over inputs broadcast to the output's dims (numpy's rules).
    Elementwise {
        /// The operator.
        op: ElementwiseOp,
        /// The inputs.
        inputs: Vec<Operand>,
        /// The output.
        output: Operand,
    },
    /// ONNX MatMulInteger, `(A - a_zero) · (B - b_zero)` into int32 (wrapping), for the
    /// operands the cube's 8-bit path does not take (uint8, B at run time, zero points): A is
    /// `[..., M, K]` and B `[..., K, N]` (batch dims broadcast), the zero points scalars or
    /// one per row of A / column of B.
    MatMulInteger {
        /// A, `[..., M, K]` (i8 or u8).
        a: Operand,
        /// B, `[..., K, N]` (i8 or u8).
        b: Operand,
        /// A's zero point (input 2), if given.
        a_zero: Option<Operand>,
        /// B's zero point (input 3), if given (only with A's).
        b_zero: Option<Operand>,
        /// The i32 output.
        output: Operand,
    },
}

impl AiCpuOp {
    /// The operator's name (its trace span).
    pub fn name(&self) -> &'static str {
        match self {
            AiCpuOp::Cast { .. } => "Cast",
            AiCpuOp::Gather { nd: false, .. } => "GatherElements",
            AiCpuOp::Gather { nd: true, .. } => "GatherND",
            AiCpuOp::Elementwise { op, .. } => op.name(),
            AiCpuOp::MatMulInteger { .. } => "MatMulInteger",
        }
    }

    /// How many of the node's inputs it reads (CastLike's second input only gives the type).
    pub fn input_count(&self) -> usize {
        match self {
            AiCpuOp::Cast { .. } => 1,
            AiCpuOp::Gather { .. } => 2,
            AiCpuOp::Elementwise { inputs, .. } => inputs.len(),
            AiCpuOp::MatMulInteger { a_zero, b_zero, .. } => {
                2 + usize::from(a_zero.is_some()) + usize::from(b_zero.is_some())
            }
        }
    }

    /// The inputs whose values steer what it reads (a gather's indices): a timing-only run
    /// must compute their producers.
    pub fn value_inputs(&self) -> &'static [usize] {
        match self {
            AiCpuOp::Gather { .. } => &[1],
            AiCpuOp::Cast { .. } | AiCpuOp::Elementwise { .. } | AiCpuOp::MatMulInteger { .. } => {
                &[]
            }
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
            AiCpuOp::Gather {
                nd,
                attr,
                data,
                indices,
                output,
            } => format!(
                "{} ({}{:?}, indices {}{:?}, {} {attr}) -> {}{:?}",
                self.name(),
                data.dtype.name(),
                data.dims,
                indices.dtype.name(),
                indices.dims,
                if *nd { "batch_dims" } else { "axis" },
                output.dtype.name(),
                output.dims
            ),
            AiCpuOp::Elementwise { op, inputs, output } => {
                let ins: Vec<String> = inputs
                    .iter()
                    .map(|o| format!("{}{:?}", o.dtype.name(), o.dims))
                    .collect();
                format!(
                    "{} ({}) -> {}{:?}",
                    op.name(),
                    ins.join(", "),
                    output.dtype.name(),
                    output.dims
                )
            }
            AiCpuOp::MatMulInteger { .. } => {
                let ins: Vec<String> = self
                    .matmul_operands()
                    .iter()
                    .map(|o| format!("{}{:?}", o.dtype.name(), o.dims))
                    .collect();
                format!("MatMulInteger ({})", ins.join(", "))
            }
        }
    }

    /// A MatMulInteger's operands in order: A, B, the zero points given, the output.
    fn matmul_operands(&self) -> Vec<&Operand> {
        match self {
            AiCpuOp::MatMulInteger {
                a,
                b,
                a_zero,
                b_zero,
                output,
            } => [
                Some(a),
                Some(b),
                a_zero.as_ref(),
                b_zero.as_ref(),
                Some(output),
            ]
            .into_iter()
            .flatten()
            .collect(),
            _ => Vec::new(),
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
            AiCpuOp::Gather {
                nd,
                attr,
                data,
                indices,
                output,
            } => {
                e.u32(3);
                e.u32(u32::from(*nd));
                e.i64(*attr);
                for o in [data, indices, output] {
                    e.u32(o.dtype.onnx_code() as u32);
                    e.i64s(&o.dims);
                }
            }
            AiCpuOp::Elementwise { op, inputs, output } => {
                e.u32(2);
                e.u32(ElementwiseOp::ALL.iter().position(|o| o == op).unwrap_or(0) as u32);
                e.len(inputs.len());
                for o in inputs.iter().chain([output]) {
                    e.u32(o.dtype.onnx_code() as u32);
                    e.i64s(&o.dims);
                }
            }
            AiCpuOp::MatMulInteger { .. } => {
                e.u32(4);
                let ops = self.matmul_operands();
                // The zero points given: 0, 1 (A's) or 2 (both).
                e.u32(ops.len() as u32 - 3);
                for o in ops {
                    e.u32(o.dtype.onnx_code() as u32);
                    e.i64s(&o.dims);
                }
            }
        }
    }

    /// Reads an operator [`AiCpuOp::encode`] wrote.
    pub fn decode(d: &mut Decoder<'_>) -> Result<AiCpuOp, OmError> {
        let corrupt = |m: String| OmError::Corrupt(format!("AI CPU op: {m}"));
        let dtype = |d: &mut Decoder<'_>, field: &str| -> Result<DataType, OmError> {
            let code = d.u32(field)?;
            i32::try_from(code)
                .ok()
                .and_then(DataType::from_onnx)
                .ok_or_else(|| {
                    corrupt(format!(
                        "`{field}` is element type code {code}, which is unknown"
                    ))
                })
        };
        let operand = |d: &mut Decoder<'_>, k: usize| -> Result<Operand, OmError> {
            let dtype = dtype(d, "operand type")?;
            let dims = d.i64s("operand dims")?;
            if dims.len() > MAX_RANK || dims.iter().any(|x| *x < 0) {
                return Err(corrupt(format!(
                    "operand {k} has dims {dims:?} (expected at most {MAX_RANK} sizes >= 0)"
                )));
            }
            Ok(Operand { dtype, dims })
        };
        match d.u32("AI CPU op kind")? {
            3 => {
                let nd = d.flag("nd")?;
                let attr = d.i64("attr")?;
                let (data, indices, output) = (operand(d, 0)?, operand(d, 1)?, operand(d, 2)?);
                if !matches!(indices.dtype, DataType::I32 | DataType::I64) {
                    return Err(corrupt(format!(
                        "gather indices of type {} (expected i32 or i64)",
                        indices.dtype.name()
                    )));
                }
                Ok(AiCpuOp::Gather {
                    nd,
                    attr,
                    data,
                    indices,
                    output,
                })
            }
            1 => {
                let from = dtype(d, "from")?;
                let to = dtype(d, "to")?;
                let saturate = d.flag("saturate")?;
                let round = d.u32("round_mode")?;
                let round = RoundMode::from_code(round).ok_or_else(|| {
                    corrupt(format!(
                        "round_mode {round} is unknown (expected 0 up, 1 down, 2 nearest)"
                    ))
                })?;
                Ok(AiCpuOp::Cast {
                    from,
                    to,
                    mode: CastMode { saturate, round },
                })
            }
            2 => {
                let code = d.u32("operator")? as usize;
                let op = ElementwiseOp::ALL.get(code).copied().ok_or_else(|| {
                    corrupt(format!(
                        "element-wise operator {code} is unknown (expected 0..{})",
                        ElementwiseOp::ALL.len()
                    ))
                })?;
                let n = d.len("inputs", 8)?;
                let mut operands = Vec::with_capacity(n + 1);
                for k in 0..=n {
                    operands.push(operand(d, k)?);
                }
                let output = operands.pop().unwrap_or(Operand {
                    dtype: DataType::F32,
                    dims: Vec::new(),
                });
                Ok(AiCpuOp::Elementwise {
                    op,
                    inputs: operands,
                    output,
                })
            }
            4 => {
                let zeros = d.u32("zero points")?;
                if zeros > 2 {
                    return Err(corrupt(format!("{zeros} zero points (expected 0, 1 or 2)")));
                }
                let (a, b) = (operand(d, 0)?, operand(d, 1)?);
                let a_zero = if zeros >= 1 {
                    Some(operand(d, 2)?)
                } else {
                    None
                };
                let b_zero = if zeros == 2 {
                    Some(operand(d, 3)?)
                } else {
                    None
                };
                let output = operand(d, 4)?;
                Ok(AiCpuOp::MatMulInteger {
                    a,
                    b,
                    a_zero,
                    b_zero,
                    output,
                })
            }
            k => Err(corrupt(format!(
                "kind {k} is unknown (expected 1 Cast, 2 element-wise, 3 gather, 4 MatMulInteger)"
            ))),
        }
    }

    /// Checks the operator's shapes and the byte sizes of the buffers a launch gives it: as
    /// many inputs and outputs as it has, each holding its tensor exactly.
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
                if x % from.size() as u64 != 0 || Some(*y) != n.checked_mul(to.size() as u64) {
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
            AiCpuOp::Gather {
                nd,
                attr,
                data,
                indices,
                output,
            } => {
                let (r, id) = (data.dims.len(), &indices.dims);
                let shape_ok = if *nd {
                    let q = id.len();
                    let k = id.last().copied().unwrap_or(0);
                    let b = *attr;
                    let fits = q >= 1
                        && (0..q as i64).contains(&b)
                        && k >= 1
                        && b as usize + k as usize <= r
                        && id[..b as usize] == data.dims[..b as usize];
                    fits && {
                        let mut dims = id[..q - 1].to_vec();
                        dims.extend(&data.dims[b as usize + k as usize..]);
                        dims == output.dims
                    }
                } else {
                    (0..r as i64).contains(attr)
                        && id.len() == r
                        && output.dims == *id
                        && (0..r).all(|a| a == *attr as usize || id[a] <= data.dims[a])
                };
                if !shape_ok {
                    return Err(format!(
                        "{}: inconsistent shapes: {}",
                        self.name(),
                        self.describe()
                    ));
                }
                let want = [data.bytes(), indices.bytes()];
                if inputs != want || outputs != [output.bytes()] || output.dtype != data.dtype {
                    return Err(format!(
                        "{}: buffers of {inputs:?} and {outputs:?} bytes, expected {want:?} and \
                         [{}] ({} output like the data)",
                        self.name(),
                        output.bytes(),
                        data.dtype.name()
                    ));
                }
                Ok(())
            }
            AiCpuOp::Elementwise {
                op,
                inputs: ins,
                output,
            } => {
                let arity_ok = if op.variadic() {
                    !ins.is_empty()
                } else {
                    ins.len() == 2
                };
                if !arity_ok || ins.len() != inputs.len() || outputs.len() != 1 {
                    return Err(format!(
                        "{}: {} operands for {} input and {} output buffers",
                        op.name(),
                        ins.len(),
                        inputs.len(),
                        outputs.len()
                    ));
                }
                for (k, o) in ins.iter().enumerate() {
                    let r = output.dims.len();
                    let fits = o.dims.len() <= r
                        && o.dims
                            .iter()
                            .rev()
                            .zip(output.dims.iter().rev())
                            .all(|(a, b)| a == b || *a == 1);
                    if !fits {
                        return Err(format!(
                            "{}: input {k} dims {:?} do not broadcast to {:?}",
                            op.name(),
                            o.dims,
                            output.dims
                        ));
                    }
                }
                let want: Vec<u64> = ins.iter().map(Operand::bytes).collect();
                if want != inputs || outputs[0] != output.bytes() {
                    return Err(format!(
                        "{}: buffers of {inputs:?} and {} bytes, expected {want:?} and {}",
                        op.name(),
                        outputs[0],
                        output.bytes()
                    ));
                }
                Ok(())
            }
            AiCpuOp::MatMulInteger {
                a,
                b,
                a_zero,
                b_zero,
                output,
            } => {
                let eight_bit = |o: &Operand| matches!(o.dtype, DataType::I8 | DataType::U8);
                let zero_ok = |z: &Option<Operand>, of: &Operand, len: Option<i64>| {
                    z.as_ref().is_none_or(|z| {
                        z.dtype == of.dtype
                            && (z.count() == 1 || (z.dims.len() == 1 && Some(z.dims[0]) == len))
                    })
                };
                let shape = matmul_shape(&a.dims, &b.dims);
                let (m, n) = (a.dims.iter().rev().nth(1).copied(), b.dims.last().copied());
                if !eight_bit(a)
                    || !eight_bit(b)
                    || output.dtype != DataType::I32
                    || shape.as_ref() != Some(&output.dims)
                    || !zero_ok(a_zero, a, m)
                    || !zero_ok(b_zero, b, n)
                {
                    return Err(format!(
                        "MatMulInteger: inconsistent operands: {}",
                        self.describe()
                    ));
                }
                let ops = self.matmul_operands();
                let want: Vec<u64> = ops[..ops.len() - 1].iter().map(|o| o.bytes()).collect();
                if want != inputs || outputs != [output.bytes()] {
                    return Err(format!(
                        "MatMulInteger: buffers of {inputs:?} and {outputs:?} bytes, expected \
                         {want:?} and [{}]",
                        output.bytes()
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
            AiCpuOp::Gather { output, .. } => output.count(),
            AiCpuOp::Elementwise {
                inputs: ins,
                output,
                ..
            } => output
                .count()
                .saturating_mul((ins.len() as u64).saturating_sub(1).max(1)),
            // One multiply-accumulate per output element and K.
            AiCpuOp::MatMulInteger { a, output, .. } => output
                .count()
                .saturating_mul(a.dims.last().copied().unwrap_or(1).max(0) as u64),
        }
    }

    /// The outputs computed from the inputs' bytes (sizes checked by [`AiCpuOp::check`]), or
    /// what is wrong with the values (a gather index out of range).
    pub fn run(&self, inputs: &[&[u8]]) -> Result<Vec<Vec<u8>>, String> {
        Ok(match self {
            AiCpuOp::Cast { from, to, mode } => {
                vec![numeric::cast(
                    *from,
                    *to,
                    inputs.first().copied().unwrap_or(&[]),
                    *mode,
                )]
            }
            AiCpuOp::Gather {
                nd,
                attr,
                data,
                indices,
                ..
            } => {
                let iv: Vec<i64> = (0..indices.count() as usize)
                    .map(|i| match numeric::decode(indices.dtype, inputs[1], i) {
                        Scalar::Int(v) => v as i64,
                        Scalar::Float(f) => f as i64,
                    })
                    .collect();
                let (rows, row) = if *nd {
                    gather_nd_rows(&data.dims, &indices.dims, *attr as usize, &iv)
                } else {
                    gather_elements_rows(&data.dims, &indices.dims, *attr as usize, &iv)
                        .map(|rows| (rows, 1))
                }
                .map_err(|e| e.to_string())?;
                let e = data.dtype.size() * row;
                let mut out = Vec::with_capacity(rows.len() * e);
                for r in rows {
                    out.extend_from_slice(&inputs[0][r * e..(r + 1) * e]);
                }
                vec![out]
            }
            AiCpuOp::Elementwise {
                op,
                inputs: ins,
                output,
            } => vec![elementwise(*op, ins, inputs, output)],
            AiCpuOp::MatMulInteger {
                a,
                b,
                a_zero,
                b_zero,
                ..
            } => {
                let ints = |o: &Operand, bytes: &[u8]| -> Vec<i64> {
                    (0..o.count() as usize)
                        .map(|i| match numeric::decode(o.dtype, bytes, i) {
                            Scalar::Int(v) => v as i64,
                            Scalar::Float(f) => f as i64,
                        })
                        .collect()
                };
                let (x, y) = (ints(a, inputs[0]), ints(b, inputs[1]));
                let za = a_zero.as_ref().map_or(vec![0], |z| ints(z, inputs[2]));
                let zb = b_zero.as_ref().map_or(vec![0], |z| ints(z, inputs[3]));
                vec![matmul_integer(&a.dims, &b.dims, &x, &y, &za, &zb)]
            }
        })
    }
}

/// Numpy's matmul shape of `a` and `b` (1-D operands promoted and the added dim dropped,
/// batch dims broadcast), or `None` when they do not fit.
fn matmul_shape(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (pa, pb) = promoted(a, b);
    let (ra, rb) = (pa.len(), pb.len());
    if pa[ra - 1] != pb[rb - 2] {
        return None;
    }
    let rank = (ra - 2).max(rb - 2);
    let batch = |d: &[i64], r: usize| -> Vec<i64> {
        let mut v = vec![1; rank - (r - 2)];
        v.extend_from_slice(&d[..r - 2]);
        v
    };
    let (ba, bb) = (batch(&pa, ra), batch(&pb, rb));
    let mut out = Vec::with_capacity(rank + 2);
    for (x, y) in ba.iter().zip(&bb) {
        if x != y && *x != 1 && *y != 1 {
            return None;
        }
        out.push(*x.max(y));
    }
    if a.len() > 1 {
        out.push(pa[ra - 2]);
    }
    if b.len() > 1 {
        out.push(pb[rb - 1]);
    }
    Some(out)
}

/// `a` with a leading 1 when it is 1-D, `b` with a trailing 1 when it is.
fn promoted(a: &[i64], b: &[i64]) -> (Vec<i64>, Vec<i64>) {
    let mut pa = a.to_vec();
    if pa.len() == 1 {
        pa.insert(0, 1);
    }
    let mut pb = b.to_vec();
    if pb.len() == 1 {
        pb.push(1);
    }
    (pa, pb)
}

/// MatMulInteger's values: `(x - za) · (y - zb)` per batch item (broadcast), the zero points
/// one value or one per row of A / column of B; i32 little-endian, wrapping.
fn matmul_integer(a: &[i64], b: &[i64], x: &[i64], y: &[i64], za: &[i64], zb: &[i64]) -> Vec<u8> {
    let (pa, pb) = promoted(a, b);
    let (ra, rb) = (pa.len(), pb.len());
    let (m, k, n) = (
        pa[ra - 2] as usize,
        pa[ra - 1] as usize,
        pb[rb - 1] as usize,
    );
    let rank = (ra - 2).max(rb - 2);
    let pad = |d: &[i64]| -> Vec<i64> {
        let mut v = vec![1; rank - (d.len() - 2)];
        v.extend_from_slice(&d[..d.len() - 2]);
        v
    };
    let (ba, bb) = (pad(&pa), pad(&pb));
    let batch: Vec<i64> = ba.iter().zip(&bb).map(|(x, y)| *x.max(y)).collect();
    let items: usize = batch.iter().product::<i64>() as usize;
    let at = |z: &[i64], i: usize| if z.len() == 1 { z[0] } else { z[i] };
    let mut out = Vec::with_capacity(items * m * n * 4);
    for item in 0..items {
        // The item's index into A's and B's batch (a broadcast dim stays at 0).
        let (mut ia, mut ib, mut rem) = (0usize, 0usize, item);
        let (mut sa, mut sb) = (1usize, 1usize);
        for d in (0..rank).rev() {
            let c = rem % batch[d] as usize;
            rem /= batch[d] as usize;
            if ba[d] > 1 {
                ia += c * sa;
            }
            if bb[d] > 1 {
                ib += c * sb;
            }
            sa *= ba[d] as usize;
            sb *= bb[d] as usize;
        }
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0i64;
                for kk in 0..k {
                    let av = x[(ia * m + i) * k + kk] - at(za, i);
                    let bv = y[(ib * k + kk) * n + j] - at(zb, j);
                    acc = acc.wrapping_add(av.wrapping_mul(bv));
                }
                out.extend_from_slice(&(acc as i32).to_le_bytes());
            }
        }
    }
    out
}

/// An index outside its dim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexOutOfRange {
    /// The index (negative ones already counted from the end).
    pub value: i64,
    /// The dim's length.
    pub len: i64,
    /// Where: `along axis 1`, `of data dim 0`.
    pub at: String,
}

impl std::fmt::Display for IndexOutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "index {} {} is outside [-{}, {}]",
            self.value,
            self.at,
            self.len,
            self.len - 1
        )
    }
}

/// Row-major element strides of `dims`.
fn strides(dims: &[i64]) -> Vec<usize> {
    (0..dims.len())
        .map(|a| dims[a + 1..].iter().product::<i64>() as usize)
        .collect()
}

/// GatherElements: per output element (the indices' shape), the data element it copies. The
/// shapes are checked by the caller (indices of the data's rank, no larger off the axis).
pub fn gather_elements_rows(
    data: &[i64],
    index_dims: &[i64],
    axis: usize,
    iv: &[i64],
) -> Result<Vec<usize>, IndexOutOfRange> {
    let stride = strides(data);
    let len = data[axis];
    let mut rows = Vec::with_capacity(iv.len());
    for (p, v) in iv.iter().enumerate() {
        let v = if *v < 0 { v + len } else { *v };
        if !(0..len).contains(&v) {
            return Err(IndexOutOfRange {
                value: v,
                len,
                at: format!("along axis {axis}"),
            });
        }
        // The output element's coordinates, with the axis's replaced by the index.
        let mut rem = p;
        let mut at = 0;
        for a in (0..data.len()).rev() {
            let c = rem % index_dims[a] as usize;
            rem /= index_dims[a] as usize;
            at += if a == axis { v as usize } else { c } * stride[a];
        }
        rows.push(at);
    }
    Ok(rows)
}

/// GatherND with `batch_dims` `b`: per index tuple (the indices' last dim), the data row of
/// the trailing dims it copies, and that row's length. The shapes are checked by the caller.
pub fn gather_nd_rows(
    data: &[i64],
    index_dims: &[i64],
    b: usize,
    iv: &[i64],
) -> Result<(Vec<usize>, usize), IndexOutOfRange> {
    let q = index_dims.len();
    let k = index_dims.last().copied().unwrap_or(1).max(1) as usize;
    let stride = strides(data);
    let row = data[(b + k).min(data.len())..].iter().product::<i64>() as usize;
    let per_batch = index_dims[b.min(q)..q.saturating_sub(1)]
        .iter()
        .product::<i64>() as usize;
    let batch_len = data[b.min(data.len())..].iter().product::<i64>() as usize;
    let mut rows = Vec::with_capacity(iv.len() / k);
    for (t, tuple) in iv.chunks(k).enumerate() {
        let mut at = (t / per_batch.max(1)) * batch_len;
        for (j, v) in tuple.iter().enumerate() {
            let len = data[b + j];
            let v = if *v < 0 { v + len } else { *v };
            if !(0..len).contains(&v) {
                return Err(IndexOutOfRange {
                    value: v,
                    len,
                    at: format!("of data dim {}", b + j),
                });
            }
            at += v as usize * stride[b + j];
        }
        rows.push(at / row.max(1));
    }
    Ok((rows, row))
}

/// Every output element, the inputs broadcast to it (numpy's rules: dims aligned at the end,
/// a size-1 dim repeated). The shapes and byte sizes must agree ([`AiCpuOp::check`]).
pub fn elementwise(op: ElementwiseOp, ins: &[Operand], data: &[&[u8]], out: &Operand) -> Vec<u8> {
    let r = out.dims.len();
    // Per input, the element stride of each output axis (0 where it broadcasts).
    let steps: Vec<Vec<u64>> = ins
        .iter()
        .map(|o| {
            let mut step = vec![0u64; r];
            let mut s = 1u64;
            for (k, d) in o.dims.iter().enumerate().rev() {
                let axis = r - (o.dims.len() - k);
                if *d != 1 {
                    step[axis] = s;
                }
                s *= *d as u64;
            }
            step
        })
        .collect();
    let n = out.count() as usize;
    let mut idx = vec![0i64; r];
    let mut at = vec![0u64; ins.len()];
    let mut bytes = Vec::with_capacity(n * out.dtype.size());
    let mode = CastMode {
        saturate: false,
        round: RoundMode::Up,
    };
    for _ in 0..n {
        let value = |k: usize| numeric::decode(ins[k].dtype, data[k], at[k] as usize);
        let mut acc = value(0);
        for k in 1..ins.len() {
            acc = op.apply(acc, value(k), out.dtype);
        }
        numeric::encode(out.dtype, acc, mode, &mut bytes);
        // The next output index, moving every input's position with it.
        for axis in (0..r).rev() {
            idx[axis] += 1;
            for (p, s) in at.iter_mut().zip(&steps) {
                *p += s[axis];
            }
            if idx[axis] < out.dims[axis] {
                break;
            }
            for (p, s) in at.iter_mut().zip(&steps) {
                *p -= s[axis] * idx[axis] as u64;
            }
            idx[axis] = 0;
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operand(dtype: DataType, dims: &[i64]) -> Operand {
        Operand {
            dtype,
            dims: dims.to_vec(),
        }
    }

    fn u32s(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn unsigned_arithmetic_wraps_and_broadcasts() {
        let op = AiCpuOp::Elementwise {
            op: ElementwiseOp::Sub,
            inputs: vec![
                operand(DataType::U32, &[2, 3]),
                operand(DataType::U32, &[3]),
            ],
            output: operand(DataType::U32, &[2, 3]),
        };
        let a = u32s(&[5, 6, 7, 8, 9, 10]);
        let b = u32s(&[1, 7, 3]);
        assert!(op.check(&[24, 12], &[24]).is_ok());
        assert_eq!(
            op.run(&[&a, &b]).unwrap(),
            vec![u32s(&[4, u32::MAX, 4, 7, 2, 7])]
        );
        assert!(op.check(&[24, 8], &[24]).is_err());
    }

    #[test]
    fn integer_division_truncates_and_comparisons_are_unsigned() {
        let i32s = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let div = AiCpuOp::Elementwise {
            op: ElementwiseOp::Div,
            inputs: vec![operand(DataType::I32, &[4]), operand(DataType::I32, &[4])],
            output: operand(DataType::I32, &[4]),
        };
        let got = div
            .run(&[&i32s(&[7, -7, 7, 5]), &i32s(&[2, 2, -2, 0])])
            .unwrap();
        assert_eq!(got, vec![i32s(&[3, -3, -3, 0])]);
        let less = AiCpuOp::Elementwise {
            op: ElementwiseOp::Less,
            inputs: vec![operand(DataType::U64, &[2]), operand(DataType::U64, &[2])],
            output: operand(DataType::Bool, &[2]),
        };
        let a: Vec<u8> = [u64::MAX, 1].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [1u64, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(less.run(&[&a, &b]).unwrap(), vec![vec![0, 1]]);
    }

    #[test]
    fn operators_round_trip_through_their_encoding() {
        let op = AiCpuOp::Elementwise {
            op: ElementwiseOp::GreaterOrEqual,
            inputs: vec![
                operand(DataType::I16, &[1, 4]),
                operand(DataType::I16, &[3, 1]),
            ],
            output: operand(DataType::Bool, &[3, 4]),
        };
        let mut e = Encoder::default();
        op.encode(&mut e);
        let mut d = Decoder::new(&e.bytes, "test");
        assert_eq!(AiCpuOp::decode(&mut d).unwrap(), op);
        assert_eq!(int_pow(3, 5, DataType::I32), 243);
        assert_eq!(int_pow(2, 40, DataType::I32), 0);
        assert_eq!(int_pow(-1, -3, DataType::I64), -1);
    }

    /// MatMulInteger: encodes and decodes with its zero points, checks its shapes and buffers,
    /// and computes `(a - za) · (b - zb)` with a broadcast batch and per-row / per-column
    /// zero points; a rank-0 operand of a damaged file is refused, not a panic.
    #[test]
    fn matmul_integer_checks_round_trips_and_computes() {
        let op = AiCpuOp::MatMulInteger {
            a: operand(DataType::U8, &[2, 2, 3]),
            b: operand(DataType::U8, &[3, 2]),
            a_zero: Some(operand(DataType::U8, &[2])),
            b_zero: Some(operand(DataType::U8, &[2])),
            output: operand(DataType::I32, &[2, 2, 2]),
        };
        let mut e = Encoder::default();
        op.encode(&mut e);
        let mut d = Decoder::new(&e.bytes, "test");
        assert_eq!(AiCpuOp::decode(&mut d).unwrap(), op);
        assert_eq!(op.input_count(), 4);
        assert!(op.check(&[12, 6, 2, 2], &[32]).is_ok());
        assert!(op.check(&[12, 6, 2, 2], &[16]).is_err());
        let a = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
        let b = [1u8, 0, 0, 1, 1, 1];
        let got = op.run(&[&a, &b, &[1, 2], &[0, 1]]).unwrap();
        // Row i of each batch item minus za[i], B minus zb[j] = [[1,-1],[0,0],[1,0]].
        let want: Vec<i32> = [[0, 1, 2], [2, 3, 4], [6, 7, 8], [8, 9, 10]]
            .iter()
            .flat_map(|r| [r[0] + r[2], -r[0]])
            .collect();
        assert_eq!(
            got,
            vec![
                want.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>()
            ]
        );
        assert_eq!(op.elements(&[12, 6, 2, 2]), 8 * 3);
        let flat = AiCpuOp::MatMulInteger {
            a: operand(DataType::I8, &[]),
            b: operand(DataType::I8, &[3, 2]),
            a_zero: None,
            b_zero: None,
            output: operand(DataType::I32, &[2]),
        };
        assert!(
            flat.check(&[1, 6], &[8])
                .unwrap_err()
                .contains("inconsistent")
        );
    }

    /// A gather of u32 data `data_dims` by i64 indices `index_dims` into `out_dims`.
    fn gather(
        nd: bool,
        attr: i64,
        data_dims: &[i64],
        index_dims: &[i64],
        out_dims: &[i64],
    ) -> AiCpuOp {
        AiCpuOp::Gather {
            nd,
            attr,
            data: operand(DataType::U32, data_dims),
            indices: operand(DataType::I64, index_dims),
            output: operand(DataType::U32, out_dims),
        }
    }

    #[test]
    fn gathers_with_run_time_indices_check_shapes_and_ranges() {
        let i64s = |v: &[i64]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let data = u32s(&[10, 11, 12, 20, 21, 22]);
        let elements = gather(false, 1, &[2, 3], &[2, 2], &[2, 2]);
        assert!(elements.check(&[24, 32], &[16]).is_ok());
        let got = elements.run(&[&data, &i64s(&[2, -3, 1, 1])]).unwrap();
        assert_eq!(got, vec![u32s(&[12, 10, 21, 21])]);
        let e = elements.run(&[&data, &i64s(&[3, 0, 0, 0])]).unwrap_err();
        assert_eq!(e, "index 3 along axis 1 is outside [-3, 2]");
        let nd = gather(true, 0, &[2, 3], &[2, 1], &[2, 3]);
        assert!(nd.check(&[24, 16], &[24]).is_ok());
        let got = nd.run(&[&data, &i64s(&[1, 0])]).unwrap();
        assert_eq!(got, vec![u32s(&[20, 21, 22, 10, 11, 12])]);
        // A rank the data does not have is refused before anything runs.
        let bad = gather(false, 1, &[2, 3], &[4], &[4]);
        assert!(
            bad.check(&[24, 32], &[16])
                .unwrap_err()
                .contains("inconsistent shapes")
        );
    }

    #[test]
    fn mod_follows_the_divisor_and_fmod_the_dividend() {
        let i = Scalar::Int;
        let cases = [
            (5, -3, -1, 2),
            (-5, 3, 1, -2),
            (-5, -3, -2, -2),
            (6, 3, 0, 0),
            (7, 0, 0, 0),
        ];
        for (x, y, m, f) in cases {
            assert_eq!(
                ElementwiseOp::Mod.apply(i(x), i(y), DataType::I32),
                i(m),
                "{x} % {y}"
            );
            assert_eq!(
                ElementwiseOp::Fmod.apply(i(x), i(y), DataType::I32),
                i(f),
                "fmod({x}, {y})"
            );
        }
        let g = ElementwiseOp::Fmod.apply(Scalar::Float(-4.3), Scalar::Float(2.1), DataType::F32);
        assert!(
            matches!(g, Scalar::Float(v) if (v + 0.1).abs() < 1e-12),
            "{g:?}"
        );
    }
}
