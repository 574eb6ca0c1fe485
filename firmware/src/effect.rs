//! Functional effects of timed operations: what an AI CPU kernel or an SDMA job does to device
//! memory, applied when its time has passed. It knows nothing of timing or of who waits.

use gearsim_sim::Chip;
use gearsim_traces::TraceSink;

use crate::error::DeviceError;
use crate::memory::Allocator;

/// A functional effect applied when a timed operation completes.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Device writes.
    Write(Vec<(u64, Vec<u8>)>),
    /// A device-to-device copy.
    Copy { dst: u64, src: u64, size: u64 },
    /// A memset.
    Fill { dst: u64, size: u64, value: u8 },
    /// GetNext: copy staged tensors to their outputs, write shapes, free the staging buffers.
    GetNext {
        copies: Vec<(u64, u64, u64)>,
        shapes: Vec<(u64, Vec<u8>)>,
        free: Vec<u64>,
    },
}

impl Effect {
    /// Applies the effect to device memory (`heap`: where GetNext's staging buffers return).
    pub(crate) fn apply<S: TraceSink>(
        self,
        chip: &mut Chip<S>,
        heap: &mut Allocator,
    ) -> Result<(), DeviceError> {
        match self {
            Effect::Write(writes) => {
                for (addr, data) in writes {
                    chip.write_mem(addr, &data)?;
                }
            }
            Effect::Copy { dst, src, size } => {
                let mut buf = vec![0u8; size as usize];
                chip.read_mem(src, &mut buf)?;
                chip.write_mem(dst, &buf)?;
            }
            Effect::Fill { dst, size, value } => chip.fill_mem(dst, size, value)?,
            Effect::GetNext {
                copies,
                shapes,
                free,
            } => {
                for (dst, src, len) in copies {
                    let mut buf = vec![0u8; len as usize];
                    chip.read_mem(src, &mut buf)?;
                    chip.write_mem(dst, &buf)?;
                }
                for (addr, bytes) in shapes {
                    chip.write_mem(addr, &bytes)?;
                }
                for p in free {
                    heap.free(p)?;
                }
            }
        }
        Ok(())
    }
}
