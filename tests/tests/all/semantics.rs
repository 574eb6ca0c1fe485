//! Functional semantics of every instruction in the table (`isa/src/table.rs`), checked by
//! running small kernels on the simulator and comparing with references computed here from the
//! documented semantics (never from simulator internals).
//!
//! Numerics the references rely on (documented in `sim/src/exec/vector.rs` and `cube.rs`):
//! - f16 vector arithmetic is done once in f32 and rounded once to f16, round to nearest even.
//!   For add, sub, mul, div, sqrt and rec (1/x) that is the correctly rounded f16 result, so the
//!   references compute in f64 (exact for add/sub/mul of f16 values; for div and sqrt one f64
//!   rounding before the f16 one is innocuous because 53 >= 2 * 11 + 2) and round once to f16
//!   with [`f16_round`], written here from first principles.
//! - `vmla` rounds the product and the sum in f32, then once to f16.
//! - exp and ln come from the `libm` crate and rsqrt is `1 / sqrt` rounded twice, so those are
//!   compared within 1 ulp of the f64 result (2 ulps for f32 rsqrt); everything else bit-exactly
//!   (any NaN matches any NaN).
//! - f16 reductions accumulate in f32 and round once; the inputs are chosen so that the f32 sum is
//!   exact, which makes the expected value independent of the summation order.
//! - The cube multiplies f16 values exactly in f32 and accumulates in f32 in ascending k order.

use gearsim_firmware::{Device, DevicePtr};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_tests::*;
use gearsim_traces::NullSink;
use half::f16;

// ---- harness ---------------------------------------------------------------------------------

/// A device plus helpers to move bytes in and out and to run one-block kernels.
struct Sim {
    dev: Device<NullSink>,
}

impl Sim {
    fn new() -> Sim {
        Sim::with(ChipConfig::preset("ascend910").expect("the ascend910 preset"))
    }

    fn with(cfg: ChipConfig) -> Sim {
        Sim {
            dev: Device::new(cfg, NullSink),
        }
    }

    /// Allocates device memory holding `data`; returns its address.
    fn put(&mut self, data: &[u8]) -> u64 {
        upload(&mut self.dev, data).0
    }

    fn get(&mut self, addr: u64, len: usize) -> Vec<u8> {
        download(&mut self.dev, DevicePtr(addr), len)
    }

    fn get_u64s(&mut self, addr: u64, n: usize) -> Vec<u64> {
        self.get(addr, n * 8)
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }

    /// Assembles and runs `src` on `blocks` blocks in full mode.
    fn run(&mut self, src: &str, blocks: u32, args: &[u64]) {
        let program = gearsim_isa::assemble(src, "semantics.s")
            .unwrap_or_else(|e| panic!("{e}\n--- kernel ---\n{src}"));
        let k = self
            .dev
            .load_kernel(program)
            .unwrap_or_else(|e| panic!("{e}\n--- kernel ---\n{src}"));
        self.dev
            .launch(k, blocks, args, ExecMode::Full)
            .unwrap_or_else(|e| panic!("{e}\n--- kernel ---\n{src}"));
    }

    /// The vector harness: loads `inputs[i]` into UB at `UB_IN[i]` (register `x20 + i`) and the
    /// initial contents of the output region at `UB_OUT` (register `x24`), runs `body` after an
    /// MTE2 -> V flag, stores the output region after a V -> MTE3 flag and returns it. Lengths
    /// are padded to whole 32-byte blocks. `body` may use x25..x31 freely.
    fn ub(&mut self, inputs: &[&[u8]], out: &[u8], body: &str) -> Vec<u8> {
        assert!(inputs.len() <= UB_IN.len());
        let pad = |d: &[u8]| {
            let mut v = d.to_vec();
            v.resize(d.len().div_ceil(32).max(1) * 32, 0);
            v
        };
        let out_p = pad(out);
        assert!(out_p.len() <= 0x10000 && inputs.iter().all(|i| i.len() <= 0x8000));
        let mut args = vec![self.put(&out_p)];
        let mut src = format!(
            "sreg x1, args\n ld.gm.u64 x2, x1\n movi x24, {UB_OUT}\n copy_gm_to_ub x24, x2, 1, {}\n",
            out_p.len() / 32
        );
        for (i, data) in inputs.iter().enumerate() {
            let d = pad(data);
            args.push(self.put(&d));
            src += &format!(
                " ld.gm.u64 x3, x1, off={}\n movi x{}, {}\n copy_gm_to_ub x{}, x3, 1, {}\n",
                8 * (i + 1),
                20 + i,
                UB_IN[i],
                20 + i,
                d.len() / 32
            );
        }
        src += " set_flag MTE2, V, 0\n wait_flag MTE2, V, 0\n";
        src += body;
        src += &format!(
            "\n set_flag V, MTE3, 0\n wait_flag V, MTE3, 0\n copy_ub_to_gm x2, x24, 1, {}\n end\n",
            out_p.len() / 32
        );
        self.run(&src, 1, &args);
        let mut got = self.get(args[0], out_p.len());
        got.truncate(out.len());
        got
    }
}

/// UB addresses of the vector harness's inputs (x20..x23) and output (x24).
const UB_IN: [u64; 4] = [0x0000, 0x8000, 0x10000, 0x18000];
const UB_OUT: u64 = 0x20000;

fn pick(rng: &mut Rng, v: &[u64]) -> u64 {
    v[(rng.next_u64() % v.len() as u64) as usize]
}

fn le_u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

// ---- element types, values and rounding ------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    F16,
    F32,
    I32,
    I16,
    U8,
}

impl Ty {
    fn size(self) -> usize {
        match self {
            Ty::U8 => 1,
            Ty::F16 | Ty::I16 => 2,
            Ty::F32 | Ty::I32 => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Ty::F16 => "f16",
            Ty::F32 => "f32",
            Ty::I32 => "i32",
            Ty::I16 => "i16",
            Ty::U8 => "u8",
        }
    }

    fn bits_mask(self) -> u64 {
        if self.size() == 2 {
            0xffff
        } else {
            0xffff_ffff
        }
    }

    /// Elements per 256-byte repeat.
    fn per_repeat(self) -> u64 {
        256 / self.size() as u64
    }
}

/// Raw elements (low bits of each u64) to little-endian bytes, and back.
fn pack(v: &[u64], ty: Ty) -> Vec<u8> {
    v.iter()
        .flat_map(|x| x.to_le_bytes()[..ty.size()].to_vec())
        .collect()
}

