//! MapIndex: the index of the lowest gear whose whole vector equals the query, else -1, with an
//! optional `level_index` remap (gear spec §6).
//!
//! Three table layouts ([`TableLayout`]): **gear-major** (GE's Const: row k is
//! `table[k*n .. (k+1)*n]`), **dim-major padded to 8 gears** (the TIK kernel's layout after
//! MapIndexFusionPass: `table[i*Gp + k]` is dim i of gear k, `Gp = ceil(G/8)*8`, padding columns
//! zero) and gearsim's **sorted for binary search** (rows `[v_0 .. v_(n-1), k]` sorted by
//! `(v, k)`). Padding columns never match: both engines compare only the first G columns.
//!
//! Two engines: an AI core kernel written in the ISA ([`aicore_program`]) and an AI CPU kernel
//! ([`run_aicpu`]) whose cost is a launch overhead, its memory reads through the shared memory
//! model and a per-element compare loop.

use gearsim_isa::{
    BuildError, Cmp, DType, Label, Pipe, Program, ProgramBuilder, Reg, SReg, SType, Space,
};

pub use gearsim_isa::gear::{TableLayout, layout_table, padded_gears};

/// The shape a MapIndex instance is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MapIndexShape {
    /// Query length (dims per gear).
    pub n: u32,
    /// Number of gears (table rows).
    pub gears: u32,
    /// Table layout.
    pub layout: TableLayout,
    /// Whether a `level_index` remap table is given.
    pub level_index: bool,
}

impl MapIndexShape {
    /// Checks the limits of gear spec §6.1 against a chip's configured maxima.
    pub fn check(&self, max_gears: u32, max_dims: u32) -> Result<(), String> {
        if self.n == 0 || self.n > max_dims {
            return Err(format!(
                "len(x) = {} is outside [1, {max_dims}] (kernels.map_index_max_dims)",
                self.n
            ));
        }
        if self.gears == 0 || self.gears > max_gears {
            return Err(format!(
                "len(data_seq) / len(x) = {} gears is outside [1, {max_gears}] (kernels.map_index_max_gears)",
                self.gears
            ));
        }
        Ok(())
    }
}

/// The reference result: the lowest k whose row equals `x`, remapped through `level_index`,
/// else -1. `table` is in `layout`, as [`layout_table`] makes it.
pub fn reference(
    x: &[i32],
    table: &[i32],
    gears: u32,
    layout: TableLayout,
    level_index: Option<&[i32]>,
) -> i32 {
    let n = x.len();
    let gp = padded_gears(gears) as usize;
    let g = gears as usize;
    let raw = match layout {
        TableLayout::GearMajor => (0..g)
            .find(|&k| table[k * n..(k + 1) * n] == *x)
            .map(|k| k as i32),
        TableLayout::DimMajor8 => (0..g)
            .find(|&k| (0..n).all(|i| table[i * gp + k] == x[i]))
            .map(|k| k as i32),
        // Rows are not in gear order: the lowest index stored in an equal row.
        TableLayout::SortedBinary => table
            .chunks_exact(n + 1)
            .take(g)
            .filter(|row| row[..n] == *x)
            .map(|row| row[n])
            .min(),
    };
    match (raw, level_index) {
        (None, _) => -1,
        (Some(k), None) => k,
        // A corrupt sorted table can name a gear past the remap table: no gear.
        (Some(k), Some(l)) => usize::try_from(k)
            .ok()
            .and_then(|k| l.get(k))
            .copied()
            .unwrap_or(-1),
    }
}

/// What a lower-bound binary search over a [`TableLayout::SortedBinary`] table did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortedSearch {
    /// The gear index stored in the first row equal to the query, if one is.
    pub gear: Option<i32>,
    /// Rows probed.
    pub probes: u64,
    /// Values compared (a probe stops at the first value that differs).
    pub compares: u64,
}

