//! The scalar unit's semantics, written once: register arithmetic, branch and loop conditions
//! and mask values as pure functions of the register file. The cores execute them
//! (`core::AiCore::execute_scalar`), and static analysis (the compiler's verifier) follows a
//! kernel's control flow with the very same functions, so the two cannot disagree.
//!
//! [`step`] is the one exhaustive sorting of instructions for the scalar unit: it evaluates what
//! is a function of the registers and names what needs the unit's own state (special
//! registers, memory, flags, the end of the kernel). What an instruction costs comes from its
//! timing class in the ISA table (`ScalarConfig::cycles`), not from here.

use gearsim_isa::{Barrier, CrossSet, CrossWait, FMatrix, Flag, Instruction, Mem, ReadSReg};

use super::MaskState;

/// Signed division: x/0 = -1 and MIN/-1 = MIN, as RISC-V.
#[inline]
pub fn div_signed(a: u64, d: u64) -> u64 {
    let (a, d) = (a as i64, d as i64);
    if d == 0 {
        u64::MAX
    } else {
        a.wrapping_div(d) as u64
    }
}

/// Signed remainder: x%0 = x and MIN%-1 = 0, as RISC-V.
#[inline]
pub fn rem_signed(a: u64, d: u64) -> u64 {
    let (a, d) = (a as i64, d as i64);
    if d == 0 {
        a as u64
    } else {
        a.wrapping_rem(d) as u64
    }
}

/// The registers an instruction reads (at most two), in operand order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sources {
    regs: [usize; 2],
    len: usize,
}

impl Sources {
    const NONE: Sources = Sources {
        regs: [0; 2],
        len: 0,
    };

    fn one(a: usize) -> Sources {
        Sources {
            regs: [a, 0],
            len: 1,
        }
    }

    fn two(a: usize, b: usize) -> Sources {
        Sources {
            regs: [a, b],
            len: 2,
        }
    }

    /// The register indices.
    pub fn as_slice(&self) -> &[usize] {
        &self.regs[..self.len]
    }
}

