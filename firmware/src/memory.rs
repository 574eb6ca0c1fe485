//! Memory management: a first-fit allocator over device memory, and the simulated host's
//! memory that copy tasks read from and write to.

use std::collections::BTreeMap;

use crate::error::DeviceError;

/// Alignment of every device allocation (the runtime's device alignment, with room to spare).
pub const ALLOC_ALIGN: u64 = 512;
/// Device memory kept back at address 0 so that a null pointer is never a valid buffer.
pub const RESERVED_LOW: u64 = 2 << 20;

/// `bytes` (at least 1) rounded up to [`ALLOC_ALIGN`]; `None` when that overflows.
fn aligned(bytes: u64) -> Option<u64> {
    bytes.max(1).div_ceil(ALLOC_ALIGN).checked_mul(ALLOC_ALIGN)
}

/// A first-fit allocator with coalescing of freed neighbours.
#[derive(Debug)]
pub(crate) struct Allocator {
    /// Free blocks: start -> size.
    free: BTreeMap<u64, u64>,
    /// Allocated blocks: start -> size.
    used: BTreeMap<u64, u64>,
}

impl Allocator {
    pub(crate) fn new(base: u64, end: u64) -> Allocator {
        let mut free = BTreeMap::new();
        if end > base {
            free.insert(base, end - base);
        }
        Allocator {
            free,
            used: BTreeMap::new(),
        }
    }

    pub(crate) fn alloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let largest = || self.free.values().copied().max().unwrap_or(0);
        // A size within an alignment step of 2^64 cannot be rounded up, nor allocated.
        let Some(size) = aligned(bytes) else {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                largest: largest(),
            });
        };
        let found = self
            .free
            .iter()
            .find(|(_, s)| **s >= size)
            .map(|(a, s)| (*a, *s));
        let Some((addr, block)) = found else {
            return Err(DeviceError::OutOfMemory {
                requested: bytes,
                largest: largest(),
            });
        };
        self.free.remove(&addr);
        if block > size {
            self.free.insert(addr + size, block - size);
        }
        self.used.insert(addr, size);
        Ok(addr)
    }

    pub(crate) fn free(&mut self, addr: u64) -> Result<(), DeviceError> {
        let size = self
            .used
            .remove(&addr)
            .ok_or(DeviceError::BadFree { addr })?;
        let (mut start, mut len) = (addr, size);
        if let Some((&p, &ps)) = self.free.range(..addr).next_back()
            && p + ps == addr
        {
            self.free.remove(&p);
            start = p;
            len += ps;
        }
        if let Some(&ns) = self.free.get(&(addr + size)) {
            self.free.remove(&(addr + size));
            len += ns;
        }
        self.free.insert(start, len);
        Ok(())
    }

    /// Bytes currently allocated.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used.values().sum()
    }
}

/// First address of the simulated host's memory (far from any device address, so a host
/// pointer given where a device pointer is expected is caught by the device's bounds check).
pub const HOST_BASE: u64 = 0x7f00_0000_0000;

/// The simulated host's memory: buffers the host allocates for copies to and from the device.
#[derive(Debug, Default)]
pub(crate) struct HostMemory {
    buffers: BTreeMap<u64, Vec<u8>>,
    next: u64,
}