/// Searches a sorted table the way both engines do: `lo = 0, hi = G`; probe `mid`; a row less
/// than the query moves `lo` past it, any other row becomes `hi`; the last row found equal on
/// the way is the first equal row, because every equal row becomes `hi` and `hi` only moves
/// left. `log2(G)` probes, each stopping at the first differing value.
pub fn sorted_search(x: &[i32], table: &[i32], gears: u32) -> SortedSearch {
    let n = x.len();
    let (mut lo, mut hi) = (0usize, gears as usize);
    let mut out = SortedSearch {
        gear: None,
        probes: 0,
        compares: 0,
    };
    while lo < hi {
        let mid = (lo + hi) / 2;
        let row = &table[mid * (n + 1)..(mid + 1) * (n + 1)];
        out.probes += 1;
        let mut order = std::cmp::Ordering::Equal;
        for i in 0..n {
            out.compares += 1;
            order = row[i].cmp(&x[i]);
            if order.is_ne() {
                break;
            }
        }
        match order {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Equal => {
                out.gear = Some(row[n]);
                hi = mid;
            }
            std::cmp::Ordering::Greater => hi = mid,
        }
    }
    out
}

/// What the AI CPU kernel did: its result and the work that sets its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AiCpuWork {
    /// The index written to `y`.
    pub result: i32,
    /// Bytes read from device memory.
    pub bytes_read: u64,
    /// Elements compared.
    pub compares: u64,
}

/// The AI CPU engine. Gear-major and dim-major: scans gears in order and stops at the first
/// full match, as a scalar loop does (a dim-major scan still reads whole dim rows). Sorted: a
/// binary search ([`sorted_search`]) that reads only the rows it probes. `table` is in
/// `layout`; `level_index` has one entry per gear. A sorted row naming a gear outside
/// `[0, gears)` (a corrupt table) is an error when `level_index` must be read with it.
pub fn run_aicpu(
    x: &[i32],
    table: &[i32],
    gears: u32,
    layout: TableLayout,
    level_index: Option<&[i32]>,
) -> Result<AiCpuWork, String> {
    let n = x.len() as u64;
    let (raw, table_bytes, compares) = match layout {
        TableLayout::GearMajor | TableLayout::DimMajor8 => {
            let raw = reference(x, table, gears, layout, None);
            // Gears examined: up to and including the match, or all of them.
            let examined = if raw < 0 {
                u64::from(gears)
            } else {
                raw as u64 + 1
            };
            let bytes = match layout {
                // A gear-major scan reads the rows it examines.
                TableLayout::GearMajor => examined * n * 4,
                // A dim-major scan must read every dim row up to the examined gears: whole rows.
                _ => layout.table_len(gears, n as u32) * 4,
            };
            (raw, bytes, examined * n)
        }
        TableLayout::SortedBinary => {
            let s = sorted_search(x, table, gears);
            (s.gear.unwrap_or(-1), s.probes * (n + 1) * 4, s.compares)
        }
    };
    let result = match (raw, level_index) {
        (k, _) if k < 0 => -1,
        (k, None) => k,
        (k, Some(l)) => *l.get(k as usize).ok_or_else(|| {
            format!("the gear table names gear {k}, outside [0, {gears}) (a corrupt table)")
        })?,
    };
    Ok(AiCpuWork {
        result,
        bytes_read: n * 4
            + table_bytes
            + if level_index.is_some() && result >= 0 {
                4
            } else {
                0
            },
        compares,
    })
}

/// Bytes of UB the AI core kernel plans within on a core with `ub_bytes` of UB: seven eighths
/// (224 KiB of the 910's 256 KiB, 168 KiB of an A2 AIV's 192 KiB). The kernel was laid out for
/// the 256 KiB UB with 32 KiB spare; scaling the spare keeps that layout on the older chips.
pub fn ub_budget(ub_bytes: u64) -> u64 {
    ub_bytes / 8 * 7
}

fn round32(x: u64) -> u64 {
    x.div_ceil(32) * 32
}

