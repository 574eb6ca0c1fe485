//! Why a run stopped: faults of the simulated hardware are values, never panics.

use std::fmt;

use gearsim_isa::Pipe;

use crate::time::Tick;

/// A memory of the chip, as named in fault reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Buffer {
    /// Global (device) memory.
    #[default]
    Gm,
    /// Unified buffer.
    Ub,
    /// L1 buffer.
    L1,
    /// L0A buffer.
    L0a,
    /// L0B buffer.
    L0b,
    /// L0C buffer.
    L0c,
    /// Bias table (a separated chip's cube core).
    Bt,
    /// FIXPIPE buffer (a separated chip's cube core).
    Fb,
}

impl fmt::Display for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Buffer::Gm => "GM",
            Buffer::Ub => "UB",
            Buffer::L1 => "L1",
            Buffer::L0a => "L0A",
            Buffer::L0b => "L0B",
            Buffer::L0c => "L0C",
            Buffer::Bt => "BT",
            Buffer::Fb => "FB",
        })
    }
}

/// A flag between two pipes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlagId {
    /// Setting pipe.
    pub src: Pipe,
    /// Waiting pipe.
    pub dst: Pipe,
    /// Event id.
    pub id: u8,
}

impl fmt::Display for FlagId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{} id {}", self.src, self.dst, self.id)
    }
}

/// A unit that can never proceed, in a deadlock report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    /// Core.
    pub core: u32,
    /// Blocked pipe (`S` for the scalar unit).
    pub pipe: Pipe,
    /// Program counter of the blocked instruction.
    pub pc: u32,
    /// What it waits for.
    pub waits_for: String,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "core {} {} pc {} waits for {}",
            self.core, self.pipe, self.pc, self.waits_for
        )
    }
}

/// Why the chip stopped before finishing its work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// An access outside a buffer or outside device memory.
    MemoryFault {
        /// Core.
        core: u32,
        /// Pipe of the instruction.
        pipe: Pipe,
        /// Program counter.
        pc: u32,
        /// Memory accessed.
        buffer: Buffer,
        /// First byte of the access.
        addr: u64,
        /// Length of the access.
        len: u64,
        /// Size of the memory.
        size: u64,
    },
    /// An address that breaks its buffer's alignment rule.
    Misaligned {
        /// Core.
        core: u32,
        /// Pipe of the instruction.
        pipe: Pipe,
        /// Program counter.
        pc: u32,
        /// Memory accessed.
        buffer: Buffer,
        /// The address.
        addr: u64,
        /// Required alignment.
        align: u64,
    },
    /// An instruction this chip cannot execute.
    IllegalInstruction {
        /// Core.
        core: u32,
        /// Pipe it would run on.
        pipe: Pipe,
        /// Program counter.
        pc: u32,
        /// Why.
        reason: String,
    },
    /// Units wait for flags that no remaining instruction will set.
    Deadlock {
        /// Tick at which no event was left.
        at: Tick,
        /// Every blocked unit.
        blocked: Vec<Blocked>,
    },
    /// A block ran past the kernel timeout.
    Timeout {
        /// Core.
        core: u32,
        /// Program counter reached.
        pc: u32,
        /// The limit in core cycles.
        limit_cycles: u64,
    },
    /// A flag set again before its waiter consumed it.
    FlagOverflow {
        /// Core.
        core: u32,
        /// Setting pipe.
        pipe: Pipe,
        /// Program counter.
        pc: u32,
        /// The flag.
        flag: FlagId,
    },
    /// A cross-core flag set while the block it is for already held the most arrivals of it
    /// that no wait consumed.
    CrossFlagOverflow {
        /// The setting core.
        core: u32,
        /// Its program counter.
        pc: u32,
        /// The block the flag was for.
        target: String,
        /// The most arrivals a flag holds (`core.cross_core_max_pending`).
        max: u32,
    },
    /// A scalar access touched a red zone (e.g. read past a kernel's argument block).
    Guarded {
        /// Core.
        core: u32,
        /// Program counter.
        pc: u32,
        /// The address accessed.
        addr: u64,
        /// Whether it was a load.
        load: bool,
        /// What the red zone guards.
        what: String,
    },
    /// In timing-only mode the scalar unit read data that only the full mode computes.
    ValueNeeded {
        /// Core.
        core: u32,
        /// Program counter.
        pc: u32,
        /// Memory read.
        buffer: Buffer,
        /// Address.
        addr: u64,
    },
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::MemoryFault {
                core,
                pipe,
                pc,
                buffer,
                addr,
                len,
                size,
            } => write!(
                f,
                "memory fault: core {core} {pipe} pc {pc}: {buffer} access [{addr:#x}, {:#x}) ({len} bytes) is outside {buffer} ({size} bytes)",
                addr.saturating_add(*len)
            ),
            StopReason::Misaligned {
                core,
                pipe,
                pc,
                buffer,
                addr,
                align,
            } => write!(
                f,
                "misaligned access: core {core} {pipe} pc {pc}: {buffer} address {addr:#x} is not {align}-byte aligned"
            ),
            StopReason::IllegalInstruction {
                core,
                pipe,
                pc,
                reason,
            } => {
                write!(
                    f,
                    "illegal instruction: core {core} {pipe} pc {pc}: {reason}"
                )
            }
            StopReason::Deadlock { at, blocked } => {
                write!(f, "deadlock at {at}: ")?;
                for (i, b) in blocked.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{b}")?;
                }
                Ok(())
            }
            StopReason::Timeout {
                core,
                pc,
                limit_cycles,
            } => write!(
                f,
                "timeout: core {core} pc {pc} still running after {limit_cycles} cycles (core.kernel_timeout_cycles)"
            ),
            StopReason::FlagOverflow {
                core,
                pipe,
                pc,
                flag,
            } => write!(
                f,
                "flag overflow: core {core} {pipe} pc {pc}: set_flag {flag} while it is still set (a wait_flag is missing)"
            ),
            StopReason::CrossFlagOverflow {
                core,
                pc,
                target,
                max,
            } => write!(
                f,
                "cross-core flag overflow: core {core} pc {pc}: a set for {target} while it already held {max} arrivals no wait consumed (a cross_wait is missing)"
            ),
            StopReason::Guarded {
                core,
                pc,
                addr,
                load,
                what,
            } => write!(
                f,
                "guarded access: core {core} S pc {pc} {} GM {addr:#x}, {what}",
                if *load { "reads" } else { "writes" }
            ),
            StopReason::ValueNeeded {
                core,
                pc,
                buffer,
                addr,
            } => write!(
                f,
                "timing-only run needs a value: core {core} S pc {pc} reads {buffer} {addr:#x}, which a skipped computation wrote; run this kernel in full mode"
            ),
        }
    }
}

impl std::error::Error for StopReason {}
