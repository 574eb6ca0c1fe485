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

use std::fmt::Write as _;

use gearsim_isa::Program;

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

/// Bytes of UB the AI core kernel plans within (the rest stays free for nothing else).
const UB_BUDGET: u64 = 224 * 1024;

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
pub fn aicore_program(shape: &MapIndexShape) -> Program {
    let text = match shape.layout {
        TableLayout::GearMajor => gear_major_asm(shape),
        TableLayout::DimMajor8 => dim_major_asm(shape),
        TableLayout::SortedBinary => sorted_asm(shape),
    };
    match gearsim_isa::assemble(&text, "map_index.s") {
        Ok(p) => p,
        // The generator's output is fixed by its parameters, which `check` bounds; a failure is
        // a bug in this file, reported with the text that failed.
        Err(e) => unreachable!("generated MapIndex kernel does not assemble: {e}\n{text}"),
    }
}

fn prologue(out: &mut String, name: &str) {
    let _ = writeln!(out, ".kernel {name}");
    let _ = writeln!(out, "    sreg      x1, args");
    let _ = writeln!(out, "    ld.gm.u64 x2, x1            # x (query, i32[n])");
    let _ = writeln!(out, "    ld.gm.u64 x3, x1, off=8     # table");
    let _ = writeln!(
        out,
        "    ld.gm.u64 x4, x1, off=16    # level_index (0 = none)"
    );
    let _ = writeln!(out, "    ld.gm.u64 x5, x1, off=24    # y (i32)");
    let _ = writeln!(
        out,
        "    movi      x30, -1           # result until a gear matches"
    );
}

/// Epilogue: `found` expects the raw gear index in x29.
fn epilogue(out: &mut String, level: bool) {
    let _ = writeln!(out, "    jmp       store");
    let _ = writeln!(out, "found:");
    let _ = writeln!(out, "    mov       x30, x29");
    if level {
        let _ = writeln!(out, "    movi      x6, 0");
        let _ = writeln!(out, "    beq       x4, x6, store");
        let _ = writeln!(out, "    shli      x7, x29, 2");
        let _ = writeln!(out, "    add       x7, x4, x7");
        let _ = writeln!(out, "    ld.gm.i32 x30, x7           # level_index[k]");
    }
    let _ = writeln!(out, "store:");
    let _ = writeln!(out, "    st.gm.u32 x30, x5");
    let _ = writeln!(out, "    end");
}

