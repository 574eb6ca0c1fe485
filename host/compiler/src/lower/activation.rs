//! Vector bodies of the transcendental element-wise functions, in f32 (f16 tensors are widened
//! to f32 around them by the caller), from the unit's exp, ln, sqrt, reciprocal and divide.
//!
//! Numerically safe forms, each within a few f32 ulps of the exact function (well inside the
//! 1e-4 relative tolerance ONNX models are checked with):
//! - Sigmoid `1 / (1 + exp(-x))`: exp overflows to +inf for x < -88 and the result is then 0,
//!   the f32 value of the tiny true result; nothing produces NaN.
//! - Tanh `sign(x) (1 - e) / (1 + e)` with `e = exp(-2|x|)` (never overflows); below |x| = 0.125
//!   the cancellation in `1 - e` would cost relative accuracy, so the odd Taylor series to x^7
//!   (next term 1.3e-9 relative there) is selected instead.
//! - Erf: below |x| = 0.5 the Maclaurin series to x^11 (3e-8 relative); above, `1 - erfc(|x|)`
//!   with the sign of x, erfc from the Chebyshev fit of Numerical Recipes (`erfcc`, relative
//!   error below 1.2e-7 for every z >= 0), so the result has no cancellation near 0 and no
//!   absolute-error floor.
//! - Gelu (exact) `x * Phi(x)`, `Phi(x) = 1 - h` for x >= 0 and `h` for x < 0 with
//!   `h = erfc(|x| / sqrt 2) / 2`: the same fit, so the tail for negative x keeps its relative
//!   accuracy instead of cancelling in `1 + erf`.
//! - Gelu (tanh) `x / (1 + exp(-2u))`, `u = sqrt(2/pi) (x + 0.044715 x^3)`, which equals
//!   `x (1 + tanh u) / 2` and has no cancellation; exp overflow gives -0 for very negative x.
//! - Pow: see [`pow_general`].
//! - Softplus `max(x, 0) + ln(1 + exp(-|x|))`: never overflows, exact to f32 for large |x|.
//! - Elu, Selu, Celu use `exp(x) - 1` on the negative side only (selected by a mask), so
//!   overflow on the positive side never reaches the result.
//! - Floor and Ceil convert to i32 with the rounding mode and back, as TBE's `floor` / `ceil`
//!   do (values beyond 2^31 saturate, as there).

use std::f32::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

use gearsim_isa::{Cmp, DType, ProgramBuilder, Round};

use super::vec::{View, Vx};
use super::writer::Reg;

/// A unary function computed in f32 (the parameters are the ONNX attributes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Act {
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// Error function.
    Erf,
    /// `x * Phi(x)` (Gelu, approximate = "none").
    Gelu,
    /// Gelu with approximate = "tanh".
    GeluTanh,
    /// `-x`.
    Neg,
    /// Round down (`Floor`) or up (`Ceil`) to an integer.
    Round(Round),
    /// `ln(1 + e^x)`.
    Softplus,
    /// `x / (1 + |x|)`.
    Softsign,
    /// `x < 0 ? alpha x : x`.
    LeakyRelu(f32),
    /// `x < 0 ? alpha (e^x - 1) : x`.
    Elu(f32),
    /// `gamma (x <= 0 ? alpha (e^x - 1) : x)` (alpha, gamma).
    Selu(f32, f32),
    /// `max(0, x) + min(0, alpha (e^(x / alpha) - 1))`.
    Celu(f32),
    /// `max(0, min(1, alpha x + beta))` (alpha, beta).
    HardSigmoid(f32, f32),
    /// `x max(0, min(1, x / 6 + 1 / 2))`.
    HardSwish,
    /// `x > alpha ? x : 0`.
    ThresholdedRelu(f32),
    /// 1, -1 or 0 by the sign of x (NaN stays NaN).
    Sign,
}

impl Act {
    /// f32 scratch tiles the body needs (besides one bit-mask buffer).
    pub fn scratch(self) -> usize {
        match self {
            Act::Sigmoid | Act::Neg | Act::Round(_) | Act::HardSigmoid(..) => 0,
            Act::GeluTanh
            | Act::Softsign
            | Act::LeakyRelu(_)
            | Act::Elu(_)
            | Act::Selu(..)
            | Act::Celu(_)
            | Act::HardSwish
            | Act::ThresholdedRelu(_) => 1,
            Act::Softplus | Act::Sign => 2,
            Act::Tanh | Act::Erf | Act::Gelu => 3,
        }
    }
}

