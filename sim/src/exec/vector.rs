//! Vector unit: operand addressing (repeats, blocks, strides, mask) and the element-wise
//! semantics of every vector instruction.
//!
//! Numerics: f16 operands are widened to f32 exactly, the operation is done once in f32 and
//! the result rounded to f16 with round-to-nearest-even; for add, sub, mul, div and sqrt this
//! equals a correctly rounded f16 operation. `vmla` rounds the product and the sum in f32 before
//! the final f16 rounding. exp, ln, sqrt come from the `libm` crate so results are the same on
//! every host. Integer ops wrap.

use gearsim_isa::{
    Cmp, DType, ReduceOp, Round, VBin, VCmp, VCmpS, VConv, VDup, VGather, VReduce, VScalar, VSel,
    VTrans, VUn, units,
};
use half::{bf16, f16};

use super::{
    Access, Fault, Mask, Operands, Plan, elems_per_repeat, f16_to_f32, narrow_f16, widen_f16,
};
use crate::core::buffers::Buffers;
use crate::stop::Buffer;

/// One vector operand's addressing.
#[derive(Debug, Clone, Copy)]
struct Opnd {
    base: u64,
    blk: u64,
    rep: u64,
    ty: DType,
    /// Bytes of one block (worked out once: every block address is a multiple of it).
    block_bytes: u64,
}

impl Opnd {
    fn new(base: u64, blk: u8, rep: impl Into<u64>, ty: DType, elems: u64) -> Opnd {
        Opnd {
            base,
            blk: u64::from(blk),
            rep: rep.into(),
            ty,
            block_bytes: elems / 8 * ty.size() as u64,
        }
    }

    fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    fn access(&self, repeats: u64, write: bool) -> Access {
        let len = if repeats == 0 {
            0
        } else {
            ((repeats - 1) * self.rep + 7 * self.blk + 1) * self.block_bytes()
        };
        Access::range(Buffer::Ub, self.base, len, write)
    }

    /// Address of the first element of block `b` of repeat `r`.
    #[inline]
    fn block_addr(&self, r: u64, b: u64) -> usize {
        (self.base + (r * self.rep + b * self.blk) * self.block_bytes()) as usize
    }
}

/// Evaluates `$body` with `$t` a constant of the element type `$ty`, so that the element
/// loops inside are compiled once per type with the per-element type dispatch folded away.
macro_rules! with_type {
    ($ty:expr, $t:ident => $body:expr) => {
        match $ty {
            DType::F16 => {
                const $t: DType = DType::F16;
                $body
            }
            DType::F32 => {
                const $t: DType = DType::F32;
                $body
            }
            DType::I32 => {
                const $t: DType = DType::I32;
                $body
            }
            DType::I16 => {
                const $t: DType = DType::I16;
                $body
            }
            DType::U8 => {
                const $t: DType = DType::U8;
                $body
            }
            DType::Bf16 => {
                const $t: DType = DType::Bf16;
                $body
            }
            DType::I8 => {
                const $t: DType = DType::I8;
                $body
            }
        }
    };
}

/// Bit k: whether element `blk * per_block + k` of repeat `rep` is enabled ([`enabled`] a
/// block at a time; at most 16 elements to a block, e being 64 or 128, so the bits fit a u32).
#[inline(always)]
fn block_live(mask: Mask, rep: u64, e: u64, blk: u64) -> u32 {
    let per_block = e / 8;
    let first = blk * per_block;
    let low = |n: u64| ((1u64 << n) - 1) as u32;
    match mask {
        Mask::Normal(bits) => (bits >> first) as u32 & low(per_block),
        Mask::Counter(n) => low(n.saturating_sub(rep * e + first).min(per_block)),
    }
}

/// Calls `f(repeat, element, addresses)` for every enabled element of `r` repeats of `e`
/// elements, in the order repeat by repeat, element by element, with each operand's address
/// of that element: `base + (repeat * rep + block * blk) * block bytes + index in block * size`,
/// computed a block at a time instead of with two divisions per element and operand. `f` does
/// each element's reads and write before the next element, so overlapping operands see
/// exactly the element-by-element semantics.
#[inline(always)]
fn each<const N: usize>(
    mask: Mask,
    r: u64,
    e: u64,
    ops: [&Opnd; N],
    mut f: impl FnMut(u64, u64, [usize; N]),
) {
    each_or_block(
        mask,
        r,
        e,
        ops,
        &mut (),
        |_, _| false,
        |_, rep, i, at| f(rep, i, at),
    );
}

/// [`each`], offering every block whose elements are all enabled to `whole(ctx, block
/// addresses)` first: when it returns true it has done the block itself (it must give the
/// element-by-element result), otherwise the block goes element by element through `f`.
#[inline(always)]
fn each_or_block<const N: usize, C>(
    mask: Mask,
    r: u64,
    e: u64,
    ops: [&Opnd; N],
    ctx: &mut C,
    mut whole: impl FnMut(&mut C, [usize; N]) -> bool,
    mut f: impl FnMut(&mut C, u64, u64, [usize; N]),
) {
    let per_block = e / 8;
    let all = ((1u64 << per_block) - 1) as u32;
    let sizes = ops.map(|o| o.ty.size());
    for rep in 0..r {
        for blk in 0..8 {
            let live = block_live(mask, rep, e, blk);
            if live == 0 {
                continue;
            }
            let bases = ops.map(|o| o.block_addr(rep, blk));
            if live == all && whole(ctx, bases) {
                continue;
            }
            for k in 0..per_block {
                if live >> k & 1 == 0 {
                    continue;
                }
                let at = std::array::from_fn(|n| bases[n] + k as usize * sizes[n]);
                f(ctx, rep, blk * per_block + k, at);
            }
        }
    }
}

/// An instruction's elements as runs of consecutive bytes that can be done in any order, one
/// run after another, each a span at a time: `count` runs of `len` elements, run `k` of
/// operand `n` starting at `base[n] + k * stride[n]`, except the runs whose bit is set in
/// `skip` (block positions the mask disables).
#[derive(Debug, Clone, Copy)]
struct Runs<const N: usize> {
    count: usize,
    len: usize,
    base: [usize; N],
    stride: [usize; N],
    skip: u8,
}

impl<const N: usize> Runs<N> {
    /// The runs to do, in order.
    fn done(&self) -> impl Iterator<Item = usize> + use<N> {
        let skip = self.skip;
        (0..self.count).filter(move |&k| k >= 8 || skip >> k & 1 == 0)
    }

    /// Where run `k` of each operand starts.
    fn at(&self, k: usize) -> [usize; N] {
        std::array::from_fn(|n| self.base[n] + k * self.stride[n])
    }
}

