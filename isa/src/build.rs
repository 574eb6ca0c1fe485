//! Typed program builders: kernels written as Rust calls instead of assembly text.
//!
//! [`ProgramBuilder`] has one method per instruction, generated from the table in `table.rs` by
//! the same `formats!` / `instructions!` macros that derive the encoder, so a new instruction
//! gets its builder method without anyone writing it.
//!
//! # Naming rule
//!
//! The method is the mnemonic (`vadd`, `copy_gm_to_ub`, `set_flag`, `ld`, `end`); the one
//! mnemonic that is a Rust keyword is called through its raw identifier (`b.r#loop(..)`).
//!
//! # Arguments
//!
//! The suffix and positional operands are the arguments, in the order the format declares
//! them — the order of assembly text: `vadd.f16 x2, x3, x4` is `b.vadd(F16, X2, X3, X4)`,
//! `ld.gm.u64 x2, x1` is `b.ld(Gm, U64, X2, X1)`. Each argument is typed by its field:
//!
//! - registers take a [`Reg`] (`Reg::X0` .. `Reg::X31`), enum operands their enum
//!   ([`DType`](crate::DType), [`Cmp`](crate::Cmp), [`Pipe`](crate::Pipe), ...), flags a `bool`;
//! - branch targets take a [`Label`] from [`ProgramBuilder::new_label`] (or an absolute
//!   [`Target`]);
//! - numeric fields (repeat, strides, burst count and length, gaps, immediates) take any
//!   primitive integer and are range-checked against the width the table declares for the field
//!   (`nburst: u16 [12]` holds 0..=4095). A value out of range is a [`BuildError::FieldRange`]
//!   naming the instruction, its index, the field and the range.
//!
//! # Keyed operands: chained setters
//!
//! Operands with a table default (`repeat: u8 = 1`) are not arguments: every method returns an
//! [`Emitted`] handle on the instruction just appended, with one setter per keyed field of its
//! format, so the defaults cost nothing at the call site and the others read like the text:
//! `b.vadd(F16, X2, X3, X4).repeat(2).dst_rep(0)`. The handle may be ignored. (A per-format
//! options struct would need `..Default::default()` on most calls; setters keep calls short
//! and are generated from the same table.)
//!
//! # Errors
//!
//! Errors are sticky: the builder keeps the first one and [`ProgramBuilder::finish`] returns it,
//! so call sites need no `?` per instruction. Nothing panics. Besides field ranges, `finish`
//! reports a table constraint broken (element type, conversion), a label placed twice or never
//! placed, a branch past the end, a bad kernel or label name, and more instructions than the
//! configured maximum.
//!
//! # Comments and listings
//!
//! [`ProgramBuilder::comment`] attaches comment lines to the next instruction; `finish` returns
//! them as [`Comments`] next to the [`Program`]. [`Program::listing`] prints the program with
//! its comments and labels through the disassembler; that listing assembles back to the very
//! same program (a built program's `source_lines` are the lines of its listing).
//!
//! ```
//! use gearsim_isa::{DType, Pipe, ProgramBuilder, Reg, SReg, Space, SType, assemble};
//!
//! let mut b = ProgramBuilder::new("example");
//! let top = b.new_label("top");
//! b.sreg(Reg::X1, SReg::Args);
//! b.ld(Space::Gm, SType::U64, Reg::X2, Reg::X1).off(8);
//! b.movi(Reg::X3, 4);
//! b.comment("four repeats of 128 f16 each time round");
//! b.place(top);
//! b.vadd(DType::F16, Reg::X2, Reg::X2, Reg::X2).repeat(4);
//! b.copy_ub_to_gm(Reg::X2, Reg::X2, 2, 8).dst_gap(8);
//! b.set_flag(Pipe::Mte3, Pipe::V, 0);
//! b.wait_flag(Pipe::Mte3, Pipe::V, 0);
//! b.r#loop(Reg::X3, top);
//! b.end();
//! let (program, comments) = b.finish().unwrap();
//! assert_eq!(program.disasm_at(4), "copy_ub_to_gm x2, x2, 2, 8, dst_gap=8");
//! assert_eq!(assemble(&program.listing(&comments), "example.s").unwrap(), program);
//!
//! let mut b = ProgramBuilder::new("too_far");
//! b.copy_gm_to_ub(Reg::X1, Reg::X2, 4096, 1);
//! assert!(b.finish().is_err());
//! ```

