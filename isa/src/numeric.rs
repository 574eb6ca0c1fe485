//! Element values and conversions with ONNX `Cast` semantics, for every element type a tensor
//! can hold: the compiler's evaluator and the AI CPU's Cast kernel both convert through here,
//! so a constant folded at compile time and the same cast run on the device agree bit for bit.
//!
//! A value is decoded to a [`Scalar`] (an f64 for float types, which holds every element of
//! every float type exactly; an i128 for integers, which holds u64 and i64 alike) and encoded
//! with one rounding:
//! - to a float type: round to nearest even; an overflow gives infinity where the type has one,
//!   NaN where it has only NaN, and the largest value where it has neither (FLOAT4E2M1);
//!   `saturate` (float8 only, as ONNX's attribute) clamps to the largest finite value first;
//! - to an integer type: truncation toward zero (NaN to 0, saturating at the i64 range), then
//!   wrapping to the type's width, as numpy and ml_dtypes do;
//! - to bool: non-zero is true.
//!
//! FLOAT8E8M0 follows `onnx.numpy_helper.to_float8e8m0` (from the value as f32, rounding `up`,
//! `down` or to `nearest`).

use crate::dtype::DataType;

/// One element's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    /// A float type's value (exact).
    Float(f64),
    /// An integer or bool's value.
    Int(i128),
}

impl Scalar {
    /// The value as f64 (integers rounded once).
    pub fn to_f64(self) -> f64 {
        match self {
            Scalar::Float(x) => x,
            Scalar::Int(i) => i as f64,
        }
    }
}

/// How a cast to FLOAT8E8M0 rounds (Cast's `round_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RoundMode {
    /// Up to the next power of two (the default).
    #[default]
    Up,
    /// Down (the exponent as it is).
    Down,
    /// To the nearest power of two.
    Nearest,
}

impl RoundMode {
    /// The attribute's spelling.
    pub fn name(self) -> &'static str {
        match self {
            RoundMode::Up => "up",
            RoundMode::Down => "down",
            RoundMode::Nearest => "nearest",
        }
    }

    /// The mode of an attribute value.
    pub fn from_name(s: &str) -> Option<RoundMode> {
        [RoundMode::Up, RoundMode::Down, RoundMode::Nearest]
            .into_iter()
            .find(|m| m.name() == s)
    }

    /// A stable code (for argument blocks).
    pub fn code(self) -> u32 {
        match self {
            RoundMode::Up => 0,
            RoundMode::Down => 1,
            RoundMode::Nearest => 2,
        }
    }

    /// The mode of a code.
    pub fn from_code(c: u32) -> Option<RoundMode> {
        [RoundMode::Up, RoundMode::Down, RoundMode::Nearest]
            .into_iter()
            .find(|m| m.code() == c)
    }
}

/// How a cast treats values its target cannot hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CastMode {
    /// Clamp to the largest finite value (float8 targets only).
    pub saturate: bool,
    /// FLOAT8E8M0's rounding.
    pub round: RoundMode,
}

impl Default for CastMode {
    /// ONNX's defaults: `saturate=1`, `round_mode="up"`.
    fn default() -> CastMode {
        CastMode {
            saturate: true,
            round: RoundMode::Up,
        }
    }
}

/// What a small float format does with its all-ones patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Specials {
    /// IEEE: infinities and NaNs in the top exponent.
    Ieee,
    /// `FN`: no infinity; only all-ones exponent and mantissa is NaN.
    FiniteNan,
    /// `FNUZ`: no infinity, no negative zero; 0x80 is the only NaN.
    Fnuz,
    /// Neither infinity nor NaN (FLOAT4E2M1); NaN converts to the negative-zero pattern, as
    /// ml_dtypes does.
    None,
}

/// A binary float format of at most 16 bits.
#[derive(Debug, Clone, Copy)]
struct Format {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    specials: Specials,
}

const F16: Format = Format {
    exp_bits: 5,
    man_bits: 10,
    bias: 15,
    specials: Specials::Ieee,
};

