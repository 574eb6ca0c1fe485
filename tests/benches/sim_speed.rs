//! Simulator speed: simulated instructions and simulated cycles per host second, in full and
//! timing-only mode, on the example kernels and on whole models (the CNN at batch 1 and the
//! transformer at sequence length 64, as `gearsim bench speed` runs them: only the model's
//! execution is timed). Run with `cargo bench -p gearsim-tests --bench sim_speed`; criterion's
//! "thrpt" column is instructions/s in the `instructions` group and chip cycles/s (cycles of
//! the chip clock, not summed over cores) in the `cycles` group. Every kernel workload's result
//! is checked before it is timed; every model run must simulate the same cycles and
//! instructions as the first.

// Tests unwrap freely: a failed unwrap is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use gearsim_firmware::Device;
use gearsim_sim::ExecMode;
use gearsim_tests::{Rng, device, example_kernel, f16_bytes, f16_from_bytes, upload};
use gearsim_traces::NullSink;
use half::f16;

/// A prepared launch: a device with its data loaded and the launch parameters.
struct Prepared {
    dev: Device<NullSink>,
    kernel: gearsim_firmware::KernelHandle,
    block_dim: u32,
    args: Vec<u64>,
}

struct Workload {
    name: &'static str,
    prepare: fn() -> Prepared,
    /// Checks the result of a full-mode run.
    check: fn(&mut Prepared),
}

const VADD_N: usize = 1 << 24;

fn vadd() -> Prepared {
    let mut dev = device("ascend910", NullSink);
    let mut rng = Rng::new(1);
    let x = upload(&mut dev, &f16_bytes(&rng.f16s(VADD_N, -8.0, 8.0)));
    let y = upload(&mut dev, &f16_bytes(&rng.f16s(VADD_N, -8.0, 8.0)));
    let z = dev.alloc(2 * VADD_N as u64).unwrap();
    let kernel = dev.load_kernel(example_kernel("vadd_f16_db")).unwrap();
    Prepared {
        dev,
        kernel,
        block_dim: 32,
        args: vec![x.0, y.0, z.0, VADD_N as u64],
    }
}

fn check_vadd(p: &mut Prepared) {
    let mut read = |ptr: u64| {
        let mut b = vec![0u8; 2 * VADD_N];
        p.dev
            .read(gearsim_firmware::DevicePtr(ptr), &mut b)
            .unwrap();
        f16_from_bytes(&b)
    };
    let (x, y, z) = (read(p.args[0]), read(p.args[1]), read(p.args[2]));
    for i in (0..VADD_N).step_by(997) {
        assert_eq!(
            z[i],
            f16::from_f32(x[i].to_f32() + y[i].to_f32()),
            "vadd element {i}"
        );
    }
}

fn mmad() -> Prepared {
    let mut dev = device("ascend910", NullSink);
    let a = upload(&mut dev, &f16_bytes(&Rng::new(2).f16s(32768, -1.0, 1.0)));
    let b = upload(&mut dev, &f16_bytes(&Rng::new(3).f16s(32768, -1.0, 1.0)));
    let c = dev.alloc(32 * 32768).unwrap();
    let kernel = dev.load_kernel(example_kernel("mmad_loop")).unwrap();
    Prepared {
        dev,
        kernel,
        block_dim: 32,
        args: vec![a.0, b.0, c.0, 64],
    }
}

fn check_mmad(p: &mut Prepared) {
    let mut out = vec![0u8; 32768];
    p.dev
        .read(gearsim_firmware::DevicePtr(p.args[2]), &mut out)
        .unwrap();
    assert!(
        f16_from_bytes(&out).iter().any(|v| v.to_f32() != 0.0),
        "mmad produced only zeros"
    );
}

fn dma() -> Prepared {
    let mut dev = device("ascend910", NullSink);
    let total = 256u64 << 20;
    let src = dev.alloc(total).unwrap();
    let kernel = dev.load_kernel(example_kernel("dma_stream")).unwrap();
    Prepared {
        dev,
        kernel,
        block_dim: 32,
        args: vec![src.0, total],
    }
}

fn check_nothing(_: &mut Prepared) {}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "vadd_f16_db x32",
        prepare: vadd,
        check: check_vadd,
    },
    Workload {
        name: "mmad_loop x32",
        prepare: mmad,
        check: check_mmad,
    },
    Workload {
        name: "dma_stream x32",
        prepare: dma,
        check: check_nothing,
    },
];

fn run(p: &mut Prepared, mode: ExecMode) -> (u64, u64) {
    let r = p.dev.launch(p.kernel, p.block_dim, &p.args, mode).unwrap();
    let cycles = p.dev.chip().clock().cycle_at_or_after(r.end).0
        - p.dev.chip().clock().cycle_at_or_after(r.first_start).0;
    (r.instructions(), cycles)
}

fn sim_speed(c: &mut Criterion) {
    for w in WORKLOADS {
        for (mode, label) in [
            (ExecMode::Full, "full"),
            (ExecMode::TimingOnly, "timing-only"),
        ] {
            let mut p = (w.prepare)();
            let (instrs, cycles) = run(&mut p, mode);
            if mode == ExecMode::Full {
                (w.check)(&mut p);
            }
            println!(
                "{} {label}: {instrs} instructions, {cycles} chip cycles per run",
                w.name
            );
            let id = format!("{} {label}", w.name);
            for (group, amount) in [("instructions", instrs), ("cycles", cycles)] {
                let mut g = c.benchmark_group(format!("sim_speed/{group}"));
                g.sample_size(10)
                    .warm_up_time(Duration::from_millis(500))
                    .measurement_time(Duration::from_secs(3));
                g.throughput(Throughput::Elements(amount));
                g.bench_function(&id, |b| {
                    // Return the prepared device so that freeing it is not timed.
                    b.iter_batched(
                        w.prepare,
                        |mut p| {
                            run(&mut p, mode);
                            p
                        },
                        BatchSize::PerIteration,
                    )
                });
                g.finish();
            }
        }
    }
}

/// The models at one gear each, full and timing-only.
fn model_speed(c: &mut Criterion) {
    use gearsim_host::bench::speed::{Model, Prepared, mode_name};
    let cfg = gearsim_sim::ChipConfig::preset("ascend910").unwrap();
    for (model, gear) in [(Model::Cnn, 1), (Model::Transformer, 64)] {
        let om = model.compile(&cfg).unwrap();
        for mode in [ExecMode::Full, ExecMode::TimingOnly] {
            let mut p = Prepared::new(&cfg, model, &om, gear, mode).unwrap();
            let count = p.run().unwrap();
            let id = format!(
                "{} {} {}",
                model.name(),
                model.gear_label(gear),
                mode_name(mode)
            );
            println!(
                "{id}: {} instructions, {} chip cycles per run",
                count.instructions, count.cycles
            );
            for (group, amount) in [
                ("instructions", count.instructions),
                ("cycles", count.cycles),
            ] {
                let mut g = c.benchmark_group(format!("sim_speed/{group}"));
                g.sample_size(10)
                    .warm_up_time(Duration::from_millis(500))
                    .measurement_time(Duration::from_secs(3));
                g.throughput(Throughput::Elements(amount));
                g.bench_function(&id, |b| {
                    b.iter(|| assert_eq!(p.run().unwrap(), count, "{id}"))
                });
                g.finish();
            }
        }
    }
}

criterion_group!(benches, sim_speed, model_speed);
criterion_main!(benches);