fn unpack(b: &[u8], ty: Ty) -> Vec<u64> {
    b.chunks_exact(ty.size())
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

fn h(raw: u64) -> f64 {
    f16::from_bits(raw as u16).to_f64()
}

fn s(raw: u64) -> f32 {
    f32::from_bits(raw as u32)
}

fn int(raw: u64) -> i32 {
    raw as u32 as i32
}

fn sr(x: f32) -> u64 {
    u64::from(x.to_bits())
}

fn ir(x: i32) -> u64 {
    u64::from(x as u32)
}

/// Round to the nearest f16, ties to even.
fn hr(x: f64) -> u64 {
    u64::from(f16_round(x, Rnd::Rint))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rnd {
    Rint,
    Floor,
    Ceil,
    Trunc,
    Round,
}

const ROUNDS: [Rnd; 5] = [Rnd::Rint, Rnd::Floor, Rnd::Ceil, Rnd::Trunc, Rnd::Round];

impl Rnd {
    fn name(self) -> &'static str {
        match self {
            Rnd::Rint => "rint",
            Rnd::Floor => "floor",
            Rnd::Ceil => "ceil",
            Rnd::Trunc => "trunc",
            Rnd::Round => "round",
        }
    }

    fn to_int(self, x: f64) -> f64 {
        match self {
            Rnd::Rint => x.round_ties_even(),
            Rnd::Floor => x.floor(),
            Rnd::Ceil => x.ceil(),
            Rnd::Trunc => x.trunc(),
            Rnd::Round => x.round(),
        }
    }
}

/// IEEE 754 rounding of a real value to binary16 in the given mode, from first principles: the
/// non-negative f16 bit patterns 0x0000..=0x7bff are ordered like their values, and while
/// rounding the pattern 0x7c00 stands for 2^16 (the next value with an unbounded exponent), so
/// rounding up to it is the overflow to infinity. A zero result keeps the sign of `x`.
fn f16_round(x: f64, mode: Rnd) -> u16 {
    if x.is_nan() {
        return 0x7e00;
    }
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    if a.is_infinite() {
        return sign | 0x7c00;
    }
    let val = |k: u16| {
        if k == 0x7c00 {
            65536.0
        } else {
            f16::from_bits(k).to_f64()
        }
    };
    // Largest pattern lo in [0, 0x7bff] with val(lo) <= a.
    let (mut lo, mut hi) = (0u16, 0x7bffu16);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if val(mid) <= a {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    if val(lo) == a {
        return sign | lo;
    }
    let up = lo + 1; // val(lo) < a < val(up), or a beyond 2^16 (then up is infinity anyway)
    let toward_zero = match mode {
        Rnd::Trunc => true,
        Rnd::Floor => sign == 0,
        Rnd::Ceil => sign != 0,
        Rnd::Rint | Rnd::Round => {
            if a >= 65536.0 {
                return sign | 0x7c00;
            }
            let (dl, du) = (a - val(lo), val(up) - a);
            if dl != du {
                dl < du
            } else if mode == Rnd::Rint {
                lo % 2 == 0
            } else {
                false
            }
        }
    };
    sign | if toward_zero { lo } else { up }
}

/// How a result is compared with its reference.
#[derive(Clone, Copy, Debug)]
enum Tol {
    /// The same bit pattern.
    Bits,
    /// The same bit pattern, or both NaN.
    Exact,
    /// Within this many ulps (+0 and -0 are the same point), or both NaN.
    Ulps(u64),
}

/// Position of a float on the number line in ulps (for f16 or f32 bit patterns).
fn ordinal(ty: Ty, raw: u64) -> i64 {
    let (sign, mag) = match ty {
        Ty::F16 => (raw & 0x8000 != 0, (raw & 0x7fff) as i64),
        _ => (raw & 0x8000_0000 != 0, (raw & 0x7fff_ffff) as i64),
    };
    if sign { -mag } else { mag }
}

fn is_nan(ty: Ty, raw: u64) -> bool {
    match ty {
        Ty::F16 => f16::from_bits(raw as u16).is_nan(),
        Ty::F32 => s(raw).is_nan(),
        _ => false,
    }
}

fn matches(ty: Ty, tol: Tol, got: u64, want: u64) -> bool {
    if got == want {
        return true;
    }
    match tol {
        Tol::Bits => false,
        Tol::Exact => is_nan(ty, want) && is_nan(ty, got),
        Tol::Ulps(n) => {
            if is_nan(ty, want) || is_nan(ty, got) {
                return is_nan(ty, want) && is_nan(ty, got);
            }
            (ty == Ty::F16 || ty == Ty::F32) && ordinal(ty, got).abs_diff(ordinal(ty, want)) <= n
        }
    }
}

/// Asserts that `got` and `want` agree element by element.
fn assert_elems(ty: Ty, tol: Tol, got: &[u64], want: &[u64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<String> = (0..want.len())
        .filter(|&i| !matches(ty, tol, got[i], want[i]))
        .take(6)
        .map(|i| format!("  element {i}: got {:#x}, want {:#x}", got[i], want[i]))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: {} mismatches ({tol:?}), first:\n{}",
        (0..want.len())
            .filter(|&i| !matches(ty, tol, got[i], want[i]))
            .count(),
        bad.join("\n")
    );
}

/// What random values an operand gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Finite values with edges: signed zeros, subnormals, the largest magnitudes.
    Finite,
    /// Finite values and infinities.
    NoNan,
    /// Finite values, infinities and NaN (for ops whose IEEE result is clear).
    Ieee,
    /// Finite values without -0 (max, min and relu do not specify the sign of a zero).
    NoNegZero,
    /// Arguments of exp: [-18, 12] for f16, [-104, 89] for f32, plus zeros and infinities.
    ExpArg,
    /// Arguments of ln / sqrt / rsqrt: mostly positive, with zeros, subnormals, the largest
    /// value, infinity and negative values.
    PosArg,
    /// Multiples of 1/256 in (-8, 8) (f16) or integers in (-2^16, 2^16) (f32), so that f32 sums
    /// of up to 128 of them are exact; any value for integers.
    ExactSum,
    /// Any bit pattern.
    Raw,
}

const F16_EDGES: &[u64] = &[
    0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x7800, 0xf800, 0x3c00,
    0xbc00, 0x3555,
];
const F32_EDGES: &[u64] = &[
    0,
    0x8000_0000,
    1,
    0x8000_0001,
    0x007f_ffff,
    0x0080_0000,
    0x7f7f_ffff,
    0xff7f_ffff,
    0x7f00_0000,
    0x3f80_0000,
    0xbf80_0000,
];
const I32_EDGES: &[u64] = &[
    0,
    1,
    0xffff_ffff,
    0x8000_0000,
    0x7fff_ffff,
    0x8000_0001,
    0xffff_fffe,
];

/// A finite f16 or f32 bit pattern with a uniformly random exponent.
fn finite_raw(ty: Ty, rng: &mut Rng) -> u64 {
    loop {
        let x = rng.next_u64() & ty.bits_mask();
        let exp_all_ones = match ty {
            Ty::F16 => (x >> 10) & 0x1f == 0x1f,
            _ => (x >> 23) & 0xff == 0xff,
        };
        if !exp_all_ones {
            return x;
        }
    }
}

/// A random bit pattern of `ty` drawn as `kind` says (edges about one time in eight).
fn value(ty: Ty, kind: Kind, rng: &mut Rng) -> u64 {
    let r = rng.next_u64() % 8;
    let float = |rng: &mut Rng, lo: f32, hi: f32| -> u64 {
        let x = rng.uniform(lo, hi);
        if ty == Ty::F16 {
            u64::from(f16::from_f32(x).to_bits())
        } else {
            sr(x)
        }
    };
    let (edges, infs, nan) = match ty {
        Ty::F16 => (F16_EDGES, [0x7c00u64, 0xfc00], 0x7e00u64),
        _ => (F32_EDGES, [0x7f80_0000, 0xff80_0000], 0x7fc0_0000),
    };
    let neg_zero = if ty == Ty::F16 { 0x8000 } else { 0x8000_0000 };
    match (ty, kind) {
        (Ty::I16, _) => rng.next_u64() & 0xffff,
        (Ty::I32, Kind::Raw | Kind::ExactSum) => rng.next_u64() & 0xffff_ffff,
        (Ty::I32, _) => {
            if r == 0 {
                pick(rng, I32_EDGES)
            } else {
                let shift = rng.next_u64() % 32;
                ir((rng.next_u64() as i32) >> shift)
            }
        }
        (_, Kind::Raw) => rng.next_u64() & ty.bits_mask(),
        (_, Kind::ExactSum) => {
            if ty == Ty::F16 {
                let k = (rng.next_u64() % 4095) as i32 - 2047;
                hr(f64::from(k) / 256.0)
            } else {
                sr(((rng.next_u64() % 131_071) as i32 - 65_535) as f32)
            }
        }
        (_, Kind::ExpArg) => match r {
            0 => pick(rng, &[0, neg_zero, infs[0], infs[1]]),
            _ if ty == Ty::F16 => float(rng, -18.0, 12.0),
            _ => float(rng, -104.0, 89.0),
        },
        (_, Kind::PosArg) => match r {
            0 => {
                let neg_one = if ty == Ty::F16 { 0xbc00 } else { 0xbf80_0000 };
                pick(
                    rng,
                    &[0, neg_zero, edges[2], edges[4], edges[6], infs[0], neg_one],
                )
            }
            1 => finite_raw(ty, rng) & (ty.bits_mask() >> 1),
            _ => float(rng, 0.0, 100.0),
        },
        _ => {
            let x = match r {
                0 => pick(rng, edges),
                1 if kind == Kind::NoNan => pick(rng, &infs),
                1 if kind == Kind::Ieee => pick(rng, &[infs[0], infs[1], nan]),
                1 | 2 => finite_raw(ty, rng),
                _ => float(rng, -100.0, 100.0),
            };
            if kind == Kind::NoNegZero && x == neg_zero {
                0
            } else {
                x
            }
        }
    }
}

// ---- vector addressing and masks -------------------------------------------------------------

/// Block and repeat stride of a vector operand, both in blocks (the table's conventions).
#[derive(Clone, Copy, Debug)]
struct Stride {
    blk: u64,
    rep: u64,
}

/// Contiguous: `blk=1, rep=8`.
const C: Stride = Stride { blk: 1, rep: 8 };

const fn st(blk: u64, rep: u64) -> Stride {
    Stride { blk, rep }
}

impl Stride {
    /// Element slot (in elements of this operand) of element `i` of repeat `r`, with
    /// `per_block` elements per block.
    fn at(self, r: u64, i: u64, per_block: u64) -> usize {
        ((r * self.rep + (i / per_block) * self.blk) * per_block + i % per_block) as usize
    }

    /// Element slots spanned by `repeats` repeats.
    fn slots(self, repeats: u64, per_block: u64) -> usize {
        if repeats == 0 {
            0
        } else {
            (((repeats - 1) * self.rep + 7 * self.blk + 1) * per_block) as usize
        }
    }
}

/// The vector mask as a kernel sets it.
#[derive(Clone, Copy, Debug)]
enum Mask {
    /// The mask a block starts with (every element).
    Full,
    /// Normal mode: bit i enables element i of every repeat.
    Bits(u128),
    /// Counter mode: the first n elements; the repeat count follows from n.
    Count(u64),
}

impl Mask {
    fn asm(self) -> String {
        match self {
            Mask::Full => String::new(),
            Mask::Bits(m) => format!(
                " movi x30, {:#x}\n movi x31, {:#x}\n set_mask x30, x31\n",
                (m >> 64) as u64,
                m as u64
            ),
            Mask::Count(n) => format!(" movi x30, {n}\n set_mask_count x30\n"),
        }
    }

    fn repeats(self, field: u64, per_repeat: u64) -> u64 {
        match self {
            Mask::Full | Mask::Bits(_) => field,
            Mask::Count(n) => n.div_ceil(per_repeat),
        }
    }

    fn on(self, r: u64, i: u64, per_repeat: u64) -> bool {
        match self {
            Mask::Full => true,
            Mask::Bits(m) => (m >> i) & 1 == 1,
            Mask::Count(n) => r * per_repeat + i < n,
        }
    }
}

/// `, <name>_blk=.., <name>_rep=..` for each operand.
fn keys(names: &[&str], strides: &[Stride]) -> String {
    names
        .iter()
        .zip(strides)
        .map(|(n, s)| format!(", {n}_blk={}, {n}_rep={}", s.blk, s.rep))
        .collect()
}

/// Repeat field, operand strides (in the instruction's operand order, unused ones ignored) and
/// mask of a vector instruction under test.
#[derive(Clone, Copy, Debug)]
struct Shape {
    repeat: u64,
    strides: [Stride; 3],
    mask: Mask,
}

/// Two contiguous repeats, full mask.
const PLAIN: Shape = Shape {
    repeat: 2,
    strides: [C; 3],
    mask: Mask::Full,
};

fn shape(repeat: u64, strides: &[Stride], mask: Mask) -> Shape {
    let mut s = [C; 3];
    s[..strides.len()].copy_from_slice(strides);
    Shape {
        repeat,
        strides: s,
        mask,
    }
}

impl Shape {
    /// Repeats actually processed for `per_repeat` elements per repeat.
    fn repeats(&self, per_repeat: u64) -> u64 {
        self.mask.repeats(self.repeat, per_repeat)
    }

    /// Enabled (repeat, element) pairs.
    fn enabled(&self, per_repeat: u64) -> Vec<(u64, u64)> {
        let reps = self.repeats(per_repeat);
        (0..reps)
            .flat_map(|r| (0..per_repeat).map(move |i| (r, i)))
            .filter(|&(r, i)| self.mask.on(r, i, per_repeat))
            .collect()
    }

    /// `repeat=..` and the stride keys of `names`.
    fn operands(&self, names: &[&str]) -> String {
        format!(
            ", repeat={}{}",
            self.repeat,
            keys(names, &self.strides[..names.len()])
        )
    }
}

/// The simulator and the random source of one test.
struct Lab {
    sim: Sim,
    rng: Rng,
}

impl Lab {
    fn new(seed: u64) -> Lab {
        Lab {
            sim: Sim::new(),
            rng: Rng::new(seed),
        }
    }

    fn values(&mut self, ty: Ty, kind: Kind, n: usize) -> Vec<u64> {
        (0..n).map(|_| value(ty, kind, &mut self.rng)).collect()
    }

    fn raw(&mut self, ty: Ty, n: usize) -> Vec<u64> {
        self.values(ty, Kind::Raw, n)
    }
}

// ---- element-wise vector instructions --------------------------------------------------------

/// One element-wise vector instruction (VBin, VUn, VScalar or VDup format): per enabled element,
/// `dst = f(sources [, scalar], old dst)`. Sources are x20 (, x21), the scalar register x25.
#[derive(Clone, Debug)]
struct Ew {
    op: &'static str,
    ty: Ty,
    nsrc: usize,
    scalar: Option<u64>,
    /// Strides: dst, then the sources.
    shape: Shape,
}

impl Ew {
    fn new(op: &'static str, ty: Ty, nsrc: usize) -> Ew {
        Ew {
            op,
            ty,
            nsrc,
            scalar: None,
            shape: PLAIN,
        }
    }

    fn scalar(mut self, k: u64) -> Ew {
        self.scalar = Some(k);
        self
    }

    fn shape(mut self, s: Shape) -> Ew {
        self.shape = s;
        self
    }

    fn asm(&self) -> String {
        let names = &["dst", "src0", "src1"][..=self.nsrc];
        let names: &[&str] = if self.nsrc == 1 {
            &["dst", "src"]
        } else {
            names
        };
        let mut operands = String::from("x24");
        for r in &["x20", "x21"][..self.nsrc] {
            operands += ", ";
            operands += r;
        }
        let mut s = self.shape.mask.asm();
        if let Some(k) = self.scalar {
            s += &format!(" movi x25, {k:#x}\n");
            operands += ", x25";
        }
        s += &format!(
            " {}.{} {operands}{}\n",
            self.op,
            self.ty.name(),
            self.shape.operands(names)
        );
        s
    }

    /// Runs the instruction on random operands of `kind` and checks every element of the
    /// destination region: enabled elements against `f`, the others unchanged.
    fn check(&self, lab: &mut Lab, kind: Kind, tol: Tol, f: impl Fn(&[u64], u64) -> u64) {
        let (ty, e, st) = (self.ty, self.ty.per_repeat(), self.shape.strides);
        let (pb, reps) = (e / 8, self.shape.repeats(e));
        let srcs: Vec<Vec<u64>> = (0..self.nsrc)
            .map(|k| lab.values(ty, kind, st[k + 1].slots(reps, pb)))
            .collect();
        let dst0 = lab.values(ty, kind, st[0].slots(reps, pb));
        let inputs: Vec<Vec<u8>> = srcs.iter().map(|v| pack(v, ty)).collect();
        let inputs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let body = self.asm();
        let got = unpack(&lab.sim.ub(&inputs, &pack(&dst0, ty), &body), ty);
        let mut want = dst0.clone();
        for (r, i) in self.shape.enabled(e) {
            let mut args: Vec<u64> = (0..self.nsrc)
                .map(|k| srcs[k][st[k + 1].at(r, i, pb)])
                .collect();
            if let Some(k) = self.scalar {
                args.push(k & ty.bits_mask()); // the scalar is the register's low bits
            }
            let d = st[0].at(r, i, pb);
            want[d] = f(&args, dst0[d]);
        }
        assert_elems(ty, tol, &got, &want, &body);
    }
}

/// Reference of the two-operand ops (`acc` is the old destination, for `vmla`).
fn bin_ref(op: &str, ty: Ty, a: u64, b: u64, acc: u64) -> u64 {
    match ty {
        Ty::F16 => {
            let (x, y) = (h(a), h(b));
            hr(match op {
                "vadd" | "vadds" => x + y,
                "vsub" => x - y,
                "vmul" | "vmuls" => x * y,
                "vdiv" => x / y,
                "vmax" | "vmaxs" => x.max(y),
                "vmin" | "vmins" => x.min(y),
                // Product and sum rounded in f32 (the product of two f16 values is exact).
                "vmla" => f64::from(x as f32 * y as f32 + h(acc) as f32),
                _ => unreachable!("{op}"),
            })
        }
        Ty::F32 => {
            let (x, y) = (s(a), s(b));
            sr(match op {
                "vadd" | "vadds" => x + y,
                "vsub" => x - y,
                "vmul" | "vmuls" => x * y,
                "vdiv" => x / y,
                "vmax" | "vmaxs" => x.max(y),
                "vmin" | "vmins" => x.min(y),
                "vmla" => x * y + s(acc),
                _ => unreachable!("{op}"),
            })
        }
        Ty::I32 => {
            let (x, y) = (int(a), int(b));
            ir(match op {
                "vadd" | "vadds" => x.wrapping_add(y),
                "vsub" => x.wrapping_sub(y),
                "vmul" | "vmuls" => x.wrapping_mul(y),
                "vmax" | "vmaxs" => x.max(y),
                "vmin" | "vmins" => x.min(y),
                "vand" => x & y,
                "vor" => x | y,
                _ => unreachable!("{op}"),
            })
        }
        Ty::I16 => match op {
            "vand" => a & b,
            "vor" => a | b,
            _ => unreachable!("{op}"),
        },
        Ty::U8 => unreachable!("u8 is a conversion source only"),
    }
}

/// Reference of the one-operand ops.
fn un_ref(op: &str, ty: Ty, a: u64) -> u64 {
    match ty {
        Ty::F16 => match op {
            "vabs" => a & 0x7fff,
            "vrelu" => {
                if h(a) > 0.0 {
                    a
                } else {
                    0
                }
            }
            "vexp" => hr(h(a).exp()),
            "vln" => hr(h(a).ln()),
            "vsqrt" => hr(h(a).sqrt()),
            "vrsqrt" => hr(1.0 / h(a).sqrt()),
            "vrec" => hr(1.0 / h(a)),
            "vmov" => a,
            _ => unreachable!("{op}"),
        },
        Ty::F32 => match op {
            "vabs" => a & 0x7fff_ffff,
            "vrelu" => {
                if s(a) > 0.0 {
                    a
                } else {
                    0
                }
            }
            "vexp" => sr(f64::from(s(a)).exp() as f32),
            "vln" => sr(f64::from(s(a)).ln() as f32),
            "vsqrt" => sr(s(a).sqrt()),
            "vrsqrt" => sr((1.0 / f64::from(s(a)).sqrt()) as f32),
            "vrec" => sr(1.0 / s(a)),
            "vmov" => a,
            _ => unreachable!("{op}"),
        },
        Ty::I32 => match op {
            "vabs" => ir(int(a).wrapping_abs()),
            "vrelu" => ir(int(a).max(0)),
            "vnot" => !a & 0xffff_ffff,
            "vmov" => a,
            _ => unreachable!("{op}"),
        },
        Ty::I16 => match op {
            "vnot" => !a & 0xffff,
            "vmov" => a,
            _ => unreachable!("{op}"),
        },
        Ty::U8 => unreachable!("u8 is a conversion source only"),
    }
}

/// Reference of any element-wise op by mnemonic.
fn ew_ref(op: &str, ty: Ty, a: &[u64], acc: u64) -> u64 {
    match a.len() {
        _ if op == "vdup" => a[0],
        1 => un_ref(op, ty, a[0]),
        _ => bin_ref(op, ty, a[0], a[1], acc),
    }
}

const ARITH: &[Ty] = &[Ty::F16, Ty::F32, Ty::I32];
const FLOATS: &[Ty] = &[Ty::F16, Ty::F32];
const BITWISE: &[Ty] = &[Ty::I16, Ty::I32];
const ALL: &[Ty] = &[Ty::F16, Ty::F32, Ty::I32, Ty::I16];

/// vadd, vsub, vmul, vdiv, vmax, vmin, vand, vor, vmla in every type of the table.
#[test]
fn vector_binary_ops_in_every_type() {
    let mut lab = Lab::new(0x5e_0001);
    let ops: [(&str, &[Ty]); 9] = [
        ("vadd", ARITH),
        ("vsub", ARITH),
        ("vmul", ARITH),
        ("vdiv", FLOATS),
        ("vmax", ARITH),
        ("vmin", ARITH),
        ("vand", BITWISE),
        ("vor", BITWISE),
        ("vmla", FLOATS),
    ];
    for (op, tys) in ops {
        for &ty in tys {
            // Infinities and NaN where IEEE fixes the result; max/min compare zeros by value.
            let (kind, tol) = match op {
                "vmax" | "vmin" => (Kind::NoNegZero, Tol::Ulps(0)),
                _ => (Kind::Ieee, Tol::Exact),
            };
            Ew::new(op, ty, 2).check(&mut lab, kind, tol, |a, acc| ew_ref(op, ty, a, acc));
        }
    }
}

/// vabs, vrelu, vexp, vln, vsqrt, vrsqrt, vrec, vnot, vmov in every type of the table.
#[test]
fn vector_unary_ops_in_every_type() {
    let mut lab = Lab::new(0x5e_0002);
    let ops: [(&str, &[Ty], Kind); 9] = [
        ("vabs", ARITH, Kind::Ieee),
        ("vrelu", ARITH, Kind::NoNegZero),
        ("vexp", FLOATS, Kind::ExpArg),
        ("vln", FLOATS, Kind::PosArg),
        ("vsqrt", FLOATS, Kind::PosArg),
        ("vrsqrt", FLOATS, Kind::PosArg),
        ("vrec", FLOATS, Kind::Ieee),
        ("vnot", BITWISE, Kind::Raw),
        ("vmov", ALL, Kind::Raw),
    ];
    for (op, tys, kind) in ops {
        for &ty in tys {
            let tol = match (op, ty) {
                ("vnot" | "vmov", _) => Tol::Bits,
                ("vrelu", _) => Tol::Ulps(0),
                // libm exp/ln and the twice-rounded 1/sqrt: within 1 ulp (2 for f32 rsqrt).
                ("vexp" | "vln", _) | ("vrsqrt", Ty::F16) => Tol::Ulps(1),
                ("vrsqrt", _) => Tol::Ulps(2),
                _ => Tol::Exact,
            };
            Ew::new(op, ty, 1).check(&mut lab, kind, tol, |a, acc| ew_ref(op, ty, a, acc));
        }
    }
}

/// vadds, vmuls, vmaxs, vmins: the scalar is the low bits of the register (the high bits here
/// are garbage and must be ignored).
#[test]
fn vector_scalar_ops_in_every_type() {
    let mut lab = Lab::new(0x5e_0003);
    let scalars: [(Ty, &[u64]); 3] = [
        (
            Ty::F16,
            &[
                0xdead_beef_0000_3e00,
                0x1234_5678_9abc_c880,
                0xffff_ffff_ffff_8000,
            ],
        ),
        (
            Ty::F32,
            &[0xdead_beef_3fc0_0000, 0x0000_0001_c2c8_0000, 0x7f7f_ffff],
        ),
        (
            Ty::I32,
            &[
                0xffff_ffff_8000_0000,
                0x1234_5678_0000_0007,
                0xffff_ffff_ffff_fffd,
            ],
        ),
    ];
    for op in ["vadds", "vmuls", "vmaxs", "vmins"] {
        let (kind, tol) = match op {
            "vmaxs" | "vmins" => (Kind::NoNegZero, Tol::Ulps(0)),
            _ => (Kind::Ieee, Tol::Exact),
        };
        for (ty, ks) in scalars {
            for &k in ks {
                Ew::new(op, ty, 1)
                    .scalar(k)
                    .check(&mut lab, kind, tol, |a, acc| ew_ref(op, ty, a, acc));
            }
        }
    }
}

/// vdup fills with the low bits of the register, in every type.
#[test]
fn vector_dup_in_every_type() {
    let mut lab = Lab::new(0x5e_0004);
    for (ty, k) in [
        (Ty::F16, 0xabcd_ef01_2345_c155u64),
        (Ty::F32, 0x8765_4321_7fc0_0001),
        (Ty::I32, 0xffff_ffff_8000_0001),
        (Ty::I16, 0x0000_0001_0000_fffe),
    ] {
        Ew::new("vdup", ty, 0)
            .scalar(k)
            .check(&mut lab, Kind::Raw, Tol::Bits, |a, _| a[0]);
    }
}

/// Non-default block and repeat strides and partial masks (normal mode with high and low bits,
/// counter mode with a partial last repeat that ignores the `repeat` field) on every element-wise
/// format.
#[test]
fn vector_strides_and_masks() {
    let mut lab = Lab::new(0x5e_0005);
    let lo_hi = Mask::Bits((0x0123_4567_89ab_cdefu128 << 64) | 0xfedc_ba98_7654_3211);
    let cases: Vec<(Ew, Kind, Tol)> = vec![
        // VBin: every operand strided differently, three repeats.
        (
            Ew::new("vadd", Ty::F32, 2).shape(shape(
                3,
                &[st(2, 20), st(3, 24), st(1, 9)],
                Mask::Full,
            )),
            Kind::Ieee,
            Tol::Exact,
        ),
        // VBin with a normal mask using both halves (f16 has 128 elements per repeat).
        (
            Ew::new("vmul", Ty::F16, 2).shape(shape(2, &[st(1, 10), st(2, 16), C], lo_hi)),
            Kind::Ieee,
            Tol::Exact,
        ),
        // Only the high half enabled.
        (
            Ew::new("vmax", Ty::F16, 2).shape(shape(2, &[], Mask::Bits(u128::MAX << 64))),
            Kind::NoNegZero,
            Tol::Ulps(0),
        ),
        // 64-element types use the low 64 bits of the mask only.
        (
            Ew::new("vsub", Ty::I32, 2).shape(shape(
                2,
                &[],
                Mask::Bits(0xffff_ffff_0000_0000_8000_0000_0000_0001),
            )),
            Kind::Finite,
            Tol::Exact,
        ),
        // Counter mode: 200 elements of 128 per repeat is two repeats, whatever `repeat` says.
        (
            Ew::new("vmla", Ty::F16, 2).shape(shape(1, &[], Mask::Count(200))),
            Kind::Finite,
            Tol::Exact,
        ),
        (
            Ew::new("vand", Ty::I16, 2).shape(shape(
                7,
                &[st(2, 16), C, st(1, 4)],
                Mask::Count(300),
            )),
            Kind::Raw,
            Tol::Bits,
        ),
        // VUn.
        (
            Ew::new("vabs", Ty::F16, 1).shape(shape(2, &[st(1, 16), st(2, 16)], lo_hi)),
            Kind::Ieee,
            Tol::Exact,
        ),
        (
            Ew::new("vsqrt", Ty::F32, 1).shape(shape(3, &[st(3, 24), st(1, 12)], Mask::Full)),
            Kind::PosArg,
            Tol::Exact,
        ),
        // VScalar.
        (
            Ew::new("vmuls", Ty::I32, 1)
                .scalar(0xffff_ffff_ffff_fff9)
                .shape(shape(7, &[st(3, 30), C], Mask::Count(100))),
            Kind::Finite,
            Tol::Exact,
        ),
        (
            Ew::new("vadds", Ty::F16, 1).scalar(0x4d00).shape(shape(
                2,
                &[st(2, 17)],
                Mask::Bits(0xffff_0000_ffff_0000_ffff_0000_ffff_0001),
            )),
            Kind::Ieee,
            Tol::Exact,
        ),
        // VDup.
        (
            Ew::new("vdup", Ty::I16, 0)
                .scalar(0x7777_a5a5)
                .shape(shape(2, &[st(2, 16)], lo_hi)),
            Kind::Raw,
            Tol::Bits,
        ),
        (
            Ew::new("vdup", Ty::F32, 0)
                .scalar(0x4049_0fdb)
                .shape(shape(9, &[], Mask::Count(70))),
            Kind::Raw,
            Tol::Bits,
        ),
    ];
    for (ew, kind, tol) in cases {
        let (op, ty) = (ew.op, ew.ty);
        ew.check(&mut lab, kind, tol, |a, acc| ew_ref(op, ty, a, acc));
    }
}

/// The mask register keeps its value across vector instructions until it is set again, and a
/// block starts with every element enabled.
#[test]
fn vector_mask_persists_until_changed() {
    let mut sim = Sim::new();
    let body = "
        movi x25, 7
        addi x26, x24, 256
        addi x27, x24, 512
        vdup.i32 x24, x25                 # full mask at block start: 64 elements
        movi x30, 10
        set_mask_count x30
        movi x25, 8
        vdup.i32 x24, x25                 # elements 0..10
        vdup.i32 x26, x25, repeat=4       # counter mode ignores repeat: elements 0..10
        movi x30, 0
        movi x31, 0x8000000000000005
        set_mask x30, x31
        movi x25, 9
        vdup.i32 x26, x25                 # elements 0, 2, 63
        vdup.i32 x27, x25                 # still elements 0, 2, 63
    ";
    let out = unpack(&sim.ub(&[], &[0xee; 1024], body), Ty::I32);
    let mut want = vec![0xeeee_eeeeu64; 256];
    for (i, w) in want.iter_mut().enumerate().take(64) {
        *w = if i < 10 { 8 } else { 7 };
    }
    for w in &mut want[64..74] {
        *w = 8;
    }
    for base in [64, 128] {
        for i in [0, 2, 63] {
            want[base + i] = 9;
        }
    }
    assert_elems(Ty::I32, Tol::Bits, &out, &want, body);
}

// ---- conversions -----------------------------------------------------------------------------

/// Reference of `vconv.<dst>.<src>` in a rounding mode.
fn conv_ref(dst: Ty, src: Ty, mode: Rnd, raw: u64) -> u64 {
    let x = match src {
        Ty::F16 => h(raw),
        Ty::F32 => f64::from(s(raw)),
        Ty::I32 => f64::from(int(raw)),
        Ty::U8 => raw as f64,
        Ty::I16 => unreachable!(),
    };
    match dst {
        // f16 -> f32 is exact; i32 -> f32 rounds to nearest even (Rust's `as`).
        Ty::F32 if src == Ty::I32 => sr(int(raw) as f32),
        Ty::F32 => sr(x as f32),
        Ty::F16 => u64::from(f16_round(x, mode)),
        Ty::I32 => {
            let r = mode.to_int(x);
            assert!(
                (-2_147_483_648.0..2_147_483_648.0).contains(&r),
                "test input {x} out of range"
            );
            ir(r as i32)
        }
        Ty::I16 | Ty::U8 => unreachable!(),
    }
}

impl Lab {
    /// Checks `vconv.<dst>.<src>` (in `mode`, or the default when None) on `specials` followed
    /// by values from `more`: every destination element, the disabled ones unchanged.
    fn conv(
        &mut self,
        (dst, src, mode): (Ty, Ty, Option<Rnd>),
        sh: Shape,
        specials: &[u64],
        mut more: impl FnMut(&mut Rng) -> u64,
    ) {
        // A repeat covers 256 bytes of the wider type; blocks hold 32 bytes of the wider type.
        let e = 256 / dst.size().max(src.size()) as u64;
        let (pb, reps, st) = (e / 8, sh.repeats(e), sh.strides);
        let mut it = specials.iter();
        let xs: Vec<u64> = (0..st[1].slots(reps, pb))
            .map(|_| it.next().copied().unwrap_or_else(|| more(&mut self.rng)))
            .collect();
        let d0 = self.raw(dst, st[0].slots(reps, pb));
        let round = mode.map_or(String::new(), |m| format!(", round={}", m.name()));
        let body = format!(
            "{} vconv.{}.{} x24, x20{}{round}\n",
            sh.mask.asm(),
            dst.name(),
            src.name(),
            sh.operands(&["dst", "src"])
        );
        let got = unpack(
            &self.sim.ub(&[&pack(&xs, src)], &pack(&d0, dst), &body),
            dst,
        );
        let mut want = d0.clone();
        for (r, i) in sh.enabled(e) {
            let x = xs[st[1].at(r, i, pb)];
            want[st[0].at(r, i, pb)] = conv_ref(dst, src, mode.unwrap_or(Rnd::Rint), x);
        }
        assert_elems(dst, Tol::Exact, &got, &want, &body);
    }
}

fn f32s(v: &[f32]) -> Vec<u64> {
    v.iter().map(|&x| sr(x)).collect()
}

fn f16s_of(v: &[f32]) -> Vec<u64> {
    v.iter()
        .map(|&x| u64::from(f16::from_f32(x).to_bits()))
        .collect()
}

/// An f32 with a random mantissa and a random exponent in [lo, hi], random sign.
fn f32_exp(rng: &mut Rng, lo: i32, hi: i32) -> u64 {
    let e = lo + (rng.next_u64() % (hi - lo + 1) as u64) as i32;
    let bits = (((e + 127) as u64) << 23) | (rng.next_u64() & 0x7f_ffff);
    bits | if rng.next_u64() & 1 == 1 {
        0x8000_0000
    } else {
        0
    }
}

/// An i32 of random magnitude (random bit length) and sign.
fn i32_any(rng: &mut Rng) -> u64 {
    let shift = rng.next_u64() % 32;
    ir((rng.next_u64() as i32) >> shift)
}

fn f16_any(rng: &mut Rng) -> u64 {
    finite_raw(Ty::F16, rng)
}

/// Every supported conversion pair; every rounding mode on the conversions that round
/// (f32 -> f16, f32 -> i32, f16 -> i32, i32 -> f16). f16 -> f32 is exact; i32 -> f32 is tested in
/// the default mode (round to nearest even) only.
#[test]
fn vector_conversions_every_pair_and_rounding_mode() {
    let mut lab = Lab::new(0x5e_0006);
    let t = 2f32.powi(-11);
    let f32_to_f16 = f32s(&[
        0.0,
        -0.0,
        1.0 + t,       // tie between 1 and 1 + 2^-10: even is 1
        1.0 + 3.0 * t, // tie: even is 1 + 2^-9
        -(1.0 + t),
        1.0 + t / 2.0,
        -(1.0 + 1.5 * t),
        65504.0,
        65519.996,
        65520.0, // tie between the largest f16 and 2^16: to nearest overflows
        70000.0,
        -70000.0,
        1e10,
        f32::MAX,
        2f32.powi(-25), // tie between 0 and the smallest subnormal
        -2f32.powi(-25),
        3.0 * 2f32.powi(-25),
        1e-10,
        -1e-10,
        5.960_464_5e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    let f32_to_i32 = f32s(&[
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        0.499_999_97,
        -0.0,
        3.7,
        -3.7,
        8_388_607.5,
        -8_388_607.5,
        2_147_483_520.0,
        -2_147_483_520.0,
        -2_147_483_648.0,
    ]);
    let f16_to_i32 = f16s_of(&[
        0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 65504.0, -65504.0, 1e-4, -1e-4, 1023.5, -1023.5, 0.0, -0.0,
    ]);
    let i32_specials: Vec<u64> = [
        0i32,
        1,
        -1,
        2049, // tie between 2048 and 2050
        -2049,
        2051,
        4097,
        4099,
        65504,
        65505,
        65519,
        65520, // tie between 65504 and 2^16
        65535,
        70000,
        -70000,
        16_777_217, // f32 tie
        16_777_219,
        -16_777_217,
        i32::MAX,
        i32::MIN,
    ]
    .iter()
    .map(|&x| ir(x))
    .collect();
    let (f16, f32, i32) = (Ty::F16, Ty::F32, Ty::I32);
    let f32_wide = |r: &mut Rng| f32_exp(r, -27, 16);
    for m in ROUNDS.map(Some) {
        lab.conv((f16, f32, m), PLAIN, &f32_to_f16, f32_wide);
        lab.conv((i32, f32, m), PLAIN, &f32_to_i32, |r| f32_exp(r, -3, 30));
        lab.conv((i32, f16, m), PLAIN, &f16_to_i32, f16_any);
        lab.conv((f16, i32, m), PLAIN, &i32_specials, i32_any);
    }
    lab.conv((f32, i32, None), PLAIN, &i32_specials, i32_any);
    let f16_specials = [
        0x0000, 0x8000, 0x0001, 0x83ff, 0x7bff, 0x7c00, 0xfc00, 0x7e00,
    ];
    lab.conv((f32, f16, None), PLAIN, &f16_specials, |r| {
        r.next_u64() & 0xffff
    });
    // Strides: a block is 32 bytes of the wider type and 16 bytes on the f16 side.
    let sh = shape(3, &[st(2, 20), st(3, 25)], Mask::Full);
    lab.conv((f32, f16, None), sh, &[], f16_any);
    let sh = shape(2, &[st(3, 24), st(1, 9)], Mask::Bits(0xf0f0_0000_ffff_0001));
    lab.conv((f16, f32, Some(Rnd::Floor)), sh, &f32_to_f16, f32_wide);
    // Image bytes to f16 (exact): every byte value, then strided and masked.
    let bytes: Vec<u64> = (0..=255).collect();
    lab.conv((f16, Ty::U8, None), PLAIN, &bytes, |r| r.next_u64() & 0xff);
    let sh = shape(2, &[st(1, 8), st(2, 16)], Mask::Bits(0xffff_0000_0f0f_f001));
    lab.conv((f16, Ty::U8, None), sh, &[], |r| r.next_u64() & 0xff);
    // Counter mode: 100 elements of 64 per repeat.
    let sh = shape(5, &[C, st(1, 4)], Mask::Count(100));
    lab.conv((i32, f16, Some(Rnd::Ceil)), sh, &f16_to_i32, f16_any);
}

// ---- compare and select ----------------------------------------------------------------------

const CMPS: [&str; 6] = ["eq", "ne", "lt", "le", "gt", "ge"];

fn cmp_ref(cmp: &str, ty: Ty, a: u64, b: u64) -> bool {
    let (x, y) = match ty {
        Ty::F16 => (h(a), h(b)),
        Ty::F32 => (f64::from(s(a)), f64::from(s(b))),
        _ => (f64::from(int(a)), f64::from(int(b))),
    };
    match cmp {
        "eq" => x == y,
        "ne" => x != y,
        "lt" => x < y,
        "le" => x <= y,
        "gt" => x > y,
        "ge" => x >= y,
        _ => unreachable!("{cmp}"),
    }
}

/// Bit `i` of a packed bit buffer, least significant bit first in each byte.
fn bit(bytes: &[u8], i: u64) -> bool {
    bytes[(i / 8) as usize] >> (i % 8) & 1 == 1
}

impl Lab {
    /// All six comparisons of `vcmp` (scalar None; strides src0, src1) or `vcmps` (strides src)
    /// in one kernel, each into its own 64-byte bit buffer. Bit `r * per_repeat + i` (least
    /// significant first in each byte) holds element i of repeat r; enabled elements are
    /// checked, and the bytes past the last bit must be untouched.
    fn cmp(&mut self, ty: Ty, scalar: Option<u64>, sh: Shape) {
        let e = ty.per_repeat();
        let (pb, reps, st) = (e / 8, sh.repeats(e), sh.strides);
        let mut a = self.values(ty, Kind::NoNan, st[0].slots(reps, pb));
        let mut b = self.values(ty, Kind::NoNan, st[1].slots(reps, pb));
        // Make a quarter of the compared pairs equal (some only as values: +0 and -0).
        for r in 0..reps {
            for i in 0..e {
                let (ia, ib) = (st[0].at(r, i, pb), st[1].at(r, i, pb));
                if self.rng.next_u64().is_multiple_of(4) {
                    match scalar {
                        Some(k) => a[ia] = k & ty.bits_mask(),
                        None => b[ib] = a[ia],
                    }
                }
            }
        }
        let mut body = sh.mask.asm();
        if let Some(k) = scalar {
            body += &format!(" movi x25, {k:#x}\n");
        }
        for (n, cmp) in CMPS.iter().enumerate() {
            body += &format!(" addi x26, x24, {}\n", 64 * n);
            body += &match scalar {
                None => format!(
                    " vcmp.{cmp}.{} x26, x20, x21{}\n",
                    ty.name(),
                    sh.operands(&["src0", "src1"])
                ),
                Some(_) => format!(
                    " vcmps.{cmp}.{} x26, x20, x25{}\n",
                    ty.name(),
                    sh.operands(&["src"])
                ),
            };
        }
        let init = self.raw(Ty::I16, 6 * 32);
        let init = pack(&init, Ty::I16);
        let out = self.sim.ub(&[&pack(&a, ty), &pack(&b, ty)], &init, &body);
        let used = (reps * e).div_ceil(8) as usize;
        for (n, cmp) in CMPS.iter().enumerate() {
            let (got, before) = (&out[n * 64..(n + 1) * 64], &init[n * 64..(n + 1) * 64]);
            for (r, i) in sh.enabled(e) {
                let x = a[st[0].at(r, i, pb)];
                let y = scalar.map_or_else(|| b[st[1].at(r, i, pb)], |k| k & ty.bits_mask());
                assert_eq!(
                    bit(got, r * e + i),
                    cmp_ref(cmp, ty, x, y),
                    "{cmp}.{}: repeat {r} element {i}: {x:#x} vs {y:#x}\n{body}",
                    ty.name()
                );
            }
            assert_eq!(
                &got[used..],
                &before[used..],
                "{cmp}: bytes past the bits\n{body}"
            );
        }
    }
}

/// vcmp and vcmps, every comparison in every type, bit-packed.
#[test]
fn vector_compares_every_comparison_and_type() {
    let mut lab = Lab::new(0x5e_0007);
    for &ty in ARITH {
        lab.cmp(ty, None, PLAIN);
    }
    let scalars = [
        (Ty::F16, 0xffff_0000_0000_c2c0u64), // -3.375 with garbage above
        (Ty::F16, 0x8000),                   // -0: equal to +0
        (Ty::F32, 0x1111_1111_4120_0000),
        (Ty::I32, 0xffff_ffff_ffff_fff0),
        (Ty::I32, 0x0000_0005_0000_0000), // low bits 0
    ];
    for (ty, k) in scalars {
        lab.cmp(ty, Some(k), PLAIN);
    }
    // Strides and partial masks.
    let bits = Mask::Bits(0x00ff_00ff_f0f0_f0f0_1234_5678_9abc_def1);
    lab.cmp(Ty::F16, None, shape(3, &[st(2, 16), st(1, 10)], bits));
    lab.cmp(Ty::I32, Some(0x7), shape(9, &[st(1, 12)], Mask::Count(150)));
    lab.cmp(Ty::F32, None, shape(1, &[C, st(3, 24)], Mask::Count(100)));
}

impl Lab {
    /// Checks vsel (strides dst, src0, src1): element (r, i) is src0 where bit r * per_repeat + i
    /// of the selection buffer is set, else src1; bit patterns (NaN payloads too) are copied.
    fn sel(&mut self, ty: Ty, sh: Shape) {
        let e = ty.per_repeat();
        let (pb, reps, st) = (e / 8, sh.repeats(e), sh.strides);
        let a = self.raw(ty, st[1].slots(reps, pb));
        let b = self.raw(ty, st[2].slots(reps, pb));
        let d0 = self.raw(ty, st[0].slots(reps, pb));
        let sel = pack(
            &self.raw(Ty::I16, (reps * e).div_ceil(16) as usize),
            Ty::I16,
        );
        let body = format!(
            "{} vsel.{} x24, x20, x21, x22{}\n",
            sh.mask.asm(),
            ty.name(),
            sh.operands(&["dst", "src0", "src1"])
        );
        let ins = [pack(&a, ty), pack(&b, ty), sel.clone()];
        let got = unpack(
            &self
                .sim
                .ub(&[&ins[0], &ins[1], &ins[2]], &pack(&d0, ty), &body),
            ty,
        );
        let mut want = d0.clone();
        for (r, i) in sh.enabled(e) {
            want[st[0].at(r, i, pb)] = if bit(&sel, r * e + i) {
                a[st[1].at(r, i, pb)]
            } else {
                b[st[2].at(r, i, pb)]
            };
        }
        assert_elems(ty, Tol::Bits, &got, &want, &body);
    }
}

impl Lab {
    /// Checks vgather: the enabled elements of each repeat (source repeat stride `src_rep`
    /// blocks) whose bit in pattern word `r * pat_rep` is set, packed at dst in order; the
    /// rest of dst is left as it was.
    fn gather(&mut self, ty: Ty, repeat: u64, src_rep: u64, pat_rep: u64, mask: Mask) {
        let e = ty.per_repeat();
        let pb = e / 8;
        let reps = mask.repeats(repeat, e);
        let src_stride = st(1, src_rep);
        let a = self.raw(ty, src_stride.slots(reps, pb).max(1));
        let words = if reps == 0 {
            1
        } else {
            (reps - 1) * pat_rep + 1
        };
        let pattern = pack(
            &self.raw(Ty::I16, (words * e).div_ceil(16) as usize),
            Ty::I16,
        );
        let d0 = self.raw(ty, (reps * e).max(1) as usize);
        let body = format!(
            "{} vgather.{} x24, x20, x21, repeat={repeat}, src_rep={src_rep}, pat_rep={pat_rep}\n",
            mask.asm(),
            ty.name(),
        );
        let got = unpack(
            &self
                .sim
                .ub(&[&pack(&a, ty), &pattern], &pack(&d0, ty), &body),
            ty,
        );
        let mut want = d0.clone();
        let mut k = 0;
        for r in 0..reps {
            for i in 0..e {
                if mask.on(r, i, e) && bit(&pattern, r * pat_rep * e + i) {
                    want[k] = a[src_stride.at(r, i, pb)];
                    k += 1;
                }
            }
        }
        assert_elems(ty, Tol::Bits, &got, &want, &body);
    }
}

/// vgather in every type: one pattern word reused, consecutive words, a strided source, both
/// mask modes.
#[test]
fn vector_gather_every_type() {
    let mut lab = Lab::new(0x5e_0010);
    for &ty in ALL {
        lab.gather(ty, 3, 8, 0, Mask::Full);
        lab.gather(ty, 2, 8, 1, Mask::Full);
    }
    lab.gather(Ty::F16, 3, 12, 1, Mask::Bits(u128::MAX >> 5));
    lab.gather(Ty::F32, 9, 8, 2, Mask::Count(300));
}

impl Lab {
    /// Checks vtranspose: repeat `r` reads 16 rows of 16 elements, `src_row` blocks apart from
    /// block `r · src_rep`, and writes element `j` of row `i` at element `i` of row `j`, rows
    /// `dst_row` blocks apart from block `r · dst_rep`; the mask does not apply.
    fn transpose(&mut self, ty: Ty, repeat: u64, rows: (u64, u64), reps: (u64, u64)) {
        let ((src_row, dst_row), (src_rep, dst_rep)) = (rows, reps);
        let span = |row: u64, rep: u64| ((repeat - 1) * rep + 15 * row + 1) as usize * 16;
        let a = self.raw(ty, span(src_row, src_rep));
        let d0 = self.raw(ty, span(dst_row, dst_rep));
        // A partial mask that must not matter.
        let body = format!(
            "movi x25, 0\n movi x26, 3\n set_mask x25, x26\n \
             vtranspose.{} x24, x20, repeat={repeat}, dst_row={dst_row}, src_row={src_row}, \
             dst_rep={dst_rep}, src_rep={src_rep}\n",
            ty.name(),
        );
        let got = unpack(&self.sim.ub(&[&pack(&a, ty)], &pack(&d0, ty), &body), ty);
        let mut want = d0.clone();
        for r in 0..repeat {
            for i in 0..16 {
                for j in 0..16 {
                    let src = ((r * src_rep + i * src_row) * 16 + j) as usize;
                    want[((r * dst_rep + j * dst_row) * 16 + i) as usize] = a[src];
                }
            }
        }
        assert_elems(ty, Tol::Bits, &got, &want, &body);
    }
}

/// vtranspose of both 2-byte types: contiguous blocks, an NCHW tile of 48-pixel rows into
/// NC1HWC0 units (source rows 3 blocks apart, one block a repeat) and back, and repeats whose
/// blocks interleave.
#[test]
fn vector_transpose_both_types() {
    let mut lab = Lab::new(0x5e_0011);
    for ty in [Ty::F16, Ty::I16] {
        lab.transpose(ty, 1, (1, 1), (16, 16));
        lab.transpose(ty, 3, (3, 16), (1, 16));
        lab.transpose(ty, 3, (1, 3), (16, 1));
    }
    lab.transpose(Ty::F16, 4, (2, 2), (1, 40));
}

/// vsel in every type, strided and masked.
#[test]
fn vector_select_every_type() {
    let mut lab = Lab::new(0x5e_0008);
    for &ty in ALL {
        lab.sel(ty, PLAIN);
    }
    let strides = [st(2, 20), st(1, 12), st(3, 24)];
    lab.sel(Ty::F16, shape(3, &strides, Mask::Bits(u128::MAX >> 3)));
    lab.sel(
        Ty::I32,
        shape(1, &[st(1, 9), C, st(2, 16)], Mask::Count(77)),
    );
}

/// vcmp feeds vsel (max by select), and `pipe_barrier ALL` lets the scalar unit read the vector
/// result from UB without a flag.
#[test]
fn compare_then_select_and_barrier_all() {
    let mut lab = Lab::new(0x5e_0009);
    let a = lab.values(Ty::F16, Kind::NoNegZero, 128);
    let b = lab.values(Ty::F16, Kind::NoNegZero, 128);
    let body = "
        movi x26, 0x30000
        vcmp.gt.f16 x26, x20, x21
        pipe_barrier V
        vsel.f16 x24, x20, x21, x26
        pipe_barrier ALL
        ld.ub.u16 x27, x24, off=254       # last element, read by the scalar unit
        addi x28, x24, 256
        st.ub.u64 x27, x28                # scalar store, then the harness's DMA out
    ";
    let ins = [pack(&a, Ty::F16), pack(&b, Ty::F16)];
    let out = unpack(&lab.sim.ub(&[&ins[0], &ins[1]], &[0; 288], body), Ty::F16);
    let want: Vec<u64> = (0..128)
        .map(|i| if h(a[i]) > h(b[i]) { a[i] } else { b[i] })
        .collect();
    assert_elems(Ty::F16, Tol::Bits, &out[..128], &want, body);
    assert_eq!(
        out[128], want[127],
        "scalar read of UB after pipe_barrier ALL"
    );
    assert_eq!(&out[129..132], &[0, 0, 0]);
}

// ---- reductions ------------------------------------------------------------------------------

impl Lab {
    /// Checks `vreduce.<op>.<ty>` (one result per repeat) or `vbreduce` (`per_block`: one per
    /// 32-byte block) with source strides `sh.strides[0]`: results `dst_rep` elements apart,
    /// the elements between them untouched.
    fn reduce(&mut self, (per_block, op, ty): (bool, &str, Ty), dst_rep: u64, sh: Shape) {
        let e = ty.per_repeat();
        let (pb, reps, src) = (e / 8, sh.repeats(e), sh.strides[0]);
        let kind = if op == "sum" {
            Kind::ExactSum
        } else {
            Kind::NoNegZero
        };
        let xs = self.values(ty, kind, src.slots(reps, pb));
        let groups = if per_block { 8 } else { 1 };
        let n = reps * groups;
        let d0 = self.raw(ty, ((n - 1) * dst_rep + 3) as usize);
        let mn = if per_block { "vbreduce" } else { "vreduce" };
        let body = format!(
            "{} {mn}.{op}.{} x24, x20{}, dst_rep={dst_rep}\n",
            sh.mask.asm(),
            ty.name(),
            sh.operands(&["src"])
        );
        let got = unpack(&self.sim.ub(&[&pack(&xs, ty)], &pack(&d0, ty), &body), ty);
        let mut want = d0.clone();
        let glen = e / groups;
        let num = |v: u64| match ty {
            Ty::F16 => h(v),
            Ty::F32 => f64::from(s(v)),
            _ => f64::from(int(v)),
        };
        for r in 0..reps {
            for g in 0..groups {
                let vals: Vec<u64> = (g * glen..(g + 1) * glen)
                    .filter(|&i| sh.mask.on(r, i, e))
                    .map(|i| xs[src.at(r, i, pb)])
                    .collect();
                assert!(!vals.is_empty(), "test bug: an empty reduction group");
                let res = match (op, ty) {
                    // Exact sums (see Kind::ExactSum), rounded once.
                    ("sum", Ty::F16) => hr(vals.iter().map(|&v| h(v)).sum()),
                    ("sum", Ty::F32) => sr(vals.iter().map(|&v| num(v)).sum::<f64>() as f32),
                    ("sum", _) => ir(vals.iter().fold(0i32, |acc, &v| acc.wrapping_add(int(v)))),
                    ("max", _) => *vals
                        .iter()
                        .max_by(|&&x, &&y| num(x).total_cmp(&num(y)))
                        .expect("non-empty"),
                    _ => *vals
                        .iter()
                        .min_by(|&&x, &&y| num(x).total_cmp(&num(y)))
                        .expect("non-empty"),
                };
                want[((r * groups + g) * dst_rep) as usize] = res;
            }
        }
        assert_elems(ty, Tol::Exact, &got, &want, &body);
    }
}

/// vreduce and vbreduce for sum, max and min in every type, with strides, gaps between results
/// and partial masks.
#[test]
fn vector_reductions_every_op_and_type() {
    let mut lab = Lab::new(0x5e_000a);
    for per_block in [false, true] {
        for op in ["sum", "max", "min"] {
            for &ty in ARITH {
                lab.reduce((per_block, op, ty), 1, shape(3, &[], Mask::Full));
            }
        }
        // Strided sources, results apart, normal and counter masks leaving no block empty.
        let m = Mask::Bits(0x0101_0101_0101_0101_8421_8421_8421_8421);
        lab.reduce((per_block, "sum", Ty::F16), 2, shape(2, &[st(2, 20)], m));
        lab.reduce((per_block, "max", Ty::F32), 3, shape(3, &[st(1, 10)], m));
        lab.reduce(
            (per_block, "min", Ty::I32),
            2,
            shape(1, &[], Mask::Count(124)),
        );
        lab.reduce(
            (per_block, "sum", Ty::I32),
            1,
            shape(2, &[st(3, 24)], Mask::Count(121)),
        );
    }
}

// ---- scalar unit -----------------------------------------------------------------------------

type Op2 = fn(u64, u64) -> u64;

fn div(a: u64, b: u64) -> u64 {
    let (a, b) = (a as i64, b as i64);
    if b == 0 {
        u64::MAX // x/0 = -1
    } else if a == i64::MIN && b == -1 {
        a as u64 // MIN/-1 = MIN
    } else {
        (a / b) as u64 // truncating, as RISC-V
    }
}

fn rem(a: u64, b: u64) -> u64 {
    let (a, b) = (a as i64, b as i64);
    if b == 0 {
        a as u64 // x%0 = x
    } else if a == i64::MIN && b == -1 {
        0
    } else {
        (a % b) as u64
    }
}

const RRR: [(&str, Op2); 20] = [
    ("add", |a, b| a.wrapping_add(b)),
    ("sub", |a, b| a.wrapping_sub(b)),
    ("mul", |a, b| a.wrapping_mul(b)),
    ("div", div),
    ("divu", |a, b| a.checked_div(b).unwrap_or(u64::MAX)),
    ("rem", rem),
    ("remu", |a, b| if b == 0 { a } else { a % b }),
    ("and", |a, b| a & b),
    ("or", |a, b| a | b),
    ("xor", |a, b| a ^ b),
    ("shl", |a, b| a << (b % 64)),
    ("shr", |a, b| a >> (b % 64)),
    ("sra", |a, b| ((a as i64) >> (b % 64)) as u64),
    ("min", |a, b| (a as i64).min(b as i64) as u64),
    ("max", |a, b| (a as i64).max(b as i64) as u64),
    ("minu", |a, b| a.min(b)),
    ("maxu", |a, b| a.max(b)),
    ("slt", |a, b| u64::from((a as i64) < (b as i64))),
    ("sltu", |a, b| u64::from(a < b)),
    ("seq", |a, b| u64::from(a == b)),
];

type Op1 = fn(u64) -> u64;
type Cond = fn(u64, u64) -> bool;

const RR: [(&str, Op1); 4] = [
    ("mov", |a| a),
    ("ctz", |a| u64::from(a.trailing_zeros())),
    ("clz", |a| u64::from(a.leading_zeros())),
    ("popc", |a| u64::from(a.count_ones())),
];

const BRANCHES: [(&str, Cond); 6] = [
    ("beq", |a, b| a == b),
    ("bne", |a, b| a != b),
    ("blt", |a, b| (a as i64) < (b as i64)),
    ("bge", |a, b| (a as i64) >= (b as i64)),
    ("bltu", |a, b| a < b),
    ("bgeu", |a, b| a >= b),
];

/// Every register-register ALU op, mov/ctz/clz/popc and every conditional branch (taken or
/// not), over edge pairs (division by zero, MIN / -1, shifts by 64 and more, signed versus
/// unsigned order, zero for ctz/clz) and random pairs. The kernel loops over the pairs in GM with
/// `loop`, so the loads, stores and loop are exercised too.
#[test]
fn scalar_register_ops_and_branches() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0010);
    let min = i64::MIN as u64;
    let neg = |x: i64| x as u64;
    let mut pairs: Vec<(u64, u64)> = vec![
        (7, 0),
        (neg(-7), 0),
        (0, 0),
        (min, neg(-1)),
        (min, 1),
        (min, 0),
        (neg(-7), 2),
        (7, neg(-2)),
        (neg(-7), neg(-2)),
        (u64::MAX, 1),
        (u64::MAX, u64::MAX),
        (0x8000_0000_0000_0001, 63),
        (neg(-1), 64),
        (0x1234_5678_9abc_def0, 65),
        (0x1234_5678_9abc_def0, 127),
        (neg(-1234), u64::MAX),
        (3, 3),
        (neg(-1), 1),
        (1, neg(-1)),
        (i64::MAX as u64, min),
        (0x0100, 0x0000_1000_0000_0000),
    ];
    for _ in 0..24 {
        let mut v = || {
            let x = rng.next_u64() >> (rng.next_u64() % 64);
            if rng.next_u64() & 1 == 1 {
                x.wrapping_neg()
            } else {
                x
            }
        };
        pairs.push((v(), v()));
    }
    let cols = RRR.len() + RR.len() + BRANCHES.len();
    let mut src = String::from(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         pair:\n ld.gm.u64 x5, x2\n ld.gm.u64 x6, x2, off=8\n",
    );
    let mut col = 0;
    let mut store = |src: &mut String| {
        *src += &format!(" st.gm.u64 x7, x3, off={}\n", 8 * col);
        col += 1;
    };
    for (op, _) in RRR {
        src += &format!(" {op} x7, x5, x6\n");
        store(&mut src);
    }
    for (op, _) in RR {
        src += &format!(" {op} x7, x5\n");
        store(&mut src);
    }
    for (op, _) in BRANCHES {
        src += &format!(" movi x7, 1\n {op} x5, x6, {op}_taken\n movi x7, 0\n{op}_taken:\n");
        store(&mut src);
    }
    src += &format!(
        " addi x2, x2, 16\n addi x3, x3, {}\n loop x4, pair\n end\n",
        8 * cols
    );
    let flat: Vec<u64> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    let pin = sim.put(&le_u64s(&flat));
    let out = sim.put(&vec![0; 8 * cols * pairs.len()]);
    sim.run(&src, 1, &[pin, out, pairs.len() as u64]);
    let got = sim.get_u64s(out, cols * pairs.len());
    for (p, &(a, b)) in pairs.iter().enumerate() {
        let row = &got[p * cols..(p + 1) * cols];
        let mut want: Vec<(&str, u64)> = RRR.iter().map(|&(op, f)| (op, f(a, b))).collect();
        want.extend(RR.iter().map(|&(op, f)| (op, f(a))));
        want.extend(BRANCHES.iter().map(|&(op, f)| (op, u64::from(f(a, b)))));
        for (c, (op, w)) in want.iter().enumerate() {
            assert_eq!(
                row[c], *w,
                "{op} a={a:#x} b={b:#x}: got {:#x}, want {w:#x}",
                row[c]
            );
        }
    }
}

type OpImm = fn(u64, i32) -> u64;

/// Sign-extended immediate.
fn sx(i: i32) -> u64 {
    i64::from(i) as u64
}

const RRI: [(&str, OpImm); 9] = [
    ("addi", |a, i| a.wrapping_add(sx(i))),
    ("muli", |a, i| a.wrapping_mul(sx(i))),
    ("andi", |a, i| a & sx(i)),
    ("ori", |a, i| a | sx(i)),
    ("xori", |a, i| a ^ sx(i)),
    ("shli", |a, i| a << (i & 63)),
    ("shri", |a, i| a >> (i & 63)),
    ("srai", |a, i| ((a as i64) >> (i & 63)) as u64),
    ("slti", |a, i| u64::from((a as i64) < i64::from(i))),
];

/// Every register-immediate op with immediates that are negative (sign extension), zero, at and
/// beyond 63 for shifts (masked), and the extremes of i32; then `movi` of 64-bit values.
#[test]
fn scalar_immediate_ops_and_movi() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0011);
    let imms: [i32; 13] = [
        0,
        1,
        -1,
        7,
        63,
        64,
        65,
        -64,
        -65,
        i32::MAX,
        i32::MIN,
        0x5555,
        -12345,
    ];
    let mut values: Vec<u64> = vec![
        0,
        1,
        u64::MAX,
        i64::MIN as u64,
        i64::MAX as u64,
        0x8000_0000,
        0xffff_ffff,
        0xffff_ffff_8000_0000,
        0x7fff_ffff,
    ];
    values.extend((0..8).map(|_| rng.next_u64() >> (rng.next_u64() % 64)));
    let mut src = String::from(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         next:\n ld.gm.u64 x5, x2\n",
    );
    let mut col = 0;
    for (op, _) in RRI {
        for imm in imms {
            src += &format!(" {op} x7, x5, {imm}\n st.gm.u64 x7, x3, off={}\n", 8 * col);
            col += 1;
        }
    }
    src += &format!(
        " addi x2, x2, 8\n addi x3, x3, {}\n loop x4, next\n",
        8 * col
    );
    // movi: any 64-bit value; the results go after the table above.
    let movis: [u64; 7] = [
        0,
        u64::MAX,
        i64::MIN as u64,
        i64::MAX as u64,
        0x1234_5678_9abc_def0,
        (-2_147_483_649i64) as u64,
        1 << 32,
    ];
    for (k, v) in movis.iter().enumerate() {
        src += &format!(" movi x7, {v:#x}\n st.gm.u64 x7, x3, off={}\n", 8 * k);
    }
    src += " movi x8, -5\n st.gm.u64 x8, x3, off=56\n end\n";
    let pin = sim.put(&le_u64s(&values));
    let out = sim.put(&vec![0; 8 * (col * values.len() + 8)]);
    sim.run(&src, 1, &[pin, out, values.len() as u64]);
    let got = sim.get_u64s(out, col * values.len() + 8);
    for (v, &a) in values.iter().enumerate() {
        let mut c = 0;
        for (op, f) in RRI {
            for imm in imms {
                let g = got[v * col + c];
                assert_eq!(g, f(a, imm), "{op} a={a:#x} imm={imm}: got {g:#x}");
                c += 1;
            }
        }
    }
    let tail = &got[col * values.len()..];
    assert_eq!(&tail[..7], &movis);
    assert_eq!(
        tail[7],
        (-5i64) as u64,
        "movi with a negative decimal immediate"
    );
}

