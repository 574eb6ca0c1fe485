//! What each pipe instruction touches, costs and does.
//!
//! For every dispatched instruction the core first builds a [`Plan`]: the memory ranges it reads
//! and writes (checked for bounds and alignment in both modes), and the amount of work that sets
//! its cost (repeats, fractals, bytes). Only in full mode does it then [`execute`] the
//! instruction's effect on real values. Timing depends on the plan alone, which is why a
//! timing-only run has exactly the timeline of a full run.

mod cube;
mod dma;
mod vector;

use gearsim_isa::{DType, FMatrix, Instruction, Pipe, TimingClass};

use crate::config::ChipConfig;
use crate::core::buffers::Buffers;
use crate::memory::DeviceMemory;
use crate::stop::Buffer;

/// A fault found while planning an instruction; the core adds core, pipe and pc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Outside a buffer.
    Range {
        buffer: Buffer,
        addr: u64,
        len: u64,
        size: u64,
    },
    /// Misaligned base address.
    Align {
        buffer: Buffer,
        addr: u64,
        align: u64,
    },
    /// Operands that make no sense together.
    Illegal(String),
}

/// The vector mask register, captured when an instruction is dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mask {
    /// Bit `i` enables element `i` of every repeat.
    Normal(u128),
    /// The instruction processes this many elements; repeats follow from it.
    Counter(u64),
}

impl Mask {
    pub(crate) const FULL: Mask = Mask::Normal(u128::MAX);
}

/// The operands of a dispatched instruction: register values read at dispatch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operands {
    pub regs: [u64; 4],
    pub mask: Mask,
    pub fmatrix: FMatrix,
}

/// A run of equally spaced bursts in one memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Access {
    pub buffer: Buffer,
    pub start: u64,
    pub burst: u64,
    pub stride: u64,
    pub count: u64,
    pub write: bool,
}

impl Access {
    fn range(buffer: Buffer, start: u64, len: u64, write: bool) -> Access {
        Access {
            buffer,
            start,
            burst: len,
            stride: len,
            count: 1,
            write,
        }
    }

    /// One past the last byte touched.
    pub(crate) fn end(&self) -> u64 {
        if self.count == 0 || self.burst == 0 {
            return self.start;
        }
        self.start
            .saturating_add((self.count - 1).saturating_mul(self.stride))
            .saturating_add(self.burst)
    }

    /// Bytes between the first and one past the last byte touched.
    pub(crate) fn extent(&self) -> u64 {
        self.end() - self.start
    }
}

/// What an instruction touches and how much work it is.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan {
    slots: [Access; 4],
    len: usize,
    /// Repeats (vector), fractal products (cube) or bytes moved (MTE1, L0C moves).
    pub work: u64,
    /// Bytes that cross the shared memory system, each burst rounded up to 32 bytes.
    pub gm_bytes: u64,
}

impl Plan {
    /// A plan touching up to four memory ranges.
    pub(crate) fn new(work: u64, gm_bytes: u64, accesses: &[Access]) -> Plan {
        let mut slots = [Access::default(); 4];
        slots[..accesses.len()].copy_from_slice(accesses);
        Plan {
            slots,
            len: accesses.len(),
            work,
            gm_bytes,
        }
    }

    /// The memory ranges.
    pub(crate) fn accesses(&self) -> &[Access] {
        &self.slots[..self.len]
    }
}

/// Elements per vector repeat for an element size.
pub(crate) fn elems_per_repeat(widest: DType) -> u64 {
    256 / widest.size() as u64
}

fn align(buffer: Buffer, addr: u64, cfg: &ChipConfig) -> Result<(), Fault> {
    let a = match buffer {
        Buffer::Gm => 1,
        Buffer::Ub => cfg.core.ub_align,
        Buffer::L1 => cfg.core.l1_align,
        Buffer::L0a => cfg.core.l0a_align,
        Buffer::L0b => cfg.core.l0b_align,
        Buffer::L0c => cfg.core.l0c_align,
    };
    if addr % a != 0 {
        Err(Fault::Align {
            buffer,
            addr,
            align: a,
        })
    } else {
        Ok(())
    }
}

