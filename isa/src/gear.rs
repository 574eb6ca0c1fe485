//! Device-side formats of the gear feature that the compiler writes and the firmware reads:
//! the gear table layouts MapIndex scans, the MapIndex engines, and the shape tensors GetNext
//! writes for GetDynamicDims.
//!
//! Three table layouts: **gear-major** (GE's Const: row k is `table[k*n .. (k+1)*n]`),
//! **dim-major padded to 8 gears** (the TIK kernel's layout after MapIndexFusionPass:
//! `table[i*Gp + k]` is dim i of gear k, `Gp = ceil(G/8)*8`, padding columns zero), and
//! gearsim's own **sorted for binary search** (row r is `[v_0 .. v_(n-1), k]`, the rows sorted
//! by `(v, k)`, so a lower-bound search finds the lowest matching gear in `log2(G)` probes).

/// Name of the gear-vector input of a non-sink gear model (GE's `ascend_mbatch_shape_data`):
/// the runtime writes the selected gear's values there before each run.
pub const SHAPE_DATA: &str = "ascend_mbatch_shape_data";

/// How the gear table is laid out in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TableLayout {
    /// Row k holds gear k's n values (GE's Const).
    #[default]
    GearMajor,
    /// Row i holds dim i of every gear, padded to a multiple of 8 gears with zeros.
    DimMajor8,
    /// gearsim's layout: G rows of `n + 1` values, gear k's n values followed by k, sorted
    /// ascending by the values (signed, lexicographic) and then by k. A lower-bound binary
    /// search lands on the first row equal to the query, which carries the lowest matching
    /// gear index, so GE's semantics hold even for repeated gears; there is no padding.
    SortedBinary,
}

impl TableLayout {
    /// Every layout: GE's two, then gearsim's.
    pub const ALL: [TableLayout; 3] = [
        TableLayout::GearMajor,
        TableLayout::DimMajor8,
        TableLayout::SortedBinary,
    ];

    /// The number stored in the AI CPU kernel's argument block.
    pub fn code(self) -> u32 {
        match self {
            TableLayout::GearMajor => 0,
            TableLayout::DimMajor8 => 1,
            TableLayout::SortedBinary => 2,
        }
    }

    /// The layout with this code.
    pub fn from_code(code: u32) -> Option<TableLayout> {
        TableLayout::ALL.into_iter().find(|l| l.code() == code)
    }

    /// Name used in reports and on the command line (`--gear_table_layout`).
    pub fn name(self) -> &'static str {
        match self {
            TableLayout::GearMajor => "gear_major",
            TableLayout::DimMajor8 => "dim_major8",
            TableLayout::SortedBinary => "sorted_binary",
        }
    }

    /// Every layout's name, for messages (`gear_major, dim_major8, sorted_binary`).
    pub fn names() -> String {
        TableLayout::ALL.map(TableLayout::name).join(", ")
    }

    /// The layout with this name.
    pub fn parse(name: &str) -> Option<TableLayout> {
        TableLayout::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Number of i32 values the table holds for `gears` gears of `n` dims.
    pub fn table_len(self, gears: u32, n: u32) -> u64 {
        match self {
            TableLayout::GearMajor => u64::from(gears) * u64::from(n),
            TableLayout::DimMajor8 => u64::from(padded_gears(gears)) * u64::from(n),
            TableLayout::SortedBinary => u64::from(gears) * (u64::from(n) + 1),
        }
    }
}

/// Gears rounded up to a multiple of 8.
pub fn padded_gears(gears: u32) -> u32 {
    gears.div_ceil(8) * 8
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
        TableLayout::SortedBinary => {
            let mut rows: Vec<(&[i32], i32)> = (0..g)
                .map(|k| (&gear_major[k * n..(k + 1) * n], k as i32))
                .collect();
            // Slices of i32 compare lexicographically and signed, exactly as the kernels' `blt`
            // does; the index breaks ties, so the first of equal rows has the lowest index.
            rows.sort_unstable();
            let mut out = Vec::with_capacity(g * (n + 1));
            for (values, k) in rows {
                out.extend_from_slice(values);
                out.push(k);
            }
            out
        }
    }
}

/// Which engine runs MapIndex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MapIndexEngine {
    /// An AI core kernel (GE's default on Ascend 910).
    #[default]
    AiCore,
    /// An AI CPU kernel.
    AiCpu,
}

impl MapIndexEngine {
    /// Both engines.
    pub const ALL: [MapIndexEngine; 2] = [MapIndexEngine::AiCore, MapIndexEngine::AiCpu];

    /// The number stored in the `.om`.
    pub fn code(self) -> u32 {
        match self {
            MapIndexEngine::AiCore => 0,
            MapIndexEngine::AiCpu => 1,
        }
    }

    /// The engine with this code.
    pub fn from_code(code: u32) -> Option<MapIndexEngine> {
        MapIndexEngine::ALL.into_iter().find(|e| e.code() == code)
    }

    /// Name used in reports and on the command line (`--mapindex_engine`).
    pub fn name(self) -> &'static str {
        match self {
            MapIndexEngine::AiCore => "aicore",
            MapIndexEngine::AiCpu => "aicpu",
        }
    }

    /// The engine with this name.
    pub fn parse(name: &str) -> Option<MapIndexEngine> {
        MapIndexEngine::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// Largest rank of a tensor shape carried by GetNext / GetDynamicDims.
pub const MAX_RANK: usize = 8;
/// Bytes of a shape tensor in device memory: `rank: i64` then `MAX_RANK` dims (i64).
pub const SHAPE_TENSOR_BYTES: u64 = 8 * (1 + MAX_RANK as u64);
