//! Cube path: fractal loads into L0A/L0B (load2d and img2col), `mmad`, and moves out of L0C.
//!
//! Layouts (a fractal is 16 x 16 elements stored row-major):
//! - L0A holds A (m x k, f16) as fractals `(mb, kb)` at index `mb * KB + kb` ("zZ").
//! - L0B holds B (k x n, f16) as fractals `(kb, nb)` at index `nb * KB + kb`, each fractal with
//!   rows along k and columns along n.
//! - L0C holds C (m x n, f32) as fractals `(mb, nb)` at index `nb * MB + mb` ("NZ"), 1 KiB each.
//! - L1 matrices written by `copy_gm_to_l1_nd2nz` are NZ: fractal `(rb, cb)` at `cb * RB + rb`.
//!
//! with MB = ceil(m/16), KB = ceil(k/16), NB = ceil(n/16). `mmad` works on whole fractals (the
//! padding inside partial fractals takes part in the product, as on the hardware). Products of
//! two f16 (or two bf16) values are exact in f32; accumulation is in f32 in ascending k order.
//!
//! An i8 `mmad` has 16 x 32 fractals (still 512 bytes): KB = ceil(k/32), L0A fractal `(mb, kb)`
//! is 16 rows of 32 k values, and L0B fractal `(kb, nb)` is stored n-major, 16 rows (n) of 32
//! k values, as the hardware's L0B holds int8 B after its transposing load. L0C then holds i32
//! accumulators (wrapping), which `copy_l0c_to_gm` copies to i32 or dequantises.

use gearsim_isa::aipp;
use gearsim_isa::units::{FRACTAL_BYTES as FRACTAL, FRACTAL_BYTES_F32 as FRACTAL_C};
use gearsim_isa::{DType, Img2col, L0cFill, L0cToGm, L0cToUb, Load2d, Mmad, Quant, units};
use half::{bf16, f16};
use std::ops::Range;

use super::{Access, Fault, Operands, Plan, narrow_f16, widen_f16};
use crate::core::buffers::Buffers;
use crate::memory::GmValues;
use crate::stop::Buffer;

fn blocks(x: u16) -> u64 {
    u64::from(x).div_ceil(16)
}

pub(super) fn plan_load2d(f: &Load2d, ops: &Operands, to: Buffer) -> Plan {
    let [dst, src, _, _] = ops.regs;
    let n = u64::from(f.nfrac);
    Plan::new(
        n * FRACTAL,
        0,
        &[
            Access {
                buffer: Buffer::L1,
                start: src,
                burst: FRACTAL,
                stride: u64::from(f.src_stride) * FRACTAL,
                count: n,
                write: false,
            },
            Access {
                buffer: to,
                start: dst,
                burst: FRACTAL,
                stride: u64::from(f.dst_stride) * FRACTAL,
                count: n,
                write: true,
            },
        ],
    )
}

pub(super) fn load2d(
    bufs: &mut Buffers,
    f: &Load2d,
    ops: &Operands,
    to: Buffer,
) -> Result<(), Fault> {
    let [dst, src, _, _] = ops.regs;
    let (l1, out) = bufs.pair_mut(Buffer::L1, to);
    let (n, size) = (u64::from(f.nfrac), FRACTAL as usize);
    let (src_step, dst_step) = (
        u64::from(f.src_stride) * FRACTAL,
        u64::from(f.dst_stride) * FRACTAL,
    );
    if !f.transpose && src_step == FRACTAL && dst_step == FRACTAL {
        // Consecutive fractals to consecutive fractals: one copy.
        let (s, d, len) = (src as usize, dst as usize, (n * FRACTAL) as usize);
        out[d..d + len].copy_from_slice(&l1[s..s + len]);
        return Ok(());
    }
    for i in 0..n {
        let (s, d) = ((src + i * src_step) as usize, (dst + i * dst_step) as usize);
        let (from, into) = (&l1[s..s + size], &mut out[d..d + size]);
        if f.transpose {
            transpose_fractal(from, into);
        } else {
            into.copy_from_slice(from);
        }
    }
    Ok(())
}

/// Element (r, c) of the 16 × 16 two-byte source fractal `from` is element (c, r) of
/// `into` (both 512 bytes).
fn transpose_fractal(from: &[u8], into: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        transpose_fractal_sse2(from, into);
    }
    #[cfg(not(target_arch = "x86_64"))]
    transpose_fractal_portable(from, into);
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn transpose_fractal_portable(from: &[u8], into: &mut [u8]) {
    for r in 0..16 {
        for c in 0..16 {
            let (a, b) = ((r * 16 + c) * 2, (c * 16 + r) * 2);
            into[b..b + 2].copy_from_slice(&from[a..a + 2]);
        }
    }
}

/// [`transpose_fractal_portable`] as four 8 × 8 transposes of 16-bit lanes in SSE2 (every
/// x86-64 host has it): three rounds of interleaves per block instead of 256 two-byte copies.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn transpose_fractal_sse2(from: &[u8], into: &mut [u8]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_storeu_si128, _mm_unpackhi_epi16, _mm_unpackhi_epi32,
        _mm_unpackhi_epi64, _mm_unpacklo_epi16, _mm_unpacklo_epi32, _mm_unpacklo_epi64,
    };
    let (from, into) = (&from[..512], &mut into[..512]);
    for (br, bc) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
        // SAFETY: each load reads 16 bytes at row `br * 8 + i`, column `bc * 8` of the
        // 512-byte source (byte (row * 16 + bc * 8) * 2, at most 496), so in bounds; the
        // unaligned load needs no alignment. The intrinsics are SSE2, which x86-64 always has.
        let a: [__m128i; 8] = std::array::from_fn(|i| unsafe {
            _mm_loadu_si128(from[((br * 8 + i) * 16 + bc * 8) * 2..].as_ptr().cast())
        });
        // Each round interleaves pairs of registers, the low halves then the high halves.
        macro_rules! interleave {
            ($lo:ident, $hi:ident, $x:expr, $pairs:expr) => {{
                let x = $x;
                let mut out = x;
                for (k, (i, j)) in $pairs.into_iter().enumerate() {
                    // SAFETY: SSE2 register operations, on every x86-64 host.
                    unsafe {
                        out[2 * k] = $lo(x[i], x[j]);
                        out[2 * k + 1] = $hi(x[i], x[j]);
                    }
                }
                out
            }};
        }
        let t = interleave!(
            _mm_unpacklo_epi16,
            _mm_unpackhi_epi16,
            a,
            [(0, 1), (2, 3), (4, 5), (6, 7)]
        );
        let u = interleave!(
            _mm_unpacklo_epi32,
            _mm_unpackhi_epi32,
            t,
            [(0, 2), (1, 3), (4, 6), (5, 7)]
        );
        // Column j of the block is row j of its transpose.
        let cols = interleave!(
            _mm_unpacklo_epi64,
            _mm_unpackhi_epi64,
            u,
            [(0, 4), (1, 5), (2, 6), (3, 7)]
        );
        for (j, col) in cols.iter().enumerate() {
            // SAFETY: the store writes 16 bytes at row `bc * 8 + j`, column `br * 8` of the
            // 512-byte destination (at most byte 496), so in bounds; unaligned form.
            unsafe {
                _mm_storeu_si128(
                    into[((bc * 8 + j) * 16 + br * 8) * 2..].as_mut_ptr().cast(),
                    *col,
                )
            };
        }
    }
}

struct Geometry {
    h: u64,
    w: u64,
    ho: u64,
    wo: u64,
}

fn geometry(f: &Img2col, ops: &Operands) -> Result<Geometry, Fault> {
    let fm = ops.fmatrix;
    let (h, w) = (u64::from(fm.h), u64::from(fm.w));
    let (kh, kw) = (u64::from(f.kh), u64::from(f.kw));
    let (sh, sw, dh, dw) = (
        u64::from(f.stride_h),
        u64::from(f.stride_w),
        u64::from(f.dil_h),
        u64::from(f.dil_w),
    );
    if kh == 0 || kw == 0 || sh == 0 || sw == 0 || dh == 0 || dw == 0 || f.c1 == 0 {
        return Err(Fault::Illegal(
            "img2col: c1, kernel, stride and dilation must be at least 1".into(),
        ));
    }
    let ph = h + u64::from(fm.pad_top) + u64::from(fm.pad_bottom);
    let pw = w + u64::from(fm.pad_left) + u64::from(fm.pad_right);
    let (eh, ew) = (dh * (kh - 1) + 1, dw * (kw - 1) + 1);
    if h == 0 || w == 0 || ph < eh || pw < ew {
        return Err(Fault::Illegal(format!(
            "img2col: a {kh}x{kw} kernel (dilation {dh}x{dw}) does not fit the padded {ph}x{pw} feature map (set_fmatrix)"
        )));
    }
    Ok(Geometry {
        h,
        w,
        ho: (ph - eh) / sh + 1,
        wo: (pw - ew) / sw + 1,
    })
}

pub(super) fn plan_img2col(f: &Img2col, ops: &Operands) -> Result<Plan, Fault> {
    let g = geometry(f, ops)?;
    let [dst, src, _, _] = ops.regs;
    let out = u64::from(f.mfrac) * u64::from(f.kfrac) * FRACTAL;
    Ok(Plan::new(
        out,
        0,
        &[
            Access::range(
                Buffer::L1,
                src,
                u64::from(f.c1) * g.h * g.w * aipp::pixel_bytes(f.c04),
                false,
            ),
            Access::range(Buffer::L0a, dst, out, true),
        ],
    ))
}

/// A K column's tap: its C1 slice and its row and column offsets in the padded map.
type Tap = (u64, i64, i64);