/// The AI core engine for `shape`: one block, arguments `[x, table, level_index (0 = none), y]`
/// as u64 device addresses; writes one i32 to `y`.
///
/// Gear-major: the table is brought into UB with padded rows (one DMA burst per gear, each
/// 32-byte aligned), the query is replicated into matching rows with one masked `vmov`, one
/// masked `vcmp` per 64 dims compares every gear at once, and the scalar unit checks each gear's
/// bit word, stopping at the first full match. Dim-major: one `vcmps` per dim against the query
/// value over the first G columns, `vand` of the bit masks, and a count-trailing-zeros scan.
/// Tables larger than UB are processed in chunks. Sorted: the query and the whole table are
/// brought in by two DMAs issued back to back (their latencies overlap), then the scalar unit
/// runs the lower-bound search of [`sorted_search`]; a table larger than UB is not brought in
/// whole, each probed row is fetched by its own DMA instead.
///
/// `ub_bytes` is the UB of the core that runs it (the chip's `core.ub_bytes`); the kernel plans
/// within [`ub_budget`] of it. The kernel is built with the ISA's typed builders; a shape past
/// what its fields can express (larger than [`MapIndexShape::check`] admits with any preset) is
/// the builder's error.
pub fn aicore_program(shape: &MapIndexShape, ub_bytes: u64) -> Result<Program, BuildError> {
    let budget = ub_budget(ub_bytes);
    let b = match shape.layout {
        TableLayout::GearMajor => gear_major(shape, budget),
        TableLayout::DimMajor8 => dim_major(shape, budget),
        TableLayout::SortedBinary => sorted(shape, budget),
    };
    b.finish().map(|(program, _comments)| program)
}

/// The argument loads; returns the builder and the `found` label the epilogue places.
fn prologue(name: &str) -> (ProgramBuilder, Label) {
    let mut b = ProgramBuilder::new(name);
    let found = b.new_label("found");
    b.sreg(Reg::X1, SReg::Args);
    b.comment("arguments: x (query, i32[n]), table, level_index (0 = none), y (i32)");
    b.ld(Space::Gm, SType::U64, Reg::X2, Reg::X1);
    b.ld(Space::Gm, SType::U64, Reg::X3, Reg::X1).off(8);
    b.ld(Space::Gm, SType::U64, Reg::X4, Reg::X1).off(16);
    b.ld(Space::Gm, SType::U64, Reg::X5, Reg::X1).off(24);
    b.comment("result until a gear matches");
    b.movi(Reg::X30, -1);
    (b, found)
}

/// Epilogue: `found` expects the raw gear index in x29.
fn epilogue(b: &mut ProgramBuilder, found: Label, level: bool) {
    let store = b.new_label("store");
    b.jmp(store);
    b.place(found);
    b.mov(Reg::X30, Reg::X29);
    if level {
        b.movi(Reg::X6, 0);
        b.beq(Reg::X4, Reg::X6, store);
        b.shli(Reg::X7, Reg::X29, 2);
        b.add(Reg::X7, Reg::X4, Reg::X7);
        b.comment("level_index[k]");
        b.ld(Space::Gm, SType::I32, Reg::X30, Reg::X7);
    }
    b.place(store);
    b.st(Space::Gm, SType::U32, Reg::X30, Reg::X5);
    b.end();
}

