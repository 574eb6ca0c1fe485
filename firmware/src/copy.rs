//! The copy engines: a PCIe link per direction (host-to-device and device-to-host, each a FIFO
//! of jobs that pay `pcie.latency_ns` and then move their bytes) and SDMA for device-to-device
//! copies and memsets. Memcpy and Memset tasks and the staging of data queue items use them;
//! every byte moves through the chip's HBM model. It reports which task or queue item a finished
//! copy was for and knows nothing of streams or queues.

use std::collections::{BTreeMap, VecDeque};

use gearsim_isa::task::MemcpyKind;
use gearsim_sim::{PcieConfig, SchedulerConfig, Tick};
use gearsim_traces::TraceSink;

use crate::context::{Ctx, bad};
use crate::effect::Effect;
use crate::error::{DeviceError, TaskRef};
use crate::timers::{Fw, Xfer, ns};

const H2D: usize = 0;
const D2H: usize = 1;

#[derive(Debug)]
enum PcieFor {
    Task {
        task: TaskRef,
        host_to_device: bool,
        dst: u64,
        src: u64,
    },
    QueueItem {
        item: u32,
        dst: u64,
        data: Vec<u8>,
    },
}

#[derive(Debug)]
struct PcieJob {
    dir: usize,
    bytes: u64,
    purpose: PcieFor,
    start: Tick,
}

#[derive(Debug, Default)]
struct PcieLink {
    busy: bool,
    fifo: VecDeque<u32>,
}

#[derive(Debug)]
struct SdmaJob {
    task: TaskRef,
    effect: Effect,
}

/// What a finished copy was for.
pub(crate) enum Copied {
    /// A Memcpy or Memset task, which is done.
    Task(TaskRef),
    /// A tensor of a data queue item is on the device.
    QueueItem(u32),
}

/// The PCIe links and SDMA.
pub(crate) struct Copies {
    pcie: [PcieLink; 2],
    pcie_jobs: BTreeMap<u32, PcieJob>,
    sdma_jobs: BTreeMap<u32, SdmaJob>,
    next_job: u32,
    link: PcieConfig,
    sdma_bytes_per_second: u64,
}

impl Copies {
    pub(crate) fn new(pcie: &PcieConfig, sched: &SchedulerConfig) -> Copies {
        Copies {
            pcie: [PcieLink::default(), PcieLink::default()],
            pcie_jobs: BTreeMap::new(),
            sdma_jobs: BTreeMap::new(),
            next_job: 0,
            link: pcie.clone(),
            sdma_bytes_per_second: sched.sdma_bytes_per_second,
        }
    }

    fn job(&mut self) -> u32 {
        let job = self.next_job;
        self.next_job += 1;
        job
    }

