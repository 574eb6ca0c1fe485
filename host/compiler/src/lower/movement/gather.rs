//! Gather: `out[o, j, i] = data[o, idx[j], i]` over the data viewed as `[outer, D, inner]`, with
//! indices of any rank read on the device (int32 or int64, a runtime tensor or a constant).
//!
//! A task copies `nj` consecutive rows of `inner` elements: it loads their indices into UB,
//! the scalar unit waits for them, then issues one DMA per row from the row's place in the
//! data into consecutive UB slots; one strided DMA writes the rows out. Rows larger than a
//! tile go piece by piece, the index read by the scalar unit straight from GM.
//!
//! Out-of-range indices: ONNX leaves them undefined. Here a negative index first counts from
//! the end (`+ D`), then any index still outside `[0, D)` is clamped to `0` or `D - 1`, so a
//! bad index reads a valid row of the same tensor and no access leaves the data.
//!
//! ```text
//!   idx ─MTE2─▶ UB ─(wait)─▶ S: ld idx, wrap, clamp ─▶ MTE2: data row → slot j
//!                                                      MTE3: slots → out rows (one DMA)
//! ```

use gearsim_isa::{SType, Space};

use super::super::queue;
use super::super::writer::{Asm, Reg};
use super::super::{Kernel, LowerCtx, LowerError, Lowered, Operand, kernel_name};
use super::kit::{
    self, BLOCK, Chain, Digit, Frame, Job, MAX_BURSTS, Pipe, Scratch, Split, Xfer, round32,
};
use crate::ir::DataType;

/// One static task shape.
#[derive(Debug, Clone)]
struct Sub {
    digits: Vec<Digit>,
    /// Offsets of the data, output and index pointers.
    offs: [i64; 3],
    /// Rows per task (row mode) or piece bytes (piece mode).
    count: u64,
}

#[derive(Clone, Copy)]
struct Regs {
    data: Reg,
    out: Reg,
    idx: Reg,
    src: Reg,
    dst: Reg,
    ip: Reg,
    ub: Reg,
    dim: Reg,
    top: Reg,
    zero: Reg,
    s: Scratch,
}

#[derive(Clone, Copy)]
struct Layout {
    buf: u64,
    slot_bytes: u64,
    idx_at: u64,
    row: u64,
    ie: u64,
    load: SType,
}

