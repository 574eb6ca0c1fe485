//! Emergent behaviour: rates and utilisations measured from the simulation, not asserted by
//! construction. Each figure comes from timestamps the simulator produced while running a
//! kernel; the configuration only sets the underlying per-instruction costs and caps.

use gearsim_firmware::{Device, LaunchReport};
use gearsim_sim::{ChipConfig, ExecMode, StopReason};
use gearsim_tests::*;
use gearsim_traces::NullSink;

fn kernel_cycles(r: &LaunchReport) -> f64 {
    (r.end.0 - r.first_start.0) as f64 / 1000.0 // ascend910 runs at 1 GHz: 1000 ps per cycle
}

fn stream(blocks: u32, bytes_per_block: u64) -> (f64, LaunchReport) {
    let mut dev = device("ascend910", NullSink);
    let total = bytes_per_block * u64::from(blocks);
    let src = dev.alloc(total).unwrap();
    let k = dev.load_kernel(example_kernel("dma_stream")).unwrap();
    let r = dev
        .launch(k, blocks, &[src.0, total], ExecMode::TimingOnly)
        .unwrap();
    (total as f64 / kernel_cycles(&r), r)
}

#[test]
fn one_core_streaming_reaches_its_mte2_rate() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let (rate, _) = stream(1, 16 << 20);
    let want = cfg.mte.gm_read_bytes_per_cycle as f64;
    assert!(
        (rate - want).abs() / want < 0.02,
        "one core streams {rate:.2} B/cycle, MTE2 cap {want}"
    );
}

#[test]
fn all_cores_streaming_saturate_the_chip_cap() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let (rate, r) = stream(32, 8 << 20);
    assert_eq!(r.cores_used, 32);
    let cap = cfg.memory.hbm_bytes_per_second as f64 / 1e9; // bytes per cycle at 1 GHz
    assert!(
        (rate - cap).abs() / cap < 0.02,
        "32 cores stream {rate:.1} B/cycle, chip cap {cap}"
    );
    // And the cap really binds: the cores' own MTE2 caps add up to far more.
    assert!(32.0 * cfg.mte.gm_read_bytes_per_cycle as f64 > 1.5 * cap);
}

#[test]
fn mmad_loop_reaches_95_percent_of_cube_peak() {
    let mut dev = device("ascend910", NullSink);
    let a = dev.alloc(65536).unwrap();
    let b = dev.alloc(65536).unwrap();
    let c = dev.alloc(32768).unwrap();
    let k = dev.load_kernel(example_kernel("mmad_loop")).unwrap();
    let r = dev
        .launch(k, 1, &[a.0, b.0, c.0, 256], ExecMode::TimingOnly)
        .unwrap();
    let peak = dev.chip().config().cube_macs_per_cycle() as f64;
    let eff = r.cube_macs() as f64 / (kernel_cycles(&r) * peak);
    assert!(eff >= 0.95, "cube efficiency {eff:.4}");
}

/// V-pipe share of the kernel's duration on core 0.
fn vector_busy(dev_cfg: ChipConfig, n: usize) -> (f64, f64) {
    let mut dev = Device::new(dev_cfg, NullSink);
    let (_, _, _, r) = run_vadd(&mut dev, n, 1, ExecMode::TimingOnly, 3);
    let busy = r.busy_cycles();
    let cycles = kernel_cycles(&r) * dev.chip().config().core.clock_mhz as f64 / 1000.0;
    (busy[1] as f64 / cycles, busy[4] as f64 / cycles)
}

/// With data movement able to keep up, double buffering keeps the vector pipe busy: loads of
/// tile i+1 and stores of tile i-1 overlap the add of tile i.
#[test]
fn double_buffered_add_keeps_v_busy_when_memory_keeps_up() {
    let mut cfg = ChipConfig::preset("ascend910").unwrap();
    cfg.mte.gm_read_bytes_per_cycle = 4096;
    cfg.mte.gm_write_bytes_per_cycle = 4096;
    cfg.memory.hbm_bytes_per_second = 64_000_000_000_000;
    cfg.memory.read_latency_cycles = 8;
    cfg.memory.write_latency_cycles = 8;
    let (v, _) = vector_busy(cfg, 1 << 22);
    assert!(v >= 0.90, "V busy {v:.3}");
}

/// On the real ascend910 numbers the add is bound by HBM, not by the vector unit: MTE2 is the
/// busy pipe and V idles most of the time (a fp16 add needs 768 B of traffic per 128-element
/// repeat, the core's MTE2 moves 67 B per cycle).
#[test]
fn double_buffered_add_is_memory_bound_on_ascend910() {
    let (v, mte2) = vector_busy(ChipConfig::preset("ascend910").unwrap(), 1 << 22);
    assert!(mte2 > 0.7, "MTE2 busy {mte2:.3}");
    assert!(v < 0.15, "V busy {v:.3}");
}

#[test]
fn waiting_on_a_flag_nobody_sets_is_a_deadlock_naming_core_pipe_and_flag() {
    let mut dev = device("ascend910", NullSink);
    let prog = gearsim_isa::assemble(
        "movi x1, 0\n wait_flag MTE2, V, 1\n vadd.f16 x1, x1, x1\n end\n",
        "deadlock.s",
    )
    .unwrap();
    let k = dev.load_kernel(prog).unwrap();
    let err = dev.launch(k, 2, &[], ExecMode::Full).unwrap_err();
    let gearsim_firmware::DeviceError::Fault(StopReason::Deadlock { blocked, .. }) = &err else {
        panic!("expected a deadlock, got {err}");
    };
    let v: Vec<_> = blocked
        .iter()
        .filter(|b| b.pipe == gearsim_isa::Pipe::V)
        .collect();
    assert_eq!(v.len(), 2, "{err}");
    assert_eq!(
        (v[0].core, v[0].pc, v[0].waits_for.as_str()),
        (0, 1, "flag MTE2->V id 1")
    );
    assert_eq!(v[1].core, 1);
    let text = err.to_string();
    assert!(
        text.contains("deadlock") && text.contains("core 0 V pc 1 waits for flag MTE2->V id 1"),
        "{text}"
    );
}