fn format(dtype: DataType) -> Option<Format> {
    let (exp_bits, man_bits, bias, specials) = match dtype {
        DataType::F16 => return Some(F16),
        DataType::BF16 => (8, 7, 127, Specials::Ieee),
        DataType::F8E4M3FN => (4, 3, 7, Specials::FiniteNan),
        DataType::F8E4M3FNUZ => (4, 3, 8, Specials::Fnuz),
        DataType::F8E5M2 => (5, 2, 15, Specials::Ieee),
        DataType::F8E5M2FNUZ => (5, 2, 16, Specials::Fnuz),
        DataType::F4E2M1 => (2, 1, 1, Specials::None),
        _ => return None,
    };
    Some(Format {
        exp_bits,
        man_bits,
        bias,
        specials,
    })
}

impl Format {
    fn sign_bit(self) -> u32 {
        1 << (self.exp_bits + self.man_bits)
    }

    fn top_exp(self) -> u32 {
        (1 << self.exp_bits) - 1
    }

    /// The largest finite value.
    fn max(self) -> f64 {
        let m = self.man_bits as i32;
        let (top_field, top_mantissa) = match self.specials {
            Specials::Ieee => (self.top_exp() - 1, (1 << m) - 1),
            // The all-ones pattern is NaN, so the top exponent stops one short.
            Specials::FiniteNan => (self.top_exp(), (1 << m) - 2),
            Specials::Fnuz | Specials::None => (self.top_exp(), (1 << m) - 1),
        };
        let e = top_field as i32 - self.bias;
        f64::from((1u32 << m) + top_mantissa) * f64::powi(2.0, e - m)
    }

    fn nan(self, negative: bool) -> u32 {
        let sign = if negative { self.sign_bit() } else { 0 };
        match self.specials {
            Specials::Ieee => sign | (self.top_exp() << self.man_bits) | (1 << (self.man_bits - 1)),
            Specials::FiniteNan => sign | (self.sign_bit() - 1),
            Specials::Fnuz | Specials::None => self.sign_bit(),
        }
    }

    fn decode(self, bits: u32) -> f64 {
        let m = self.man_bits;
        let negative = bits & self.sign_bit() != 0;
        let field = (bits >> m) & self.top_exp();
        let mantissa = bits & ((1 << m) - 1);
        let nan = match self.specials {
            Specials::Ieee => field == self.top_exp() && mantissa != 0,
            Specials::FiniteNan => field == self.top_exp() && mantissa == (1 << m) - 1,
            Specials::Fnuz => bits == self.sign_bit(),
            Specials::None => false,
        };
        if nan {
            return f64::NAN;
        }
        let magnitude = if self.specials == Specials::Ieee && field == self.top_exp() {
            f64::INFINITY
        } else if field == 0 {
            f64::from(mantissa) * f64::powi(2.0, 1 - self.bias - m as i32)
        } else {
            f64::from((1 << m) | mantissa) * f64::powi(2.0, field as i32 - self.bias - m as i32)
        };
        if negative { -magnitude } else { magnitude }
    }

