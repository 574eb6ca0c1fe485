//! Helpers shared by the firmware tests.

use gearsim_firmware::kernels::map_index::{self, MapIndexShape, TableLayout};
use gearsim_firmware::kernels::{AiCpuKernelId, MapIndexArgs};
use gearsim_firmware::{Device, DevicePtr, KERNEL_NEEDS_VALUES, StreamId};
use gearsim_isa::task::{AiCpuKernel, Task};
use gearsim_sim::{ChipConfig, ExecMode, Tick};
use gearsim_traces::TraceSink;

/// Which MapIndex implementation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    AiCore,
    AiCpu,
}

pub fn device<S: TraceSink>(preset: &str, sink: S) -> Device<S> {
    Device::new(ChipConfig::preset(preset).unwrap(), sink)
}

pub fn upload<S: TraceSink>(dev: &mut Device<S>, bytes: &[u8]) -> DevicePtr {
    let p = dev.alloc(bytes.len().max(1) as u64).unwrap();
    dev.write(p, bytes).unwrap();
    p
}

pub fn i32s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn read_i32<S: TraceSink>(dev: &mut Device<S>, p: DevicePtr) -> i32 {
    let mut b = [0u8; 4];
    dev.read(p, &mut b).unwrap();
    i32::from_le_bytes(b)
}

/// Device buffers of one MapIndex instance.
pub struct MapIndexBuffers {
    pub x: DevicePtr,
    pub table: DevicePtr,
    pub level: DevicePtr,
    pub y: DevicePtr,
}

pub fn map_index_buffers<S: TraceSink>(
    dev: &mut Device<S>,
    shape: &MapIndexShape,
    x: &[i32],
    gear_major: &[i32],
    level: Option<&[i32]>,
) -> MapIndexBuffers {
    let table = map_index::layout_table(gear_major, shape.n, shape.gears, shape.layout);
    MapIndexBuffers {
        x: upload(dev, &i32s(x)),
        table: upload(dev, &i32s(&table)),
        level: level.map_or(DevicePtr(0), |l| upload(dev, &i32s(l))),
        y: upload(dev, &i32s(&[12345])),
    }
}

/// The task that runs MapIndex on `engine` (loading the AI core kernel if needed).
pub fn map_index_task<S: TraceSink>(
    dev: &mut Device<S>,
    engine: Engine,
    shape: &MapIndexShape,
    b: &MapIndexBuffers,
) -> Task {
    match engine {
        Engine::AiCore => {
            let k = dev
                .load_kernel_flags(
                    map_index::aicore_program(shape, dev.chip().config().core.ub_bytes).unwrap(),
                    KERNEL_NEEDS_VALUES,
                )
                .unwrap();
            let args = upload(
                dev,
                &[b.x.0, b.table.0, b.level.0, b.y.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<_>>(),
            );
            Task::AiCoreKernel(gearsim_isa::task::AiCoreKernel {
                kernel: k.addr.0,
                args: args.0,
                block_dim: 1,
                l2ctrl: 0,
                l2_sections: 0,
            })
        }
        Engine::AiCpu => {
            let block = MapIndexArgs {
                x: b.x.0,
                table: b.table.0,
                level_index: b.level.0,
                y: b.y.0,
                shape: *shape,
            }
            .encode();
            let args = upload(dev, &block);
            Task::AiCpuKernel(AiCpuKernel {
                kernel: AiCpuKernelId::MapIndex as u32,
                block_dim: 1,
                args: args.0,
                args_size: block.len() as u32,
            })
        }
    }
}

/// Runs one MapIndex on a fresh stream and returns (result, device time it took).
pub fn run_map_index<S: TraceSink>(
    dev: &mut Device<S>,
    engine: Engine,
    layout: TableLayout,
    x: &[i32],
    gear_major: &[i32],
    gears: u32,
    level: Option<&[i32]>,
) -> (i32, Tick) {
    let shape = MapIndexShape {
        n: x.len() as u32,
        gears,
        layout,
        level_index: level.is_some(),
    };
    let b = map_index_buffers(dev, &shape, x, gear_major, level);
    let task = map_index_task(dev, engine, &shape, &b);
    let s: StreamId = dev.create_stream().unwrap();
    let t0 = dev.now();
    dev.set_exec_mode(ExecMode::TimingOnly); // MapIndex needs values and must run in full anyway
    dev.submit(s, task, Some("MapIndex")).unwrap();
    dev.synchronize(s).unwrap();
    (read_i32(dev, b.y), Tick(dev.now().0 - t0.0))
}
