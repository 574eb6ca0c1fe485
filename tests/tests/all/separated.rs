//! The separated architecture (Ascend 910B, Atlas A2): cube cores and vector cores that run
//! their own programs, kernels placed on the cores of their kind, MIX kernels on whole AI
//! cores, cross-core flags with their three modes, and the faults a wrong kernel gets.

use std::io::Cursor;

use gearsim_firmware::{Device, DeviceError};
use gearsim_isa::Program;
use gearsim_isa::task::KernelKind;
use gearsim_sim::{ChipConfig, ExecMode, StopReason};
use gearsim_tests::*;
use gearsim_traces::{NullSink, Record, TraceFile, TraceSink, TraceWriter};

fn asm(src: &str) -> Program {
    gearsim_isa::assemble(src, "separated.s").unwrap_or_else(|e| panic!("{e}\n{src}"))
}

fn b2<S: TraceSink>(sink: S) -> Device<S> {
    device("ascend910b2", sink)
}

fn fault_of(r: Result<gearsim_firmware::LaunchReport, DeviceError>) -> StopReason {
    match r {
        Err(DeviceError::Fault(s)) => s,
        other => panic!("expected a fault, got {other:?}"),
    }
}

/// Each of the 48 vector blocks stores its index, meets the others at a `cross_set.all`
/// barrier, then sums every block's value: 0 + 1 + ... + 47 = 1128 only if no block reads
/// before the last one has written.
const BARRIER_SUM: &str = "
    sreg x1, args
    ld.gm.u64 x2, x1
    ld.gm.u64 x3, x1, off=8
    sreg x4, block_idx
    sreg x5, block_num
    shli x6, x4, 3
    add x7, x2, x6
    st.gm.u64 x4, x7
    cross_set.all S, 2
    cross_wait S, 2
    movi x8, 0
    mov x9, x5
    mov x10, x2
sum:
    ld.gm.u64 x11, x10
    add x8, x8, x11
    addi x10, x10, 8
    loop x9, sum
    add x12, x3, x6
    st.gm.u64 x8, x12
    end
";

#[test]
fn a_vector_kernel_runs_on_the_vector_cores_and_meets_at_a_barrier() {
    let mut dev = b2(NullSink);
    let slots = upload(&mut dev, &[0u8; 48 * 8]);
    let sums = upload(&mut dev, &[0u8; 48 * 8]);
    let k = dev.load_kernel(asm(BARRIER_SUM)).unwrap();
    let r = dev
        .launch(k, 48, &[slots.0, sums.0], ExecMode::Full)
        .unwrap();
    assert_eq!(r.cores_used, 48);
    // Only vector cores (chip ids 24..72) did any work.
    let busy: Vec<usize> = (0..r.core_stats.len())
        .filter(|&c| r.core_stats[c].pipes[0].instructions > 0)
        .collect();
    assert_eq!(busy, (24..72).collect::<Vec<_>>());
    let got: Vec<u64> = download(&mut dev, sums, 48 * 8)
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, vec![1128; 48]);
}

#[test]
fn without_the_barrier_blocks_read_before_the_others_wrote() {
    // The same kernel with its wait removed: the check above can fail.
    let mut dev = b2(NullSink);
    let slots = upload(&mut dev, &[0u8; 48 * 8]);
    let sums = upload(&mut dev, &[0u8; 48 * 8]);
    let src = BARRIER_SUM.replace("cross_wait S, 2", "nop");
    let k = dev.load_kernel(asm(&src)).unwrap();
    // Without the waits nobody consumes the barrier's arrivals: the launch's end sees none
    // left over only because one set per block makes one arrival each.
    dev.launch(k, 48, &[slots.0, sums.0], ExecMode::Full)
        .unwrap();
    let got: Vec<u64> = download(&mut dev, sums, 48 * 8)
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_ne!(got, vec![1128; 48]);
}

/// A MIX kernel's cube program: tells its vector cores (mode 2) and waits for both.
const CUBE_PING: &str = "
    cross_set.aic_aiv S, 0
    cross_wait S, 1
    end
";

/// A MIX kernel's vector program: waits for the cube core, loops a while, answers.
const VECTOR_PONG: &str = "
    cross_wait S, 0
    movi x1, 100
spin:
    loop x1, spin
    cross_set.aic_aiv S, 1
    end
";

