//! The streaming pipeline element-wise kernels share: each block takes a contiguous slice of
//! the tensors, and tiles of it flow GM →MTE2→ UB →V→ UB →MTE3→ GM through two buffers, so
//! MTE2 loads tile i+1 while V computes tile i and MTE3 stores tile i−1 (Ascend C's double
//! buffer with the TQue flag pattern: MTE2→V "data ready", V→MTE2 "input buffer free",
//! V→MTE3 "result ready", MTE3→V "output buffer free"; `queue.rs`'s `VECIN` and `VECOUT`).
//!
//! Every length is static: the blocks get `per_block` elements except the last, which gets the
//! rest; within a block full tiles run in pairs (buffer 0, buffer 1), then an odd full tile and
//! a tail tile. The vector unit runs in counter mode, so a tile of any length is one
//! instruction per operation and tails need no special code; a tail whose bytes are not a
//! multiple of 32 moves with the byte-granular DMA.

use gearsim_isa::SReg;

use super::dma;
use super::queue::{self, VECIN, VECOUT};
use super::writer::{Asm, Reg};
use crate::CoreSpec;

/// Smallest slice worth a block of its own.
const MIN_ELEMS_PER_BLOCK: u64 = 2048;
/// Slices and full tiles are multiples of this many elements (so every buffer is 32-byte
/// aligned for any element size and a tile fills whole vector repeats).
const QUANTUM: u64 = 64;
/// Tiles at least this long (shorter ones spend more time synchronising than moving).
const MIN_TILE: u64 = 256;

/// A streamed tensor: its argument index, element size in bytes and where it starts in the
/// argument (tensors sharing an argument cost one argument load per block).
#[derive(Debug, Clone, Copy)]
pub struct Io {
    /// Index in the kernel's argument array.
    pub arg: usize,
    /// Bytes per element.
    pub elem: u64,
    /// Bytes from the argument's address to the tensor's first element.
    pub offset: u64,
}

impl Io {
    /// The tensor at argument `arg`'s address, of `elem`-byte elements.
    pub fn new(arg: usize, elem: u64) -> Io {
        Io {
            arg,
            elem,
            offset: 0,
        }
    }
}

/// A row vector every tile reads (a per-column factor or bias of a row-major matrix): loaded
/// once per block from argument `arg` in `bursts` strided bursts of `burst_bytes` (`gap_bytes`
/// apart in GM) and repeated to fill a tile, which then starts on a row (see
/// [`Stream::row`]).
#[derive(Debug, Clone, Copy)]
pub struct Resident {
    /// Index in the kernel's argument array.
    pub arg: usize,
    /// Bursts of one row.
    pub bursts: u64,
    /// Bytes per burst.
    pub burst_bytes: u64,
    /// GM bytes between bursts.
    pub gap_bytes: u64,
    /// Bytes per element.
    pub elem: u64,
}

/// What the body of one tile works with: UB addresses of this tile's buffers, its length,
/// and the registers `setup` prepared.
#[derive(Debug, Clone)]
pub struct Tile {
    /// Input buffers.
    pub ins: Vec<Reg>,
    /// Output buffers.
    pub outs: Vec<Reg>,
    /// Scratch buffers (one element of the declared size per tile element).
    pub scratch: Vec<Reg>,
    /// The resident row vectors, each repeated over the tile.
    pub resident: Vec<Reg>,
    /// Elements in this tile (the vector mask is in counter mode for exactly these).
    pub len: u64,
    /// Registers `setup` returned.
    pub consts: Vec<Reg>,
}

/// A streaming element-wise kernel.
pub struct Stream<'a> {
    /// Elements of every streamed tensor.
    pub n: u64,
    /// Streamed inputs.
    pub inputs: Vec<Io>,
    /// Streamed outputs.
    pub outputs: Vec<Io>,
    /// Bytes per element of each scratch buffer.
    pub scratch: Vec<u64>,
    /// Elements per row when tiles must start on rows (0: no rows; slices and tiles are then
    /// multiples of 64 elements); a row's bytes must be a multiple of 32 for every tensor.
    pub row: u64,
    /// Row vectors every tile reads (needs `row`).
    pub resident: Vec<Resident>,
    /// Runs once per block before the tiles (e.g. loads a scalar operand); gets the argument
    /// array register and returns registers the body reads.
    pub setup: &'a dyn Fn(&mut Asm, Reg) -> Vec<Reg>,
    /// Emits the vector instructions of one tile.
    pub body: &'a dyn Fn(&mut Asm, &Tile),
}

/// The static shape of a streaming kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Blocks.
    pub block_dim: u32,
    /// Elements per block (the last block gets the rest).
    pub per_block: u64,
    /// Elements per full tile.
    pub tile: u64,
}

