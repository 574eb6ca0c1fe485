//! Streams, events and copies: documented ordering, deadlock reports, PCIe and SDMA timing, and
//! GetDynamicDims on the gear spec §5 example.

use gearsim_firmware::kernels::{AiCpuKernelId, GetDynamicDimsArgs, encode_shape};
use gearsim_firmware::{BlockedTask, DeviceError, TaskRef};
use gearsim_isa::task::*;
use gearsim_sim::ChipConfig;
use gearsim_traces::NullSink;

use crate::support::*;

fn memset(dst: u64, size: u64, value: u32) -> Task {
    Task::Memset(Memset { dst, size, value })
}

/// Stream B waits on an event that stream A records after a long memset: B's short memset runs
/// second although it was submitted first and is far shorter.
#[test]
fn an_event_orders_two_streams() {
    let mut dev = device("ascend910", NullSink);
    let buf = dev.alloc(4 << 20).unwrap();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let e = dev.create_event().unwrap();
    dev.submit(
        b,
        Task::StreamWaitEvent(StreamWaitEvent { event: e.0 }),
        None,
    )
    .unwrap();
    dev.submit(b, memset(buf.0, 64, 2), None).unwrap();
    dev.submit(a, memset(buf.0, 4 << 20, 1), None).unwrap();
    dev.submit(a, Task::EventRecord(EventRecord { event: e.0 }), None)
        .unwrap();
    dev.run_until_idle().unwrap();
    let mut head = [0u8; 64];
    dev.read(buf, &mut head).unwrap();
    assert_eq!(head, [2u8; 64], "B's memset must land after A's");

    // Without the event, the short memset finishes first and A's overwrites it.
    let mut dev = device("ascend910", NullSink);
    let buf = dev.alloc(4 << 20).unwrap();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    dev.submit(b, memset(buf.0, 64, 2), None).unwrap();
    dev.submit(a, memset(buf.0, 4 << 20, 1), None).unwrap();
    dev.run_until_idle().unwrap();
    dev.read(buf, &mut head).unwrap();
    assert_eq!(head, [1u8; 64]);
}

