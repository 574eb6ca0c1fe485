//! The L2 cache in front of HBM: re-reading a buffer that fits is served at the cores' or the
//! L2's rate, a working set that does not fit streams at the HBM rate, and turning the L2 off,
//! the timing-only mode and repeating a run change nothing they should not.
//!
//! Every pass runs `dma_stream` on all cores of the chip at once (no dispatch stagger) and
//! measures the rate over the longest MTE2 busy time of a core: the cores stream back to back,
//! so that is the chip's read rate without the kernel's prologue and final latency.

use std::io::Cursor;

use gearsim_sim::{BlockLaunch, Chip, ChipConfig, CoreKind, CrossGroup, ExecMode, Kernel, Tick};
use gearsim_tests::*;
use gearsim_traces::{NullSink, Record, TraceFile, TraceSink, TraceWriter};

const ARGS: u64 = 0x1000;
const SRC: u64 = 1 << 30;
/// MTE2's index in the per-pipe statistics ([`gearsim_isa::Pipe::EXECUTING`] order).
const MTE2: usize = 4;
const MIB: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Pass {
    /// Bytes per cycle over the longest MTE2 busy time of a core.
    rate: f64,
    /// Bytes the L2 served during the pass.
    hits: u64,
    /// Cycles from the start of the pass to its last block's end.
    cycles: u64,
}

struct Rig<S: TraceSink> {
    chip: Chip<S>,
    kernel: usize,
}

fn rig<S: TraceSink>(cfg: ChipConfig, sink: S) -> Rig<S> {
    let mut chip = Chip::new(cfg, sink);
    let kernel = chip
        .load_kernel(Kernel::new(example_kernel("dma_stream")))
        .unwrap();
    Rig { chip, kernel }
}

fn ascend910() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

impl<S: TraceSink> Rig<S> {
    /// Streams `bytes` from `SRC` on every core.
    fn pass(&mut self, bytes: u64, mode: ExecMode) -> Pass {
        let chip = &mut self.chip;
        let n = chip.core_count();
        let busy = |chip: &Chip<S>, c: u32| chip.core_stats(c).unwrap().pipes[MTE2].busy_cycles;
        let busy_before: Vec<u64> = (0..n).map(|c| busy(chip, c)).collect();
        let hits_before = chip.l2_traffic().0;
        let at = start_on_every_core(chip, self.kernel, [SRC, bytes], mode);
        let done = chip.run_to_idle().unwrap();
        assert_eq!(done.len(), n as usize);
        let longest = (0..n)
            .map(|c| busy(chip, c) - busy_before[c as usize])
            .max()
            .unwrap();
        let end = done.iter().map(|d| d.1).max().unwrap();
        let (hits, misses) = chip.l2_traffic();
        assert_eq!(hits + misses, chip.memory_traffic().0);
        Pass {
            rate: bytes as f64 / longest as f64,
            hits: hits - hits_before,
            cycles: (end.0 - at.0) / 1000, // ascend910 runs at 1 GHz: 1000 ps per cycle
        }
    }
}

/// Starts `kernel` with arguments `args` on every core at once, when all are free; returns
/// when.
fn start_on_every_core<S: TraceSink>(
    chip: &mut Chip<S>,
    kernel: usize,
    args: [u64; 2],
    mode: ExecMode,
) -> Tick {
    let n = chip.core_count();
    let bytes: Vec<u8> = args.iter().flat_map(|v| v.to_le_bytes()).collect();
    chip.write_mem(ARGS, &bytes).unwrap();
    let at = (0..n)
        .map(|c| chip.core_free_at(c).unwrap())
        .fold(chip.now(), Tick::max);
    for core in 0..n {
        let launch = BlockLaunch {
            kernel,
            block_idx: core,
            block_dim: n,
            sub_block: 0,
            group: CrossGroup::solo(0, CoreKind::Coupled, n),
            args: ARGS,
            mode,
        };
        chip.start_block(core, launch, at).unwrap();
    }
    at
}

fn near(got: f64, want: f64, tolerance: f64) -> bool {
    (got - want).abs() / want < tolerance
}

/// Bytes per cycle at 1 GHz.
fn per_cycle(bytes_per_second: u64) -> f64 {
    bytes_per_second as f64 / 1e9
}

#[test]
fn a_buffer_smaller_than_l2_is_read_at_the_cores_rate_the_second_time() {
    let cfg = ascend910();
    let hbm = per_cycle(cfg.memory.hbm_bytes_per_second);
    // A hit moves at the cores' L2 read rate (a miss at their device-memory rate).
    let cores = 32.0 * cfg.mte.l2_read_bytes_per_cycle as f64;
    // The premise: the cores could pull more than HBM gives, and L2 gives more than they pull.
    assert!(cores > 1.5 * hbm && cores < per_cycle(cfg.memory.l2_bytes_per_second));
    let mut r = rig(cfg, NullSink);
    let cold = r.pass(16 * MIB, ExecMode::TimingOnly);
    let warm = r.pass(16 * MIB, ExecMode::TimingOnly);
    assert_eq!(cold.hits, 0);
    assert!(
        near(cold.rate, hbm, 0.01),
        "cold pass {:.1} B/cycle",
        cold.rate
    );
    assert_eq!(warm.hits, 16 * MIB);
    assert!(
        near(warm.rate, cores, 0.01),
        "warm pass {:.1} B/cycle",
        warm.rate
    );
    assert!(warm.cycles < cold.cycles * 2 / 3, "{warm:?} vs {cold:?}");
}