fn gear_major_asm(s: &MapIndexShape) -> String {
    let n = u64::from(s.n);
    let g = u64::from(s.gears);
    let row = round32(4 * n); // UB row stride: each gear's n values padded to 32 bytes
    let chunks = n.div_ceil(64); // 64 i32 per vector repeat
    let x_bytes = row;
    // Gears per pass: table rows + replicated query rows + one bit word per (gear, dim chunk).
    let per_gear = 2 * row + 8 * chunks + 32;
    let gc = ((UB_BUDGET - x_bytes) / per_gear).clamp(1, 255).min(g);
    let (x_ub, xrep_ub) = (0u64, x_bytes);
    let tbl_ub = xrep_ub + gc * row;
    let bits_ub = tbl_ub + gc * row;
    let bits_stride = round32(gc * 8); // each dim chunk's bit words start 32-byte aligned
    let mut o = String::new();
    prologue(&mut o, &format!("map_index_gm_g{g}_n{n}"));
    let _ = writeln!(o, "    movi      x6, {x_ub}");
    let _ = writeln!(o, "    copy_gm_to_ub_pad x6, x2, 1, {}", 4 * n);
    let _ = writeln!(o, "    set_flag  MTE2, V, 0");
    let _ = writeln!(o, "    wait_flag MTE2, V, 0");
    let _ = writeln!(o, "    movi      x7, 0");
    // Replicate the query into gc rows, 64 dims at a time.
    for c in 0..chunks {
        let m = mask_for(n - 64 * c);
        let _ = writeln!(o, "    movi      x8, {m:#x}");
        let _ = writeln!(o, "    set_mask  x7, x8");
        let _ = writeln!(o, "    movi      x9, {}", xrep_ub + 256 * c);
        let _ = writeln!(o, "    movi      x10, {}", x_ub + 256 * c);
        let _ = writeln!(
            o,
            "    vmov.i32  x9, x10, repeat={gc}, dst_rep={}, src_rep=0",
            row / 32
        );
    }
    let mut g0 = 0u64;
    let mut pass = 0;
    while g0 < g {
        let gn = gc.min(g - g0);
        let _ = writeln!(o, "# ---- gears {g0}..{}", g0 + gn);
        let _ = writeln!(o, "    movi      x11, {tbl_ub}");
        let _ = writeln!(o, "    addi      x12, x3, {}", g0 * n * 4);
        let _ = writeln!(o, "    copy_gm_to_ub_pad x11, x12, {gn}, {}", 4 * n);
        let _ = writeln!(o, "    set_flag  MTE2, V, 1");
        let _ = writeln!(o, "    wait_flag MTE2, V, 1");
        for c in 0..chunks {
            let m = mask_for(n - 64 * c);
            let _ = writeln!(o, "    movi      x8, {m:#x}");
            let _ = writeln!(o, "    set_mask  x7, x8");
            let _ = writeln!(o, "    movi      x13, {}", bits_ub + c * bits_stride);
            let _ = writeln!(o, "    movi      x14, {}", tbl_ub + 256 * c);
            let _ = writeln!(o, "    movi      x15, {}", xrep_ub + 256 * c);
            let _ = writeln!(
                o,
                "    vcmp.eq.i32 x13, x14, x15, repeat={gn}, src0_rep={r}, src1_rep={r}",
                r = row / 32
            );
        }
        let _ = writeln!(o, "    set_flag  V, S, 0");
        let _ = writeln!(o, "    wait_flag V, S, 0");
        // Scalar scan: gear k matches when every dim chunk's bit word has all its dims set.
        let _ = writeln!(o, "    movi      x16, 0              # k within the pass");
        let _ = writeln!(o, "    movi      x17, {gn}");
        let _ = writeln!(o, "scan{pass}:");
        let _ = writeln!(o, "    shli      x18, x16, 3");
        for c in 0..chunks {
            let m = mask_for(n - 64 * c);
            let _ = writeln!(o, "    movi      x8, {m:#x}");
            let _ = writeln!(o, "    addi      x19, x18, {}", bits_ub + c * bits_stride);
            let _ = writeln!(o, "    ld.ub.u64 x20, x19");
            let _ = writeln!(o, "    and       x20, x20, x8");
            let _ = writeln!(o, "    bne       x20, x8, next{pass}");
        }
        let _ = writeln!(o, "    addi      x29, x16, {g0}");
        let _ = writeln!(o, "    jmp       found");
        let _ = writeln!(o, "next{pass}:");
        let _ = writeln!(o, "    addi      x16, x16, 1");
        let _ = writeln!(o, "    blt       x16, x17, scan{pass}");
        g0 += gn;
        pass += 1;
    }
    epilogue(&mut o, s.level_index);
    o
}

/// The normal-mode mask enabling the first `min(k, 64)` elements.
fn mask_for(k: u64) -> u64 {
    if k >= 64 { u64::MAX } else { (1u64 << k) - 1 }
}

