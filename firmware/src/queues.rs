//! Data queues: the device queues GetNext pops, each item a list of tensors in device staging
//! buffers, and the items whose copies to the device are still in flight. It counts copies and
//! traces queue depths; the copies themselves are the copy engines', and who waits on a queue is
//! the streams'.

use std::collections::{BTreeMap, VecDeque};

use gearsim_traces::TraceSink;

use crate::context::Ctx;
use crate::error::DeviceError;

/// A tensor of a queue item on the device: (staging buffer, bytes, dims).
pub(crate) type Staged = (u64, u64, Vec<i64>);

struct DataQueue {
    capacity: u32,
    /// Items whose copies to the device are still in flight.
    pending: u32,
    /// Items on the device, oldest first.
    ready: VecDeque<Vec<Staged>>,
}

impl DataQueue {
    fn depth(&self) -> usize {
        self.ready.len() + self.pending as usize
    }
}

/// An item whose tensors are being copied to the device.
struct StagedItem {
    queue: u32,
    remaining: u32,
    tensors: Vec<Staged>,
}

/// Every data queue and the items on their way to one.
#[derive(Default)]
pub(crate) struct Queues {
    list: Vec<DataQueue>,
    items: BTreeMap<u32, StagedItem>,
    next_item: u32,
}

impl Queues {
    /// Adds an empty queue holding up to `capacity` items; returns its id.
    pub(crate) fn add(&mut self, capacity: u32) -> u32 {
        self.list.push(DataQueue {
            capacity,
            pending: 0,
            ready: VecDeque::new(),
        });
        self.list.len() as u32 - 1
    }

    /// Items queue `q` holds (on the device or still being copied there).
    pub(crate) fn len(&self, q: u32) -> Option<u32> {
        self.list
            .get(q as usize)
            .map(|d| d.pending + d.ready.len() as u32)
    }

    /// Checks that queue `q` exists and has room for one more item.
    pub(crate) fn check_room(&self, q: u32) -> Result<(), DeviceError> {
        let queue = self.list.get(q as usize).ok_or(DeviceError::NoSuch {
            what: "queue",
            id: u64::from(q),
        })?;
        if queue.pending + queue.ready.len() as u32 >= queue.capacity {
            return Err(DeviceError::QueueFull {
                queue: q,
                capacity: queue.capacity,
            });
        }
        Ok(())
    }

    /// Starts an item of queue `q` whose tensors are being copied to `tensors`' staging
    /// buffers; returns its id for [`Queues::copied`].
    pub(crate) fn stage(&mut self, q: u32, tensors: Vec<Staged>) -> u32 {
        self.list[q as usize].pending += 1;
        let item = self.next_item;
        self.next_item += 1;
        self.items.insert(
            item,
            StagedItem {
                queue: q,
                remaining: tensors.len() as u32,
                tensors,
            },
        );
        item
    }

    /// One tensor of `item` reached the device (or, for an item without tensors, the item was
    /// staged); when it was the last, the item is ready and its queue is returned.
    pub(crate) fn copied<S: TraceSink>(&mut self, cx: &mut Ctx<'_, S>, item: u32) -> Option<u32> {
        let it = self.items.get_mut(&item)?;
        it.remaining = it.remaining.saturating_sub(1);
        if it.remaining > 0 && !it.tensors.is_empty() {
            return None;
        }
        let it = self.items.remove(&item)?;
        let q = &mut self.list[it.queue as usize];
        q.pending -= 1;
        q.ready.push_back(it.tensors);
        let depth = q.depth();
        let now = cx.now();
        cx.lanes
            .queue(cx.chip.sink_mut(), it.queue, depth, "ready", now);
        Some(it.queue)
    }

    /// The oldest item on the device of queue `q` (`Err` when there is no such queue).
    pub(crate) fn front(&self, q: u32) -> Result<Option<&[Staged]>, ()> {
        let queue = self.list.get(q as usize).ok_or(())?;
        Ok(queue.ready.front().map(Vec::as_slice))
    }

    /// Removes the oldest item on the device of queue `q` (GetNext took it).
    pub(crate) fn pop<S: TraceSink>(&mut self, cx: &mut Ctx<'_, S>, q: u32) {
        let queue = &mut self.list[q as usize];
        queue.ready.pop_front();
        let depth = queue.depth();
        let now = cx.now();
        cx.lanes.queue(cx.chip.sink_mut(), q, depth, "pop", now);
    }
}