impl Stream<'_> {
    /// Bytes of UB one tile element needs: two buffers per streamed tensor, one scratch.
    fn bytes_per_elem(&self) -> u64 {
        let io: u64 = self
            .inputs
            .iter()
            .chain(&self.outputs)
            .map(|i| i.elem)
            .sum();
        let resident: u64 = self.resident.iter().map(|r| r.elem).sum();
        2 * io + self.scratch.iter().sum::<u64>() + resident
    }

    /// What slices and full tiles are multiples of.
    fn quantum(&self) -> u64 {
        if self.row > 0 { self.row } else { QUANTUM }
    }

    /// Chooses blocks and tiles for `core`. `None` when one tile does not fit in UB.
    pub fn plan(&self, core: &CoreSpec) -> Option<Plan> {
        let n = self.n.max(1);
        let q = self.quantum();
        let cores = core.vector_blocks();
        let mut blocks = n.div_ceil(MIN_ELEMS_PER_BLOCK).clamp(1, cores);
        let per_block = n.div_ceil(blocks).div_ceil(q) * q;
        blocks = n.div_ceil(per_block);
        let max_tile = core.ub_bytes / self.bytes_per_elem().max(1) / q * q;
        if max_tile < q {
            return None;
        }
        // At least four tiles per block when the slice allows, so the pipeline fills.
        let want = per_block.div_ceil(4).div_ceil(q) * q;
        let tile = want.max(MIN_TILE.div_ceil(q) * q).min(max_tile);
        Some(Plan {
            block_dim: blocks as u32,
            per_block,
            tile,
        })
    }

    /// Writes the kernel into `a` following `plan`.
    pub fn emit(&self, a: &mut Asm, plan: Plan) {
        a.tiling("elements", self.n as i64);
        a.tiling("block_dim", i64::from(plan.block_dim));
        a.tiling("per_block", plan.per_block as i64);
        a.tiling("tile", plan.tile as i64);
        let args = a.reg();
        a.sreg(args, SReg::Args);
        let io: Vec<Io> = self.inputs.iter().chain(&self.outputs).copied().collect();
        // One load per argument; a tensor further into it is its address plus an offset.
        let mut loaded: Vec<(usize, Reg)> = Vec::new();
        let mut ptrs: Vec<Reg> = Vec::new();
        for i in &io {
            match loaded.iter().find(|(arg, _)| *arg == i.arg) {
                Some(&(_, base)) => {
                    let p = a.reg();
                    a.mov(p, base);
                    ptrs.push(p);
                }
                None => {
                    let p = a.arg(args, i.arg);
                    loaded.push((i.arg, p));
                    ptrs.push(p);
                }
            }
        }
        let bi = a.reg();
        let t = a.reg();
        a.sreg(bi, SReg::BlockIdx);
        for (p, i) in ptrs.iter().zip(&io) {
            a.movi(t, (plan.per_block * i.elem) as i64);
            a.mul(t, t, bi);
            a.add(*p, *p, t);
            if i.offset > 0 {
                a.add_imm(*p, i.offset as i64);
            }
        }
        let consts = (self.setup)(a, args);
        // UB layout: buffer 0 of every streamed tensor, buffer 1 of every one, then scratch.
        let mut offset = 0u64;
        let mut bufs = [Vec::new(), Vec::new()];
        for b in &mut bufs {
            for i in &io {
                b.push(offset);
                offset += plan.tile * i.elem;
            }
        }
        let mut scratch = Vec::new();
        for s in &self.scratch {
            scratch.push(offset);
            offset += plan.tile * s;
        }
        let mut resident = Vec::new();
        for r in &self.resident {
            resident.push(offset);
            offset += plan.tile * r.elem;
        }
        a.tiling("ub_bytes", offset as i64);
        let resident_regs = self.load_resident(a, args, plan, &resident);
        let ub: Vec<Reg> = io.iter().map(|_| a.reg()).collect();
        let scratch_regs: Vec<Reg> = scratch
            .iter()
            .map(|off| {
                let r = a.reg();
                a.movi(r, *off as i64);
                r
            })
            .collect();
        let mask = a.reg();
        let count = a.reg();
        let ctx = Emit {
            s: self,
            plan,
            io: &io,
            ptrs: &ptrs,
            ub: &ub,
            bufs: &bufs,
            scratch: &scratch_regs,
            resident: &resident_regs,
            consts: &consts,
            mask,
            count,
        };
        a.comment("both input buffers and both output buffers start free");
        queue::prime(a, &[VECIN, VECOUT], 2);
        let last = self.n - (u64::from(plan.block_dim) - 1) * plan.per_block;
        if last == plan.per_block {
            ctx.slice(a, plan.per_block);
        } else {
            let last_label = a.new_label("last_block");
            let done = a.new_label("drain");
            a.movi(t, i64::from(plan.block_dim) - 1);
            let l = a.label(&last_label);
            a.beq(bi, t, l);
            ctx.slice(a, plan.per_block);
            let l = a.label(&done);
            a.jmp(l);
            a.place(&last_label);
            ctx.slice(a, last);
            a.place(&done);
        }
        a.comment("consume the flags the last tiles set");
        queue::drain(a, &[VECIN, VECOUT], 2);
    }

    /// Loads every resident row vector once per tile row into its UB area at `offsets`, the
    /// vector unit waiting for them (flag id 0, set and consumed before the buffers' flags are
    /// primed); returns registers holding the areas' addresses.
    fn load_resident(&self, a: &mut Asm, args: Reg, plan: Plan, offsets: &[u64]) -> Vec<Reg> {
        if self.resident.is_empty() {
            return Vec::new();
        }
        a.comment("the resident row vectors, repeated over a tile");
        let rows = plan.tile / self.row.max(1);
        let ub = a.reg();
        let mut regs = Vec::new();
        for (r, off) in self.resident.iter().zip(offsets) {
            let gm = a.arg(args, r.arg);
            for j in 0..rows {
                a.movi(ub, (off + j * self.row * r.elem) as i64);
                dma::rows(
                    a,
                    Dir::GmToUb,
                    ub,
                    gm,
                    r.bursts,
                    r.burst_bytes,
                    r.gap_bytes,
                    0,
                );
            }
            let reg = a.reg();
            a.movi(reg, *off as i64);
            regs.push(reg);
        }
        queue::barrier(a, gearsim_isa::Pipe::Mte2, gearsim_isa::Pipe::V, 0);
        regs
    }
}