/// Builds the plan of a pipe instruction (never called for scalar-unit instructions).
pub(crate) fn plan(instr: &Instruction, ops: &Operands, cfg: &ChipConfig) -> Result<Plan, Fault> {
    let plan = match instr {
        Instruction::Vadd(f)
        | Instruction::Vsub(f)
        | Instruction::Vmul(f)
        | Instruction::Vdiv(f)
        | Instruction::Vmax(f)
        | Instruction::Vmin(f)
        | Instruction::Vand(f)
        | Instruction::Vor(f)
        | Instruction::Vmla(f) => vector::plan_bin(f, ops),
        Instruction::Vabs(f)
        | Instruction::Vrelu(f)
        | Instruction::Vexp(f)
        | Instruction::Vln(f)
        | Instruction::Vsqrt(f)
        | Instruction::Vrsqrt(f)
        | Instruction::Vrec(f)
        | Instruction::Vnot(f)
        | Instruction::Vmov(f) => vector::plan_un(f, ops),
        Instruction::Vadds(f)
        | Instruction::Vmuls(f)
        | Instruction::Vmaxs(f)
        | Instruction::Vmins(f) => vector::plan_scalar(f, ops),
        Instruction::Vdup(f) => vector::plan_dup(f, ops),
        Instruction::Vconv(f) => vector::plan_conv(f, ops),
        Instruction::Vcmp(f) => vector::plan_cmp(f, ops),
        Instruction::Vcmps(f) => vector::plan_cmps(f, ops),
        Instruction::Vsel(f) => vector::plan_sel(f, ops),
        Instruction::Vreduce(f) => vector::plan_reduce(f, ops, false),
        Instruction::Vbreduce(f) => vector::plan_reduce(f, ops, true),
        Instruction::CopyL0cToUb(f) => cube::plan_l0c_to_ub(f, ops),
        Instruction::CopyGmToUb(f) => dma::plan_burst(f, ops, Buffer::Gm, Buffer::Ub)?,
        Instruction::CopyUbToGm(f) => dma::plan_burst(f, ops, Buffer::Ub, Buffer::Gm)?,
        Instruction::CopyGmToL1(f) => dma::plan_burst(f, ops, Buffer::Gm, Buffer::L1)?,
        Instruction::CopyGmToUbPad(f) => dma::plan_pad(f, ops, Buffer::Gm, Buffer::Ub)?,
        Instruction::CopyUbToGmPad(f) => dma::plan_pad(f, ops, Buffer::Ub, Buffer::Gm)?,
        Instruction::CopyGmToL1Nd2nz(f) => dma::plan_nd2nz(f, ops)?,
        Instruction::LoadL0a(f) => cube::plan_load2d(f, ops, Buffer::L0a),
        Instruction::LoadL0b(f) => cube::plan_load2d(f, ops, Buffer::L0b),
        Instruction::Img2colL0a(f) => cube::plan_img2col(f, ops)?,
        Instruction::CopyL0cToGm(f) => cube::plan_l0c_to_gm(f, ops),
        Instruction::Mmad(f) => cube::plan_mmad(f, ops),
        Instruction::Add(_)
        | Instruction::Sub(_)
        | Instruction::Mul(_)
        | Instruction::Div(_)
        | Instruction::Divu(_)
        | Instruction::Rem(_)
        | Instruction::Remu(_)
        | Instruction::And(_)
        | Instruction::Or(_)
        | Instruction::Xor(_)
        | Instruction::Shl(_)
        | Instruction::Shr(_)
        | Instruction::Sra(_)
        | Instruction::Min(_)
        | Instruction::Max(_)
        | Instruction::Minu(_)
        | Instruction::Maxu(_)
        | Instruction::Slt(_)
        | Instruction::Sltu(_)
        | Instruction::Seq(_)
        | Instruction::Addi(_)
        | Instruction::Muli(_)
        | Instruction::Andi(_)
        | Instruction::Ori(_)
        | Instruction::Xori(_)
        | Instruction::Shli(_)
        | Instruction::Shri(_)
        | Instruction::Srai(_)
        | Instruction::Slti(_)
        | Instruction::Movi(_)
        | Instruction::Mov(_)
        | Instruction::Ctz(_)
        | Instruction::Clz(_)
        | Instruction::Popc(_)
        | Instruction::Sreg(_)
        | Instruction::Beq(_)
        | Instruction::Bne(_)
        | Instruction::Blt(_)
        | Instruction::Bge(_)
        | Instruction::Bltu(_)
        | Instruction::Bgeu(_)
        | Instruction::Jmp(_)
        | Instruction::LoopNz(_)
        | Instruction::Ld(_)
        | Instruction::St(_)
        | Instruction::SetMask(_)
        | Instruction::SetMaskCount(_)
        | Instruction::SetFmatrix(_)
        | Instruction::SetFlag(_)
        | Instruction::WaitFlag(_)
        | Instruction::PipeBarrier(_)
        | Instruction::Nop(_)
        | Instruction::End(_) => Plan::default(),
    };
    for a in plan.accesses() {
        if a.count > 0 && a.burst > 0 {
            align(a.buffer, a.start, cfg)?;
        }
    }
    Ok(plan)
}