/// The [`Runs`] of an instruction whose operands are `ops` (the destination last), when the
/// order of its elements cannot change the result: the destination writing no byte twice, and
/// each source either laid out exactly as the destination (each element reads only the byte
/// it writes) or apart from everything the destination writes. The runs are
/// - the whole instruction, when blocks and repeats are back to back and every element is
///   enabled (or a counter's first `n`);
/// - one per block position, when repeats are one block apart and the mask enables whole
///   blocks (each position's blocks are then one run over the repeats);
/// - one per repeat, when blocks are back to back and every element is enabled.
///
/// Otherwise there are none and the caller goes element by element.
fn runs<const N: usize>(mask: Mask, r: u64, e: u64, ops: [&Opnd; N]) -> Option<Runs<N>> {
    let dst = ops[N - 1];
    let per_block = e / 8;
    // The block positions whose elements are all enabled in every repeat, when the mask
    // enables whole blocks only.
    let live: Option<u8> = match mask {
        Mask::Normal(_) if e <= 128 => {
            let full = u32::MAX >> (32 - per_block);
            let block = |b: u64| block_live(mask, 0, e, b);
            (0..8).all(|b| block(b) == 0 || block(b) == full).then(|| {
                (0..8)
                    .filter(|&b| block(b) == full)
                    .fold(0, |m, b| m | 1 << b)
            })
        }
        Mask::Counter(n) if n == r * e => Some(0xff),
        _ => None,
    };
    let bb = |o: &Opnd| o.block_bytes();
    let (count, len, stride, skip): (u64, u64, [u64; N], u8) =
        if ops.iter().all(|o| o.blk == 1 && o.rep == 8) {
            // One run; a counter may end inside a repeat.
            let n = match (mask, live) {
                (Mask::Counter(n), _) => n,
                (_, Some(0xff)) => r * e,
                _ => return None,
            };
            (1, n, [0; N], 0)
        } else if ops.iter().all(|o| o.rep == 1) && dst.blk >= r {
            (8, r * per_block, ops.map(|o| o.blk * bb(o)), !live?)
        } else if ops.iter().all(|o| o.blk == 1) && dst.rep >= 8 && live == Some(0xff) {
            (r, e, ops.map(|o| o.rep * bb(o)), 0)
        } else {
            return None;
        };
    if count == 0 || len == 0 {
        return None;
    }
    // Every byte an operand's runs can touch, from its first to its last.
    let span = |i: usize| {
        let o = ops[i];
        let end = o.base + (count - 1) * stride[i] + len * o.ty.size() as u64;
        (o.base, end)
    };
    let (dlo, dhi) = span(N - 1);
    let order_free = (0..N - 1).all(|i| {
        let o = ops[i];
        let same = o.base == dst.base && o.blk == dst.blk && o.rep == dst.rep && o.ty == dst.ty;
        let (lo, hi) = span(i);
        same || hi <= dlo || dhi <= lo
    });
    if !order_free {
        return None;
    }
    Some(Runs {
        count: usize::try_from(count).ok()?,
        len: usize::try_from(len).ok()?,
        base: ops.map(|o| o.base as usize),
        stride: stride.map(|s| s as usize),
        skip,
    })
}

/// Elements a span-at-a-time float operation widens at once.
const SPAN: usize = 128;

/// Whether a block-at-a-time operation gives the element-by-element result: the source block
/// at `src` is the destination block at `dst` itself or does not overlap it (with a partial
/// overlap an element would read what an earlier element of the block has just written).
#[inline(always)]
fn same_or_apart(dst: usize, src: usize, bytes: usize) -> bool {
    src == dst || src + bytes <= dst || dst + bytes <= src
}

/// The floats of one block at `at` (as many as `out` holds), with the bits of [`ld_f`]
/// element by element (f16 through the slice conversion [`widen_f16`]).
#[inline(always)]
fn load_floats(ub: &[u8], at: usize, ty: DType, out: &mut [f32]) {
    if ty == DType::F16 {
        widen_f16(&ub[at..at + 2 * out.len()], out);
    } else if ty == DType::F32 {
        let n = out.len();
        for (x, b) in out.iter_mut().zip(ub[at..at + 4 * n].chunks_exact(4)) {
            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    } else {
        let size = ty.size();
        for (i, x) in out.iter_mut().enumerate() {
            *x = ld_f(ub, at + i * size, ty);
        }
    }
}

/// Stores one block's floats at `at` with the bits of [`st_f`] element by element.
#[inline(always)]
fn store_floats(ub: &mut [u8], at: usize, ty: DType, v: &[f32]) {
    if ty == DType::F16 {
        narrow_f16(v, &mut ub[at..at + 2 * v.len()]);
    } else if ty == DType::F32 {
        for (x, b) in v.iter().zip(ub[at..at + 4 * v.len()].chunks_exact_mut(4)) {
            b.copy_from_slice(&x.to_le_bytes());
        }
    } else {
        let size = ty.size();
        for (i, x) in v.iter().enumerate() {
            st_f(ub, at + i * size, ty, *x);
        }
    }
}

fn repeats(mask: Mask, field: u8, elems: u64) -> u64 {
    match mask {
        Mask::Normal(0) => 0,
        Mask::Normal(_) => u64::from(field),
        Mask::Counter(n) => n.div_ceil(elems),
    }
}

#[inline(always)]
fn enabled(mask: Mask, r: u64, i: u64, elems: u64) -> bool {
    match mask {
        Mask::Normal(bits) => (bits >> i) & 1 == 1,
        Mask::Counter(n) => r * elems + i < n,
    }
}

fn plan_of(work: u64, accesses: &[Access]) -> Plan {
    Plan::new(work, 0, accesses)
}

pub(super) fn plan_bin(f: &VBin, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, a, b, _] = ops.regs;
    plan_of(
        r,
        &[
            Opnd::new(a, f.src0_blk, f.src0_rep, f.ty, e).access(r, false),
            Opnd::new(b, f.src1_blk, f.src1_rep, f.ty, e).access(r, false),
            Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e).access(r, true),
        ],
    )
}

pub(super) fn plan_un(f: &VUn, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    plan_of(
        r,
        &[
            Opnd::new(s, f.src_blk, f.src_rep, f.ty, e).access(r, false),
            Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e).access(r, true),
        ],
    )
}

pub(super) fn plan_scalar(f: &VScalar, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    plan_of(
        r,
        &[
            Opnd::new(s, f.src_blk, f.src_rep, f.ty, e).access(r, false),
            Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e).access(r, true),
        ],
    )
}

pub(super) fn plan_dup(f: &VDup, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    plan_of(
        r,
        &[Opnd::new(ops.regs[0], f.dst_blk, f.dst_rep, f.ty, e).access(r, true)],
    )
}

fn widest(a: DType, b: DType) -> DType {
    if a.size() >= b.size() { a } else { b }
}

pub(super) fn plan_conv(f: &VConv, ops: &Operands) -> Plan {
    let e = elems_per_repeat(widest(f.dst_ty, f.src_ty));
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    plan_of(
        r,
        &[
            Opnd::new(s, f.src_blk, f.src_rep, f.src_ty, e).access(r, false),
            Opnd::new(d, f.dst_blk, f.dst_rep, f.dst_ty, e).access(r, true),
        ],
    )
}

fn bits_access(base: u64, repeats: u64, elems: u64, write: bool) -> Access {
    Access::range(Buffer::Ub, base, (repeats * elems).div_ceil(8), write)
}

pub(super) fn plan_cmp(f: &VCmp, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, a, b, _] = ops.regs;
    plan_of(
        r,
        &[
            Opnd::new(a, f.src0_blk, f.src0_rep, f.ty, e).access(r, false),
            Opnd::new(b, f.src1_blk, f.src1_rep, f.ty, e).access(r, false),
            bits_access(d, r, e, true),
        ],
    )
}

pub(super) fn plan_cmps(f: &VCmpS, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    plan_of(
        r,
        &[
            Opnd::new(s, f.src_blk, f.src_rep, f.ty, e).access(r, false),
            bits_access(d, r, e, true),
        ],
    )
}

pub(super) fn plan_sel(f: &VSel, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, a, b, s] = ops.regs;
    plan_of(
        r,
        &[
            Opnd::new(a, f.src0_blk, f.src0_rep, f.ty, e).access(r, false),
            Opnd::new(b, f.src1_blk, f.src1_rep, f.ty, e).access(r, false),
            bits_access(s, r, e, false),
            Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e).access(r, true),
        ],
    )
}

pub(super) fn plan_gather(f: &VGather, ops: &Operands) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, p, _] = ops.regs;
    // Pattern words (one bit per element of a repeat) up to the last repeat's.
    let words = if r == 0 {
        0
    } else {
        (r - 1) * u64::from(f.pat_rep) + 1
    };
    plan_of(
        r,
        &[
            Opnd::new(s, 1, f.src_rep, f.ty, e).access(r, false),
            bits_access(p, words, e, false),
            // As many elements as every repeat could select (the pattern decides how many).
            Access::range(Buffer::Ub, d, r * e * f.ty.size() as u64, true),
        ],
    )
}

pub(super) fn gather(bufs: &mut Buffers, f: &VGather, ops: &Operands) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, p, _] = ops.regs;
    let os = Opnd::new(s, 1, f.src_rep, f.ty, e);
    let size = f.ty.size();
    let per_block = e / 8;
    let ub = bufs.ub_mut();
    let mut out = d as usize;
    for rep in 0..r {
        let word = rep * u64::from(f.pat_rep) * e;
        for i in 0..e {
            if !enabled(ops.mask, rep, i, e) || !get_bit(ub, p, word + i) {
                continue;
            }
            let at = os.block_addr(rep, i / per_block) + ((i % per_block) as usize) * size;
            ub.copy_within(at..at + size, out);
            out += size;
        }
    }
    Ok(())
}