pub(super) fn img2col(bufs: &mut Buffers, f: &Img2col, ops: &Operands) -> Result<(), Fault> {
    let g = geometry(f, ops)?;
    let [dst, src, _, _] = ops.regs;
    let fm = ops.fmatrix;
    let (kh, kw) = (u64::from(f.kh), u64::from(f.kw));
    // A K fractal's 16 columns are one tap's 16 channels, or (C04) four taps' 4 channels.
    let chans = aipp::pixel_channels(f.c04);
    let taps_per_frac = units::C0 / chans;
    let taps = u64::from(f.c1) * kh * kw;
    let unit = aipp::pixel_bytes(f.c04);
    let pixels = g.ho * g.wo;
    let (l1, l0a) = bufs.pair_mut(Buffer::L1, Buffer::L0a);
    let (kfrac, m_start, k_start) = (
        u64::from(f.kfrac),
        u64::from(f.m_start),
        u64::from(f.k_start),
    );
    // Each K column's place in a fractal row (its fractal and its part of the 32 bytes) and
    // its tap as (c1, row offset, column offset) in the padded map, `None` past the last tap:
    // worked out once instead of once per row.
    let columns: Vec<(u64, Option<Tap>)> = (0..kfrac * taps_per_frac)
        .map(|col| {
            let (ki, part) = (col / taps_per_frac, col % taps_per_frac);
            let tap = k_start * taps_per_frac + col;
            let at = (tap < taps).then(|| {
                let (c1, rest) = (tap / (kh * kw), tap % (kh * kw));
                let (i, j) = (rest / kw, rest % kw);
                (
                    c1,
                    (i * u64::from(f.dil_h)) as i64 - i64::from(fm.pad_top),
                    (j * u64::from(f.dil_w)) as i64 - i64::from(fm.pad_left),
                )
            });
            (ki * FRACTAL + part * unit, at)
        })
        .collect();
    let n = (chans * 2) as usize;
    for mi in 0..u64::from(f.mfrac) {
        // The fractal's 16 rows: each pixel's window corner, `None` past the last pixel.
        let corners: [Option<(i64, i64)>; 16] = std::array::from_fn(|r| {
            let p = (m_start + mi) * 16 + r as u64;
            let (oh, ow) = (p / g.wo, p % g.wo);
            (p < pixels).then_some((
                (oh * u64::from(f.stride_h)) as i64,
                (ow * u64::from(f.stride_w)) as i64,
            ))
        });
        let frac_base = dst + mi * kfrac * FRACTAL;
        for (offset, tap) in &columns {
            let base = (frac_base + offset) as usize;
            // Row r's slice in L1, `None` where the window reads padding.
            let value_at = |r: usize| {
                let (c1, di, dj) = (*tap)?;
                let (top, left) = corners[r]?;
                let (ih, iw) = (top + di, left + dj);
                (ih >= 0 && iw >= 0 && (ih as u64) < g.h && (iw as u64) < g.w)
                    .then(|| (src + ((c1 * g.h + ih as u64) * g.w + iw as u64) * unit) as usize)
            };
            if n != 32 {
                // C04: a row's 8 bytes are a quarter of its 32, so rows never join.
                for r in 0..16 {
                    let row = base + r * 32;
                    match value_at(r) {
                        Some(s) => l0a[row..row + n].copy_from_slice(&l1[s..s + n]),
                        None => l0a[row..row + n].fill(0),
                    }
                }
                continue;
            }
            // 16 channels fill a row, so rows whose slices lie back to back in L1 (a window
            // moving one pixel along a map row) are one copy, and rows of padding one fill.
            // Each row's slice is looked up once: the one that ends a run starts the next.
            let (mut r, mut first) = (0, value_at(0));
            while r < 16 {
                let mut end = r + 1;
                let mut next = None;
                while end < 16 {
                    let v = value_at(end);
                    if v != first.map(|s| s + (end - r) * 32) {
                        next = v;
                        break;
                    }
                    end += 1;
                }
                let (d, len) = (base + r * 32, (end - r) * 32);
                match first {
                    Some(s) => l0a[d..d + len].copy_from_slice(&l1[s..s + len]),
                    None => l0a[d..d + len].fill(0),
                }
                (r, first) = (end, next);
            }
        }
    }
    Ok(())
}

/// K fractals of an `mmad`: 32 i8 values or 16 of a 16-bit type each.
fn k_blocks(f: &Mmad) -> u64 {
    match f.ty {
        DType::I8 => u64::from(f.k).div_ceil(32),
        _ => blocks(f.k),
    }
}

pub(super) fn plan_mmad(f: &Mmad, ops: &Operands) -> Plan {
    let [c, a, b, _] = ops.regs;
    let (mb, kb, nb) = (blocks(f.m), k_blocks(f), blocks(f.n));
    Plan::new(
        mb * kb * nb,
        0,
        &[
            Access::range(Buffer::L0a, a, mb * kb * FRACTAL, false),
            Access::range(Buffer::L0b, b, kb * nb * FRACTAL, false),
            Access::range(Buffer::L0c, c, mb * nb * FRACTAL_C, true),
        ],
    )
}

/// bf16 values widened to f32 (exact: a bf16 is an f32's top half).
fn widen_bf16s(bytes: &[u8], out: &mut [f32]) {
    for (v, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *v = bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
    }
}

/// The groups of rows of an output fractal (first row, rows) that one pass of the AVX2 form
/// keeps in registers: six, six, then four. Zero products are left out per group
/// ([`NonzeroColumns`]), so a column goes from a group only when all of its rows are zero.
const ROW_GROUPS: [(usize, usize); 3] = [(0, 6), (6, 6), (12, 4)];

/// Per row group of one row of A's fractals ([`ROW_GROUPS`]), the K columns (ascending) in
/// which one of the group's rows of A is nonzero: the only products an accumulator of the
/// group needs when the conditions of [`zeros_may_be_skipped`] hold. Column k (column k % 16
/// of K fractal k / 16) is given by the float offsets its products read: A's value of row 0
/// at `a_cols` (256 (k / 16) + k % 16) and B's row at `b_rows` (256 (k / 16) + 16 (k % 16)).
/// Only [`NonzeroColumns::find`] makes them, and only for columns of the first `fractals` K
/// fractals, which is what lets the products read them without a check per column.
#[derive(Clone, Copy)]
struct GroupColumns<'a> {
    fractals: usize,
    a_cols: [&'a [u32]; 3],
    b_rows: [&'a [u32]; 3],
}

/// `acc += Σ_k a_k · b_k` over the K fractals of one output fractal (`a`, `b`: K fractals of
/// 256 values each, row-major 16×16): for each element, products added one at a time in
/// ascending k, each a multiplication then an addition, so every vector width gives the same
/// bits (the vector widths fuse the two only where that changes no bit: [`Products`]). With
/// `kept`, each row group adds only its nonzero columns' products, in the same order.
#[inline(always)]
fn accumulate_portable(acc: &mut [f32; 256], a: &[f32], b: &[f32], kept: Option<&GroupColumns>) {
    let Some(kept) = kept else {
        accumulate_portable_rows(acc, (a, b), 0..16);
        return;
    };
    for (g, &(first, rows)) in ROW_GROUPS.iter().enumerate() {
        let group = first * 16..(first + rows) * 16;
        if !clean_accumulators(&acc[group]) {
            accumulate_portable_rows(acc, (a, b), first..first + rows);
            continue;
        }
        for (&a_at, &b_at) in kept.a_cols[g].iter().zip(kept.b_rows[g]) {
            let brow = &b[b_at as usize..][..16];
            for i in first..first + rows {
                let x = a[a_at as usize + i * 16];
                for j in 0..16 {
                    acc[i * 16 + j] += x * brow[j];
                }
            }
        }
    }
}

/// Rows `rows` of [`accumulate_portable`] over every column.
#[inline(always)]
fn accumulate_portable_rows(acc: &mut [f32; 256], (a, b): (&[f32], &[f32]), rows: Range<usize>) {
    for (af, bf) in a.chunks_exact(256).zip(b.chunks_exact(256)) {
        for i in rows.clone() {
            let row = &mut acc[i * 16..i * 16 + 16];
            for kk in 0..16 {
                let x = af[i * 16 + kk];
                let brow = &bf[kk * 16..kk * 16 + 16];
                for j in 0..16 {
                    row[j] += x * brow[j];
                }
            }
        }
    }
}

/// Whether each product of two operands is exact in f32, so that a fused multiply-add
/// (one rounding) gives the bits of a multiplication followed by an addition (two). True of
/// f16 operands: an f16 has 11 significant bits, so a product has at most 22 (an f32 holds
/// 24), and its exponent stays inside f32's normal range (2^-48 to 2^32), so the
/// multiplication never rounds. Not of bf16, whose f32 exponent range lets a product overflow
/// or leave the normal range. With no NaN among the operands, the only NaN a product or a sum
/// can make is the default one, the same in both forms; which of two NaN payloads survives a
/// sum is the host's choice in either form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Products {
    Exact,
    Rounded,
}

/// [`accumulate_portable`] in AVX-512: the 16 rows of the output fractal are 16 vector
/// accumulators held in registers for all K fractals, and `k` is the outer loop, so each row
/// gets its products one at a time in ascending k (the portable order, the same bits) while
/// the 16 rows' additions are independent and overlap in the pipeline instead of waiting on
/// one another's latency. `FUSED` adds each product with one fused multiply-add, which only
/// [`Products::Exact`] operands may use. It adds every column, `kept` or not: a left-out
/// product changes no bit where `kept` is given.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn accumulate_avx512<const FUSED: bool>(
    acc: &mut [f32; 256],
    a: &[f32],
    b: &[f32],
    _kept: Option<&GroupColumns>,
) {
    use std::arch::x86_64::{__m512, _mm512_add_ps, _mm512_fmadd_ps, _mm512_loadu_ps};
    use std::arch::x86_64::{_mm512_mul_ps, _mm512_set1_ps, _mm512_storeu_ps};
    // SAFETY (every load and store below): each pointer is the start of a 16-float row
    // inside a `[f32; 256]` (the accumulator, or one fractal of `a` / `b` taken with
    // `chunks_exact(256)`), so the 16 floats read or written are in bounds; the unaligned
    // forms need no alignment.
    let mut rows: [__m512; 16] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(acc[i * 16..].as_ptr()) });
    for (af, bf) in a.chunks_exact(256).zip(b.chunks_exact(256)) {
        for kk in 0..16 {
            let brow = unsafe { _mm512_loadu_ps(bf[kk * 16..kk * 16 + 16].as_ptr()) };
            for (i, row) in rows.iter_mut().enumerate() {
                let x = _mm512_set1_ps(af[i * 16 + kk]);
                *row = if FUSED {
                    _mm512_fmadd_ps(x, brow, *row)
                } else {
                    _mm512_add_ps(*row, _mm512_mul_ps(x, brow))
                };
            }
        }
    }
    for (i, row) in rows.iter().enumerate() {
        unsafe { _mm512_storeu_ps(acc[i * 16..i * 16 + 16].as_mut_ptr(), *row) };
    }
}