/// jmp skips, `loop` runs its body `counter` times and leaves the counter at zero, a backward
/// conditional branch loops, `nop` changes nothing.
#[test]
fn scalar_control_flow() {
    let mut sim = Sim::new();
    let src = "
        sreg x1, args
        ld.gm.u64 x2, x1
        movi x3, 11
        jmp over
        movi x3, 22                 # skipped
    over:
        st.gm.u64 x3, x2
        movi x4, 5
        movi x5, 0
    body5:
        addi x5, x5, 3
        nop
        loop x4, body5
        st.gm.u64 x5, x2, off=8     # 15
        st.gm.u64 x4, x2, off=16    # 0
        movi x4, 1
        movi x5, 0
    body1:
        addi x5, x5, 1
        loop x4, body1
        st.gm.u64 x5, x2, off=24    # 1
        movi x6, 0
        movi x7, 4
    again:
        addi x6, x6, 1
        bne x6, x7, again           # taken three times
        st.gm.u64 x6, x2, off=32    # 4
        movi x8, -3
        movi x9, 2
        bltu x8, x9, wrong          # unsigned: -3 is huge, not taken
        blt x8, x9, right           # signed: taken
    wrong:
        movi x10, 0
        jmp done
    right:
        movi x10, 1
    done:
        st.gm.u64 x10, x2, off=40
        end
    ";
    let out = sim.put(&[0xff; 48]);
    sim.run(src, 1, &[out]);
    assert_eq!(sim.get_u64s(out, 6), [11, 15, 0, 1, 4, 1]);
}

