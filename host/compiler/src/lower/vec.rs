//! Vector instructions over operand *views*: a UB address register plus the block and repeat
//! strides the operand is read with. A flat view (`blk=1, rep=8`) walks a contiguous tile; a
//! splat view (`blk=0, rep=0`) reads the same 32-byte block for every block of every repeat, so
//! a block holding one value in every lane acts as a broadcast scalar for any instruction without
//! a scalar register (and so without the scalar unit ever reading tensor data, which keeps
//! timing-only runs exact).
//!
//! Immediates go through one scratch register (`movi` right before the instruction): a pipe
//! instruction captures its registers when it is dispatched, so the register is free again at
//! once.

use std::fmt::Write as _;

use super::writer::{Asm, Reg};

/// A vector operand: its UB address and the strides it is read or written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Register holding the UB address.
    pub reg: Reg,
    /// Blocks between the blocks of one repeat.
    pub blk: u8,
    /// Blocks between repeats.
    pub rep: u8,
}

impl View {
    /// A contiguous operand.
    pub const fn flat(reg: Reg) -> View {
        View {
            reg,
            blk: 1,
            rep: 8,
        }
    }

    /// A 32-byte block read for every block of every repeat (a broadcast value when the block
    /// holds it in every lane).
    pub const fn splat(reg: Reg) -> View {
        View {
            reg,
            blk: 0,
            rep: 0,
        }
    }
}

/// Appends the non-default stride keys of each named operand.
fn keys(s: &mut String, views: &[(&str, View)]) {
    for (name, v) in views {
        if v.blk != 1 {
            let _ = write!(s, ", {name}_blk={}", v.blk);
        }
        if v.rep != 8 {
            let _ = write!(s, ", {name}_rep={}", v.rep);
        }
    }
}

/// Writes vector instructions into a kernel; `tmp` carries immediates.
pub struct Vx<'a> {
    /// The kernel.
    pub a: &'a mut Asm,
    /// Register for immediates (clobbered).
    pub tmp: Reg,
}

impl Vx<'_> {
    /// `m.ty d, x, y` (vadd, vsub, vmul, vdiv, vmax, vmin, vand, vor).
    pub fn bin(&mut self, m: &str, ty: &str, d: View, x: View, y: View) {
        let mut s = format!("{m}.{ty} {}, {}, {}", d.reg, x.reg, y.reg);
        keys(&mut s, &[("dst", d), ("src0", x), ("src1", y)]);
        self.a.ins(s);
    }

    /// `m.ty d, x` (vabs, vexp, vln, vsqrt, vrec, vmov, ...).
    pub fn un(&mut self, m: &str, ty: &str, d: View, x: View) {
        let mut s = format!("{m}.{ty} {}, {}", d.reg, x.reg);
        keys(&mut s, &[("dst", d), ("src", x)]);
        self.a.ins(s);
    }

    /// `m.ty d, x, imm` (vadds, vmuls, vmaxs, vmins) with the immediate's raw bits.
    pub fn scalar(&mut self, m: &str, ty: &str, d: View, x: View, bits: i64) {
        self.a.movi(self.tmp, bits);
        self.scalar_reg(m, ty, d, x, self.tmp);
    }

    /// `m.ty d, x, r` with the scalar in a register.
    pub fn scalar_reg(&mut self, m: &str, ty: &str, d: View, x: View, r: Reg) {
        let mut s = format!("{m}.{ty} {}, {}, {r}", d.reg, x.reg);
        keys(&mut s, &[("dst", d), ("src", x)]);
        self.a.ins(s);
    }

    /// `d = x * c` in f32.
    pub fn muls(&mut self, d: View, x: View, c: f32) {
        self.scalar("vmuls", "f32", d, x, i64::from(c.to_bits()));
    }

    /// `d = x + c` in f32.
    pub fn adds(&mut self, d: View, x: View, c: f32) {
        self.scalar("vadds", "f32", d, x, i64::from(c.to_bits()));
    }

    /// `d = c - x` in f32 (negate, then add).
    pub fn rsubs(&mut self, d: View, x: View, c: f32) {
        self.muls(d, x, -1.0);
        self.adds(d, d, c);
    }

    /// Bit mask `bits = x cmp y`.
    pub fn cmp(&mut self, c: &str, ty: &str, bits: Reg, x: View, y: View) {
        let mut s = format!("vcmp.{c}.{ty} {bits}, {}, {}", x.reg, y.reg);
        keys(&mut s, &[("src0", x), ("src1", y)]);
        self.a.ins(s);
    }

    /// Bit mask `bits = x cmp imm` (raw bits of the immediate).
    pub fn cmps(&mut self, c: &str, ty: &str, bits: Reg, x: View, imm: i64) {
        self.a.movi(self.tmp, imm);
        let mut s = format!("vcmps.{c}.{ty} {bits}, {}, {}", x.reg, self.tmp);
        keys(&mut s, &[("src", x)]);
        self.a.ins(s);
    }

    /// Bit mask `bits = x cmp c` for an f32 constant.
    pub fn cmps_f32(&mut self, c: &str, bits: Reg, x: View, v: f32) {
        self.cmps(c, "f32", bits, x, i64::from(v.to_bits()));
    }

    /// `d = bit ? x : y`.
    pub fn sel(&mut self, ty: &str, d: View, x: View, y: View, bits: Reg) {
        let mut s = format!("vsel.{ty} {}, {}, {}, {bits}", d.reg, x.reg, y.reg);
        keys(&mut s, &[("dst", d), ("src0", x), ("src1", y)]);
        self.a.ins(s);
    }

    /// `d = convert(x)` from `sty` to `dty` with a rounding mode.
    pub fn conv(&mut self, dty: &str, sty: &str, d: View, x: View, round: &str) {
        let mut s = format!("vconv.{dty}.{sty} {}, {}", d.reg, x.reg);
        keys(&mut s, &[("dst", d), ("src", x)]);
        if round != "rint" {
            let _ = write!(s, ", round={round}");
        }
        self.a.ins(s);
    }

    /// Fills `d` with a value (raw bits).
    pub fn dup(&mut self, ty: &str, d: View, bits: i64) {
        self.a.movi(self.tmp, bits);
        let mut s = format!("vdup.{ty} {}, {}", d.reg, self.tmp);
        keys(&mut s, &[("dst", d)]);
        self.a.ins(s);
    }

    /// `p = p * t + c_k` for the coefficients from the highest degree down (Horner), starting
    /// from `p = t * c[0] + c[1]`; `c` has at least two entries.
    pub fn horner(&mut self, p: View, t: View, c: &[f32]) {
        self.muls(p, t, c[0]);
        self.adds(p, p, c[1]);
        for &k in &c[2..] {
            self.bin("vmul", "f32", p, p, t);
            self.adds(p, p, k);
        }
    }
}
