//! Operand types of the instruction set and how each one maps to raw bits.
//!
//! Every field of every instruction format is one of these types. The [`FieldType`] trait
//! tells the generic encoder, decoder, assembler and disassembler how wide the field is, how it
//! is spelled in text and how it converts to and from its raw bit pattern, so none of them needs
//! to know about individual instructions.

use std::fmt;

/// How a field is spelled in assembly text and how its raw bits are interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// A scalar register `x0`..`x31`.
    Reg,
    /// An unsigned integer immediate.
    Unsigned,
    /// A two's-complement signed integer immediate.
    Signed,
    /// A one-bit flag, spelled `true`/`false` (or `1`/`0`).
    Bool,
    /// One of a closed list of names; the raw value is the index into the list.
    Enum(&'static [&'static str]),
    /// A branch target: an absolute instruction index, spelled `@N` or as a label.
    Target,
}

/// A type that can be the field of an instruction format.
pub trait FieldType: Copy + Sized {
    /// The text and bit interpretation of the field.
    const KIND: FieldKind;
    /// The natural width in bits; a format may declare a narrower width for one field.
    const BITS: u32;
    /// The largest raw value of an unsigned kind when the type allows fewer values than its
    /// width holds (a cross-core flag id stops at 10); the width alone bounds the others.
    const MAX_RAW: u64 = u64::MAX;
    /// The raw value: zero-extended for unsigned kinds, sign-extended for [`FieldKind::Signed`].
    fn to_raw(&self) -> u64;
    /// Builds the value back from a raw value (sign-extended for signed kinds);
    /// `None` when the raw value names nothing (an enum index past the end).
    fn from_raw(raw: u64) -> Option<Self>;
}

macro_rules! unsigned_field {
    ($($t:ty),*) => {$(
        impl FieldType for $t {
            const KIND: FieldKind = FieldKind::Unsigned;
            const BITS: u32 = <$t>::BITS;
            fn to_raw(&self) -> u64 { u64::from(*self) }
            fn from_raw(raw: u64) -> Option<Self> { <$t>::try_from(raw).ok() }
        }
    )*};
}
unsigned_field!(u8, u16, u32, u64);

macro_rules! signed_field {
    ($($t:ty),*) => {$(
        impl FieldType for $t {
            const KIND: FieldKind = FieldKind::Signed;
            const BITS: u32 = <$t>::BITS;
            fn to_raw(&self) -> u64 { i64::from(*self) as u64 }
            fn from_raw(raw: u64) -> Option<Self> { <$t>::try_from(raw as i64).ok() }
        }
    )*};
}
signed_field!(i16, i32, i64);

impl FieldType for bool {
    const KIND: FieldKind = FieldKind::Bool;
    const BITS: u32 = 1;
    fn to_raw(&self) -> u64 {
        u64::from(*self)
    }
    fn from_raw(raw: u64) -> Option<Self> {
        match raw {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
}

/// Number of scalar registers.
pub const NUM_REGS: usize = 32;

/// A scalar register `x0`..`x31` (64 bits each). All 32 are general purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(u8);

impl Reg {
    /// The register with this number, if it exists.
    pub const fn new(n: u8) -> Option<Reg> {
        if (n as usize) < NUM_REGS {
            Some(Reg(n))
        } else {
            None
        }
    }
    /// The register number, 0..32.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

macro_rules! reg_consts {
    ($($name:ident = $n:literal),*) => {
        impl Reg { $(
            #[doc = concat!("Register `x", $n, "`.")]
            pub const $name: Reg = Reg($n);
        )* }
    };
}
reg_consts!(
    X0 = 0,
    X1 = 1,
    X2 = 2,
    X3 = 3,
    X4 = 4,
    X5 = 5,
    X6 = 6,
    X7 = 7,
    X8 = 8,
    X9 = 9,
    X10 = 10,
    X11 = 11,
    X12 = 12,
    X13 = 13,
    X14 = 14,
    X15 = 15,
    X16 = 16,
    X17 = 17,
    X18 = 18,
    X19 = 19,
    X20 = 20,
    X21 = 21,
    X22 = 22,
    X23 = 23,
    X24 = 24,
    X25 = 25,
    X26 = 26,
    X27 = 27,
    X28 = 28,
    X29 = 29,
    X30 = 30,
    X31 = 31
);

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "x{}", self.0)
    }
}

