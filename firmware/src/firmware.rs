//! The firmware's state in one place — the scheduler's components, the firmware timers and
//! transfer tokens, the trace lanes, device and host memory — and the event loop that takes the
//! chip's events and routes them: a block completion to AI core dispatch, a timer or a transfer
//! completion to the scheduler by what its token names. It does not own the chip (the device
//! lends it for each call) and knows no task kind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gearsim_sim::{Chip, ChipConfig, RunEvent};
use gearsim_traces::TraceSink;

use crate::context::Ctx;
use crate::error::DeviceError;
use crate::lanes::Lanes;
use crate::memory::{Allocator, HostMemory, RESERVED_LOW};
use crate::queues::Staged;
use crate::scheduler::Scheduler;
use crate::streams::{StreamState, Streams};
use crate::timers::{Fw, Timers};

/// An error when the host has set the interrupt flag.
fn interrupted<S: TraceSink>(
    flag: Option<&AtomicBool>,
    cx: &Ctx<'_, S>,
) -> Result<(), DeviceError> {
    match flag {
        Some(f) if f.load(Ordering::Relaxed) => Err(DeviceError::Interrupted { at: cx.now().0 }),
        _ => Ok(()),
    }
}

/// Everything the firmware keeps about the device.
pub(crate) struct Firmware {
    pub(crate) sched: Scheduler,
    pub(crate) heap: Allocator,
    pub(crate) host: HostMemory,
    timers: Timers,
    lanes: Lanes,
    /// Set by another thread to stop the event loop (checked once per chip event).
    pub(crate) interrupt: Option<Arc<AtomicBool>>,
}

impl Firmware {
    pub(crate) fn new(cfg: &ChipConfig) -> Firmware {
        Firmware {
            sched: Scheduler::new(cfg),
            heap: Allocator::new(RESERVED_LOW, cfg.memory.hbm_bytes),
            host: HostMemory::default(),
            timers: Timers::default(),
            lanes: Lanes::default(),
            interrupt: None,
        }
    }

    /// The scheduler, and the rest lent to it with `chip` for one call.
    fn split<'a, S: TraceSink>(
        &'a mut self,
        chip: &'a mut Chip<S>,
    ) -> (&'a mut Scheduler, Ctx<'a, S>) {
        let cx = Ctx {
            chip,
            timers: &mut self.timers,
            lanes: &mut self.lanes,
            heap: &mut self.heap,
            host: &mut self.host,
        };
        (&mut self.sched, cx)
    }

    /// Runs the event loop until `done` holds of the streams (or, for a condition that never
    /// holds, until the chip is idle); an idle chip with tasks still waiting is a deadlock.
    pub(crate) fn run<S: TraceSink>(
        &mut self,
        chip: &mut Chip<S>,
        done: &dyn Fn(&Streams) -> bool,
    ) -> Result<(), DeviceError> {
        let interrupt = self.interrupt.clone();
        let (sched, mut cx) = self.split(chip);
        loop {
            if done(&sched.streams) {
                return Ok(());
            }
            interrupted(interrupt.as_deref(), &cx)?;
            match cx.chip.run_until_event().map_err(DeviceError::Fault)? {
                RunEvent::Idle { .. } => {
                    if done(&sched.streams) {
                        return Ok(());
                    }
                    let blocked = sched.blocked();
                    if blocked.is_empty() {
                        return Ok(());
                    }
                    return Err(DeviceError::Deadlock { blocked });
                }
                event => {
                    route(sched, &mut cx, event)?;
                }
            }
        }
    }

    /// Runs the event loop until time `until` while the host does its own work: whatever the
    /// device has to do meanwhile happens, and the clock stands at `until` on return (an idle
    /// device with tasks waiting is not a deadlock here: the host may be about to feed it).
    pub(crate) fn run_to<S: TraceSink>(
        &mut self,
        chip: &mut Chip<S>,
        until: gearsim_sim::Tick,
    ) -> Result<(), DeviceError> {
        let interrupt = self.interrupt.clone();
        let (sched, mut cx) = self.split(chip);
        if until <= cx.now() {
            return Ok(());
        }
        cx.timers.set(cx.chip, until, Fw::HostWake);
        loop {
            interrupted(interrupt.as_deref(), &cx)?;
            match cx.chip.run_until_event().map_err(DeviceError::Fault)? {
                // The wake timer is pending, so the chip is never idle before it fires.
                RunEvent::Idle { .. } => return Ok(()),
                event => {
                    if route(sched, &mut cx, event)? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A task was submitted to `stream`: an idle stream steps now.
    pub(crate) fn submitted<S: TraceSink>(&mut self, chip: &mut Chip<S>, stream: u32) {
        let (sched, mut cx) = self.split(chip);
        if sched.streams.stream(stream).state == StreamState::Idle {
            let now = cx.now();
            sched.streams.step_later(&mut cx, stream, now);
        }
    }

    /// Stages a data queue item (see [`Scheduler::enqueue`]).
    pub(crate) fn enqueue<S: TraceSink>(
        &mut self,
        chip: &mut Chip<S>,
        queue: u32,
        data: Vec<Vec<u8>>,
        staged: Vec<Staged>,
    ) {
        let (sched, mut cx) = self.split(chip);
        sched.enqueue(&mut cx, queue, data, staged);
    }
}

/// Routes one chip event (not `Idle`) to the scheduler by what its token names; true when it
/// was the host's wake timer.
fn route<S: TraceSink>(
    sched: &mut Scheduler,
    cx: &mut Ctx<'_, S>,
    event: RunEvent,
) -> Result<bool, DeviceError> {
    match event {
        RunEvent::BlockFinished { core, at } => sched.block_finished(cx, core, at)?,
        RunEvent::Timer { token, .. } => match cx.timers.fired(token) {
            Some(Fw::HostWake) => return Ok(true),
            Some(fw) => sched.timer_fired(cx, fw)?,
            None => {}
        },
        RunEvent::TransferDone { token, .. } => {
            if let Some(x) = cx.timers.finished(token) {
                sched.transfer_done(cx, x)?;
            }
        }
        RunEvent::Idle { .. } => {}
    }
    Ok(false)
}