/// block_idx, block_num, args and core_id over more blocks than cores (two waves), and the cycle
/// counter advancing.
#[test]
fn scalar_special_registers_over_several_blocks() {
    let mut sim = Sim::new();
    let blocks = 40u32;
    let src = "
        sreg x1, args
        ld.gm.u64 x2, x1
        sreg x3, block_idx
        sreg x4, block_num
        sreg x5, args
        sreg x6, core_id
        sreg x7, cycle
        nop
        nop
        sreg x8, cycle
        sub x8, x8, x7
        muli x9, x3, 40
        add x2, x2, x9
        st.gm.u64 x3, x2
        st.gm.u64 x4, x2, off=8
        st.gm.u64 x5, x2, off=16
        st.gm.u64 x6, x2, off=24
        st.gm.u64 x8, x2, off=32
        end
    ";
    let out = sim.put(&vec![0xff; 40 * blocks as usize]);
    sim.run(src, blocks, &[out]);
    let got = sim.get_u64s(out, 5 * blocks as usize);
    let args = got[2];
    assert_eq!(
        sim.get_u64s(args, 1),
        [out],
        "args points at the argument array"
    );
    let mut first_wave = Vec::new();
    for b in 0..blocks as usize {
        let rec = &got[5 * b..5 * b + 5];
        assert_eq!(rec[0], b as u64, "block_idx");
        assert_eq!(rec[1], u64::from(blocks), "block_num");
        assert_eq!(rec[2], args, "args is the same for every block");
        assert!(rec[3] < 32, "core_id {} of block {b}", rec[3]);
        assert!(rec[4] > 0 && rec[4] < 1000, "cycle advanced by {}", rec[4]);
        if b < 32 {
            first_wave.push(rec[3]);
        }
    }
    first_wave.sort_unstable();
    assert_eq!(
        first_wave,
        (0..32).collect::<Vec<u64>>(),
        "the first 32 blocks use 32 cores"
    );
}

