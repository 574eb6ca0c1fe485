//! Faults of the simulated hardware stop the run with a `StopReason` that names core, pipe, pc
//! and address; the simulator itself never panics.

use gearsim_firmware::DeviceError;
use gearsim_isa::Pipe;
use gearsim_sim::{Buffer, ChipConfig, ExecMode, StopReason};
use gearsim_traces::NullSink;

fn run_on(cfg: ChipConfig, src: &str, args: &[u64], mode: ExecMode) -> StopReason {
    let mut dev = gearsim_firmware::Device::new(cfg, NullSink);
    let k = dev
        .load_kernel(gearsim_isa::assemble(src, "fault.s").unwrap())
        .unwrap();
    match dev.launch(k, 1, args, mode) {
        Err(DeviceError::Fault(s)) => s,
        other => panic!("expected a fault, got {other:?}"),
    }
}

fn run(src: &str) -> StopReason {
    run_on(
        ChipConfig::preset("ascend910").unwrap(),
        src,
        &[],
        ExecMode::Full,
    )
}

#[test]
fn dma_outside_device_memory() {
    let s = run("movi x1, 0\n movi x2, 0x800000000 - 64\n copy_gm_to_ub x1, x2, 1, 4\n end");
    assert_eq!(
        s,
        StopReason::MemoryFault {
            core: 0,
            pipe: Pipe::Mte2,
            pc: 2,
            buffer: Buffer::Gm,
            addr: 0x8_0000_0000 - 64,
            len: 128,
            size: 0x8_0000_0000,
        }
    );
    assert!(
        s.to_string()
            .starts_with("memory fault: core 0 MTE2 pc 2: GM access [0x7ffffffc0, 0x800000040)"),
        "{s}"
    );
}

#[test]
fn ub_overflow_and_misalignment() {
    let s = run("movi x1, 262144 - 64\n movi x2, 4096\n copy_gm_to_ub x1, x2, 1, 4\n end");
    assert!(
        matches!(
            s,
            StopReason::MemoryFault {
                pipe: Pipe::Mte2,
                pc: 2,
                buffer: Buffer::Ub,
                addr: 262080,
                len: 128,
                ..
            }
        ),
        "{s}"
    );
    let s = run("movi x1, 16\n movi x2, 4096\n copy_gm_to_ub x1, x2, 1, 1\n end");
    assert_eq!(
        s,
        StopReason::Misaligned {
            core: 0,
            pipe: Pipe::Mte2,
            pc: 2,
            buffer: Buffer::Ub,
            addr: 16,
            align: 32
        }
    );
    let s = run("movi x1, 262144 - 256\n vadd.f16 x1, x1, x1, repeat=2\n end");
    assert!(
        matches!(
            s,
            StopReason::MemoryFault {
                pipe: Pipe::V,
                pc: 1,
                buffer: Buffer::Ub,
                len: 512,
                ..
            }
        ),
        "{s}"
    );
}

#[test]
fn l1_overflow_and_misalignment() {
    let s = run("movi x1, 1048576 - 512\n movi x2, 0\n copy_gm_to_l1 x1, x2, 2, 16\n end");
    assert_eq!(
        s,
        StopReason::MemoryFault {
            core: 0,
            pipe: Pipe::Mte2,
            pc: 2,
            buffer: Buffer::L1,
            addr: 1048576 - 512,
            len: 1024,
            size: 1048576,
        }
    );
    let s = run("movi x1, 8\n movi x2, 0\n copy_gm_to_l1 x1, x2, 1, 1\n end");
    assert_eq!(
        s,
        StopReason::Misaligned {
            core: 0,
            pipe: Pipe::Mte2,
            pc: 2,
            buffer: Buffer::L1,
            addr: 8,
            align: 32
        }
    );
}

#[test]
fn l0_overflow_and_misalignment() {
    let s = run("movi x1, 256\n movi x2, 0\n load_l0a x1, x2, 1\n end");
    assert_eq!(
        s,
        StopReason::Misaligned {
            core: 0,
            pipe: Pipe::Mte1,
            pc: 2,
            buffer: Buffer::L0a,
            addr: 256,
            align: 512
        }
    );
    let s = run("movi x1, 0\n mmad x1, x1, x1, 16, 2064, 16\n end");
    assert_eq!(
        s,
        StopReason::MemoryFault {
            core: 0,
            pipe: Pipe::M,
            pc: 1,
            buffer: Buffer::L0a,
            addr: 0,
            len: 66048,
            size: 65536
        }
    );
    let s = run("movi x1, 0\n mmad x1, x1, x1, 256, 16, 272\n end");
    assert_eq!(
        s,
        StopReason::MemoryFault {
            core: 0,
            pipe: Pipe::M,
            pc: 1,
            buffer: Buffer::L0c,
            addr: 0,
            len: 278528,
            size: 262144
        }
    );
}

