//! The vocabulary of the instruction table: field, format and instruction descriptions, and the
//! two macros that turn the table in `table.rs` into Rust types.
//!
//! `formats!` declares each operand layout once: a struct with typed fields plus a
//! [`Format`] impl that lists the fields' widths, kinds and text placement. `instructions!`
//! declares each instruction once: opcode, mnemonic, pipe, timing class, format, allowed element
//! types and doc. From those two declarations come the [`crate::Opcode`] and
//! [`crate::Instruction`] enums and the [`InstrSpec`] table that the generic encoder, decoder,
//! assembler, disassembler and the simulator's cost lookup all read, and the typed builder
//! methods of [`crate::ProgramBuilder`] (one per instruction, one setter per keyed field).

use crate::operand::{DType, FieldKind, Pipe};

/// Width of an encoded instruction in bytes.
pub const WORD_BYTES: usize = 16;
/// Operand bits available after the opcode byte.
pub const PAYLOAD_BITS: u32 = 120;
/// The most fields any format has (checked by a test).
pub const MAX_FIELDS: usize = 16;

/// Where a field goes in assembly text.
#[derive(Debug, Clone, Copy)]
pub enum Placement {
    /// Appended to the mnemonic after a dot, in declaration order: `vadd.f16`.
    Suffix,
    /// A required comma-separated operand, in declaration order.
    Positional,
    /// An optional `name=value` operand; the function returns the raw default.
    Keyed(fn() -> u64),
}

/// One field of a format.
#[derive(Debug, Clone, Copy)]
pub struct FieldSpec {
    /// Field name, also the key of keyed operands.
    pub name: &'static str,
    /// Encoded width in bits.
    pub bits: u32,
    /// The largest raw value an unsigned field takes: the width's, or less when its type
    /// allows fewer values ([`crate::operand::FieldType::MAX_RAW`]).
    pub max: u64,
    /// Text and bit interpretation.
    pub kind: FieldKind,
    /// Where it goes in text.
    pub placement: Placement,
}

impl FieldSpec {
    /// The raw default of a keyed field.
    pub fn default_raw(&self) -> Option<u64> {
        match self.placement {
            Placement::Keyed(f) => Some(f()),
            Placement::Suffix | Placement::Positional => None,
        }
    }

    /// Whether `raw` (sign-extended for signed kinds) fits the field's width.
    pub fn fits(&self, raw: u64) -> bool {
        match self.kind {
            FieldKind::Signed => {
                let v = raw as i64;
                let half = 1i128 << (self.bits - 1);
                (i128::from(v) >= -half) && (i128::from(v) < half)
            }
            _ => raw <= self.max,
        }
    }
}

/// An operand layout shared by several instructions.
pub trait Format: Copy + Sized {
    /// Name of the layout (for documentation).
    const NAME: &'static str;
    /// Its fields in encoding order.
    const FIELDS: &'static [FieldSpec];
    /// Sum of the field widths.
    const TOTAL_BITS: u32;
    /// Writes the raw value of every field into `out[..FIELDS.len()]`.
    fn to_raw(&self, out: &mut [u64]);
    /// Builds the layout from raw values; `None` if one names no value of its type.
    fn from_raw(raw: &[u64]) -> Option<Self>;
}

/// Which pipe an instruction executes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeClass {
    /// Always the same pipe.
    Fixed(Pipe),
    /// Chosen by an operand (`set_flag` runs on its source pipe, `wait_flag` on its
    /// destination pipe, `pipe_barrier` on the pipe it names).
    Routed,
}

/// Cost class of an instruction; the chip preset gives each class its cycles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimingClass {
    /// Scalar ALU operation.
    Alu,
    /// Scalar multiply.
    Mul,
    /// Scalar divide or remainder.
    Div,
    /// Branch, jump or loop.
    Branch,
    /// Scalar load or store; latency depends on the memory space.
    ScalarMem,
    /// Special-register write (mask, feature-map config) or read.
    Spr,
    /// Vector add/sub/max/min/abs/relu/move/duplicate/compare/select/bitwise.
    VecSimple,
    /// Vector multiply and multiply-add.
    VecMul,
    /// Vector divide and reciprocal.
    VecDiv,
    /// Vector exp/ln/sqrt/rsqrt.
    VecTranscend,
    /// Vector reductions.
    VecReduce,
    /// Vector type conversions.
    VecConv,
    /// L0C -> UB move on the vector pipe.
    L0cMove,
    /// GM -> local buffer DMA through the shared memory system.
    DmaRead,
    /// Local buffer -> GM DMA through the shared memory system.
    DmaWrite,
    /// L1 -> L0A/L0B fractal load.
    Load2d,
    /// L1 -> L0A img2col load.
    Img2col,
    /// Cube matrix multiply-accumulate.
    Cube,
    /// Flags and barriers.
    Sync,
    /// End of kernel.
    End,
}

