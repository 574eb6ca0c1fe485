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

use gearsim_isa::{Cmp, DType, Emitted, ProgramBuilder, Round, VBin, VScalar, VUn, units};

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
            rep: units::BLOCKS_PER_REPEAT as u8,
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

/// A two-source vector instruction's builder method (`ProgramBuilder::vadd`, `vmul`, ...).
pub type BinOp = for<'b> fn(&'b mut ProgramBuilder, DType, Reg, Reg, Reg) -> Emitted<'b, VBin>;
/// A one-source vector instruction's builder method (`ProgramBuilder::vabs`, `vexp`, ...).
pub type UnOp = for<'b> fn(&'b mut ProgramBuilder, DType, Reg, Reg) -> Emitted<'b, VUn>;
/// A vector-and-scalar instruction's builder method (`ProgramBuilder::vadds`, `vmuls`, ...).
pub type ScalarOp =
    for<'b> fn(&'b mut ProgramBuilder, DType, Reg, Reg, Reg) -> Emitted<'b, VScalar>;

/// Writes vector instructions into a kernel; `tmp` carries immediates.
///
/// The instruction is a builder method (`vbin(ProgramBuilder::vadd, DType::F32, ..)`), so a
/// caller choosing it from a table keeps a table of [`BinOp`], [`UnOp`] or [`ScalarOp`].
pub struct Vx<'a> {
    /// The kernel.
    pub a: &'a mut Asm,
    /// Register for immediates (clobbered).
    pub tmp: Reg,
}

impl Vx<'_> {
    /// `op.ty d, x, y` (vadd, vsub, vmul, vdiv, vmax, vmin, vand, vor).
    pub fn vbin(&mut self, op: BinOp, ty: DType, d: View, x: View, y: View) {
        op(self.a, ty, d.reg, x.reg, y.reg)
            .dst_blk(d.blk)
            .src0_blk(x.blk)
            .src1_blk(y.blk)
            .dst_rep(d.rep)
            .src0_rep(x.rep)
            .src1_rep(y.rep);
    }

    /// `op.ty d, x` (vabs, vexp, vln, vsqrt, vrec, vmov, ...).
    pub fn vun(&mut self, op: UnOp, ty: DType, d: View, x: View) {
        op(self.a, ty, d.reg, x.reg)
            .dst_blk(d.blk)
            .src_blk(x.blk)
            .dst_rep(d.rep)
            .src_rep(x.rep);
    }

    /// `op.ty d, x, imm` (vadds, vmuls, vmaxs, vmins) with the immediate's raw bits.
    pub fn vscalar(&mut self, op: ScalarOp, ty: DType, d: View, x: View, bits: i64) {
        self.a.movi(self.tmp, bits);
        self.vscalar_reg(op, ty, d, x, self.tmp);
    }

    /// `op.ty d, x, r` with the scalar in a register.
    pub fn vscalar_reg(&mut self, op: ScalarOp, ty: DType, d: View, x: View, r: Reg) {
        op(self.a, ty, d.reg, x.reg, r)
            .dst_blk(d.blk)
            .src_blk(x.blk)
            .dst_rep(d.rep)
            .src_rep(x.rep);
    }

    /// `d = x * c` in f32.
    pub fn muls(&mut self, d: View, x: View, c: f32) {
        self.vscalar(
            ProgramBuilder::vmuls,
            DType::F32,
            d,
            x,
            i64::from(c.to_bits()),
        );
    }

    /// `d = x + c` in f32.
    pub fn adds(&mut self, d: View, x: View, c: f32) {
        self.vscalar(
            ProgramBuilder::vadds,
            DType::F32,
            d,
            x,
            i64::from(c.to_bits()),
        );
    }

    /// `d = c - x` in f32 (negate, then add).
    pub fn rsubs(&mut self, d: View, x: View, c: f32) {
        self.muls(d, x, -1.0);
        self.adds(d, d, c);
    }

    /// Bit mask `bits = x cmp y`.
    pub fn vcmp(&mut self, c: Cmp, ty: DType, bits: Reg, x: View, y: View) {
        self.a
            .vcmp(c, ty, bits, x.reg, y.reg)
            .src0_blk(x.blk)
            .src1_blk(y.blk)
            .src0_rep(x.rep)
            .src1_rep(y.rep);
    }

    /// Bit mask `bits = x cmp imm` (raw bits of the immediate).
    pub fn vcmps(&mut self, c: Cmp, ty: DType, bits: Reg, x: View, imm: i64) {
        self.a.movi(self.tmp, imm);
        self.a
            .vcmps(c, ty, bits, x.reg, self.tmp)
            .src_blk(x.blk)
            .src_rep(x.rep);
    }

    /// Bit mask `bits = x cmp c` for an f32 constant.
    pub fn vcmps_f32(&mut self, c: Cmp, bits: Reg, x: View, v: f32) {
        self.vcmps(c, DType::F32, bits, x, i64::from(v.to_bits()));
    }

    /// `d = bit ? x : y`.
    pub fn vsel(&mut self, ty: DType, d: View, x: View, y: View, bits: Reg) {
        self.a
            .vsel(ty, d.reg, x.reg, y.reg, bits)
            .dst_blk(d.blk)
            .src0_blk(x.blk)
            .src1_blk(y.blk)
            .dst_rep(d.rep)
            .src0_rep(x.rep)
            .src1_rep(y.rep);
    }

    /// `d = convert(x)` from `sty` to `dty` with a rounding mode.
    pub fn vconv(&mut self, dty: DType, sty: DType, d: View, x: View, round: Round) {
        self.a
            .vconv(dty, sty, d.reg, x.reg)
            .dst_blk(d.blk)
            .src_blk(x.blk)
            .dst_rep(d.rep)
            .src_rep(x.rep)
            .round(round);
    }

    /// Fills `d` with a value (raw bits).
    pub fn vdup(&mut self, ty: DType, d: View, bits: i64) {
        self.a.movi(self.tmp, bits);
        self.a
            .vdup(ty, d.reg, self.tmp)
            .dst_blk(d.blk)
            .dst_rep(d.rep);
    }

    /// `p = p * t + c_k` for the coefficients from the highest degree down (Horner), starting
    /// from `p = t * c[0] + c[1]`; `c` has at least two entries.
    pub fn horner(&mut self, p: View, t: View, c: &[f32]) {
        self.muls(p, t, c[0]);
        self.adds(p, p, c[1]);
        for &k in &c[2..] {
            self.vbin(ProgramBuilder::vmul, DType::F32, p, p, t);
            self.adds(p, p, k);
        }
    }
}