/// What the scalar unit does with one instruction, with everything that is a function of the
/// registers already evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// Register arithmetic: register `dst` becomes `value`, computed from `srcs`.
    Write {
        /// The register written.
        dst: usize,
        /// Its new value.
        value: u64,
        /// The registers read.
        srcs: Sources,
    },
    /// A branch or jump: to `target` if `taken`, after comparing `srcs` (none for `jmp`).
    Branch {
        /// Whether control goes to `target`.
        taken: bool,
        /// The branch target (an instruction index).
        target: u32,
        /// The registers compared.
        srcs: Sources,
    },
    /// `loop`: register `counter` becomes `value` (one less); to `target` if that is not zero.
    Loop {
        /// The counter register.
        counter: usize,
        /// Its new value.
        value: u64,
        /// Whether control goes to `target`.
        taken: bool,
        /// The loop head.
        target: u32,
    },
    /// A new vector mask, computed from `srcs`.
    SetMask {
        /// The mask.
        mask: MaskState,
        /// The registers read.
        srcs: Sources,
    },
    /// Read a special register (block index, arguments, cycle, ...): the unit's own state.
    ReadSpecial(&'a ReadSReg),
    /// Scalar load (`true`) or store to a memory space.
    Memory(&'a Mem, bool),
    /// New img2col feature-map geometry.
    SetFmatrix(&'a FMatrix),
    /// `set_flag` executed by the scalar unit.
    SetFlag(&'a Flag),
    /// `wait_flag` executed by the scalar unit.
    WaitFlag(&'a Flag),
    /// `pipe_barrier` executed by the scalar unit.
    Barrier(&'a Barrier),
    /// `cross_set` executed by the scalar unit.
    CrossSet(&'a CrossSet),
    /// `cross_wait` executed by the scalar unit.
    CrossWait(&'a CrossWait),
    /// No operation.
    Nop,
    /// End of the kernel.
    End,
    /// Not the scalar unit's: a vector, cube or DMA instruction is dispatched to its pipe.
    Dispatched,
}

/// What `instr` does on the scalar unit given the registers `r`. Inlined so that the core's
/// match on the result folds into this one.
#[inline(always)]
pub fn step<'a>(instr: &'a Instruction, r: &[u64; 32]) -> Step<'a> {
    use Instruction as I;
    let rrr = |f: &gearsim_isa::Rrr, op: fn(u64, u64) -> u64| {
        let (a, b) = (f.a.index(), f.b.index());
        Step::Write {
            dst: f.dst.index(),
            value: op(r[a], r[b]),
            srcs: Sources::two(a, b),
        }
    };
    let rri = |f: &gearsim_isa::Rri, op: fn(u64, u64) -> u64| {
        let a = f.a.index();
        Step::Write {
            dst: f.dst.index(),
            value: op(r[a], i64::from(f.imm) as u64),
            srcs: Sources::one(a),
        }
    };
    let rr = |f: &gearsim_isa::Rr, op: fn(u64) -> u64| {
        let a = f.src.index();
        Step::Write {
            dst: f.dst.index(),
            value: op(r[a]),
            srcs: Sources::one(a),
        }
    };
    let branch = |f: &gearsim_isa::Branch, cond: fn(u64, u64) -> bool| {
        let (a, b) = (f.a.index(), f.b.index());
        Step::Branch {
            taken: cond(r[a], r[b]),
            target: f.target.0,
            srcs: Sources::two(a, b),
        }
    };
    match instr {
        I::Add(f) => rrr(f, u64::wrapping_add),
        I::Sub(f) => rrr(f, u64::wrapping_sub),
        I::Mul(f) => rrr(f, u64::wrapping_mul),
        I::Div(f) => rrr(f, div_signed),
        I::Divu(f) => rrr(f, |a, d| a.checked_div(d).unwrap_or(u64::MAX)),
        I::Rem(f) => rrr(f, rem_signed),
        I::Remu(f) => rrr(f, |a, d| a.checked_rem(d).unwrap_or(a)),
        I::And(f) => rrr(f, |a, b| a & b),
        I::Or(f) => rrr(f, |a, b| a | b),
        I::Xor(f) => rrr(f, |a, b| a ^ b),
        I::Shl(f) => rrr(f, |a, b| a << (b & 63)),
        I::Shr(f) => rrr(f, |a, b| a >> (b & 63)),
        I::Sra(f) => rrr(f, |a, b| ((a as i64) >> (b & 63)) as u64),
        I::Min(f) => rrr(f, |a, b| (a as i64).min(b as i64) as u64),
        I::Max(f) => rrr(f, |a, b| (a as i64).max(b as i64) as u64),
        I::Minu(f) => rrr(f, u64::min),
        I::Maxu(f) => rrr(f, u64::max),
        I::Slt(f) => rrr(f, |a, b| u64::from((a as i64) < (b as i64))),
        I::Sltu(f) => rrr(f, |a, b| u64::from(a < b)),
        I::Seq(f) => rrr(f, |a, b| u64::from(a == b)),
        I::Addi(f) => rri(f, u64::wrapping_add),
        I::Muli(f) => rri(f, u64::wrapping_mul),
        I::Andi(f) => rri(f, |a, b| a & b),
        I::Ori(f) => rri(f, |a, b| a | b),
        I::Xori(f) => rri(f, |a, b| a ^ b),
        I::Shli(f) => rri(f, |a, b| a << (b & 63)),
        I::Shri(f) => rri(f, |a, b| a >> (b & 63)),
        I::Srai(f) => rri(f, |a, b| ((a as i64) >> (b & 63)) as u64),
        I::Slti(f) => rri(f, |a, b| u64::from((a as i64) < (b as i64))),
        I::Movi(f) => Step::Write {
            dst: f.dst.index(),
            value: f.imm as u64,
            srcs: Sources::NONE,
        },
        I::Mov(f) => rr(f, |a| a),
        I::Ctz(f) => rr(f, |a| u64::from(a.trailing_zeros())),
        I::Clz(f) => rr(f, |a| u64::from(a.leading_zeros())),
        I::Popc(f) => rr(f, |a| u64::from(a.count_ones())),
        I::Beq(f) => branch(f, |x, y| x == y),
        I::Bne(f) => branch(f, |x, y| x != y),
        I::Blt(f) => branch(f, |x, y| (x as i64) < (y as i64)),
        I::Bge(f) => branch(f, |x, y| (x as i64) >= (y as i64)),
        I::Bltu(f) => branch(f, |x, y| x < y),
        I::Bgeu(f) => branch(f, |x, y| x >= y),
        I::Jmp(f) => Step::Branch {
            taken: true,
            target: f.target.0,
            srcs: Sources::NONE,
        },
        I::LoopNz(f) => {
            let counter = f.counter.index();
            let value = r[counter].wrapping_sub(1);
            Step::Loop {
                counter,
                value,
                taken: value != 0,
                target: f.target.0,
            }
        }
        I::SetMask(f) => {
            let (hi, lo) = (f.hi.index(), f.lo.index());
            Step::SetMask {
                mask: MaskState::Normal((u128::from(r[hi]) << 64) | u128::from(r[lo])),
                srcs: Sources::two(hi, lo),
            }
        }
        I::SetMaskCount(f) => {
            let count = f.count.index();
            Step::SetMask {
                mask: MaskState::Counter(r[count]),
                srcs: Sources::one(count),
            }
        }
        I::Sreg(f) => Step::ReadSpecial(f),
        I::Ld(f) => Step::Memory(f, true),
        I::St(f) => Step::Memory(f, false),
        I::SetFmatrix(f) => Step::SetFmatrix(f),
        I::SetFlag(f) => Step::SetFlag(f),
        I::WaitFlag(f) => Step::WaitFlag(f),
        I::PipeBarrier(f) => Step::Barrier(f),
        I::CrossCoreSetFlag(f) => Step::CrossSet(f),
        I::CrossCoreWaitFlag(f) => Step::CrossWait(f),
        I::Nop(_) => Step::Nop,
        I::End(_) => Step::End,
        I::Vadd(_)
        | I::Vsub(_)
        | I::Vmul(_)
        | I::Vdiv(_)
        | I::Vmax(_)
        | I::Vmin(_)
        | I::Vand(_)
        | I::Vor(_)
        | I::Vmla(_)
        | I::Vabs(_)
        | I::Vrelu(_)
        | I::Vexp(_)
        | I::Vln(_)
        | I::Vsqrt(_)
        | I::Vrsqrt(_)
        | I::Vrec(_)
        | I::Vnot(_)
        | I::Vmov(_)
        | I::Vadds(_)
        | I::Vmuls(_)
        | I::Vmaxs(_)
        | I::Vmins(_)
        | I::Vdup(_)
        | I::Vconv(_)
        | I::Vcmp(_)
        | I::Vcmps(_)
        | I::Vsel(_)
        | I::Vgather(_)
        | I::Vtranspose(_)
        | I::Vreduce(_)
        | I::Vbreduce(_)
        | I::CopyL0cToUb(_)
        | I::BroadcastUbToL0c(_)
        | I::BroadcastL1ToL0c(_)
        | I::CopyGmToUb(_)
        | I::CopyUbToGm(_)
        | I::CopyGmToUbPad(_)
        | I::CopyUbToGmPad(_)
        | I::CopyGmToL1(_)
        | I::CopyGmToL1Nd2nz(_)
        | I::LoadImageL1(_)
        | I::LoadL0a(_)
        | I::LoadL0b(_)
        | I::Img2colL0a(_)
        | I::CopyL0cToGm(_)
        | I::CopyL0cToGmNz(_)
        | I::CopyL1ToFb(_)
        | I::CopyL0cToL1(_)
        | I::Mmad(_) => Step::Dispatched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn division_follows_risc_v_at_the_edges() {
        let min = i64::MIN as u64;
        let neg1 = u64::MAX;
        assert_eq!(div_signed(7, 0), u64::MAX);
        assert_eq!(div_signed(min, neg1), min);
        assert_eq!(rem_signed(7, 0), 7);
        assert_eq!(rem_signed(min, neg1), 0);
        assert_eq!(div_signed((-7i64) as u64, 2), (-3i64) as u64);
        assert_eq!(rem_signed((-7i64) as u64, 2), (-1i64) as u64);
    }
}
