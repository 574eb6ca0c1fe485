//! Device memory (HBM): a sparse, bounds-checked address space whose pages are allocated on
//! first write, plus the record of ranges whose contents a timing-only run did not compute.

use std::collections::BTreeMap;
use std::sync::Arc;

const PAGE_BITS: u32 = 16;
const PAGE: usize = 1 << PAGE_BITS;

/// An access outside device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfRange {
    /// First byte accessed.
    pub addr: u64,
    /// Bytes accessed.
    pub len: u64,
    /// Capacity of device memory.
    pub capacity: u64,
}

/// A range no kernel may touch with a scalar access (a red zone), and what it guards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guard {
    /// First byte.
    pub start: u64,
    /// Bytes.
    pub len: u64,
    /// What touching it means, for the fault report (e.g. "past the end of the 2-argument
    /// block at 0x1000").
    pub what: String,
}

/// The device address space.
#[derive(Debug)]
pub struct DeviceMemory {
    capacity: u64,
    /// Shared with the host threads computing a batch of values, which read it while the
    /// event loop goes on (see `crate::values`); written only when no batch is in flight.
    pages: Arc<Pages>,
    unknown: RangeSet,
    /// Red zones (few: one per directly launched kernel's argument block).
    guards: Vec<Guard>,
}

impl DeviceMemory {
    /// Empty (all-zero) memory of `capacity` bytes.
    pub fn new(capacity: u64) -> DeviceMemory {
        DeviceMemory {
            capacity,
            pages: Arc::default(),
            unknown: RangeSet::default(),
            guards: Vec::new(),
        }
    }

    /// Adds a red zone: a scalar access touching it stops the kernel with a fault naming
    /// `guard.what`.
    pub fn add_guard(&mut self, guard: Guard) {
        self.guards.push(guard);
    }

    /// Removes the red zone starting at `start`.
    pub fn remove_guard(&mut self, start: u64) {
        self.guards.retain(|g| g.start != start);
    }

    /// The red zone `[addr, addr + len)` touches, if any.
    pub fn guard_at(&self, addr: u64, len: u64) -> Option<&Guard> {
        let end = addr.saturating_add(len);
        self.guards
            .iter()
            .find(|g| addr < g.start.saturating_add(g.len) && g.start < end)
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of host memory the allocated pages use.
    pub fn resident_bytes(&self) -> u64 {
        self.pages.0.len() as u64 * PAGE as u64
    }

    /// Checks that `[addr, addr + len)` is inside device memory.
    pub fn check(&self, addr: u64, len: u64) -> Result<(), OutOfRange> {
        check_range(self.capacity, addr, len)
    }

    /// Reads `buf.len()` bytes at `addr`; never-written bytes read as zero.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        self.check(addr, buf.len() as u64)?;
        self.pages.read(addr, buf);
        Ok(())
    }