fn gear_major(s: &MapIndexShape, budget: u64) -> ProgramBuilder {
    let n = u64::from(s.n);
    let g = u64::from(s.gears);
    let row = round32(4 * n); // UB row stride: each gear's n values padded to 32 bytes
    let chunks = n.div_ceil(64); // 64 i32 per vector repeat
    let x_bytes = row;
    // Gears per pass: table rows + replicated query rows + one bit word per (gear, dim chunk).
    let per_gear = 2 * row + 8 * chunks + 32;
    let gc = ((budget - x_bytes) / per_gear).clamp(1, 255).min(g);
    let (x_ub, xrep_ub) = (0u64, x_bytes);
    let tbl_ub = xrep_ub + gc * row;
    let bits_ub = tbl_ub + gc * row;
    let bits_stride = round32(gc * 8); // each dim chunk's bit words start 32-byte aligned
    let (mut b, found) = prologue(&format!("map_index_gm_g{g}_n{n}"));
    b.movi(Reg::X6, x_ub);
    b.copy_gm_to_ub_pad(Reg::X6, Reg::X2, 1, 4 * n);
    b.set_flag(Pipe::Mte2, Pipe::V, 0);
    b.wait_flag(Pipe::Mte2, Pipe::V, 0);
    b.movi(Reg::X7, 0);
    b.comment("replicate the query into the gears' rows, 64 dims at a time");
    for c in 0..chunks {
        b.movi(Reg::X8, mask_for(n - 64 * c));
        b.set_mask(Reg::X7, Reg::X8);
        b.movi(Reg::X9, xrep_ub + 256 * c);
        b.movi(Reg::X10, x_ub + 256 * c);
        b.vmov(DType::I32, Reg::X9, Reg::X10)
            .repeat(gc)
            .dst_rep(row / 32)
            .src_rep(0);
    }
    let mut g0 = 0u64;
    let mut pass = 0;
    while g0 < g {
        let gn = gc.min(g - g0);
        let scan = b.new_label(format!("scan{pass}"));
        let next = b.new_label(format!("next{pass}"));
        b.comment(format!("---- gears {g0}..{}", g0 + gn));
        b.movi(Reg::X11, tbl_ub);
        b.addi(Reg::X12, Reg::X3, g0 * n * 4);
        b.copy_gm_to_ub_pad(Reg::X11, Reg::X12, gn, 4 * n);
        b.set_flag(Pipe::Mte2, Pipe::V, 1);
        b.wait_flag(Pipe::Mte2, Pipe::V, 1);
        for c in 0..chunks {
            b.movi(Reg::X8, mask_for(n - 64 * c));
            b.set_mask(Reg::X7, Reg::X8);
            b.movi(Reg::X13, bits_ub + c * bits_stride);
            b.movi(Reg::X14, tbl_ub + 256 * c);
            b.movi(Reg::X15, xrep_ub + 256 * c);
            b.vcmp(Cmp::Eq, DType::I32, Reg::X13, Reg::X14, Reg::X15)
                .repeat(gn)
                .src0_rep(row / 32)
                .src1_rep(row / 32);
        }
        b.set_flag(Pipe::V, Pipe::S, 0);
        b.wait_flag(Pipe::V, Pipe::S, 0);
        b.comment(
            "scalar scan: gear k matches when every dim chunk's bit word has all its dims set",
        );
        b.movi(Reg::X16, 0);
        b.movi(Reg::X17, gn);
        b.place(scan);
        b.shli(Reg::X18, Reg::X16, 3);
        for c in 0..chunks {
            b.movi(Reg::X8, mask_for(n - 64 * c));
            b.addi(Reg::X19, Reg::X18, bits_ub + c * bits_stride);
            b.ld(Space::Ub, SType::U64, Reg::X20, Reg::X19);
            b.and(Reg::X20, Reg::X20, Reg::X8);
            b.bne(Reg::X20, Reg::X8, next);
        }
        b.addi(Reg::X29, Reg::X16, g0);
        b.jmp(found);
        b.place(next);
        b.addi(Reg::X16, Reg::X16, 1);
        b.blt(Reg::X16, Reg::X17, scan);
        g0 += gn;
        pass += 1;
    }
    epilogue(&mut b, found, s.level_index);
    b
}

/// The normal-mode mask enabling the first `min(k, 64)` elements, as the bit pattern `movi`
/// loads (all 64 bits set is -1).
fn mask_for(k: u64) -> i64 {
    if k >= 64 {
        -1
    } else {
        (1i64 << k).wrapping_sub(1)
    }
}

