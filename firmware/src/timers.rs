//! Firmware timers and transfer tokens: the closed lists of what the firmware waits for on the
//! chip's event queue — its own timers ([`Fw`]) and the transfers it started through the shared
//! memory system ([`Xfer`]) — and the tokens that name them there. It does not know what a
//! stream, a job or a copy is beyond their ids, and owns no time of its own: every timer is a
//! chip timer.

use std::collections::BTreeMap;

use gearsim_sim::{Chip, Tick};
use gearsim_traces::TraceSink;

/// A firmware timer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fw {
    /// The stream may fetch its next task.
    Step { stream: u32 },
    /// A fetched task begins executing.
    Start { stream: u32, index: u32 },
    /// A task ends now.
    Done { stream: u32, index: u32 },
    /// An AI CPU job finished starting: its memory phase begins.
    AiCpuLaunched { job: u32 },
    /// An AI CPU job finished computing.
    AiCpuComputed { job: u32 },
    /// A PCIe job's latency elapsed: its data starts to move.
    PcieData { job: u32 },
    /// A GetNext waited as long as it may.
    QueueTimeout { stream: u32, index: u32 },
    /// The host's own work (an API call's cost) ends: control returns to the host.
    HostWake,
}

/// What a transfer through the shared memory system is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Xfer {
    /// The memory phase of an AI CPU job.
    AiCpu(u32),
    /// The data of a PCIe job.
    Pcie(u32),
    /// An SDMA job (a device-to-device copy or a memset).
    Sdma(u32),
}

/// `n` nanoseconds (saturating).
pub(crate) fn ns(n: u64) -> Tick {
    Tick(n.saturating_mul(1000))
}

/// The firmware's timers and transfers in flight on the chip, by token. Timer and transfer
/// tokens count up from 1 separately, in the order they are set, so the chip's event queue sees
/// the same keys in the same order on every run.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    timers: BTreeMap<u64, Fw>,
    next_token: u64,
    transfers: BTreeMap<u64, Xfer>,
    next_transfer: u64,
}

impl Timers {
    /// Sets a chip timer for `fw` at `at` (or now, when `at` has passed).
    pub(crate) fn set<S: TraceSink>(&mut self, chip: &mut Chip<S>, at: Tick, fw: Fw) {
        let at = at.max(chip.now());
        self.next_token += 1;
        self.timers.insert(self.next_token, fw);
        // `at` is never in the past, so the chip accepts it.
        let _ = chip.set_timer(at, self.next_token);
    }

    /// Starts a transfer of `bytes` through the chip's memory system at up to `cap` bytes per
    /// second (`write`: into device memory).
    pub(crate) fn transfer<S: TraceSink>(
        &mut self,
        chip: &mut Chip<S>,
        x: Xfer,
        bytes: u64,
        cap: u64,
        write: bool,
    ) {
        self.next_transfer += 1;
        self.transfers.insert(self.next_transfer, x);
        chip.start_transfer(self.next_transfer, bytes, cap, write);
    }

    /// The timer a chip timer token names (once).
    pub(crate) fn fired(&mut self, token: u64) -> Option<Fw> {
        self.timers.remove(&token)
    }

    /// The transfer a chip transfer token names (once).
    pub(crate) fn finished(&mut self, token: u64) -> Option<Xfer> {
        self.transfers.remove(&token)
    }
}
