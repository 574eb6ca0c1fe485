//! What each pipe instruction touches, costs and does.
//!
//! For every dispatched instruction the core first builds a [`Plan`]: the memory ranges it reads
//! and writes (checked for bounds and alignment in both modes), and the amount of work that sets
//! its cost (repeats, fractals, bytes). Only in full mode does it then [`execute`] the
//! instruction's effect on real values. Timing depends on the plan alone, which is why a
//! timing-only run has exactly the timeline of a full run.

mod cube;
mod dma;
pub mod scalar;
mod vector;

use gearsim_isa::{
    DType, Dma, DmaPad, FMatrix, Img2col, Instruction, L0cFill, L0cToGm, L0cToUb, Load2d,
    LoadImage, Mmad, Nd2Nz, Pipe, TimingClass, VBin, VCmp, VCmpS, VConv, VDup, VGather, VReduce,
    VScalar, VSel, VTrans, VUn,
};

use crate::config::ChipConfig;
use crate::core::buffers::Buffers;
use crate::memory::GmValues;
use crate::stop::{Buffer, StopReason};

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

impl Fault {
    /// The stop this fault is on `core`'s `pipe` at `pc`.
    pub(crate) fn stop_reason(self, core: u32, pipe: gearsim_isa::Pipe, pc: u32) -> StopReason {
        match self {
            Fault::Range {
                buffer,
                addr,
                len,
                size,
            } => StopReason::MemoryFault {
                core,
                pipe,
                pc,
                buffer,
                addr,
                len,
                size,
            },
            Fault::Align {
                buffer,
                addr,
                align,
            } => StopReason::Misaligned {
                core,
                pipe,
                pc,
                buffer,
                addr,
                align,
            },
            Fault::Illegal(reason) => StopReason::IllegalInstruction {
                core,
                pipe,
                pc,
                reason,
            },
        }
    }
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

impl From<MaskState> for Mask {
    #[inline]
    fn from(m: MaskState) -> Mask {
        match m {
            MaskState::Normal(bits) => Mask::Normal(bits),
            MaskState::Counter(n) => Mask::Counter(n),
        }
    }
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

/// The f32 value of f16 `bits`, exactly (NaNs keep sign and payload with the quiet bit set).
/// The same bits as `half::f16::to_f32` (a test compares all 65536 inputs), written out so that
/// it inlines into the element loops instead of being a call per element.
#[inline]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exp = u32::from(bits >> 10) & 0x1f;
    let man = u32::from(bits & 0x3ff);
    match exp {
        0x1f if man == 0 => f32::from_bits(sign | 0x7f80_0000),
        0x1f => f32::from_bits(sign | 0x7fc0_0000 | (man << 13)),
        // Zero and subnormals: man * 2^-24, exact in f32.
        0 => {
            let v = man as f32 * (1.0 / 16_777_216.0);
            if sign != 0 { -v } else { v }
        }
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// Widens the little-endian f16 values of `bytes` into `out` (as many as it holds).
#[allow(unsafe_code)]
pub(crate) fn widen_f16(bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the host has AVX-512F (checked just above).
            return unsafe { widen_f16_avx512(bytes, out) };
        }
        if std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: the host has F16C, and so AVX (checked just above).
            return unsafe { widen_f16_f16c(bytes, out) };
        }
    }
    widen_f16_portable(bytes, out);
}