fn dim_major_asm(s: &MapIndexShape) -> String {
    let n = u64::from(s.n);
    let g = u64::from(s.gears);
    let gp = u64::from(padded_gears(s.gears));
    let row = gp * 4; // a multiple of 32 because gp is a multiple of 8
    let bits = round32(gp.div_ceil(8));
    let x_bytes = round32(4 * n);
    let (x_ub, acc_ub) = (0u64, x_bytes);
    let tmp_ub = acc_ub + bits;
    let rows_ub = tmp_ub + bits;
    let dc = ((UB_BUDGET - rows_ub) / row).clamp(1, n);
    // The AND covers the whole bit area, so bits past G (zero in tmp) are cleared in acc too.
    let halfwords = bits / 2;
    let mut o = String::new();
    prologue(&mut o, &format!("map_index_dm8_g{g}_n{n}"));
    let _ = writeln!(o, "    movi      x6, {x_ub}");
    let _ = writeln!(o, "    copy_gm_to_ub_pad x6, x2, 1, {}", 4 * n);
    // acc = all ones, tmp = zeros over the bit area (bits past G stay zero in tmp, so the AND
    // clears them in acc: padding columns can never match).
    let _ = writeln!(o, "    movi      x7, {}", bits / 2);
    let _ = writeln!(o, "    set_mask_count x7");
    let _ = writeln!(o, "    movi      x8, {acc_ub}");
    let _ = writeln!(o, "    movi      x9, -1");
    let _ = writeln!(o, "    vdup.i16  x8, x9");
    let _ = writeln!(o, "    movi      x10, {tmp_ub}");
    let _ = writeln!(o, "    movi      x9, 0");
    let _ = writeln!(o, "    vdup.i16  x10, x9");
    let _ = writeln!(o, "    set_flag  MTE2, S, 0");
    let _ = writeln!(
        o,
        "    wait_flag MTE2, S, 0            # the scalar unit reads query values from UB"
    );
    let mut d0 = 0u64;
    let mut pass = 0;
    while d0 < n {
        let dn = dc.min(n - d0);
        let _ = writeln!(o, "# ---- dims {d0}..{}", d0 + dn);
        if pass > 0 {
            // The previous rows must be consumed before they are overwritten.
            let _ = writeln!(o, "    set_flag  V, MTE2, 0");
            let _ = writeln!(o, "    wait_flag V, MTE2, 0");
        }
        let _ = writeln!(o, "    movi      x11, {rows_ub}");
        let _ = writeln!(o, "    addi      x12, x3, {}", d0 * row);
        let _ = writeln!(o, "    copy_gm_to_ub x11, x12, 1, {}", dn * row / 32);
        let _ = writeln!(o, "    set_flag  MTE2, V, 1");
        let _ = writeln!(o, "    wait_flag MTE2, V, 1");
        let _ = writeln!(o, "    movi      x13, {}", x_ub + 4 * d0);
        let _ = writeln!(o, "    movi      x14, {dn}");
        let _ = writeln!(o, "    movi      x15, {g}");
        let _ = writeln!(o, "    movi      x16, {halfwords}");
        let _ = writeln!(o, "dim{pass}:");
        let _ = writeln!(
            o,
            "    ld.ub.i32 x17, x13              # query value of this dim"
        );
        let _ = writeln!(o, "    set_mask_count x15");
        let _ = writeln!(o, "    vcmps.eq.i32 x10, x11, x17");
        let _ = writeln!(o, "    pipe_barrier V");
        let _ = writeln!(o, "    set_mask_count x16");
        let _ = writeln!(o, "    vand.i16  x8, x8, x10");
        let _ = writeln!(o, "    pipe_barrier V");
        let _ = writeln!(o, "    addi      x13, x13, 4");
        let _ = writeln!(o, "    addi      x11, x11, {row}");
        let _ = writeln!(o, "    loop      x14, dim{pass}");
        d0 += dn;
        pass += 1;
    }
    let _ = writeln!(o, "    set_flag  V, S, 1");
    let _ = writeln!(o, "    wait_flag V, S, 1");
    // First set bit of acc: scan 64-bit words.
    for w in 0..gp.div_ceil(64) {
        let _ = writeln!(o, "    movi      x18, {}", acc_ub + 8 * w);
        let _ = writeln!(o, "    ld.ub.u64 x19, x18");
        let _ = writeln!(o, "    movi      x20, 0");
        let _ = writeln!(o, "    beq       x19, x20, word{w}");
        let _ = writeln!(o, "    ctz       x29, x19");
        let _ = writeln!(o, "    addi      x29, x29, {}", 64 * w);
        let _ = writeln!(o, "    jmp       found");
        let _ = writeln!(o, "word{w}:");
    }
    epilogue(&mut o, s.level_index);
    o
}

