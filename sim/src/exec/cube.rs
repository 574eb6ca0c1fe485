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

/// `acc += Σ_k a_k · b_k` over the K fractals of one output fractal (`a`, `b`: K fractals of
/// 256 values each, row-major 16×16): for each element, products added one at a time in
/// ascending k, each a multiplication then an addition, so every vector width gives the same
/// bits (the vector widths fuse the two only where that changes no bit: [`Products`]).
#[inline(always)]
fn accumulate_portable(acc: &mut [f32; 256], a: &[f32], b: &[f32]) {
    for (af, bf) in a.chunks_exact(256).zip(b.chunks_exact(256)) {
        for i in 0..16 {
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
/// [`Products::Exact`] operands may use.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(unsafe_code)]
fn accumulate_avx512<const FUSED: bool>(acc: &mut [f32; 256], a: &[f32], b: &[f32]) {
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
/// ones has): a pass per group of rows (six, six, then four), each row two 8-float
/// accumulators (twelve registers, with room for the B row and the broadcast in the sixteen).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn accumulate_avx2<const FUSED: bool>(acc: &mut [f32; 256], a: &[f32], b: &[f32]) {
    accumulate_avx2_rows::<6, FUSED>(acc, a, b, 0);
    accumulate_avx2_rows::<6, FUSED>(acc, a, b, 6);
    accumulate_avx2_rows::<4, FUSED>(acc, a, b, 12);
}

/// Rows `first..first + ROWS` of [`accumulate_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
fn accumulate_avx2_rows<const ROWS: usize, const FUSED: bool>(
    acc: &mut [f32; 256],
    a: &[f32],
    b: &[f32],
    first: usize,
) {
    use std::arch::x86_64::{__m256, _mm256_add_ps, _mm256_fmadd_ps, _mm256_loadu_ps};
    use std::arch::x86_64::{_mm256_mul_ps, _mm256_set1_ps, _mm256_storeu_ps};
    // SAFETY (every load and store below): each pointer starts 8 floats inside a 16-float
    // row of a `[f32; 256]` (the accumulator, or a fractal of `a` / `b` from
    // `chunks_exact(256)`), offset 0 or 8, so the 8 floats are in bounds; unaligned forms.
    let mut rows: [[__m256; 2]; ROWS] = std::array::from_fn(|r| {
        let at = (first + r) * 16;
        unsafe {
            [
                _mm256_loadu_ps(acc[at..at + 8].as_ptr()),
                _mm256_loadu_ps(acc[at + 8..at + 16].as_ptr()),
            ]
        }
    });
    for (af, bf) in a.chunks_exact(256).zip(b.chunks_exact(256)) {
        for kk in 0..16 {
            let (lo, hi) = unsafe {
                (
                    _mm256_loadu_ps(bf[kk * 16..kk * 16 + 8].as_ptr()),
                    _mm256_loadu_ps(bf[kk * 16 + 8..kk * 16 + 16].as_ptr()),
                )
            };
            for (r, row) in rows.iter_mut().enumerate() {
                let x = _mm256_set1_ps(af[(first + r) * 16 + kk]);
                if FUSED {
                    row[0] = _mm256_fmadd_ps(x, lo, row[0]);
                    row[1] = _mm256_fmadd_ps(x, hi, row[1]);
                } else {
                    row[0] = _mm256_add_ps(row[0], _mm256_mul_ps(x, lo));
                    row[1] = _mm256_add_ps(row[1], _mm256_mul_ps(x, hi));
                }
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
type VectorAccumulate = unsafe fn(&mut [f32; 256], &[f32], &[f32]);

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
    fn run(self, acc: &mut [f32; 256], a: &[f32], b: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(form) = self.vector {
            // SAFETY: `vector_accumulates` lists only the forms whose target features the host
            // has (checked at run time), their only requirement.
            return unsafe { form(acc, a, b) };
        }
        accumulate_portable(acc, a, b);
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
/// bytes, by way of f32 operands widened into `scratch`; all-zero K columns of A are left out
/// where that changes no bit ([`leave_out_zero_columns`]). Returns whether they were.
fn product_of(
    (a_bytes, b_bytes, operand): (&[u8], &[u8], Operand),
    accumulators: &mut [u8],
    [mb, kb, nb]: [u64; 3],
    init: bool,
    exact: Products,
    scratch: &mut Scratch,
) -> bool {
    let Scratch {
        av,
        bv,
        kept,
        a_kept,
    } = scratch;
    let a_len = (mb * kb * 256) as usize;
    grow(av, a_len);
    (operand.widen)(a_bytes, &mut av[..a_len]);
    let av = &av[..a_len];
    let adds_into = (!init).then_some(&*accumulators);
    let leave_out = leave_out_zero_columns((av, b_bytes), [mb, kb], operand, adds_into, kept);
    if leave_out {
        // A's kept columns gathered, and only B's rows for them widened.
        let kept_kb = kept_fractals(kept) as u64;
        gather_kept(
            (av, b_bytes),
            [mb, kb, nb],
            kept,
            operand,
            (a_kept, bv),
            kept_kb,
        );
        let (a_len, b_len) = ((mb * kept_kb * 256) as usize, (kept_kb * nb * 256) as usize);
        let operands = (&a_kept[..a_len], &bv[..b_len]);
        products(accumulators, [mb, kept_kb, nb], init, operands, exact);
    } else {
        let b_len = (kb * nb * 256) as usize;
        grow(bv, b_len);
        (operand.widen)(b_bytes, &mut bv[..b_len]);
        products(accumulators, [mb, kb, nb], init, (av, &bv[..b_len]), exact);
    }
    leave_out
}

/// One host thread's scratch for `mmad`: the widened operands, and the K columns kept when
/// zero ones are left out ([`leave_out_zero_columns`]: per K fractal, a bit per column) with
/// A gathered to them (B's rows for them are widened into `bv`).
struct Scratch {
    av: Vec<f32>,
    bv: Vec<f32>,
    kept: Vec<u16>,
    a_kept: Vec<f32>,
}

impl Scratch {
    const fn new() -> Scratch {
        Scratch {
            av: Vec::new(),
            bv: Vec::new(),
            kept: Vec::new(),
            a_kept: Vec::new(),
        }
    }
}

fn grow(v: &mut Vec<f32>, len: usize) {
    if v.len() < len {
        v.resize(len, 0.0);
    }
}

/// K fractals of the columns `kept` keeps (per K fractal, a bit per column).
fn kept_fractals(kept: &[u16]) -> usize {
    (kept.iter().map(|m| m.count_ones() as usize).sum::<usize>()).div_ceil(16)
}

/// The kept K columns, in ascending order.
fn kept_columns(kept: &[u16]) -> impl Iterator<Item = usize> + '_ {
    kept.iter().enumerate().flat_map(|(kbi, &m)| {
        (0..16)
            .filter(move |kk| m >> kk & 1 == 1)
            .map(move |kk| kbi * 16 + kk)
    })
}

/// Whether leaving A's all-zero K columns (and B's rows for them) out of a product saves at
/// least half of its K fractals and changes no bit, with the columns to keep in `kept` (per
/// K fractal, a bit per column). A product of ±0 and a finite value is ±0, and adding ±0 to
/// an accumulator changes it only when the accumulator is -0 (or a signalling NaN). An
/// accumulator that starts neither -0 nor NaN never becomes -0 (a round-to-nearest sum is -0
/// only when both of its terms are), so a column may go when every A value in it is ±0,
/// every B value in its row is finite (here: every B value) and (`accumulators`, when the
/// product adds into what L0C holds) no accumulator starts as -0 or NaN. The kept columns
/// are then summed in the same ascending order, with the same bits. Real convolutions have
/// such columns where a layer's input channels are padded to a fractal (a 3-channel image's
/// 16 in a stem convolution without AIPP). Leaving columns out costs a pass over A, B and
/// the accumulators, and a gather, which is why it waits for half of the work to go.
fn leave_out_zero_columns(
    (av, b_bytes): (&[f32], &[u8]),
    [mb, kb]: [u64; 2],
    operand: Operand,
    accumulators: Option<&[u8]>,
    kept: &mut Vec<u16>,
) -> bool {
    let (mb, kb) = (mb as usize, kb as usize);
    // The columns of K fractal `kbi` with a nonzero value in fractal rows `m_range` (bits
    // ORed over the rows, the sign left out: zero only for an all-zero column).
    let nonzero_columns = |kbi: usize, m_range: std::ops::Range<usize>| {
        let mut any = [0u32; 16];
        for m_i in m_range {
            let fractal: &[f32; 256] = av[(m_i * kb + kbi) * 256..][..256]
                .try_into()
                .expect("a fractal is 256 values");
            for r in 0..16 {
                for kk in 0..16 {
                    any[kk] |= fractal[r * 16 + kk].to_bits();
                }
            }
        }
        (0..16).fold(0u16, |m, kk| {
            m | u16::from(any[kk] & 0x7fff_ffff != 0) << kk
        })
    };
    let worth_it = |kept: &[u16]| kept_fractals(kept) * 2 <= kb;
    // The first row of fractals turns most products down cheaply (a dense A keeps it all);
    // the other rows can only add columns to it.
    kept.clear();
    kept.extend((0..kb).map(|kbi| nonzero_columns(kbi, 0..1)));
    if !worth_it(kept) {
        return false;
    }
    for (kbi, m) in kept.iter_mut().enumerate() {
        *m |= nonzero_columns(kbi, 1..mb);
    }
    if !worth_it(kept) {
        return false;
    }
    // No infinity or NaN in B (in its left-out rows is enough, but all of it is one pass that
    // runs in vectors; folded without an early exit for the same reason).
    let non_finite = b_bytes.chunks_exact(2).fold(0u16, |seen, h| {
        let exponent = u16::from_le_bytes([h[0], h[1]]) & operand.exponent;
        seen | u16::from(exponent == operand.exponent)
    });
    non_finite == 0
        && accumulators.is_none_or(|acc| {
            acc.chunks_exact(4).fold(0u32, |seen, b| {
                let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                seen | u32::from(bits == 0x8000_0000 || bits & 0x7fff_ffff > 0x7f80_0000)
            }) == 0
        })
}

/// The operands of a product on the `kept` K columns only, `kept_kb` fractals of them: A's
/// columns gathered from its widened values, B's rows widened from its bytes. The last
/// fractal's unused columns are zero in both, so their products add +0, which changes no
/// accumulator [`leave_out_zero_columns`] allows.
fn gather_kept(
    (av, b_bytes): (&[f32], &[u8]),
    [mb, kb, nb]: [u64; 3],
    kept: &[u16],
    operand: Operand,
    (a_kept, b_kept): (&mut Vec<f32>, &mut Vec<f32>),
    kept_kb: u64,
) {
    let (mb, kb, nb, kept_kb) = (mb as usize, kb as usize, nb as usize, kept_kb as usize);
    let at = |k: usize| (k / 16, k % 16);
    a_kept.clear();
    a_kept.resize(mb * kept_kb * 256, 0.0);
    for m_i in 0..mb {
        for (j, k) in kept_columns(kept).enumerate() {
            let ((to_f, to_c), (from_f, from_c)) = (at(j), at(k));
            let to = &mut a_kept[(m_i * kept_kb + to_f) * 256 + to_c..];
            let from = &av[(m_i * kb + from_f) * 256 + from_c..];
            for r in 0..16 {
                to[r * 16] = from[r * 16];
            }
        }
    }
    b_kept.clear();
    b_kept.resize(nb * kept_kb * 256, 0.0);
    for n_i in 0..nb {
        for (j, k) in kept_columns(kept).enumerate() {
            let ((to_f, to_r), (from_f, from_r)) = (at(j), at(k));
            let from = &b_bytes[((n_i * kb + from_f) * 256 + from_r * 16) * 2..][..32];
            (operand.widen)(
                from,
                &mut b_kept[(n_i * kept_kb + to_f) * 256 + to_r * 16..][..16],
            );
        }
    }
}

/// The f32 products of an `mmad` whose widened operands are `av` (`mb` × `kb` fractals)
/// and `bv` (`nb` × `kb`), into (or, `init`, over) its accumulators' bytes `l0c`.
fn products(
    l0c: &mut [u8],
    [mb, kb, nb]: [u64; 3],
    init: bool,
    (av, bv): (&[f32], &[f32]),
    exact: Products,
) {
    let accumulate = Accumulator::new(exact);
    let mut acc = [0f32; 256];
    for n_i in 0..nb {
        for m_i in 0..mb {
            let cbase = ((n_i * mb + m_i) * FRACTAL_C) as usize;
            let a_row = &av[(m_i * kb * 256) as usize..][..(kb * 256) as usize];
            let b_col = &bv[(n_i * kb * 256) as usize..][..(kb * 256) as usize];
            // On a little-endian host an aligned fractal of L0C is its 256 accumulators as
            // they are: add into them where they lie, without copying them out and back.
            let fractal = &mut l0c[cbase..cbase + FRACTAL_C as usize];
            if cfg!(target_endian = "little") {
                if init {
                    fractal.fill(0);
                }
                if let Ok(acc) = <[f32; 256] as zerocopy::FromBytes>::mut_from_bytes(fractal) {
                    accumulate.run(acc, a_row, b_col);
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
            accumulate.run(&mut acc, a_row, b_col);
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
                products(l0c, [mb, kb, nb], init, (&av, &bv), Products::Rounded);
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
        accumulate_portable(&mut portable, &a, &b);
        let mut dispatched = start;
        Accumulator::new(Products::Rounded).run(&mut dispatched, &a, &b);
        assert_eq!(portable.map(f32::to_bits), dispatched.map(f32::to_bits));
        for (name, v) in vector_paths(start, &a, &b, false) {
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
        a: &[f32],
        b: &[f32],
        fused: bool,
    ) -> Vec<(&'static str, [f32; 256])> {
        let mut out = Vec::new();
        #[cfg(target_arch = "x86_64")]
        for (name, form) in vector_accumulates(fused) {
            let mut v = start;
            // SAFETY: the host has the form's target features (`vector_accumulates` checks).
            unsafe { form(&mut v, a, b) };
            out.push((name, v));
        }
        let _ = (a, b, fused);
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
            accumulate_portable(&mut portable, &a, &b);
            let mut dispatched = start;
            Accumulator::new(Products::Exact).run(&mut dispatched, &a, &b);
            let bits = |v: [f32; 256]| v.map(f32::to_bits);
            assert_eq!(bits(portable), bits(dispatched), "case {case}: dispatch");
            for (name, v) in vector_paths(start, &a, &b, true) {
                assert_eq!(bits(portable), bits(v), "case {case}: {name}");
            }
        }
    }

    /// Leaving A's all-zero K columns out of a product (as in a 2-channel convolution's
    /// operands: 2 of every 16 columns carry values, the others +0 or -0) gives the bits of
    /// the whole product, for f16 and bf16, with and without `init`; and the columns stay in
    /// where leaving them out would change a bit: an accumulator that starts as -0 (row 0's
    /// kept products are all -0, its left-out ones +0; the 16 kept columns fill a fractal, so
    /// no padding column adds a +0 either) or NaN, or an infinity in B.
    #[test]
    fn leaving_zero_columns_out_keeps_every_bit() {
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
            // A: fractal (m_i, kbi), row r, column kk; row 0 of the first row of fractals is
            // -0 where others have values.
            let a: Vec<u16> = (0..mb * kb * 256)
                .map(|i| {
                    let (m_i, r, kk) = (i / (kb * 256), i % 256 / 16, i % 16);
                    match (kk < 2, m_i == 0 && r == 0) {
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
                let mut left_out = acc_bytes.clone();
                let operands = (&a_bytes[..], &b_bytes[..], operand);
                let took = product_of(
                    operands,
                    &mut left_out,
                    [mb, kb, nb],
                    init,
                    exact,
                    &mut scratch,
                );
                let (mut av, mut bv) = (vec![0.0; a.len()], vec![0.0; b.len()]);
                (operand.widen)(&a_bytes, &mut av);
                (operand.widen)(&b_bytes, &mut bv);
                let mut whole = acc_bytes;
                products(&mut whole, [mb, kb, nb], init, (&av, &bv), exact);
                assert_eq!(left_out, whole);
                took
            };
            assert!(run(&b, &start, true), "init: left out");
            assert!(run(&b, &start, false), "adding: left out");
            // Row 0's accumulators start as -0: the whole product makes +0 of them.
            let mut negative_zero = start.clone();
            for n_i in 0..nb as usize {
                negative_zero[n_i * mb as usize * 256..][..16].fill(-0.0);
            }
            assert!(!run(&b, &negative_zero, false), "a -0 accumulator: kept in");
            assert!(run(&b, &negative_zero, true), "init overwrites the -0");
            let mut nan = start.clone();
            nan[7] = f32::from_bits(0x7f80_0001);
            assert!(!run(&b, &nan, false), "a NaN accumulator: kept in");
            // An infinity in a left-out row of B makes NaN products in the whole product.
            let mut infinite = b.clone();
            infinite[5 * 16 + 2] = operand.exponent;
            assert!(!run(&infinite, &start, true), "an infinity in B: kept in");
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