/// Everything the table says about one instruction.
#[derive(Debug, Clone, Copy)]
pub struct InstrSpec {
    /// Encoded opcode byte.
    pub opcode: u8,
    /// Base mnemonic (without type suffixes).
    pub mnemonic: &'static str,
    /// Executing pipe.
    pub pipe: PipeClass,
    /// Cost class.
    pub timing: TimingClass,
    /// Operand layout name.
    pub format: &'static str,
    /// Operand fields.
    pub fields: &'static [FieldSpec],
    /// Element types allowed in the field named `ty`; empty when the format has none.
    pub types: &'static [DType],
    /// One-paragraph description.
    pub doc: &'static str,
}

impl InstrSpec {
    /// Index of the field with this name.
    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }
}

/// The text of a mnemonic written as an identifier in the table: `add` is `"add"` and the raw
/// identifier `r#loop` (a Rust keyword) is `"loop"`.
pub const fn mnemonic_text(ident: &'static str) -> &'static str {
    match ident.as_bytes() {
        [b'r', b'#', rest @ ..] => match core::str::from_utf8(rest) {
            Ok(text) => text,
            Err(_) => panic!("a mnemonic is ASCII"),
        },
        _ => ident,
    }
}

/// The position of the field called `name` in `fields`; a compile-time error when there is none
/// (the builders and the unit constants look fields up by name in constant context).
pub const fn field_position(fields: &[FieldSpec], name: &str) -> usize {
    let mut i = 0;
    while i < fields.len() {
        if str_eq(fields[i].name, name) {
            return i;
        }
        i += 1;
    }
    panic!("no field of that name in the format")
}

/// The largest value the field called `name` of `fields` holds, from its declared width and its
/// type (signed fields: the largest positive value).
pub const fn field_max(fields: &[FieldSpec], name: &str) -> u64 {
    let f = &fields[field_position(fields, name)];
    match f.kind {
        FieldKind::Signed => (1u64 << (f.bits - 1)) - 1,
        _ => f.max,
    }
}

/// The largest raw value of a field `bits` wide whose type allows up to `type_max`.
pub const fn width_max(bits: u32, type_max: u64) -> u64 {
    let width = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    if type_max < width { type_max } else { width }
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Declares operand layouts. See the module docs.
///
/// Besides the struct and its [`Format`] impl, each layout gets two pieces of the typed program
/// builder (`crate::build`): a chained setter on `Emitted<'_, Layout>` for every keyed field,
/// and a macro named after the layout that `instructions!` expands into one builder method per
/// instruction, taking the suffix and positional fields as arguments in declaration order.
macro_rules! formats {
    ( $(
        $(#[doc = $fdoc:literal])*
        $fmt:ident {
            $( $(#[$place:ident])? $field:ident : $fty:ident $([$bits:literal])? $(= $def:expr)? ),* $(,)?
        }
    )* ) => { $(
        $(#[doc = $fdoc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(missing_docs)]
        pub struct $fmt { $( pub $field: $fty ),* }

        impl $crate::spec::Format for $fmt {
            const NAME: &'static str = stringify!($fmt);
            const FIELDS: &'static [$crate::spec::FieldSpec] = &[ $(
                $crate::spec::FieldSpec {
                    name: stringify!($field),
                    bits: formats!(@bits $fty $(, $bits)?),
                    max: $crate::spec::width_max(
                        formats!(@bits $fty $(, $bits)?),
                        <$fty as $crate::operand::FieldType>::MAX_RAW,
                    ),
                    kind: <$fty as $crate::operand::FieldType>::KIND,
                    placement: formats!(@place $($place)? ; $fty ; $($def)?),
                }
            ),* ];
            const TOTAL_BITS: u32 = 0 $( + formats!(@bits $fty $(, $bits)?) )*;
            #[allow(unused_assignments, unused_variables, unused_mut)]
            fn to_raw(&self, out: &mut [u64]) {
                let mut i = 0;
                $( out[i] = $crate::operand::FieldType::to_raw(&self.$field); i += 1; )*
            }
            #[allow(unused_assignments, unused_variables, unused_mut)]
            fn from_raw(raw: &[u64]) -> Option<Self> {
                let mut i = 0;
                Some(Self { $( $field: {
                    let v = <$fty as $crate::operand::FieldType>::from_raw(raw[i])?;
                    i += 1;
                    v
                } ),* })
            }
        }

        const _: () = assert!(
            <$fmt as $crate::spec::Format>::TOTAL_BITS <= $crate::spec::PAYLOAD_BITS,
            concat!("format ", stringify!($fmt), " is wider than the instruction payload"),
        );
        $( const _: () = assert!(
            formats!(@bits $fty $(, $bits)?) <= <$fty as $crate::operand::FieldType>::BITS,
            concat!("field ", stringify!($fmt), ".", stringify!($field), " is declared wider than its type"),
        ); )*

        formats!(@builder ($) $fmt [] [] $( { $($place)? } $field $fty { $($def)? } )*);
    )* };
    (@bits $fty:ident) => { <$fty as $crate::operand::FieldType>::BITS };
    (@bits $fty:ident, $bits:literal) => { $bits };
    (@place suffix ; $fty:ident ; ) => { $crate::spec::Placement::Suffix };
    (@place ; $fty:ident ; $def:expr) => {
        $crate::spec::Placement::Keyed(|| <$fty as $crate::operand::FieldType>::to_raw(&$def))
    };
    (@place ; $fty:ident ; ) => { $crate::spec::Placement::Positional };

    // The builder pieces: sort the fields into arguments (suffix and positional) and setters
    // (keyed), then emit the setters and the per-layout method macro.
    (@builder ($d:tt) $fmt:ident [$($arg:tt)*] [$($set:tt)*]
        { $($place:ident)? } $field:ident $fty:ident { } $($rest:tt)*) => {
        formats!(@builder ($d) $fmt [$($arg)* $field : $fty,] [$($set)*] $($rest)*);
    };
    (@builder ($d:tt) $fmt:ident [$($arg:tt)*] [$($set:tt)*]
        { } $field:ident $fty:ident { $def:expr } $($rest:tt)*) => {
        formats!(@builder ($d) $fmt [$($arg)*] [$($set)* $field : $fty = $def,] $($rest)*);
    };
    (@builder ($d:tt) $fmt:ident [$($arg:ident : $aty:ident,)*] [$($set:ident : $sty:ident = $sdef:expr,)*]) => {
        impl $crate::build::Emitted<'_, $fmt> {
            $(
                #[doc = concat!(
                    "Sets the keyed operand `", stringify!($set), "` (default `",
                    stringify!($sdef), "`); an out-of-range value is a sticky ",
                    "[`BuildError::FieldRange`](crate::BuildError::FieldRange)."
                )]
                pub fn $set(mut self, value: impl $crate::build::Operand<$sty>) -> Self {
                    self.set_operand::<$sty>(
                        const {
                            $crate::spec::field_position(
                                <$fmt as $crate::spec::Format>::FIELDS,
                                stringify!($set),
                            )
                        },
                        value,
                    );
                    self
                }
            )*
        }

        #[allow(unused_macros)]
        macro_rules! $fmt {
            (@rebuild $d b:expr, $d f:ident, $d mn:ident) => {{
                let _ = $d b.$d mn($( $d f.$arg ),*) $( .$set($d f.$set) )*;
            }};
            ($d(#[doc = $d doc:literal])* $d mn:ident $d var:ident) => {
                $d(#[doc = $d doc])*
                #[doc = ""]
                #[doc = concat!(
                    "Operand layout [`", stringify!($fmt), "`](crate::", stringify!($fmt),
                    "); keyed operands are set on the returned [`Emitted`](crate::Emitted)."
                )]
                // The arguments are the instruction's operands, as many as its text has.
                #[allow(clippy::too_many_arguments)]
                pub fn $d mn(
                    &mut self,
                    $( $arg: impl $crate::build::Operand<$aty>, )*
                ) -> $crate::build::Emitted<'_, $fmt> {
                    #[allow(unused_mut)]
                    let mut pending = self.start($crate::table::Opcode::$d var);
                    $(
                        pending.operand::<$aty>(
                            const {
                                $crate::spec::field_position(
                                    <$fmt as $crate::spec::Format>::FIELDS,
                                    stringify!($arg),
                                )
                            },
                            $arg,
                        );
                    )*
                    pending.emit()
                }
            };
        }
    };
}