fn dim_major(s: &MapIndexShape, budget: u64) -> ProgramBuilder {
    let n = u64::from(s.n);
    let g = u64::from(s.gears);
    let gp = u64::from(padded_gears(s.gears));
    let row = gp * 4; // a multiple of 32 because gp is a multiple of 8
    let bits = round32(gp.div_ceil(8));
    let x_bytes = round32(4 * n);
    let (x_ub, acc_ub) = (0u64, x_bytes);
    let tmp_ub = acc_ub + bits;
    let rows_ub = tmp_ub + bits;
    let dc = ((budget - rows_ub) / row).clamp(1, n);
    // The AND covers the whole bit area, so bits past G (zero in tmp) are cleared in acc too.
    let halfwords = bits / 2;
    let (mut b, found) = prologue(&format!("map_index_dm8_g{g}_n{n}"));
    b.movi(Reg::X6, x_ub);
    b.copy_gm_to_ub_pad(Reg::X6, Reg::X2, 1, 4 * n);
    b.comment("acc = all ones, tmp = zeros over the bit area (bits past G stay zero in tmp, so");
    b.comment("the AND clears them in acc: padding columns can never match)");
    b.movi(Reg::X7, bits / 2);
    b.set_mask_count(Reg::X7);
    b.movi(Reg::X8, acc_ub);
    b.movi(Reg::X9, -1);
    b.vdup(DType::I16, Reg::X8, Reg::X9);
    b.movi(Reg::X10, tmp_ub);
    b.movi(Reg::X9, 0);
    b.vdup(DType::I16, Reg::X10, Reg::X9);
    b.set_flag(Pipe::Mte2, Pipe::S, 0);
    b.comment("the scalar unit reads query values from UB");
    b.wait_flag(Pipe::Mte2, Pipe::S, 0);
    let mut d0 = 0u64;
    let mut pass = 0;
    while d0 < n {
        let dn = dc.min(n - d0);
        let dim = b.new_label(format!("dim{pass}"));
        b.comment(format!("---- dims {d0}..{}", d0 + dn));
        if pass > 0 {
            b.comment("the previous rows must be consumed before they are overwritten");
            b.set_flag(Pipe::V, Pipe::Mte2, 0);
            b.wait_flag(Pipe::V, Pipe::Mte2, 0);
        }
        b.movi(Reg::X11, rows_ub);
        b.addi(Reg::X12, Reg::X3, d0 * row);
        b.copy_gm_to_ub(Reg::X11, Reg::X12, 1, dn * row / 32);
        b.set_flag(Pipe::Mte2, Pipe::V, 1);
        b.wait_flag(Pipe::Mte2, Pipe::V, 1);
        b.movi(Reg::X13, x_ub + 4 * d0);
        b.movi(Reg::X14, dn);
        b.movi(Reg::X15, g);
        b.movi(Reg::X16, halfwords);
        b.place(dim);
        b.comment("query value of this dim");
        b.ld(Space::Ub, SType::I32, Reg::X17, Reg::X13);
        b.set_mask_count(Reg::X15);
        b.vcmps(Cmp::Eq, DType::I32, Reg::X10, Reg::X11, Reg::X17);
        b.pipe_barrier(Pipe::V);
        b.set_mask_count(Reg::X16);
        b.vand(DType::I16, Reg::X8, Reg::X8, Reg::X10);
        b.pipe_barrier(Pipe::V);
        b.addi(Reg::X13, Reg::X13, 4);
        b.addi(Reg::X11, Reg::X11, row);
        b.r#loop(Reg::X14, dim);
        d0 += dn;
        pass += 1;
    }
    b.set_flag(Pipe::V, Pipe::S, 1);
    b.wait_flag(Pipe::V, Pipe::S, 1);
    b.comment("first set bit of acc: scan 64-bit words");
    for w in 0..gp.div_ceil(64) {
        let word = b.new_label(format!("word{w}"));
        b.movi(Reg::X18, acc_ub + 8 * w);
        b.ld(Space::Ub, SType::U64, Reg::X19, Reg::X18);
        b.movi(Reg::X20, 0);
        b.beq(Reg::X19, Reg::X20, word);
        b.ctz(Reg::X29, Reg::X19);
        b.addi(Reg::X29, Reg::X29, 64 * w);
        b.jmp(found);
        b.place(word);
    }
    epilogue(&mut b, found, s.level_index);
    b
}