/// [`accumulate_avx512`]'s order in AVX2 (with FMA, which every AVX2 host but a few early
/// ones has): a pass per row group ([`ROW_GROUPS`]), each row two 8-float accumulators
/// (twelve registers, with room for the B row and the broadcast in the sixteen), over the
/// group's `kept` columns when given.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn accumulate_avx2<const FUSED: bool>(
    acc: &mut [f32; 256],
    a: &[f32],
    b: &[f32],
    kept: Option<&GroupColumns>,
) {
    let columns = |g: usize| kept.map(|kept| (kept.fractals, kept.a_cols[g], kept.b_rows[g]));
    const G: [(usize, usize); 3] = ROW_GROUPS;
    accumulate_avx2_rows::<{ G[0].1 }, FUSED>(acc, (a, b), G[0].0, columns(0));
    accumulate_avx2_rows::<{ G[1].1 }, FUSED>(acc, (a, b), G[1].0, columns(1));
    accumulate_avx2_rows::<{ G[2].1 }, FUSED>(acc, (a, b), G[2].0, columns(2));
}

/// Rows `first..first + ROWS` of [`accumulate_avx2`], over every K column or over `columns`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn accumulate_avx2_rows<const ROWS: usize, const FUSED: bool>(
    acc: &mut [f32; 256],
    (a, b): (&[f32], &[f32]),
    first: usize,
    columns: Option<(usize, &[u32], &[u32])>,
) {
    use std::arch::x86_64::{__m256, _mm256_add_ps, _mm256_fmadd_ps, _mm256_loadu_ps};
    use std::arch::x86_64::{_CMP_UNORD_Q, _mm256_cmp_ps, _mm256_movemask_ps, _mm256_or_ps};
    use std::arch::x86_64::{_mm256_castps_si256, _mm256_castsi256_ps, _mm256_cmpeq_epi32};
    use std::arch::x86_64::{_mm256_min_epi32, _mm256_storeu_ps};
    use std::arch::x86_64::{_mm256_mul_ps, _mm256_set1_epi32, _mm256_set1_ps};
    // SAFETY (every load and store below): each pointer starts 8 floats inside a 16-float
    // row of a `[f32; 256]` (the accumulator, or a fractal of `a` / `b` sliced to 256
    // values), offset 0 or 8, so the 8 floats are in bounds; unaligned forms.
    let mut rows: [[__m256; 2]; ROWS] = std::array::from_fn(|r| {
        let at = (first + r) * 16;
        unsafe {
            [
                _mm256_loadu_ps(acc[at..at + 8].as_ptr()),
                _mm256_loadu_ps(acc[at + 8..at + 16].as_ptr()),
            ]
        }
    });
    // The column whose A value of row 0 is at float `a_col` of `a` and whose B row starts
    // at float `b_row` of `b` into every row's accumulators. Safe to call only when
    // `a_col + 16 * 15 < a.len()` and `b_row + 16 <= b.len()`.
    let (a_at, b_at) = (a.as_ptr(), b.as_ptr());
    let add_column = |rows: &mut [[__m256; 2]; ROWS], a_col: usize, b_row: usize| {
        // SAFETY: the caller's condition: B's row (16 floats from `b_row`) is inside `b`, and
        // A's values of rows `first + r <= 15` (at `a_col + 16 (first + r)`) inside `a`;
        // unaligned loads.
        let (lo, hi) = unsafe {
            (
                _mm256_loadu_ps(b_at.add(b_row)),
                _mm256_loadu_ps(b_at.add(b_row + 8)),
            )
        };
        for (r, row) in rows.iter_mut().enumerate() {
            let x = unsafe { _mm256_set1_ps(*a_at.add(a_col + (first + r) * 16)) };
            if FUSED {
                row[0] = _mm256_fmadd_ps(x, lo, row[0]);
                row[1] = _mm256_fmadd_ps(x, hi, row[1]);
            } else {
                row[0] = _mm256_add_ps(row[0], _mm256_mul_ps(x, lo));
                row[1] = _mm256_add_ps(row[1], _mm256_mul_ps(x, hi));
            }
        }
    };
    assert!(first + ROWS <= 16, "rows {first}.. are outside a fractal");
    // The columns are left out only when no accumulator of these rows is -0 or NaN
    // ([`zeros_may_be_skipped`]): checked on the registers just loaded, in few registers so
    // that none of the twelve spills. -0's bits are i32::MIN, the least i32, so the rows hold
    // one exactly when their least lane is i32::MIN; an unordered comparison of a row's two
    // halves is true in a lane where either holds a NaN.
    let columns = columns.filter(|_| {
        let (least, nan) = rows.iter().fold(
            (
                _mm256_castps_si256(rows[0][0]),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(rows[0][0], rows[0][1]),
            ),
            |(least, nan), &[lo, hi]| {
                let least = _mm256_min_epi32(least, _mm256_castps_si256(lo));
                let least = _mm256_min_epi32(least, _mm256_castps_si256(hi));
                (
                    least,
                    _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(lo, hi)),
                )
            },
        );
        let negative_zero = _mm256_cmpeq_epi32(least, _mm256_set1_epi32(i32::MIN));
        _mm256_movemask_ps(_mm256_or_ps(_mm256_castsi256_ps(negative_zero), nan)) == 0
    });
    match columns {
        None => {
            // Column kk of fractal f: A's value at 256 f + kk, B's row at 256 f + 16 kk, both
            // inside fractal f, which `f < fractals` puts inside both operands.
            let fractals = a.len().min(b.len()) / 256;
            for f in 0..fractals {
                for kk in 0..16 {
                    add_column(&mut rows, f * 256 + kk, f * 256 + kk * 16);
                }
            }
        }
        Some((fractals, a_cols, b_rows)) => {
            // The offsets are of columns of the first `fractals` K fractals ([`GroupColumns`]),
            // inside both operands when these hold that many.
            assert!(
                fractals * 256 <= a.len().min(b.len()),
                "the columns are of {fractals} K fractals, more than the operands hold"
            );
            for (&a_col, &b_row) in a_cols.iter().zip(b_rows) {
                add_column(&mut rows, a_col as usize, b_row as usize);
            }
        }
    }
    for (r, row) in rows.iter().enumerate() {
        let at = (first + r) * 16;
        unsafe {
            _mm256_storeu_ps(acc[at..at + 8].as_mut_ptr(), row[0]);
            _mm256_storeu_ps(acc[at + 8..at + 16].as_mut_ptr(), row[1]);
        }
    }
}

/// A vector form of [`accumulate_portable`]; callable only on a host with its features.
#[cfg(target_arch = "x86_64")]
type VectorAccumulate = unsafe fn(&mut [f32; 256], &[f32], &[f32], Option<&GroupColumns>);

/// The vector forms of [`accumulate_portable`] this host can run, widest first, fused or not.
#[cfg(target_arch = "x86_64")]
fn vector_accumulates(fused: bool) -> impl Iterator<Item = (&'static str, VectorAccumulate)> {
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let avx2 =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    let (wide, narrow): (VectorAccumulate, VectorAccumulate) = if fused {
        (accumulate_avx512::<true>, accumulate_avx2::<true>)
    } else {
        (accumulate_avx512::<false>, accumulate_avx2::<false>)
    };
    [(avx512, ("avx512", wide)), (avx2, ("avx2", narrow))]
        .into_iter()
        .filter_map(|(has, form)| has.then_some(form))
}

/// [`accumulate_portable`] in the widest vectors the host has (the same bits in each), with
/// fused multiply-adds when the products are exact: the form is chosen once per product and
/// then run for each of its output fractals.
#[derive(Clone, Copy)]
struct Accumulator {
    #[cfg(target_arch = "x86_64")]
    vector: Option<VectorAccumulate>,
}

impl Accumulator {
    fn new(products: Products) -> Accumulator {
        let _ = products;
        Accumulator {
            #[cfg(target_arch = "x86_64")]
            vector: vector_accumulates(products == Products::Exact)
                .next()
                .map(|(_, form)| form),
        }
    }

    #[allow(unsafe_code)]
    fn run(self, acc: &mut [f32; 256], a: &[f32], b: &[f32], kept: Option<&GroupColumns>) {
        #[cfg(target_arch = "x86_64")]
        if let Some(form) = self.vector {
            // SAFETY: `vector_accumulates` lists only the forms whose target features the host
            // has (checked at run time), their only requirement.
            return unsafe { form(acc, a, b, kept) };
        }
        accumulate_portable(acc, a, b, kept);
    }
}

/// A 16-bit operand type of `mmad`: how its values widen to f32, and the bits of its
/// exponent (all ones in an infinity or a NaN).
#[derive(Clone, Copy)]
struct Operand {
    widen: fn(&[u8], &mut [f32]),
    exponent: u16,
}

impl Operand {
    const F16: Operand = Operand {
        widen: widen_f16,
        exponent: 0x7c00,
    };
    const BF16: Operand = Operand {
        widen: widen_bf16s,
        exponent: 0x7f80,
    };
}

pub(super) fn mmad(bufs: &mut Buffers, f: &Mmad, ops: &Operands) -> Result<(), Fault> {
    let [c, a, b, _] = ops.regs;
    let (mb, kb, nb) = (blocks(f.m), k_blocks(f), blocks(f.n));
    if mb * kb * nb == 0 {
        return Ok(());
    }
    let (l0a, l0b, l0c) = bufs.two_and_mut(Buffer::L0a, Buffer::L0b, Buffer::L0c);
    let a_bytes = &l0a[a as usize..][..(mb * kb * FRACTAL) as usize];
    let b_bytes = &l0b[b as usize..][..(kb * nb * FRACTAL) as usize];
    let accumulators = &mut l0c[c as usize..][..(mb * nb * FRACTAL_C) as usize];
    let (operand, exact) = match f.ty {
        DType::I8 => {
            mmad_i8((a_bytes, b_bytes), accumulators, [mb, kb, nb], f.init);
            return Ok(());
        }
        DType::Bf16 => (Operand::BF16, Products::Rounded),
        _ => (Operand::F16, Products::Exact),
    };
    // The widened operands go into this thread's scratch vectors, which only ever grow (so a
    // product allocates and zeroes nothing once the largest has been seen).
    thread_local! {
        static SCRATCH: std::cell::RefCell<Scratch> = const {
            std::cell::RefCell::new(Scratch::new())
        };
    }
    SCRATCH.with_borrow_mut(|scratch| {
        let operands = (a_bytes, b_bytes, operand);
        product_of(operands, accumulators, [mb, kb, nb], f.init, exact, scratch);
    });
    Ok(())
}