/// Cycles a pipe is occupied issuing an instruction of this plan (the pipe can take the next
/// instruction after this), and the extra latency until its results are visible.
pub(crate) fn local_cost(instr: &Instruction, plan: &Plan, cfg: &ChipConfig) -> (u64, u64) {
    let class = instr.spec().timing;
    match class {
        TimingClass::VecSimple
        | TimingClass::VecMul
        | TimingClass::VecDiv
        | TimingClass::VecTranscend
        | TimingClass::VecReduce
        | TimingClass::VecConv => (
            (plan.work * cfg.vector_cycles_per_repeat(class)).max(1),
            cfg.vector.latency,
        ),
        TimingClass::L0cMove => (
            plan.work
                .div_ceil(cfg.vector.l0c_to_ub_bytes_per_cycle)
                .max(1),
            cfg.vector.latency,
        ),
        TimingClass::Cube => (
            (plan.work * cfg.cube.cycles_per_fractal).max(1),
            cfg.cube.latency,
        ),
        TimingClass::Load2d => {
            let rate = match instr {
                Instruction::LoadL0b(_) => cfg.mte.l1_to_l0b_bytes_per_cycle,
                _ => cfg.mte.l1_to_l0a_bytes_per_cycle,
            };
            (plan.work.div_ceil(rate).max(1), cfg.mte.local_latency)
        }
        TimingClass::Img2col => (
            plan.work.div_ceil(cfg.mte.img2col_bytes_per_cycle).max(1),
            cfg.mte.local_latency,
        ),
        TimingClass::Alu
        | TimingClass::Mul
        | TimingClass::Div
        | TimingClass::Branch
        | TimingClass::ScalarMem
        | TimingClass::Spr
        | TimingClass::DmaRead
        | TimingClass::DmaWrite
        | TimingClass::Sync
        | TimingClass::End => (1, 0),
    }
}

/// Whether an instruction moves data through the shared memory system (and so must wait for
/// global time order).
pub(crate) fn uses_gm(instr: &Instruction) -> bool {
    matches!(
        instr.spec().timing,
        TimingClass::DmaRead | TimingClass::DmaWrite
    )
}

/// Which pipes move data out of the core (their rate cap is the write cap).
pub(crate) fn gm_rate_cap(pipe: Pipe, cfg: &ChipConfig) -> u64 {
    let per_cycle = match pipe {
        Pipe::Mte3 => cfg.mte.gm_write_bytes_per_cycle,
        Pipe::Fix => cfg.mte.fix_write_bytes_per_cycle,
        _ => cfg.mte.gm_read_bytes_per_cycle,
    };
    cfg.core_clock().bytes_per_second(per_cycle)
}