/// Whether a sorted table of `shape` fits in UB next to the query (else rows are streamed).
pub fn sorted_table_fits_ub(shape: &MapIndexShape) -> bool {
    let x_bytes = round32(4 * u64::from(shape.n));
    let table_bytes = round32(shape.layout.table_len(shape.gears, shape.n) * 4);
    x_bytes + table_bytes <= UB_BUDGET
}

fn sorted_asm(s: &MapIndexShape) -> String {
    let n = u64::from(s.n);
    let g = u64::from(s.gears);
    let row = 4 * (n + 1); // n values then the gear index
    let x_ub = 0u64;
    let tbl_ub = round32(4 * n); // the table, or the one row being probed
    let resident = sorted_table_fits_ub(s);
    let mut o = String::new();
    prologue(&mut o, &format!("map_index_sorted_g{g}_n{n}"));
    let _ = writeln!(o, "    movi      x6, {x_ub}");
    let _ = writeln!(o, "    copy_gm_to_ub_pad x6, x2, 1, {}", 4 * n);
    if resident {
        // Issued right behind the query's DMA, so the two memory latencies overlap.
        let _ = writeln!(o, "    movi      x7, {tbl_ub}");
        let _ = writeln!(o, "    copy_gm_to_ub_pad x7, x3, 1, {}", g * row);
    }
    let _ = writeln!(o, "    set_flag  MTE2, S, 0");
    let _ = writeln!(
        o,
        "    wait_flag MTE2, S, 0            # the scalar unit reads UB from here on"
    );
    let _ = writeln!(o, "    movi      x8, 0                 # lo");
    let _ = writeln!(o, "    movi      x9, {g}               # hi");
    let _ = writeln!(
        o,
        "    movi      x28, 0                # 1 once a probed row equalled the query"
    );
    let _ = writeln!(o, "search:");
    let _ = writeln!(o, "    bge       x8, x9, searched");
    let _ = writeln!(o, "    add       x10, x8, x9");
    let _ = writeln!(o, "    shri      x10, x10, 1           # mid");
    let _ = writeln!(o, "    muli      x11, x10, {row}");
    if resident {
        let _ = writeln!(o, "    addi      x11, x11, {tbl_ub}");
    } else {
        let _ = writeln!(o, "    add       x12, x3, x11");
        let _ = writeln!(o, "    movi      x11, {tbl_ub}");
        let _ = writeln!(o, "    copy_gm_to_ub_pad x11, x12, 1, {row}");
        let _ = writeln!(o, "    set_flag  MTE2, S, 1");
        let _ = writeln!(o, "    wait_flag MTE2, S, 1");
    }
    let _ = writeln!(o, "    movi      x12, {x_ub}");
    let _ = writeln!(o, "    movi      x13, {n}");
    let _ = writeln!(o, "compare:");
    let _ = writeln!(o, "    ld.ub.i32 x14, x11");
    let _ = writeln!(o, "    ld.ub.i32 x15, x12");
    let _ = writeln!(o, "    blt       x14, x15, less");
    let _ = writeln!(o, "    bne       x14, x15, not_less");
    let _ = writeln!(o, "    addi      x11, x11, 4");
    let _ = writeln!(o, "    addi      x12, x12, 4");
    let _ = writeln!(o, "    loop      x13, compare");
    // Equal: x11 now points at the row's gear index. The first equal row is at or left of mid.
    let _ = writeln!(o, "    movi      x28, 1");
    let _ = writeln!(o, "    ld.ub.i32 x29, x11");
    let _ = writeln!(o, "not_less:");
    let _ = writeln!(o, "    mov       x9, x10");
    let _ = writeln!(o, "    jmp       search");
    let _ = writeln!(o, "less:");
    let _ = writeln!(o, "    addi      x8, x10, 1");
    let _ = writeln!(o, "    jmp       search");
    let _ = writeln!(o, "searched:");
    let _ = writeln!(o, "    movi      x6, 0");
    let _ = writeln!(o, "    bne       x28, x6, found");
    epilogue(&mut o, s.level_index);
    o
}