impl FieldType for Reg {
    const KIND: FieldKind = FieldKind::Reg;
    const BITS: u32 = 5;
    fn to_raw(&self) -> u64 {
        u64::from(self.0)
    }
    fn from_raw(raw: u64) -> Option<Self> {
        u8::try_from(raw).ok().and_then(Reg::new)
    }
}

/// An absolute branch target: the index of an instruction in its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target(pub u32);

impl FieldType for Target {
    const KIND: FieldKind = FieldKind::Target;
    const BITS: u32 = 32;
    fn to_raw(&self) -> u64 {
        u64::from(self.0)
    }
    fn from_raw(raw: u64) -> Option<Self> {
        u32::try_from(raw).ok().map(Target)
    }
}

/// Defines a closed operand enum whose text names and raw values come from one list.
macro_rules! operand_enum {
    (
        $(#[$meta:meta])*
        $name:ident bits $bits:literal {
            $( $(#[doc = $doc:literal])* $variant:ident = $text:literal ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $( $(#[doc = $doc])* $variant ),* }

        impl $name {
            /// Every value, in raw-value order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];
            /// The assembly spelling of every value, in raw-value order.
            pub const NAMES: &'static [&'static str] = &[$($text),*];
            /// The assembly spelling.
            pub fn name(self) -> &'static str {
                Self::NAMES[self as usize]
            }
            /// Looks a value up by its assembly spelling (case-insensitive).
            pub fn from_name(text: &str) -> Option<Self> {
                Self::NAMES
                    .iter()
                    .position(|n| n.eq_ignore_ascii_case(text))
                    .map(|i| Self::ALL[i])
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FieldType for $name {
            const KIND: FieldKind = FieldKind::Enum($name::NAMES);
            const BITS: u32 = $bits;
            fn to_raw(&self) -> u64 { *self as u64 }
            fn from_raw(raw: u64) -> Option<Self> {
                usize::try_from(raw).ok().and_then(|i| Self::ALL.get(i).copied())
            }
        }
    };
}

operand_enum! {
    /// Element type of a vector, cube or conversion operand.
    DType bits 3 {
        /// IEEE binary16.
        F16 = "f16",
        /// IEEE binary32.
        F32 = "f32",
        /// Two's-complement 32-bit integer.
        I32 = "i32",
        /// Two's-complement 16-bit integer (bitwise ops and bit masks).
        I16 = "i16",
        /// Unsigned 8-bit integer (image bytes; a conversion source only).
        U8 = "u8",
        /// bfloat16: a cube operand (f32 accumulation) and a FIXPIPE output type.
        Bf16 = "bf16",
        /// Two's-complement 8-bit integer: a cube operand (i32 accumulation, 16 x 32 fractals).
        I8 = "i8",
    }
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::F16 | DType::I16 | DType::Bf16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }
}

operand_enum! {
    /// An AI core pipe: an in-order instruction queue feeding one execution unit.
    Pipe bits 3 {
        /// Scalar unit (`PIPE_S`).
        S = "S",
        /// Vector unit, UB to UB (`PIPE_V`).
        V = "V",
        /// Cube unit, L0A x L0B -> L0C (`PIPE_M`).
        M = "M",
        /// L1 -> L0A/L0B moves (`PIPE_MTE1`).
        Mte1 = "MTE1",
        /// GM -> UB/L1 moves (`PIPE_MTE2`).
        Mte2 = "MTE2",
        /// UB -> GM moves (`PIPE_MTE3`).
        Mte3 = "MTE3",
        /// L0C -> GM moves (`FIXPIPE`, separated-architecture presets only).
        Fix = "FIX",
        /// All pipes; only meaningful for `pipe_barrier`.
        All = "ALL",
    }
}

impl Pipe {
    /// The pipes that hold queues of dispatched instructions (everything except S and ALL),
    /// in the order the simulator indexes them.
    pub const QUEUED: [Pipe; 6] = [
        Pipe::V,
        Pipe::M,
        Pipe::Mte1,
        Pipe::Mte2,
        Pipe::Mte3,
        Pipe::Fix,
    ];
    /// The pipes that have a trace lane, in lane order.
    pub const EXECUTING: [Pipe; 7] = [
        Pipe::S,
        Pipe::V,
        Pipe::M,
        Pipe::Mte1,
        Pipe::Mte2,
        Pipe::Mte3,
        Pipe::Fix,
    ];

    /// Index into [`Pipe::QUEUED`], or `None` for S and ALL.
    pub const fn queue_index(self) -> Option<usize> {
        match self {
            Pipe::V => Some(0),
            Pipe::M => Some(1),
            Pipe::Mte1 => Some(2),
            Pipe::Mte2 => Some(3),
            Pipe::Mte3 => Some(4),
            Pipe::Fix => Some(5),
            Pipe::S | Pipe::All => None,
        }
    }

    /// Which core of a separated chip (Atlas A2) has this pipe: the cube core's M, MTE1 and
    /// FIXPIPE, the vector core's V and MTE3; both have S and MTE2 (ascend-hardware.md §7.1).
    pub const fn side(self) -> PipeSide {
        match self {
            Pipe::M | Pipe::Mte1 | Pipe::Fix => PipeSide::Cube,
            Pipe::V | Pipe::Mte3 => PipeSide::Vector,
            Pipe::S | Pipe::All | Pipe::Mte2 => PipeSide::Both,
        }
    }

    /// The lane name Ascend's profilers use for this pipe.
    pub const fn lane_name(self) -> &'static str {
        match self {
            Pipe::S => "SCALAR",
            Pipe::V => "VECTOR",
            Pipe::M => "CUBE",
            Pipe::Mte1 => "MTE1",
            Pipe::Mte2 => "MTE2",
            Pipe::Mte3 => "MTE3",
            Pipe::Fix => "FIXP",
            Pipe::All => "ALL",
        }
    }
}

/// The core of a separated chip a pipe belongs to ([`Pipe::side`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PipeSide {
    /// The cube core (AIC) only.
    Cube,
    /// The vector cores (AIV) only.
    Vector,
    /// Both kinds of core.
    Both,
}

operand_enum! {
    /// Comparison of `vcmp`/`vcmps`.
    Cmp bits 3 {
        /// Equal.
        Eq = "eq",
        /// Not equal.
        Ne = "ne",
        /// Less than.
        Lt = "lt",
        /// Less than or equal.
        Le = "le",
        /// Greater than.
        Gt = "gt",
        /// Greater than or equal.
        Ge = "ge",
    }
}

operand_enum! {
    /// Reduction of `vreduce`/`vbreduce`.
    ReduceOp bits 2 {
        /// Sum (accumulated in f32 for f16 inputs, rounded once).
        Sum = "sum",
        /// Maximum.
        Max = "max",
        /// Minimum.
        Min = "min",
    }
}

operand_enum! {
    /// Rounding of a narrowing conversion.
    Round bits 3 {
        /// To nearest, ties to even.
        Rint = "rint",
        /// Towards negative infinity.
        Floor = "floor",
        /// Towards positive infinity.
        Ceil = "ceil",
        /// Towards zero.
        Trunc = "trunc",
        /// To nearest, ties away from zero.
        Round = "round",
    }
}

operand_enum! {
    /// What the FIXPIPE does to an L0C value before converting it to the output type.
    Quant bits 2 {
        /// Nothing: the accumulator is f32 (or i32 copied as it is to an `i32` output).
        None = "none",
        /// Dequantise: the i32 accumulator times one f32 scale (the low 32 bits of the `scale`
        /// register), as `DEQF16` with a scalar `deqscale`.
        Deq = "deq",
        /// Dequantise per column: column j's i32 values times the f32 at FB byte
        /// `scale + 4·j` (`VDEQF16`; the scales reach the FB with `copy_l1_to_fb`).
        Vdeq = "vdeq",
    }
}

operand_enum! {
    /// Special registers readable with `sreg`.
    SReg bits 3 {
        /// This block's index in [0, block_num).
        BlockIdx = "block_idx",
        /// The kernel's block_dim.
        BlockNum = "block_num",
        /// GM address of the kernel's argument array (u64 values).
        Args = "args",
        /// The physical core running this block.
        CoreId = "core_id",
        /// The core's cycle counter at this instruction.
        Cycle = "cycle",
        /// Which of its AI core's two vector cores runs this block of a MIX kernel (0 or 1;
        /// 0 on a cube core and on a coupled core): Ascend C's `GetSubBlockIdx`.
        SubBlockIdx = "sub_block_idx",
    }
}

operand_enum! {
    /// Which cores a cross-core flag reaches (`CrossCoreSetFlag`'s mode, separated chips only).
    CrossMode bits 2 {
        /// Mode 0: a barrier of every block of the setter's kind in the launch (all AICs or
        /// all AIVs): the flag reaches each of them once every one has set it.
        All = "all",
        /// Mode 1: the other vector core of the setter's AI core.
        Aiv = "aiv",
        /// Mode 2: between a cube core and its AI core's two vector cores: an AIC's set reaches
        /// both AIVs; the AIC sees the flag once both AIVs have set it.
        AicAiv = "aic_aiv",
    }
}

/// Cross-core flag ids per core: 0 to 10 (asc-devkit `NPU架构版本2201.md`).
pub const CROSS_CORE_FLAG_IDS: u8 = 11;

/// A cross-core flag id, 0 to [`CROSS_CORE_FLAG_IDS`] − 1: the assembler, the builders and the
/// decoder refuse any other value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CrossFlagId(u8);

impl CrossFlagId {
    /// The id `n`, if the architecture has it.
    pub const fn new(n: u8) -> Option<CrossFlagId> {
        if n < CROSS_CORE_FLAG_IDS {
            Some(CrossFlagId(n))
        } else {
            None
        }
    }
    /// The id's number.
    pub const fn get(self) -> u8 {
        self.0
    }
}

impl fmt::Display for CrossFlagId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FieldType for CrossFlagId {
    const KIND: FieldKind = FieldKind::Unsigned;
    const BITS: u32 = 4;
    const MAX_RAW: u64 = CROSS_CORE_FLAG_IDS as u64 - 1;
    fn to_raw(&self) -> u64 {
        u64::from(self.0)
    }
    fn from_raw(raw: u64) -> Option<Self> {
        u8::try_from(raw).ok().and_then(CrossFlagId::new)
    }
}

operand_enum! {
    /// Memory space of a scalar load or store.
    Space bits 2 {
        /// Global memory (device HBM).
        Gm = "gm",
        /// Unified buffer.
        Ub = "ub",
        /// L1 buffer.
        L1 = "l1",
    }
}

operand_enum! {
    /// Width and signedness of a scalar load or store.
    SType bits 3 {
        /// Unsigned byte.
        U8 = "u8",
        /// Unsigned 16-bit.
        U16 = "u16",
        /// Unsigned 32-bit.
        U32 = "u32",
        /// 64-bit.
        U64 = "u64",
        /// Signed byte.
        I8 = "i8",
        /// Signed 16-bit.
        I16 = "i16",
        /// Signed 32-bit.
        I32 = "i32",
    }
}

impl SType {
    /// Size in bytes.
    pub const fn size(self) -> usize {
        match self {
            SType::U8 | SType::I8 => 1,
            SType::U16 | SType::I16 => 2,
            SType::U32 | SType::I32 => 4,
            SType::U64 => 8,
        }
    }
    /// Whether a load sign-extends.
    pub const fn signed(self) -> bool {
        matches!(self, SType::I8 | SType::I16 | SType::I32)
    }
}