use std::marker::PhantomData;

use thiserror::Error;

use crate::operand::{
    Cmp, CrossFlagId, CrossMode, DType, FieldKind, FieldType, Pipe, Quant, ReduceOp, Reg, Round,
    SReg, SType, Space, Target,
};
use crate::program::{Comments, Program};
use crate::spec::{FieldSpec, MAX_FIELDS};
use crate::table::{Instruction, Opcode};

/// The most instructions a builder accepts unless told otherwise ([`ProgramBuilder::max_instructions`]).
pub const DEFAULT_MAX_INSTRUCTIONS: usize = 1 << 20;

/// A branch target of a program being built; placed once with [`ProgramBuilder::place`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label(u32);

/// Why a program could not be built. The first error a builder meets is kept and returned by
/// [`ProgramBuilder::finish`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BuildError {
    /// A numeric operand does not fit the width the table declares for its field.
    #[error("instruction {pc} ({mnemonic}): operand `{field}` = {value} is outside {min}..={max}")]
    FieldRange {
        /// Index of the instruction in the program.
        pc: usize,
        /// Instruction mnemonic.
        mnemonic: &'static str,
        /// Field name.
        field: &'static str,
        /// The value given.
        value: i128,
        /// Smallest value the field holds.
        min: i128,
        /// Largest value the field holds.
        max: i128,
    },
    /// The operands break a rule of the instruction (element type, conversion).
    #[error("instruction {pc} ({mnemonic}): {reason}")]
    Constraint {
        /// Index of the instruction in the program.
        pc: usize,
        /// Instruction mnemonic.
        mnemonic: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// More instructions than the builder's maximum.
    #[error("program {program} has more than {max} instructions")]
    TooManyInstructions {
        /// Kernel name.
        program: String,
        /// The maximum.
        max: usize,
    },
    /// A kernel or label name the assembler could not read back.
    #[error(
        "`{name}` is not a valid {what} name (letters, digits and `_`, not starting with a digit)"
    )]
    BadName {
        /// `kernel` or `label`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// Two labels of one program share a name.
    #[error("label `{name}` is created twice")]
    DuplicateLabel {
        /// The name.
        name: String,
    },
    /// A label is placed twice.
    #[error("label `{name}` is placed twice (at {first} and {second})")]
    LabelPlacedTwice {
        /// The name.
        name: String,
        /// Where it was placed first.
        first: u32,
        /// Where it was placed again.
        second: u32,
    },
    /// A label is never placed.
    #[error("label `{name}` is never placed")]
    LabelUnplaced {
        /// The name.
        name: String,
    },
    /// A label that this builder did not create.
    #[error("label #{index} does not belong to this builder")]
    ForeignLabel {
        /// The label's index.
        index: u32,
    },
    /// A branch to an instruction index past the end of the program.
    #[error(
        "instruction {pc} ({mnemonic}): branch target {target} is past the end ({len} instructions)"
    )]
    TargetPastEnd {
        /// Index of the branching instruction.
        pc: usize,
        /// Instruction mnemonic.
        mnemonic: &'static str,
        /// The target.
        target: u32,
        /// Program length.
        len: usize,
    },
}

/// What an operand argument becomes: a raw field value, or a label resolved at `finish`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lowered {
    /// The raw bits of the field (sign-extended for signed fields).
    Raw(u64),
    /// A label, resolved to its instruction index by [`ProgramBuilder::finish`].
    Label(Label),
}

/// A value a builder method accepts for a field of type `T`: the type itself for registers,
/// enums and flags; any primitive integer for numeric fields (range-checked against the field's
/// declared width); a [`Label`] or [`Target`] for branch targets.
pub trait Operand<T: FieldType> {
    /// The field's raw value, or the value given when it is out of the field's range.
    fn lower(self, field: &FieldSpec) -> Result<Lowered, i128>;
}

