//! The values of a full run: every core's local buffers, and the pipe instructions whose effect
//! on values is deferred so that independent cores compute them on host threads while the event
//! loop goes on.
//!
//! The timeline never depends on the values a pipe instruction computes: the core plans each
//! instruction (what it touches, what it costs) when it issues, and only the effect on real
//! values is left to do. With more than one host thread those effects are collected, in issue
//! order, into a batch. A batch is handed to the workers when the next instruction would read
//! device memory another core writes in the batch, or when it is [`BATCH_SIZE`] long, and the event loop goes
//! on collecting the next one; one batch is in flight at a time, so batches apply in order, and
//! the event loop's thread runs parts of it too while it waits. Everything that needs values —
//! a scalar load or store, an instruction that reads its own configuration from memory, the
//! firmware or host touching device memory — first waits for the effects it depends on.
//!
//! Within a batch each core's instructions run in order on one thread, and the result is the
//! sequential one: each core's local buffers are its own; every device-memory read sees the
//! memory as the batch began with the core's own earlier writes of the batch laid over it,
//! which is what it would have seen because no other core writes a byte it reads earlier in
//! the batch; and the writes, staged per core, are applied in issue order when the batch is
//! collected, so a later write of the same byte wins as it would have. So outputs and traces
//! do not depend on the number of host threads. A fault found while a batch is applied (a
//! worker's panic; range, alignment and operand faults are all found earlier, when the core
//! plans the instruction) is the first in issue order, and only the writes issued before it
//! are applied, as a sequential run would leave memory.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use gearsim_isa::{Instruction, Pipe};

use crate::core::buffers::Buffers;
use crate::exec::{Access, Operands, PipeOp, Plan};
use crate::memory::{DeviceMemory, GmValues, OutOfRange, RangeSet, Snapshot};
use crate::stop::{Buffer, StopReason};

/// Instructions after which a batch is handed to the workers even without a conflict: large
/// enough that handing over (a message per core) is cheap beside the work, small enough that
/// the workers start while the event loop is still issuing.
const BATCH_SIZE: usize = 4096;

/// Bursts of a strided access tracked one by one at most: a longer run is tracked as its
/// extent (which can only close a batch early, never let a conflict through).
const BURSTS_TRACKED: u64 = 256;

/// A pipe instruction whose effect on values is still to be applied.
#[derive(Debug, Clone, Copy)]
struct Deferred {
    instr: Instruction,
    ops: Operands,
    pipe: Pipe,
    pc: u32,
    /// Place in issue order over all cores (the first fault in this order is the one reported).
    seq: u64,
}

/// One core's device-memory writes during a batch: the bytes, and where each run goes.
#[derive(Debug, Default)]
struct Staged {
    bytes: Vec<u8>,
    /// Issue-order place of the writing instruction, address, offset in `bytes`, length.
    runs: Vec<(u64, u64, usize, usize)>,
    /// The extent `[lo, hi)` of the runs (so that a read the core's own writes miss skips them).
    extent: (u64, u64),
    /// The place of the instruction executing now.
    seq: u64,
}

/// A core's view of device memory while its part of a batch runs on a worker.
struct StagedMemory<'a> {
    mem: &'a Snapshot,
    staged: &'a mut Staged,
}

impl GmValues for StagedMemory<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        // No other core writes a byte this core reads earlier in the batch (such a read closes
        // the batch first), so the memory as the batch began holds the value, unless this core
        // wrote it itself: its own runs go over it, in the order it wrote them.
        self.mem.read(addr, buf)?;
        let end = addr + buf.len() as u64;
        if addr < self.staged.extent.1 && end > self.staged.extent.0 {
            for &(_, at, off, len) in &self.staged.runs {
                let (s, e) = (at.max(addr), (at + len as u64).min(end));
                if s < e {
                    let from = off + (s - at) as usize;
                    buf[(s - addr) as usize..(e - addr) as usize]
                        .copy_from_slice(&self.staged.bytes[from..from + (e - s) as usize]);
                }
            }
        }
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        self.mem.check(addr, data.len() as u64)?;
        let off = self.staged.bytes.len();
        self.staged.bytes.extend_from_slice(data);
        self.staged
            .runs
            .push((self.staged.seq, addr, off, data.len()));
        let (lo, hi) = &mut self.staged.extent;
        if *lo >= *hi {
            (*lo, *hi) = (addr, addr + data.len() as u64);
        } else {
            (*lo, *hi) = ((*lo).min(addr), (*hi).max(addr + data.len() as u64));
        }
        Ok(())
    }

    fn capacity(&self) -> u64 {
        self.mem.capacity()
    }
}

