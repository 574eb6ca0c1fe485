//! Operators the AI CPU runs for the graph: GE places an operator on the AI CPU engine when
//! the AI core has no kernel for its types (a Cast to or from float64, bfloat16, float8 or
//! int4; arithmetic or comparisons of int16, unsigned or 64-bit integers and float64 on these
//! chips). The operator is stored in the `.om` task and in the AI CPU kernel's argument block
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

    /// The operator of an ONNX name (Mod as `fmod=0`; see [`ElementwiseOp::Fmod`]).
    pub fn from_name(s: &str) -> Option<ElementwiseOp> {
        ElementwiseOp::ALL.into_iter().find(|o| o.name() == s)
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
    fn count(&self) -> u64 {
        self.dims.iter().map(|d| *d as u64).product()
    }

    fn bytes(&self) -> u64 {
        self.count() * self.dtype.size() as u64
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
    /// An element-wise operator over inputs broadcast to the output's dims (numpy's rules).
    Elementwise {
        /// The operator.
        op: ElementwiseOp,
        /// The inputs.
        inputs: Vec<Operand>,
        /// The output.
        output: Operand,
    },
}

impl AiCpuOp {
    /// The operator's name (its trace span).
    pub fn name(&self) -> &'static str {
        match self {
            AiCpuOp::Cast { .. } => "Cast",
            AiCpuOp::Elementwise { op, .. } => op.name(),
        }
    }

    /// How many of the node's inputs it reads (CastLike's second input only gives the type).
    pub fn input_count(&self) -> usize {
        match self {
            AiCpuOp::Cast { .. } => 1,
            AiCpuOp::Elementwise { inputs, .. } => inputs.len(),
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
            AiCpuOp::Elementwise { op, inputs, output } => {
                e.u32(2);
                e.u32(ElementwiseOp::ALL.iter().position(|o| o == op).unwrap_or(0) as u32);
                e.len(inputs.len());
                for o in inputs.iter().chain([output]) {
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
        match d.u32("AI CPU op kind")? {
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
                    let dtype = dtype(d, "operand type")?;
                    let dims = d.i64s("operand dims")?;
                    if dims.len() > MAX_RANK || dims.iter().any(|x| *x < 0) {
                        return Err(corrupt(format!(
                            "operand {k} has dims {dims:?} (expected at most {MAX_RANK} sizes \
                             >= 0)"
                        )));
                    }
                    operands.push(Operand { dtype, dims });
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
            k => Err(corrupt(format!(
                "kind {k} is unknown (expected 1 Cast, 2 element-wise)"
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
        }
    }

    /// Elements the operator processes (its inner loop's trip count).
    pub fn elements(&self, inputs: &[u64]) -> u64 {
        match self {
            AiCpuOp::Cast { from, .. } => inputs.first().map_or(0, |b| b / from.size() as u64),
            AiCpuOp::Elementwise {
                inputs: ins,
                output,
                ..
            } => output.count() * (ins.len() as u64).saturating_sub(1).max(1),
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
            AiCpuOp::Elementwise {
                op,
                inputs: ins,
                output,
            } => vec![elementwise(*op, ins, inputs, output)],
        }
    }
}

/// Every output element, the inputs broadcast to it (numpy's rules: dims aligned at the end,
/// a size-1 dim repeated).
fn elementwise(op: ElementwiseOp, ins: &[Operand], data: &[&[u8]], out: &Operand) -> Vec<u8> {
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
        assert_eq!(op.run(&[&a, &b]), vec![u32s(&[4, u32::MAX, 4, 7, 2, 7])]);
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
        let got = div.run(&[&i32s(&[7, -7, 7, 5]), &i32s(&[2, 2, -2, 0])]);
        assert_eq!(got, vec![i32s(&[3, -3, -3, 0])]);
        let less = AiCpuOp::Elementwise {
            op: ElementwiseOp::Less,
            inputs: vec![operand(DataType::U64, &[2]), operand(DataType::U64, &[2])],
            output: operand(DataType::Bool, &[2]),
        };
        let a: Vec<u8> = [u64::MAX, 1].iter().flat_map(|x| x.to_le_bytes()).collect();
        let b: Vec<u8> = [1u64, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(less.run(&[&a, &b]), vec![vec![0, 1]]);
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