macro_rules! exact_operands {
    ($($t:ty),*) => {$(
        impl Operand<$t> for $t {
            fn lower(self, _field: &FieldSpec) -> Result<Lowered, i128> {
                Ok(Lowered::Raw(FieldType::to_raw(&self)))
            }
        }
    )*};
}
exact_operands!(
    Reg,
    DType,
    Pipe,
    Cmp,
    ReduceOp,
    Round,
    Quant,
    SReg,
    SType,
    Space,
    bool,
    Target,
    CrossMode,
    CrossFlagId
);

impl Operand<Target> for Label {
    fn lower(self, _field: &FieldSpec) -> Result<Lowered, i128> {
        Ok(Lowered::Label(self))
    }
}

macro_rules! int_operands {
    ($($field:ty),*) => {$(
        int_operands!(@each $field; u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);
    )*};
    (@each $field:ty; $($arg:ty),*) => {$(
        impl Operand<$field> for $arg {
            fn lower(self, field: &FieldSpec) -> Result<Lowered, i128> {
                int_raw(i128::try_from(self).unwrap_or(i128::MAX), field)
            }
        }
    )*};
}
int_operands!(u8, u16, u32, u64, i16, i32, i64, CrossFlagId);

/// The range of a numeric field: its width's, or its type's when narrower.
pub fn field_range(field: &FieldSpec) -> (i128, i128) {
    match field.kind {
        FieldKind::Signed => {
            let half = 1i128 << (field.bits - 1);
            (-half, half - 1)
        }
        _ => (0, i128::from(field.max)),
    }
}

fn int_raw(value: i128, field: &FieldSpec) -> Result<Lowered, i128> {
    let (min, max) = field_range(field);
    if value < min || value > max {
        return Err(value);
    }
    // In range, so the value fits 64 bits: two's complement for signed fields.
    Ok(Lowered::Raw(match field.kind {
        FieldKind::Signed => i64::try_from(value).map_or(0, |v| v as u64),
        _ => u64::try_from(value).unwrap_or(0),
    }))
}

struct LabelSlot {
    name: String,
    pc: Option<u32>,
}

struct Fixup {
    instr: usize,
    field: usize,
    label: Label,
}

/// A program being built; see the module docs.
pub struct ProgramBuilder {
    name: String,
    instrs: Vec<Instruction>,
    labels: Vec<LabelSlot>,
    fixups: Vec<Fixup>,
    comments: Vec<(u32, String)>,
    max: usize,
    error: Option<BuildError>,
}

impl std::fmt::Debug for ProgramBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramBuilder")
            .field("name", &self.name)
            .field("instructions", &self.instrs.len())
            .field("labels", &self.labels.len())
            .field("error", &self.error)
            .finish()
    }
}

impl ProgramBuilder {
    /// A builder for the kernel called `name` (spelled as `.kernel name` in its listing).
    pub fn new(name: impl Into<String>) -> ProgramBuilder {
        let name = name.into();
        let mut b = ProgramBuilder {
            name,
            instrs: Vec::new(),
            labels: Vec::new(),
            fixups: Vec::new(),
            comments: Vec::new(),
            max: DEFAULT_MAX_INSTRUCTIONS,
            error: None,
        };
        if !is_identifier(&b.name) {
            let name = b.name.clone();
            b.fail(BuildError::BadName {
                what: "kernel",
                name,
            });
        }
        b
    }

    /// Sets the most instructions the program may have; one more is a
    /// [`BuildError::TooManyInstructions`] (and is not kept, so memory stays bounded).
    pub fn max_instructions(mut self, max: usize) -> ProgramBuilder {
        self.max = max;
        self
    }

    /// Instructions appended so far: the index the next one gets.
    pub fn len(&self) -> usize {
        self.instrs.len()
    }

    /// Whether no instruction was appended yet.
    pub fn is_empty(&self) -> bool {
        self.instrs.is_empty()
    }

    /// The first error met so far, if any.
    pub fn error(&self) -> Option<&BuildError> {
        self.error.as_ref()
    }