/// The Gather lowering.
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let ind = ctx.input(1)?;
    let dims = super::dims_of(ctx, x)?;
    let idims = super::dims_of(ctx, ind)?;
    let rank = dims.len() as i64;
    let axis = ctx.node.int("axis").unwrap_or(0);
    let axis = usize::try_from(if axis < 0 { axis + rank } else { axis })
        .ok()
        .filter(|a| (*a as i64) < rank)
        .ok_or_else(|| ctx.error(format!("axis {axis} is outside the data's rank {rank}")))?;
    let ie: u64 = match ind.dtype {
        DataType::I32 => 4,
        DataType::I64 => 8,
        t => {
            return Err(ctx.error(format!(
                "indices of type {} (int32 or int64 expected)",
                t.name()
            )));
        }
    };
    let e = x.dtype.size() as u64;
    let outer: u64 = dims[..axis].iter().product();
    let d = dims[axis];
    let row = dims[axis + 1..].iter().product::<u64>() * e;
    let j: u64 = idims.iter().product();
    if outer * j * row == 0 {
        return Ok(super::no_kernels());
    }
    if d == 0 {
        return Err(ctx.error(format!(
            "axis {axis} of the data is empty, so every one of the {j} indices is out of range"
        )));
    }
    let core = &ctx.target.core;
    let nbuf = kit::buffers(core);
    let buf_max = kit::floor_to(core.ub_bytes / nbuf as u64, BLOCK).min(kit::MAX_TILE);
    // A row slot and its index share a buffer: leave an eighth for the indices.
    let tile = kit::tile_bytes(outer * j * row, core, buf_max * 7 / 8);
    let pitch = round32(row);
    let rows_mode = pitch <= tile;
    let mut subs = Vec::new();
    let (dl, jl) = ((d * row) as i64, (j * row) as i64);
    if rows_mode {
        let nj = j.min(tile / pitch).clamp(1, MAX_BURSTS);
        let first = (j / nj) * nj;
        for (n, count) in [(j / nj, nj), (u64::from(!j.is_multiple_of(nj)), j % nj)] {
            if n == 0 || count == 0 {
                continue;
            }
            let mut digits = vec![Digit {
                n: outer,
                strides: vec![dl, jl, 0],
            }];
            let offs = if count == nj && n == j / nj {
                digits.push(Digit {
                    n,
                    strides: vec![0, (nj * row) as i64, (nj * ie) as i64],
                });
                [0, 0, 0]
            } else {
                [0, (first * row) as i64, (first * ie) as i64]
            };
            subs.push(Sub {
                digits,
                offs,
                count,
            });
        }
    } else {
        let piece = kit::floor_to(tile, BLOCK);
        let (np, rem) = (row / piece, row % piece);
        for (n, len, off) in [(np, piece, 0), (u64::from(rem > 0), rem, np * piece)] {
            if n == 0 || len == 0 {
                continue;
            }
            let mut digits = vec![
                Digit {
                    n: outer,
                    strides: vec![dl, jl, 0],
                },
                Digit {
                    n: j,
                    strides: vec![0, row as i64, ie as i64],
                },
            ];
            if len == piece {
                digits.push(Digit {
                    n,
                    strides: vec![piece as i64, piece as i64, 0],
                });
            }
            subs.push(Sub {
                digits,
                offs: [off as i64, off as i64, 0],
                count: len,
            });
        }
    }
    let slots = if rows_mode {
        subs.iter().map(|s| s.count).max().unwrap_or(1)
    } else {
        1
    };
    let slot_bytes = if rows_mode { pitch } else { tile };
    let idx_bytes = if rows_mode { round32(slots * ie) } else { 0 };
    let buf = slots * slot_bytes + idx_bytes;
    if nbuf as u64 * buf > core.ub_bytes {
        return Err(ctx.error(format!(
            "gather tiles of {buf} bytes do not fit {nbuf} times in the {}-byte unified buffer",
            core.ub_bytes
        )));
    }
    let out_xfer = Xfer {
        n: if rows_mode { slots } else { 1 },
        len: if rows_mode { row } else { tile },
        gm_stride: if rows_mode { row } else { tile },
        ub_pitch: slot_bytes,
    };
    if !kit::fits(&out_xfer) {
        return Err(ctx.error(format!(
            "gather rows of {row} bytes do not fit the DMA's fields"
        )));
    }
    let tasks: u64 = subs
        .iter()
        .map(|s| s.digits.iter().map(|d| d.n).product::<u64>())
        .sum();
    let split = Split::new(tasks, core);
    let chain = Chain {
        stages: &[Pipe::Mte2, Pipe::Mte3],
        nbuf,
    };
    let mut a = Asm::new(&kernel_name(ctx, if rows_mode { "rows" } else { "pieces" }));
    a.tiling("row_bytes", row as i64);
    a.tiling("rows_per_task", slots as i64);
    a.tiling("buffer_bytes", buf as i64);
    let f = Frame::new(&mut a, split);
    let g = Regs {
        data: a.reg(),
        out: a.reg(),
        idx: a.reg(),
        src: a.reg(),
        dst: a.reg(),
        ip: a.reg(),
        ub: a.reg(),
        dim: a.reg(),
        top: a.reg(),
        zero: a.reg(),
        s: Scratch::new(&mut a),
    };
    a.movi(g.dim, d as i64);
    a.movi(g.top, d as i64 - 1);
    a.movi(g.zero, 0);
    f.arg(&mut a, g.data, 0);
    f.arg(&mut a, g.idx, 1);
    f.arg(&mut a, g.out, 2);
    chain.prologue(&mut a);
    let layout = Layout {
        buf,
        slot_bytes,
        idx_at: slots * slot_bytes,
        row,
        ie,
        load: if ie == 4 { SType::I32 } else { SType::U64 },
    };
    let jobs: Vec<Job<'_>> = subs
        .iter()
        .map(|s| {
            let (rg, ly) = (g, layout);
            Job {
                tasks: s.digits.iter().map(|d| d.n).product(),
                setup: Box::new(|_: &mut Asm| {}),
                load: Box::new(move |a: &mut Asm, k: usize, t: Reg| {
                    if rows_mode {
                        rows_load(a, s, &rg, &chain, &ly, k, t);
                    } else {
                        piece_load(a, s, &rg, &chain, &ly, k, t);
                    }
                }),
                rest: Box::new(move |a: &mut Asm, k: usize, t: Reg| {
                    store(a, s, &rg, &chain, &ly, k, t, rows_mode);
                }),
            }
        })
        .collect();
    kit::run_jobs(&mut a, &f, nbuf, &jobs);
    chain.epilogue(&mut a);
    let args = vec![Operand::Input(0), Operand::Input(1), Operand::Output(0)];
    Ok(Lowered::Kernels {
        kernels: vec![Kernel {
            // The scalar unit reads the indices to address the rows.
            value_inputs: vec![1],
            ..ctx.kernel(a, split.blocks, args)?
        }],
        derived: Vec::new(),
        workspace_bytes: 0,
    })
}

