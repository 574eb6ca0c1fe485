//! Determinism: the same kernel, inputs and configuration give byte-identical traces, and the
//! timing-only mode produces exactly the full mode's timeline.

use std::io::Cursor;

use gearsim_sim::ExecMode;
use gearsim_tests::*;
use gearsim_traces::{TraceFile, TraceWriter};

fn traced_vadd(mode: ExecMode) -> Vec<u8> {
    let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let mut dev = device("ascend910", sink);
    run_vadd(&mut dev, 1 << 21, 8, mode, 5);
    dev.into_sink().finish().unwrap().into_inner()
}

#[test]
fn two_runs_write_byte_identical_traces() {
    let a = traced_vadd(ExecMode::Full);
    let b = traced_vadd(ExecMode::Full);
    assert!(a.len() > 10_000);
    assert!(a == b, "two identical runs produced different traces");
}

#[test]
fn timing_only_has_the_full_mode_timeline() {
    let full = TraceFile::from_bytes(traced_vadd(ExecMode::Full)).unwrap();
    let timing = TraceFile::from_bytes(traced_vadd(ExecMode::TimingOnly)).unwrap();
    assert_eq!(full.record_count(), timing.record_count());
    assert!(full.record_count() > 1000);
    for (i, (a, b)) in full.records().zip(timing.records()).enumerate() {
        assert_eq!(a, b, "record {i} differs");
    }
    assert_eq!(full.lanes(), timing.lanes());
}

/// Every block writes its number to one shared slot and to its own, then reads its neighbour's
/// slot (written or not yet, as the timeline has it) and stores that plus 1000: the values
/// depend on the order of the cores' device-memory accesses within one kernel. Last it reads
/// its own slot back and stores that plus 2000 (a core reading what it wrote itself).
const RACE: &str = "
.kernel race
    sreg      x1, args
    ld.gm.u64 x2, x1              # shared slot
    ld.gm.u64 x3, x1, off=8       # own slots, 32 bytes each
    ld.gm.u64 x4, x1, off=16      # results, 32 bytes each
    ld.gm.u64 x5, x1, off=24      # own slots read back, plus 2000, 32 bytes each
    sreg      x6, block_idx
    sreg      x7, block_num
    addi      x8, x6, 1
    movi      x20, 0
    vdup.i32  x20, x8
    set_flag  V, MTE3, 0
    wait_flag V, MTE3, 0
    copy_ub_to_gm x2, x20, 1, 1
    shli      x9, x6, 5
    add       x10, x3, x9
    copy_ub_to_gm x10, x20, 1, 1
    remu      x11, x8, x7
    shli      x11, x11, 5
    add       x11, x3, x11
    movi      x21, 256
    copy_gm_to_ub x21, x11, 1, 1
    set_flag  MTE2, V, 0
    wait_flag MTE2, V, 0
    movi      x12, 1000
    vadds.i32 x21, x21, x12
    set_flag  V, MTE3, 1
    wait_flag V, MTE3, 1
    add       x13, x4, x9
    copy_ub_to_gm x13, x21, 1, 1
    set_flag  MTE3, MTE2, 0
    wait_flag MTE3, MTE2, 0
    movi      x22, 512
    copy_gm_to_ub x22, x10, 1, 1
    set_flag  MTE2, V, 1
    wait_flag MTE2, V, 1
    movi      x14, 2000
    vadds.i32 x22, x22, x14
    set_flag  V, MTE3, 2
    wait_flag V, MTE3, 2
    add       x15, x5, x9
    copy_ub_to_gm x15, x22, 1, 1
    end
";

/// Runs the race kernel twice on 32 blocks with values computed on `threads` host threads;
/// returns the memory it wrote (the shared slot, the own slots, the first and the second
/// launch's results and read-backs) and the trace.
fn race(threads: usize) -> (Vec<u8>, Vec<u8>) {
    let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let mut dev = device("ascend910", sink);
    dev.set_host_threads(threads);
    let program = gearsim_isa::assemble(RACE, "race.s").unwrap_or_else(|e| panic!("{e}"));
    let k = dev.load_kernel(program).unwrap_or_else(|e| panic!("{e}"));
    let shared = upload(&mut dev, &[0u8; 32]);
    let own = upload(&mut dev, &[0u8; 32 * 32]);
    let outs = [0; 2].map(|_| [0; 2].map(|_| upload(&mut dev, &[0u8; 32 * 32])));
    for [out, back] in outs {
        dev.launch(k, 32, &[shared.0, own.0, out.0, back.0], ExecMode::Full)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let mut memory = download(&mut dev, shared, 32);
    memory.extend(download(&mut dev, own, 32 * 32));
    for out in outs.iter().flatten() {
        memory.extend(download(&mut dev, *out, 32 * 32));
    }
    (memory, dev.into_sink().finish().unwrap().into_inner())
}

#[test]
fn values_and_traces_do_not_depend_on_the_host_thread_count() {
    let (memory, trace) = race(1);
    let word = |at: usize| i32::from_le_bytes(memory[at..at + 4].try_into().unwrap());
    // The shared slot holds some block's number. In the first launch a block finds its
    // neighbour's slot written or not, as the timeline has it (both happen); the second finds
    // every slot written by the first.
    assert!((1..=32).contains(&word(0)), "shared slot {}", word(0));
    let mut found = [0; 2];
    for b in 0..32 {
        let neighbour = ((b + 1) % 32) as i32 + 1;
        assert_eq!(word(32 + 32 * b), b as i32 + 1, "own slot {b}");
        let first = word(32 + 32 * 32 + 32 * b);
        for back in [32 + 64 * 32 + 32 * b, 32 + 128 * 32 + 32 * b] {
            assert_eq!(word(back), 2000 + b as i32 + 1, "read-back {b}");
        }
        assert!(
            first == 1000 || first == 1000 + neighbour,
            "first result {b}: {first}"
        );
        found[usize::from(first != 1000)] += 1;
        assert_eq!(word(32 + 96 * 32 + 32 * b), 1000 + neighbour, "result {b}");
    }
    assert!(
        found[0] > 0 && found[1] > 0,
        "no race in the first launch: {found:?}"
    );
    for threads in [2, 3, 8] {
        let (m, t) = race(threads);
        assert!(m == memory, "{threads} threads: other values");
        assert!(t == trace, "{threads} threads: another trace");
    }
}