    /// A new, not yet placed label. Its name is how the listing and disassembly show it.
    pub fn new_label(&mut self, name: impl Into<String>) -> Label {
        let name = name.into();
        if !is_identifier(&name) {
            self.fail(BuildError::BadName {
                what: "label",
                name: name.clone(),
            });
        } else if self.labels.iter().any(|l| l.name == name) {
            self.fail(BuildError::DuplicateLabel { name: name.clone() });
        }
        let index = u32::try_from(self.labels.len()).unwrap_or(u32::MAX);
        self.labels.push(LabelSlot { name, pc: None });
        Label(index)
    }

    /// Places `label` at the next instruction.
    pub fn place(&mut self, label: Label) {
        let pc = self.pc();
        match self.labels.get_mut(label.0 as usize) {
            None => self.fail(BuildError::ForeignLabel { index: label.0 }),
            Some(slot) => match slot.pc {
                Some(first) => {
                    let name = slot.name.clone();
                    self.fail(BuildError::LabelPlacedTwice {
                        name,
                        first,
                        second: pc,
                    });
                }
                None => slot.pc = Some(pc),
            },
        }
    }

    /// A comment before the next instruction (several lines if `text` has several).
    pub fn comment(&mut self, text: impl AsRef<str>) {
        let pc = self.pc();
        for line in text.as_ref().lines() {
            self.comments.push((pc, line.trim_end().to_string()));
        }
    }

    /// The program and its comments, or the first error met.
    pub fn finish(self) -> Result<(Program, Comments), BuildError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut instrs = self.instrs;
        let mut placed = Vec::with_capacity(self.labels.len());
        for slot in &self.labels {
            match slot.pc {
                Some(pc) => placed.push(pc),
                None => {
                    return Err(BuildError::LabelUnplaced {
                        name: slot.name.clone(),
                    });
                }
            }
        }
        for f in &self.fixups {
            let instr = &mut instrs[f.instr];
            let mut raw = [0u64; MAX_FIELDS];
            let n = instr.raw_fields(&mut raw);
            raw[f.field] = u64::from(placed[f.label.0 as usize]);
            if let Some(resolved) = Instruction::from_raw_fields(instr.opcode(), &raw[..n]) {
                *instr = resolved;
            }
        }
        let len = instrs.len();
        for (pc, instr) in instrs.iter().enumerate() {
            let spec = instr.spec();
            let mut raw = [0u64; MAX_FIELDS];
            let n = instr.raw_fields(&mut raw);
            for (field, &v) in spec.fields.iter().zip(&raw[..n]) {
                if field.kind == FieldKind::Target && v >= len as u64 {
                    return Err(BuildError::TargetPastEnd {
                        pc,
                        mnemonic: spec.mnemonic,
                        target: u32::try_from(v).unwrap_or(u32::MAX),
                        len,
                    });
                }
            }
        }
        let mut labels: Vec<(String, u32)> = self
            .labels
            .into_iter()
            .zip(placed)
            .map(|(slot, pc)| (slot.name, pc))
            .collect();
        labels.sort();
        let comments = Comments {
            lines: self.comments,
        };
        let mut program = Program::with_source(Some(self.name), instrs, labels, Vec::new());
        program.source_lines = program.listing_lines(&comments);
        Ok((program, comments))
    }

    fn pc(&self) -> u32 {
        u32::try_from(self.instrs.len()).unwrap_or(u32::MAX)
    }

    fn fail(&mut self, error: BuildError) {
        if self.error.is_none() {
            self.error = Some(error);
        }
    }

    /// Starts an instruction: every keyed field at its table default, the rest zero until the
    /// generated method sets them.
    pub(crate) fn start(&mut self, opcode: Opcode) -> Pending<'_> {
        let spec = opcode.spec();
        let mut raw = [0u64; MAX_FIELDS];
        for (slot, field) in raw.iter_mut().zip(spec.fields) {
            *slot = field.default_raw().unwrap_or(0);
        }
        Pending {
            builder: self,
            opcode,
            raw,
            labels: Vec::new(),
        }
    }

    fn lower<T: FieldType>(
        &mut self,
        pc: usize,
        opcode: Opcode,
        index: usize,
        value: impl Operand<T>,
    ) -> Option<Lowered> {
        let spec = opcode.spec();
        let field = &spec.fields[index];
        match value.lower(field) {
            Ok(lowered) => Some(lowered),
            Err(value) => {
                let (min, max) = field_range(field);
                self.fail(BuildError::FieldRange {
                    pc,
                    mnemonic: spec.mnemonic,
                    field: field.name,
                    value,
                    min,
                    max,
                });
                None
            }
        }
    }

    fn set_operand<T: FieldType>(&mut self, at: usize, index: usize, value: impl Operand<T>) {
        let opcode = self.instrs[at].opcode();
        match self.lower(at, opcode, index, value) {
            None => {}
            Some(Lowered::Label(label)) => {
                self.fixups.retain(|f| !(f.instr == at && f.field == index));
                self.fixups.push(Fixup {
                    instr: at,
                    field: index,
                    label,
                });
            }
            Some(Lowered::Raw(v)) => {
                let mut raw = [0u64; MAX_FIELDS];
                let n = self.instrs[at].raw_fields(&mut raw);
                raw[index] = v;
                if let Some(instr) = Instruction::from_raw_fields(opcode, &raw[..n]) {
                    self.instrs[at] = instr;
                }
            }
        }
    }
}