/// The task's data pointer (row 0 of its outer index) and index pointer.
fn load_pointers(a: &mut Asm, s: &Sub, g: &Regs, t: Reg) {
    let [s0, ..] = g.s.r;
    kit::set_add(a, g.src, g.data, s.offs[0], s0);
    kit::set_add(a, g.ip, g.idx, s.offs[2], s0);
    kit::decompose(a, t, &s.digits, &[Some(g.src), None, Some(g.ip)], &g.s);
}

/// `y` becomes the byte offset of index `x`'s row: wrapped if negative, clamped into `[0, D)`.
fn row_offset(a: &mut Asm, g: &Regs, x: Reg, y: Reg, row: u64) {
    a.srai(y, x, 63);
    a.and(y, y, g.dim);
    a.add(x, x, y);
    a.max(x, x, g.zero);
    a.min(x, x, g.top);
    kit::mul_imm(a, y, x, row as i64);
}

fn rows_load(a: &mut Asm, s: &Sub, g: &Regs, chain: &Chain, ly: &Layout, k: usize, t: Reg) {
    let [x, y, slot, cnt] = g.s.r;
    let base = k as u64 * ly.buf;
    load_pointers(a, s, g, t);
    a.movi(g.ub, (base + ly.idx_at) as i64);
    kit::dma(a, true, g.ub, g.ip, &Xfer::contiguous(s.count * ly.ie));
    // The scalar unit reads the indices: wait for their load.
    queue::barrier(a, Pipe::Mte2, Pipe::S, k);
    chain.begin(a, 0, k);
    a.movi(slot, base as i64);
    let top = a.new_label("row");
    a.movi(cnt, s.count as i64);
    a.place(&top);
    a.ld(Space::Ub, ly.load, x, g.ub);
    row_offset(a, g, x, y, ly.row);
    a.add(y, y, g.src);
    kit::dma(a, true, slot, y, &Xfer::contiguous(ly.row));
    a.addi(g.ub, g.ub, ly.ie);
    a.addi(slot, slot, ly.slot_bytes);
    let top_l = a.label(&top);
    a.r#loop(cnt, top_l);
    chain.end(a, 0, k);
}

fn piece_load(a: &mut Asm, s: &Sub, g: &Regs, chain: &Chain, ly: &Layout, k: usize, t: Reg) {
    let [x, y, slot, _] = g.s.r;
    load_pointers(a, s, g, t);
    a.ld(Space::Gm, ly.load, x, g.ip);
    row_offset(a, g, x, y, ly.row);
    a.add(y, y, g.src);
    chain.begin(a, 0, k);
    a.movi(slot, (k as u64 * ly.buf) as i64);
    kit::dma(a, true, slot, y, &Xfer::contiguous(s.count));
    chain.end(a, 0, k);
}

/// The store of one task: its rows (or piece) from buffer `k` to the output.
#[allow(clippy::too_many_arguments)]
fn store(a: &mut Asm, s: &Sub, g: &Regs, chain: &Chain, ly: &Layout, k: usize, t: Reg, rows: bool) {
    let [s0, _, slot, _] = g.s.r;
    kit::set_add(a, g.dst, g.out, s.offs[1], s0);
    kit::decompose(a, t, &s.digits, &[None, Some(g.dst), None], &g.s);
    chain.begin(a, 1, k);
    a.movi(slot, (k as u64 * ly.buf) as i64);
    let x = if rows {
        Xfer {
            n: s.count,
            len: ly.row,
            gm_stride: ly.row,
            ub_pitch: ly.slot_bytes,
        }
    } else {
        Xfer::contiguous(s.count)
    };
    kit::dma(a, false, slot, g.dst, &x);
    chain.end(a, 1, k);
}