/// Rows (and columns) of a `vtranspose` block, and bytes of one of its rows: a fractal's
/// 16 rows of one 32-byte block each.
const TRANS_ROWS: u64 = units::FRACTAL_ROWS;
const TRANS_ROW_BYTES: u64 = units::BLOCK_BYTES;

/// The UB bytes `vtranspose` spans on one side: from `base` to the end of the last repeat's
/// last row (`row` and `rep` in 32-byte blocks).
fn trans_access(base: u64, repeats: u64, row: u16, rep: u16, write: bool) -> Access {
    let len = if repeats == 0 {
        0
    } else {
        ((repeats - 1) * u64::from(rep) + (TRANS_ROWS - 1) * u64::from(row) + 1) * TRANS_ROW_BYTES
    };
    Access::range(Buffer::Ub, base, len, write)
}

/// A repeat moves 512 bytes in and 512 out: two 256-byte steps of the vector datapath (an
/// assumption: VNCHWCONV's rate is not public).
pub(super) fn plan_transpose(f: &VTrans, ops: &Operands) -> Plan {
    let r = u64::from(f.repeat);
    let [d, s, _, _] = ops.regs;
    plan_of(
        2 * r,
        &[
            trans_access(s, r, f.src_row, f.src_rep, false),
            trans_access(d, r, f.dst_row, f.dst_rep, true),
        ],
    )
}

pub(super) fn transpose(bufs: &mut Buffers, f: &VTrans, ops: &Operands) -> Result<(), Fault> {
    let [d, s, _, _] = ops.regs;
    let ub = bufs.ub_mut();
    let mut block = [0u8; (TRANS_ROWS * TRANS_ROW_BYTES) as usize];
    for rep in 0..u64::from(f.repeat) {
        let src = s + rep * u64::from(f.src_rep) * TRANS_ROW_BYTES;
        let dst = d + rep * u64::from(f.dst_rep) * TRANS_ROW_BYTES;
        // The whole source block first: a destination row may overlap a source row.
        for i in 0..TRANS_ROWS {
            let at = (src + i * u64::from(f.src_row) * TRANS_ROW_BYTES) as usize;
            let row = (i * TRANS_ROW_BYTES) as usize;
            block[row..row + TRANS_ROW_BYTES as usize]
                .copy_from_slice(&ub[at..at + TRANS_ROW_BYTES as usize]);
        }
        for j in 0..TRANS_ROWS {
            let at = (dst + j * u64::from(f.dst_row) * TRANS_ROW_BYTES) as usize;
            for i in 0..TRANS_ROWS {
                let from = (i * TRANS_ROW_BYTES + 2 * j) as usize;
                ub[at + 2 * i as usize..at + 2 * i as usize + 2]
                    .copy_from_slice(&block[from..from + 2]);
            }
        }
    }
    Ok(())
}

fn reduce_results(r: u64, per_block: bool) -> u64 {
    if per_block { r * 8 } else { r }
}

pub(super) fn plan_reduce(f: &VReduce, ops: &Operands, per_block: bool) -> Plan {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    let n = reduce_results(r, per_block);
    let size = f.ty.size() as u64;
    let dst_len = if n == 0 {
        0
    } else {
        ((n - 1) * u64::from(f.dst_rep) + 1) * size
    };
    plan_of(
        r,
        &[
            Opnd::new(s, f.src_blk, f.src_rep, f.ty, e).access(r, false),
            Access::range(Buffer::Ub, d, dst_len, true),
        ],
    )
}

// ---- element access ---------------------------------------------------------------------

/// The `N` bytes at `a` (one bounds check instead of one per byte).
#[inline(always)]
fn at<const N: usize>(b: &[u8], a: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[a..a + N]);
    out
}

#[inline(always)]
fn ld_f(b: &[u8], a: usize, ty: DType) -> f32 {
    match ty {
        DType::F16 => f16_to_f32(u16::from_le_bytes(at(b, a))),
        DType::F32 => f32::from_le_bytes(at(b, a)),
        DType::I32 => i32::from_le_bytes(at(b, a)) as f32,
        DType::I16 => f32::from(i16::from_le_bytes(at(b, a))),
        DType::U8 => f32::from(b[a]),
        DType::Bf16 => bf16::from_bits(u16::from_le_bytes(at(b, a))).to_f32(),
        DType::I8 => f32::from(b[a] as i8),
    }
}

#[inline(always)]
fn st_f(b: &mut [u8], a: usize, ty: DType, v: f32) {
    match ty {
        DType::F16 => b[a..a + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
        DType::F32 => b[a..a + 4].copy_from_slice(&v.to_le_bytes()),
        DType::I32 => b[a..a + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I16 => b[a..a + 2].copy_from_slice(&(v as i16).to_le_bytes()),
        DType::U8 => b[a] = v as u8,
        DType::Bf16 => b[a..a + 2].copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
        DType::I8 => b[a] = (v as i8) as u8,
    }
}

#[inline(always)]
fn ld_i(b: &[u8], a: usize, ty: DType) -> i64 {
    match ty {
        DType::I32 | DType::F32 => i64::from(i32::from_le_bytes(at(b, a))),
        DType::I16 | DType::F16 | DType::Bf16 => i64::from(i16::from_le_bytes(at(b, a))),
        DType::U8 => i64::from(b[a]),
        DType::I8 => i64::from(b[a] as i8),
    }
}

#[inline(always)]
fn st_i(b: &mut [u8], a: usize, ty: DType, v: i64) {
    match ty {
        DType::I32 | DType::F32 => b[a..a + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        DType::I16 | DType::F16 | DType::Bf16 => {
            b[a..a + 2].copy_from_slice(&(v as i16).to_le_bytes())
        }
        DType::U8 | DType::I8 => b[a] = v as u8,
    }
}

fn is_float(ty: DType) -> bool {
    matches!(ty, DType::F16 | DType::F32 | DType::Bf16)
}

/// Two-operand arithmetic.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bin {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    And,
    Or,
    Mla,
}

#[inline(always)]
fn bin_f(op: Bin, a: f32, b: f32, acc: f32) -> f32 {
    match op {
        Bin::Add => a + b,
        Bin::Sub => a - b,
        Bin::Mul => a * b,
        Bin::Div => a / b,
        Bin::Max => a.max(b),
        Bin::Min => a.min(b),
        Bin::Mla => a * b + acc,
        // Bitwise ops are integer-only (the table refuses float types); keep the value.
        Bin::And | Bin::Or => a,
    }
}

/// `z[i] = bin_f(op, x[i], y[i], z[i])` for every element, with the operation chosen once
/// for the whole slice rather than per element, so each loop is a straight (vectorisable) one.
#[inline(always)]
fn bin_floats(op: Bin, z: &mut [f32], x: &[f32], y: &[f32]) {
    #[inline(always)]
    fn each(z: &mut [f32], x: &[f32], y: &[f32], f: impl Fn(f32, f32, f32) -> f32) {
        for ((z, x), y) in z.iter_mut().zip(x).zip(y) {
            *z = f(*x, *y, *z);
        }
    }
    match op {
        Bin::Add => each(z, x, y, |a, b, _| bin_f(Bin::Add, a, b, 0.0)),
        Bin::Sub => each(z, x, y, |a, b, _| bin_f(Bin::Sub, a, b, 0.0)),
        Bin::Mul => each(z, x, y, |a, b, _| bin_f(Bin::Mul, a, b, 0.0)),
        Bin::Div => each(z, x, y, |a, b, _| bin_f(Bin::Div, a, b, 0.0)),
        Bin::Max => each(z, x, y, |a, b, _| bin_f(Bin::Max, a, b, 0.0)),
        Bin::Min => each(z, x, y, |a, b, _| bin_f(Bin::Min, a, b, 0.0)),
        Bin::Mla => each(z, x, y, |a, b, acc| bin_f(Bin::Mla, a, b, acc)),
        Bin::And | Bin::Or => each(z, x, y, |a, b, acc| bin_f(op, a, b, acc)),
    }
}

#[inline(always)]
fn bin_i(op: Bin, a: i64, b: i64, acc: i64) -> i64 {
    match op {
        Bin::Add => a.wrapping_add(b),
        Bin::Sub => a.wrapping_sub(b),
        Bin::Mul => a.wrapping_mul(b),
        Bin::Div => {
            if b == 0 {
                -1
            } else {
                a.wrapping_div(b)
            }
        }
        Bin::Max => a.max(b),
        Bin::Min => a.min(b),
        Bin::And => a & b,
        Bin::Or => a | b,
        Bin::Mla => a.wrapping_mul(b).wrapping_add(acc),
    }
}

pub(super) fn bin(bufs: &mut Buffers, f: &VBin, ops: &Operands, op: Bin) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, a, b, _] = ops.regs;
    let (od, oa, ob) = (
        Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e),
        Opnd::new(a, f.src0_blk, f.src0_rep, f.ty, e),
        Opnd::new(b, f.src1_blk, f.src1_rep, f.ty, e),
    );
    let n = (e / 8) as usize;
    let bytes = n * f.ty.size();
    // A float block at a time when the sources are apart from the destination or are it.
    let block = |ub: &mut &mut [u8], [pa, pb, pd]: [usize; 3]| {
        if !is_float(f.ty) || !same_or_apart(pd, pa, bytes) || !same_or_apart(pd, pb, bytes) {
            return false;
        }
        bin_span::<16>(ub, f.ty, op, [pa, pb, pd], n);
        true
    };
    let mut ub = bufs.ub_mut();
    if is_float(f.ty)
        && let Some(runs) = runs(ops.mask, r, e, [&oa, &ob, &od])
    {
        let size = f.ty.size();
        for k in runs.done() {
            let at = runs.at(k);
            for i in (0..runs.len).step_by(SPAN) {
                let span = at.map(|p| p + i * size);
                bin_span::<SPAN>(ub, f.ty, op, span, SPAN.min(runs.len - i));
            }
        }
        return Ok(());
    }
    with_type!(f.ty, T => each_or_block(ops.mask, r, e, [&oa, &ob, &od], &mut ub, block, |ub, _, _, [pa, pb, pd]| {
        if is_float(T) {
            let acc = if matches!(op, Bin::Mla) {
                ld_f(ub, pd, T)
            } else {
                0.0
            };
            let v = bin_f(op, ld_f(ub, pa, T), ld_f(ub, pb, T), acc);
            st_f(ub, pd, T, v);
        } else {
            let acc = if matches!(op, Bin::Mla) {
                ld_i(ub, pd, T)
            } else {
                0
            };
            let v = bin_i(op, ld_i(ub, pa, T), ld_i(ub, pb, T), acc);
            st_i(ub, pd, T, v);
        }
    }));
    Ok(())
}