    /// The values as they are now, for reading on another thread.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot {
            pages: Arc::clone(&self.pages),
            capacity: self.capacity,
        }
    }

    /// The pages, to change. A snapshot still held would make this copy every page, so the
    /// values module drops its snapshots before anything writes.
    fn pages_mut(&mut self) -> &mut Pages {
        Arc::make_mut(&mut self.pages)
    }

    /// Writes `data` at `addr`; the range's contents become known.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        self.check(addr, data.len() as u64)?;
        self.pages_mut().write(addr, data);
        self.unknown.remove(addr, addr + data.len() as u64);
        Ok(())
    }

    /// Writes each `(addr, data)` in order, as [`DeviceMemory::write`] would one by one (each
    /// range already checked); consecutive writes inside one page find it once.
    pub(crate) fn write_runs<'a>(&mut self, runs: impl IntoIterator<Item = (u64, &'a [u8])>) {
        let pages = Arc::make_mut(&mut self.pages);
        let mut last: Option<(u64, &mut Box<[u8; PAGE]>)> = None;
        for (addr, data) in runs {
            self.unknown.remove(addr, addr + data.len() as u64);
            let (key, off) = (addr >> PAGE_BITS, addr as usize & (PAGE - 1));
            if off + data.len() > PAGE {
                last = None;
                pages.write(addr, data);
                continue;
            }
            let page = match last {
                Some((k, page)) if k == key => page,
                _ => pages.0.entry(key).or_insert_with(zero_page),
            };
            page[off..off + data.len()].copy_from_slice(data);
            last = Some((key, page));
        }
    }

    /// Fills `len` bytes at `addr` with `byte`.
    pub fn fill(&mut self, addr: u64, len: u64, byte: u8) -> Result<(), OutOfRange> {
        self.check(addr, len)?;
        let mut done = 0u64;
        while done < len {
            let a = addr + done;
            let off = (a as usize) & (PAGE - 1);
            let n = ((PAGE - off) as u64).min(len - done) as usize;
            if byte == 0 && !self.pages.0.contains_key(&(a >> PAGE_BITS)) {
                done += n as u64;
                continue;
            }
            let page = self
                .pages_mut()
                .0
                .entry(a >> PAGE_BITS)
                .or_insert_with(zero_page);
            page[off..off + n].fill(byte);
            done += n as u64;
        }
        self.unknown.remove(addr, addr + len);
        Ok(())
    }

    /// Marks `[addr, addr + len)` as written by a timing-only run (contents not computed).
    pub(crate) fn mark_unknown(&mut self, addr: u64, len: u64) {
        self.unknown.insert(addr, addr.saturating_add(len));
    }

    /// Whether all of `[addr, addr + len)` (non-empty) is marked as not computed.
    pub(crate) fn all_unknown(&self, addr: u64, len: u64) -> bool {
        self.unknown.covers(addr, addr.saturating_add(len))
    }

    /// Marks `[addr, addr + len)` as holding real values again.
    pub(crate) fn mark_known(&mut self, addr: u64, len: u64) {
        self.unknown.remove(addr, addr.saturating_add(len));
    }

    /// Whether any byte of `[addr, addr + len)` was written by a timing-only run.
    pub fn is_unknown(&self, addr: u64, len: u64) -> bool {
        self.unknown.intersects(addr, addr.saturating_add(len))
    }
}

/// Checks that `[addr, addr + len)` is inside a memory of `capacity` bytes.
fn check_range(capacity: u64, addr: u64, len: u64) -> Result<(), OutOfRange> {
    match addr.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(OutOfRange {
            addr,
            len,
            capacity,
        }),
    }
}

/// The allocated pages of device memory.
#[derive(Debug, Default, Clone)]
pub(crate) struct Pages(BTreeMap<u64, Box<[u8; PAGE]>>);

impl Pages {
    /// Writes `data` at `addr` (in range).
    fn write(&mut self, addr: u64, data: &[u8]) {
        let mut done = 0usize;
        while done < data.len() {
            let a = addr + done as u64;
            let off = (a as usize) & (PAGE - 1);
            let n = (PAGE - off).min(data.len() - done);
            let page = self.0.entry(a >> PAGE_BITS).or_insert_with(zero_page);
            page[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }

    /// Reads `buf.len()` bytes at `addr` (in range); never-written bytes read as zero.
    fn read(&self, addr: u64, buf: &mut [u8]) {
        let mut done = 0usize;
        while done < buf.len() {
            let a = addr + done as u64;
            let off = (a as usize) & (PAGE - 1);
            let n = (PAGE - off).min(buf.len() - done);
            match self.0.get(&(a >> PAGE_BITS)) {
                Some(p) => buf[done..done + n].copy_from_slice(&p[off..off + n]),
                None => buf[done..done + n].fill(0),
            }
            done += n;
        }
    }
}

/// Device memory's values at one moment, readable on any thread.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pages: Arc<Pages>,
    capacity: u64,
}

impl Snapshot {
    /// Checks that `[addr, addr + len)` is inside device memory.
    pub(crate) fn check(&self, addr: u64, len: u64) -> Result<(), OutOfRange> {
        check_range(self.capacity, addr, len)
    }

    /// Reads `buf.len()` bytes at `addr`.
    pub(crate) fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        self.check(addr, buf.len() as u64)?;
        self.pages.read(addr, buf);
        Ok(())
    }

    /// Capacity in bytes.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// Device memory as the pipes' functional code sees it: the memory itself, or one core's
/// staged view while cores compute on host threads (reads from the memory as it was when the
/// batch began, writes kept until the batch ends; see `crate::values`).
pub(crate) trait GmValues {
    /// Reads `buf.len()` bytes at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange>;
    /// Writes `data` at `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), OutOfRange>;
    /// Capacity in bytes.
    fn capacity(&self) -> u64;
}

impl GmValues for DeviceMemory {
    #[inline]
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), OutOfRange> {
        DeviceMemory::read(self, addr, buf)
    }