#[test]
fn a_mix_kernel_runs_each_block_on_a_whole_ai_core_and_traces_its_flags() {
    let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
    let mut dev = b2(sink);
    let k = dev
        .load_mix_kernel(asm(CUBE_PING), asm(VECTOR_PONG), 0)
        .unwrap();
    let r = dev.launch(k, 3, &[], ExecMode::Full).unwrap();
    assert_eq!(
        r.cores_used, 9,
        "three cube cores and their six vector cores"
    );
    for c in [0, 1, 2, 24, 25, 26, 27, 28, 29] {
        assert!(r.core_stats[c].pipes[0].instructions > 0, "core {c} idle");
    }
    let trace = TraceFile::from_bytes(dev.into_sink().finish().unwrap().into_inner()).unwrap();
    let processes: std::collections::BTreeSet<&str> =
        trace.lanes().iter().map(|l| l.process.as_str()).collect();
    for p in ["aic0", "aic2", "aiv0", "aiv5"] {
        assert!(processes.contains(p), "no {p} in {processes:?}");
    }
    // An AIC has cube-side lanes and no vector lane; an AIV the opposite.
    let threads = |p: &str| -> Vec<&str> {
        trace
            .lanes()
            .iter()
            .filter(|l| l.process == p)
            .map(|l| l.thread.as_str())
            .collect()
    };
    assert_eq!(threads("aic0"), ["SCALAR", "CUBE", "MTE1", "MTE2", "FIXP"]);
    assert_eq!(threads("aiv1"), ["SCALAR", "VECTOR", "MTE2", "MTE3"]);
    // Every set reached its wait as a flow: 3 x (2 to the AIVs + 1 back to the AIC, which
    // waits for the later of its two AIVs' sets).
    let flows: Vec<(u16, u16)> = trace
        .records()
        .filter_map(|r| match r {
            Record::Flow {
                name,
                from_lane,
                to_lane,
                from_at,
                to_at,
                ..
            } if trace.string(name) == "cross-core flag" => {
                assert!(from_at <= to_at);
                Some((from_lane.0, to_lane.0))
            }
            _ => None,
        })
        .collect();
    assert_eq!(flows.len(), 9, "{flows:?}");
    let lane_process = |id: u16| trace.lanes()[usize::from(id)].process.clone();
    assert!(
        flows
            .iter()
            .any(|&(f, t)| lane_process(f) == "aic1" && lane_process(t) == "aiv3")
    );
    assert!(
        flows
            .iter()
            .any(|&(f, t)| lane_process(f).starts_with("aiv") && lane_process(t) == "aic1")
    );
}

#[test]
fn the_mix_start_up_is_paid_once_per_launch() {
    // A MIX launch of empty programs against a vector launch of the same program: the MIX one
    // starts `mix_launch_ns` later.
    let start = |mix: bool| {
        let mut dev = b2(NullSink);
        let k = if mix {
            dev.load_mix_kernel(asm("end"), asm("end"), 0).unwrap()
        } else {
            dev.load_kernel(asm("end")).unwrap()
        };
        let r = dev.launch(k, 1, &[], ExecMode::Full).unwrap();
        r.first_start.0 - r.submitted.0
    };
    let cfg = ChipConfig::preset("ascend910b2").unwrap();
    assert_eq!(
        start(true) - start(false),
        cfg.scheduler.mix_launch_ns * 1000
    );
}

#[test]
fn an_instruction_of_the_other_core_kind_is_illegal_naming_kind_core_and_pc() {
    // vadd in the cube program of a MIX kernel: the AIC (core 0) has no vector unit.
    let mut dev = b2(NullSink);
    let k = dev
        .load_mix_kernel(asm("movi x1, 0\n vadd.f16 x1, x1, x1\n end"), asm("end"), 0)
        .unwrap();
    let s = fault_of(dev.launch(k, 1, &[], ExecMode::Full));
    let text = s.to_string();
    assert!(
        matches!(s, StopReason::IllegalInstruction { core: 0, pc: 1, .. }),
        "{s}"
    );
    assert!(
        text.contains("vadd runs on the V pipe, which a cube core (AIC) does not have"),
        "{text}"
    );
    // mmad in the vector program: core 24 is aiv0.
    let mut dev = b2(NullSink);
    let k = dev
        .load_mix_kernel(
            asm("end"),
            asm("movi x1, 0\n mmad x1, x1, x1, 16, 16, 16\n end"),
            0,
        )
        .unwrap();
    let s = fault_of(dev.launch(k, 1, &[], ExecMode::Full));
    assert!(
        matches!(
            s,
            StopReason::IllegalInstruction {
                core: 24,
                pc: 1,
                ..
            }
        ),
        "{s}"
    );
    assert!(
        s.to_string()
            .contains("which a vector core (AIV) does not have"),
        "{s}"
    );
    // A UB copy on the AIC: MTE2 is there, the UB is not.
    let mut dev = b2(NullSink);
    let k = dev
        .load_kernel_flags(
            asm("movi x1, 0\n copy_gm_to_ub x1, x1, 1, 1\n end"),
            KernelKind::Cube.flags(),
        )
        .unwrap();
    let s = fault_of(dev.launch(k, 1, &[], ExecMode::Full));
    assert!(
        s.to_string()
            .contains("copy_gm_to_ub uses UB, which a cube core (AIC) does not have"),
        "{s}"
    );
}

