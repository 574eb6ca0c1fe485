//! The kinds of core a chip is built from, and what each has: a coupled AI core (910A, 310P)
//! has every pipe and buffer; a separated chip (910B, Atlas A2) splits each AI core into a cube
//! core (AIC: cube, MTE1, MTE2, FIXPIPE, L1, L0A/B/C) and vector cores (AIV: vector, MTE2,
//! MTE3, UB), each with its own scalar unit (ascend-hardware.md §2.1, §7.1).

use std::fmt;

use gearsim_isa::{Pipe, PipeSide};
use serde::Deserialize;

use crate::stop::Buffer;

/// How a chip's AI cores are organised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Cube and vector units share one core and its scalar unit.
    Coupled,
    /// Each AI core is a cube core and vector cores that exchange data only through GM and
    /// synchronise with cross-core flags.
    Separated,
}

/// The kind of one core of the chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CoreKind {
    /// A coupled AI core: every pipe and buffer.
    Coupled,
    /// A separated chip's cube core (AIC).
    Cube,
    /// A separated chip's vector core (AIV).
    Vector,
}

impl CoreKind {
    /// Whether a core of this kind has the pipe (`S` and `ALL` always).
    pub const fn has_pipe(self, pipe: Pipe) -> bool {
        match self {
            CoreKind::Coupled => true,
            CoreKind::Cube => !matches!(pipe.side(), PipeSide::Vector),
            CoreKind::Vector => !matches!(pipe.side(), PipeSide::Cube),
        }
    }

    /// Whether a core of this kind has the buffer (GM always).
    pub const fn has_buffer(self, buffer: Buffer) -> bool {
        match self {
            CoreKind::Coupled => true,
            CoreKind::Cube => !matches!(buffer, Buffer::Ub),
            CoreKind::Vector => matches!(buffer, Buffer::Gm | Buffer::Ub),
        }
    }

    /// The short name Ascend's tools use: `aic`, `aiv`, or `core` for a coupled core.
    pub const fn short_name(self) -> &'static str {
        match self {
            CoreKind::Coupled => "core",
            CoreKind::Cube => "aic",
            CoreKind::Vector => "aiv",
        }
    }

    /// What the kind is called in messages.
    pub const fn long_name(self) -> &'static str {
        match self {
            CoreKind::Coupled => "a coupled AI core",
            CoreKind::Cube => "a cube core (AIC)",
            CoreKind::Vector => "a vector core (AIV)",
        }
    }
}

impl fmt::Display for CoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// Where one core sits on the chip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CoreSlot {
    /// Its kind.
    pub kind: CoreKind,
    /// Its number among the cores of its kind (`aiv7` is vector core 7).
    pub number: u32,
    /// The AI core it belongs to (a coupled core is its own).
    pub ai_core: u32,
    /// Which of its AI core's vector cores it is (0 for the others).
    pub sub: u8,
}

impl fmt::Display for CoreSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.kind.short_name(), self.number)
    }
}