/// `op` on `m` (at most `CAP`) float elements from `pa` and `pb` into `pd` (Mla adds to
/// `pd`'s), widened at once: the element-by-element result when each source span is the
/// destination's or apart from it.
#[inline(always)]
fn bin_span<const CAP: usize>(
    ub: &mut [u8],
    ty: DType,
    op: Bin,
    [pa, pb, pd]: [usize; 3],
    m: usize,
) {
    let (mut x, mut y, mut z) = ([0f32; CAP], [0f32; CAP], [0f32; CAP]);
    load_floats(ub, pa, ty, &mut x[..m]);
    load_floats(ub, pb, ty, &mut y[..m]);
    if matches!(op, Bin::Mla) {
        load_floats(ub, pd, ty, &mut z[..m]);
    }
    bin_floats(op, &mut z[..m], &x[..m], &y[..m]);
    store_floats(ub, pd, ty, &z[..m]);
}

/// `op` on `m` (at most `CAP`) float elements from `ps` into `pd`, widened at once (as
/// [`bin_span`]).
#[inline(always)]
fn un_span<const CAP: usize>(ub: &mut [u8], ty: DType, op: Un, [ps, pd]: [usize; 2], m: usize) {
    let mut x = [0f32; CAP];
    load_floats(ub, ps, ty, &mut x[..m]);
    un_floats(op, &mut x[..m]);
    store_floats(ub, pd, ty, &x[..m]);
}

/// One-operand arithmetic.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Un {
    Abs,
    Relu,
    Exp,
    Ln,
    Sqrt,
    Rsqrt,
    Rec,
    Not,
    Mov,
}

#[inline(always)]
fn un_f(op: Un, x: f32) -> f32 {
    match op {
        Un::Abs => x.abs(),
        Un::Relu => {
            if x > 0.0 || x.is_nan() {
                x
            } else {
                0.0
            }
        }
        Un::Exp => libm::expf(x),
        Un::Ln => libm::logf(x),
        Un::Sqrt => libm::sqrtf(x),
        Un::Rsqrt => 1.0 / libm::sqrtf(x),
        Un::Rec => 1.0 / x,
        Un::Not | Un::Mov => x,
    }
}

/// `x[i] = un_f(op, x[i])` for every element, the operation chosen once (as [`bin_floats`]).
#[inline(always)]
fn un_floats(op: Un, x: &mut [f32]) {
    #[inline(always)]
    fn each(x: &mut [f32], f: impl Fn(f32) -> f32) {
        for v in x {
            *v = f(*v);
        }
    }
    match op {
        Un::Abs => each(x, |v| un_f(Un::Abs, v)),
        Un::Relu => each(x, |v| un_f(Un::Relu, v)),
        Un::Exp => each(x, |v| un_f(Un::Exp, v)),
        Un::Ln => each(x, |v| un_f(Un::Ln, v)),
        Un::Sqrt => each(x, |v| un_f(Un::Sqrt, v)),
        Un::Rsqrt => each(x, |v| un_f(Un::Rsqrt, v)),
        Un::Rec => each(x, |v| un_f(Un::Rec, v)),
        Un::Not | Un::Mov => {}
    }
}

#[inline(always)]
fn un_i(op: Un, x: i64) -> i64 {
    match op {
        Un::Abs => x.wrapping_abs(),
        Un::Relu => x.max(0),
        Un::Not => !x,
        Un::Mov | Un::Exp | Un::Ln | Un::Sqrt | Un::Rsqrt | Un::Rec => x,
    }
}

pub(super) fn un(bufs: &mut Buffers, f: &VUn, ops: &Operands, op: Un) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    let (od, os) = (
        Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e),
        Opnd::new(s, f.src_blk, f.src_rep, f.ty, e),
    );
    let size = f.ty.size();
    let n = (e / 8) as usize;
    let bytes = n * size;
    // A block at a time when the source is apart from the destination or is it: a move is
    // one copy, a float op goes through f32 vectors.
    let block = |ub: &mut &mut [u8], [ps, pd]: [usize; 2]| {
        if !same_or_apart(pd, ps, bytes) {
            return false;
        }
        if matches!(op, Un::Mov) {
            ub.copy_within(ps..ps + bytes, pd);
            return true;
        }
        if !is_float(f.ty) {
            return false;
        }
        un_span::<16>(ub, f.ty, op, [ps, pd], n);
        true
    };
    let mut ub = bufs.ub_mut();
    if (is_float(f.ty) || matches!(op, Un::Mov))
        && let Some(runs) = runs(ops.mask, r, e, [&os, &od])
    {
        for k in runs.done() {
            let [ps, pd] = runs.at(k);
            if matches!(op, Un::Mov) {
                ub.copy_within(ps..ps + runs.len * size, pd);
                continue;
            }
            for i in (0..runs.len).step_by(SPAN) {
                let span = [ps, pd].map(|p| p + i * size);
                un_span::<SPAN>(ub, f.ty, op, span, SPAN.min(runs.len - i));
            }
        }
        return Ok(());
    }
    with_type!(f.ty, T => each_or_block(ops.mask, r, e, [&os, &od], &mut ub, block, |ub, _, _, [ps, pd]| {
        if matches!(op, Un::Mov) {
            ub.copy_within(ps..ps + size, pd);
        } else if is_float(T) {
            let v = un_f(op, ld_f(ub, ps, T));
            st_f(ub, pd, T, v);
        } else {
            let v = un_i(op, ld_i(ub, ps, T));
            st_i(ub, pd, T, v);
        }
    }));
    Ok(())
}

