//! MapIndex cost: prints the simulated cycles of MapIndex for G in {2, 8, 32, 100, 256} gears x
//! n in {1, 4, 8} dims, per engine and table layout, next to the physical minimum (table bytes
//! over one core's MTE2 rate plus the DDR read latency), then measures the host time of a few
//! of those simulations with criterion. Run: `cargo bench -p gearsim-firmware --bench map_index`.
//!
//! The query matches no gear, so every engine scans the whole table (the worst case). Cycles
//! are AI core cycles at the preset clock. "kernel" is the AI core kernel alone (first block
//! start to end); "task" is the whole task on its stream: descriptor fetch, kernel or AI CPU
//! launch, memory and compute.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use gearsim_firmware::kernels::map_index::{self, MapIndexShape, TableLayout};
use gearsim_firmware::kernels::{AiCpuKernelId, MapIndexArgs};
use gearsim_firmware::{Device, DevicePtr, KERNEL_NEEDS_VALUES};
use gearsim_isa::task::{AiCoreKernel, AiCpuKernel, Task};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::NullSink;

fn config() -> ChipConfig {
    let mut cfg = ChipConfig::preset("ascend910").unwrap();
    // 256 gears is the Ascend 950 limit (gear spec §6.1); allow it to chart the whole range.
    cfg.kernels.map_index_max_gears = 256;
    cfg
}

fn upload(dev: &mut Device<NullSink>, v: &[u8]) -> DevicePtr {
    let p = dev.alloc(v.len() as u64).unwrap();
    dev.write(p, v).unwrap();
    p
}

fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// (kernel cycles for the AI core engine, task cycles, result).
fn measure(aicore: bool, layout: TableLayout, gears: u32, n: u32) -> (Option<u64>, u64, i32) {
    let cfg = config();
    let mhz = cfg.core.clock_mhz;
    let mut dev = Device::new(cfg, NullSink);
    let table: Vec<i32> = (0..gears * n).map(|v| v as i32).collect();
    let laid = map_index::layout_table(&table, n, gears, layout);
    let x = upload(&mut dev, &i32s(&vec![-5; n as usize]));
    let t = upload(&mut dev, &i32s(&laid));
    let y = upload(&mut dev, &i32s(&[0]));
    let shape = MapIndexShape {
        n,
        gears,
        layout,
        level_index: false,
    };
    let cycles = |ps: u64| ps * mhz / 1_000_000;
    let s = dev.create_stream().unwrap();
    let (task, kernel) = if aicore {
        let k = dev
            .load_kernel_flags(
                map_index::aicore_program(&shape, dev.chip().config().core.ub_bytes).unwrap(),
                KERNEL_NEEDS_VALUES,
            )
            .unwrap();
        let args = upload(
            &mut dev,
            &[x.0, t.0, 0, y.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        );
        let r = dev
            .launch(k, 1, &[x.0, t.0, 0, y.0], ExecMode::Full)
            .unwrap();
        (
            Task::AiCoreKernel(AiCoreKernel {
                kernel: k.addr.0,
                args: args.0,
                block_dim: 1,
                l2ctrl: 0,
                l2_sections: 0,
            }),
            Some(cycles(r.end.0 - r.first_start.0)),
        )
    } else {
        let block = MapIndexArgs {
            x: x.0,
            table: t.0,
            level_index: 0,
            y: y.0,
            shape,
        }
        .encode();
        let args = upload(&mut dev, &block);
        (
            Task::AiCpuKernel(AiCpuKernel {
                kernel: AiCpuKernelId::MapIndex as u32,
                block_dim: 1,
                args: args.0,
                args_size: block.len() as u32,
            }),
            None,
        )
    };
    dev.run_until_idle().unwrap();
    let t0 = dev.now();
    dev.submit(s, task, None).unwrap();
    dev.synchronize(s).unwrap();
    let task_cycles = cycles(dev.now().0 - t0.0);
    let mut b = [0u8; 4];
    dev.read(y, &mut b).unwrap();
    (kernel, task_cycles, i32::from_le_bytes(b))
}

fn print_table() {
    let cfg = config();
    println!(
        "\nMapIndex, no gear matching (full scan), ascend910 @ {} MHz; cycles are AI core cycles",
        cfg.core.clock_mhz
    );
    println!(
        "minimum = table bytes / {} B/cycle (one core's MTE2) + {} cycles read latency\n",
        cfg.mte.gm_read_bytes_per_cycle, cfg.memory.read_latency_cycles
    );
    println!(
        "| G | n | layout | table bytes | minimum | AI core kernel | x min | AI core task | AI CPU task | x min |"
    );
    println!("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for gears in [2u32, 8, 32, 100, 256] {
        for n in [1u32, 4, 8] {
            for layout in TableLayout::ALL {
                let bytes = layout.table_len(gears, n) * 4;
                let min = bytes.div_ceil(cfg.mte.gm_read_bytes_per_cycle)
                    + cfg.memory.read_latency_cycles;
                let (kernel, core_task, r1) = measure(true, layout, gears, n);
                let (_, cpu_task, r2) = measure(false, layout, gears, n);
                assert_eq!((r1, r2), (-1, -1), "MapIndex must find no gear");
                let kernel = kernel.unwrap_or(0);
                println!(
                    "| {gears} | {n} | {} | {bytes} | {min} | {kernel} | {:.1} | {core_task} | {cpu_task} | {:.1} |",
                    layout.name(),
                    kernel as f64 / min as f64,
                    cpu_task as f64 / min as f64
                );
            }
        }
    }
    println!();
}

fn bench(c: &mut Criterion) {
    print_table();
    let mut g = c.benchmark_group("map_index_host_time");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300));
    for (aicore, layout, gears, n) in [
        (true, TableLayout::DimMajor8, 100, 8),
        (true, TableLayout::GearMajor, 100, 8),
        (false, TableLayout::GearMajor, 100, 8),
    ] {
        let id = format!(
            "{} {} G{gears} n{n}",
            if aicore { "aicore" } else { "aicpu" },
            layout.name()
        );
        g.bench_function(&id, |b| b.iter(|| measure(aicore, layout, gears, n)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
