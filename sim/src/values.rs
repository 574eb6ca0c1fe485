//! The values of a full run: every core's local buffers, and the pipe instructions whose effect
//! on values is deferred so that independent cores compute them on host threads while the event
//! loop goes on.
//!
//! The timeline never depends on the values a pipe instruction computes: the core plans each
//! instruction (what it touches, what it costs) when it issues, and only the effect on real
//! values is left to do. With more than one host thread those effects are collected, in issue
//! order, into a batch. A batch is handed to the workers when the next instruction would read
//! device memory the batch writes, or when it is [`BATCH_SIZE`] long, and the event loop goes
//! on collecting the next one; one batch is in flight at a time, so batches apply in order, and
//! the event loop's thread runs parts of it too while it waits. Everything that needs values —
//! a scalar load or store, an instruction that reads its own configuration from memory, the
//! firmware or host touching device memory — first waits for the effects it depends on.
//!
//! Within a batch each core's instructions run in order on one thread, and the result is the
//! sequential one: each core's local buffers are its own; every device-memory read sees the
//! memory as the batch began, which is what it would have seen because no byte it reads is
//! written earlier in the batch; and the writes, staged per core, are applied in issue order
//! when the batch is collected, so a later write of the same byte wins as it would have. So
//! outputs and traces do not depend on the number of host threads.

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
        // No byte a batch reads is written in the same batch (such a read closes the batch
        // first), so the memory as the batch began holds the value.
        self.mem.read(addr, buf)
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        self.mem.check(addr, data.len() as u64)?;
        let off = self.staged.bytes.len();
        self.staged.bytes.extend_from_slice(data);
        self.staged
            .runs
            .push((self.staged.seq, addr, off, data.len()));
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
/// store) and writes (each burst: consulted before every read).
#[derive(Debug, Default)]
struct Footprint {
    reads: RangeSet,
    writes: RangeSet,
}

impl Footprint {
    fn clear(&mut self) {
        *self = Footprint::default();
    }

    /// Whether reading `a` in this batch would miss a value the batch writes first.
    fn misses_a_write(&self, a: &Access) -> bool {
        self.writes.intersects(a.start, a.end())
            && bursts(a).any(|(s, e)| self.writes.intersects(s, e))
    }

    fn add(&mut self, a: &Access) {
        if a.write {
            for (s, e) in bursts(a) {
                self.writes.insert(s, e);
            }
        } else {
            self.reads.insert(a.start, a.end());
        }
    }

    /// Whether the batch writes anything of `[s, e)`, or (`store`) reads or writes it.
    fn touches(&self, s: u64, e: u64, store: bool) -> bool {
        self.writes.intersects(s, e) || (store && self.reads.intersects(s, e))
    }
}

/// The byte ranges `[start, end)` of an access's bursts: one range when they touch, and the
/// extent when they are too many (which can only close a batch early).
fn bursts(a: &Access) -> impl Iterator<Item = (u64, u64)> + '_ {
    let whole = a.stride <= a.burst || a.count > BURSTS_TRACKED;
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
        if gm().any(|a| !a.write && self.collecting.misses_a_write(a)) {
            self.hand_over(mem)?;
        }
        for a in gm() {
            self.collecting.add(a);
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
        for c in 0..self.pending.len() {
            if self.pending[c].is_empty() {
                continue;
            }
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
        // Every part has dropped its snapshot, so these writes change the pages in place.
        // They go in issue order: two cores may write the same byte in one batch.
        back.sort_by_key(|p| p.core);
        let mut runs: Vec<(u64, usize, u64, usize, usize)> = back
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.staged
                    .runs
                    .iter()
                    .map(move |&(seq, addr, off, len)| (seq, i, addr, off, len))
            })
            .collect();
        runs.sort_unstable_by_key(|r| r.0);
        for (_, i, addr, off, len) in runs {
            // In range: checked when staged.
            let _ = mem.write(addr, &back[i].staged.bytes[off..off + len]);
        }
        let mut fault: Option<(u64, StopReason)> = None;
        for mut part in back {
            part.staged.runs.clear();
            part.staged.bytes.clear();
            if let Some((seq, reason)) = part.fault.take()
                && fault.as_ref().is_none_or(|(s, _)| seq < *s)
            {
                fault = Some((seq, reason));
            }
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