/// The product of `mmad` on its operands' bytes into (or, `init`, over) its accumulators'
/// bytes, by way of f32 operands widened into `scratch`; the products of A's zeros are left
/// out where that changes no bit ([`zeros_may_be_skipped`]). Returns whether they may be (a
/// row group whose accumulators start as -0 or NaN still adds every column).
fn product_of(
    (a_bytes, b_bytes, operand): (&[u8], &[u8], Operand),
    accumulators: &mut [u8],
    [mb, kb, nb]: [u64; 3],
    init: bool,
    exact: Products,
    scratch: &mut Scratch,
) -> bool {
    let Scratch { av, bv, nonzero } = scratch;
    let (a_len, b_len) = ((mb * kb * 256) as usize, (kb * nb * 256) as usize);
    grow(av, a_len);
    grow(bv, b_len);
    (operand.widen)(a_bytes, &mut av[..a_len]);
    (operand.widen)(b_bytes, &mut bv[..b_len]);
    let operands = (&av[..a_len], &bv[..b_len]);
    let skip = nonzero.find(a_bytes, [mb, kb]) && zeros_may_be_skipped(b_bytes, operand);
    let kept = skip.then_some(&*nonzero);
    products(accumulators, [mb, kb, nb], init, operands, exact, kept);
    skip
}

/// One host thread's scratch for `mmad`: the widened operands, and the nonzero columns of
/// each row group of A.
struct Scratch {
    av: Vec<f32>,
    bv: Vec<f32>,
    nonzero: NonzeroColumns,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            av: Vec::new(),
            bv: Vec::new(),
            nonzero: NonzeroColumns::new(),
        }
    }
}

fn grow<T: Default + Clone>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize(len, T::default());
    }
}

/// [`GroupColumns`] for every row of A's fractals: the columns of row `m_i`'s group `g` are
/// entries `ends[3 m_i + g - 1]..ends[3 m_i + g]` of `a_cols` and `b_rows`.
struct NonzeroColumns {
    fractals: usize,
    a_cols: Vec<u32>,
    b_rows: Vec<u32>,
    ends: Vec<usize>,
    /// Per K fractal of the row being scanned, its groups' nonzero columns (a bit each).
    masks: Vec<[u16; 3]>,
}

/// For each byte, the positions of its set bits, lowest first (the unused entries 0).
const SET_BITS: [[u8; 8]; 256] = {
    let mut table = [[0u8; 8]; 256];
    let mut byte = 0;
    while byte < 256 {
        let (mut bit, mut n) = (0, 0);
        while bit < 8 {
            if byte >> bit & 1 == 1 {
                table[byte][n] = bit as u8;
                n += 1;
            }
            bit += 1;
        }
        byte += 1;
    }
    table
};

impl NonzeroColumns {
    const fn new() -> NonzeroColumns {
        NonzeroColumns {
            fractals: 0,
            a_cols: Vec::new(),
            b_rows: Vec::new(),
            ends: Vec::new(),
            masks: Vec::new(),
        }
    }

    /// Finds the nonzero columns of every row group of A, from its bytes (`mb` × `kb`
    /// fractals of a 16-bit type, whose zeros are ±0: every bit but the sign clear); returns
    /// whether any product would be left out.
    fn find(&mut self, a_bytes: &[u8], [mb, kb]: [u64; 2]) -> bool {
        let (mb, kb) = (mb as usize, kb as usize);
        self.fractals = kb;
        // Each byte of a mask writes 8 entries at the end and keeps as many as it has bits
        // set, so the lists have room for every column and 8 more.
        let room = mb * ROW_GROUPS.len() * kb * 16 + 8;
        grow(&mut self.a_cols, room);
        grow(&mut self.b_rows, room);
        self.ends.clear();
        let mut len = 0;
        for m_i in 0..mb {
            self.masks.clear();
            for kbi in 0..kb {
                self.masks
                    .push(nonzero_in_groups(&a_bytes[(m_i * kb + kbi) * 512..][..512]));
            }
            for g in 0..ROW_GROUPS.len() {
                for (kbi, masks) in self.masks.iter().enumerate() {
                    for (half, byte) in masks[g].to_le_bytes().into_iter().enumerate() {
                        // Column kk of fractal kbi: A's value at 256 kbi + kk, B's row at
                        // 256 kbi + 16 kk.
                        let first = [kbi * 256 + half * 8, kbi * 256 + half * 128];
                        let into = (&mut self.a_cols[len..], &mut self.b_rows[len..]);
                        put_columns(byte, first.map(|f| f as u32), into);
                        len += byte.count_ones() as usize;
                    }
                }
                self.ends.push(len);
            }
        }
        len < mb * ROW_GROUPS.len() * kb * 16
    }

    /// The columns of each row group of row `m_i` of A's fractals.
    fn of(&self, m_i: usize) -> GroupColumns<'_> {
        let span = |g: usize| {
            let i = m_i * ROW_GROUPS.len() + g;
            (if i == 0 { 0 } else { self.ends[i - 1] })..self.ends[i]
        };
        GroupColumns {
            fractals: self.fractals,
            a_cols: std::array::from_fn(|g| &self.a_cols[span(g)]),
            b_rows: std::array::from_fn(|g| &self.b_rows[span(g)]),
        }
    }
}

/// Writes the columns of a fractal half's set bits (`byte`: bit j for its column j) into
/// the first entries of `a_cols` and `b_rows` (8 entries are written, as many kept as the
/// byte has bits set): A's offset `a_first + j` and B's `b_first + 16 j` for each bit j.
fn put_columns(byte: u8, [a_first, b_first]: [u32; 2], (a_cols, b_rows): (&mut [u32], &mut [u32])) {
    let bits = &SET_BITS[usize::from(byte)];
    #[cfg(target_arch = "x86_64")]
    {
        put_columns_sse2(bits, [a_first, b_first], (a_cols, b_rows));
    }
    #[cfg(not(target_arch = "x86_64"))]
    put_columns_portable(bits, [a_first, b_first], (a_cols, b_rows));
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn put_columns_portable(
    bits: &[u8; 8],
    [a_first, b_first]: [u32; 2],
    (a_cols, b_rows): (&mut [u32], &mut [u32]),
) {
    for (j, &bit) in bits.iter().enumerate() {
        a_cols[j] = a_first + u32::from(bit);
        b_rows[j] = b_first + u32::from(bit) * 16;
    }
}

/// [`put_columns_portable`] in SSE2 (every x86-64 host has it): the 8 bit positions widened
/// to two registers of 4 offsets, for each of A and B.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn put_columns_sse2(
    bits: &[u8; 8],
    [a_first, b_first]: [u32; 2],
    (a_cols, b_rows): (&mut [u32], &mut [u32]),
) {
    use std::arch::x86_64::{
        _mm_add_epi32, _mm_loadl_epi64, _mm_set1_epi32, _mm_setzero_si128, _mm_slli_epi32,
        _mm_storeu_si128, _mm_unpackhi_epi16, _mm_unpacklo_epi8, _mm_unpacklo_epi16,
    };
    let (a_cols, b_rows) = (&mut a_cols[..8], &mut b_rows[..8]);
    // SAFETY: the load reads the 8 bytes of `bits`; each store writes 4 u32 at entry 0 or 4
    // of the 8 `a_cols` / `b_rows` entries (sliced above), so in bounds; unaligned forms.
    // The other intrinsics are SSE2 register operations. The offsets fit an i32 (a K fractal
    // offset of an L0 buffer), so the signed SSE2 `set1` keeps their bits.
    unsafe {
        let zero = _mm_setzero_si128();
        let positions = _mm_unpacklo_epi8(_mm_loadl_epi64(bits.as_ptr().cast()), zero);
        let halves = [
            _mm_unpacklo_epi16(positions, zero),
            _mm_unpackhi_epi16(positions, zero),
        ];
        let (a_base, b_base) = (
            _mm_set1_epi32(a_first as i32),
            _mm_set1_epi32(b_first as i32),
        );
        for (i, half) in halves.into_iter().enumerate() {
            _mm_storeu_si128(
                a_cols[i * 4..].as_mut_ptr().cast(),
                _mm_add_epi32(half, a_base),
            );
            let rows = _mm_add_epi32(_mm_slli_epi32::<4>(half), b_base);
            _mm_storeu_si128(b_rows[i * 4..].as_mut_ptr().cast(), rows);
        }
    }
}