/// Declares the instructions. See the module docs.
///
/// The mnemonic is written as an identifier (`vadd`, `copy_gm_to_ub`; the keyword `loop` as
/// `r#loop`): it is both the assembly spelling and the name of the instruction's builder method
/// on [`crate::ProgramBuilder`].
macro_rules! instructions {
    ( $(
        $(#[doc = $doc:literal])*
        $var:ident = $op:literal, $mn:ident, $pipe:ident, $timing:ident, $fmt:ident $(, [$($ty:ident),*])? ;
    )* ) => {
        /// Opcode byte of every instruction.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode { $( $(#[doc = $doc])* $var = $op ),* }

        impl Opcode {
            /// Every opcode in table order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$var),*];

            /// The opcode with this byte, if any.
            pub fn from_u8(byte: u8) -> Option<Opcode> {
                match byte {
                    $( $op => Some(Opcode::$var), )*
                    _ => None,
                }
            }

            /// The table entry of this opcode.
            pub fn spec(self) -> &'static $crate::spec::InstrSpec {
                &SPECS[self.table_index()]
            }

            /// Position of this opcode in [`Opcode::ALL`].
            pub fn table_index(self) -> usize {
                SPEC_INDEX[self as u8 as usize] as usize
            }
        }

        /// The table, in declaration order.
        pub static SPECS: &[$crate::spec::InstrSpec] = &[ $(
            $crate::spec::InstrSpec {
                opcode: $op,
                mnemonic: $crate::spec::mnemonic_text(stringify!($mn)),
                pipe: instructions!(@pipe $pipe),
                timing: $crate::spec::TimingClass::$timing,
                format: <$fmt as $crate::spec::Format>::NAME,
                fields: <$fmt as $crate::spec::Format>::FIELDS,
                types: &[ $($( $crate::operand::DType::$ty ),*)? ],
                doc: concat!($($doc, "\n"),*),
            }
        ),* ];

        static SPEC_INDEX: [u16; 256] = {
            let mut index = [u16::MAX; 256];
            let ops: &[u8] = &[$($op),*];
            let mut i = 0;
            while i < ops.len() {
                assert!(index[ops[i] as usize] == u16::MAX, "two instructions share an opcode");
                index[ops[i] as usize] = i as u16;
                i += 1;
            }
            index
        };

        /// A decoded instruction: the opcode with its typed operands.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Instruction { $( $(#[doc = $doc])* $var($fmt) ),* }

        impl Instruction {
            /// The opcode.
            pub fn opcode(&self) -> Opcode {
                match self { $( Instruction::$var(_) => Opcode::$var ),* }
            }

            /// The table entry.
            pub fn spec(&self) -> &'static $crate::spec::InstrSpec {
                self.opcode().spec()
            }

            /// Writes the raw value of every operand into `out`; returns how many there are.
            pub fn raw_fields(&self, out: &mut [u64; $crate::spec::MAX_FIELDS]) -> usize {
                match self { $( Instruction::$var(f) => {
                    $crate::spec::Format::to_raw(f, out);
                    <$fmt as $crate::spec::Format>::FIELDS.len()
                } ),* }
            }

            /// Builds an instruction from its opcode and raw operand values (no constraint checks).
            pub fn from_raw_fields(opcode: Opcode, raw: &[u64]) -> Option<Instruction> {
                match opcode { $(
                    Opcode::$var => <$fmt as $crate::spec::Format>::from_raw(raw).map(Instruction::$var),
                )* }
            }
        }

        /// One typed builder method per instruction, named after its mnemonic.
        impl $crate::build::ProgramBuilder {
            $( $fmt! { $(#[doc = $doc])* $mn $var } )*

            /// Appends an instruction given whole, through its typed method and setters, so
            /// the same checks apply (a field wider than its declared width is a
            /// [`BuildError::FieldRange`](crate::BuildError::FieldRange)); branch targets are
            /// taken as absolute instruction indices.
            #[allow(unused_variables)] // the operand-less layout reads no field
            pub fn instruction(&mut self, instr: Instruction) {
                match instr { $(
                    Instruction::$var(f) => $fmt!(@rebuild self, f, $mn),
                )* }
            }
        }
    };
    (@pipe Routed) => { $crate::spec::PipeClass::Routed };
    (@pipe $p:ident) => { $crate::spec::PipeClass::Fixed($crate::operand::Pipe::$p) };
}

pub(crate) use formats;
pub(crate) use instructions;
