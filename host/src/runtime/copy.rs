//! The runtime's copies: every host<->device transfer of a run is a synchronous `aclrtMemcpy`
//! — a staging copy on the host, a `Memcpy` task on the runtime's stream through a pinned host
//! buffer, and a wait for it — so PCIe time is device time, the host's part is host time, and
//! the trace names each transfer. The gear path (`session.rs`) and the hybrid path
//! (`dynamic.rs`) both copy through here and count what they moved in [`Transfers`].

use gearsim_firmware::{Device, HostPtr, StreamId};
use gearsim_isa::task::{Memcpy, MemcpyKind, Task};
use gearsim_traces::TraceSink;

use super::error::RuntimeError;
use super::host_work::Host;

/// Transfer counts of a run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Transfers {
    pub h2d_bytes: u64,
    pub h2d: u64,
    pub d2h_bytes: u64,
    pub d2h: u64,
}

/// The runtime's device, stream and host, for one copy.
pub(crate) struct Link<'a, S: TraceSink> {
    pub dev: &'a mut Device<S>,
    pub host: &'a mut Host,
    pub stream: StreamId,
}

impl<S: TraceSink> Link<'_, S> {
    /// The same link for one more call.
    pub(crate) fn reborrow(&mut self) -> Link<'_, S> {
        Link {
            dev: &mut *self.dev,
            host: &mut *self.host,
            stream: self.stream,
        }
    }
}

/// Copies `data` to device address `dst` through the pinned buffer `pinned` and waits for it
/// (nothing for empty data).
pub(crate) fn h2d<S: TraceSink>(
    l: Link<'_, S>,
    name: &str,
    pinned: HostPtr,
    dst: u64,
    data: &[u8],
    t: &mut Transfers,
) -> Result<(), RuntimeError> {
    if data.is_empty() {
        return Ok(());
    }
    l.host.stage(l.dev, data.len() as u64)?;
    l.dev.host_write(pinned, data)?;
    let copy = Task::Memcpy(Memcpy {
        kind: MemcpyKind::HostToDevice,
        dst,
        src: pinned.0,
        size: data.len() as u64,
    });
    l.host.submit(l.dev, l.stream, copy, name)?;
    l.host.sync(l.dev, l.stream)?;
    t.h2d += 1;
    t.h2d_bytes += data.len() as u64;
    Ok(())
}

/// Copies `bytes` from device address `src` to the host through `pinned`, waits for it and
/// returns them.
pub(crate) fn d2h<S: TraceSink>(
    l: Link<'_, S>,
    name: &str,
    src: u64,
    pinned: HostPtr,
    bytes: u64,
    t: &mut Transfers,
) -> Result<Vec<u8>, RuntimeError> {
    let mut out = vec![0u8; bytes as usize];
    if bytes == 0 {
        return Ok(out);
    }
    let copy = Task::Memcpy(Memcpy {
        kind: MemcpyKind::DeviceToHost,
        dst: pinned.0,
        src,
        size: bytes,
    });
    l.host.submit(l.dev, l.stream, copy, name)?;
    l.host.sync(l.dev, l.stream)?;
    l.dev.host_read(pinned, &mut out)?;
    l.host.stage(l.dev, bytes)?;
    t.d2h += 1;
    t.d2h_bytes += bytes;
    Ok(out)
}