/// [`widen_f16`] 8 values at a time with F16C's `vcvtph2ps` straight from the bytes (the
/// instruction `half` uses, without its copy through an array of halves).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[allow(unsafe_code)]
fn widen_f16_f16c(bytes: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    let whole = (bytes.len() / 16).min(out.len() / 8);
    for (src, dst) in bytes
        .chunks_exact(16)
        .zip(out.chunks_exact_mut(8))
        .take(whole)
    {
        // SAFETY: `src` is 16 bytes and `dst` 8 floats (`chunks_exact`), the sizes the
        // unaligned load and store touch; x86 is little-endian, so the bytes are the halves.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().cast::<__m128i>());
            _mm256_storeu_ps(dst.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
    // The tail, under 8 values, one at a time (no buffer to fill for it).
    for (c, o) in bytes[whole * 16..]
        .chunks_exact(2)
        .zip(&mut out[whole * 8..])
    {
        *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// [`widen_f16`] through `half`'s slice conversion (the host's F16C where it has it).
fn widen_f16_portable(bytes: &[u8], out: &mut [f32]) {
    use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
    if bytes.len() < 2 || out.is_empty() {
        return;
    }
    // One fractal at a time through a buffer on the stack (no second allocation).
    let mut bits = [0u16; 256];
    for (chunk, dst) in bytes.chunks(512).zip(out.chunks_mut(256)) {
        let n = chunk.len() / 2;
        for (b, c) in bits[..n].iter_mut().zip(chunk.chunks_exact(2)) {
            *b = u16::from_le_bytes([c[0], c[1]]);
        }
        let halves: &[half::f16] = bits[..n].reinterpret_cast();
        halves.convert_to_f32_slice(&mut dst[..n]);
    }
}

/// [`widen_f16`] 16 values at a time with AVX-512's `vcvtph2ps`, the instruction `half` uses
/// 8 at a time (the tail, under 16 values, through [`widen_f16_portable`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn widen_f16_avx512(bytes: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
    let whole = (bytes.len() / 32).min(out.len() / 16);
    for (src, dst) in bytes
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(16))
        .take(whole)
    {
        // SAFETY: `src` is 32 bytes and `dst` 16 floats (`chunks_exact`), the sizes the
        // unaligned load and store touch; x86 is little-endian, so the bytes are the halves.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().cast::<__m256i>());
            _mm512_storeu_ps(dst.as_mut_ptr(), _mm512_cvtph_ps(h));
        }
    }
    widen_f16_portable(&bytes[whole * 32..], &mut out[whole * 16..]);
}

/// Narrows `values` to f16 to nearest even into `out` as little-endian halves (as many as it
/// holds), with the bits of `f16::from_f32` (`half`'s slice conversion: the host's F16C
/// where it has it).
#[allow(unsafe_code)]
pub(crate) fn narrow_f16(values: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: the host has F16C, and so AVX (checked just above).
            return unsafe { narrow_f16_f16c(values, out) };
        }
    }
    narrow_f16_portable(values, out);
}

/// [`narrow_f16`] 8 values at a time with F16C's `vcvtps2ph` to nearest even (the
/// instruction and rounding `half` uses), stored straight into the bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
#[allow(unsafe_code)]
fn narrow_f16_f16c(values: &[f32], out: &mut [u8]) {
    use std::arch::x86_64::{
        __m128i, _MM_FROUND_TO_NEAREST_INT, _mm_storeu_si128, _mm256_cvtps_ph, _mm256_loadu_ps,
    };
    let whole = (values.len() / 8).min(out.len() / 16);
    for (src, dst) in values
        .chunks_exact(8)
        .zip(out.chunks_exact_mut(16))
        .take(whole)
    {
        // SAFETY: `src` is 8 floats and `dst` 16 bytes (`chunks_exact`), the sizes the
        // unaligned load and store touch; x86 is little-endian, so the halves are the bytes.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr()));
            _mm_storeu_si128(dst.as_mut_ptr().cast::<__m128i>(), h);
        }
    }
    // The tail, under 8 values, one at a time (no buffer to fill for it).
    for (v, o) in values[whole * 8..]
        .iter()
        .zip(out[whole * 16..].chunks_exact_mut(2))
    {
        o.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
    }
}

/// [`narrow_f16`] through `half`'s slice conversion.
fn narrow_f16_portable(values: &[f32], out: &mut [u8]) {
    use half::slice::HalfFloatSliceExt;
    if values.is_empty() || out.len() < 2 {
        return;
    }
    let mut halves = [half::f16::ZERO; 256];
    for (v, o) in values.chunks(256).zip(out.chunks_mut(512)) {
        let n = v.len().min(o.len() / 2);
        halves[..n].convert_from_f32_slice(&v[..n]);
        for (h, b) in halves[..n].iter().zip(o.chunks_exact_mut(2)) {
            b.copy_from_slice(&h.to_bits().to_le_bytes());
        }
    }
}