#[test]
fn instructions_the_chip_cannot_execute() {
    let s = run("movi x1, 0\n copy_l0c_to_gm.f16 x1, x1, 16, 16, 16\n end");
    assert!(
        matches!(
            &s,
            StopReason::IllegalInstruction {
                pipe: Pipe::Fix,
                pc: 1,
                ..
            }
        ),
        "{s}"
    );
    assert!(
        s.to_string()
            .contains("needs a FIXPIPE, which ascend910 does not have"),
        "{s}"
    );
    let s = run("set_flag V, MTE2, 4\n end");
    assert!(
        s.to_string()
            .contains("event id 4 is out of range: ascend910 has 4 event ids per pipe pair"),
        "{s}"
    );
    let s = run("movi x1, 1\n");
    assert!(
        matches!(
            &s,
            StopReason::IllegalInstruction {
                pipe: Pipe::S,
                pc: 1,
                ..
            }
        ),
        "{s}"
    );
    assert!(
        s.to_string()
            .contains("past the end of kernel `kernel` (1 instructions)"),
        "{s}"
    );
}

#[test]
fn fixpipe_path_works_on_a_chip_that_has_one() {
    let mut cfg = ChipConfig::preset("ascend910").unwrap();
    cfg.core.fixpipe = true;
    let mut dev = gearsim_firmware::Device::new(cfg, NullSink);
    let out = dev.alloc(16 * 16 * 2).unwrap();
    let k = dev
        .load_kernel(gearsim_isa::assemble("sreg x1, args\n ld.gm.u64 x2, x1\n movi x3, 0\n copy_l0c_to_gm.f16 x2, x3, 16, 16, 16\n end", "fix.s").unwrap())
        .unwrap();
    let r = dev.launch(k, 1, &[out.0], ExecMode::Full).unwrap();
    assert_eq!(r.core_stats[0].pipes[6].instructions, 1);
}

#[test]
fn runaway_kernel_times_out() {
    let mut cfg = ChipConfig::preset("ascend910").unwrap();
    cfg.core.kernel_timeout_cycles = 10_000;
    let s = run_on(cfg, "spin: jmp spin\n end", &[], ExecMode::Full);
    assert_eq!(
        s,
        StopReason::Timeout {
            core: 0,
            pc: 0,
            limit_cycles: 10_000
        }
    );
}

#[test]
fn setting_a_flag_twice_before_its_wait_is_an_overflow() {
    let s = run(
        "movi x1, 0\n movi x2, 4096\n copy_gm_to_ub x1, x2, 1, 1024\n wait_flag V, MTE2, 0\n set_flag V, MTE2, 0\n set_flag V, MTE2, 0\n end",
    );
    assert!(
        matches!(
            &s,
            StopReason::FlagOverflow {
                core: 0,
                pipe: Pipe::V,
                pc: 5,
                ..
            }
        ),
        "{s}"
    );
    assert!(
        s.to_string()
            .contains("set_flag V->MTE2 id 0 while it is still set"),
        "{s}"
    );
}

#[test]
fn scalar_access_faults() {
    let s = run("movi x1, 3\n ld.ub.u32 x2, x1\n end");
    assert_eq!(
        s,
        StopReason::Misaligned {
            core: 0,
            pipe: Pipe::S,
            pc: 1,
            buffer: Buffer::Ub,
            addr: 3,
            align: 4
        }
    );
    let s = run("movi x1, 0x900000000\n ld.gm.u64 x2, x1\n end");
    assert!(
        matches!(
            s,
            StopReason::MemoryFault {
                pipe: Pipe::S,
                pc: 1,
                buffer: Buffer::Gm,
                addr: 0x9_0000_0000,
                ..
            }
        ),
        "{s}"
    );
}

#[test]
fn timing_only_refuses_to_branch_on_uncomputed_data() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let src = "movi x1, 0\n movi x2, 7\n vdup.i32 x1, x2\n set_flag V, S, 0\n wait_flag V, S, 0\n ld.ub.u32 x3, x1\n end";
    let s = run_on(cfg.clone(), src, &[], ExecMode::TimingOnly);
    assert_eq!(
        s,
        StopReason::ValueNeeded {
            core: 0,
            pc: 5,
            buffer: Buffer::Ub,
            addr: 0
        }
    );
    // The same kernel in full mode reads the computed value.
    let mut dev = gearsim_firmware::Device::new(cfg, NullSink);
    let k = dev
        .load_kernel(gearsim_isa::assemble(src, "v.s").unwrap())
        .unwrap();
    dev.launch(k, 1, &[], ExecMode::Full).unwrap();
}