    /// A `Memcpy` task: host copies queue on their PCIe link, device copies go to SDMA.
    pub(crate) fn memcpy<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        kind: MemcpyKind,
        dst: u64,
        src: u64,
        size: u64,
    ) -> Result<(), DeviceError> {
        const K: &str = "Memcpy";
        let host = |cx: &Ctx<'_, S>, field: &'static str, addr: u64| {
            cx.host.check(addr, size).map_err(|m| bad(at, K, field, m))
        };
        match kind {
            MemcpyKind::HostToDevice => {
                host(cx, "src", src)?;
                cx.check_range(at, K, "dst", dst, size)?;
                let purpose = PcieFor::Task {
                    task: at,
                    host_to_device: true,
                    dst,
                    src,
                };
                self.pcie_submit(cx, H2D, size, purpose);
            }
            MemcpyKind::DeviceToHost => {
                cx.check_range(at, K, "src", src, size)?;
                host(cx, "dst", dst)?;
                let purpose = PcieFor::Task {
                    task: at,
                    host_to_device: false,
                    dst,
                    src,
                };
                self.pcie_submit(cx, D2H, size, purpose);
            }
            MemcpyKind::DeviceToDevice => {
                cx.check_range(at, K, "src", src, size)?;
                cx.check_range(at, K, "dst", dst, size)?;
                let effect = Effect::Copy { dst, src, size };
                // A copy reads and writes every byte.
                self.sdma(cx, at, effect, 2 * size, false);
            }
        }
        Ok(())
    }

    /// A `Memset` task, on SDMA.
    pub(crate) fn memset<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        dst: u64,
        size: u64,
        value: u8,
    ) -> Result<(), DeviceError> {
        cx.check_range(at, "Memset", "dst", dst, size)?;
        self.sdma(cx, at, Effect::Fill { dst, size, value }, size, true);
        Ok(())
    }

    fn sdma<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        task: TaskRef,
        effect: Effect,
        bytes: u64,
        write: bool,
    ) {
        let job = self.job();
        self.sdma_jobs.insert(job, SdmaJob { task, effect });
        cx.transfer(Xfer::Sdma(job), bytes, self.sdma_bytes_per_second, write);
    }

    /// Copies a tensor of data queue item `item` to its staging buffer at `dst`.
    pub(crate) fn stage<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        item: u32,
        dst: u64,
        data: Vec<u8>,
    ) {
        let bytes = data.len() as u64;
        self.pcie_submit(cx, H2D, bytes, PcieFor::QueueItem { item, dst, data });
    }

    fn pcie_submit<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        dir: usize,
        bytes: u64,
        purpose: PcieFor,
    ) {
        let job = self.job();
        self.pcie_jobs.insert(
            job,
            PcieJob {
                dir,
                bytes,
                purpose,
                start: Tick::ZERO,
            },
        );
        self.pcie[dir].fifo.push_back(job);
        self.pcie_next(cx, dir);
    }

    fn pcie_next<S: TraceSink>(&mut self, cx: &mut Ctx<'_, S>, dir: usize) {
        if self.pcie[dir].busy {
            return;
        }
        let Some(job) = self.pcie[dir].fifo.pop_front() else {
            return;
        };
        self.pcie[dir].busy = true;
        let now = cx.now();
        if let Some(j) = self.pcie_jobs.get_mut(&job) {
            j.start = now;
        }
        cx.timer(now + ns(self.link.latency_ns), Fw::PcieData { job });
    }

    /// A PCIe job's latency has passed: its bytes move.
    pub(crate) fn pcie_data<S: TraceSink>(&mut self, cx: &mut Ctx<'_, S>, job: u32) {
        let Some(j) = self.pcie_jobs.get(&job) else {
            return;
        };
        let (bytes, write) = (j.bytes, j.dir == H2D);
        cx.transfer(Xfer::Pcie(job), bytes, self.link.bytes_per_second, write);
    }

    /// A PCIe job's bytes have moved: its data lands and its link takes the next job.
    pub(crate) fn pcie_done<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        job: u32,
    ) -> Result<Option<Copied>, DeviceError> {
        let Some(j) = self.pcie_jobs.remove(&job) else {
            return Ok(None);
        };
        let now = cx.now();
        cx.lanes
            .pcie(cx.chip.sink_mut(), j.dir == H2D, j.bytes, j.start, now);
        self.pcie[j.dir].busy = false;
        self.pcie_next(cx, j.dir);
        match j.purpose {
            PcieFor::Task {
                task,
                host_to_device,
                dst,
                src,
            } => {
                let mut buf = vec![0u8; j.bytes as usize];
                if host_to_device {
                    cx.host
                        .read(src, &mut buf)
                        .map_err(DeviceError::HostMemory)?;
                    cx.chip.write_mem(dst, &buf)?;
                } else {
                    cx.chip.read_mem(src, &mut buf)?;
                    cx.host.write(dst, &buf).map_err(DeviceError::HostMemory)?;
                }
                Ok(Some(Copied::Task(task)))
            }
            PcieFor::QueueItem { item, dst, data } => {
                cx.chip.write_mem(dst, &data)?;
                Ok(Some(Copied::QueueItem(item)))
            }
        }
    }

    /// An SDMA job's bytes have moved: its effect is applied.
    pub(crate) fn sdma_done<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        job: u32,
    ) -> Result<Option<TaskRef>, DeviceError> {
        let Some(j) = self.sdma_jobs.remove(&job) else {
            return Ok(None);
        };
        j.effect.apply(cx.chip, cx.heap)?;
        Ok(Some(j.task))
    }
}
