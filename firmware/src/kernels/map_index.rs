//! MapIndex: the index of the lowest gear whose whole vector equals the query, else -1, with an
//! optional `level_index` remap (gear spec §6).
//!
//! Two table layouts: **gear-major** (GE's Const: row k is `table[k*n .. (k+1)*n]`) and
//! **dim-major padded to 8 gears** (the TIK kernel's layout after MapIndexFusionPass:
//! `table[i*Gp + k]` is dim i of gear k, `Gp = ceil(G/8)*8`, padding columns zero). Padding
//! columns never match: both engines compare only the first G columns.
//!
//! Two engines: an AI core kernel written in the ISA ([`aicore_program`]) and an AI CPU kernel
//! ([`run_aicpu`]) whose cost is a launch overhead, its memory reads through the shared memory
//! model and a per-element compare loop.

use std::fmt::Write as _;

use gearsim_isa::Program;

/// How the gear table is laid out in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TableLayout {
    /// Row k holds gear k's n values (GE's Const).
    GearMajor,
    /// Row i holds dim i of every gear, padded to a multiple of 8 gears with zeros.
    DimMajor8,
}

impl TableLayout {
    /// Both layouts.
    pub const ALL: [TableLayout; 2] = [TableLayout::GearMajor, TableLayout::DimMajor8];

    /// The number stored in the AI CPU kernel's argument block.
    pub fn code(self) -> u32 {
        match self {
            TableLayout::GearMajor => 0,
            TableLayout::DimMajor8 => 1,
        }
    }

    /// The layout with this code.
    pub fn from_code(code: u32) -> Option<TableLayout> {
        match code {
            0 => Some(TableLayout::GearMajor),
            1 => Some(TableLayout::DimMajor8),
            _ => None,
        }
    }

    /// Name used in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TableLayout::GearMajor => "gear_major",
            TableLayout::DimMajor8 => "dim_major8",
        }
    }

    /// Number of i32 values the table holds for `gears` gears of `n` dims.
    pub fn table_len(self, gears: u32, n: u32) -> u64 {
        match self {
            TableLayout::GearMajor => u64::from(gears) * u64::from(n),
            TableLayout::DimMajor8 => u64::from(padded_gears(gears)) * u64::from(n),
        }
    }
}

/// Gears rounded up to a multiple of 8.
pub fn padded_gears(gears: u32) -> u32 {
    gears.div_ceil(8) * 8
}

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

/// Lays a gear-major table (`gears` rows of `n`) out in `layout`.
pub fn layout_table(gear_major: &[i32], n: u32, gears: u32, layout: TableLayout) -> Vec<i32> {
    let (n, g) = (n as usize, gears as usize);
    match layout {
        TableLayout::GearMajor => gear_major.to_vec(),
        TableLayout::DimMajor8 => {
            let gp = padded_gears(gears) as usize;
            let mut out = vec![0; n * gp];
            for k in 0..g {
                for i in 0..n {
                    out[i * gp + k] = gear_major[k * n + i];
                }
            }
            out
        }
    }
}

/// The reference result: the lowest k whose row equals `x`, remapped through `level_index`,
/// else -1. `table` is in `layout`.
pub fn reference(
    x: &[i32],
    table: &[i32],
    gears: u32,
    layout: TableLayout,
    level_index: Option<&[i32]>,
) -> i32 {
    let n = x.len();
    let gp = padded_gears(gears) as usize;
    let value = |k: usize, i: usize| match layout {
        TableLayout::GearMajor => table[k * n + i],
        TableLayout::DimMajor8 => table[i * gp + k],
    };
    for k in 0..gears as usize {
        if (0..n).all(|i| value(k, i) == x[i]) {
            return level_index.map_or(k as i32, |l| l[k]);
        }
    }
    -1
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

/// The AI CPU engine: scans gears in order and stops at the first full match, as a scalar loop
/// does. `table` is in `layout`; `level_index` has one entry per gear.
pub fn run_aicpu(
    x: &[i32],
    table: &[i32],
    gears: u32,
    layout: TableLayout,
    level_index: Option<&[i32]>,
) -> AiCpuWork {
    let n = x.len() as u64;
    let result = reference(x, table, gears, layout, level_index);
    // Gears examined: up to and including the match, or all of them.
    let examined = if result < 0 {
        u64::from(gears)
    } else {
        // The reference returns the remapped value; find the raw index again for the cost.
        let raw = reference(x, table, gears, layout, None);
        raw as u64 + 1
    };
    let table_bytes = match layout {
        // A gear-major scan reads the rows it examines.
        TableLayout::GearMajor => examined * n * 4,
        // A dim-major scan must read every dim row up to the examined gears: whole rows.
        TableLayout::DimMajor8 => layout.table_len(gears, n as u32) * 4,
    };
    AiCpuWork {
        result,
        bytes_read: n * 4
            + table_bytes
            + if level_index.is_some() && result >= 0 {
                4
            } else {
                0
            },
        compares: examined * n,
    }
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
/// Tables larger than UB are processed in chunks.
pub fn aicore_program(shape: &MapIndexShape) -> Program {
    let text = match shape.layout {
        TableLayout::GearMajor => gear_major_asm(shape),
        TableLayout::DimMajor8 => dim_major_asm(shape),
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