/// Numerical Recipes `erfcc` coefficients as published, highest power of t first.
const ERFC: [f64; 10] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_87,
    -1.135_203_98,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_68,
    -1.265_512_23,
];

/// `o = erfc(z)` for `z >= 0`, with `t` and `s` as scratch; `s` holds `z^2` on entry (computed
/// by the caller from the most exact operands it has: the exponent's rounding error is
/// multiplied by `z^2` in the result).
fn erfc(vx: &mut Vx<'_>, o: View, z: View, t: View, s: View) {
    vx.muls(t, z, 0.5);
    vx.adds(t, t, 1.0);
    vx.vun(ProgramBuilder::vrec, DType::F32, t, t);
    vx.horner(o, t, &ERFC.map(|c| c as f32));
    vx.vbin(ProgramBuilder::vsub, DType::F32, o, o, s);
    vx.vun(ProgramBuilder::vexp, DType::F32, o, o);
    vx.vbin(ProgramBuilder::vmul, DType::F32, o, o, t);
}

/// Writes `o = act(x)` in f32; `s` holds [`Act::scratch`] tiles, `bits` a bit-mask buffer.
pub fn emit(vx: &mut Vx<'_>, act: Act, o: View, x: View, s: &[View], bits: Reg) {
    match act {
        Act::Sigmoid => {
            vx.muls(o, x, -1.0);
            vx.vun(ProgramBuilder::vexp, DType::F32, o, o);
            vx.adds(o, o, 1.0);
            vx.vun(ProgramBuilder::vrec, DType::F32, o, o);
        }
        Act::Tanh => {
            let (ax, e, d) = (s[0], s[1], s[2]);
            vx.vun(ProgramBuilder::vabs, DType::F32, ax, x);
            vx.muls(e, ax, -2.0);
            vx.vun(ProgramBuilder::vexp, DType::F32, e, e);
            vx.adds(d, e, 1.0);
            vx.rsubs(e, e, 1.0);
            vx.vbin(ProgramBuilder::vdiv, DType::F32, e, e, d);
            vx.muls(d, e, -1.0);
            vx.vcmps_f32(Cmp::Lt, bits, x, 0.0);
            vx.vsel(DType::F32, e, d, e, bits);
            // Series x (1 - x^2/3 + 2x^4/15 - 17x^6/315) for small |x|.
            vx.vbin(ProgramBuilder::vmul, DType::F32, d, x, x);
            vx.horner(o, d, &[-17.0 / 315.0, 2.0 / 15.0, -1.0 / 3.0, 1.0]);
            vx.vbin(ProgramBuilder::vmul, DType::F32, o, o, x);
            vx.vcmps_f32(Cmp::Lt, bits, ax, 0.125);
            vx.vsel(DType::F32, o, o, e, bits);
        }
        Act::Erf => {
            let (ax, t, w) = (s[0], s[1], s[2]);
            vx.vun(ProgramBuilder::vabs, DType::F32, ax, x);
            vx.vbin(ProgramBuilder::vmul, DType::F32, w, x, x);
            erfc(vx, o, ax, t, w);
            vx.rsubs(o, o, 1.0);
            vx.muls(w, o, -1.0);
            vx.vcmps_f32(Cmp::Lt, bits, x, 0.0);
            vx.vsel(DType::F32, o, w, o, bits);
            // Series 2/sqrt(pi) x (1 - x^2/3 + x^4/10 - x^6/42 + x^8/216 - x^10/1320).
            vx.vbin(ProgramBuilder::vmul, DType::F32, w, x, x);
            vx.horner(
                t,
                w,
                &[
                    -1.0 / 1320.0,
                    1.0 / 216.0,
                    -1.0 / 42.0,
                    1.0 / 10.0,
                    -1.0 / 3.0,
                    1.0,
                ],
            );
            vx.vbin(ProgramBuilder::vmul, DType::F32, t, t, x);
            vx.muls(t, t, FRAC_2_SQRT_PI);
            vx.vcmps_f32(Cmp::Lt, bits, ax, 0.5);
            vx.vsel(DType::F32, o, t, o, bits);
        }
        Act::Gelu => {
            let (z, t, w) = (s[0], s[1], s[2]);
            vx.vun(ProgramBuilder::vabs, DType::F32, z, x);
            vx.muls(z, z, FRAC_1_SQRT_2);
            // z^2 = x^2 / 2: one rounding instead of the square of a rounded z.
            vx.vbin(ProgramBuilder::vmul, DType::F32, w, x, x);
            vx.muls(w, w, 0.5);
            erfc(vx, o, z, t, w);
            vx.muls(o, o, 0.5);
            vx.rsubs(w, o, 1.0);
            vx.vcmps_f32(Cmp::Lt, bits, x, 0.0);
            vx.vsel(DType::F32, o, o, w, bits);
            vx.vbin(ProgramBuilder::vmul, DType::F32, o, o, x);
        }
        Act::GeluTanh => {
            let c1 = (2.0f64 / std::f64::consts::PI).sqrt();
            let c2 = c1 * 0.044715;
            let w = s[0];
            vx.vbin(ProgramBuilder::vmul, DType::F32, w, x, x);
            vx.muls(w, w, (-2.0 * c2) as f32);
            vx.adds(w, w, (-2.0 * c1) as f32);
            vx.vbin(ProgramBuilder::vmul, DType::F32, w, w, x);
            vx.vun(ProgramBuilder::vexp, DType::F32, w, w);
            vx.adds(w, w, 1.0);
            vx.vbin(ProgramBuilder::vdiv, DType::F32, o, x, w);
        }
        Act::Neg => vx.muls(o, x, -1.0),
        Act::Round(r) => {
            vx.vconv(DType::I32, DType::F32, o, x, r);
            vx.vconv(DType::F32, DType::I32, o, o, Round::Rint);
        }
        Act::Softplus => {
            let (t, r) = (s[0], s[1]);
            vx.vun(ProgramBuilder::vabs, DType::F32, t, x);
            vx.muls(t, t, -1.0);
            vx.vun(ProgramBuilder::vexp, DType::F32, t, t);
            vx.adds(t, t, 1.0);
            vx.vun(ProgramBuilder::vln, DType::F32, t, t);
            vx.vun(ProgramBuilder::vrelu, DType::F32, r, x);
            vx.vbin(ProgramBuilder::vadd, DType::F32, o, r, t);
        }
        Act::Softsign => {
            let t = s[0];
            vx.vun(ProgramBuilder::vabs, DType::F32, t, x);
            vx.adds(t, t, 1.0);
            vx.vbin(ProgramBuilder::vdiv, DType::F32, o, x, t);
        }
        Act::LeakyRelu(alpha) => {
            let t = s[0];
            vx.muls(t, x, alpha);
            vx.vcmps_f32(Cmp::Lt, bits, x, 0.0);
            vx.vsel(DType::F32, o, t, x, bits);
        }
        Act::Elu(alpha) => {
            let t = s[0];
            expm1_scaled(vx, t, x, alpha);
            vx.vcmps_f32(Cmp::Lt, bits, x, 0.0);
            vx.vsel(DType::F32, o, t, x, bits);
        }
        Act::Selu(alpha, gamma) => {
            let t = s[0];
            expm1_scaled(vx, t, x, alpha);
            vx.vcmps_f32(Cmp::Le, bits, x, 0.0);
            vx.vsel(DType::F32, o, t, x, bits);
            vx.muls(o, o, gamma);
        }
        Act::Celu(alpha) => {
            let t = s[0];
            vx.muls(t, x, 1.0 / alpha);
            expm1_scaled(vx, t, t, alpha);
            vx.vcmps_f32(Cmp::Lt, bits, x, 0.0);
            vx.vsel(DType::F32, o, t, x, bits);
        }
        Act::HardSigmoid(alpha, beta) => {
            vx.muls(o, x, alpha);
            vx.adds(o, o, beta);
            clamp01(vx, o);
        }
        Act::HardSwish => {
            let t = s[0];
            vx.muls(t, x, 1.0 / 6.0);
            vx.adds(t, t, 0.5);
            clamp01(vx, t);
            vx.vbin(ProgramBuilder::vmul, DType::F32, o, x, t);
        }
        Act::Sign => {
            let (c, z) = (s[0], s[1]);
            vx.vdup(DType::F32, z, i64::from(0f32.to_bits()));
            vx.vdup(DType::F32, c, i64::from(1f32.to_bits()));
            vx.vcmps_f32(Cmp::Gt, bits, x, 0.0);
            vx.vsel(DType::F32, o, c, z, bits);
            vx.vdup(DType::F32, c, i64::from((-1f32).to_bits()));
            vx.vcmps_f32(Cmp::Lt, bits, x, 0.0);
            vx.vsel(DType::F32, o, c, o, bits);
            // NaN compares unequal to itself: keep it.
            vx.vcmp(Cmp::Eq, DType::F32, bits, x, x);
            vx.vsel(DType::F32, o, o, x, bits);
        }
        Act::ThresholdedRelu(alpha) => {
            let t = s[0];
            vx.vdup(DType::F32, t, i64::from(0f32.to_bits()));
            vx.vcmps_f32(Cmp::Gt, bits, x, alpha);
            vx.vsel(DType::F32, o, x, t, bits);
        }
    }
}