#[test]
fn waiting_on_an_event_never_recorded_is_a_deadlock_naming_stream_and_task() {
    let mut dev = device("ascend910", NullSink);
    let s = dev.create_stream().unwrap();
    let other = dev.create_stream().unwrap();
    let e = dev.create_event().unwrap();
    let buf = dev.alloc(64).unwrap();
    dev.submit(s, memset(buf.0, 64, 1), None).unwrap();
    dev.submit(
        s,
        Task::StreamWaitEvent(StreamWaitEvent { event: e.0 }),
        Some("wait for producer"),
    )
    .unwrap();
    dev.submit(
        other,
        Task::StreamWaitEvent(StreamWaitEvent { event: e.0 }),
        None,
    )
    .unwrap();
    match dev.run_until_idle() {
        Err(DeviceError::Deadlock { blocked }) => {
            assert_eq!(
                blocked,
                vec![
                    BlockedTask {
                        task: TaskRef {
                            stream: s.0,
                            index: 1
                        },
                        kind: "StreamWaitEvent",
                        waits_for: format!("event {}, which nothing left will record", e.0),
                    },
                    BlockedTask {
                        task: TaskRef {
                            stream: other.0,
                            index: 0
                        },
                        kind: "StreamWaitEvent",
                        waits_for: format!("event {}, which nothing left will record", e.0),
                    },
                ]
            );
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
    // The device stays stopped and says why.
    let e = dev.run_until_idle().unwrap_err().to_string();
    assert!(
        e.contains("the device stopped earlier: deadlock: stream 0 task 1 (StreamWaitEvent)"),
        "{e}"
    );
}

/// A host-to-device copy takes the PCIe latency plus its bytes at the link rate; copies in one
/// direction queue behind each other on the link.
#[test]
fn pcie_copies_cost_latency_plus_bytes_over_bandwidth() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let mut dev = device("ascend910", NullSink);
    let n: u64 = 1 << 20;
    let host = dev.host_alloc(n).unwrap();
    dev.host_write(host, &vec![7u8; n as usize]).unwrap();
    let d = dev.alloc(n).unwrap();
    let s = dev.create_stream().unwrap();
    let t0 = dev.now();
    dev.submit(
        s,
        Task::Memcpy(Memcpy {
            kind: MemcpyKind::HostToDevice,
            dst: d.0,
            src: host.0,
            size: n,
        }),
        None,
    )
    .unwrap();
    dev.synchronize(s).unwrap();
    let took = dev.now().0 - t0.0;
    let expect = cfg.scheduler.task_fetch_ns * 1000
        + cfg.pcie.latency_ns * 1000
        + n * 1_000_000_000_000 / cfg.pcie.bytes_per_second;
    assert!(
        took.abs_diff(expect) <= 2000,
        "took {took} ps, expected {expect} ps"
    );
    let mut back = vec![0u8; 16];
    dev.read(d, &mut back).unwrap();
    assert_eq!(back, vec![7u8; 16]);
    // And back to the host.
    let host2 = dev.host_alloc(n).unwrap();
    dev.submit(
        s,
        Task::Memcpy(Memcpy {
            kind: MemcpyKind::DeviceToHost,
            dst: host2.0,
            src: d.0,
            size: n,
        }),
        None,
    )
    .unwrap();
    dev.synchronize(s).unwrap();
    let mut h = vec![0u8; 8];
    dev.host_read(gearsim_firmware::HostPtr(host2.0 + 100), &mut h)
        .unwrap();
    assert_eq!(h, vec![7u8; 8]);
}

/// GetDynamicDims on the example of gear spec §5.
#[test]
fn get_dynamic_dims_spec_example() {
    let mut dev = device("ascend910", NullSink);
    let shapes: Vec<u64> = [vec![3i64, 2, 4, 1], vec![1, 2, 1], vec![16, 112, 112, 3, 4]]
        .iter()
        .map(|d| upload(&mut dev, &encode_shape(d)).0)
        .collect();
    let out = dev.alloc(12).unwrap();
    let args = GetDynamicDimsArgs {
        out: out.0,
        out_i64: false,
        n: 3,
        shapes,
        shape_info: vec![4, 3, 2, -1, 1, 3, 1, 2, 1, 5, 16, -1, -1, 3, 4],
    };
    let block = args.encode();
    let p = upload(&mut dev, &block);
    let s = dev.create_stream().unwrap();
    let task = Task::AiCpuKernel(AiCpuKernel {
        kernel: AiCpuKernelId::GetDynamicDims as u32,
        block_dim: 1,
        args: p.0,
        args_size: block.len() as u32,
    });
    dev.submit(s, task, None).unwrap();
    let t0 = dev.now();
    dev.synchronize(s).unwrap();
    let mut b = [0u8; 12];
    dev.read(out, &mut b).unwrap();
    let dims: Vec<i32> = b
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(dims, vec![4, 112, 112]);
    // It costs at least the AI CPU launch.
    let cfg = ChipConfig::preset("ascend910").unwrap();
    assert!(dev.now().0 - t0.0 >= cfg.aicpu.launch_ns * 1000);

    // A rank mismatch is KERNEL_STATUS_PARAM_INVALID naming the task.
    let bad_shape = upload(&mut dev, &encode_shape(&[3, 2, 4]));
    let mut bad = args.clone();
    bad.shapes[0] = bad_shape.0;
    let block = bad.encode();
    let p = upload(&mut dev, &block);
    let task = Task::AiCpuKernel(AiCpuKernel {
        kernel: 2,
        block_dim: 1,
        args: p.0,
        args_size: block.len() as u32,
    });
    dev.submit(s, task, None).unwrap();
    let e = dev.synchronize(s).unwrap_err().to_string();
    assert!(e.contains("stream 0 task 1: GetDynamicDims: input 0: runtime rank 3 differs from configured rank 4"), "{e}");
}

/// Blocks of a kernel beyond the core count run in waves; two kernels on two streams share
/// the cores.
#[test]
fn kernels_run_in_waves_and_share_cores() {
    let mut dev = device("ascend310p", NullSink);
    let spin = gearsim_isa::assemble("movi x1, 1000\nl: loop x1, l\nend", "spin.s").unwrap();
    let k = dev.load_kernel(spin).unwrap();
    let one = dev.launch(k, 8, &[], gearsim_sim::ExecMode::Full).unwrap();
    let two = dev.launch(k, 16, &[], gearsim_sim::ExecMode::Full).unwrap();
    let span = |r: &gearsim_firmware::LaunchReport| r.end.0 - r.first_start.0;
    // Two waves take nearly twice as long (the second wave's dispatch overlaps the first's tail).
    assert!(
        span(&two) > span(&one) * 16 / 10,
        "16 blocks on 8 cores take two waves: {} vs {}",
        span(&two),
        span(&one)
    );
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let t0 = dev.now();
    for s in [s1, s2] {
        dev.submit(
            s,
            Task::AiCoreKernel(AiCoreKernel {
                kernel: k.addr.0,
                args: 0,
                block_dim: 8,
                l2ctrl: 0,
                l2_sections: 0,
            }),
            None,
        )
        .unwrap();
    }
    dev.run_until_idle().unwrap();
    let both = dev.now().0 - t0.0;
    assert!(
        both > span(&one) * 16 / 10,
        "two 8-block kernels on 8 cores share them: {both}"
    );
}

/// While the host works, the device runs what it was given: a copy submitted before the host
/// works for less than the copy takes is still running afterwards, and one the host outlasts
/// finished meanwhile; either way the clock moved by exactly the host's work.
#[test]
fn the_device_runs_while_the_host_works() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let mut dev = device("ascend910", NullSink);
    let n: u64 = 1 << 20;
    let host = dev.host_alloc(n).unwrap();
    let d = dev.alloc(n).unwrap();
    let s = dev.create_stream().unwrap();
    let copy = Task::Memcpy(Memcpy {
        kind: MemcpyKind::HostToDevice,
        dst: d.0,
        src: host.0,
        size: n,
    });
    let copy_ps = cfg.scheduler.task_fetch_ns * 1000
        + cfg.pcie.latency_ns * 1000
        + n * 1_000_000_000_000 / cfg.pcie.bytes_per_second;
    for (host_ps, finished) in [(copy_ps / 2, false), (copy_ps * 2, true)] {
        let t0 = dev.now().0;
        let busy0 = dev.stream_busy(s).unwrap().0;
        dev.submit(s, copy, None).unwrap();
        dev.host_work(gearsim_sim::Tick(host_ps)).unwrap();
        assert_eq!(dev.now().0 - t0, host_ps);
        let busy = dev.stream_busy(s).unwrap().0 - busy0;
        if finished {
            // Busy from the task's start: the descriptor fetch before it is not the copy's.
            let fetch = cfg.scheduler.task_fetch_ns * 1000;
            assert!(
                (busy + fetch).abs_diff(copy_ps) <= 2000,
                "busy {busy} ps, copy {copy_ps}"
            );
        } else {
            assert_eq!(busy, 0, "the copy cannot have ended yet");
        }
        dev.synchronize(s).unwrap();
        let end = dev.now().0 - t0;
        assert_eq!(end, host_ps.max(end), "synchronize never goes back in time");
        if !finished {
            assert!(end.abs_diff(copy_ps) <= 2000, "ended after {end} ps");
        }
    }
    // An idle device lets the host's time pass as well.
    let t0 = dev.now().0;
    dev.host_work(gearsim_sim::Tick(5_000_000)).unwrap();
    assert_eq!(dev.now().0 - t0, 5_000_000);
}