#[test]
fn a_kernel_using_both_sides_must_be_a_mix_kernel() {
    let mut dev = b2(NullSink);
    let e = dev
        .load_kernel(asm(
            "movi x1, 0\n mmad x1, x1, x1, 16, 16, 16\n vadd.f16 x1, x1, x1\n end",
        ))
        .unwrap_err()
        .to_string();
    assert!(e.contains("split it into a MIX kernel"), "{e}");
    assert!(e.contains("pc 1: mmad") && e.contains("pc 2: vadd"), "{e}");
    // A coupled chip takes it whole, and refuses a MIX image.
    let mut dev = device("ascend910", NullSink);
    assert!(
        dev.load_kernel(asm(
            "movi x1, 0\n mmad x1, x1, x1, 16, 16, 16\n vadd.f16 x1, x1, x1\n end"
        ))
        .is_ok()
    );
    let e = dev
        .load_mix_kernel(asm("end"), asm("end"), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs a separated chip"), "{e}");
}

#[test]
fn a_cross_core_wait_nobody_satisfies_is_a_deadlock_naming_both_cores_and_the_flag() {
    let mut dev = b2(NullSink);
    let k = dev
        .load_mix_kernel(asm("end"), asm("cross_wait MTE2, 3\n end"), 0)
        .unwrap();
    let s = fault_of(dev.launch(k, 1, &[], ExecMode::Full));
    let text = s.to_string();
    assert!(matches!(s, StopReason::Deadlock { .. }), "{text}");
    assert!(
        text.contains("core 24 MTE2 pc 0 waits for cross-core flag 3"),
        "{text}"
    );
    // The cube core ended without setting it; the other vector core waits as well.
    assert!(
        text.contains(
            "(on aiv0; set by aic block 0 (not running) with cross_set.aic_aiv or aiv1 (core 25) \
             with cross_set.aiv: none did)"
        ),
        "{text}"
    );
    assert!(
        text.contains("core 25 MTE2 pc 0 waits for cross-core flag 3 (on aiv1"),
        "{text}"
    );
}

/// A MIX kernel whose cube core sets flag 4 `n` times at once while its vector cores wait for
/// it `n` times only after a long loop, so all `n` arrivals are pending together.
fn burst_of_sets(n: usize) -> Result<gearsim_firmware::LaunchReport, DeviceError> {
    let sets = "cross_set.aic_aiv S, 4\n".repeat(n);
    let waits = "cross_wait S, 4\n".repeat(n);
    let mut dev = b2(NullSink);
    let k = dev
        .load_mix_kernel(
            asm(&format!("{sets} end")),
            asm(&format!("movi x1, 1000\nl: loop x1, l\n{waits} end")),
            0,
        )
        .unwrap();
    dev.launch(k, 1, &[], ExecMode::Full)
}

#[test]
fn a_sixteenth_unconsumed_arrival_overflows_the_flag() {
    let s = fault_of(burst_of_sets(16));
    assert!(
        matches!(
            s,
            StopReason::CrossFlagOverflow {
                core: 0,
                max: 15,
                ..
            }
        ),
        "{s}"
    );
    assert!(s.to_string().contains("already held 15 arrivals"), "{s}");
    burst_of_sets(15).unwrap();
}

#[test]
fn cross_core_flags_are_illegal_on_a_coupled_chip_and_in_a_kernel_of_one_kind() {
    let mut dev = device("ascend310p", NullSink);
    let k = dev.load_kernel(asm("cross_set.all S, 0\n end")).unwrap();
    let s = fault_of(dev.launch(k, 1, &[], ExecMode::Full));
    assert!(s.to_string().contains("separated chips only"), "{s}");
    // Mode aiv pairs the vector cores of one AI core, which only a MIX kernel has.
    let mut dev = b2(NullSink);
    let k = dev.load_kernel(asm("cross_set.aiv S, 0\n end")).unwrap();
    let s = fault_of(dev.launch(k, 2, &[], ExecMode::Full));
    assert!(
        s.to_string().contains("only a MIX kernel runs together"),
        "{s}"
    );
}

#[test]
fn a_traced_mix_run_is_byte_identical_and_timing_only_keeps_its_timeline() {
    let run = |mode: ExecMode| {
        let sink = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        let mut dev = b2(sink);
        let slots = upload(&mut dev, &[0u8; 48 * 8]);
        let sums = upload(&mut dev, &[0u8; 48 * 8]);
        let k = dev
            .load_mix_kernel(asm(CUBE_PING), asm(VECTOR_PONG), 0)
            .unwrap();
        dev.launch(k, 24, &[], mode).unwrap();
        let k = dev.load_kernel(asm(BARRIER_SUM)).unwrap();
        dev.launch(k, 48, &[slots.0, sums.0], mode).unwrap();
        dev.into_sink().finish().unwrap().into_inner()
    };
    let a = run(ExecMode::Full);
    assert!(a == run(ExecMode::Full), "two runs differ");
    let (full, timing) = (
        TraceFile::from_bytes(a).unwrap(),
        TraceFile::from_bytes(run(ExecMode::TimingOnly)).unwrap(),
    );
    assert_eq!(full.record_count(), timing.record_count());
}