const WIDTHS: [(&str, usize, bool); 7] = [
    ("u8", 1, false),
    ("i8", 1, true),
    ("u16", 2, false),
    ("i16", 2, true),
    ("u32", 4, false),
    ("i32", 4, true),
    ("u64", 8, false),
];

fn load_ref(mem: &[u8], off: usize, size: usize, signed: bool) -> u64 {
    let mut w = [0u8; 8];
    w[..size].copy_from_slice(&mem[off..off + size]);
    let raw = u64::from_le_bytes(w);
    if signed {
        let sh = 64 - 8 * size as u32;
        (((raw << sh) as i64) >> sh) as u64
    } else {
        raw
    }
}

/// ld and st of every width and signedness in GM, UB and L1: loads zero- or sign-extend (bytes
/// with the top bit set), stores write the low bytes only, offsets may be negative. UB and L1
/// are filled by DMA (MTE2 -> S flag), and the UB stores are read back by DMA (S -> MTE3 flag).
#[test]
fn scalar_loads_and_stores_every_width_and_space() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0012);
    for space in ["gm", "ub", "l1"] {
        let mut pattern: Vec<u8> = (0..64).map(|_| rng.next_u64() as u8).collect();
        for i in [1, 2, 5, 7, 8, 13, 15, 19, 23, 31] {
            pattern[i] |= 0x80;
        }
        let pat = sim.put(&pattern);
        let dump = sim.put(&[0; 64]);
        let out = sim.put(&[0; 8 * 64]);
        // x10 = base + 32, so the loads of the first half use negative offsets.
        let mut src = String::from(
            "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n",
        );
        src += &match space {
            "gm" => " addi x10, x2, 32\n".to_string(),
            "ub" => " movi x11, 0x100\n copy_gm_to_ub x11, x2, 1, 2\n set_flag MTE2, S, 0\n wait_flag MTE2, S, 0\n addi x10, x11, 32\n".into(),
            _ => " movi x11, 0x400\n copy_gm_to_l1 x11, x2, 1, 2\n set_flag MTE2, S, 0\n wait_flag MTE2, S, 0\n addi x10, x11, 32\n".into(),
        };
        let mut loads = Vec::new();
        for (w, size, signed) in WIDTHS {
            for off in [0, size, 3 * size, 8 * size.min(2), 32 - size, 24] {
                if off % size == 0 && off + size <= 32 {
                    src += &format!(
                        " ld.{space}.{w} x7, x10, off={}\n st.gm.u64 x7, x4, off={}\n",
                        off as i64 - 32,
                        8 * loads.len()
                    );
                    loads.push(load_ref(&pattern, off, size, signed));
                }
            }
        }
        // Stores into the second half, then read it back as u64s.
        src += " movi x7, 0x8899aabbccddeeff\n";
        let stores = [
            ("u8", 1),
            ("i8", 2),
            ("u16", 4),
            ("i16", 6),
            ("u32", 8),
            ("i32", 12),
            ("u64", 16),
        ];
        for (w, off) in stores {
            src += &format!(" st.{space}.{w} x7, x10, off={off}\n");
        }
        for k in 0..4 {
            src += &format!(
                " ld.{space}.u64 x8, x10, off={}\n st.gm.u64 x8, x4, off={}\n",
                8 * k,
                8 * (loads.len() + k)
            );
        }
        if space == "ub" {
            src += " set_flag S, MTE3, 0\n wait_flag S, MTE3, 0\n copy_ub_to_gm x3, x11, 1, 2\n";
        }
        src += " end\n";
        sim.run(&src, 1, &[pat, dump, out]);
        let got = sim.get_u64s(out, loads.len() + 4);
        assert_eq!(&got[..loads.len()], &loads[..], "{space} loads\n{src}");
        let mut want = pattern.clone();
        let v = 0x8899_aabb_ccdd_eeffu64.to_le_bytes();
        for (w, off) in stores {
            let size = WIDTHS.iter().find(|x| x.0 == w).unwrap().1;
            want[32 + off..32 + off + size].copy_from_slice(&v[..size]);
        }
        let back: Vec<u8> = got[loads.len()..]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        assert_eq!(back, want[32..], "{space} stores read back");
        match space {
            "gm" => assert_eq!(sim.get(pat, 64), want, "GM after the stores"),
            "ub" => assert_eq!(sim.get(dump, 64), want, "UB after the stores, by DMA"),
            _ => {}
        }
    }
}