/// An instruction whose operands are being filled in by its generated builder method.
pub(crate) struct Pending<'a> {
    builder: &'a mut ProgramBuilder,
    opcode: Opcode,
    raw: [u64; MAX_FIELDS],
    labels: Vec<(usize, Label)>,
}

impl<'a> Pending<'a> {
    pub(crate) fn operand<T: FieldType>(&mut self, index: usize, value: impl Operand<T>) {
        let pc = self.builder.instrs.len();
        match self.builder.lower(pc, self.opcode, index, value) {
            None => {}
            Some(Lowered::Raw(v)) => self.raw[index] = v,
            Some(Lowered::Label(l)) => {
                if (l.0 as usize) < self.builder.labels.len() {
                    self.labels.push((index, l));
                } else {
                    self.builder.fail(BuildError::ForeignLabel { index: l.0 });
                }
            }
        }
    }

    pub(crate) fn emit<F>(self) -> Emitted<'a, F> {
        let b = self.builder;
        let pc = b.instrs.len();
        let spec = self.opcode.spec();
        if pc >= b.max {
            let program = b.name.clone();
            b.fail(BuildError::TooManyInstructions {
                program,
                max: b.max,
            });
            return Emitted {
                builder: b,
                at: None,
                format: PhantomData,
            };
        }
        let Some(instr) = Instruction::from_raw_fields(self.opcode, &self.raw[..spec.fields.len()])
        else {
            // Every raw value came from a typed operand, so this cannot happen; report it as a
            // constraint rather than panic.
            b.fail(BuildError::Constraint {
                pc,
                mnemonic: spec.mnemonic,
                reason: "operands name no value".into(),
            });
            return Emitted {
                builder: b,
                at: None,
                format: PhantomData,
            };
        };
        if let Err(reason) = instr.validate() {
            b.fail(BuildError::Constraint {
                pc,
                mnemonic: spec.mnemonic,
                reason,
            });
        }
        b.instrs.push(instr);
        for (field, label) in self.labels {
            b.fixups.push(Fixup {
                instr: pc,
                field,
                label,
            });
        }
        Emitted {
            builder: b,
            at: Some(pc),
            format: PhantomData,
        }
    }
}

/// The instruction a builder method just appended, with one chained setter per keyed operand
/// of its format `F` (`.repeat(2)`, `.dst_gap(8)`, `.off(16)`). Dropping it is fine.
pub struct Emitted<'a, F> {
    builder: &'a mut ProgramBuilder,
    at: Option<usize>,
    format: PhantomData<F>,
}

impl<F> Emitted<'_, F> {
    /// Sets field `index` of the instruction (used by the generated setters).
    pub(crate) fn set_operand<T: FieldType>(&mut self, index: usize, value: impl Operand<T>) {
        if let Some(at) = self.at {
            self.builder.set_operand(at, index, value);
        }
    }
}

impl<F> std::fmt::Debug for Emitted<'_, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emitted").field("at", &self.at).finish()
    }
}

/// Whether the assembler reads `name` back as one identifier (and not as a number).
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