/// Whether a sorted table of `shape` fits in a UB `budget` next to the query (else rows are
/// streamed).
pub fn sorted_table_fits_ub(shape: &MapIndexShape, budget: u64) -> bool {
    let x_bytes = round32(4 * u64::from(shape.n));
    let table_bytes = round32(shape.layout.table_len(shape.gears, shape.n) * 4);
    x_bytes + table_bytes <= budget
}

fn sorted(s: &MapIndexShape, budget: u64) -> ProgramBuilder {
    let n = u64::from(s.n);
    let g = u64::from(s.gears);
    let row = 4 * (n + 1); // n values then the gear index
    let x_ub = 0u64;
    let tbl_ub = round32(4 * n); // the table, or the one row being probed
    let resident = sorted_table_fits_ub(s, budget);
    let (mut b, found) = prologue(&format!("map_index_sorted_g{g}_n{n}"));
    let [search, searched, compare, less, not_less] =
        ["search", "searched", "compare", "less", "not_less"].map(|name| b.new_label(name));
    b.movi(Reg::X6, x_ub);
    b.copy_gm_to_ub_pad(Reg::X6, Reg::X2, 1, 4 * n);
    if resident {
        b.comment("issued right behind the query's DMA, so the two memory latencies overlap");
        b.movi(Reg::X7, tbl_ub);
        b.copy_gm_to_ub_pad(Reg::X7, Reg::X3, 1, g * row);
    }
    b.set_flag(Pipe::Mte2, Pipe::S, 0);
    b.comment("the scalar unit reads UB from here on");
    b.wait_flag(Pipe::Mte2, Pipe::S, 0);
    b.comment("lo, hi, and 1 once a probed row equalled the query");
    b.movi(Reg::X8, 0);
    b.movi(Reg::X9, g);
    b.movi(Reg::X28, 0);
    b.place(search);
    b.bge(Reg::X8, Reg::X9, searched);
    b.add(Reg::X10, Reg::X8, Reg::X9);
    b.comment("mid");
    b.shri(Reg::X10, Reg::X10, 1);
    b.muli(Reg::X11, Reg::X10, row);
    if resident {
        b.addi(Reg::X11, Reg::X11, tbl_ub);
    } else {
        b.add(Reg::X12, Reg::X3, Reg::X11);
        b.movi(Reg::X11, tbl_ub);
        b.copy_gm_to_ub_pad(Reg::X11, Reg::X12, 1, row);
        b.set_flag(Pipe::Mte2, Pipe::S, 1);
        b.wait_flag(Pipe::Mte2, Pipe::S, 1);
    }
    b.movi(Reg::X12, x_ub);
    b.movi(Reg::X13, n);
    b.place(compare);
    b.ld(Space::Ub, SType::I32, Reg::X14, Reg::X11);
    b.ld(Space::Ub, SType::I32, Reg::X15, Reg::X12);
    b.blt(Reg::X14, Reg::X15, less);
    b.bne(Reg::X14, Reg::X15, not_less);
    b.addi(Reg::X11, Reg::X11, 4);
    b.addi(Reg::X12, Reg::X12, 4);
    b.r#loop(Reg::X13, compare);
    b.comment(
        "equal: x11 now points at the row's gear index; the first equal row is at or left of mid",
    );
    b.movi(Reg::X28, 1);
    b.ld(Space::Ub, SType::I32, Reg::X29, Reg::X11);
    b.place(not_less);
    b.mov(Reg::X9, Reg::X10);
    b.jmp(search);
    b.place(less);
    b.addi(Reg::X8, Reg::X10, 1);
    b.jmp(search);
    b.place(searched);
    b.movi(Reg::X6, 0);
    b.bne(Reg::X28, Reg::X6, found);
    epilogue(&mut b, found, s.level_index);
    b
}