impl HostMemory {
    pub(crate) fn alloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let too_large = |why: &str| DeviceError::HostMemory(format!("{bytes} bytes: {why}"));
        let len = usize::try_from(bytes).map_err(|_| too_large("too large for this host"))?;
        let next = aligned(bytes)
            .and_then(|step| self.next.checked_add(step))
            .filter(|next| HOST_BASE.checked_add(*next).is_some())
            .ok_or_else(|| too_large("past the end of the host address space"))?;
        // A request the machine cannot hold is an error, not an abort: the size is first
        // reserved fallibly (and released), then allocated zeroed, which leaves the pages to
        // the operating system until they are written.
        Vec::<u8>::new()
            .try_reserve_exact(len)
            .map_err(|e| too_large(&format!("cannot allocate ({e})")))?;
        let addr = HOST_BASE + self.next;
        self.next = next;
        self.buffers.insert(addr, vec![0; len]);
        Ok(addr)
    }

    pub(crate) fn free(&mut self, addr: u64) -> Result<(), DeviceError> {
        self.buffers.remove(&addr).map(|_| ()).ok_or_else(|| {
            DeviceError::HostMemory(format!("free of {addr:#x}, which is not a host buffer"))
        })
    }

    fn locate(&self, addr: u64, len: u64) -> Result<(u64, usize), String> {
        let (&base, buf) = self
            .buffers
            .range(..=addr)
            .next_back()
            .ok_or_else(|| format!("{addr:#x} is not in a host buffer"))?;
        let off = addr - base;
        if off.checked_add(len).is_none_or(|e| e > buf.len() as u64) {
            return Err(format!(
                "host range [{addr:#x}, +{len}) is outside the {}-byte host buffer at {base:#x}",
                buf.len()
            ));
        }
        Ok((base, off as usize))
    }

    /// Checks that `[addr, addr + len)` lies inside one host buffer.
    pub(crate) fn check(&self, addr: u64, len: u64) -> Result<(), String> {
        self.locate(addr, len).map(|_| ())
    }

    pub(crate) fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        let (base, off) = self.locate(addr, out.len() as u64)?;
        out.copy_from_slice(&self.buffers[&base][off..off + out.len()]);
        Ok(())
    }

    pub(crate) fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String> {
        let (base, off) = self.locate(addr, data.len() as u64)?;
        if let Some(buf) = self.buffers.get_mut(&base) {
            buf[off..off + data.len()].copy_from_slice(data);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_reuses_and_coalesces() {
        let mut a = Allocator::new(4096, 4096 + 8 * ALLOC_ALIGN);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(ALLOC_ALIGN + 1).unwrap();
        let z = a.alloc(10).unwrap();
        assert_eq!((x, y, z), (4096, 4096 + 512, 4096 + 1536));
        a.free(y).unwrap();
        a.free(x).unwrap();
        assert_eq!(a.alloc(3 * ALLOC_ALIGN).unwrap(), 4096);
        assert!(matches!(
            a.free(12345),
            Err(DeviceError::BadFree { addr: 12345 })
        ));
        assert!(matches!(
            a.alloc(100 * ALLOC_ALIGN),
            Err(DeviceError::OutOfMemory { .. })
        ));
        a.free(z).unwrap();
        assert_eq!(a.used_bytes(), 3 * ALLOC_ALIGN);
    }

    #[test]
    fn host_memory_bounds() {
        let mut h = HostMemory::default();
        let p = h.alloc(10).unwrap();
        h.write(p + 2, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 4];
        h.read(p + 1, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3]);
        assert!(
            h.read(p + 8, &mut out)
                .unwrap_err()
                .contains("outside the 10-byte host buffer")
        );
        assert!(h.check(5, 1).is_err());
    }

    /// Regression (fuzzing a `.om` whose input size was u64::MAX): rounding the size up to the
    /// alignment overflowed (a panic in debug builds, a zero-byte block in release builds),
    /// and a host buffer the machine cannot hold aborted the process.
    #[test]
    fn sizes_near_the_top_of_u64_are_errors() {
        let mut a = Allocator::new(4096, 1 << 20);
        for bytes in [u64::MAX, u64::MAX - ALLOC_ALIGN + 2, 1 << 63] {
            assert!(matches!(
                a.alloc(bytes),
                Err(DeviceError::OutOfMemory { requested, .. }) if requested == bytes
            ));
        }
        let mut h = HostMemory::default();
        for bytes in [u64::MAX, 1 << 62] {
            let e = h.alloc(bytes).unwrap_err().to_string();
            assert!(e.contains(&bytes.to_string()), "{e}");
        }
        // Nothing was allocated on the way: the next buffer still starts at the base.
        assert_eq!(h.alloc(1).unwrap(), HOST_BASE);
    }
}
