//! MapIndex equals a plain reference (GE's semantics: the lowest gear index whose whole vector
//! equals the query, -1 if none) on both engines and every table layout: random tables of 2 to
//! 100 gears (the preset's limit) and 1 to 8 dims, queries that match a gear or none, with and
//! without `level_index`; all-zero queries against padding, repeated gears, tables too large
//! for UB.

use gearsim_firmware::kernels::map_index::{self, TableLayout};
use gearsim_traces::NullSink;
use proptest::prelude::*;

use crate::support::*;

/// A gear-major table of unique gears with many partial collisions (small values), and a query.
fn case(gears: u32, n: u32, seed: u64, matching: bool, pick: u32) -> (Vec<i32>, Vec<i32>) {
    let mut s = seed;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) % 5) as i32 - 2
    };
    let (g, n) = (gears as usize, n as usize);
    let mut rows: Vec<Vec<i32>> = Vec::new();
    for k in 0..g {
        let mut row: Vec<i32> = (0..n).map(|_| next()).collect();
        if rows.contains(&row) {
            row[0] = 1000 + k as i32; // gears are unique (GE's E10039)
        }
        rows.push(row);
    }
    let query = if matching {
        rows[pick as usize % g].clone()
    } else {
        let mut q: Vec<i32> = (0..n).map(|_| next()).collect();
        while rows.contains(&q) {
            q[0] -= 7;
        }
        q
    };
    (rows.concat(), query)
}

