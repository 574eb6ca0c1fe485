//! DMA between GM and the local buffers: burst copies, byte-granular (padded) copies, the
//! row-major to fractal-NZ conversion on the way into L1, and image rows through the AIPP unit
//! into an L1 C04 feature map.

use gearsim_isa::aipp::{self, AippConfig, CONFIG_BYTES};
use gearsim_isa::{Dma, DmaPad, LoadImage, Nd2Nz};

use super::{Access, Fault, Operands, Plan};
use crate::core::buffers::Buffers;
use crate::memory::GmValues;
use crate::stop::Buffer;

/// DMA lengths and gaps count 32-byte blocks.
const BLOCK: u64 = gearsim_isa::units::BLOCK_BYTES;

fn gm_fault(mem: &impl GmValues, addr: u64, len: u64) -> Fault {
    Fault::Range {
        buffer: Buffer::Gm,
        addr,
        len,
        size: mem.capacity(),
    }
}

pub(super) fn plan_burst(f: &Dma, ops: &Operands, from: Buffer, to: Buffer) -> Result<Plan, Fault> {
    let [dst, src, _, _] = ops.regs;
    let len = u64::from(f.len) * BLOCK;
    let n = u64::from(f.nburst);
    let src_stride = (u64::from(f.len) + u64::from(f.src_gap)) * BLOCK;
    let dst_stride = (u64::from(f.len) + u64::from(f.dst_gap)) * BLOCK;
    let bytes = n * len;
    // A copy between two local buffers (L1 -> FB) crosses no shared memory.
    let shared = if from == Buffer::Gm || to == Buffer::Gm {
        bytes
    } else {
        0
    };
    Ok(Plan::new(
        bytes,
        shared,
        &[
            Access {
                buffer: from,
                start: src,
                burst: len,
                stride: src_stride,
                count: n,
                write: false,
            },
            Access {
                buffer: to,
                start: dst,
                burst: len,
                stride: dst_stride,
                count: n,
                write: true,
            },
        ],
    ))
}

pub(super) fn burst(
    bufs: &mut Buffers,
    mem: &mut impl GmValues,
    f: &Dma,
    ops: &Operands,
    from: Buffer,
    to: Buffer,
) -> Result<(), Fault> {
    let plan = plan_burst(f, ops, from, to)?;
    copy_bursts(
        bufs,
        mem,
        &plan.accesses()[0],
        &plan.accesses()[1],
        plan.accesses()[0].burst,
    )
}

/// Copies `count` bursts of `len` bytes from `src` to `dst` (GM and a local buffer, or two
/// local buffers).
fn copy_bursts(
    bufs: &mut Buffers,
    mem: &mut impl GmValues,
    src: &Access,
    dst: &Access,
    len: u64,
) -> Result<(), Fault> {
    let len_us = len as usize;
    for i in 0..src.count {
        let s = src.start + i * src.stride;
        let d = dst.start + i * dst.stride;
        match (src.buffer, dst.buffer) {
            (Buffer::Gm, local) => {
                let buf = bufs.get_mut(local);
                let d = d as usize;
                mem.read(s, &mut buf[d..d + len_us])
                    .map_err(|_| gm_fault(mem, s, len))?;
            }
            (local, Buffer::Gm) => {
                let buf = bufs.get(local);
                let s = s as usize;
                mem.write(d, &buf[s..s + len_us])
                    .map_err(|_| gm_fault(mem, d, len))?;
            }
            (a, b) if a != b => {
                let (from, to) = bufs.pair_mut(a, b);
                let (s, d) = (s as usize, d as usize);
                to[d..d + len_us].copy_from_slice(&from[s..s + len_us]);
            }
            (a, b) => {
                return Err(Fault::Illegal(format!("no DMA path from {a} to {b}")));
            }
        }
    }
    Ok(())
}

fn round32(x: u64) -> u64 {
    x.div_ceil(BLOCK) * BLOCK
}

pub(super) fn plan_pad(
    f: &DmaPad,
    ops: &Operands,
    from: Buffer,
    to: Buffer,
) -> Result<Plan, Fault> {
    let [dst, src, _, _] = ops.regs;
    let len = u64::from(f.len);
    let n = u64::from(f.nburst);
    let local_len = round32(len);
    let (gm_gap, local_gap) = if from == Buffer::Gm {
        (u64::from(f.src_gap), u64::from(f.dst_gap))
    } else {
        (u64::from(f.dst_gap), u64::from(f.src_gap))
    };
    if local_gap % BLOCK != 0 {
        return Err(Fault::Illegal(format!(
            "the {} side gap of a padded copy must be a multiple of 32 bytes, got {local_gap}",
            if from == Buffer::Gm { to } else { from }
        )));
    }
    let gm = |start| Access {
        buffer: Buffer::Gm,
        start,
        burst: len,
        stride: len + gm_gap,
        count: n,
        write: from != Buffer::Gm,
    };
    let local = |buffer, start| Access {
        buffer,
        start,
        burst: local_len,
        stride: local_len + local_gap,
        count: n,
        write: from == Buffer::Gm,
    };
    let accesses = if from == Buffer::Gm {
        [gm(src), local(to, dst)]
    } else {
        [local(from, src), gm(dst)]
    };
    Ok(Plan::new(n * len, n * local_len, &accesses))
}

pub(super) fn pad(
    bufs: &mut Buffers,
    mem: &mut impl GmValues,
    f: &DmaPad,
    ops: &Operands,
    from: Buffer,
    to: Buffer,
) -> Result<(), Fault> {
    let plan = plan_pad(f, ops, from, to)?;
    let (src, dst) = (&plan.accesses()[0], &plan.accesses()[1]);
    let len = u64::from(f.len);
    copy_bursts(bufs, mem, src, dst, len)?;
    if from == Buffer::Gm {
        // Zero the padding after each burst in the local buffer.
        let buf = bufs.get_mut(to);
        for i in 0..dst.count {
            let d = (dst.start + i * dst.stride) as usize;
            buf[d + len as usize..d + dst.burst as usize].fill(0);
        }
    }
    Ok(())
}