/// Applies an instruction's effect on real values (full mode only).
pub(crate) fn execute(
    instr: &Instruction,
    ops: &Operands,
    bufs: &mut Buffers,
    mem: &mut DeviceMemory,
) -> Result<(), Fault> {
    match instr {
        Instruction::Vadd(f) => vector::bin(bufs, f, ops, vector::Bin::Add),
        Instruction::Vsub(f) => vector::bin(bufs, f, ops, vector::Bin::Sub),
        Instruction::Vmul(f) => vector::bin(bufs, f, ops, vector::Bin::Mul),
        Instruction::Vdiv(f) => vector::bin(bufs, f, ops, vector::Bin::Div),
        Instruction::Vmax(f) => vector::bin(bufs, f, ops, vector::Bin::Max),
        Instruction::Vmin(f) => vector::bin(bufs, f, ops, vector::Bin::Min),
        Instruction::Vand(f) => vector::bin(bufs, f, ops, vector::Bin::And),
        Instruction::Vor(f) => vector::bin(bufs, f, ops, vector::Bin::Or),
        Instruction::Vmla(f) => vector::bin(bufs, f, ops, vector::Bin::Mla),
        Instruction::Vabs(f) => vector::un(bufs, f, ops, vector::Un::Abs),
        Instruction::Vrelu(f) => vector::un(bufs, f, ops, vector::Un::Relu),
        Instruction::Vexp(f) => vector::un(bufs, f, ops, vector::Un::Exp),
        Instruction::Vln(f) => vector::un(bufs, f, ops, vector::Un::Ln),
        Instruction::Vsqrt(f) => vector::un(bufs, f, ops, vector::Un::Sqrt),
        Instruction::Vrsqrt(f) => vector::un(bufs, f, ops, vector::Un::Rsqrt),
        Instruction::Vrec(f) => vector::un(bufs, f, ops, vector::Un::Rec),
        Instruction::Vnot(f) => vector::un(bufs, f, ops, vector::Un::Not),
        Instruction::Vmov(f) => vector::un(bufs, f, ops, vector::Un::Mov),
        Instruction::Vadds(f) => vector::scalar_op(bufs, f, ops, vector::Bin::Add),
        Instruction::Vmuls(f) => vector::scalar_op(bufs, f, ops, vector::Bin::Mul),
        Instruction::Vmaxs(f) => vector::scalar_op(bufs, f, ops, vector::Bin::Max),
        Instruction::Vmins(f) => vector::scalar_op(bufs, f, ops, vector::Bin::Min),
        Instruction::Vdup(f) => vector::dup(bufs, f, ops),
        Instruction::Vconv(f) => vector::conv(bufs, f, ops),
        Instruction::Vcmp(f) => vector::cmp(bufs, f, ops),
        Instruction::Vcmps(f) => vector::cmps(bufs, f, ops),
        Instruction::Vsel(f) => vector::sel(bufs, f, ops),
        Instruction::Vreduce(f) => vector::reduce(bufs, f, ops, false),
        Instruction::Vbreduce(f) => vector::reduce(bufs, f, ops, true),
        Instruction::CopyL0cToUb(f) => cube::l0c_to_ub(bufs, f, ops),
        Instruction::CopyGmToUb(f) => dma::burst(bufs, mem, f, ops, Buffer::Gm, Buffer::Ub),
        Instruction::CopyUbToGm(f) => dma::burst(bufs, mem, f, ops, Buffer::Ub, Buffer::Gm),
        Instruction::CopyGmToL1(f) => dma::burst(bufs, mem, f, ops, Buffer::Gm, Buffer::L1),
        Instruction::CopyGmToUbPad(f) => dma::pad(bufs, mem, f, ops, Buffer::Gm, Buffer::Ub),
        Instruction::CopyUbToGmPad(f) => dma::pad(bufs, mem, f, ops, Buffer::Ub, Buffer::Gm),
        Instruction::CopyGmToL1Nd2nz(f) => dma::nd2nz(bufs, mem, f, ops),
        Instruction::LoadL0a(f) => cube::load2d(bufs, f, ops, Buffer::L0a),
        Instruction::LoadL0b(f) => cube::load2d(bufs, f, ops, Buffer::L0b),
        Instruction::Img2colL0a(f) => cube::img2col(bufs, f, ops),
        Instruction::CopyL0cToGm(f) => cube::l0c_to_gm(bufs, mem, f, ops),
        Instruction::Mmad(f) => cube::mmad(bufs, f, ops),
        Instruction::Add(_)
        | Instruction::Sub(_)
        | Instruction::Mul(_)
        | Instruction::Div(_)
        | Instruction::Divu(_)
        | Instruction::Rem(_)
        | Instruction::Remu(_)
        | Instruction::And(_)
        | Instruction::Or(_)
        | Instruction::Xor(_)
        | Instruction::Shl(_)
        | Instruction::Shr(_)
        | Instruction::Sra(_)
        | Instruction::Min(_)
        | Instruction::Max(_)
        | Instruction::Minu(_)
        | Instruction::Maxu(_)
        | Instruction::Slt(_)
        | Instruction::Sltu(_)
        | Instruction::Seq(_)
        | Instruction::Addi(_)
        | Instruction::Muli(_)
        | Instruction::Andi(_)
        | Instruction::Ori(_)
        | Instruction::Xori(_)
        | Instruction::Shli(_)
        | Instruction::Shri(_)
        | Instruction::Srai(_)
        | Instruction::Slti(_)
        | Instruction::Movi(_)
        | Instruction::Mov(_)
        | Instruction::Ctz(_)
        | Instruction::Clz(_)
        | Instruction::Popc(_)
        | Instruction::Sreg(_)
        | Instruction::Beq(_)
        | Instruction::Bne(_)
        | Instruction::Blt(_)
        | Instruction::Bge(_)
        | Instruction::Bltu(_)
        | Instruction::Bgeu(_)
        | Instruction::Jmp(_)
        | Instruction::LoopNz(_)
        | Instruction::Ld(_)
        | Instruction::St(_)
        | Instruction::SetMask(_)
        | Instruction::SetMaskCount(_)
        | Instruction::SetFmatrix(_)
        | Instruction::SetFlag(_)
        | Instruction::WaitFlag(_)
        | Instruction::PipeBarrier(_)
        | Instruction::Nop(_)
        | Instruction::End(_) => Ok(()),
    }
}