struct Emit<'a> {
    s: &'a Stream<'a>,
    plan: Plan,
    io: &'a [Io],
    ptrs: &'a [Reg],
    ub: &'a [Reg],
    bufs: &'a [Vec<u64>; 2],
    scratch: &'a [Reg],
    resident: &'a [Reg],
    consts: &'a [Reg],
    mask: Reg,
    count: Reg,
}

impl Emit<'_> {
    /// The tiles of one block's slice of `m` elements.
    fn slice(&self, a: &mut Asm, m: u64) {
        let tile = self.plan.tile;
        let (full, rest) = (m / tile, m % tile);
        if full >= 2 {
            let top = a.new_label("tile_pair");
            a.movi(self.count, (full / 2) as i64);
            a.place(&top);
            self.tile(a, 0, tile);
            self.tile(a, 1, tile);
            let l = a.label(&top);
            a.r#loop(self.count, l);
        }
        let mut next = 0;
        if full % 2 == 1 {
            self.tile(a, 0, tile);
            next = 1;
        }
        if rest > 0 {
            self.tile(a, next, rest);
        }
    }

    /// One tile of `len` elements in buffer `k`.
    fn tile(&self, a: &mut Asm, k: usize, len: u64) {
        let n_in = self.s.inputs.len();
        for (r, off) in self.ub.iter().zip(&self.bufs[k]) {
            a.movi(*r, *off as i64);
        }
        VECIN.alloc(a, k);
        for i in 0..n_in {
            copy(
                a,
                Dir::GmToUb,
                self.ub[i],
                self.ptrs[i],
                len * self.io[i].elem,
            );
            a.add_imm(self.ptrs[i], (len * self.io[i].elem) as i64);
        }
        VECIN.enque(a, k);
        VECIN.deque(a, k);
        VECOUT.alloc(a, k);
        a.mask_count(self.mask, len);
        let tile = Tile {
            ins: self.ub[..n_in].to_vec(),
            outs: self.ub[n_in..].to_vec(),
            scratch: self.scratch.to_vec(),
            resident: self.resident.to_vec(),
            len,
            consts: self.consts.to_vec(),
        };
        (self.s.body)(a, &tile);
        VECIN.free(a, k);
        VECOUT.enque(a, k);
        VECOUT.deque(a, k);
        for i in n_in..self.io.len() {
            copy(
                a,
                Dir::UbToGm,
                self.ptrs[i],
                self.ub[i],
                len * self.io[i].elem,
            );
            a.add_imm(self.ptrs[i], (len * self.io[i].elem) as i64);
        }
        VECOUT.free(a, k);
    }
}

pub use super::dma::Dir;

/// One contiguous copy of `bytes`: 32-byte bursts when they divide it, else byte-granular.
pub fn copy(a: &mut Asm, dir: Dir, dst: Reg, src: Reg, bytes: u64) {
    let (ub, gm) = match dir {
        Dir::GmToUb => (dst, src),
        Dir::UbToGm => (src, dst),
    };
    dma::rows(a, dir, ub, gm, 1, bytes, 0, 0);
}