#[allow(clippy::too_many_arguments)] // one per proptest input, named as in the strategies
fn check(
    engine: Engine,
    layout: TableLayout,
    gears: u32,
    n: u32,
    seed: u64,
    matching: bool,
    pick: u32,
    with_level: bool,
) -> Result<(), TestCaseError> {
    let (table, x) = case(gears, n, seed, matching, pick);
    let level: Option<Vec<i32>> =
        with_level.then(|| (0..gears as i32).map(|k| 7 * k + 3).collect());
    let mut dev = device("ascend310p", NullSink);
    let (got, _) = run_map_index(
        &mut dev,
        engine,
        layout,
        &x,
        &table,
        gears,
        level.as_deref(),
    );
    let laid = map_index::layout_table(&table, n, gears, layout);
    let want = map_index::reference(&x, &laid, gears, layout, level.as_deref());
    // The reference itself must agree with the plain definition on the gear-major table.
    let plain = (0..gears as usize)
        .find(|&k| table[k * n as usize..(k + 1) * n as usize] == x[..])
        .map_or(-1, |k| level.as_ref().map_or(k as i32, |l| l[k]));
    prop_assert_eq!(want, plain);
    prop_assert_eq!(
        got,
        want,
        "engine {:?} layout {:?} gears {} n {} query {:?}",
        engine,
        layout,
        gears,
        n,
        x
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn aicore_gear_major(gears in 2u32..=100, n in 1u32..=8, seed: u64, matching: bool, pick: u32, lvl: bool) {
        check(Engine::AiCore, TableLayout::GearMajor, gears, n, seed, matching, pick, lvl)?;
    }

    #[test]
    fn aicore_dim_major8(gears in 2u32..=100, n in 1u32..=8, seed: u64, matching: bool, pick: u32, lvl: bool) {
        check(Engine::AiCore, TableLayout::DimMajor8, gears, n, seed, matching, pick, lvl)?;
    }

    #[test]
    fn aicpu_gear_major(gears in 2u32..=100, n in 1u32..=8, seed: u64, matching: bool, pick: u32, lvl: bool) {
        check(Engine::AiCpu, TableLayout::GearMajor, gears, n, seed, matching, pick, lvl)?;
    }

    #[test]
    fn aicpu_dim_major8(gears in 2u32..=100, n in 1u32..=8, seed: u64, matching: bool, pick: u32, lvl: bool) {
        check(Engine::AiCpu, TableLayout::DimMajor8, gears, n, seed, matching, pick, lvl)?;
    }

    #[test]
    fn aicore_sorted_binary(gears in 2u32..=100, n in 1u32..=8, seed: u64, matching: bool, pick: u32, lvl: bool) {
        check(Engine::AiCore, TableLayout::SortedBinary, gears, n, seed, matching, pick, lvl)?;
    }

    #[test]
    fn aicpu_sorted_binary(gears in 2u32..=100, n in 1u32..=8, seed: u64, matching: bool, pick: u32, lvl: bool) {
        check(Engine::AiCpu, TableLayout::SortedBinary, gears, n, seed, matching, pick, lvl)?;
    }

    /// An all-zero query against random gear sets, with or without an all-zero gear somewhere:
    /// every layout and engine returns that gear or -1, never a padding column (dim-major pads
    /// with zero columns up to a multiple of 8 gears, so G = 8k+1 leaves seven of them).
    #[test]
    fn zero_query_matches_only_a_zero_gear(gears in 2u32..=100, n in 1u32..=6, seed: u64, zero_at in proptest::option::of(0u32..100)) {
        let (mut table, _) = case(gears, n, seed, true, 0);
        let nn = n as usize;
        // Random rows may be all zero by chance; make them non-zero first, then plant one.
        for row in table.chunks_exact_mut(nn) {
            if row.iter().all(|v| *v == 0) {
                row[0] = 1;
            }
        }
        let zero = zero_at.map(|z| (z % gears) as usize);
        if let Some(z) = zero {
            table[z * nn..(z + 1) * nn].fill(0);
        }
        // Keep the gears unique (GE's E10039) after the edits.
        for k in 0..gears as usize {
            if Some(k) != zero && table[k * nn..(k + 1) * nn].iter().all(|v| *v == 0) {
                table[k * nn] = 2000 + k as i32;
            }
        }
        let want = zero.map_or(-1, |z| z as i32);
        let x = vec![0; nn];
        for layout in TableLayout::ALL {
            for engine in [Engine::AiCore, Engine::AiCpu] {
                let mut dev = device("ascend910", NullSink);
                let (got, _) = run_map_index(&mut dev, engine, layout, &x, &table, gears, None);
                prop_assert_eq!(got, want, "{:?} {:?} gears {} n {}", engine, layout, gears, n);
            }
        }
    }
}

/// Repeated gears (GE rejects them with E10039, but MapIndex's contract is still "the lowest
/// index"): every layout and engine returns the first of the copies.
#[test]
fn repeated_gears_return_the_lowest_index() {
    let n = 3;
    // Gears 1, 4 and 6 are the same vector; 0 and 7 are all zero.
    let rows: [[i32; 3]; 9] = [
        [0, 0, 0],
        [5, -1, 2],
        [9, 9, 9],
        [-4, 2, 2],
        [5, -1, 2],
        [1, 1, 1],
        [5, -1, 2],
        [0, 0, 0],
        [5, -1, 3],
    ];
    let table: Vec<i32> = rows.concat();
    for (x, want) in [
        ([5, -1, 2], 1),
        ([0, 0, 0], 0),
        ([5, -1, 3], 8),
        ([5, 0, 2], -1),
    ] {
        for layout in TableLayout::ALL {
            let laid = map_index::layout_table(&table, n, rows.len() as u32, layout);
            assert_eq!(
                map_index::reference(&x, &laid, rows.len() as u32, layout, None),
                want,
                "reference {layout:?} {x:?}"
            );
            for engine in [Engine::AiCore, Engine::AiCpu] {
                let mut dev = device("ascend910", NullSink);
                let (got, _) = run_map_index(
                    &mut dev,
                    engine,
                    layout,
                    &x,
                    &table,
                    rows.len() as u32,
                    None,
                );
                assert_eq!(got, want, "{engine:?} {layout:?} {x:?}");
            }
        }
    }
}

/// A sorted table larger than UB (a chip whose limits exceed the 910's) is searched with one
/// DMA per probed row instead of being brought in whole, with the same answers.
#[test]
fn sorted_table_larger_than_ub_streams_its_rows() {
    let (gears, n) = (256, 300);
    let shape = map_index::MapIndexShape {
        n,
        gears,
        layout: TableLayout::SortedBinary,
        level_index: false,
    };
    assert!(!map_index::sorted_table_fits_ub(
        &shape,
        map_index::ub_budget(256 * 1024)
    ));
    let (table, _) = case(gears, n, 7, true, 0);
    for pick in [0, 1, 77, 128, 255] {
        let x = table[pick * n as usize..(pick + 1) * n as usize].to_vec();
        let mut dev = device("ascend910", NullSink);
        let (got, _) = run_map_index(
            &mut dev,
            Engine::AiCore,
            TableLayout::SortedBinary,
            &x,
            &table,
            gears,
            None,
        );
        assert_eq!(got, pick as i32);
    }
}

/// The binary search probes `log2(G)` rows where the scans look at every gear: at 100 gears
/// with the last gear queried, the sorted layout's AI core kernel takes less device time than
/// GE's gear-major scan, and its AI CPU kernel compares far fewer values.
#[test]
fn sorted_binary_scans_less_than_gear_major_at_many_gears() {
    let (gears, n) = (100, 8);
    let (table, _) = case(gears, n, 3, true, 0);
    let x = table[(gears as usize - 1) * n as usize..].to_vec();
    let time = |layout| {
        let mut dev = device("ascend910", NullSink);
        let (got, t) = run_map_index(&mut dev, Engine::AiCore, layout, &x, &table, gears, None);
        assert_eq!(got, gears as i32 - 1);
        t
    };
    let (gm, sorted) = (
        time(TableLayout::GearMajor),
        time(TableLayout::SortedBinary),
    );
    assert!(sorted < gm, "sorted {sorted:?} vs gear-major {gm:?}");
    let work = |layout| {
        let laid = map_index::layout_table(&table, n, gears, layout);
        map_index::run_aicpu(&x, &laid, gears, layout, None).unwrap()
    };
    let (gm, sorted) = (
        work(TableLayout::GearMajor),
        work(TableLayout::SortedBinary),
    );
    assert_eq!((gm.result, sorted.result), (99, 99));
    assert!(sorted.compares * 5 < gm.compares, "{sorted:?} vs {gm:?}");
    assert!(sorted.bytes_read < gm.bytes_read, "{sorted:?} vs {gm:?}");
}

/// The limits of both ends: the largest gear count and a long query (chunked in UB), on the AI
/// core; and the last gear matching.
#[test]
fn large_tables_are_chunked_and_still_exact() {
    for (gears, n, layout) in [
        (100, 400, TableLayout::GearMajor),
        (100, 400, TableLayout::DimMajor8),
        (100, 65, TableLayout::GearMajor),
    ] {
        let (table, _) = case(gears, n, 99, true, 0);
        let x = table[(gears as usize - 1) * n as usize..].to_vec();
        let mut dev = device("ascend910", NullSink);
        let (got, _) = run_map_index(&mut dev, Engine::AiCore, layout, &x, &table, gears, None);
        assert_eq!(got, gears as i32 - 1, "gears {gears} n {n} {layout:?}");
    }
}

/// A zero-valued query never matches a padding column of the dim-major table (the fixed case
/// of the proptest above).
#[test]
fn zero_query_never_matches_padding() {
    let gears = 5; // padded to 8: columns 5..8 are zeros
    let table: Vec<i32> = (0..gears * 3).map(|v| v as i32 + 1).collect();
    for engine in [Engine::AiCore, Engine::AiCpu] {
        let mut dev = device("ascend910", NullSink);
        let (got, _) = run_map_index(
            &mut dev,
            engine,
            TableLayout::DimMajor8,
            &[0, 0, 0],
            &table,
            gears,
            None,
        );
        assert_eq!(got, -1, "{engine:?}");
    }
    // And a genuine all-zero gear is found at its own index.
    let mut table = table;
    table[6..9].fill(0);
    let mut dev = device("ascend910", NullSink);
    let (got, _) = run_map_index(
        &mut dev,
        Engine::AiCore,
        TableLayout::DimMajor8,
        &[0, 0, 0],
        &table,
        gears,
        None,
    );
    assert_eq!(got, 2);
}

/// The limits of gear spec §6.1 are enforced with clear errors.
#[test]
fn limits_are_enforced() {
    let shape = map_index::MapIndexShape {
        n: 401,
        gears: 4,
        layout: TableLayout::GearMajor,
        level_index: false,
    };
    assert!(
        shape
            .check(100, 400)
            .unwrap_err()
            .contains("len(x) = 401 is outside [1, 400]")
    );
    let shape = map_index::MapIndexShape {
        n: 4,
        gears: 101,
        layout: TableLayout::GearMajor,
        level_index: false,
    };
    assert!(
        shape
            .check(100, 400)
            .unwrap_err()
            .contains("101 gears is outside [1, 100]")
    );
    // Through the AI CPU kernel: a KernelParam error naming the task.
    let mut dev = device("ascend910", NullSink);
    let table = vec![0; 101 * 2];
    let shape = map_index::MapIndexShape {
        n: 2,
        gears: 101,
        layout: TableLayout::GearMajor,
        level_index: false,
    };
    let b = map_index_buffers(&mut dev, &shape, &[1, 2], &table, None);
    let task = map_index_task(&mut dev, Engine::AiCpu, &shape, &b);
    let s = dev.create_stream().unwrap();
    dev.submit(s, task, None).unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert!(
        e.contains("stream 0 task 0: MapIndex:") && e.contains("101 gears is outside [1, 100]"),
        "{e}"
    );
}