/// `d = alpha (e^x - 1)` (`d` may be `x`).
fn expm1_scaled(vx: &mut Vx<'_>, d: View, x: View, alpha: f32) {
    vx.vun(ProgramBuilder::vexp, DType::F32, d, x);
    vx.adds(d, d, -1.0);
    vx.muls(d, d, alpha);
}

/// `d = max(0, min(1, d))`.
fn clamp01(vx: &mut Vx<'_>, d: View) {
    vx.vscalar(
        ProgramBuilder::vmins,
        DType::F32,
        d,
        d,
        i64::from(1f32.to_bits()),
    );
    vx.vun(ProgramBuilder::vrelu, DType::F32, d, d);
}

/// A constant exponent with a cheaper exact form than exp(b ln a).
pub fn pow_special(b: f64) -> bool {
    [0.0, 1.0, 2.0, 3.0, 4.0, -1.0, -2.0, 0.5].contains(&b)
}

/// `o = x^b` for a [`pow_special`] exponent, in the tensor's own type `ty`; `s` is one tile of
/// that type and `bits` a bit-mask buffer.
pub fn pow_special_emit(vx: &mut Vx<'_>, ty: DType, b: f64, o: View, x: View, s: View, bits: Reg) {
    let one = if ty == DType::F16 {
        i64::from(half::f16::from_f32(1.0).to_bits())
    } else {
        i64::from(1.0f32.to_bits())
    };
    let neg_inf = if ty == DType::F16 {
        i64::from(half::f16::NEG_INFINITY.to_bits())
    } else {
        i64::from(f32::NEG_INFINITY.to_bits())
    };
    match b {
        0.0 => vx.vdup(ty, o, one),
        1.0 => vx.vun(ProgramBuilder::vmov, ty, o, x),
        2.0 => vx.vbin(ProgramBuilder::vmul, ty, o, x, x),
        3.0 => {
            vx.vbin(ProgramBuilder::vmul, ty, o, x, x);
            vx.vbin(ProgramBuilder::vmul, ty, o, o, x);
        }
        4.0 => {
            vx.vbin(ProgramBuilder::vmul, ty, o, x, x);
            vx.vbin(ProgramBuilder::vmul, ty, o, o, o);
        }
        -1.0 => vx.vun(ProgramBuilder::vrec, ty, o, x),
        -2.0 => {
            vx.vbin(ProgramBuilder::vmul, ty, o, x, x);
            vx.vun(ProgramBuilder::vrec, ty, o, o);
        }
        _ => {
            // sqrt, except pow(-inf, 0.5) = +inf where sqrt gives NaN.
            vx.vun(ProgramBuilder::vsqrt, ty, o, x);
            vx.vun(ProgramBuilder::vabs, ty, s, x);
            vx.vcmps(Cmp::Eq, ty, bits, x, neg_inf);
            vx.vsel(ty, o, s, o, bits);
        }
    }
}

