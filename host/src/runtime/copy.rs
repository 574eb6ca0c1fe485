//! The runtime's copies: every host<->device transfer of a run is a `Memcpy` task on the
//! runtime's stream through a pinned host buffer, so PCIe time is device time and the trace
//! names each transfer. The gear path (`session.rs`) and the hybrid path (`dynamic.rs`) both
//! copy through here and count what they moved in [`Transfers`].

use gearsim_firmware::{Device, HostPtr, StreamId};
use gearsim_isa::task::{Memcpy, MemcpyKind, Task};
use gearsim_traces::TraceSink;

use super::error::RuntimeError;

/// Transfer counts of a run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Transfers {
    pub h2d_bytes: u64,
    pub h2d: u64,
    pub d2h_bytes: u64,
    pub d2h: u64,
}

/// Queues one host-to-device copy of `data` to device address `dst` through the pinned buffer
/// `host` on `stream` (nothing for empty data).
pub(crate) fn h2d<S: TraceSink>(
    dev: &mut Device<S>,
    stream: StreamId,
    name: &str,
    host: HostPtr,
    dst: u64,
    data: &[u8],
    t: &mut Transfers,
) -> Result<(), RuntimeError> {
    if data.is_empty() {
        return Ok(());
    }
    dev.host_write(host, data)?;
    dev.submit(
        stream,
        Task::Memcpy(Memcpy {
            kind: MemcpyKind::HostToDevice,
            dst,
            src: host.0,
            size: data.len() as u64,
        }),
        Some(name),
    )?;
    t.h2d += 1;
    t.h2d_bytes += data.len() as u64;
    Ok(())
}

/// Copies `bytes` from device address `src` to the host through `host` on `stream`, waits for
/// the stream and returns them.
pub(crate) fn d2h<S: TraceSink>(
    dev: &mut Device<S>,
    stream: StreamId,
    name: &str,
    src: u64,
    host: HostPtr,
    bytes: u64,
    t: &mut Transfers,
) -> Result<Vec<u8>, RuntimeError> {
    let mut out = vec![0u8; bytes as usize];
    if bytes == 0 {
        return Ok(out);
    }
    dev.submit(
        stream,
        Task::Memcpy(Memcpy {
            kind: MemcpyKind::DeviceToHost,
            dst: host.0,
            src,
            size: bytes,
        }),
        Some(name),
    )?;
    dev.synchronize(stream)?;
    dev.host_read(host, &mut out)?;
    t.d2h += 1;
    t.d2h_bytes += bytes;
    Ok(out)
}