// ---- DMA -------------------------------------------------------------------------------------

/// copy_gm_to_ub and copy_ub_to_gm with several bursts and gaps on both sides: the gaps keep
/// their bytes in UB and in GM, and GM bytes around the copy are untouched.
#[test]
fn dma_bursts_with_gaps() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0020);
    let data: Vec<u8> = (0..1024).map(|_| rng.next_u64() as u8).collect();
    let background: Vec<u8> = (0..1024).map(|_| rng.next_u64() as u8).collect();
    let (src, bg) = (sim.put(&data), sim.put(&background));
    let dump = sim.put(&[0; 1024]);
    let gm_out = sim.put(&[0x55; 1024]);
    let kernel = "
        sreg x1, args
        ld.gm.u64 x2, x1
        ld.gm.u64 x3, x1, off=8
        ld.gm.u64 x4, x1, off=16
        ld.gm.u64 x5, x1, off=24
        movi x10, 0x200
        copy_gm_to_ub x10, x3, 1, 32                            # background
        copy_gm_to_ub x10, x2, 3, 2, src_gap=1, dst_gap=2       # 64 B from 0, 96, 192 to 0, 128, 256
        set_flag MTE2, MTE3, 0
        wait_flag MTE2, MTE3, 0
        copy_ub_to_gm x4, x10, 1, 32
        addi x6, x5, 64
        copy_ub_to_gm x6, x10, 2, 3, src_gap=1, dst_gap=4       # 96 B from 0, 128 to 64, 288
        end
    ";
    sim.run(kernel, 1, &[src, bg, dump, gm_out]);
    let mut ub = background.clone();
    for b in 0..3 {
        ub[b * 128..b * 128 + 64].copy_from_slice(&data[b * 96..b * 96 + 64]);
    }
    assert_eq!(sim.get(dump, 1024), ub, "UB after the strided copy in");
    let mut gm = vec![0x55u8; 1024];
    for b in 0..2 {
        gm[64 + b * 224..64 + b * 224 + 96].copy_from_slice(&ub[b * 128..b * 128 + 96]);
    }
    assert_eq!(sim.get(gm_out, 1024), gm, "GM after the strided copy out");
}

/// The padded (byte-granular) copies: GM side exact bytes from unaligned addresses with byte
/// gaps, UB side each burst rounded up to 32 bytes with the padding zero-filled and the UB gaps
/// untouched; on the way out only the `len` bytes of each burst reach GM.
#[test]
fn dma_pad_copies() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0021);
    let data: Vec<u8> = (0..512).map(|_| rng.next_u64() as u8).collect();
    let (src, bg) = (sim.put(&data), sim.put(&[0xaa; 512]));
    let dump = sim.put(&[0; 512]);
    let gm_out = sim.put(&[0x55; 512]);
    let kernel = "
        sreg x1, args
        ld.gm.u64 x2, x1
        ld.gm.u64 x3, x1, off=8
        ld.gm.u64 x4, x1, off=16
        ld.gm.u64 x5, x1, off=24
        movi x10, 0x400
        copy_gm_to_ub x10, x3, 1, 16                                 # background 0xaa
        addi x6, x2, 3
        copy_gm_to_ub_pad x10, x6, 3, 50, src_gap=7, dst_gap=32      # GM 3, 60, 117 -> UB 0, 96, 192
        addi x11, x10, 320
        addi x6, x2, 200
        copy_gm_to_ub_pad x11, x6, 1, 33                             # -> UB 320, padded to 384
        addi x12, x10, 416
        addi x6, x2, 300
        copy_gm_to_ub_pad x12, x6, 2, 1, dst_gap=0                   # one byte each -> UB 416, 448
        set_flag MTE2, MTE3, 0
        wait_flag MTE2, MTE3, 0
        copy_ub_to_gm x4, x10, 1, 16
        addi x7, x5, 5
        copy_ub_to_gm_pad x7, x10, 3, 50, src_gap=32, dst_gap=5      # UB 0, 96, 192 -> GM 5, 60, 115
        addi x7, x5, 301
        copy_ub_to_gm_pad x7, x11, 1, 33                             # UB 320 -> GM 301..334
        end
    ";
    sim.run(kernel, 1, &[src, bg, dump, gm_out]);
    let mut ub = vec![0xaau8; 512];
    let mut burst = |ub_at: usize, gm_at: usize, len: usize| {
        ub[ub_at..ub_at + len].copy_from_slice(&data[gm_at..gm_at + len]);
        ub[ub_at + len..ub_at + len.div_ceil(32) * 32].fill(0);
    };
    for b in 0..3 {
        burst(b * 96, 3 + b * 57, 50);
    }
    burst(320, 200, 33);
    burst(416, 300, 1);
    burst(448, 301, 1);
    assert_eq!(sim.get(dump, 512), ub, "UB after the padded copies in");
    let mut gm = vec![0x55u8; 512];
    for b in 0..3 {
        gm[5 + b * 55..5 + b * 55 + 50].copy_from_slice(&ub[b * 96..b * 96 + 50]);
    }
    gm[301..334].copy_from_slice(&ub[320..353]);
    assert_eq!(sim.get(gm_out, 512), gm, "GM after the padded copies out");
}

/// Scalar loop reading `words` u64s of L1 from `l1` (register holding the address) into GM at
/// the address in `out`; uses x20..x23.
fn dump_l1(label: &str, l1: &str, words: usize, out: &str) -> String {
    format!(
        " mov x20, {l1}\n mov x21, {out}\n movi x22, {words}\n{label}:\n ld.l1.u64 x23, x20\n \
         st.gm.u64 x23, x21\n addi x20, x20, 8\n addi x21, x21, 8\n loop x22, {label}\n"
    )
}

/// copy_gm_to_l1 with bursts and gaps, read back with scalar L1 loads after an MTE2 -> S flag.
#[test]
fn dma_gm_to_l1_bursts_with_gaps() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0022);
    let data: Vec<u8> = (0..512).map(|_| rng.next_u64() as u8).collect();
    let background: Vec<u8> = (0..512).map(|_| rng.next_u64() as u8).collect();
    let (src, bg) = (sim.put(&data), sim.put(&background));
    let out = sim.put(&[0; 512]);
    let kernel = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         movi x10, 0x1000\n copy_gm_to_l1 x10, x3, 1, 16\n\
         copy_gm_to_l1 x10, x2, 2, 3, src_gap=2, dst_gap=1\n\
         addi x11, x10, 320\n addi x12, x2, 400\n copy_gm_to_l1 x11, x12, 1, 1\n\
         set_flag MTE2, S, 0\n wait_flag MTE2, S, 0\n{}end\n",
        dump_l1("rd", "x10", 64, "x4")
    );
    sim.run(&kernel, 1, &[src, bg, out]);
    let mut want = background.clone();
    for b in 0..2 {
        want[b * 128..b * 128 + 96].copy_from_slice(&data[b * 160..b * 160 + 96]);
    }
    want[320..352].copy_from_slice(&data[400..432]);
    assert_eq!(sim.get(out, 512), want);
}

/// copy_gm_to_l1_nd2nz of row-major f16 matrices whose rows and columns are not multiples of 16,
/// with a source row stride: fractal (rb, cb) lands at (cb * dst_rows / 16 + rb) * 512 and the
/// padding inside the fractals is zero.
#[test]
fn dma_nd2nz_pads_partial_fractals_with_zeros() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0023);
    for (rows, cols, stride, dst_rows) in [
        (20usize, 40usize, 50usize, 32usize),
        (5, 7, 9, 16),
        (33, 16, 16, 48),
    ] {
        let a = rng.f16s(rows * stride, -4.0, 4.0);
        let pa = sim.put(&f16_bytes(&a));
        let col_blocks = cols.div_ceil(16);
        let bytes = col_blocks * dst_rows * 32;
        let bg = sim.put(&vec![0xaa; bytes]);
        let out = sim.put(&vec![0; bytes]);
        let kernel = format!(
            "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
             movi x10, 0x2000\n copy_gm_to_l1 x10, x3, 1, {}\n\
             copy_gm_to_l1_nd2nz x10, x2, {rows}, {cols}, {stride}, {dst_rows}\n\
             set_flag MTE2, S, 0\n wait_flag MTE2, S, 0\n{}end\n",
            bytes / 32,
            dump_l1("rd", "x10", bytes / 8, "x4")
        );
        sim.run(&kernel, 1, &[pa, bg, out]);
        let got = f16_from_bytes(&sim.get(out, bytes));
        let rows16 = rows.div_ceil(16) * 16;
        for cb in 0..col_blocks {
            for r in 0..rows16 {
                for c in 0..16 {
                    let (col, at) = (cb * 16 + c, (cb * dst_rows + r) * 16 + c);
                    let want = if r < rows && col < cols {
                        a[r * stride + col]
                    } else {
                        f16::ZERO
                    };
                    assert_eq!(
                        got[at].to_bits(),
                        want.to_bits(),
                        "{rows}x{cols}: row {r} col {col} (fractal {}, {cb})",
                        r / 16
                    );
                }
            }
        }
    }
}

// ---- cube ------------------------------------------------------------------------------------

/// A 16x16 f16 identity fractal.
fn identity() -> Vec<u8> {
    let mut v = vec![f16::ZERO; 256];
    for i in 0..16 {
        v[i * 17] = f16::ONE;
    }
    f16_bytes(&v)
}

/// Kernel tail: multiplies `nfrac` L0A fractals (at L0A 0, read as a 16*nfrac x 16 matrix) by the
/// identity in L0B (at L0B 0x8000), or the identity in L0A (at 0x8000) by `nfrac` L0B fractals
/// (a 16 x 16*nfrac matrix), so that L0C holds the fractals exactly as f32; then moves them
/// through UB to GM at x3 (fractal i at i * 1 KiB). Expects the operands loaded (MTE1 done).
fn read_out_through_cube(nfrac: usize, l0b: bool) -> String {
    let (m, n, a, b) = if l0b {
        (16, 16 * nfrac, "x27", "x26")
    } else {
        (16 * nfrac, 16, "x26", "x27")
    };
    format!(
        " set_flag MTE1, M, 0\n wait_flag MTE1, M, 0\n movi x26, 0\n movi x27, 0x8000\n\
         mmad x26, {a}, {b}, {m}, 16, {n}, init=true\n set_flag M, V, 0\n wait_flag M, V, 0\n\
         copy_l0c_to_ub.f32 x26, x26, {nfrac}\n set_flag V, MTE3, 0\n wait_flag V, MTE3, 0\n\
         copy_ub_to_gm x3, x26, 1, {}\n end\n",
        nfrac * 32
    )
}

/// Fractals as f32 values in row-major order within each fractal.
fn fractals_f32(b: &[u8]) -> Vec<f32> {
    f32_from_bytes(b)
}

fn transpose_fractal(f: &[f16]) -> Vec<f16> {
    (0..256).map(|i| f[(i % 16) * 16 + i / 16]).collect()
}

/// load_l0a and load_l0b with source and destination strides and transpose: the destination
/// slots not written keep an earlier load's contents. L0A / L0B are read back exactly through
/// an identity matrix multiply.
#[test]
fn cube_load2d_strides_and_transpose() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0030);
    let fr = rng.f16s(6 * 256, -8.0, 8.0);
    let bg = rng.f16s(9 * 256, -8.0, 8.0);
    let (pf, pbg, pid) = (
        sim.put(&f16_bytes(&fr)),
        sim.put(&f16_bytes(&bg)),
        sim.put(&identity()),
    );
    for to_l0b in [false, true] {
        let out = sim.put(&vec![0; 9 * 1024]);
        let (dst, id_load) = if to_l0b {
            ("load_l0b", "load_l0a x27, x12, 1")
        } else {
            ("load_l0a", "load_l0b x27, x12, 1")
        };
        let kernel = format!(
            "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
             ld.gm.u64 x5, x1, off=24\n\
             movi x10, 0\n movi x11, 0x4000\n movi x12, 0x8000\n\
             copy_gm_to_l1 x10, x2, 1, 96\n copy_gm_to_l1 x11, x4, 1, 144\n copy_gm_to_l1 x12, x5, 1, 16\n\
             set_flag MTE2, MTE1, 0\n wait_flag MTE2, MTE1, 0\n\
             movi x26, 0\n movi x27, 0x8000\n\
             {dst} x26, x11, 9                                            # background\n\
             {dst} x26, x10, 3, src_stride=2, dst_stride=3               # F0 F2 F4 -> 0 3 6\n\
             movi x13, 512\n movi x14, 512\n\
             {dst} x14, x13, 2, src_stride=2, dst_stride=3, transpose=true # F1 F3 -> 1 4\n\
             {id_load}\n{}",
            read_out_through_cube(9, to_l0b)
        );
        sim.run(&kernel, 1, &[pf, out, pbg, pid]);
        let got = fractals_f32(&sim.get(out, 9 * 1024));
        let f = |k: usize| fr[k * 256..(k + 1) * 256].to_vec();
        let mut want: Vec<Vec<f16>> = (0..9)
            .map(|k| bg[k * 256..(k + 1) * 256].to_vec())
            .collect();
        want[0] = f(0);
        want[3] = f(2);
        want[6] = f(4);
        want[1] = transpose_fractal(&f(1));
        want[4] = transpose_fractal(&f(3));
        for (k, w) in want.iter().enumerate() {
            for i in 0..256 {
                assert_eq!(
                    got[k * 256 + i],
                    w[i].to_f32(),
                    "{dst}: slot {k} element {i}"
                );
            }
        }
    }
}