    #[inline]
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), OutOfRange> {
        DeviceMemory::write(self, addr, data)
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.capacity
    }
}

fn zero_page() -> Box<[u8; PAGE]> {
    let v = vec![0u8; PAGE].into_boxed_slice();
    match v.try_into() {
        Ok(b) => b,
        Err(_) => unreachable!("a PAGE-sized vector converts to a PAGE-sized array"),
    }
}

/// A set of disjoint half-open ranges.
#[derive(Debug, Default, Clone)]
pub(crate) struct RangeSet {
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // The common case in one lookup: extending (or lying inside) the range that starts at
        // or below `start`, with no other range starting up to `end` to absorb (the last range
        // starting up to `end` starts at or below `start`).
        if let Some((&s, e)) = self.ranges.range_mut(..=end).next_back()
            && s <= start
            && *e >= start
        {
            *e = (*e).max(end);
            return;
        }
        self.insert_absorbing(start, end);
    }

    /// [`RangeSet::insert`] in general: absorbing, one at a time, every range it overlaps or
    /// touches.
    fn insert_absorbing(&mut self, mut start: u64, mut end: u64) {
        if self.covers(start, end) {
            return;
        }
        while let Some((&s, &e)) = self.ranges.range(..=end).next_back() {
            if e < start {
                break;
            }
            self.ranges.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
    }

    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end || self.ranges.is_empty() {
            return;
        }
        // Cut, one at a time, the last range that overlaps [start, end).
        while let Some((&s, &e)) = self.ranges.range(..end).next_back() {
            if e <= start {
                break;
            }
            self.ranges.remove(&s);
            if e > end {
                self.ranges.insert(end, e);
            }
            if s < start {
                self.ranges.insert(s, start);
                break;
            }
        }
    }

    /// Whether one range holds all of `[start, end)` (non-empty).
    pub(crate) fn covers(&self, start: u64, end: u64) -> bool {
        self.ranges
            .range(..=start)
            .next_back()
            .is_some_and(|(_, e)| *e >= end)
    }

    pub(crate) fn intersects(&self, start: u64, end: u64) -> bool {
        start < end
            && self
                .ranges
                .range(..end)
                .next_back()
                .is_some_and(|(_, e)| *e > start)
    }
}

#[cfg(test)]
mod tests {
    use super::RangeSet;

    fn ranges(r: &RangeSet) -> Vec<(u64, u64)> {
        r.ranges.iter().map(|(s, e)| (*s, *e)).collect()
    }

    /// The one-lookup case of `RangeSet::insert` leaves the ranges the general case would,
    /// for random inserts and removals over a small space (so that ranges touch, overlap, nest).
    #[test]
    fn extending_a_range_in_place_matches_absorbing() {
        let mut next = crate::testing::draws_below(7);
        for _ in 0..200 {
            let (mut fast, mut general) = (RangeSet::default(), RangeSet::default());
            for _ in 0..40 {
                let start = u64::from(next(120));
                let end = start + u64::from(next(24));
                if next(4) == 0 {
                    fast.remove(start, end);
                    general.remove(start, end);
                } else {
                    fast.insert(start, end);
                    if start < end {
                        general.insert_absorbing(start, end);
                    }
                }
                assert_eq!(ranges(&fast), ranges(&general), "after [{start}, {end})");
            }
        }
    }

    #[test]
    fn ranges_merge_split_and_intersect() {
        let mut r = RangeSet::default();
        r.insert(10, 20);
        r.insert(30, 40);
        r.insert(20, 25);
        assert_eq!(ranges(&r), [(10, 25), (30, 40)]);
        r.insert(5, 35);
        assert_eq!(ranges(&r), [(5, 40)]);
        r.remove(12, 18);
        assert_eq!(ranges(&r), [(5, 12), (18, 40)]);
        r.remove(0, 100);
        assert!(ranges(&r).is_empty());
        r.insert(0, 10);
        r.insert(20, 30);
        r.insert(40, 50);
        r.remove(5, 45);
        assert_eq!(ranges(&r), [(0, 5), (45, 50)]);
        assert!(r.intersects(4, 6) && r.intersects(49, 60) && !r.intersects(5, 45));
        assert!(r.covers(45, 50) && r.covers(46, 47) && !r.covers(44, 46) && !r.covers(49, 51));
        r.insert(46, 48);
        assert_eq!(ranges(&r), [(0, 5), (45, 50)]);
    }
}