#[test]
fn hits_are_capped_by_the_l2_bandwidth() {
    let mut cfg = ascend910();
    cfg.mte.gm_read_bytes_per_cycle = 1024;
    cfg.mte.l2_read_bytes_per_cycle = 1024;
    let l2 = per_cycle(cfg.memory.l2_bytes_per_second);
    assert!(32.0 * 1024.0 > 2.0 * l2);
    let mut r = rig(cfg.clone(), NullSink);
    let cold = r.pass(16 * MIB, ExecMode::TimingOnly);
    let warm = r.pass(16 * MIB, ExecMode::TimingOnly);
    let hbm = per_cycle(cfg.memory.hbm_bytes_per_second);
    assert!(
        near(cold.rate, hbm, 0.01),
        "cold pass {:.1} B/cycle",
        cold.rate
    );
    assert!(
        near(warm.rate, l2, 0.01),
        "warm pass {:.1} B/cycle",
        warm.rate
    );
}

#[test]
fn a_working_set_larger_than_l2_streams_at_the_hbm_rate() {
    let cfg = ascend910();
    let hbm = per_cycle(cfg.memory.hbm_bytes_per_second);
    assert!(64 * MIB >= 2 * cfg.memory.l2_bytes);
    let mut r = rig(cfg, NullSink);
    let first = r.pass(64 * MIB, ExecMode::TimingOnly);
    let second = r.pass(64 * MIB, ExecMode::TimingOnly);
    // Each line is gone before it is read again: no false hits.
    assert_eq!(first.hits, 0);
    assert!(second.hits < 64 * MIB / 100, "{} hit bytes", second.hits);
    assert!(
        near(second.rate, hbm, 0.01),
        "second pass {:.1} B/cycle",
        second.rate
    );
}

#[test]
fn without_l2_a_second_pass_is_no_faster_and_a_cold_pass_costs_the_same() {
    let mut off = ascend910();
    off.memory.l2_bytes = 0;
    let mut r = rig(off, NullSink);
    let first = r.pass(16 * MIB, ExecMode::TimingOnly);
    let second = r.pass(16 * MIB, ExecMode::TimingOnly);
    assert_eq!((first.hits, second.hits), (0, 0));
    assert_eq!(first, second);
    // Misses cost exactly what every byte cost without the L2.
    let cold = rig(ascend910(), NullSink).pass(16 * MIB, ExecMode::TimingOnly);
    assert_eq!(cold, first);
}

/// Two passes over 16 MiB, traced; returns the trace bytes and the passes.
fn traced(cfg: ChipConfig, mode: ExecMode) -> (Vec<u8>, [Pass; 2]) {
    let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let mut r = rig(cfg, sink);
    let passes = [r.pass(16 * MIB, mode), r.pass(16 * MIB, mode)];
    (r.chip.into_sink().finish().unwrap().into_inner(), passes)
}

/// Largest value of the counter named `name` in a trace, if it has one.
fn counter_max(trace: &TraceFile, name: &str) -> Option<i64> {
    trace
        .records()
        .filter_map(|r| match r {
            Record::Counter { name: n, value, .. } if trace.string(n) == name => Some(value),
            _ => None,
        })
        .max()
}

#[test]
fn runs_with_hits_are_deterministic_and_timing_only_matches_full() {
    let (a, passes_a) = traced(ascend910(), ExecMode::Full);
    let (b, passes_b) = traced(ascend910(), ExecMode::Full);
    assert!(a == b, "two identical runs produced different traces");
    assert_eq!(passes_a, passes_b);
    assert_eq!(passes_a[1].hits, 16 * MIB);
    let (t, passes_t) = traced(ascend910(), ExecMode::TimingOnly);
    assert_eq!(passes_t, passes_a);
    let (full, timing) = (
        TraceFile::from_bytes(a).unwrap(),
        TraceFile::from_bytes(t).unwrap(),
    );
    assert_eq!(full.record_count(), timing.record_count());
    for (i, (x, y)) in full.records().zip(timing.records()).enumerate() {
        assert_eq!(x, y, "record {i} differs");
    }
}