    /// `x` rounded once to nearest even.
    fn encode(self, x: f64, saturate: bool) -> u32 {
        let negative = x.is_sign_negative();
        if x.is_nan() {
            return self.nan(negative);
        }
        let sign = if negative { self.sign_bit() } else { 0 };
        let max = self.max();
        let mut a = x.abs();
        if saturate && a > max {
            a = max;
        }
        let m = self.man_bits as i32;
        let emin = 1 - self.bias;
        // The quantum of a's binade (the subnormal one below 2^emin); the scalings by powers of
        // two are exact, so the only rounding is round_ties_even's.
        let e = if a == 0.0 || a.is_infinite() {
            emin
        } else {
            (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(emin)
        };
        let r = if a.is_infinite() {
            a
        } else {
            (a * f64::powi(2.0, m - e)).round_ties_even() * f64::powi(2.0, e - m)
        };
        if r > max {
            return match self.specials {
                Specials::Ieee => sign | (self.top_exp() << self.man_bits),
                Specials::FiniteNan | Specials::Fnuz => self.nan(negative),
                Specials::None => sign | self.encode(max, false),
            };
        }
        if r == 0.0 {
            return if self.specials == Specials::Fnuz {
                0
            } else {
                sign
            };
        }
        let re = ((r.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let bits = if re < emin {
            (r * f64::powi(2.0, m - emin)) as u32
        } else {
            (((re + self.bias) as u32) << m) | ((r * f64::powi(2.0, m - re)) as u32 - (1 << m))
        };
        sign | bits
    }
}

/// f64 to IEEE binary16 bits, rounded once to nearest even.
pub fn f64_to_f16_bits(x: f64) -> u16 {
    F16.encode(x, false) as u16
}

/// FLOAT8E8M0 bits of `x` (converted to f32 first, as ONNX's reference does).
fn e8m0_encode(x: f64, mode: CastMode) -> u8 {
    let bits = (x as f32).to_bits();
    let exponent = (bits >> 23) & 0xff;
    if exponent == 0xff {
        return 0xff;
    }
    let round_up = match mode.round {
        RoundMode::Down => false,
        RoundMode::Up => bits & 0x7f_ffff != 0,
        RoundMode::Nearest => {
            let (g, r, s) = (
                bits & 0x40_0000 != 0,
                bits & 0x20_0000 != 0,
                bits & 0x1f_ffff != 0,
            );
            g && (r || s || exponent > 0)
        }
    };
    let up = round_up && !(mode.saturate && exponent == 0xfe);
    (exponent + u32::from(up)) as u8
}

/// The value of element `i` of `bytes` (held as `dtype`, one element per
/// [`DataType::size`] bytes).
pub fn decode(dtype: DataType, bytes: &[u8], i: usize) -> Scalar {
    let at = i * dtype.size();
    let b = &bytes[at..at + dtype.size()];
    let word = |n: usize| -> u64 {
        let mut w = [0u8; 8];
        w[..n].copy_from_slice(&b[..n]);
        u64::from_le_bytes(w)
    };
    match dtype {
        DataType::F64 => Scalar::Float(f64::from_bits(word(8))),
        DataType::F32 => Scalar::Float(f64::from(f32::from_bits(word(4) as u32))),
        DataType::F8E8M0 => Scalar::Float(if b[0] == 0xff {
            f64::NAN
        } else {
            f64::powi(2.0, i32::from(b[0]) - 127)
        }),
        DataType::F16
        | DataType::BF16
        | DataType::F8E4M3FN
        | DataType::F8E4M3FNUZ
        | DataType::F8E5M2
        | DataType::F8E5M2FNUZ
        | DataType::F4E2M1 => {
            let f = format(dtype).expect("a small float format");
            Scalar::Float(f.decode(word(dtype.size()) as u32))
        }
        DataType::I64 => Scalar::Int(i128::from(word(8) as i64)),
        DataType::I32 => Scalar::Int(i128::from(word(4) as u32 as i32)),
        DataType::I16 => Scalar::Int(i128::from(word(2) as u16 as i16)),
        DataType::I8 | DataType::I4 | DataType::I2 => Scalar::Int(i128::from(b[0] as i8)),
        DataType::U64 => Scalar::Int(i128::from(word(8))),
        DataType::U32 | DataType::U16 | DataType::U8 | DataType::U4 | DataType::U2 => {
            Scalar::Int(i128::from(word(dtype.size())))
        }
        DataType::Bool => Scalar::Int(i128::from(b[0] != 0)),
    }
}

/// Appends `v` encoded as `dtype` (see the module's rules).
pub fn encode(dtype: DataType, v: Scalar, mode: CastMode, out: &mut Vec<u8>) {
    match (dtype, v) {
        (DataType::Bool, Scalar::Float(x)) => out.push(u8::from(x != 0.0)),
        (DataType::Bool, Scalar::Int(i)) => out.push(u8::from(i != 0)),
        (DataType::F64, v) => out.extend_from_slice(&v.to_f64().to_le_bytes()),
        // One correctly rounded step from either side (Rust's `as` rounds to nearest even).
        (DataType::F32, Scalar::Float(x)) => out.extend_from_slice(&(x as f32).to_le_bytes()),
        (DataType::F32, Scalar::Int(i)) => out.extend_from_slice(&(i as f32).to_le_bytes()),
        (DataType::F8E8M0, v) => out.push(e8m0_encode(v.to_f64(), mode)),
        (_, v) if let Some(f) = format(dtype) => {
            let float8 = matches!(
                dtype,
                DataType::F8E4M3FN | DataType::F8E4M3FNUZ | DataType::F8E5M2 | DataType::F8E5M2FNUZ
            );
            // An integer beyond 2^53 is rounded twice, but every such value lies far outside
            // these formats' ranges, where both roundings give the same overflow.
            let bits = f.encode(v.to_f64(), mode.saturate && float8);
            out.extend_from_slice(&bits.to_le_bytes()[..dtype.size()]);
        }
        (_, v) => {
            let i: i128 = match v {
                Scalar::Int(i) => i,
                // Truncation toward zero, saturating at the i64 range, NaN to 0.
                Scalar::Float(x) => i128::from(x as i64),
            };
            let wrapped = match dtype {
                DataType::I4 => i128::from(((i as u8) << 4) as i8 >> 4),
                DataType::I2 => i128::from(((i as u8) << 6) as i8 >> 6),
                DataType::U4 => i & 0xf,
                DataType::U2 => i & 0x3,
                _ => i,
            };
            out.extend_from_slice(&(wrapped as u64).to_le_bytes()[..dtype.size()]);
        }
    }
}

/// Casts every element of `src` (held as `from`) to `to`.
pub fn cast(from: DataType, to: DataType, src: &[u8], mode: CastMode) -> Vec<u8> {
    let n = src.len() / from.size();
    let mut out = Vec::with_capacity(n * to.size());
    for i in 0..n {
        encode(to, decode(from, src, i), mode, &mut out);
    }
    out
}

/// Packs elements held one per byte into ONNX's sub-byte layout (`bits` 4 or 2: the first
/// element in the low bits), padding the last byte with zeros.
pub fn pack(bytes: &[u8], bits: usize) -> Vec<u8> {
    let per = 8 / bits;
    let mask = (1u8 << bits) - 1;
    bytes
        .chunks(per)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u8, |acc, (k, v)| acc | ((v & mask) << (k * bits)))
        })
        .collect()
}