/// img2col_l0a against a direct im2col of an NC1HWC0 feature map (K order c1, kh, kw, c0) with
/// asymmetric padding, stride and dilation, from the first fractal and from an offset
/// (m_start, k_start) window; pixels past the output size read as zero.
#[test]
fn cube_img2col_matches_direct_im2col() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0031);
    let (c1, h, w) = (2usize, 5usize, 6usize);
    let (kh, kw, sh, sw, dh, dw) = (3usize, 2usize, 2usize, 1usize, 1usize, 2usize);
    let (pt, pb, pl, pr) = (1usize, 1usize, 2usize, 0usize);
    let fm = rng.f16s(c1 * h * w * 16, -4.0, 4.0);
    let ho = (h + pt + pb - (dh * (kh - 1) + 1)) / sh + 1;
    let wo = (w + pl + pr - (dw * (kw - 1) + 1)) / sw + 1;
    let kfracs = c1 * kh * kw;
    // Direct im2col: row p = output pixel, column (kb, c0) with kb = (c1 * kh + i) * kw + j.
    let im2col = |p: usize, kb: usize, c0: usize| -> f16 {
        if p >= ho * wo {
            return f16::ZERO;
        }
        let (oh, ow) = (p / wo, p % wo);
        let (ci, i, j) = (kb / (kh * kw), kb / kw % kh, kb % kw);
        let ih = (oh * sh + i * dh) as isize - pt as isize;
        let iw = (ow * sw + j * dw) as isize - pl as isize;
        if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
            f16::ZERO
        } else {
            fm[((ci * h + ih as usize) * w + iw as usize) * 16 + c0]
        }
    };
    let mfrac = (ho * wo).div_ceil(16);
    let nfrac = mfrac * kfracs + 4;
    let (pfm, pid) = (sim.put(&f16_bytes(&fm)), sim.put(&identity()));
    let out = sim.put(&vec![0; nfrac * 1024]);
    let kernel = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x5, x1, off=16\n\
         movi x10, 0\n movi x12, 0x8000\n\
         copy_gm_to_l1 x10, x2, 1, {}\n copy_gm_to_l1 x12, x5, 1, 16\n\
         set_flag MTE2, MTE1, 0\n wait_flag MTE2, MTE1, 0\n\
         set_fmatrix {h}, {w}, pad_top={pt}, pad_bottom={pb}, pad_left={pl}, pad_right={pr}\n\
         movi x26, 0\n movi x27, 0x8000\n\
         img2col_l0a x26, x10, {c1}, {kh}, {kw}, 0, 0, {mfrac}, {kfracs}, stride_h={sh}, stride_w={sw}, dil_h={dh}, dil_w={dw}\n\
         movi x13, {}\n\
         img2col_l0a x13, x10, {c1}, {kh}, {kw}, 1, 5, 1, 4, stride_h={sh}, stride_w={sw}, dil_h={dh}, dil_w={dw}\n\
         load_l0b x27, x12, 1\n{}",
        fm.len() * 2 / 32,
        mfrac * kfracs * 512,
        read_out_through_cube(nfrac, false)
    );
    sim.run(&kernel, 1, &[pfm, out, pid]);
    let got = fractals_f32(&sim.get(out, nfrac * 1024));
    // Fractal (mi, ki) of a window (m_start, k_start, kfrac) sits at mi * kfrac + ki.
    let check = |first: usize, m_start: usize, k_start: usize, mf: usize, kf: usize| {
        for mi in 0..mf {
            for ki in 0..kf {
                let at = (first + mi * kf + ki) * 256;
                for r in 0..16 {
                    for c0 in 0..16 {
                        let want = im2col((m_start + mi) * 16 + r, k_start + ki, c0);
                        assert_eq!(
                            got[at + r * 16 + c0],
                            want.to_f32(),
                            "window at m {m_start} k {k_start}: fractal ({mi}, {ki}) row {r} c0 {c0}"
                        );
                    }
                }
            }
        }
    };
    check(0, 0, 0, mfrac, kfracs);
    check(mfrac * kfracs, 1, 5, 1, 4);
}

/// load_image_l1 brings a cropped band of an RGB888 image through the AIPP unit (channels
/// swapped, mean / min / variance per channel) into L1 as C04, and img2col_l0a with `c04`
/// packs four taps of four channels into each K fractal: both against a direct computation
/// (the AIPP arithmetic of `gearsim_isa::aipp`, then the im2col with K order tap, channel).
#[test]
fn aipp_load_image_and_c04_img2col_match_direct_im2col() {
    use gearsim_isa::aipp::AippConfig;
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0035);
    let (hs, ws, pixel) = (7usize, 9usize, 3usize);
    let (h0, w0, h, w) = (1usize, 2usize, 5usize, 6usize);
    let image: Vec<u8> = (0..hs * ws * pixel).map(|_| rng.next_u64() as u8).collect();
    let conf = AippConfig {
        channels: 3,
        first_byte: 0,
        swap: true,
        csc: None,
        mean: [104.0, 117.0, 123.0, 0.0],
        min: [0.5, 0.0, 1.0, 0.0],
        var_reci: [0.017, 0.0175, 0.0171, 0.0],
    };
    let (kh, kw, sh, sw) = (3usize, 3usize, 2usize, 1usize);
    let (pt, pb, pl, pr) = (1usize, 1usize, 1usize, 1usize);
    let ho = (h + pt + pb - kh) / sh + 1;
    let wo = (w + pl + pr - kw) / sw + 1;
    let kfracs = (kh * kw * 4).div_ceil(16);
    let c04 = |ih: usize, iw: usize, c: usize| -> f16 {
        let at = ((h0 + ih) * ws + w0 + iw) * pixel;
        f16::from_bits(conf.pixel_c04(&image[at..at + pixel])[c])
    };
    // Column `kb * 16 + e` of row p: tap (kb * 16 + e) / 4, channel e % 4.
    let im2col = |p: usize, kb: usize, e: usize| -> f16 {
        let tap = kb * 4 + e / 4;
        if p >= ho * wo || tap >= kh * kw {
            return f16::ZERO;
        }
        let (oh, ow) = (p / wo, p % wo);
        let (i, j) = (tap / kw, tap % kw);
        let ih = (oh * sh + i) as isize - pt as isize;
        let iw = (ow * sw + j) as isize - pl as isize;
        if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
            f16::ZERO
        } else {
            c04(ih as usize, iw as usize, e % 4)
        }
    };
    let mfrac = (ho * wo).div_ceil(16);
    let nfrac = mfrac * kfracs;
    let (pimg, pid) = (sim.put(&image), sim.put(&identity()));
    let pcfg = sim.put(&conf.to_bytes());
    let out = sim.put(&vec![0; nfrac * 1024]);
    let kernel = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x5, x1, off=16\n\
         ld.gm.u64 x6, x1, off=24\n\
         movi x10, 0\n movi x12, 0x8000\n movi x7, {}\n add x7, x2, x7\n\
         load_image_l1 x10, x7, x6, {h}, {w}, {pixel}, {}, c04=true\n copy_gm_to_l1 x12, x5, 1, 16\n\
         set_flag MTE2, MTE1, 0\n wait_flag MTE2, MTE1, 0\n\
         set_fmatrix {h}, {w}, pad_top={pt}, pad_bottom={pb}, pad_left={pl}, pad_right={pr}\n\
         movi x26, 0\n movi x27, 0x8000\n\
         img2col_l0a x26, x10, 1, {kh}, {kw}, 0, 0, {mfrac}, {kfracs}, stride_h={sh}, stride_w={sw}, c04=true\n\
         load_l0b x27, x12, 1\n{}",
        (h0 * ws + w0) * pixel,
        ws * pixel,
        read_out_through_cube(nfrac, false)
    );
    sim.run(&kernel, 1, &[pimg, out, pid, pcfg]);
    let got = fractals_f32(&sim.get(out, nfrac * 1024));
    for mi in 0..mfrac {
        for ki in 0..kfracs {
            let at = (mi * kfracs + ki) * 256;
            for r in 0..16 {
                for e in 0..16 {
                    let want = im2col(mi * 16 + r, ki, e);
                    assert_eq!(
                        got[at + r * 16 + e],
                        want.to_f32(),
                        "fractal ({mi}, {ki}) row {r} column {e}"
                    );
                }
            }
        }
    }
}

/// Row-major f16 matrix of `rows x cols` values in [-2, 2).
fn matrix(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f16> {
    rng.f16s(rows * cols, -2.0, 2.0)
}

/// C = init + A x B in f32, products exact, summed in ascending k order.
fn matmul(init: &[f32], a: &[f16], b: &[f16], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = init.to_vec();
    for i in 0..m {
        for j in 0..n {
            let mut acc = c[i * n + j];
            for kk in 0..k {
                acc += a[i * k + kk].to_f32() * b[kk * n + j].to_f32();
            }
            c[i * n + j] = acc;
        }
    }
    c
}

const M: usize = 20;
const K: usize = 40;
const N: usize = 24;

/// The loads shared by the mmad tests: A (M x K) and B, B2 (K x N) from row-major GM at x2, x3,
/// x4 through nd2nz (zero padding) into L1, then into L0A (zZ: row block by row block, L1
/// fractal (mb, kb) at (kb * 2 + mb) * 512) at 0 and L0B at 0 (B) and 0x1000 (B2).
const MMAD_LOADS: &str = "
    movi x10, 0
    movi x11, 0x4000
    movi x12, 0x8000
    copy_gm_to_l1_nd2nz x10, x2, 20, 40, 40, 32
    copy_gm_to_l1_nd2nz x11, x3, 40, 24, 24, 48
    copy_gm_to_l1_nd2nz x12, x4, 40, 24, 24, 48
    set_flag MTE2, MTE1, 0
    wait_flag MTE2, MTE1, 0
    movi x13, 0
    load_l0a x13, x10, 3, src_stride=2
    movi x13, 1536
    addi x14, x10, 512
    load_l0a x13, x14, 3, src_stride=2
    movi x15, 0
    load_l0b x15, x11, 6
    movi x16, 0x1000
    load_l0b x16, x12, 6
    set_flag MTE1, M, 0
    wait_flag MTE1, M, 0
    movi x13, 0
    movi x17, 0
";

/// Element (i, j) of an M x N matrix in L0C's NZ order: fractal (i/16, j/16) at
/// (j/16) * MB + i/16, row-major inside; MB = 2 here.
fn nz(i: usize, j: usize) -> usize {
    ((j / 16) * 2 + i / 16) * 256 + (i % 16) * 16 + j % 16
}

/// mmad with init and then accumulating, with m, k, n not multiples of 16 (20 x 40 x 24), moved
/// out with copy_l0c_to_ub in f32 (plain and relu) and f16 (relu, with source and destination
/// gaps); the padding rows and columns of C are zero.
#[test]
fn cube_mmad_init_accumulate_and_l0c_to_ub() {
    let mut sim = Sim::new();
    let mut rng = Rng::new(0x5e_0032);
    let (a, b, b2) = (
        matrix(&mut rng, M, K),
        matrix(&mut rng, K, N),
        matrix(&mut rng, K, N),
    );
    let garbage: Vec<u8> = (0..2048).map(|_| rng.next_u64() as u8).collect();
    let ins = [&a, &b, &b2].map(|x| sim.put(&f16_bytes(x)));
    let pg = sim.put(&garbage);
    let out = sim.put(&vec![0; 4 * 4096 + 2048]);
    let kernel = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         ld.gm.u64 x5, x1, off=24\n ld.gm.u64 x6, x1, off=32\n\
         movi x21, 0x3000\n copy_gm_to_ub x21, x6, 1, 64              # garbage under the f16 copy\n\
         {MMAD_LOADS}\
         mmad x17, x13, x15, 20, 40, 24, init=true\n\
         set_flag M, V, 0\n wait_flag M, V, 0\n\
         movi x20, 0\n copy_l0c_to_ub.f32 x20, x17, 4\n\
         set_flag V, M, 0\n wait_flag V, M, 0\n\
         mmad x17, x13, x16, 20, 40, 24                              # accumulate A x B2\n\
         set_flag M, V, 1\n wait_flag M, V, 1\n\
         movi x22, 0x1000\n copy_l0c_to_ub.f32 x22, x17, 4\n\
         movi x23, 0x2000\n copy_l0c_to_ub.f32 x23, x17, 4, relu=true\n\
         copy_l0c_to_ub.f16 x21, x17, 2, src_gap=1, dst_gap=1, relu=true\n\
         set_flag V, MTE3, 0\n wait_flag V, MTE3, 0\n\
         copy_ub_to_gm x5, x20, 1, {}\n end\n",
        (3 * 4096 + 2048) / 32
    );
    sim.run(&kernel, 1, &[ins[0], ins[1], ins[2], out, pg]);
    let got = sim.get(out, 3 * 4096 + 2048);
    let c1 = matmul(&vec![0.0; M * N], &a, &b, M, K, N);
    let c2 = matmul(&c1, &a, &b2, M, K, N);
    let (g1, g2, g3) = (
        fractals_f32(&got[..4096]),
        fractals_f32(&got[4096..8192]),
        fractals_f32(&got[8192..12288]),
    );
    let g4 = f16_from_bytes(&got[12288..]);
    for i in 0..32 {
        for j in 0..32 {
            let (w1, w2) = if i < M && j < N {
                (c1[i * N + j], c2[i * N + j])
            } else {
                (0.0, 0.0)
            };
            let at = nz(i, j);
            assert_eq!(g1[at], w1, "init: C[{i}][{j}]");
            assert_eq!(g2[at], w2, "accumulate: C[{i}][{j}]");
            assert_eq!(g3[at], w2.max(0.0), "f32 relu: C[{i}][{j}]");
            // f16 copy of fractals 0 and 2 (src_gap 1) to UB fractal slots 0 and 2 (dst_gap 1).
            let f = at / 256;
            if f.is_multiple_of(2) {
                let slot = f * 256 + at % 256;
                assert_eq!(
                    u64::from(g4[slot].to_bits()),
                    hr(f64::from(w2.max(0.0))),
                    "f16 relu: C[{i}][{j}]"
                );
            }
        }
    }
    for slot in [1, 3] {
        let range = slot * 512..(slot + 1) * 512;
        assert_eq!(
            &got[12288..][range.clone()],
            &garbage[range],
            "UB gap slot {slot} untouched"
        );
    }
}

/// broadcast_ub_to_l0c fills L0C with a bias row per channel block (two blocks, two fractals
/// each), and an mmad without init accumulates onto it: C = bias + A x B, in that order.
#[test]
fn cube_bias_broadcast_then_accumulate() {
    bias_then_accumulate(false);
}

/// broadcast_l1_to_l0c (a separated chip's bias through L1 and the bias table) fills L0C
/// exactly as broadcast_ub_to_l0c does from UB.
#[test]
fn cube_bias_from_l1_then_accumulate() {
    bias_then_accumulate(true);
}

fn bias_then_accumulate(from_l1: bool) {
    // The coupled preset has no bias table; this one gets the 910B's 1 KiB for the L1 path.
    let mut cfg = ChipConfig::preset("ascend910").expect("the ascend910 preset");
    cfg.core.bt_bytes = 1024;
    let mut sim = Sim::with(cfg);
    let mut rng = Rng::new(0x5e_0033);
    let (a, b) = (matrix(&mut rng, M, K), matrix(&mut rng, K, N));
    let bias: Vec<f32> = (0..32).map(|j| j as f32 * 0.375 - 5.0).collect();
    let bias_bytes: Vec<u8> = bias.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ins = [&a, &b, &b].map(|x| sim.put(&f16_bytes(x)));
    let pb = sim.put(&bias_bytes);
    let out = sim.put(&vec![0; 4096]);
    let fill = if from_l1 {
        "movi x20, 0xc000\n copy_gm_to_l1 x20, x6, 1, 4\n\
         set_flag MTE2, MTE1, 1\n wait_flag MTE2, MTE1, 1\n\
         broadcast_l1_to_l0c x17, x20, 2, 2\n\
         set_flag MTE1, M, 1\n wait_flag MTE1, M, 1\n"
    } else {
        "movi x20, 0x2000\n copy_gm_to_ub x20, x6, 1, 4\n\
         set_flag MTE2, V, 0\n wait_flag MTE2, V, 0\n\
         broadcast_ub_to_l0c x17, x20, 2, 2\n\
         set_flag V, M, 0\n wait_flag V, M, 0\n"
    };
    let kernel = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         ld.gm.u64 x5, x1, off=24\n ld.gm.u64 x6, x1, off=32\n\
         {MMAD_LOADS}\
         {fill}\
         mmad x17, x13, x15, 20, 40, 24\n\
         set_flag M, V, 0\n wait_flag M, V, 0\n\
         movi x21, 0\n copy_l0c_to_ub.f32 x21, x17, 4\n\
         set_flag V, MTE3, 0\n wait_flag V, MTE3, 0\n\
         copy_ub_to_gm x5, x21, 1, {}\n end\n",
        4096 / 32
    );
    sim.run(&kernel, 1, &[ins[0], ins[1], ins[2], out, pb]);
    let got = fractals_f32(&sim.get(out, 4096));
    let init: Vec<f32> = (0..M * N).map(|e| bias[e % N]).collect();
    let want = matmul(&init, &a, &b, M, K, N);
    for i in 0..M {
        for j in 0..N {
            assert_eq!(got[nz(i, j)], want[i * N + j], "C[{i}][{j}]");
        }
    }
    // Rows past M hold the bias alone (the product adds nothing there).
    for i in M..32 {
        for j in 0..N {
            assert_eq!(got[nz(i, j)], bias[j], "padding row {i}, column {j}");
        }
    }
}

