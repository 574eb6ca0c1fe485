//! What a firmware component may touch while it handles a task or an event: the chip (its
//! memory, event queue and trace sink), the firmware's timers and trace lanes, and device and
//! host memory. It owns none of them — the firmware lends them for one call — and knows no
//! component.

use gearsim_sim::{Chip, Tick};
use gearsim_traces::TraceSink;

use crate::error::{DeviceError, TaskRef};
use crate::lanes::Lanes;
use crate::memory::{Allocator, HostMemory};
use crate::timers::{Fw, Timers, Xfer};

/// The firmware's view of the chip for one call.
pub(crate) struct Ctx<'a, S: TraceSink> {
    pub chip: &'a mut Chip<S>,
    pub timers: &'a mut Timers,
    pub lanes: &'a mut Lanes,
    pub heap: &'a mut Allocator,
    pub host: &'a mut HostMemory,
}

/// A bad field of a task.
pub(crate) fn bad(
    at: TaskRef,
    kind: &'static str,
    field: &'static str,
    message: String,
) -> DeviceError {
    DeviceError::BadTask {
        task: at,
        kind,
        field,
        message,
    }
}

impl<S: TraceSink> Ctx<'_, S> {
    /// Current device time.
    pub(crate) fn now(&self) -> Tick {
        self.chip.now()
    }

    /// Sets a firmware timer at `at` (or now, when `at` has passed).
    pub(crate) fn timer(&mut self, at: Tick, fw: Fw) {
        self.timers.set(self.chip, at, fw);
    }

    /// Starts a transfer through the chip's memory system (see [`Timers::transfer`]).
    pub(crate) fn transfer(&mut self, x: Xfer, bytes: u64, cap: u64, write: bool) {
        self.timers.transfer(self.chip, x, bytes, cap, write);
    }

    /// Checks that a task's device range lies in device memory.
    pub(crate) fn check_range(
        &self,
        at: TaskRef,
        kind: &'static str,
        field: &'static str,
        addr: u64,
        len: u64,
    ) -> Result<(), DeviceError> {
        self.chip.memory().check(addr, len).map_err(|e| {
            bad(
                at,
                kind,
                field,
                format!(
                    "device range [{addr:#x}, +{len}) is outside device memory ({} bytes)",
                    e.capacity
                ),
            )
        })
    }

    /// Reads a task's `u32` operand from device memory.
    pub(crate) fn read_u32(
        &mut self,
        at: TaskRef,
        kind: &'static str,
        field: &'static str,
        addr: u64,
    ) -> Result<u32, DeviceError> {
        self.check_range(at, kind, field, addr, 4)?;
        let mut b = [0u8; 4];
        self.chip.read_mem(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}
