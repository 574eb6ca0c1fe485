//! The runtime's own work on the host CPU, on the simulated timeline. Each ACL call costs the
//! calling thread what the chip preset's `[host]` section says (submitting a task, waking from a
//! synchronisation, a staging copy, the dynamic path's shape inference and tiling); while the
//! host works, the device runs whatever it was already given ([`Device::host_work`]), so a host
//! that dispatches faster than the device computes hides its cost and a slower one leaves the
//! device idle, as on the hardware (host-bound vs device-bound).
//!
//! Every piece is a span on the host's `work` lane, next to the `runtime` lane that shows whole
//! API calls; [`Host::busy`] sums them, so a run reports host work and end-to-end time apart
//! from device time.

use gearsim_firmware::{Device, StreamId};
use gearsim_isa::task::Task;
use gearsim_sim::{HostConfig, Tick};
use gearsim_traces::{Lane, LaneId, LaneKind, Record, TraceSink};

use super::error::RuntimeError;

/// The host thread that calls the runtime.
#[derive(Debug, Clone)]
pub(crate) struct Host {
    /// The lane of the host's own work (None: tracing is off).
    lane: Option<LaneId>,
    /// Host work so far, picoseconds.
    busy_ps: u64,
}

/// The host's costs: the chip preset's `[host]` section.
pub(crate) fn costs<S: TraceSink>(dev: &Device<S>) -> &HostConfig {
    &dev.chip().config().host
}

/// Records a host span on `lane` from `start` to now.
pub(crate) fn span<S: TraceSink>(
    dev: &mut Device<S>,
    lane: LaneId,
    name: &str,
    start: u64,
    detail: &str,
) {
    let end = dev.now().0.max(start);
    let sink = dev.chip_mut().sink_mut();
    let name = sink.intern(name);
    let detail = sink.intern(detail);
    sink.record(Record::Span {
        lane,
        name,
        start,
        end,
        pc: 0,
        detail,
    });
}

/// Picoseconds `bytes` take at `rate` bytes per second (rounded down).
fn bytes_ps(bytes: u64, rate: u64) -> u64 {
    let ps = u128::from(bytes) * 1_000_000_000_000 / u128::from(rate.max(1));
    u64::try_from(ps).unwrap_or(u64::MAX)
}

impl Host {
    /// The host of a runtime over `dev` (its lane is made when `dev` traces).
    pub(crate) fn new<S: TraceSink>(dev: &mut Device<S>) -> Host {
        let sink = dev.chip_mut().sink_mut();
        let lane = sink.enabled().then(|| {
            sink.lane(Lane {
                process: "host".into(),
                thread: "work".into(),
                kind: LaneKind::Host,
            })
        });
        Host { lane, busy_ps: 0 }
    }

    /// Host work so far (ps).
    pub(crate) fn busy(&self) -> u64 {
        self.busy_ps
    }

    /// The host works `ps` picoseconds on `what` while the device goes on.
    pub(crate) fn work_ps<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        what: &str,
        ps: u64,
    ) -> Result<(), RuntimeError> {
        if ps == 0 {
            return Ok(());
        }
        let start = dev.now().0;
        dev.host_work(Tick(ps))?;
        self.busy_ps += ps;
        if let Some(lane) = self.lane {
            span(dev, lane, what, start, "");
        }
        Ok(())
    }

    /// The host works `ns` nanoseconds on `what`.
    pub(crate) fn work<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        what: &str,
        ns: u64,
    ) -> Result<(), RuntimeError> {
        self.work_ps(dev, what, ns.saturating_mul(1000))
    }

    /// A call that only updates host state.
    pub(crate) fn api_call<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        what: &str,
    ) -> Result<(), RuntimeError> {
        let ns = costs(dev).api_call_ns;
        self.work(dev, what, ns)
    }

    /// Copies `bytes` between user memory and a pinned staging buffer.
    pub(crate) fn stage<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        bytes: u64,
    ) -> Result<(), RuntimeError> {
        let ps = bytes_ps(bytes, costs(dev).staging_bytes_per_second);
        self.work_ps(dev, "staging copy", ps)
    }

    /// Submits `task` to `stream`: the device sees it once the submission's cost is paid.
    pub(crate) fn submit<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        stream: StreamId,
        task: Task,
        name: &str,
    ) -> Result<(), RuntimeError> {
        let ns = costs(dev).submit_ns;
        self.work(dev, "submit", ns)?;
        dev.submit(stream, task, Some(name))?;
        Ok(())
    }

    /// `aclrtSynchronizeStream`: waits for `stream`'s tasks, then wakes up.
    pub(crate) fn sync<S: TraceSink>(
        &mut self,
        dev: &mut Device<S>,
        stream: StreamId,
    ) -> Result<(), RuntimeError> {
        dev.synchronize(stream)?;
        self.wake(dev)
    }

    /// The wake-up after a wait for the device.
    pub(crate) fn wake<S: TraceSink>(&mut self, dev: &mut Device<S>) -> Result<(), RuntimeError> {
        let ns = costs(dev).sync_ns;
        self.work(dev, "synchronize", ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearsim_isa::task::AiCoreKernel;
    use gearsim_sim::ChipConfig;
    use gearsim_traces::NullSink;

    /// ascend-hardware.md §6.4: a tiny kernel's launch + `aclrtSynchronizeStream` takes 74-89 us
    /// of host wall time on 310P and 19-31 us on 910B3 (the 910 preset takes the latter).
    #[test]
    fn a_tiny_launch_and_synchronize_takes_the_published_host_time() {
        for (preset, lo_us, hi_us) in [("ascend310p", 74, 89), ("ascend910", 19, 31)] {
            let mut dev = Device::new(ChipConfig::preset(preset).unwrap(), NullSink);
            let mut b = gearsim_isa::ProgramBuilder::new("tiny");
            b.end();
            let (program, _) = b.finish().unwrap();
            let k = dev.load_kernel(program).unwrap();
            let args = dev.alloc(8).unwrap();
            let s = dev.create_stream().unwrap();
            let mut host = Host::new(&mut dev);
            let t0 = dev.now().0;
            let launch = Task::AiCoreKernel(AiCoreKernel {
                kernel: k.addr.0,
                args: args.0,
                block_dim: 1,
                l2ctrl: 0,
                l2_sections: 0,
            });
            host.submit(&mut dev, s, launch, "tiny").unwrap();
            host.sync(&mut dev, s).unwrap();
            let us = (dev.now().0 - t0) as f64 / 1e6;
            assert!(
                (lo_us as f64..=hi_us as f64).contains(&us),
                "{preset}: launch + synchronize took {us} us, published {lo_us}-{hi_us} us"
            );
            let cfg = costs(&dev);
            assert_eq!(host.busy(), (cfg.submit_ns + cfg.sync_ns) * 1000);
        }
    }

    #[test]
    fn staging_time_rounds_down_to_picoseconds_and_never_overflows() {
        assert_eq!(bytes_ps(10_000, 10_000_000_000), 1_000_000);
        assert_eq!(bytes_ps(1, 3), 333_333_333_333);
        assert_eq!(bytes_ps(u64::MAX, 1), u64::MAX);
    }
}