/// copy_l0c_to_gm (FIXPIPE, on a chip configured with one): NZ to row-major with a row stride,
/// f32 and f16 with relu; GM between the rows and after the matrix is untouched.
#[test]
fn cube_l0c_to_gm_through_fixpipe() {
    let mut cfg = ChipConfig::preset("ascend910").unwrap();
    cfg.core.fixpipe = true;
    let mut sim = Sim::with(cfg);
    let mut rng = Rng::new(0x5e_0033);
    let (a, b) = (matrix(&mut rng, M, K), matrix(&mut rng, K, N));
    let ins = [&a, &b, &b].map(|x| sim.put(&f16_bytes(x)));
    let (s32, s16) = (30usize, 27usize);
    let o32 = sim.put(&vec![0x55; (M + 1) * s32 * 4]);
    let o16 = sim.put(&vec![0x55; (M + 1) * s16 * 2]);
    let kernel = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         ld.gm.u64 x5, x1, off=24\n ld.gm.u64 x6, x1, off=32\n\
         {MMAD_LOADS}\
         mmad x17, x13, x15, 20, 40, 24, init=true\n\
         set_flag M, FIX, 0\n wait_flag M, FIX, 0\n\
         copy_l0c_to_gm.f32 x5, x17, 20, 24, {s32}\n\
         copy_l0c_to_gm.f16 x6, x17, 20, 24, {s16}, relu=true\n end\n"
    );
    sim.run(&kernel, 1, &[ins[0], ins[1], ins[2], o32, o16]);
    let c = matmul(&vec![0.0; M * N], &a, &b, M, K, N);
    let g32 = f32_from_bytes(&sim.get(o32, (M + 1) * s32 * 4));
    let g16 = f16_from_bytes(&sim.get(o16, (M + 1) * s16 * 2));
    let sentinel32 = f32::from_le_bytes([0x55; 4]);
    for i in 0..=M {
        for j in 0..s32 {
            let want = if i < M && j < N {
                c[i * N + j]
            } else {
                sentinel32
            };
            assert_eq!(
                g32[i * s32 + j].to_bits(),
                want.to_bits(),
                "f32 row {i} col {j}"
            );
        }
        for j in 0..s16 {
            let want = if i < M && j < N {
                hr(f64::from(c[i * N + j].max(0.0)))
            } else {
                0x5555
            };
            assert_eq!(
                u64::from(g16[i * s16 + j].to_bits()),
                want,
                "f16 relu row {i} col {j}"
            );
        }
    }
}

/// copy_l0c_to_gm_nz (FIXPIPE without NZ2ND) writes GM exactly the bytes copy_l0c_to_ub writes
/// UB, fractal order, conversion, ReLU and gaps included; the gap fractals are left untouched.
#[test]
fn cube_l0c_to_gm_nz_matches_the_ub_drain() {
    let mut cfg = ChipConfig::preset("ascend910").unwrap();
    cfg.core.fixpipe = true;
    let mut sim = Sim::with(cfg);
    let mut rng = Rng::new(0x5e_0034);
    let (a, b) = (matrix(&mut rng, M, K), matrix(&mut rng, K, N));
    let ins = [&a, &b, &b].map(|x| sim.put(&f16_bytes(x)));
    // Per form: f32 all four fractals, f16 with ReLU fractals 0 and 2 into slots 0 and 2.
    let bytes = [4 * 1024, 3 * 512];
    let sentinel = |n: usize| vec![0x5au8; n];
    let via_ub = [sim.put(&sentinel(bytes[0])), sim.put(&sentinel(bytes[1]))];
    let via_fix = [sim.put(&sentinel(bytes[0])), sim.put(&sentinel(bytes[1]))];
    let kernel = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         ld.gm.u64 x5, x1, off=24\n ld.gm.u64 x6, x1, off=32\n\
         ld.gm.u64 x7, x1, off=40\n ld.gm.u64 x8, x1, off=48\n\
         movi x21, 0x1000\n copy_gm_to_ub x21, x6, 1, {}\n\
         {MMAD_LOADS}\
         mmad x17, x13, x15, 20, 40, 24, init=true\n\
         set_flag M, V, 0\n wait_flag M, V, 0\n set_flag M, FIX, 0\n wait_flag M, FIX, 0\n\
         movi x20, 0\n copy_l0c_to_ub.f32 x20, x17, 4\n\
         copy_l0c_to_ub.f16 x21, x17, 2, src_gap=1, dst_gap=1, relu=true\n\
         copy_l0c_to_gm_nz.f32 x7, x17, 4\n\
         copy_l0c_to_gm_nz.f16 x8, x17, 2, src_gap=1, dst_gap=1, relu=true\n\
         set_flag V, MTE3, 0\n wait_flag V, MTE3, 0\n\
         copy_ub_to_gm x5, x20, 1, {}\n copy_ub_to_gm x6, x21, 1, {}\n end\n",
        bytes[1] / 32,
        bytes[0] / 32,
        bytes[1] / 32,
    );
    sim.run(
        &kernel,
        1,
        &[
            ins[0], ins[1], ins[2], via_ub[0], via_ub[1], via_fix[0], via_fix[1],
        ],
    );
    for (i, n) in bytes.into_iter().enumerate() {
        let (u, g) = (sim.get(via_ub[i], n), sim.get(via_fix[i], n));
        assert_eq!(u, g, "form {i}");
    }
    // The f16 form skipped its gap fractal in GM, as in UB.
    assert!(sim.get(via_fix[1], 1024)[512..].iter().all(|&b| b == 0x5a));
}

/// A MIX kernel on a separated chip (ascend910b2): the cube core computes C = A x B and writes
/// it out through the FIXPIPE, then tells its two vector cores with `cross_set.aic_aiv`; each
/// vector core waits for it (`cross_wait`), adds 1 + its `sub_block_idx` to C in UB and writes
/// its own copy, then tells the cube core, which waits for both before it ends.
#[test]
fn mix_kernel_cube_to_vector_through_gm_with_cross_core_flags() {
    let mut sim = Sim::with(ChipConfig::preset("ascend910b2").unwrap());
    let mut rng = Rng::new(0x5e_0177);
    let (a, b) = (matrix(&mut rng, M, K), matrix(&mut rng, K, N));
    let ins = [&a, &b, &b].map(|x| sim.put(&f16_bytes(x)));
    let c_bytes = M * N * 4; // 1920: 60 blocks
    let c_gm = sim.put(&vec![0u8; c_bytes]);
    let outs = [sim.put(&vec![0u8; c_bytes]), sim.put(&vec![0u8; c_bytes])];
    let cube = format!(
        "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n ld.gm.u64 x4, x1, off=16\n\
         ld.gm.u64 x5, x1, off=24\n\
         {MMAD_LOADS}\
         mmad x17, x13, x15, 20, 40, 24, init=true\n\
         set_flag M, FIX, 0\n wait_flag M, FIX, 0\n\
         copy_l0c_to_gm.f32 x5, x17, 20, 24, 24\n\
         cross_set.aic_aiv FIX, 0\n\
         cross_wait S, 1\n end\n"
    );
    let vector = "sreg x1, args\n ld.gm.u64 x5, x1, off=24\n\
         sreg x21, sub_block_idx\n shli x22, x21, 3\n addi x22, x22, 32\n add x22, x1, x22\n\
         ld.gm.u64 x6, x22\n\
         shli x21, x21, 23\n movi x20, 0x3f800000\n add x20, x20, x21\n\
         movi x10, 0\n\
         cross_wait MTE2, 0\n\
         copy_gm_to_ub x10, x5, 1, 60\n\
         set_flag MTE2, V, 0\n wait_flag MTE2, V, 0\n\
         vadds.f32 x10, x10, x20, repeat=8\n\
         set_flag V, MTE3, 0\n wait_flag V, MTE3, 0\n\
         copy_ub_to_gm x6, x10, 1, 60\n\
         cross_set.aic_aiv MTE3, 1\n end\n";
    let asm = |src: &str| gearsim_isa::assemble(src, "mix.s").unwrap_or_else(|e| panic!("{e}"));
    let k = sim.dev.load_mix_kernel(asm(&cube), asm(vector), 0).unwrap();
    let args = [ins[0], ins[1], ins[2], c_gm, outs[0], outs[1]];
    let report = sim.dev.launch(k, 1, &args, ExecMode::Full).unwrap();
    assert_eq!(
        report.cores_used, 3,
        "one cube core and its two vector cores"
    );
    let c = matmul(&vec![0.0; M * N], &a, &b, M, K, N);
    for (s, &out) in outs.iter().enumerate() {
        let got = f32_from_bytes(&sim.get(out, c_bytes));
        for (i, (g, want)) in got.iter().zip(&c).enumerate() {
            assert_eq!(
                g.to_bits(),
                (want + (1.0 + s as f32)).to_bits(),
                "vector core {s}, element {i}"
            );
        }
    }
}

/// An i8 product of ones (each accumulator 32 = K) leaves the FIXPIPE times its column's scale
/// from the FIXPIPE buffer (`copy_l1_to_fb`, then `copy_l0c_to_gm` with `quant=vdeq`).
#[test]
fn fixpipe_dequantises_each_column_by_its_fb_scale() {
    let mut sim = Sim::with(ChipConfig::preset("ascend910b2").expect("the ascend910b2 preset"));
    let ones = sim.put(&[1u8; 512]);
    let scales: Vec<u8> = (0..16)
        .flat_map(|j| (j as f32 * 0.5).to_le_bytes())
        .collect();
    let ps = sim.put(&scales);
    let out = sim.put(&[0u8; 16 * 16 * 4]);
    let kernel = "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n\
         ld.gm.u64 x4, x1, off=16\n movi x10, 0\n movi x11, 1024\n\
         copy_gm_to_l1 x10, x2, 1, 16\n copy_gm_to_l1 x11, x3, 1, 2\n\
         set_flag MTE2, MTE1, 0\n wait_flag MTE2, MTE1, 0\n\
         set_flag MTE2, FIX, 0\n wait_flag MTE2, FIX, 0\n\
         movi x12, 0\n movi x13, 64\n copy_l1_to_fb x13, x11, 1, 2\n\
         load_l0a x12, x10, 1\n load_l0b x12, x10, 1\n\
         set_flag MTE1, M, 0\n wait_flag MTE1, M, 0\n\
         mmad x12, x12, x12, 16, 32, 16, init=true, ty=i8\n\
         set_flag M, FIX, 0\n wait_flag M, FIX, 0\n\
         copy_l0c_to_gm.f32 x4, x12, 16, 16, 16, quant=vdeq, scale=x13\n end\n";
    sim.run(kernel, 1, &[ones, ps, out]);
    let got = f32_from_bytes(&sim.get(out, 16 * 16 * 4));
    for (e, v) in got.iter().enumerate() {
        assert_eq!(*v, 32.0 * (e % 16) as f32 * 0.5, "element {e}");
    }
}

/// A chained product on a cube core: `C = A·B` leaves L0C through the FIXPIPE into L1 as fp16
/// fractals (`copy_l0c_to_l1`), is loaded into L0A and multiplied by `B` again, without a trip
/// through GM; the result is `f16(A·B)·B` accumulated in f32.
#[test]
fn a_product_goes_back_into_l1_through_the_fixpipe() {
    let mut sim = Sim::with(ChipConfig::preset("ascend910b2").expect("the ascend910b2 preset"));
    let mut rng = Rng::new(0x11_0c);
    let (a, b) = (matrix(&mut rng, 16, 16), matrix(&mut rng, 16, 16));
    let (pa, pb) = (sim.put(&f16_bytes(&a)), sim.put(&f16_bytes(&b)));
    let out = sim.put(&[0u8; 1024]);
    let kernel = "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n\
         ld.gm.u64 x4, x1, off=16\n movi x10, 0\n movi x11, 512\n movi x14, 1024\n\
         copy_gm_to_l1 x10, x2, 1, 16\n copy_gm_to_l1 x11, x3, 1, 16\n\
         set_flag MTE2, MTE1, 0\n wait_flag MTE2, MTE1, 0\n\
         movi x12, 0\n load_l0a x12, x10, 1\n load_l0b x12, x11, 1\n\
         set_flag MTE1, M, 0\n wait_flag MTE1, M, 0\n\
         mmad x12, x12, x12, 16, 16, 16, init=true\n\
         set_flag M, FIX, 0\n wait_flag M, FIX, 0\n\
         copy_l0c_to_l1.f16 x14, x12, 1\n\
         set_flag FIX, MTE1, 0\n wait_flag FIX, MTE1, 0\n\
         load_l0a x12, x14, 1\n\
         set_flag MTE1, M, 1\n wait_flag MTE1, M, 1\n\
         mmad x12, x12, x12, 16, 16, 16, init=true\n\
         set_flag M, FIX, 1\n wait_flag M, FIX, 1\n\
         copy_l0c_to_gm.f32 x4, x12, 16, 16, 16\n end\n";
    sim.run(kernel, 1, &[pa, pb, out]);
    let got = f32_from_bytes(&sim.get(out, 1024));
    let f = |v: &[f16], i: usize| v[i].to_f32();
    let mut c = vec![f16::ZERO; 256];
    for i in 0..16 {
        for j in 0..16 {
            let mut acc = 0f32;
            for k in 0..16 {
                acc += f(&a, i * 16 + k) * f(&b, k * 16 + j);
            }
            c[i * 16 + j] = f16::from_f32(acc);
        }
    }
    for i in 0..16 {
        for j in 0..16 {
            let mut acc = 0f32;
            for k in 0..16 {
                acc += f(&c, i * 16 + k) * f(&b, k * 16 + j);
            }
            assert_eq!(got[i * 16 + j].to_bits(), acc.to_bits(), "({i}, {j})");
        }
    }
}

// ---- coverage of the table ---------------------------------------------------------------------

/// Every mnemonic of the instruction table occurs in a kernel of this module (spelled as an
/// instruction, or as the name a kernel generator formats into one), so an instruction added to
/// the table without a semantics test here fails this test. This checks presence only; the tests
/// above check the behaviour.
#[test]
fn every_table_instruction_is_exercised_here() {
    let text = include_str!("semantics.rs");
    let bytes = text.as_bytes();
    let missing: Vec<&str> = gearsim_isa::SPECS
        .iter()
        .map(|spec| spec.mnemonic)
        .filter(|m| {
            !text.match_indices(m).any(|(at, _)| {
                let before = if at == 0 { b' ' } else { bytes[at - 1] };
                let after = bytes.get(at + m.len()).copied().unwrap_or(b' ');
                matches!(before, b' ' | b'"' | b'\n')
                    && matches!(after, b' ' | b'"' | b'.' | b'\\' | b'\n')
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "instructions without a kernel here: {missing:?}"
    );
}