/// One core's part of a batch, sent to a worker and sent back done.
struct Part {
    core: u32,
    bufs: Buffers,
    work: Vec<Deferred>,
    staged: Staged,
    /// Device memory as the batch began (dropped before the part is sent back, so that the
    /// memory can be written again without a copy).
    mem: Option<Snapshot>,
    /// The first fault, with its place in issue order.
    fault: Option<(u64, StopReason)>,
    /// The instruction being applied (place, pipe, pc), for the report of a worker's panic.
    current: (u64, Pipe, u32),
}

impl Part {
    fn run(&mut self) {
        let Some(mem) = self.mem.take() else {
            return;
        };
        let mut view = StagedMemory {
            mem: &mem,
            staged: &mut self.staged,
        };
        for d in self.work.drain(..) {
            view.staged.seq = d.seq;
            self.current = (d.seq, d.pipe, d.pc);
            let op = PipeOp::of(&d.instr).unwrap_or(PipeOp::Sync);
            if let Err(f) = op.execute(&d.ops, &mut self.bufs, &mut view) {
                self.fault = Some((d.seq, f.stop_reason(self.core, d.pipe, d.pc)));
                break;
            }
        }
        self.work.clear();
    }
}

/// The worker threads: parts go in on one channel, come back on another. The event loop's
/// thread takes parts from the same channel while it waits for a batch, so it is one of the
/// host threads computing values.
struct Pool {
    parts: Option<Sender<Part>>,
    inbox: Arc<Mutex<Receiver<Part>>>,
    /// Behind a lock only so that a chip can be shared between threads (it is used by one).
    done: Mutex<Receiver<Part>>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `workers` threads.
    fn new(workers: usize) -> Pool {
        let (parts, inbox) = channel::<Part>();
        let (outbox, done) = channel::<Part>();
        let inbox = Arc::new(Mutex::new(inbox));
        let workers = (0..workers)
            .map(|_| {
                let inbox = Arc::clone(&inbox);
                let outbox = outbox.clone();
                std::thread::spawn(move || {
                    loop {
                        // The lock is held only to take the next part; a poisoned lock or a
                        // closed channel ends the worker.
                        let next = match inbox.lock() {
                            Ok(rx) => rx.recv(),
                            Err(_) => return,
                        };
                        let Ok(mut part) = next else { return };
                        // A panic is a simulator bug: it becomes the part's fault, so the
                        // event loop reports it instead of waiting for a part that never
                        // comes back.
                        let run = std::panic::AssertUnwindSafe(|| part.run());
                        if std::panic::catch_unwind(run).is_err() {
                            let (seq, pipe, pc) = part.current;
                            part.work.clear();
                            part.fault = Some((
                                seq,
                                StopReason::IllegalInstruction {
                                    core: part.core,
                                    pipe,
                                    pc,
                                    reason: "the simulator failed while computing this \
                                             instruction's values (an internal error; please \
                                             report it)"
                                        .into(),
                                },
                            ));
                        }
                        if outbox.send(part).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Pool {
            parts: Some(parts),
            inbox,
            done: Mutex::new(done),
            workers,
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the channel ends every worker once it is idle.
        self.parts = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} workers)", self.workers.len())
    }
}

/// The device memory a batch reads (each access's extent: consulted only before a direct
/// store) and writes (each burst, with the core that writes it: consulted before every read).
#[derive(Debug, Default)]
struct Footprint {
    reads: RangeSet,
    writes: Writers,
}

impl Footprint {
    fn clear(&mut self) {
        *self = Footprint::default();
    }

    /// Whether `core` reading `a` in this batch would miss a value another core writes
    /// earlier in the batch (its own writes it sees: [`StagedMemory`]).
    fn misses_a_write(&self, core: u32, a: &Access) -> bool {
        self.writes.other_than_in_bursts(core, a)
    }

    fn add(&mut self, core: u32, a: &Access) {
        if a.write {
            self.writes.insert_bursts(a, core);
        } else {
            self.reads.insert(a.start, a.end());
        }
    }

    /// Whether the batch writes anything of `[s, e)`, or (`store`) reads or writes it.
    fn touches(&self, s: u64, e: u64, store: bool) -> bool {
        self.writes.any(s, e) || (store && self.reads.intersects(s, e))
    }
}

/// Disjoint byte ranges, each with the core that writes it ([`Writers::SEVERAL`] when more
/// than one does). Ranges of one core that touch are merged; ranges of different cores are
/// merged (as several) only where they overlap, so that cores writing side by side stay apart.
#[derive(Debug, Default)]
struct Writers {
    /// Start: end, writer.
    ranges: BTreeMap<u64, (u64, u32)>,
}

impl Writers {
    const SEVERAL: u32 = u32::MAX;

    fn insert(&mut self, start: u64, end: u64, core: u32) {
        if start >= end {
            return;
        }
        // The common case in one lookup: a core extending (or writing inside) its own range
        // that starts at or below `start`, with no other range starting up to `end` (so none to
        // absorb, and none of this core touching on the right, as the general case would merge):
        // the last range starting up to `end` starts at or below `start`.
        if let Some((&s, (e, w))) = self.ranges.range_mut(..=end).next_back()
            && s <= start
            && *w == core
            && *e >= start
        {
            *e = (*e).max(end);
            return;
        }
        self.insert_absorbing(start, end, core);
    }

    /// [`Writers::insert`] of every burst of a write ([`bursts`]). Bursts apart from one
    /// another (a stride longer than the burst) landing where no range is, none overlapping or
    /// touching their extent, are each a range of their own, as inserting them one at a time
    /// would leave them: they go in without the search for ranges to absorb (a strided write
    /// has 25 bursts on average in a ResNet).
    fn insert_bursts(&mut self, a: &Access, core: u32) {
        let (start, end) = (a.start, a.end());
        let apart = bursts_apart(a) && a.count > 1;
        let clear = || {
            self.ranges
                .range(..=end)
                .next_back()
                .is_none_or(|(_, &(e, _))| e < start)
        };
        if apart && clear() {
            for (s, e) in bursts(a) {
                self.ranges.insert(s, (e, core));
            }
            return;
        }
        for (s, e) in bursts(a) {
            self.insert(s, e, core);
        }
    }

    /// [`Writers::insert`] in general: absorbing every range it overlaps or touches.
    fn insert_absorbing(&mut self, mut start: u64, mut end: u64, core: u32) {
        let mut writer = core;
        // Every range that overlaps [start, end), or touches it and has the same writer, is
        // absorbed; a range of another core that only touches it is stepped over.
        let mut below = end;
        while let Some((&s, &(e, w))) = self.ranges.range(..=below).next_back() {
            if e < start || (e == start && w != core) {
                break;
            }
            if s == end && w != core {
                // Touches on the right with another writer: keep it, look below it.
                if s == 0 {
                    break;
                }
                below = s - 1;
                continue;
            }
            self.ranges.remove(&s);
            if w != core && s < end && e > start {
                writer = Writers::SEVERAL;
            }
            start = start.min(s);
            end = end.max(e);
            below = end;
        }
        self.ranges.insert(start, (end, writer));
    }

    /// Whether two cores write a byte in common.
    fn several(&self) -> bool {
        self.ranges.values().any(|&(_, w)| w == Writers::SEVERAL)
    }

    /// Whether a core other than `core` writes a byte of `[start, end)`.
    fn other_than(&self, core: u32, start: u64, end: u64) -> bool {
        self.overlapping(start, end).any(|w| w != core)
    }

    /// Whether a core other than `core` writes a byte of a burst of `a` ([`bursts`]): the
    /// ranges over the bursts' extent are walked once, each tested against the bursts by
    /// arithmetic, instead of a search per burst.
    fn other_than_in_bursts(&self, core: u32, a: &Access) -> bool {
        let (start, end) = (a.start, a.end());
        if !bursts_apart(a) {
            return self.other_than(core, start, end);
        }
        // At most one range starts below `start` and reaches into the extent (they are
        // disjoint); the others start inside it.
        let below = self.ranges.range(..start).next_back();
        let inside = self.ranges.range(start..end);
        below.into_iter().chain(inside).any(|(&s, &(e, w))| {
            // Burst i covers [i stride, i stride + burst) from `start`; the first to end past
            // the range's first byte must begin before its end.
            let (lo, hi) = (s.max(start) - start, e.min(end).saturating_sub(start));
            let first = if lo < a.burst {
                0
            } else {
                (lo - a.burst) / a.stride + 1
            };
            w != core && lo < hi && first < a.count && first * a.stride < hi
        })
    }

    /// Whether any core writes a byte of `[start, end)`.
    fn any(&self, start: u64, end: u64) -> bool {
        self.overlapping(start, end).next().is_some()
    }

    /// The writers of the ranges that overlap `[start, end)`.
    fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = u32> + '_ {
        let end = end.max(start);
        self.ranges
            .range(..end)
            .rev()
            .take_while(move |(_, (e, _))| *e > start)
            .map(|(_, (_, w))| *w)
    }
}

/// Whether an access's bursts are tracked one by one: apart from one another (a stride
/// longer than the burst) and not too many ([`bursts`]).
fn bursts_apart(a: &Access) -> bool {
    a.stride > a.burst && a.count <= BURSTS_TRACKED
}

/// The byte ranges `[start, end)` of an access's bursts: one range when they touch, and the
/// extent when they are too many (which can only close a batch early).
fn bursts(a: &Access) -> impl Iterator<Item = (u64, u64)> + '_ {
    let whole = !bursts_apart(a);
    let n = if whole { 1 } else { a.count };
    (0..n).map(move |i| {
        if whole {
            (a.start, a.end())
        } else {
            let s = a.start + i * a.stride;
            (s, s + a.burst)
        }
    })
}

/// Every core's buffer values and the deferred work.
#[derive(Debug)]
pub(crate) struct Values {
    /// Per core its buffers; `None` while its part of the batch in flight has them.
    bufs: Vec<Option<Buffers>>,
    /// Per core, its deferred instructions of the batch being collected, in issue order.
    pending: Vec<Vec<Deferred>>,
    /// What the batch being collected touches.
    collecting: Footprint,
    /// What the batch in flight touches.
    flying: Footprint,
    queued: usize,
    /// Parts of the batch in flight not yet back.
    in_flight: usize,
    next_seq: u64,
    /// Staging areas and work lists not in use (reused so batches do not allocate).
    spare_staged: Vec<Staged>,
    spare_work: Vec<Vec<Deferred>>,
    threads: usize,
    pool: Option<Pool>,
}

impl Values {
    /// Values for cores with these buffers, computed on the event loop's thread.
    pub(crate) fn new(bufs: Vec<Buffers>) -> Values {
        let n = bufs.len();
        Values {
            bufs: bufs.into_iter().map(Some).collect(),
            pending: (0..n).map(|_| Vec::new()).collect(),
            collecting: Footprint::default(),
            flying: Footprint::default(),
            queued: 0,
            in_flight: 0,
            next_seq: 0,
            spare_staged: Vec::new(),
            spare_work: Vec::new(),
            threads: 1,
            pool: None,
        }
    }

    /// Worker threads that compute values (1: every effect is applied on the event loop's
    /// thread when its instruction issues, as a sequential simulator would).
    pub(crate) fn set_threads(&mut self, threads: usize) {
        self.threads = threads.max(1);
    }

    /// Applies the effect of pipe instruction `instr` of `core` (pipe `pipe`, pc `pc`), which
    /// the core planned as `plan`: now, or in a batch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply(
        &mut self,
        core: u32,
        instr: Instruction,
        ops: &Operands,
        plan: &Plan,
        pipe: Pipe,
        pc: u32,
        mem: &mut DeviceMemory,
    ) -> Result<(), StopReason> {
        let op = PipeOp::of(&instr).unwrap_or(PipeOp::Sync);
        if self.threads == 1 || op.reads_own_configuration() {
            // It may read any core's results: everything deferred goes first.
            self.settle(mem)?;
            let bufs = self.buffers(core, mem)?;
            return op
                .execute(ops, bufs, mem)
                .map_err(|f| f.stop_reason(core, pipe, pc));
        }
        let c = core as usize;
        let gm = || {
            plan.accesses()
                .iter()
                .filter(|a| a.buffer == Buffer::Gm && a.count > 0 && a.burst > 0)
        };
        if gm().any(|a| !a.write && self.collecting.misses_a_write(core, a)) {
            self.hand_over(mem)?;
        }
        for a in gm() {
            self.collecting.add(core, a);
        }
        self.pending[c].push(Deferred {
            instr,
            ops: *ops,
            pipe,
            pc,
            seq: self.next_seq,
        });
        self.next_seq += 1;
        self.queued += 1;
        if self.queued >= BATCH_SIZE {
            self.hand_over(mem)?;
        }
        Ok(())
    }

    /// The buffers of `core` with every effect on them applied (for a scalar load or store, or
    /// an instruction applied when it issues).
    pub(crate) fn buffers(
        &mut self,
        core: u32,
        mem: &mut DeviceMemory,
    ) -> Result<&mut Buffers, StopReason> {
        let c = core as usize;
        if !self.pending[c].is_empty() || self.bufs[c].is_none() {
            self.settle(mem)?;
        }
        match self.bufs[c].as_mut() {
            Some(b) => Ok(b),
            None => unreachable!("a settled batch gives every core its buffers back"),
        }
    }

    /// Applies the effects that touch `[addr, addr + len)` of device memory, before it is read
    /// (or, `store`, written) directly. A store also waits for the batch in flight, whose
    /// workers still read the memory as it began.
    pub(crate) fn settle_range(
        &mut self,
        addr: u64,
        len: u64,
        store: bool,
        mem: &mut DeviceMemory,
    ) -> Result<(), StopReason> {
        let end = addr.saturating_add(len);
        if store {
            self.collect(mem)?;
        }
        if self.collecting.touches(addr, end, store) || self.flying.touches(addr, end, store) {
            self.settle(mem)?;
        }
        Ok(())
    }

    /// Applies every deferred effect. A fault is the first in issue order.
    pub(crate) fn settle(&mut self, mem: &mut DeviceMemory) -> Result<(), StopReason> {
        if self.queued == 0 && self.in_flight == 0 {
            return Ok(());
        }
        self.hand_over(mem)?;
        self.collect(mem)
    }

    /// Hands the batch being collected to the workers (after the one in flight is back).
    fn hand_over(&mut self, mem: &mut DeviceMemory) -> Result<(), StopReason> {
        self.collect(mem)?;
        if self.queued == 0 {
            return Ok(());
        }
        self.queued = 0;
        std::mem::swap(&mut self.collecting, &mut self.flying);
        self.collecting.clear();
        let threads = self.threads;
        let pool = self.pool.get_or_insert_with(|| Pool::new(threads - 1));
        let Some(sender) = pool.parts.as_ref() else {
            unreachable!("the pool's channel is open until it is dropped")
        };
        let snapshot = mem.snapshot();
        // The longest parts go first, so that the last ones taken, by a worker or by the event
        // loop's thread while it waits, are short and the threads finish close together.
        let mut order: Vec<usize> = (0..self.pending.len())
            .filter(|&c| !self.pending[c].is_empty())
            .collect();
        order.sort_by_key(|&c| std::cmp::Reverse(self.pending[c].len()));
        for c in order {
            let spare = self.spare_work.pop().unwrap_or_default();
            let work = std::mem::replace(&mut self.pending[c], spare);
            let Some(bufs) = self.bufs[c].take() else {
                unreachable!("no part is in flight when a batch is handed over")
            };
            let part = Part {
                core: c as u32,
                bufs,
                work,
                staged: self.spare_staged.pop().unwrap_or_default(),
                mem: Some(snapshot.clone()),
                fault: None,
                current: (0, Pipe::S, 0),
            };
            if sender.send(part).is_err() {
                unreachable!("workers end only when the pool is dropped")
            }
            self.in_flight += 1;
        }
        Ok(())
    }

    /// Waits for the batch in flight and applies its device-memory writes.
    fn collect(&mut self, mem: &mut DeviceMemory) -> Result<(), StopReason> {
        if self.in_flight == 0 {
            return Ok(());
        }
        let mut back = Vec::with_capacity(self.in_flight);
        while self.in_flight > 0 {
            let Some(pool) = self.pool.as_ref() else {
                unreachable!("parts are in flight only through the pool")
            };
            // Run a part no worker has taken yet, or wait for one a worker has. A worker waits
            // for parts holding the inbox's lock, so the lock is only tried: when it is held,
            // that worker is taking a part and will send it back.
            let waiting = pool.inbox.try_lock().ok().and_then(|rx| rx.try_recv().ok());
            let part = match waiting {
                Some(mut part) => {
                    part.run();
                    part
                }
                None => match pool.done.lock().ok().and_then(|rx| rx.recv().ok()) {
                    Some(part) => part,
                    None => {
                        unreachable!("the workers hold the channel open while parts are in flight")
                    }
                },
            };
            self.in_flight -= 1;
            back.push(part);
        }
        // The first fault in issue order ends the run: a sequential run would have stopped
        // there, so no core's write issued after it is applied (the faulting instruction's
        // own writes before its fault are, as they would have been).
        let mut fault: Option<(u64, StopReason)> = None;
        for part in &mut back {
            if let Some((seq, reason)) = part.fault.take()
                && fault.as_ref().is_none_or(|(s, _)| seq < *s)
            {
                fault = Some((seq, reason));
            }
        }
        let last = fault.as_ref().map_or(u64::MAX, |(seq, _)| *seq);
        // Every part has dropped its snapshot, so these writes change the pages in place.
        // They go in issue order when two cores wrote the same byte in the batch; otherwise
        // the order between cores cannot matter, and each core's runs are in order already.
        back.sort_by_key(|p| p.core);
        let mut runs: Vec<(u64, u64, &[u8])> = back
            .iter()
            .flat_map(|p| {
                p.staged
                    .runs
                    .iter()
                    .filter(|run| run.0 <= last)
                    .map(|&(seq, addr, off, len)| (seq, addr, &p.staged.bytes[off..off + len]))
            })
            .collect();
        if self.flying.writes.several() {
            runs.sort_by_key(|r| r.0);
        }
        // In range: checked when staged.
        mem.write_runs(runs.iter().map(|&(_, addr, data)| (addr, data)));
        for mut part in back {
            part.staged.runs.clear();
            part.staged.bytes.clear();
            part.staged.extent = (0, 0);
            self.bufs[part.core as usize] = Some(part.bufs);
            self.spare_staged.push(part.staged);
            self.spare_work.push(part.work);
        }
        self.flying.clear();
        match fault {
            Some((_, reason)) => Err(reason),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Values, Writers, bursts};
    use crate::CoreKind;
    use crate::config::ChipConfig;
    use crate::core::buffers::Buffers;
    use crate::exec::Access;
    use crate::exec::{Mask, Operands, PipeOp, Plan};
    use crate::memory::DeviceMemory;
    use crate::stop::Buffer;
    use crate::stop::StopReason;
    use gearsim_isa::{Dma, FMatrix, Instruction, Pipe, Reg};

    /// A fault found while a batch is applied leaves device memory as a run on one thread
    /// leaves it: the writes issued before the faulting instruction are applied, those issued
    /// after it (by any core) are not. The fault here is one a plan cannot see (its plan is
    /// made by hand without the access), as a data-dependent fault would be.
    #[test]
    fn a_fault_in_a_batch_applies_only_the_writes_issued_before_it() {
        let cfg = ChipConfig::preset("ascend910").unwrap();
        let reg = |i| Reg::new(i).unwrap();
        let copy = Instruction::CopyUbToGm(Dma {
            dst: reg(1),
            src: reg(2),
            nburst: 1,
            len: 1,
            src_gap: 0,
            dst_gap: 0,
        });
        let ops = |gm: u64| Operands {
            regs: [gm, 0, 0, 0],
            mask: Mask::FULL,
            fmatrix: FMatrix::RESET,
        };
        let Some(op) = PipeOp::of(&copy) else {
            unreachable!("a copy is a pipe instruction")
        };
        let run = |threads: usize| -> (StopReason, Vec<u8>) {
            let mut mem = DeviceMemory::new(4096);
            let mut values = Values::new(vec![Buffers::new(&cfg, CoreKind::Coupled); 2]);
            values.set_threads(threads);
            for core in 0..2u32 {
                let bufs = values.buffers(core, &mut mem).unwrap();
                bufs.ub_mut()[..32].fill(0xa0 + core as u8);
            }
            // (core, GM address): core 0 writes, core 1 writes past the end, core 0 and core 1
            // write again.
            let issued = [(0u32, 0u64), (1, 8192), (0, 64), (1, 128)];
            let mut stop = None;
            for (core, gm) in issued {
                let o = ops(gm);
                let plan = if gm < 4096 {
                    op.plan(&o, &cfg).unwrap()
                } else {
                    Plan::new(1, 0, &[])
                };
                if let Err(reason) = values.apply(core, copy, &o, &plan, Pipe::Mte3, 7, &mut mem) {
                    stop = Some(reason);
                    break;
                }
            }
            let stop = match stop {
                Some(reason) => reason,
                None => values.settle(&mut mem).unwrap_err(),
            };
            let mut bytes = vec![0u8; 256];
            mem.read(0, &mut bytes).unwrap();
            (stop, bytes)
        };
        let (stop, bytes) = run(1);
        assert!(
            matches!(stop, StopReason::MemoryFault { core: 1, pc: 7, .. }),
            "{stop:?}"
        );
        assert!(bytes[..32].iter().all(|&b| b == 0xa0));
        assert!(bytes[32..].iter().all(|&b| b == 0));
        for threads in [2, 3] {
            let (s, b) = run(threads);
            assert_eq!(format!("{s:?}"), format!("{stop:?}"), "{threads} threads");
            assert_eq!(b, bytes, "{threads} threads");
        }
    }

    /// The one-lookup case of `Writers::insert` leaves the ranges the general case would, for
    /// random writes of three cores over a small space (so that ranges touch, overlap, nest).
    #[test]
    fn extending_a_range_in_place_matches_absorbing() {
        let mut next = crate::testing::draws_below(99);
        for _ in 0..200 {
            let (mut fast, mut general) = (Writers::default(), Writers::default());
            for _ in 0..40 {
                let start = u64::from(next(120));
                let end = start + u64::from(next(24));
                let core = next(3);
                fast.insert(start, end, core);
                if start < end {
                    general.insert_absorbing(start, end, core);
                }
                assert_eq!(
                    fast.ranges, general.ranges,
                    "after [{start}, {end}) of core {core}"
                );
            }
        }
    }

    /// A random GM access of 1 to 6-byte bursts: starting below `starts`, with gaps below
    /// `gaps` between them, and 1 to `counts` of them.
    fn strided(
        next: &mut impl FnMut(u32) -> u32,
        [starts, gaps, counts]: [u32; 3],
        write: bool,
    ) -> Access {
        let burst = 1 + u64::from(next(6));
        Access {
            buffer: Buffer::Gm,
            start: u64::from(next(starts)),
            burst,
            stride: burst + u64::from(next(gaps)),
            count: 1 + u64::from(next(counts)),
            write,
        }
    }

    /// A strided write's bursts inserted at once leave the ranges that inserting them one at
    /// a time leaves, whether their extent is clear (the quick path) or meets other ranges.
    #[test]
    fn bursts_inserted_at_once_match_one_at_a_time() {
        let mut next = crate::testing::draws_below(7);
        let mut quick = 0;
        for _ in 0..300 {
            let (mut at_once, mut one_by_one) = (Writers::default(), Writers::default());
            for _ in 0..12 {
                let a = strided(&mut next, [400, 4, 5], true);
                let core = next(3);
                let clear = at_once
                    .ranges
                    .range(..=a.end())
                    .next_back()
                    .is_none_or(|(_, &(e, _))| e < a.start);
                quick += usize::from(clear && a.stride > a.burst && a.count > 1);
                at_once.insert_bursts(&a, core);
                for (s, e) in bursts(&a) {
                    one_by_one.insert(s, e, core);
                }
                assert_eq!(
                    at_once.ranges, one_by_one.ranges,
                    "after {a:?} of core {core}"
                );
            }
        }
        assert!(quick > 300, "the quick path ran {quick} times");
    }

    /// Walking the ranges over a read's bursts finds a byte of another core's exactly when a
    /// search per burst does, for random writes and strided reads.
    #[test]
    fn another_cores_write_in_a_reads_bursts_is_found_as_per_burst() {
        let mut next = crate::testing::draws_below(31);
        let (mut found, mut missed) = (0, 0);
        for _ in 0..300 {
            let mut w = Writers::default();
            for _ in 0..8 {
                let start = u64::from(next(300));
                w.insert(start, start + 1 + u64::from(next(8)), next(3));
            }
            for _ in 0..20 {
                let a = strided(&mut next, [300, 12, 8], false);
                let core = next(3);
                let want = bursts(&a).any(|(s, e)| w.other_than(core, s, e));
                assert_eq!(
                    w.other_than_in_bursts(core, &a),
                    want,
                    "{a:?} of core {core}"
                );
                if want { found += 1 } else { missed += 1 }
            }
        }
        assert!(found > 500 && missed > 500, "{found} found, {missed} not");
    }

    /// Cores writing side by side stay apart (each reads its own range freely), a byte two
    /// cores write is several cores', and one core's touching ranges merge.
    #[test]
    fn writers_keep_each_cores_ranges_apart() {
        let mut w = Writers::default();
        w.insert(0, 10, 1);
        w.insert(10, 20, 2);
        assert!(!w.other_than(1, 0, 10) && !w.other_than(2, 10, 20));
        assert!(w.other_than(1, 9, 11) && w.other_than(2, 9, 11));
        assert!(w.other_than(1, 12, 13) && w.other_than(2, 0, 1));
        assert!(!w.any(20, 30) && w.any(19, 30) && !w.several());
        w.insert(30, 40, 1);
        w.insert(40, 50, 1);
        assert_eq!(w.ranges.get(&30), Some(&(50, 1)));
        w.insert(5, 15, 3);
        assert!(w.several());
        // The overlapped ranges became one written by several cores: conservative for all.
        assert!(w.other_than(1, 0, 1) && w.other_than(2, 19, 20) && w.other_than(3, 7, 8));
        assert!(!w.other_than(1, 30, 50));
    }
}