/// Constants [`pow_general`] reads, in this order.
pub const POW_CONSTS: [(DType, u32); 4] = [
    (DType::F32, 0x3f80_0000), // 1.0
    (DType::F32, 0),           // 0.0
    (DType::F32, 0x7fc0_0000), // NaN
    (DType::I32, 1),
];

/// f32 scratch tiles [`pow_general`] needs (besides one bit-mask buffer).
pub const POW_SCRATCH: usize = 5;

/// The exponent of [`pow_general`].
#[derive(Debug, Clone, Copy)]
pub enum Exponent {
    /// An f32 view.
    Float(View),
    /// An i32 exponent.
    Int {
        /// The exponent.
        int: View,
        /// A scratch tile for its f32 copy.
        float: View,
    },
}

/// `o = a^b` in f32 with C's `pow` special cases (which ONNX follows):
///
/// 1. `r = exp(b ln|a|)` (relative error about `|b ln a|` f32 ulps: 5e-6 at 1e38);
/// 2. `|a| = 1` gives 1 (`(-1)^±inf`, and no `inf * 0` NaN);
/// 3. an odd integer `b` negates where `a`'s sign bit is set (-0 and -inf included);
/// 4. a finite negative `a` with a non-integer `b` gives NaN;
/// 5. `b = 0` gives 1, a NaN `b` NaN, `a = 1` gives 1.
///
/// Integer tests on f32 clamp to +-2^23 first (every f32 beyond is an even integer) and compare
/// the value with its truncation; an i32 exponent is integer and its parity is its low bit.
/// `s` holds [`POW_SCRATCH`] tiles and `c` the [`POW_CONSTS`] splats.
pub fn pow_general(
    vx: &mut Vx<'_>,
    o: View,
    a: View,
    b: Exponent,
    s: &[View],
    c: &[View],
    bits: Reg,
) {
    let (one, zero, nan, one_i) = (c[0], c[1], c[2], c[3]);
    let (s0, s1, s2, s3, s4) = (s[0], s[1], s[2], s[3], s[4]);
    let bf = match b {
        Exponent::Float(v) => v,
        Exponent::Int { int, float } => {
            vx.vconv(DType::F32, DType::I32, float, int, Round::Rint);
            float
        }
    };
    // 1 and 2.
    vx.vun(ProgramBuilder::vabs, DType::F32, s0, a);
    vx.vun(ProgramBuilder::vln, DType::F32, s1, s0);
    vx.vbin(ProgramBuilder::vmul, DType::F32, s1, s1, bf);
    vx.vun(ProgramBuilder::vexp, DType::F32, o, s1);
    vx.vcmps_f32(Cmp::Eq, bits, s0, 1.0);
    vx.vsel(DType::F32, o, one, o, bits);
    // Integer and odd flags as 0.0 / 1.0: s4 = int(b), s3 = odd(b).
    let is_int = |vx: &mut Vx<'_>, dst: View, v: View, t: View| {
        vx.vscalar(
            ProgramBuilder::vmaxs,
            DType::F32,
            t,
            v,
            i64::from((-8_388_608.0f32).to_bits()),
        );
        vx.vscalar(
            ProgramBuilder::vmins,
            DType::F32,
            t,
            t,
            i64::from(8_388_608.0f32.to_bits()),
        );
        vx.vconv(DType::I32, DType::F32, dst, t, Round::Trunc);
        vx.vconv(DType::F32, DType::I32, dst, dst, Round::Rint);
        vx.vcmp(Cmp::Eq, DType::F32, bits, dst, t);
        vx.vsel(DType::F32, dst, one, zero, bits);
    };
    match b {
        Exponent::Float(v) => {
            is_int(vx, s4, v, s2);
            vx.muls(s1, v, 0.5);
            is_int(vx, s3, s1, s2);
            vx.vbin(ProgramBuilder::vsub, DType::F32, s3, s4, s3);
        }
        Exponent::Int { int, .. } => {
            vx.vbin(ProgramBuilder::vand, DType::I32, s3, int, one_i);
            vx.vconv(DType::F32, DType::I32, s3, s3, Round::Rint);
        }
    }
    // 3: negate where odd(b) and a's sign bit is set.
    vx.vcmps(Cmp::Lt, DType::I32, bits, a, 0);
    vx.vsel(DType::F32, s2, one, zero, bits);
    vx.vbin(ProgramBuilder::vmul, DType::F32, s2, s2, s3);
    vx.vcmps_f32(Cmp::Eq, bits, s2, 1.0);
    vx.muls(s1, o, -1.0);
    vx.vsel(DType::F32, o, s1, o, bits);
    // 4: finite negative a with a non-integer b.
    if let Exponent::Float(_) = b {
        vx.vcmps_f32(Cmp::Lt, bits, a, 0.0);
        vx.vsel(DType::F32, s2, one, zero, bits);
        vx.vcmps_f32(Cmp::Gt, bits, a, f32::NEG_INFINITY);
        vx.vsel(DType::F32, s1, one, zero, bits);
        vx.vbin(ProgramBuilder::vmul, DType::F32, s2, s2, s1);
        vx.rsubs(s1, s4, 1.0);
        vx.vbin(ProgramBuilder::vmul, DType::F32, s2, s2, s1);
        vx.vcmps_f32(Cmp::Eq, bits, s2, 1.0);
        vx.vsel(DType::F32, o, nan, o, bits);
    }
    // 5.
    match b {
        Exponent::Float(v) => {
            vx.vcmps_f32(Cmp::Eq, bits, v, 0.0);
            vx.vsel(DType::F32, o, one, o, bits);
            vx.vcmp(Cmp::Eq, DType::F32, bits, v, v);
            vx.vsel(DType::F32, o, o, nan, bits);
        }
        Exponent::Int { int, .. } => {
            vx.vcmps(Cmp::Eq, DType::I32, bits, int, 0);
            vx.vsel(DType::F32, o, one, o, bits);
        }
    }
    vx.vcmps_f32(Cmp::Eq, bits, a, 1.0);
    vx.vsel(DType::F32, o, one, o, bits);
}