#[test]
fn the_trace_shows_l2_hits_only_on_a_chip_with_an_l2() {
    let (on, _) = traced(ascend910(), ExecMode::TimingOnly);
    let on = TraceFile::from_bytes(on).unwrap();
    // The warm pass reads at 32 x 128 B/cycle = 4096 MB/ms = 4.096e6 MB/s from L2.
    let hits = counter_max(&on, "L2 read hit MB/s").unwrap();
    assert!(near(hits as f64, 4.096e6, 0.01), "{hits} MB/s");
    let hbm = counter_max(&on, "HBM read MB/s").unwrap();
    assert!(near(hbm as f64, 1.2e6, 0.01), "{hbm} MB/s");
    let mut cfg = ascend910();
    cfg.memory.l2_bytes = 0;
    let (off, _) = traced(cfg, ExecMode::TimingOnly);
    let off = TraceFile::from_bytes(off).unwrap();
    assert_eq!(counter_max(&off, "L2 read hit MB/s"), None);
    assert!(counter_max(&off, "HBM read MB/s").is_some());
}

/// The cube loop's 32 blocks all read the same A and B tiles: through the device, with the
/// preset's L2, all but the first reader of each line hit, and the timing-only launch still
/// has the full launch's timeline.
#[test]
fn shared_tiles_hit_through_the_device_in_both_modes() {
    let launch = |mode: ExecMode| {
        let mut dev = device("ascend910", NullSink);
        let a = upload(&mut dev, &f16_bytes(&Rng::new(2).f16s(32768, -1.0, 1.0)));
        let b = upload(&mut dev, &f16_bytes(&Rng::new(3).f16s(32768, -1.0, 1.0)));
        let c = dev.alloc(32 * 32768).unwrap();
        let k = dev.load_kernel(example_kernel("mmad_loop")).unwrap();
        let r = dev.launch(k, 32, &[a.0, b.0, c.0, 4], mode).unwrap();
        (
            r.end.0 - r.first_start.0,
            r.core_stats,
            dev.chip().l2_traffic(),
        )
    };
    let full = launch(ExecMode::Full);
    assert_eq!(full, launch(ExecMode::TimingOnly));
    let (hits, misses) = full.2;
    // 32 blocks x 128 KiB of A and B; only the first block's reads come from HBM.
    assert_eq!(hits + misses, 32 * 128 * 1024);
    assert_eq!(misses, 128 * 1024);
}

/// Writes `bytes` from UB to `DST` on every core in 64 KiB DMAs (a block per core, each its
/// share); returns the cycles the pass took and the bytes the L2 wrote back during it.
fn write_pass(chip: &mut Chip<NullSink>, kernel: usize, bytes: u64) -> (u64, u64) {
    const DST: u64 = 1 << 31;
    let before = chip.l2_written_back();
    let at = start_on_every_core(chip, kernel, [DST, bytes], ExecMode::TimingOnly);
    let done = chip.run_to_idle().unwrap();
    let end = done.iter().map(|d| d.1).max().unwrap();
    ((end.0 - at.0) / 1000, chip.l2_written_back() - before)
}

/// A write-back L2 (the presets') keeps written lines until they are evicted: a buffer that
/// fits is written at the cores' rate and never written back, one three times the L2's size
/// writes back what it pushes out; written through, every byte goes to HBM as it is written.
#[test]
fn a_write_back_l2_writes_to_hbm_only_what_it_evicts() {
    let text = "sreg x1, args\n ld.gm.u64 x2, x1\n ld.gm.u64 x3, x1, off=8\n sreg x4, block_idx\n\
                sreg x5, block_num\n divu x6, x3, x5\n mul x7, x6, x4\n add x2, x2, x7\n\
                movi x8, 65536\n divu x9, x6, x8\n movi x11, 0\n\
                top:\n copy_ub_to_gm x2, x11, 1, 2048\n addi x2, x2, 65536\n loop x9, top\n end\n";
    let program = gearsim_isa::assemble(text, "write_stream.s").unwrap();
    let run = |write_back: bool, bytes: u64| {
        let mut cfg = ascend910();
        cfg.memory.l2_write_back = write_back;
        let mut chip = Chip::new(cfg, NullSink);
        let k = chip.load_kernel(Kernel::new(program.clone())).unwrap();
        write_pass(&mut chip, k, bytes)
    };
    let cfg = ascend910();
    let l2 = cfg.memory.l2_bytes;
    let (wb_small, wb_small_out) = run(true, 8 * MIB);
    let (wt_small, wt_small_out) = run(false, 8 * MIB);
    assert_eq!((wb_small_out, wt_small_out), (0, 0));
    assert!(
        (wb_small as f64) < 0.8 * wt_small as f64,
        "write-back {wb_small} cycles, write-through {wt_small}"
    );
    let big = 3 * l2;
    let (_, wb_big_out) = run(true, big);
    assert!(
        wb_big_out >= big - l2 - l2 / 8 && wb_big_out <= big - l2 / 2,
        "{wb_big_out} bytes written back of {big}"
    );
    assert_eq!(run(false, big).1, 0);
}