/// Unpacks `count` elements of `bits` (4 or 2) bits into one byte each, sign-extending when
/// `signed`.
pub fn unpack(packed: &[u8], bits: usize, count: usize, signed: bool) -> Vec<u8> {
    let per = 8 / bits;
    (0..count)
        .map(|i| {
            let v = (packed[i / per] >> ((i % per) * bits)) << (8 - bits);
            if signed {
                ((v as i8) >> (8 - bits)) as u8
            } else {
                v >> (8 - bits)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(dtype: DataType, x: f64, saturate: bool) -> u32 {
        let mut out = Vec::new();
        let mode = CastMode {
            saturate,
            round: RoundMode::Up,
        };
        encode(dtype, Scalar::Float(x), mode, &mut out);
        let mut w = [0u8; 4];
        w[..out.len()].copy_from_slice(&out);
        u32::from_le_bytes(w)
    }

    #[test]
    fn float8_limits_and_overflow_follow_ml_dtypes() {
        // Patterns ml_dtypes 0.6 gives for these values (astype, i.e. not saturating).
        let cases = [
            (
                DataType::F8E4M3FN,
                [127, 255, 127, 127, 255, 128, 0, 127, 126, 119, 119],
            ),
            (
                DataType::F8E4M3FNUZ,
                [128, 128, 128, 128, 128, 0, 0, 128, 128, 127, 127],
            ),
            (
                DataType::F8E5M2,
                [124, 252, 126, 124, 252, 128, 0, 96, 95, 92, 92],
            ),
            (
                DataType::F8E5M2FNUZ,
                [128, 128, 128, 128, 128, 0, 0, 100, 99, 96, 96],
            ),
        ];
        let xs = [
            1e6,
            -1e6,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            1e-7,
            500.0,
            464.0,
            240.0,
            241.0,
        ];
        for (dtype, want) in cases {
            let got: Vec<u32> = xs.iter().map(|x| enc(dtype, *x, false)).collect();
            assert_eq!(got, want, "{}", dtype.name());
        }
        assert_eq!(enc(DataType::F8E4M3FN, 1e6, true), 126); // 448
        assert_eq!(enc(DataType::F8E4M3FN, f64::NEG_INFINITY, true), 254); // -448
        assert_eq!(enc(DataType::F8E5M2, f64::INFINITY, true), 123); // 57344
    }

    #[test]
    fn float4_saturates_and_nan_is_negative_zero() {
        let xs = [
            0.48,
            0.25,
            1.05,
            -3.5,
            -8.0,
            9.0,
            1e6,
            1e-7,
            f64::NAN,
            f64::INFINITY,
        ];
        let got: Vec<u32> = xs
            .iter()
            .map(|x| enc(DataType::F4E2M1, *x, false))
            .collect();
        assert_eq!(got, [1, 0, 2, 14, 15, 7, 7, 0, 8, 7]);
        assert_eq!(enc(DataType::F4E2M1, -0.0, false), 8);
    }

    #[test]
    fn every_small_float_pattern_round_trips() {
        for dtype in [
            DataType::F16,
            DataType::BF16,
            DataType::F8E4M3FN,
            DataType::F8E4M3FNUZ,
            DataType::F8E5M2,
            DataType::F8E5M2FNUZ,
            DataType::F4E2M1,
        ] {
            let n = dtype.size();
            let count = if dtype == DataType::F4E2M1 {
                16
            } else {
                1usize << (8 * n)
            };
            for p in 0..count {
                let bytes = (p as u32).to_le_bytes();
                let x = decode(dtype, &bytes[..n], 0).to_f64();
                let back = enc(dtype, x, false);
                if x.is_nan() {
                    assert!(decode(dtype, &back.to_le_bytes()[..n], 0).to_f64().is_nan());
                } else {
                    assert_eq!(back, p as u32, "{} pattern {p:#x} = {x}", dtype.name());
                }
            }
        }
    }

    #[test]
    fn integers_truncate_then_wrap_like_ml_dtypes() {
        let xs: Vec<f64> = (-9..16).map(f64::from).collect();
        let i4: Vec<i128> = xs
            .iter()
            .map(|x| {
                let mut b = Vec::new();
                encode(DataType::I4, Scalar::Float(*x), CastMode::default(), &mut b);
                match decode(DataType::I4, &b, 0) {
                    Scalar::Int(i) => i,
                    Scalar::Float(_) => unreachable!(),
                }
            })
            .collect();
        let want: Vec<i128> = vec![
            7, -8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2,
            -1,
        ];
        assert_eq!(i4, want);
        let mut b = Vec::new();
        encode(
            DataType::U2,
            Scalar::Float(-3.0),
            CastMode::default(),
            &mut b,
        );
        assert_eq!(b, [1]);
        let mut b = Vec::new();
        encode(
            DataType::I4,
            Scalar::Float(-2.5),
            CastMode::default(),
            &mut b,
        );
        assert_eq!(b, [(-2i8) as u8]);
    }

    #[test]
    fn e8m0_rounds_as_onnx_reference() {
        let mode = |round| CastMode {
            saturate: true,
            round,
        };
        let xs = [0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 4.0, 8.0];
        let up: Vec<u8> = xs
            .iter()
            .map(|x| e8m0_encode(*x, mode(RoundMode::Up)))
            .collect();
        assert_eq!(up, [0, 124, 125, 126, 128, 128, 129, 130]);
        assert_eq!(e8m0_encode(1.5, mode(RoundMode::Nearest)), 128);
        assert_eq!(e8m0_encode(1.4, mode(RoundMode::Nearest)), 127);
        assert_eq!(e8m0_encode(1.9, mode(RoundMode::Down)), 127);
        assert_eq!(e8m0_encode(f64::INFINITY, mode(RoundMode::Up)), 255);
    }

    #[test]
    fn sub_byte_packing_round_trips() {
        let v: Vec<u8> = (-8i8..8).chain([3]).map(|x| x as u8).collect();
        let packed = pack(&v, 4);
        assert_eq!(packed.len(), 9);
        assert_eq!(unpack(&packed, 4, v.len(), true), v);
        let u = [0u8, 1, 2, 3, 3, 2];
        assert_eq!(unpack(&pack(&u, 2), 2, u.len(), false), u);
    }
}