fn scalar_f(ty: DType, bits: u64) -> f32 {
    match ty {
        DType::F16 => f16_to_f32(bits as u16),
        DType::F32 => f32::from_bits(bits as u32),
        DType::I32 => (bits as i32) as f32,
        DType::I16 => f32::from(bits as i16),
        DType::U8 => f32::from(bits as u8),
        DType::Bf16 => bf16::from_bits(bits as u16).to_f32(),
        DType::I8 => f32::from(bits as i8),
    }
}

fn scalar_i(ty: DType, bits: u64) -> i64 {
    match ty {
        DType::I32 | DType::F32 => i64::from(bits as i32),
        DType::I16 | DType::F16 | DType::Bf16 => i64::from(bits as i16),
        DType::U8 => i64::from(bits as u8),
        DType::I8 => i64::from(bits as i8),
    }
}

pub(super) fn scalar_op(
    bufs: &mut Buffers,
    f: &VScalar,
    ops: &Operands,
    op: Bin,
) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, k, _] = ops.regs;
    let (od, os) = (
        Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e),
        Opnd::new(s, f.src_blk, f.src_rep, f.ty, e),
    );
    let (kf, ki) = (scalar_f(f.ty, k), scalar_i(f.ty, k));
    let ub = bufs.ub_mut();
    with_type!(f.ty, T => each(ops.mask, r, e, [&os, &od], |_, _, [ps, pd]| {
        if is_float(T) {
            let v = bin_f(op, ld_f(ub, ps, T), kf, 0.0);
            st_f(ub, pd, T, v);
        } else {
            let v = bin_i(op, ld_i(ub, ps, T), ki, 0);
            st_i(ub, pd, T, v);
        }
    }));
    Ok(())
}

pub(super) fn dup(bufs: &mut Buffers, f: &VDup, ops: &Operands) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let od = Opnd::new(ops.regs[0], f.dst_blk, f.dst_rep, f.ty, e);
    let bytes = ops.regs[1].to_le_bytes();
    let size = f.ty.size();
    let ub = bufs.ub_mut();
    each(ops.mask, r, e, [&od], |_, _, [pd]| {
        ub[pd..pd + size].copy_from_slice(&bytes[..size]);
    });
    Ok(())
}

fn round_f64(x: f64, mode: Round) -> f64 {
    match mode {
        Round::Rint => x.round_ties_even(),
        Round::Floor => x.floor(),
        Round::Ceil => x.ceil(),
        Round::Trunc => x.trunc(),
        Round::Round => x.round(),
    }
}

fn to_i32(x: f64, mode: Round) -> i32 {
    if x.is_nan() {
        return 0;
    }
    let r = round_f64(x, mode);
    r.clamp(f64::from(i32::MIN), f64::from(i32::MAX)) as i32
}

/// f32 -> f16 with a rounding mode (round-to-nearest-even is `half`'s conversion; the others
/// step to the neighbouring f16 when the nearest one lies on the wrong side).
fn f32_to_f16(x: f32, mode: Round) -> f16 {
    let near = f16::from_f32(x);
    if x.is_nan() || near.to_f32() == x || mode == Round::Rint {
        return near;
    }
    // The two to-nearest modes differ only on ties between two finite values; both overflow to
    // infinity from the same threshold (65520, halfway to 2^16), as IEEE 754 requires.
    if mode == Round::Round && near.is_infinite() {
        return near;
    }
    let next = |h: f16, up: bool| -> f16 {
        let b = h.to_bits();
        let (neg, mag) = (b & 0x8000 != 0, b & 0x7fff);
        let bits = if mag == 0 {
            if up { 0x0001 } else { 0x8001 }
        } else if up != neg {
            b + 1
        } else {
            b - 1
        };
        f16::from_bits(bits)
    };
    let back = near.to_f32();
    let (lo, hi) = if back < x {
        (near, next(near, true))
    } else {
        (next(near, false), near)
    };
    match mode {
        Round::Floor => lo,
        Round::Ceil => hi,
        Round::Trunc => {
            if x >= 0.0 {
                lo
            } else {
                hi
            }
        }
        Round::Round => {
            let (dl, dh) = (
                f64::from(x) - f64::from(lo.to_f32()),
                f64::from(hi.to_f32()) - f64::from(x),
            );
            if dl < dh {
                lo
            } else if dh < dl || x >= 0.0 {
                hi
            } else {
                lo
            }
        }
        Round::Rint => near,
    }
}

pub(super) fn conv(bufs: &mut Buffers, f: &VConv, ops: &Operands) -> Result<(), Fault> {
    let e = elems_per_repeat(widest(f.dst_ty, f.src_ty));
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    let (od, os) = (
        Opnd::new(d, f.dst_blk, f.dst_rep, f.dst_ty, e),
        Opnd::new(s, f.src_blk, f.src_rep, f.src_ty, e),
    );
    let n = (e / 8) as usize;
    let (src_bytes, dst_bytes) = (n * f.src_ty.size(), n * f.dst_ty.size());
    // f16 -> f32 (exact) and f32 -> f16 to nearest even a block at a time, when the blocks are
    // apart (the sizes differ, so a block written over its own source would show the order).
    let widen = f.src_ty == DType::F16 && f.dst_ty == DType::F32;
    let narrow = f.src_ty == DType::F32 && f.dst_ty == DType::F16 && f.round == Round::Rint;
    let block = |ub: &mut &mut [u8], [ps, pd]: [usize; 2]| {
        if !(widen || narrow) || (ps < pd + dst_bytes && pd < ps + src_bytes) {
            return false;
        }
        let mut x = [0f32; 16];
        load_floats(ub, ps, f.src_ty, &mut x[..n]);
        store_floats(ub, pd, f.dst_ty, &x[..n]);
        true
    };
    let mut ub = bufs.ub_mut();
    each_or_block(
        ops.mask,
        r,
        e,
        [&os, &od],
        &mut ub,
        block,
        |ub, _, _, [ps, pd]| {
            let x: f64 = if is_float(f.src_ty) {
                f64::from(ld_f(ub, ps, f.src_ty))
            } else {
                ld_i(ub, ps, f.src_ty) as f64
            };
            match f.dst_ty {
                DType::F32 => st_f(ub, pd, DType::F32, x as f32),
                DType::F16 => {
                    // Both sources (f32, i32) narrow in the requested rounding mode. An i32 goes
                    // through f32 first: exact up to 2^24, and beyond that both values lie far
                    // outside the f16 range, where every mode gives the same result.
                    let h = f32_to_f16(x as f32, f.round);
                    ub[pd..pd + 2].copy_from_slice(&h.to_bits().to_le_bytes());
                }
                DType::I32 => st_i(ub, pd, DType::I32, i64::from(to_i32(x, f.round))),
                DType::Bf16 => st_f(ub, pd, DType::Bf16, x as f32),
                DType::I16 | DType::U8 | DType::I8 => {
                    st_i(ub, pd, f.dst_ty, i64::from(to_i32(x, f.round)))
                }
            }
        },
    );
    Ok(())
}

fn cmp_f(c: Cmp, a: f32, b: f32) -> bool {
    match c {
        Cmp::Eq => a == b,
        Cmp::Ne => a != b,
        Cmp::Lt => a < b,
        Cmp::Le => a <= b,
        Cmp::Gt => a > b,
        Cmp::Ge => a >= b,
    }
}

fn cmp_i(c: Cmp, a: i64, b: i64) -> bool {
    match c {
        Cmp::Eq => a == b,
        Cmp::Ne => a != b,
        Cmp::Lt => a < b,
        Cmp::Le => a <= b,
        Cmp::Gt => a > b,
        Cmp::Ge => a >= b,
    }
}