/// Per row group ([`ROW_GROUPS`]) of a 16 × 16 fractal of a 16-bit type (512 bytes), its
/// nonzero columns: bit `kk` of group `g` is set when element (r, kk) is not ±0 for a row r
/// of the group.
fn nonzero_in_groups(fractal: &[u8]) -> [u16; 3] {
    #[cfg(target_arch = "x86_64")]
    {
        nonzero_in_groups_sse2(fractal)
    }
    #[cfg(not(target_arch = "x86_64"))]
    nonzero_in_groups_portable(fractal)
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn nonzero_in_groups_portable(fractal: &[u8]) -> [u16; 3] {
    ROW_GROUPS.map(|(first, rows)| {
        (first..first + rows).fold(0u16, |m, r| {
            (0..16).fold(m, |m, kk| {
                let at = (r * 16 + kk) * 2;
                let bits = u16::from_le_bytes([fractal[at], fractal[at + 1]]);
                m | u16::from(bits & 0x7fff != 0) << kk
            })
        })
    })
}

/// [`nonzero_in_groups_portable`] in SSE2 (every x86-64 host has it). An element is
/// nonzero in some row of a group exactly when the OR of the group's rows, sign cleared, is
/// nonzero there, so the rows are ORed first (a row is two registers of 8 values) and only
/// the OR is compared with zero, packed to bytes and read as a 16-bit mask of the zeros.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
fn nonzero_in_groups_sse2(fractal: &[u8]) -> [u16; 3] {
    use std::arch::x86_64::{
        _mm_and_si128, _mm_cmpeq_epi16, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
        _mm_packs_epi16, _mm_set1_epi16, _mm_setzero_si128,
    };
    let fractal = &fractal[..512];
    let mut groups = [0u16; 3];
    for (mask, &(first, rows)) in groups.iter_mut().zip(&ROW_GROUPS) {
        // SAFETY: each row is sliced to its 32 bytes of the 512-byte fractal (rows r < 16),
        // and the loads read its two halves of 16, in bounds; unaligned forms. The other
        // intrinsics are SSE2 register operations.
        let zeros = unsafe {
            let (mut lo, mut hi) = (_mm_setzero_si128(), _mm_setzero_si128());
            for r in first..first + rows {
                let row = fractal[r * 32..][..32].as_ptr();
                lo = _mm_or_si128(lo, _mm_loadu_si128(row.cast()));
                hi = _mm_or_si128(hi, _mm_loadu_si128(row.add(16).cast()));
            }
            let (magnitude, zero) = (_mm_set1_epi16(0x7fff), _mm_setzero_si128());
            let lo = _mm_cmpeq_epi16(_mm_and_si128(lo, magnitude), zero);
            let hi = _mm_cmpeq_epi16(_mm_and_si128(hi, magnitude), zero);
            _mm_movemask_epi8(_mm_packs_epi16(lo, hi))
        };
        *mask = !(zeros as u16);
    }
    groups
}

/// Whether the products of A's zeros may be left out of an `mmad` with no bit changed, as
/// far as B decides. A product of ±0 and a finite value is ±0, and adding ±0 to an
/// accumulator changes it only when the accumulator is -0 (or a signalling NaN). An
/// accumulator that starts neither -0 nor NaN never becomes -0 (a round-to-nearest sum is -0
/// only when both of its terms are), so the products may go when every B value is finite
/// and no accumulator of the rows they would go from starts as -0 or NaN
/// ([`clean_accumulators`], checked per row group where the accumulators are loaded); the
/// others are still added in ascending k. Zeros are common in A: every ReLU's output, the
/// padding of a convolution's borders and of channels to a fractal (a 3-channel image's 16
/// in a stem convolution without AIPP), and the channels a ReLU leaves all zero.
fn zeros_may_be_skipped(b_bytes: &[u8], operand: Operand) -> bool {
    // A fold without an early exit, so that it runs in vectors.
    let non_finite = b_bytes.chunks_exact(2).fold(0u16, |seen, h| {
        let exponent = u16::from_le_bytes([h[0], h[1]]) & operand.exponent;
        seen | u16::from(exponent == operand.exponent)
    });
    non_finite == 0
}

/// Whether no accumulator in `acc` is -0 or NaN, so that the products of A's zeros may be
/// left out of its sums ([`zeros_may_be_skipped`]).
fn clean_accumulators(acc: &[f32]) -> bool {
    acc.iter().fold(0u32, |seen, v| {
        let bits = v.to_bits();
        seen | u32::from(bits == 0x8000_0000 || bits & 0x7fff_ffff > 0x7f80_0000)
    }) == 0
}

/// The f32 products of an `mmad` whose widened operands are `av` (`mb` × `kb` fractals)
/// and `bv` (`nb` × `kb`), into (or, `init`, over) its accumulators' bytes `l0c`, over
/// A's `kept` columns when given.
fn products(
    l0c: &mut [u8],
    [mb, kb, nb]: [u64; 3],
    init: bool,
    (av, bv): (&[f32], &[f32]),
    exact: Products,
    kept: Option<&NonzeroColumns>,
) {
    let accumulate = Accumulator::new(exact);
    let mut acc = [0f32; 256];
    for n_i in 0..nb {
        for m_i in 0..mb {
            let cbase = ((n_i * mb + m_i) * FRACTAL_C) as usize;
            let a_row = &av[(m_i * kb * 256) as usize..][..(kb * 256) as usize];
            let b_col = &bv[(n_i * kb * 256) as usize..][..(kb * 256) as usize];
            let columns = kept.map(|k| k.of(m_i as usize));
            let columns = columns.as_ref();
            // On a little-endian host an aligned fractal of L0C is its 256 accumulators as
            // they are: add into them where they lie, without copying them out and back.
            let fractal = &mut l0c[cbase..cbase + FRACTAL_C as usize];
            if cfg!(target_endian = "little") {
                if init {
                    fractal.fill(0);
                }
                if let Ok(acc) = <[f32; 256] as zerocopy::FromBytes>::mut_from_bytes(fractal) {
                    accumulate.run(acc, a_row, b_col, columns);
                    continue;
                }
            }
            if init {
                acc = [0.0; 256];
            } else {
                for (v, b) in acc
                    .iter_mut()
                    .zip(l0c[cbase..cbase + FRACTAL_C as usize].chunks_exact(4))
                {
                    *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            accumulate.run(&mut acc, a_row, b_col, columns);
            for (v, b) in acc
                .iter()
                .zip(l0c[cbase..cbase + FRACTAL_C as usize].chunks_exact_mut(4))
            {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// The i8 product of operand bytes `av` and `bv` into (or, `init`, over) its accumulators'
/// bytes `l0c`: i32 accumulators, products summed in ascending k order (wrapping, though a
/// sum of i8 products needs over 2^17 terms to leave the i32 range).
fn mmad_i8((av, bv): (&[u8], &[u8]), l0c: &mut [u8], [mb, kb, nb]: [u64; 3], init: bool) {
    let mut acc = [0i32; 256];
    for n_i in 0..nb {
        for m_i in 0..mb {
            let cbase = ((n_i * mb + m_i) * FRACTAL_C) as usize;
            let cfrac = &mut l0c[cbase..cbase + FRACTAL_C as usize];
            for (v, b) in acc.iter_mut().zip(cfrac.chunks_exact(4)) {
                *v = if init {
                    0
                } else {
                    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
                };
            }
            for k_i in 0..kb {
                let af = &av[((m_i * kb + k_i) * FRACTAL) as usize..][..FRACTAL as usize];
                let bf = &bv[((n_i * kb + k_i) * FRACTAL) as usize..][..FRACTAL as usize];
                for i in 0..16 {
                    let arow = &af[i * 32..i * 32 + 32];
                    for j in 0..16 {
                        let brow = &bf[j * 32..j * 32 + 32];
                        let dot = arow.iter().zip(brow).fold(0i32, |s, (&x, &y)| {
                            s + i32::from(x as i8) * i32::from(y as i8)
                        });
                        acc[i * 16 + j] = acc[i * 16 + j].wrapping_add(dot);
                    }
                }
            }
            for (v, b) in acc.iter().zip(cfrac.chunks_exact_mut(4)) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

fn out_size(ty: DType) -> u64 {
    ty.size() as u64
}

pub(super) fn plan_l0c_to_ub(f: &L0cToUb, ops: &Operands) -> Plan {
    let [dst, src, _, _] = ops.regs;
    let n = u64::from(f.nfrac);
    let out = 256 * out_size(f.ty);
    Plan::new(
        n * FRACTAL_C,
        0,
        &[
            Access {
                buffer: Buffer::L0c,
                start: src,
                burst: FRACTAL_C,
                stride: (1 + u64::from(f.src_gap)) * FRACTAL_C,
                count: n,
                write: false,
            },
            Access {
                buffer: Buffer::Ub,
                start: dst,
                burst: out,
                stride: (1 + u64::from(f.dst_gap)) * out,
                count: n,
                write: true,
            },
        ],
    )
}

/// Bytes of one channel block's 16 f32 values in UB.
const FILL_ROW: u64 = units::FRACTAL_ROW_BYTES_F32;

/// The work is the L0C bytes written (the L0C datapath's rate, as for `copy_l0c_to_ub`).
pub(super) fn plan_l0c_fill(f: &L0cFill, ops: &Operands) -> Plan {
    let [dst, src, _, _] = ops.regs;
    let (nblk, nfrac) = (u64::from(f.nblk), u64::from(f.nfrac));
    Plan::new(
        nblk * nfrac * FRACTAL_C,
        0,
        &[
            Access {
                buffer: Buffer::Ub,
                start: src,
                burst: FILL_ROW,
                stride: FILL_ROW,
                count: nblk,
                write: false,
            },
            Access {
                buffer: Buffer::L0c,
                start: dst,
                burst: nfrac * FRACTAL_C,
                stride: nfrac * FRACTAL_C,
                count: nblk,
                write: true,
            },
        ],
    )
}

/// `broadcast_l1_to_l0c`: the same rows from L1; the work is the bias bytes the bias table
/// takes in (the accumulator's initialisation from it is part of the cube's own start).
pub(super) fn plan_l1_fill(f: &L0cFill, ops: &Operands) -> Plan {
    let fill = plan_l0c_fill(f, ops);
    let (mut src, dst) = (fill.accesses()[0], fill.accesses()[1]);
    src.buffer = Buffer::L1;
    // The rows pass through the bias table, which must hold them all.
    let table = Access::range(Buffer::Bt, 0, u64::from(f.nblk) * FILL_ROW, true);
    Plan::new(u64::from(f.nblk) * FILL_ROW, 0, &[src, table, dst])
}

pub(super) fn l1_fill(bufs: &mut Buffers, f: &L0cFill, ops: &Operands) -> Result<(), Fault> {
    fill_rows(bufs, &plan_l0c_fill(f, ops), Buffer::L1)
}

pub(super) fn l0c_fill(bufs: &mut Buffers, f: &L0cFill, ops: &Operands) -> Result<(), Fault> {
    fill_rows(bufs, &plan_l0c_fill(f, ops), Buffer::Ub)
}

/// Writes each source row of a fill plan to every row of its L0C range.
fn fill_rows(bufs: &mut Buffers, plan: &Plan, from: Buffer) -> Result<(), Fault> {
    let (src, dst) = (plan.accesses()[0], plan.accesses()[1]);
    let (ub, l0c) = bufs.pair_mut(from, Buffer::L0c);
    for j in 0..src.count {
        let s = (src.start + j * src.stride) as usize;
        let row = &ub[s..s + FILL_ROW as usize];
        let d = (dst.start + j * dst.stride) as usize;
        for r in l0c[d..d + dst.burst as usize].chunks_exact_mut(FILL_ROW as usize) {
            r.copy_from_slice(row);
        }
    }
    Ok(())
}

fn store_out(buf: &mut [u8], at: usize, ty: DType, mut v: f32, relu: bool) {
    if relu && v < 0.0 {
        v = 0.0;
    }
    match ty {
        DType::F16 => buf[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes()),
        DType::Bf16 => buf[at..at + 2].copy_from_slice(&bf16::from_f32(v).to_bits().to_le_bytes()),
        // `copy_l0c_to_ub` and the FIXPIPE's 4-byte outputs without dequantisation carry the
        // accumulator's bits (f32, or i32 from an i8 product) as they are.
        DType::F32 | DType::I32 | DType::I16 | DType::U8 | DType::I8 => {
            buf[at..at + 4].copy_from_slice(&v.to_le_bytes())
        }
    }
}

#[inline]
fn load_c(l0c: &[u8], at: usize) -> f32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&l0c[at..at + 4]);
    f32::from_le_bytes(b)
}

/// `copy_l0c_to_gm_nz`: `copy_l0c_to_ub`'s fractals and layout, written to GM by the FIXPIPE.
pub(super) fn plan_l0c_to_gm_nz(f: &L0cToUb, ops: &Operands) -> Plan {
    let ub = plan_l0c_to_ub(f, ops);
    let (src, mut dst) = (ub.accesses()[0], ub.accesses()[1]);
    dst.buffer = Buffer::Gm;
    Plan::new(dst.burst * dst.count, dst.burst * dst.count, &[src, dst])
}

pub(super) fn l0c_to_gm_nz(
    bufs: &mut Buffers,
    mem: &mut impl GmValues,
    f: &L0cToUb,
    ops: &Operands,
) -> Result<(), Fault> {
    let plan = plan_l0c_to_gm_nz(f, ops);
    let (src, dst) = (plan.accesses()[0], plan.accesses()[1]);
    let mut fractal = vec![0u8; dst.burst as usize];
    for i in 0..dst.count {
        convert_fractal(
            bufs.get(Buffer::L0c),
            &mut fractal,
            f,
            src.start + i * src.stride,
            0,
        );
        let a = dst.start + i * dst.stride;
        mem.write(a, &fractal).map_err(|_| Fault::Range {
            buffer: Buffer::Gm,
            addr: a,
            len: fractal.len() as u64,
            size: mem.capacity(),
        })?;
    }
    Ok(())
}

/// `copy_l0c_to_l1`: `copy_l0c_to_ub`'s fractals and layout, written into L1 by the FIXPIPE.
pub(super) fn plan_l0c_to_l1(f: &L0cToUb, ops: &Operands) -> Plan {
    let ub = plan_l0c_to_ub(f, ops);
    let (src, mut dst) = (ub.accesses()[0], ub.accesses()[1]);
    dst.buffer = Buffer::L1;
    Plan::new(ub.work, 0, &[src, dst])
}

pub(super) fn l0c_to_l1(bufs: &mut Buffers, f: &L0cToUb, ops: &Operands) -> Result<(), Fault> {
    convert_fractals(bufs, &plan_l0c_to_l1(f, ops), f)
}

pub(super) fn l0c_to_ub(bufs: &mut Buffers, f: &L0cToUb, ops: &Operands) -> Result<(), Fault> {
    convert_fractals(bufs, &plan_l0c_to_ub(f, ops), f)
}

/// Converts each L0C fractal of `plan` (source access first) into its local destination.
fn convert_fractals(bufs: &mut Buffers, plan: &Plan, f: &L0cToUb) -> Result<(), Fault> {
    let (src, dst) = (plan.accesses()[0], plan.accesses()[1]);
    let (l0c, ub) = bufs.pair_mut(Buffer::L0c, dst.buffer);
    for i in 0..src.count {
        convert_fractal(
            l0c,
            ub,
            f,
            src.start + i * src.stride,
            dst.start + i * dst.stride,
        );
    }
    Ok(())
}

/// Converts the L0C fractal at byte `s` of `l0c` into `out` at byte `d` as `f.ty` (ReLU
/// first when `f.relu`).
fn convert_fractal(l0c: &[u8], out: &mut [u8], f: &L0cToUb, s: u64, d: u64) {
    let size = out_size(f.ty) as usize;
    let (s, d) = (s as usize, d as usize);
    if f.ty == DType::F16 {
        // A fractal at a time: the relu, then the slice conversion (the bits of
        // `f16::from_f32`, as `store_out` gives).
        let mut v = [0f32; 256];
        for (x, b) in v
            .iter_mut()
            .zip(l0c[s..s + FRACTAL_C as usize].chunks_exact(4))
        {
            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if f.relu && *x < 0.0 {
                *x = 0.0;
            }
        }
        narrow_f16(&v, &mut out[d..d + 512]);
        return;
    }
    if size == 4 && !f.relu {
        // 4-byte outputs carry the accumulators' bits as they are (`store_out`).
        out[d..d + 1024].copy_from_slice(&l0c[s..s + 1024]);
        return;
    }
    for e in 0..256 {
        store_out(out, d + e * size, f.ty, load_c(l0c, s + e * 4), f.relu);
    }
}

pub(super) fn plan_l0c_to_gm(f: &L0cToGm, ops: &Operands) -> Plan {
    let [dst, src, scale, _] = ops.regs;
    let (m, n) = (u64::from(f.m), u64::from(f.n));
    let size = out_size(f.ty);
    let row = n * size;
    let l0c = Access::range(
        Buffer::L0c,
        src,
        blocks(f.m) * blocks(f.n) * FRACTAL_C,
        false,
    );
    let gm = Access {
        buffer: Buffer::Gm,
        start: dst,
        burst: row,
        stride: u64::from(f.dst_stride) * size,
        count: m,
        write: true,
    };
    let (work, traffic) = (m * row, m * row.div_ceil(32) * 32);
    match f.quant {
        Quant::Vdeq => Plan::new(
            work,
            traffic,
            &[l0c, gm, Access::range(Buffer::Fb, scale, 4 * n, false)],
        ),
        Quant::None | Quant::Deq => Plan::new(work, traffic, &[l0c, gm]),
    }
}

/// An L0C accumulator as the FIXPIPE's quantisation stage leaves it: the f32 itself, or the
/// i32 times its scale (computed in f32).
#[inline]
fn dequantised(l0c: &[u8], at: usize, quant: Quant, scale: f32) -> f32 {
    match quant {
        Quant::None => load_c(l0c, at),
        Quant::Deq | Quant::Vdeq => {
            let mut b = [0u8; 4];
            b.copy_from_slice(&l0c[at..at + 4]);
            i32::from_le_bytes(b) as f32 * scale
        }
    }
}

pub(super) fn l0c_to_gm(
    bufs: &mut Buffers,
    mem: &mut impl GmValues,
    f: &L0cToGm,
    ops: &Operands,
) -> Result<(), Fault> {
    let [dst, src, scale, _] = ops.regs;
    let (m, n) = (u64::from(f.m), u64::from(f.n));
    let mbs = blocks(f.m);
    let size = out_size(f.ty) as usize;
    // The scale of each column: one for `deq`, one per column from the FB for `vdeq` (none
    // without dequantisation).
    let scales: Vec<f32> = match f.quant {
        Quant::None => Vec::new(),
        Quant::Deq => vec![f32::from_bits(scale as u32); n as usize],
        Quant::Vdeq => bufs.get(Buffer::Fb)[scale as usize..(scale + 4 * n) as usize]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    };
    let l0c = bufs.get(Buffer::L0c);
    let mut row = vec![0u8; n as usize * size];
    for i in 0..m {
        for j in 0..n {
            let at = (src + ((j / 16) * mbs + i / 16) * FRACTAL_C + ((i % 16) * 16 + j % 16) * 4)
                as usize;
            let v = dequantised(
                l0c,
                at,
                f.quant,
                scales.get(j as usize).copied().unwrap_or(1.0),
            );
            store_out(&mut row, j as usize * size, f.ty, v, f.relu);
        }
        let a = dst + i * u64::from(f.dst_stride) * size as u64;
        mem.write(a, &row).map_err(|_| Fault::Range {
            buffer: Buffer::Gm,
            addr: a,
            len: row.len() as u64,
            size: mem.capacity(),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ChipConfig;
    use crate::exec::Mask;
    use gearsim_isa::{FMatrix, Reg};

    /// The fractal-at-a-time paths of `copy_l0c_to_ub` (f16, and f32 without relu as one
    /// copy) write the bits the per-element `store_out` writes, for ordinary, tiny, huge,
    /// signed-zero and NaN values, with and without relu.
    #[test]
    fn l0c_to_ub_matches_the_per_element_conversion() {
        let specials = [
            0.0f32,
            -0.0,
            1.0,
            -1.5,
            65504.0,
            65520.0,
            -70000.0,
            1e-8,
            -3e-5,
            5.96e-8,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.0 + 2f32.powi(-11),
        ];
        let mut x = 7u32;
        let values: Vec<f32> = (0..512)
            .map(|i| {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                specials
                    .get(i % 40)
                    .copied()
                    .unwrap_or(f32::from_bits(x) % 70000.0)
            })
            .collect();
        for (ty, relu) in [
            (DType::F16, false),
            (DType::F16, true),
            (DType::F32, false),
            (DType::F32, true),
        ] {
            let mut bufs = Buffers::new(
                &ChipConfig::preset("ascend910").unwrap(),
                crate::CoreKind::Coupled,
            );
            for (i, v) in values.iter().enumerate() {
                bufs.get_mut(Buffer::L0c)[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            let f = L0cToUb {
                ty,
                dst: Reg::new(1).unwrap(),
                src: Reg::new(2).unwrap(),
                nfrac: 2,
                src_gap: 0,
                dst_gap: 0,
                relu,
            };
            let ops = Operands {
                regs: [0, 0, 0, 0],
                mask: Mask::FULL,
                fmatrix: FMatrix::RESET,
            };
            l0c_to_ub(&mut bufs, &f, &ops).unwrap();
            let size = ty.size();
            let mut want = vec![0u8; 512 * size];
            for (i, v) in values.iter().enumerate() {
                store_out(&mut want, i * size, ty, *v, relu);
            }
            assert_eq!(
                &bufs.get(Buffer::Ub)[..want.len()],
                &want[..],
                "{ty:?} relu {relu}"
            );
        }
    }

    #[test]
    fn a_fill_writes_each_blocks_row_to_every_row_of_its_fractals() {
        let mut bufs = Buffers::new(
            &ChipConfig::preset("ascend310p").unwrap(),
            crate::CoreKind::Coupled,
        );
        // Two blocks of 16 f32 values at UB 64 (rows 64 bytes apart), three fractals each,
        // into L0C from 2048.
        for (i, b) in bufs.get_mut(Buffer::Ub)[64..192]
            .chunks_exact_mut(4)
            .enumerate()
        {
            b.copy_from_slice(&(i as f32 - 7.5).to_le_bytes());
        }
        let f = L0cFill {
            dst: Reg::new(1).unwrap(),
            src: Reg::new(2).unwrap(),
            nblk: 2,
            nfrac: 3,
        };
        let ops = Operands {
            regs: [2048, 64, 0, 0],
            mask: Mask::FULL,
            fmatrix: FMatrix::RESET,
        };
        let plan = plan_l0c_fill(&f, &ops);
        assert_eq!(
            plan.work,
            2 * 3 * FRACTAL_C,
            "the work is the L0C bytes written"
        );
        l0c_fill(&mut bufs, &f, &ops).unwrap();
        let l0c = bufs.get(Buffer::L0c);
        assert!(l0c[..2048].iter().all(|&b| b == 0), "nothing before dst");
        for block in 0..2 {
            for row in 0..48 {
                for col in 0..16 {
                    let at = 2048 + (block * 48 + row) * 64 + col * 4;
                    let v = f32::from_le_bytes(l0c[at..at + 4].try_into().unwrap());
                    assert_eq!(
                        v,
                        (block * 16 + col) as f32 - 7.5,
                        "block {block} row {row}"
                    );
                }
            }
        }
        assert!(
            l0c[2048 + 6 * 1024..].iter().all(|&b| b == 0),
            "nothing after"
        );
    }

    /// Values in [-500, 500) from a seeded linear congruential generator.
    fn draws(mut seed: u64) -> impl FnMut() -> f32 {
        move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e3
        }
    }

    /// An L0C fractal that is not 4-byte aligned is copied out, added into and copied back;
    /// an aligned one is added into where it lies. Both give the same bits, with and without
    /// `init`.
    #[test]
    fn products_in_place_and_copied_agree() {
        let (mb, kb, nb) = (2u64, 3u64, 2u64);
        let mut draw = draws(0x9e37_79b9);
        let av: Vec<f32> = (0..mb * kb * 256).map(|_| draw()).collect();
        let bv: Vec<f32> = (0..kb * nb * 256).map(|_| draw()).collect();
        let start: Vec<u8> = (0..mb * nb * 256)
            .flat_map(|_| draw().to_le_bytes())
            .collect();
        for init in [false, true] {
            let mut buf = vec![0u8; start.len() + 4];
            let base = buf.as_ptr() as usize;
            let at = |aligned: bool| {
                (0..4)
                    .find(|o| (base + o).is_multiple_of(4) == aligned)
                    .expect("four offsets hold both kinds")
            };
            let mut results = Vec::new();
            for aligned in [true, false] {
                let o = at(aligned);
                let l0c = &mut buf[o..o + start.len()];
                l0c.copy_from_slice(&start);
                products(l0c, [mb, kb, nb], init, (&av, &bv), Products::Rounded, None);
                results.push(l0c.to_vec());
            }
            assert_eq!(results[0], results[1], "init {init}");
            assert_ne!(results[0], start, "the products changed the accumulators");
        }
    }

    /// Every vector width gives the bits of the portable loop (products added one at a time
    /// in ascending k), never fused on values that round differently in every order, and
    /// fused on f16 values, whose products are exact.
    #[test]
    #[allow(unsafe_code)]
    fn every_accumulate_path_gives_the_same_bits() {
        let mut draw = draws(0x1234_5678);
        let a: Vec<f32> = (0..256 * 5).map(|_| draw()).collect();
        let b: Vec<f32> = (0..256 * 5).map(|_| draw()).collect();
        let start: [f32; 256] = std::array::from_fn(|_| draw());
        let mut portable = start;
        accumulate_portable(&mut portable, &a, &b, None);
        let mut dispatched = start;
        Accumulator::new(Products::Rounded).run(&mut dispatched, &a, &b, None);
        assert_eq!(portable.map(f32::to_bits), dispatched.map(f32::to_bits));
        for (name, v) in vector_paths(start, (&a, &b), None, false) {
            assert_eq!(portable.map(f32::to_bits), v.map(f32::to_bits), "{name}");
        }
        // And the products are the textbook ones, summed in ascending k.
        let mut by_hand = start;
        for (af, bf) in a.chunks_exact(256).zip(b.chunks_exact(256)) {
            for i in 0..16 {
                for j in 0..16 {
                    for k in 0..16 {
                        by_hand[i * 16 + j] += af[i * 16 + k] * bf[k * 16 + j];
                    }
                }
            }
        }
        assert_eq!(portable.map(f32::to_bits), by_hand.map(f32::to_bits));
    }

    /// What each vector path of this host computes from `start`, `a` and `b` (fused or not).
    #[allow(unsafe_code)]
    fn vector_paths(
        start: [f32; 256],
        (a, b): (&[f32], &[f32]),
        kept: Option<&GroupColumns>,
        fused: bool,
    ) -> Vec<(&'static str, [f32; 256])> {
        let mut out = Vec::new();
        #[cfg(target_arch = "x86_64")]
        for (name, form) in vector_accumulates(fused) {
            let mut v = start;
            // SAFETY: the host has the form's target features (`vector_accumulates` checks).
            unsafe { form(&mut v, a, b, kept) };
            out.push((name, v));
        }
        let _ = (a, b, kept, fused);
        out
    }

    /// On f16 operands a fused multiply-add gives the bits of a multiplication and an
    /// addition, because the product is exact: across the whole f16 range (subnormals, the
    /// largest finite values, signed zeros and infinities, whose products with zero make the
    /// default NaN), onto accumulators from f32's whole range, the fused paths and the
    /// dispatch give the portable loop's bits.
    #[test]
    fn fused_products_of_f16_operands_give_the_unfused_bits() {
        let lcg = |mut seed: u64| {
            move || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                seed >> 16
            }
        };
        let mut next = lcg(0x05ee_df16);
        let mut other = lcg(0xacc0_0f32);
        // Any f16 but a NaN: random bits, with the extremes often.
        let special = [
            0x0001u16, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0, 0x8000, 0x7c00, 0xfc00,
        ];
        let mut half = || {
            let r = next();
            let bits = if r % 8 == 0 {
                special[(r >> 3) as usize % special.len()]
            } else {
                (r >> 3) as u16
            };
            let v = half::f16::from_bits(bits);
            if v.is_nan() { 1.0 } else { v.to_f32() }
        };
        for case in 0..40 {
            let k = 1 + case % 6;
            let a: Vec<f32> = (0..256 * k).map(|_| half()).collect();
            let b: Vec<f32> = (0..256 * k).map(|_| half()).collect();
            let start: [f32; 256] = std::array::from_fn(|_| {
                let v = f32::from_bits(other() as u32);
                if v.is_nan() { 0.5 } else { v }
            });
            let mut portable = start;
            accumulate_portable(&mut portable, &a, &b, None);
            let mut dispatched = start;
            Accumulator::new(Products::Exact).run(&mut dispatched, &a, &b, None);
            let bits = |v: [f32; 256]| v.map(f32::to_bits);
            assert_eq!(bits(portable), bits(dispatched), "case {case}: dispatch");
            for (name, v) in vector_paths(start, (&a, &b), None, true) {
                assert_eq!(bits(portable), bits(v), "case {case}: {name}");
            }
        }
    }

    /// Leaving out the products of A's zeros (columns that are zero in whole row groups, as
    /// a ReLU's dead channels or a 2-channel convolution's padding, and scattered zeros,
    /// +0 and -0) gives the bits of the whole product, for f16 and bf16, with and without
    /// `init`; and nothing is left out where that would change a bit: from the row group of
    /// an accumulator that starts as -0 (row 0's kept products are all -0, its left-out ones
    /// +0) or NaN, or anywhere when B holds an infinity.
    #[test]
    fn skipping_zero_products_keeps_every_bit() {
        let (mb, kb, nb) = (2u64, 8u64, 3u64);
        let mut draw = draws(0x5eed_0c04);
        for (operand, exact) in [
            (Operand::F16, Products::Exact),
            (Operand::BF16, Products::Rounded),
        ] {
            let bits = |v: f32| -> u16 {
                if operand.exponent == 0x7c00 {
                    f16::from_f32(v).to_bits()
                } else {
                    bf16::from_f32(v).to_bits()
                }
            };
            let to_bytes =
                |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|h| h.to_le_bytes()).collect() };
            // A: fractal (m_i, kbi), row r, column kk. Columns 0 and 1 carry values (row 0 of
            // the first row of fractals -0); column 5 only in rows 7 and 13 (so it stays in
            // two groups and goes from the first); the others are +0 or -0.
            let a: Vec<u16> = (0..mb * kb * 256)
                .map(|i| {
                    let (m_i, r, kk) = (i / (kb * 256), i % 256 / 16, i % 16);
                    match (kk < 2 || kk == 5 && (r == 7 || r == 13), m_i == 0 && r == 0) {
                        (true, true) => 0x8000,
                        (true, false) => bits(draw()),
                        (false, _) => {
                            if i % 5 == 0 {
                                0x8000
                            } else {
                                0
                            }
                        }
                    }
                })
                .collect();
            let b: Vec<u16> = (0..kb * nb * 256)
                .map(|_| bits(draw().abs() + 1.0))
                .collect();
            let start: Vec<f32> = (0..mb * nb * 256).map(|_| draw()).collect();
            let mut scratch = Scratch::new();
            let mut run = |b: &[u16], start: &[f32], init: bool| {
                let (a_bytes, b_bytes) = (to_bytes(&a), to_bytes(b));
                let acc_bytes: Vec<u8> = start.iter().flat_map(|v| v.to_le_bytes()).collect();
                let mut skipped = acc_bytes.clone();
                let operands = (&a_bytes[..], &b_bytes[..], operand);
                let took = product_of(
                    operands,
                    &mut skipped,
                    [mb, kb, nb],
                    init,
                    exact,
                    &mut scratch,
                );
                let (mut av, mut bv) = (vec![0.0; a.len()], vec![0.0; b.len()]);
                (operand.widen)(&a_bytes, &mut av);
                (operand.widen)(&b_bytes, &mut bv);
                let mut whole = acc_bytes;
                products(&mut whole, [mb, kb, nb], init, (&av, &bv), exact, None);
                assert_eq!(skipped, whole);
                took
            };
            assert!(run(&b, &start, true), "init: skipped");
            assert!(run(&b, &start, false), "adding: skipped");
            // Row 0's accumulators start as -0: the whole product makes +0 of them.
            let mut negative_zero = start.clone();
            for n_i in 0..nb as usize {
                negative_zero[n_i * mb as usize * 256..][..16].fill(-0.0);
            }
            // (the row groups with a -0 or NaN accumulator add every column; `run` checks
            // the bits)
            run(&b, &negative_zero, false);
            run(&b, &negative_zero, true);
            let mut nan = start.clone();
            nan[7] = f32::from_bits(0x7f80_0001);
            run(&b, &nan, false);
            // An infinity in a skipped row of B makes NaN products in the whole product.
            let mut infinite = b.clone();
            infinite[5 * 16 + 2] = operand.exponent;
            assert!(
                !run(&infinite, &start, true),
                "an infinity in B: nothing skipped"
            );
        }
    }

    /// A row group that keeps no column still has its products added when one of its
    /// accumulators is -0 or a signaling NaN, in either half of a row: the whole product turns
    /// -0 into +0 and quiets the NaN, so leaving the zeros out would keep different bits.
    #[test]
    fn a_group_keeping_no_column_still_adds_into_special_accumulators() {
        let (mb, kb, nb) = (1u64, 2u64, 1u64);
        let mut draw = draws(0x51a7_0001);
        // A: zeros of both signs only, so every group keeps no column.
        let a_bytes: Vec<u8> = (0..mb * kb * 256)
            .flat_map(|i| if i % 3 == 0 { 0x8000u16 } else { 0 }.to_le_bytes())
            .collect();
        let b_bytes: Vec<u8> = (0..kb * nb * 256)
            .flat_map(|_| f16::from_f32(draw().abs() + 1.0).to_bits().to_le_bytes())
            .collect();
        let (mut av, mut bv) = (vec![0.0; a_bytes.len() / 2], vec![0.0; b_bytes.len() / 2]);
        (Operand::F16.widen)(&a_bytes, &mut av);
        (Operand::F16.widen)(&b_bytes, &mut bv);
        let signaling_nan = f32::from_bits(0x7f80_0001);
        // One special accumulator per case: each group (rows 0, 6, 12), low and high halves.
        for (at, special) in [
            (3, -0.0),
            (6 * 16 + 12, -0.0),
            (2, signaling_nan),
            (7 * 16 + 14, signaling_nan),
            (12 * 16 + 9, signaling_nan),
        ] {
            let mut start: Vec<f32> = (0..mb * nb * 256).map(|_| draw()).collect();
            start[at] = special;
            let acc_bytes: Vec<u8> = start.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut skipped = acc_bytes.clone();
            let operands = (&a_bytes[..], &b_bytes[..], Operand::F16);
            let took = product_of(
                operands,
                &mut skipped,
                [mb, kb, nb],
                false,
                Products::Exact,
                &mut Scratch::new(),
            );
            assert!(took, "an all-zero A is skipped");
            let mut whole = acc_bytes.clone();
            products(
                &mut whole,
                [mb, kb, nb],
                false,
                (&av, &bv),
                Products::Exact,
                None,
            );
            assert_ne!(
                whole, acc_bytes,
                "the whole product changes the special value"
            );
            assert_eq!(skipped, whole, "accumulator {at} starting as {special:?}");
        }
    }

    /// Each row group keeps exactly its nonzero columns, in ascending order, and every form
    /// run over them gives the bits of the same form over all columns, also where a row
    /// starts as -0 (its group then adds every column).
    #[test]
    fn row_groups_keep_their_nonzero_columns() {
        let (mb, kb) = (2usize, 3usize);
        let mut draw = draws(0x0c01_5eed);
        // Column k of row r in fractal row m_i is nonzero when 7 divides k + 3 r + m_i, or
        // k % 16 == 9 (a column every row keeps); -0 elsewhere in row 2. Row 12 of the second
        // row of fractals is all zeros: -0 in its group's kept columns, +0 in the others.
        let nonzero = |m_i: usize, r: usize, k: usize| {
            ((k + 3 * r + m_i).is_multiple_of(7) || k % 16 == 9) && (m_i, r) != (1, 12)
        };
        let a: Vec<f16> = (0..mb * kb * 256)
            .map(|i| {
                let (m_i, kbi, r, kk) = (i / (kb * 256), i / 256 % kb, i % 256 / 16, i % 16);
                let k = kbi * 16 + kk;
                if nonzero(m_i, r, k) {
                    f16::from_f32(draw())
                } else if r == 2 || (m_i, r) == (1, 12) && (13..16).any(|r| nonzero(1, r, k)) {
                    f16::NEG_ZERO
                } else {
                    f16::ZERO
                }
            })
            .collect();
        let a_bytes: Vec<u8> = a.iter().flat_map(|h| h.to_le_bytes()).collect();
        let a: Vec<f32> = a.iter().map(|h| h.to_f32()).collect();
        // B positive, so that row 12's sums stay zero: -0 over its kept columns, +0 over all.
        let b: Vec<f32> = (0..kb * 256).map(|_| draw().abs() + 1.0).collect();
        let mut found = NonzeroColumns::new();
        assert!(found.find(&a_bytes, [mb as u64, kb as u64]));
        for m_i in 0..mb {
            let groups = found.of(m_i);
            for (g, &(first, rows)) in ROW_GROUPS.iter().enumerate() {
                let want: Vec<usize> = (0..kb * 16)
                    .filter(|&k| (first..first + rows).any(|r| nonzero(m_i, r, k)))
                    .collect();
                let a_cols: Vec<u32> = want
                    .iter()
                    .map(|k| (k / 16 * 256 + k % 16) as u32)
                    .collect();
                let b_rows: Vec<u32> = want.iter().map(|k| (k * 16) as u32).collect();
                assert_eq!(
                    groups.a_cols[g],
                    &a_cols[..],
                    "row {m_i}, group at {first}: A"
                );
                assert_eq!(
                    groups.b_rows[g],
                    &b_rows[..],
                    "row {m_i}, group at {first}: B"
                );
            }
            let a_row = &a[m_i * kb * 256..][..kb * 256];
            // Row 12 starts as -0 in the second row of fractals: its group adds every column.
            let start: [f32; 256] = std::array::from_fn(|i| {
                if m_i == 1 && i / 16 == 12 {
                    -0.0
                } else {
                    draw()
                }
            });
            let bits = |v: [f32; 256]| v.map(f32::to_bits);
            let mut whole = start;
            accumulate_portable(&mut whole, a_row, &b, None);
            let mut kept = start;
            accumulate_portable(&mut kept, a_row, &b, Some(&groups));
            assert_eq!(bits(whole), bits(kept), "portable");
            for fused in [false, true] {
                let all = vector_paths(start, (a_row, &b), None, fused);
                let some = vector_paths(start, (a_row, &b), Some(&groups), fused);
                for ((name, all), (_, some)) in all.into_iter().zip(some) {
                    assert_eq!(bits(all), bits(some), "{name}, fused {fused}");
                }
            }
        }
        // A dense A leaves nothing out.
        let dense: Vec<u8> = (0..mb * kb * 256)
            .flat_map(|_| f16::from_f32(draw().abs() + 1.0).to_le_bytes())
            .collect();
        assert!(!found.find(&dense, [mb as u64, kb as u64]));
    }

    /// The SSE2 group masks are the portable ones, on values with zeros of both signs and
    /// values whose only nonzero bit is the lowest (which the OR of rows must keep).
    #[test]
    fn nonzero_group_masks_agree() {
        let mut draw = draws(0x0000_f00d);
        for case in 0..40 {
            let fractal: Vec<u8> = (0..256)
                .flat_map(|i| {
                    let v = draw();
                    let bits = match (i * 7 + case) % 23 {
                        0 => f16::from_f32(v).to_bits() | 1,
                        1 => 1,
                        2..12 => 0x8000,
                        _ => 0,
                    };
                    bits.to_le_bytes()
                })
                .collect();
            let want = nonzero_in_groups_portable(&fractal);
            assert_eq!(nonzero_in_groups(&fractal), want, "case {case}");
            assert!(want.iter().any(|&m| m != 0) && want.iter().any(|&m| m != u16::MAX));
        }
    }

    /// The SSE2 fractal transpose moves every element (r, c) to (c, r), as the portable one.
    #[test]
    fn fractal_transposes_agree() {
        let from: Vec<u8> = (0..512u32).map(|i| (i * 7 + i / 3) as u8).collect();
        let mut want = vec![0u8; 512];
        transpose_fractal_portable(&from, &mut want);
        for r in 0..16 {
            for c in 0..16 {
                assert_eq!(
                    want[(c * 16 + r) * 2..][..2],
                    from[(r * 16 + c) * 2..][..2],
                    "({r}, {c})"
                );
            }
        }
        let mut got = vec![0u8; 512];
        transpose_fractal(&from, &mut got);
        assert_eq!(got, want);
    }
}
