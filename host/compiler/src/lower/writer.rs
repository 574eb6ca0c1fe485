//! Writing kernels: an [`Asm`] is the ISA's typed [`ProgramBuilder`] (its generated method per
//! instruction, reached through `Deref`) plus what a lowering needs around it: registers handed
//! out by name, labels by name, the tiling recorded (shown as comments in `--dump_kernels`,
//! whose text is the built program's listing from the disassembler, made only when asked).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::ops::{Deref, DerefMut};

use gearsim_isa::build::{BuildError, Label, ProgramBuilder};
use gearsim_isa::{Comments, Program, SType, Space};

/// A scalar register.
pub use gearsim_isa::Reg;

/// The most instructions one kernel may have: hundreds of times what any lowering writes for
/// real shapes (a few thousand), and small enough that a lowering unrolled over an absurd shape
/// (a damaged model, a huge gear) stops with an error instead of filling memory.
pub const MAX_KERNEL_INSTRUCTIONS: usize = 1 << 20;

/// Registers a kernel may hand out (x0 is kept free for hand-written code and debugging).
const FIRST_REG: u8 = 1;
const REG_COUNT: u8 = gearsim_isa::operand::NUM_REGS as u8;

/// A written kernel.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The built program.
    pub program: Program,
    /// Its comments (the tiling among them), for [`Program::listing`].
    pub comments: Comments,
    /// The tiling parameters recorded.
    pub tiling: Vec<(String, i64)>,
}

/// A kernel being written.
#[derive(Debug)]
pub struct Asm {
    b: ProgramBuilder,
    name: String,
    next_reg: u8,
    labels: BTreeMap<String, Label>,
    label_count: u32,
    tiling: Vec<(String, i64)>,
    overflow: bool,
    /// The first inconsistency a lowering found in its own plan (a bug of the generator).
    generator_error: Option<String>,
}

impl Deref for Asm {
    type Target = ProgramBuilder;
    fn deref(&self) -> &ProgramBuilder {
        &self.b
    }
}

impl DerefMut for Asm {
    fn deref_mut(&mut self) -> &mut ProgramBuilder {
        &mut self.b
    }
}

impl Asm {
    /// A new kernel called `name`.
    pub fn new(name: &str) -> Asm {
        Asm {
            b: ProgramBuilder::new(name).max_instructions(MAX_KERNEL_INSTRUCTIONS),
            name: name.to_string(),
            next_reg: FIRST_REG,
            labels: BTreeMap::new(),
            label_count: 0,
            tiling: Vec::new(),
            overflow: false,
            generator_error: None,
        }
    }

    /// Whether the kernel has reached the instruction limit (its `finish` will fail).
    pub fn too_long(&self) -> bool {
        matches!(self.b.error(), Some(BuildError::TooManyInstructions { .. }))
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A register no other part of the kernel uses.
    pub fn reg(&mut self) -> Reg {
        if self.next_reg >= REG_COUNT {
            self.overflow = true;
            return Reg::X31;
        }
        let r = Reg::new(self.next_reg).unwrap_or(Reg::X31);
        self.next_reg += 1;
        r
    }

    /// `N` fresh registers.
    pub fn regs<const N: usize>(&mut self) -> [Reg; N] {
        std::array::from_fn(|_| self.reg())
    }

    /// Records a tiling parameter (shown in the dump's header and the kernel's description).
    pub fn tiling(&mut self, name: &str, value: i64) {
        self.b.comment(format!("tiling {name} = {value}"));
        self.tiling.push((name.to_string(), value));
    }

    /// A comment line above the next instruction.
    pub fn comment(&mut self, text: impl Display) {
        self.b.comment(text.to_string());
    }

    /// Records that the lowering asked for something inconsistent (a bug of the generator, not
    /// of the model): `finish` then fails naming the kernel, instead of a panic.
    pub fn generator_error(&mut self, what: &str) {
        self.generator_error.get_or_insert_with(|| what.to_string());
    }

    /// A fresh label name (not yet placed). The builder's label is made when the name is
    /// first placed or branched to, so a name a lowering makes but ends up not using is no
    /// error.
    pub fn new_label(&mut self, stem: &str) -> String {
        self.label_count += 1;
        format!("{stem}_{}", self.label_count)
    }

    /// The builder's label of a name from [`Asm::new_label`], for the typed branch methods.
    pub fn label(&mut self, name: &str) -> Label {
        if let Some(l) = self.labels.get(name) {
            return *l;
        }
        let l = self.b.new_label(name.to_string());
        self.labels.insert(name.to_string(), l);
        l
    }

    /// Places a label at the next instruction.
    pub fn place(&mut self, label: &str) {
        let l = self.label(label);
        self.b.place(l);
    }

    /// `dst = value`.
    pub fn movi(&mut self, dst: Reg, value: i64) {
        self.b.movi(dst, value);
    }

    /// A register holding `value`.
    pub fn constant(&mut self, value: i64) -> Reg {
        let r = self.reg();
        self.movi(r, value);
        r
    }

    /// Loads argument `index` (a u64 of the argument array) into a new register.
    pub fn arg(&mut self, args: Reg, index: usize) -> Reg {
        let r = self.reg();
        self.b.ld(Space::Gm, SType::U64, r, args).off(index * 8);
        r
    }

    /// `dst += value` (nothing for 0).
    pub fn add_imm(&mut self, dst: Reg, value: i64) {
        if value == 0 {
            return;
        }
        if i32::try_from(value).is_ok() {
            self.b.addi(dst, dst, value);
        } else {
            let t = self.reg();
            self.movi(t, value);
            self.b.add(dst, dst, t);
        }
    }

    /// Puts the vector mask in counter mode for `count` elements.
    pub fn mask_count(&mut self, scratch: Reg, count: u64) {
        self.movi(scratch, count as i64);
        self.b.set_mask_count(scratch);
    }

    /// The built program and its listing. Errors are the generator's bugs (a bad operand or
    /// line, too many registers) or a shape too large for the kernel's unrolled code, reported
    /// with the kernel's name.
    pub fn finish(mut self) -> Result<Finished, FinishError> {
        if let Some(BuildError::TooManyInstructions { .. }) = self.b.error() {
            return Err(FinishError::TooLarge(format!(
                "kernel {} would have {} instructions or more, past the {MAX_KERNEL_INSTRUCTIONS} \
                 a kernel may have; its shapes are too large for this lowering",
                self.name,
                MAX_KERNEL_INSTRUCTIONS + 1
            )));
        }
        if self.overflow {
            return Err(FinishError::Generator(format!(
                "kernel {} needs more than {} scalar registers",
                self.name,
                REG_COUNT - FIRST_REG
            )));
        }
        if let Some(what) = self.generator_error {
            return Err(FinishError::Generator(format!(
                "kernel {}: {what}",
                self.name
            )));
        }
        self.b.end();
        let (program, comments) = self
            .b
            .finish()
            .map_err(|e| FinishError::Generator(format!("kernel {}: {e}", self.name)))?;
        Ok(Finished {
            program,
            comments,
            tiling: self.tiling,
        })
    }
}

/// Why a kernel could not be finished.
#[derive(Debug)]
pub enum FinishError {
    /// The shapes are valid but the kernel's code would pass the instruction limit.
    TooLarge(String),
    /// The generator wrote something invalid: a bug of the lowering.
    Generator(String),
}