fn put_bit(ub: &mut [u8], base: u64, idx: u64, v: bool) {
    let byte = (base + idx / 8) as usize;
    let bit = 1u8 << (idx % 8);
    if v {
        ub[byte] |= bit;
    } else {
        ub[byte] &= !bit;
    }
}

fn get_bit(ub: &[u8], base: u64, idx: u64) -> bool {
    ub[(base + idx / 8) as usize] & (1 << (idx % 8)) != 0
}

pub(super) fn cmp(bufs: &mut Buffers, f: &VCmp, ops: &Operands) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, a, b, _] = ops.regs;
    let (oa, ob) = (
        Opnd::new(a, f.src0_blk, f.src0_rep, f.ty, e),
        Opnd::new(b, f.src1_blk, f.src1_rep, f.ty, e),
    );
    let ub = bufs.ub_mut();
    each(ops.mask, r, e, [&oa, &ob], |rep, i, [pa, pb]| {
        let v = if is_float(f.ty) {
            cmp_f(f.cmp, ld_f(ub, pa, f.ty), ld_f(ub, pb, f.ty))
        } else {
            cmp_i(f.cmp, ld_i(ub, pa, f.ty), ld_i(ub, pb, f.ty))
        };
        put_bit(ub, d, rep * e + i, v);
    });
    Ok(())
}

pub(super) fn cmps(bufs: &mut Buffers, f: &VCmpS, ops: &Operands) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, k, _] = ops.regs;
    let os = Opnd::new(s, f.src_blk, f.src_rep, f.ty, e);
    let (kf, ki) = (scalar_f(f.ty, k), scalar_i(f.ty, k));
    let ub = bufs.ub_mut();
    each(ops.mask, r, e, [&os], |rep, i, [ps]| {
        let v = if is_float(f.ty) {
            cmp_f(f.cmp, ld_f(ub, ps, f.ty), kf)
        } else {
            cmp_i(f.cmp, ld_i(ub, ps, f.ty), ki)
        };
        put_bit(ub, d, rep * e + i, v);
    });
    Ok(())
}

pub(super) fn sel(bufs: &mut Buffers, f: &VSel, ops: &Operands) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, a, b, s] = ops.regs;
    let (od, oa, ob) = (
        Opnd::new(d, f.dst_blk, f.dst_rep, f.ty, e),
        Opnd::new(a, f.src0_blk, f.src0_rep, f.ty, e),
        Opnd::new(b, f.src1_blk, f.src1_rep, f.ty, e),
    );
    let size = f.ty.size();
    let ub = bufs.ub_mut();
    each(ops.mask, r, e, [&oa, &ob, &od], |rep, i, [pa, pb, pd]| {
        let src = if get_bit(ub, s, rep * e + i) { pa } else { pb };
        ub.copy_within(src..src + size, pd);
    });
    Ok(())
}

/// What a reduction's groups read: the source operand, the operation, and which elements of
/// each block are enabled (worked out once per instruction under a normal mask, which is the
/// same in every repeat).
struct Groups {
    os: Opnd,
    ty: DType,
    op: ReduceOp,
    mask: Mask,
    e: u64,
    /// Per block, its enabled elements when they are the same in every repeat (a normal mask).
    live: Option<[u32; 8]>,
}

impl Groups {
    fn new(os: Opnd, f: &VReduce, mask: Mask, e: u64) -> Groups {
        Groups {
            os,
            ty: f.ty,
            op: f.op,
            mask,
            e,
            live: match mask {
                Mask::Normal(_) => Some(std::array::from_fn(|b| block_live(mask, 0, e, b as u64))),
                Mask::Counter(_) => None,
            },
        }
    }

    /// The enabled elements of block `blk` of repeat `rep` (bit k for element k), and the
    /// block's first byte.
    #[inline(always)]
    fn block(&self, rep: u64, blk: u64) -> (u32, usize) {
        let live = match self.live {
            Some(live) => live[blk as usize],
            None => block_live(self.mask, rep, self.e, blk),
        };
        (live, self.os.block_addr(rep, blk))
    }

    /// The fold of repeat `rep`'s enabled floats in `blocks`, 0 when none is enabled.
    /// Whole blocks are widened at once (the bits of `ld_f`) into `x`, which holds the block
    /// at `widened` (kept while no result has been written over it); the enabled elements
    /// fold from the first one, which keeps a NaN's bits as they were.
    #[inline(always)]
    fn fold(
        &self,
        ub: &[u8],
        rep: u64,
        blocks: std::ops::Range<u64>,
        widened: &mut Option<usize>,
        x: &mut [f32; 16],
    ) -> f32 {
        let pb = (self.e / 8) as usize;
        let (mut acc, mut any) = (0f32, false);
        for blk in blocks {
            let (live, base) = self.block(rep, blk);
            if live == 0 {
                continue;
            }
            if *widened != Some(base) {
                load_floats(ub, base, self.ty, &mut x[..pb]);
                *widened = Some(base);
            }
            let mut rest = live;
            while rest != 0 {
                let v = x[rest.trailing_zeros() as usize];
                rest &= rest - 1;
                acc = if !any {
                    v
                } else {
                    match self.op {
                        ReduceOp::Sum => acc + v,
                        ReduceOp::Max => acc.max(v),
                        ReduceOp::Min => acc.min(v),
                    }
                };
                any = true;
            }
        }
        if any { acc } else { 0.0 }
    }
}