/// Elements per vector repeat for an element size.
pub(crate) fn elems_per_repeat(widest: DType) -> u64 {
    gearsim_isa::units::REPEAT_BYTES / widest.size() as u64
}

fn align(buffer: Buffer, addr: u64, cfg: &ChipConfig) -> Result<(), Fault> {
    let a = match buffer {
        Buffer::Gm => 1,
        Buffer::Ub => cfg.core.ub_align,
        Buffer::L1 => cfg.core.l1_align,
        Buffer::L0a => cfg.core.l0a_align,
        Buffer::L0b => cfg.core.l0b_align,
        Buffer::L0c => cfg.core.l0c_align,
        Buffer::Bt => cfg.core.bt_align,
        Buffer::Fb => cfg.core.fb_align,
    };
    if !addr.is_multiple_of(a) {
        Err(Fault::Align {
            buffer,
            addr,
            align: a,
        })
    } else {
        Ok(())
    }
}

/// A pipe instruction with its operand layout and the operation it performs: the one place
/// that sorts every instruction into "executed by the scalar unit" or "dispatched to a pipe".
#[derive(Debug, Clone, Copy)]
pub(crate) enum PipeOp<'a> {
    Bin(&'a VBin, vector::Bin),
    Un(&'a VUn, vector::Un),
    Scalar(&'a VScalar, vector::Bin),
    Dup(&'a VDup),
    Conv(&'a VConv),
    Cmp(&'a VCmp),
    Cmps(&'a VCmpS),
    Sel(&'a VSel),
    Gather(&'a VGather),
    Trans(&'a VTrans),
    Reduce(&'a VReduce, bool),
    L0cToUb(&'a L0cToUb),
    L0cFill(&'a L0cFill),
    L1Fill(&'a L0cFill),
    Burst(&'a Dma, Buffer, Buffer),
    Pad(&'a DmaPad, Buffer, Buffer),
    Nd2nz(&'a Nd2Nz),
    Image(&'a LoadImage),
    Load2d(&'a Load2d, Buffer),
    Img2col(&'a Img2col),
    L0cToGm(&'a L0cToGm),
    L0cToGmNz(&'a L0cToUb),
    L0cToL1(&'a L0cToUb),
    Mmad(&'a Mmad),
    /// `set_flag`, `wait_flag`, `pipe_barrier`, `cross_set`, `cross_wait`: handled by the pipe
    /// itself.
    Sync,
}

impl<'a> PipeOp<'a> {
    /// The pipe operation of an instruction, or `None` if the scalar unit executes it.
    pub(crate) fn of(instr: &'a Instruction) -> Option<PipeOp<'a>> {
        use vector::{Bin, Un};
        Some(match instr {
            Instruction::Vadd(f) => PipeOp::Bin(f, Bin::Add),
            Instruction::Vsub(f) => PipeOp::Bin(f, Bin::Sub),
            Instruction::Vmul(f) => PipeOp::Bin(f, Bin::Mul),
            Instruction::Vdiv(f) => PipeOp::Bin(f, Bin::Div),
            Instruction::Vmax(f) => PipeOp::Bin(f, Bin::Max),
            Instruction::Vmin(f) => PipeOp::Bin(f, Bin::Min),
            Instruction::Vand(f) => PipeOp::Bin(f, Bin::And),
            Instruction::Vor(f) => PipeOp::Bin(f, Bin::Or),
            Instruction::Vmla(f) => PipeOp::Bin(f, Bin::Mla),
            Instruction::Vabs(f) => PipeOp::Un(f, Un::Abs),
            Instruction::Vrelu(f) => PipeOp::Un(f, Un::Relu),
            Instruction::Vexp(f) => PipeOp::Un(f, Un::Exp),
            Instruction::Vln(f) => PipeOp::Un(f, Un::Ln),
            Instruction::Vsqrt(f) => PipeOp::Un(f, Un::Sqrt),
            Instruction::Vrsqrt(f) => PipeOp::Un(f, Un::Rsqrt),
            Instruction::Vrec(f) => PipeOp::Un(f, Un::Rec),
            Instruction::Vnot(f) => PipeOp::Un(f, Un::Not),
            Instruction::Vmov(f) => PipeOp::Un(f, Un::Mov),
            Instruction::Vadds(f) => PipeOp::Scalar(f, Bin::Add),
            Instruction::Vmuls(f) => PipeOp::Scalar(f, Bin::Mul),
            Instruction::Vmaxs(f) => PipeOp::Scalar(f, Bin::Max),
            Instruction::Vmins(f) => PipeOp::Scalar(f, Bin::Min),
            Instruction::Vdup(f) => PipeOp::Dup(f),
            Instruction::Vconv(f) => PipeOp::Conv(f),
            Instruction::Vcmp(f) => PipeOp::Cmp(f),
            Instruction::Vcmps(f) => PipeOp::Cmps(f),
            Instruction::Vsel(f) => PipeOp::Sel(f),
            Instruction::Vgather(f) => PipeOp::Gather(f),
            Instruction::Vtranspose(f) => PipeOp::Trans(f),
            Instruction::Vreduce(f) => PipeOp::Reduce(f, false),
            Instruction::Vbreduce(f) => PipeOp::Reduce(f, true),
            Instruction::CopyL0cToUb(f) => PipeOp::L0cToUb(f),
            Instruction::BroadcastUbToL0c(f) => PipeOp::L0cFill(f),
            Instruction::BroadcastL1ToL0c(f) => PipeOp::L1Fill(f),
            Instruction::CopyGmToUb(f) => PipeOp::Burst(f, Buffer::Gm, Buffer::Ub),
            Instruction::CopyUbToGm(f) => PipeOp::Burst(f, Buffer::Ub, Buffer::Gm),
            Instruction::CopyGmToL1(f) => PipeOp::Burst(f, Buffer::Gm, Buffer::L1),
            Instruction::CopyGmToUbPad(f) => PipeOp::Pad(f, Buffer::Gm, Buffer::Ub),
            Instruction::CopyUbToGmPad(f) => PipeOp::Pad(f, Buffer::Ub, Buffer::Gm),
            Instruction::CopyGmToL1Nd2nz(f) => PipeOp::Nd2nz(f),
            Instruction::LoadImageL1(f) => PipeOp::Image(f),
            Instruction::LoadL0a(f) => PipeOp::Load2d(f, Buffer::L0a),
            Instruction::LoadL0b(f) => PipeOp::Load2d(f, Buffer::L0b),
            Instruction::Img2colL0a(f) => PipeOp::Img2col(f),
            Instruction::CopyL0cToGm(f) => PipeOp::L0cToGm(f),
            Instruction::CopyL0cToGmNz(f) => PipeOp::L0cToGmNz(f),
            Instruction::CopyL1ToFb(f) => PipeOp::Burst(f, Buffer::L1, Buffer::Fb),
            Instruction::CopyL0cToL1(f) => PipeOp::L0cToL1(f),
            Instruction::Mmad(f) => PipeOp::Mmad(f),
            Instruction::SetFlag(_)
            | Instruction::WaitFlag(_)
            | Instruction::PipeBarrier(_)
            | Instruction::CrossCoreSetFlag(_)
            | Instruction::CrossCoreWaitFlag(_) => PipeOp::Sync,
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
            | Instruction::Nop(_)
            | Instruction::End(_) => return None,
        })
    }

    /// The registers read when the instruction is dispatched (addresses, then scalar operand).
    pub(crate) fn capture(self, r: &[u64; 32]) -> [u64; 4] {
        let g = |x: gearsim_isa::Reg| r[x.index()];
        match self {
            PipeOp::Bin(f, _) => [g(f.dst), g(f.src0), g(f.src1), 0],
            PipeOp::Un(f, _) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Scalar(f, _) => [g(f.dst), g(f.src), g(f.scalar), 0],
            PipeOp::Dup(f) => [g(f.dst), g(f.scalar), 0, 0],
            PipeOp::Conv(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Cmp(f) => [g(f.dst), g(f.src0), g(f.src1), 0],
            PipeOp::Cmps(f) => [g(f.dst), g(f.src), g(f.scalar), 0],
            PipeOp::Sel(f) => [g(f.dst), g(f.src0), g(f.src1), g(f.sel)],
            PipeOp::Gather(f) => [g(f.dst), g(f.src), g(f.pattern), 0],
            PipeOp::Trans(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Reduce(f, _) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::L0cToUb(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::L0cFill(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::L1Fill(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Burst(f, ..) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Pad(f, ..) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Nd2nz(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Image(f) => [g(f.dst), g(f.src), g(f.cfg), 0],
            PipeOp::Load2d(f, _) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Img2col(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::L0cToGm(f) => [g(f.dst), g(f.src), g(f.scale), 0],
            PipeOp::L0cToGmNz(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::L0cToL1(f) => [g(f.dst), g(f.src), 0, 0],
            PipeOp::Mmad(f) => [g(f.dst), g(f.a), g(f.b), 0],
            PipeOp::Sync => [0; 4],
        }
    }

    /// What the instruction touches and how much work it is.
    pub(crate) fn plan(self, ops: &Operands, cfg: &ChipConfig) -> Result<Plan, Fault> {
        let plan = match self {
            PipeOp::Bin(f, _) => vector::plan_bin(f, ops),
            PipeOp::Un(f, _) => vector::plan_un(f, ops),
            PipeOp::Scalar(f, _) => vector::plan_scalar(f, ops),
            PipeOp::Dup(f) => vector::plan_dup(f, ops),
            PipeOp::Conv(f) => vector::plan_conv(f, ops),
            PipeOp::Cmp(f) => vector::plan_cmp(f, ops),
            PipeOp::Cmps(f) => vector::plan_cmps(f, ops),
            PipeOp::Sel(f) => vector::plan_sel(f, ops),
            PipeOp::Gather(f) => vector::plan_gather(f, ops),
            PipeOp::Trans(f) => vector::plan_transpose(f, ops),
            PipeOp::Reduce(f, per_block) => vector::plan_reduce(f, ops, per_block),
            PipeOp::L0cToUb(f) => cube::plan_l0c_to_ub(f, ops),
            PipeOp::L0cFill(f) => cube::plan_l0c_fill(f, ops),
            PipeOp::L1Fill(f) => cube::plan_l1_fill(f, ops),
            PipeOp::Burst(f, from, to) => dma::plan_burst(f, ops, from, to)?,
            PipeOp::Pad(f, from, to) => dma::plan_pad(f, ops, from, to)?,
            PipeOp::Nd2nz(f) => dma::plan_nd2nz(f, ops)?,
            PipeOp::Image(f) => dma::plan_image(f, ops)?,
            PipeOp::Load2d(f, to) => cube::plan_load2d(f, ops, to),
            PipeOp::Img2col(f) => cube::plan_img2col(f, ops)?,
            PipeOp::L0cToGm(f) => cube::plan_l0c_to_gm(f, ops),
            PipeOp::L0cToGmNz(f) => cube::plan_l0c_to_gm_nz(f, ops),
            PipeOp::L0cToL1(f) => cube::plan_l0c_to_l1(f, ops),
            PipeOp::Mmad(f) => cube::plan_mmad(f, ops),
            PipeOp::Sync => Plan::default(),
        };
        for a in plan.accesses() {
            if a.count > 0 && a.burst > 0 {
                align(a.buffer, a.start, cfg)?;
            }
        }
        Ok(plan)
    }

    /// Whether executing the instruction reads a configuration block from device memory whose
    /// contents can make it fault (`load_image_l1`): its effect is applied when it issues, so
    /// that the fault stops the core at the right time.
    pub(crate) fn reads_own_configuration(self) -> bool {
        matches!(self, PipeOp::Image(_))
    }

    /// Applies the effect on real values (full mode only).
    pub(crate) fn execute(
        self,
        ops: &Operands,
        bufs: &mut Buffers,
        mem: &mut impl GmValues,
    ) -> Result<(), Fault> {
        match self {
            PipeOp::Bin(f, op) => vector::bin(bufs, f, ops, op),
            PipeOp::Un(f, op) => vector::un(bufs, f, ops, op),
            PipeOp::Scalar(f, op) => vector::scalar_op(bufs, f, ops, op),
            PipeOp::Dup(f) => vector::dup(bufs, f, ops),
            PipeOp::Conv(f) => vector::conv(bufs, f, ops),
            PipeOp::Cmp(f) => vector::cmp(bufs, f, ops),
            PipeOp::Cmps(f) => vector::cmps(bufs, f, ops),
            PipeOp::Sel(f) => vector::sel(bufs, f, ops),
            PipeOp::Gather(f) => vector::gather(bufs, f, ops),
            PipeOp::Trans(f) => vector::transpose(bufs, f, ops),
            PipeOp::Reduce(f, per_block) => vector::reduce(bufs, f, ops, per_block),
            PipeOp::L0cToUb(f) => cube::l0c_to_ub(bufs, f, ops),
            PipeOp::L0cFill(f) => cube::l0c_fill(bufs, f, ops),
            PipeOp::L1Fill(f) => cube::l1_fill(bufs, f, ops),
            PipeOp::Burst(f, from, to) => dma::burst(bufs, mem, f, ops, from, to),
            PipeOp::Pad(f, from, to) => dma::pad(bufs, mem, f, ops, from, to),
            PipeOp::Nd2nz(f) => dma::nd2nz(bufs, mem, f, ops),
            PipeOp::Image(f) => dma::image(bufs, mem, f, ops),
            PipeOp::Load2d(f, to) => cube::load2d(bufs, f, ops, to),
            PipeOp::Img2col(f) => cube::img2col(bufs, f, ops),
            PipeOp::L0cToGm(f) => cube::l0c_to_gm(bufs, mem, f, ops),
            PipeOp::L0cToGmNz(f) => cube::l0c_to_gm_nz(bufs, mem, f, ops),
            PipeOp::L0cToL1(f) => cube::l0c_to_l1(bufs, f, ops),
            PipeOp::Mmad(f) => cube::mmad(bufs, f, ops),
            PipeOp::Sync => Ok(()),
        }
    }
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
            // The rate is the destination's: the plan writes L0A or L0B.
            let to_l0b = plan
                .accesses()
                .iter()
                .any(|a| a.write && a.buffer == Buffer::L0b);
            let rate = if to_l0b {
                cfg.mte.l1_to_l0b_bytes_per_cycle
            } else {
                cfg.mte.l1_to_l0a_bytes_per_cycle
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

/// A memory range a pipe instruction touches (for static analysis such as the compiler's
/// verifier): bytes `start..end` of `buffer`, touched `count` times `stride` apart from
/// `start` in bursts of `burst` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Touch {
    /// The memory.
    pub buffer: Buffer,
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
    /// Whether the instruction writes it.
    pub write: bool,
}

/// The vector mask an instruction is dispatched with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskState {
    /// Bit `i` enables element `i` of every repeat.
    Normal(u128),
    /// Counter mode: the instruction processes this many elements.
    Counter(u64),
}

/// What a pipe instruction touches, given the scalar registers when it is dispatched, the
/// vector mask and the img2col geometry: the same planning the cores use, so a static check
/// and a run agree. `None` for an instruction the scalar unit executes itself; `Err` for a
/// fault the instruction raises whatever the buffer sizes (misalignment, illegal operands).
pub fn touches(
    instr: &Instruction,
    regs: &[u64; 32],
    mask: MaskState,
    fmatrix: FMatrix,
    cfg: &ChipConfig,
) -> Option<Result<Vec<Touch>, String>> {
    let op = PipeOp::of(instr)?;
    let ops = Operands {
        regs: op.capture(regs),
        mask: Mask::from(mask),
        fmatrix,
    };
    Some(match op.plan(&ops, cfg) {
        Ok(plan) => Ok(plan
            .accesses()
            .iter()
            .filter(|a| a.count > 0 && a.burst > 0)
            .map(|a| Touch {
                buffer: a.buffer,
                start: a.start,
                end: a.end(),
                write: a.write,
            })
            .collect()),
        Err(Fault::Range {
            buffer,
            addr,
            len,
            size,
        }) => Err(format!(
            "{buffer} range {addr:#x}+{len} is outside the {size}-byte buffer"
        )),
        Err(Fault::Align {
            buffer,
            addr,
            align,
        }) => Err(format!(
            "{buffer} address {addr:#x} is not {align}-byte aligned"
        )),
        Err(Fault::Illegal(reason)) => Err(reason),
    })
}

#[cfg(test)]
mod tests {
    /// A widening path, as the tests call it.
    type Widen = fn(&[u8], &mut [f32]);
    /// A narrowing path, as the tests call it.
    type Narrow = fn(&[f32], &mut [u8]);

    /// Every widening path gives `f16_to_f32`'s bits for all 65536 halves (NaNs included).
    #[test]
    fn f16_widening_paths_give_the_bits_of_the_scalar_conversion() {
        let bytes: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        // 65536 values and a 9-value tail, so the vector path's remainder is exercised.
        let mut with_tail = bytes.clone();
        with_tail.extend_from_slice(&bytes[..18]);
        let mut paths: Vec<Widen> = vec![super::widen_f16, super::widen_f16_portable];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") {
            #[allow(unsafe_code)]
            // SAFETY: the host has F16C (checked just above).
            paths.push(|b, o| unsafe { super::widen_f16_f16c(b, o) });
        }
        for widen in paths {
            // The whole list, and short prefixes (every length of a vector path's tail).
            for n in (0..34).chain([with_tail.len() / 2]) {
                let mut out = vec![0f32; n];
                widen(&with_tail[..2 * n], &mut out);
                for (i, v) in out.iter().enumerate() {
                    let bits = (i % 65536) as u16;
                    assert_eq!(
                        v.to_bits(),
                        super::f16_to_f32(bits).to_bits(),
                        "f16 bits {bits:#06x}"
                    );
                }
            }
        }
    }

    /// Every narrowing path gives the bits of `half`'s software conversion (to nearest even)
    /// for every half, every midpoint between neighbours and its two neighbouring floats,
    /// overflow, subnormals, NaNs with payloads and a spread of random floats.
    #[test]
    fn f16_narrowing_paths_give_the_bits_of_the_software_conversion() {
        let mut values: Vec<f32> = Vec::new();
        for bits in 0..=u16::MAX {
            let v = super::f16_to_f32(bits);
            values.push(v);
            let next = super::f16_to_f32(bits.wrapping_add(1));
            if v.is_finite() && next.is_finite() && (bits & 0x7fff) != 0x7bff {
                let mid = f32::from_bits((v.to_bits() + next.to_bits()) / 2);
                values.extend([
                    mid,
                    f32::from_bits(mid.to_bits() - 1),
                    f32::from_bits(mid.to_bits() + 1),
                ]);
            }
        }
        values.extend([
            65520.0,
            -65520.0,
            65519.99,
            1e9,
            f32::MIN_POSITIVE,
            1e-10,
            f32::NAN,
        ]);
        values.extend((0..22).map(|p| f32::from_bits(0x7f80_0001 | (1 << p))));
        let mut x = 0x9e37_79b9u32;
        values.extend((0..200_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            f32::from_bits(x)
        }));
        values.extend([0.1, 0.2, 0.3, -2.5e-5, 6.0e-8, -65504.0, 3.0e-8, 1.5]);
        let mut paths: Vec<Narrow> = vec![super::narrow_f16, super::narrow_f16_portable];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") {
            #[allow(unsafe_code)]
            // SAFETY: the host has F16C (checked just above).
            paths.push(|v, o| unsafe { super::narrow_f16_f16c(v, o) });
        }
        for narrow in paths {
            // The whole list, and short prefixes (every length of a vector path's tail).
            for n in (0..20).chain([values.len()]) {
                let mut out = vec![0u8; n * 2];
                narrow(&values[values.len() - n..], &mut out);
                for (v, h) in values[values.len() - n..].iter().zip(out.chunks_exact(2)) {
                    let got = u16::from_le_bytes([h[0], h[1]]);
                    let want = half::f16::from_f32_const(*v).to_bits();
                    assert_eq!(got, want, "f32 bits {:#010x}", v.to_bits());
                }
            }
        }
    }

    #[test]
    fn f16_widening_gives_the_bits_of_half_for_every_input() {
        for bits in 0..=u16::MAX {
            let want = half::f16::from_bits(bits).to_f32().to_bits();
            assert_eq!(
                super::f16_to_f32(bits).to_bits(),
                want,
                "f16 bits {bits:#06x}"
            );
        }
    }
}