pub(super) fn plan_nd2nz(f: &Nd2Nz, ops: &Operands) -> Result<Plan, Fault> {
    let [dst, src, _, _] = ops.regs;
    let (rows, cols) = (u64::from(f.rows), u64::from(f.cols));
    let rows16 = rows.div_ceil(16) * 16;
    if u64::from(f.dst_rows) < rows16 {
        return Err(Fault::Illegal(format!(
            "dst_rows {} is less than rows rounded up to 16 ({rows16})",
            f.dst_rows
        )));
    }
    if u64::from(f.src_stride) < cols {
        return Err(Fault::Illegal(format!(
            "src_stride {} is less than cols {cols}",
            f.src_stride
        )));
    }
    let col_blocks = cols.div_ceil(16);
    let l1_len = col_blocks * u64::from(f.dst_rows) * 32;
    Ok(Plan::new(
        rows * cols * 2,
        rows * round32(cols * 2),
        &[
            Access {
                buffer: Buffer::Gm,
                start: src,
                burst: cols * 2,
                stride: u64::from(f.src_stride) * 2,
                count: rows,
                write: false,
            },
            Access::range(Buffer::L1, dst, l1_len, true),
        ],
    ))
}

pub(super) fn nd2nz(
    bufs: &mut Buffers,
    mem: &mut impl GmValues,
    f: &Nd2Nz,
    ops: &Operands,
) -> Result<(), Fault> {
    let [dst, src, _, _] = ops.regs;
    let (rows, cols) = (u64::from(f.rows), u64::from(f.cols));
    let rows16 = rows.div_ceil(16) * 16;
    let col_blocks = cols.div_ceil(16);
    let dst_rows = u64::from(f.dst_rows);
    let mut row = vec![0u8; (col_blocks * 32) as usize];
    let l1 = bufs.get_mut(Buffer::L1);
    for r in 0..rows16 {
        row.fill(0);
        if r < rows {
            let a = src + r * u64::from(f.src_stride) * 2;
            mem.read(a, &mut row[..(cols * 2) as usize])
                .map_err(|_| gm_fault(mem, a, cols * 2))?;
        }
        for cb in 0..col_blocks {
            let d = (dst + (cb * dst_rows + r) * 32) as usize;
            let s = (cb * 32) as usize;
            l1[d..d + 32].copy_from_slice(&row[s..s + 32]);
        }
    }
    Ok(())
}

pub(super) fn plan_image(f: &LoadImage, ops: &Operands) -> Result<Plan, Fault> {
    let [dst, src, cfg, _] = ops.regs;
    let (rows, cols, pixel) = (u64::from(f.rows), u64::from(f.cols), u64::from(f.pixel));
    let row = cols * pixel;
    if pixel == 0 || u64::from(f.src_stride) < row {
        return Err(Fault::Illegal(format!(
            "load_image_l1: {pixel} byte(s) per pixel and a row stride of {} bytes for rows of {row} bytes",
            f.src_stride
        )));
    }
    // The parameter block comes in through the unit's own port; only the image rows are
    // timed (the block is 128 bytes per instruction of hundreds of pixels).
    let out = aipp::pixel_bytes(f.c04);
    Ok(Plan::new(
        rows * cols * out,
        rows * round32(row),
        &[
            Access {
                buffer: Buffer::Gm,
                start: src,
                burst: row,
                stride: u64::from(f.src_stride),
                count: rows,
                write: false,
            },
            Access::range(Buffer::L1, dst, rows * cols * out, true),
            Access::range(Buffer::Gm, cfg, CONFIG_BYTES, false),
        ],
    ))
}

pub(super) fn image(
    bufs: &mut Buffers,
    mem: &mut impl GmValues,
    f: &LoadImage,
    ops: &Operands,
) -> Result<(), Fault> {
    let [dst, src, cfg, _] = ops.regs;
    let mut block = [0u8; CONFIG_BYTES as usize];
    mem.read(cfg, &mut block)
        .map_err(|_| gm_fault(mem, cfg, CONFIG_BYTES))?;
    let conf = AippConfig::from_bytes(&block)
        .map_err(|e| Fault::Illegal(format!("load_image_l1: the block at {cfg:#x}: {e}")))?;
    let (rows, cols, pixel) = (u64::from(f.rows), u64::from(f.cols), u64::from(f.pixel));
    if u64::from(conf.bytes_read()) > pixel {
        return Err(Fault::Illegal(format!(
            "load_image_l1: the AIPP block reads {} bytes of a {pixel}-byte pixel",
            conf.bytes_read()
        )));
    }
    let mut row = vec![0u8; (cols * pixel) as usize];
    let unit = aipp::pixel_bytes(f.c04);
    let l1 = bufs.get_mut(Buffer::L1);
    for r in 0..rows {
        let a = src + r * u64::from(f.src_stride);
        mem.read(a, &mut row)
            .map_err(|_| gm_fault(mem, a, cols * pixel))?;
        let out = dst + r * cols * unit;
        for (c, px) in row.chunks_exact(pixel as usize).enumerate() {
            let at = (out + c as u64 * unit) as usize;
            l1[at..at + unit as usize].fill(0);
            for (k, v) in conf.pixel_c04(px).iter().enumerate() {
                l1[at + 2 * k..at + 2 * k + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
    }
    Ok(())
}