pub(super) fn reduce(
    bufs: &mut Buffers,
    f: &VReduce,
    ops: &Operands,
    per_block: bool,
) -> Result<(), Fault> {
    let e = elems_per_repeat(f.ty);
    let r = repeats(ops.mask, f.repeat, e);
    let [d, s, _, _] = ops.regs;
    let os = Opnd::new(s, f.src_blk, f.src_rep, f.ty, e);
    let size = f.ty.size() as u64;
    let groups: u64 = if per_block { 8 } else { 1 };
    let pb = (e / 8) as usize;
    let ub = bufs.ub_mut();
    let block_bytes = pb * size as usize;
    // The block last widened into `x`, while no result has been written over it (a
    // per-block reduction with a block stride of 0 reads one block eight times).
    let mut x = [0f32; 16];
    let mut widened: Option<usize> = None;
    let reads = Groups::new(os, f, ops.mask, e);
    // A group is one block (per-block reductions) or all eight; its enabled elements are
    // folded one at a time in ascending order.
    for rep in 0..r {
        if f.ty == DType::F16 && per_block && f.dst_rep == 1 {
            // A repeat's eight f16 results side by side, when they overwrite none of its
            // blocks, are narrowed at once after all eight are folded: no group reads
            // another's result, so the bits are those of writing each in turn.
            let first = (d + rep * groups * size) as usize;
            let end = first + (8 * size) as usize;
            let apart = (0..8).all(|blk| {
                let base = os.block_addr(rep, blk);
                base + block_bytes <= first || end <= base
            });
            if apart {
                let mut results = [0f32; 8];
                for (g, v) in (0u64..).zip(results.iter_mut()) {
                    *v = reads.fold(ub, rep, g..g + 1, &mut widened, &mut x);
                }
                narrow_f16(&results, &mut ub[first..end]);
                if widened.is_some_and(|w| first < w + block_bytes && w < end) {
                    widened = None;
                }
                continue;
            }
        }
        for g in 0..groups {
            let out = (d + (rep * groups + g) * u64::from(f.dst_rep) * size) as usize;
            let blocks = if per_block { g..g + 1 } else { 0..8 };
            if is_float(f.ty) {
                let v = reads.fold(ub, rep, blocks, &mut widened, &mut x);
                st_f(ub, out, f.ty, v);
                if widened.is_some_and(|w| out < w + block_bytes && w < out + size as usize) {
                    widened = None;
                }
            } else {
                // Integers fold from the operation's identity, which gives the same result
                // as starting from the first enabled element (the sums are at most eight
                // 32-bit values, exact in 64 bits).
                let mut acc = match f.op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Max => i64::MIN,
                    ReduceOp::Min => i64::MAX,
                };
                let mut any = false;
                let size = size as usize;
                for blk in blocks {
                    let (live, base) = reads.block(rep, blk);
                    // Only the enabled elements are read, lowest first (a transpose's
                    // single-lane masks read one element a block).
                    let mut rest = live;
                    while rest != 0 {
                        let k = rest.trailing_zeros() as usize;
                        rest &= rest - 1;
                        let x = ld_i(ub, base + k * size, f.ty);
                        acc = match f.op {
                            ReduceOp::Sum => acc.wrapping_add(x),
                            ReduceOp::Max => acc.max(x),
                            ReduceOp::Min => acc.min(x),
                        };
                        any = true;
                    }
                }
                st_i(ub, out, f.ty, if any { acc } else { 0 });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ChipConfig;
    use gearsim_isa::{FMatrix, Reg};

    /// `reduce` (which widens whole blocks, once for a block read by several groups) gives the
    /// bits of the element-by-element definition: results written over the source (so a
    /// widened block goes stale), a block stride of 0 (one block read by all eight groups, as
    /// a max pool's window does), strided repeats, full, partial and counter masks.
    #[test]
    fn reduce_gives_the_element_by_element_bits() {
        let mut x = 4242u32;
        let mut next = move || {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            x
        };
        let cfg = ChipConfig::preset("ascend910").unwrap();
        let reg = |i| Reg::new(i).unwrap();
        for ty in [DType::F16, DType::F32, DType::I32] {
            let size = ty.size() as u64;
            let e = elems_per_repeat(ty);
            let pb = e / 8;
            // (dst, src, src_blk, src_rep, dst_rep), addresses in bytes.
            for (d, s, blk, rep, dst_rep) in [
                (8192, 4096, 1, 8, 1),
                (4096, 4096, 1, 8, 1),
                (4096 + 2 * size, 4096, 0, 1, 1),
                (4096 + 32, 4096, 0, 1, 1),
                (4096, 4096, 0, 1, 3),
                (8192, 4096, 2, 3, 2),
            ] {
                for mask in [
                    Mask::FULL,
                    Mask::Normal(0x0f0f_00ff_ffff_0000_ffff_ffff_ff00_f00f),
                    Mask::Counter(3 * e - 5),
                ] {
                    for (per_block, op) in [
                        (true, ReduceOp::Max),
                        (true, ReduceOp::Sum),
                        (false, ReduceOp::Min),
                        (false, ReduceOp::Sum),
                    ] {
                        let mut bufs = Buffers::new(&cfg, crate::CoreKind::Coupled);
                        for b in bufs.ub_mut()[..16384].chunks_exact_mut(2) {
                            b.copy_from_slice(&((next() & 0x3bff) as u16).to_le_bytes());
                        }
                        let f = VReduce {
                            op,
                            ty,
                            dst: reg(1),
                            src: reg(2),
                            repeat: 3,
                            src_blk: blk,
                            src_rep: rep,
                            dst_rep,
                        };
                        let ops = Operands {
                            regs: [d, s, 0, 0],
                            mask,
                            fmatrix: FMatrix::RESET,
                        };
                        let mut got = bufs.clone();
                        reduce(&mut got, &f, &ops, per_block).unwrap();
                        // The definition: each group's enabled elements read one at a time in
                        // ascending order, folded from the first, the result written before
                        // the next group is read.
                        let mut want = bufs.clone();
                        let ub = want.ub_mut();
                        let os = Opnd::new(s, blk, rep, ty, e);
                        let groups = if per_block { 8 } else { 1 };
                        for r in 0..repeats(mask, 3, e) {
                            for g in 0..groups {
                                let blocks = if per_block { g..g + 1 } else { 0..8 };
                                let mut acc: Option<f64> = None;
                                for b in blocks {
                                    let live = block_live(mask, r, e, b);
                                    for k in (0..pb).filter(|k| live >> k & 1 == 1) {
                                        let at = os.block_addr(r, b) + (k * size) as usize;
                                        let v = if is_float(ty) {
                                            f64::from(ld_f(ub, at, ty))
                                        } else {
                                            ld_i(ub, at, ty) as f64
                                        };
                                        acc = Some(match (acc, op) {
                                            (None, _) => v,
                                            (Some(a), ReduceOp::Sum) if is_float(ty) => {
                                                f64::from(a as f32 + v as f32)
                                            }
                                            (Some(a), ReduceOp::Sum) => a + v,
                                            (Some(a), ReduceOp::Max) => a.max(v),
                                            (Some(a), ReduceOp::Min) => a.min(v),
                                        });
                                    }
                                }
                                let out =
                                    (d + (r * groups + g) * u64::from(dst_rep) * size) as usize;
                                let v = acc.unwrap_or(0.0);
                                if is_float(ty) {
                                    st_f(ub, out, ty, v as f32);
                                } else {
                                    st_i(ub, out, ty, v as i64);
                                }
                            }
                        }
                        assert!(
                            got.ub_mut()[..16384] == want.ub_mut()[..16384],
                            "{op:?} per block {per_block} {ty:?} dst {d} src {s} blk {blk} rep {rep} {mask:?}"
                        );
                    }
                }
            }
        }
    }

    /// `bin` and `un` (which take a whole block, or a run of blocks, at a time when they can)
    /// give the bits of the element-by-element definition for every operand layout: the
    /// destination the source itself, overlapping it by one element or one block either way,
    /// apart, spread over blocks, repeats one block apart (a bias broadcast from one block as
    /// the second source), blocks back to back with gaps between repeats, a destination that
    /// writes bytes twice; with full, partial, whole-block and counter masks.
    #[test]
    fn whole_blocks_and_runs_give_the_element_by_element_bits() {
        let mut x = 12345u32;
        let mut next = move || {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            x
        };
        let cfg = ChipConfig::preset("ascend910").unwrap();
        let reg = |i| Reg::new(i).unwrap();
        // An operand: base address in bytes, block stride, repeat stride (in blocks).
        type Layout = (u64, u8, u8);
        for ty in [DType::F16, DType::F32, DType::I32] {
            let size = ty.size() as u64;
            let value = |bits: u32| -> Vec<u8> {
                match ty {
                    // Finite halves (exponent below 31) and floats in ±1e4.
                    DType::F16 => ((bits & 0xfbff) as u16).to_le_bytes().to_vec(),
                    DType::F32 => ((bits as i32 % 20000) as f32 * 0.37).to_le_bytes().to_vec(),
                    _ => bits.to_le_bytes().to_vec(),
                }
            };
            let dense = |base: u64, blk: u8| (base, blk, 8 * blk);
            let bias = (12288, 0, 1);
            // (repeat, [dst, src0, src1]).
            let layouts: [(u8, [Layout; 3]); 17] = [
                (2, [dense(4096, 1), dense(4096, 1), dense(12288, 1)]),
                (2, [dense(4096 + size, 1), dense(4096, 1), dense(12288, 1)]),
                (2, [dense(4096, 1), dense(4096 + size, 1), dense(12288, 1)]),
                (2, [dense(4096 + 32, 1), dense(4096, 1), dense(12288, 1)]),
                (2, [dense(4096, 1), dense(4096 + 32, 1), dense(12288, 1)]),
                (2, [dense(4096 + 256, 1), dense(4096, 1), dense(12288, 1)]),
                (2, [dense(8192, 1), dense(4096, 1), dense(12288, 1)]),
                (2, [dense(8192, 2), dense(4096, 2), dense(12288, 1)]),
                (3, [(4096, 16, 1), (4096, 16, 1), bias]),
                (3, [(4096, 16, 1), (4096 + 32, 16, 1), bias]),
                (3, [(4096 + 32, 16, 1), (4096, 16, 1), bias]),
                (2, [(4096, 2, 1), (6400, 2, 1), bias]),
                (2, [(4096, 1, 1), (4096, 1, 1), bias]),
                (3, [(4096, 1, 9), (4096, 1, 9), (12288, 1, 0)]),
                (3, [(4096, 1, 9), (4096 + 256, 1, 9), (12288, 1, 0)]),
                (3, [(4096, 1, 9), (5120, 1, 9), (4096, 1, 9)]),
                (4, [(4096, 1, 8), (4096, 1, 8), (9600, 1, 8)]),
            ];
            for (repeat, [d, a, b]) in layouts {
                // Full; part of a block; whole blocks only (every other pair of 32-bit blocks,
                // five of eight f16 blocks; the first seven 32-bit blocks); counters.
                for mask in [
                    Mask::FULL,
                    Mask::Normal(0x0f0f_00ff_ffff_0000_ffff_ffff_ff00_f00f),
                    Mask::Normal(0xffff_0000_ffff_ffff_0000_ffff_0000_ffff),
                    Mask::Normal((1 << 56) - 1),
                    Mask::Counter(200),
                    Mask::Counter(u64::from(repeat) * elems_per_repeat(ty)),
                ] {
                    let mut bufs = Buffers::new(&cfg, crate::CoreKind::Coupled);
                    for b in bufs.ub_mut()[..16384].chunks_exact_mut(size as usize) {
                        b.copy_from_slice(&value(next())[..size as usize]);
                    }
                    let ops = Operands {
                        regs: [d.0, a.0, b.0, 0],
                        mask,
                        fmatrix: FMatrix::RESET,
                    };
                    let f = VBin {
                        ty,
                        dst: reg(1),
                        src0: reg(2),
                        src1: reg(3),
                        repeat,
                        dst_blk: d.1,
                        src0_blk: a.1,
                        src1_blk: b.1,
                        dst_rep: d.2,
                        src0_rep: a.2,
                        src1_rep: b.2,
                    };
                    let u = VUn {
                        ty,
                        dst: reg(1),
                        src: reg(2),
                        repeat,
                        dst_blk: d.1,
                        src_blk: a.1,
                        dst_rep: d.2,
                        src_rep: a.2,
                    };
                    let e = elems_per_repeat(ty);
                    let r = repeats(mask, repeat, e);
                    let [od, oa, ob] =
                        [d, a, b].map(|(base, blk, rep)| Opnd::new(base, blk, rep, ty, e));
                    let what = format!("{ty:?} repeat {repeat} {d:?} {a:?} {b:?} {mask:?}");
                    for op in [Bin::Add, Bin::Mla, Bin::Max] {
                        let mut got = bufs.clone();
                        bin(&mut got, &f, &ops, op).unwrap();
                        let mut want = bufs.clone();
                        let ub = want.ub_mut();
                        each(mask, r, e, [&oa, &ob, &od], |_, _, [pa, pb, pd]| {
                            if is_float(ty) {
                                let acc = ld_f(ub, pd, ty);
                                let v = bin_f(op, ld_f(ub, pa, ty), ld_f(ub, pb, ty), acc);
                                st_f(ub, pd, ty, v);
                            } else {
                                let acc = ld_i(ub, pd, ty);
                                let v = bin_i(op, ld_i(ub, pa, ty), ld_i(ub, pb, ty), acc);
                                st_i(ub, pd, ty, v);
                            }
                        });
                        assert!(
                            got.ub_mut()[..16384] == want.ub_mut()[..16384],
                            "{op:?} {what}"
                        );
                    }
                    for op in [Un::Relu, Un::Mov, Un::Abs] {
                        let mut got = bufs.clone();
                        un(&mut got, &u, &ops, op).unwrap();
                        let mut want = bufs.clone();
                        let ub = want.ub_mut();
                        each(mask, r, e, [&oa, &od], |_, _, [ps, pd]| {
                            if is_float(ty) {
                                st_f(ub, pd, ty, un_f(op, ld_f(ub, ps, ty)));
                            } else {
                                st_i(ub, pd, ty, un_i(op, ld_i(ub, ps, ty)));
                            }
                        });
                        assert!(
                            got.ub_mut()[..16384] == want.ub_mut()[..16384],
                            "{op:?} {what}"
                        );
                    }
                }
            }
        }
    }

    /// `conv` between f16 and f32 (a block at a time where it can) gives the bits of the
    /// element-by-element definition, with the destination apart from the source or over it.
    #[test]
    fn block_conversions_give_the_element_by_element_bits() {
        let cfg = ChipConfig::preset("ascend910").unwrap();
        let reg = |i| Reg::new(i).unwrap();
        let mut x = 99u32;
        for (src_ty, dst_ty, round) in [
            (DType::F16, DType::F32, Round::Rint),
            (DType::F32, DType::F16, Round::Rint),
            (DType::F32, DType::F16, Round::Floor),
        ] {
            for (dst, src) in [(8192, 4096), (4096, 4096), (4100, 4096), (4096, 4112)] {
                for mask in [Mask::FULL, Mask::Counter(100)] {
                    let mut bufs = Buffers::new(&cfg, crate::CoreKind::Coupled);
                    for b in bufs.ub_mut()[..16384].chunks_exact_mut(4) {
                        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        // Finite halves in both halves of the word, or a float in ±7e4.
                        let v = match src_ty {
                            DType::F16 => x & 0xfbff_fbff,
                            _ => ((x as i32 % 70000) as f32 * 1.37).to_bits(),
                        };
                        b.copy_from_slice(&v.to_le_bytes());
                    }
                    let f = VConv {
                        dst_ty,
                        src_ty,
                        dst: reg(1),
                        src: reg(2),
                        repeat: 2,
                        dst_blk: 1,
                        src_blk: 1,
                        dst_rep: 8,
                        src_rep: 8,
                        round,
                    };
                    let ops = Operands {
                        regs: [dst, src, 0, 0],
                        mask,
                        fmatrix: FMatrix::RESET,
                    };
                    let mut got = bufs.clone();
                    conv(&mut got, &f, &ops).unwrap();
                    let mut want = bufs.clone();
                    let ub = want.ub_mut();
                    let e = elems_per_repeat(widest(dst_ty, src_ty));
                    let (od, os) = (
                        Opnd::new(dst, 1, 8u8, dst_ty, e),
                        Opnd::new(src, 1, 8u8, src_ty, e),
                    );
                    each(
                        mask,
                        repeats(mask, 2, e),
                        e,
                        [&os, &od],
                        |_, _, [ps, pd]| {
                            let v = ld_f(ub, ps, src_ty);
                            match dst_ty {
                                DType::F16 => {
                                    let h = f32_to_f16(v, round);
                                    ub[pd..pd + 2].copy_from_slice(&h.to_bits().to_le_bytes());
                                }
                                _ => st_f(ub, pd, dst_ty, v),
                            }
                        },
                    );
                    assert!(
                        got.ub_mut()[..16384] == want.ub_mut()[..16384],
                        "{src_ty:?} -> {dst_ty:?} {round:?} dst {dst} src {src} {mask:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn directed_rounding_to_f16() {
        let x = 1.0f32 + 2f32.powi(-11) * 1.5; // between 1.0 and 1.0009765625, nearer the top
        assert_eq!(f32_to_f16(x, Round::Rint).to_f32(), 1.0 + 2f32.powi(-10));
        assert_eq!(f32_to_f16(x, Round::Floor).to_f32(), 1.0);
        assert_eq!(f32_to_f16(x, Round::Ceil).to_f32(), 1.0 + 2f32.powi(-10));
        assert_eq!(f32_to_f16(-x, Round::Trunc).to_f32(), -1.0);
        let tie = 1.0f32 + 2f32.powi(-11);
        assert_eq!(f32_to_f16(tie, Round::Rint).to_f32(), 1.0);
        assert_eq!(f32_to_f16(tie, Round::Round).to_f32(), 1.0 + 2f32.powi(-10));
        assert_eq!(f32_to_f16(65520.0, Round::Round), f16::INFINITY);
        assert_eq!(f32_to_f16(-70000.0, Round::Round), f16::NEG_INFINITY);
        assert_eq!(f32_to_f16(70000.0, Round::Trunc), f16::MAX);
        assert_eq!(to_i32(2.5, Round::Rint), 2);
        assert_eq!(to_i32(-2.5, Round::Round), -3);
        assert_eq!(to_i32(1e20, Round::Trunc), i32::MAX);
        assert_eq!(to_i32(f64::NAN, Round::Trunc), 0);
    }
}
