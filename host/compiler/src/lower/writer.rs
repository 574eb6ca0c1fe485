//! Writing kernels: assembly text built line by line (readable in `--dump_kernels`, with the
//! tiling as comments), registers handed out by name, then assembled with the one ISA table.

use std::fmt::{self, Display, Write as _};

use gearsim_isa::{Program, assemble};

/// A scalar register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(pub u8);

impl Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "x{}", self.0)
    }
}

/// The most instructions one kernel may have: hundreds of times what any lowering writes for
/// real shapes (a few thousand), and small enough that a lowering unrolled over an absurd shape
/// (a damaged model, a huge gear) stops with an error instead of filling memory with text.
pub const MAX_KERNEL_INSTRUCTIONS: usize = 1 << 20;

/// Registers a kernel may hand out (x0 is kept free for hand-written code and debugging).
const FIRST_REG: u8 = 1;
const REG_COUNT: u8 = 32;

/// A written kernel.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The assembly text.
    pub source: String,
    /// The assembled program.
    pub program: Program,
    /// The tiling parameters recorded.
    pub tiling: Vec<(String, i64)>,
}

/// A kernel being written.
#[derive(Debug)]
pub struct Asm {
    name: String,
    text: String,
    next_reg: u8,
    labels: u32,
    tiling: Vec<(String, i64)>,
    overflow: bool,
    /// Instructions written so far; past [`MAX_KERNEL_INSTRUCTIONS`] nothing more is kept.
    instructions: usize,
}

impl Asm {
    /// A new kernel called `name`.
    pub fn new(name: &str) -> Asm {
        let mut text = String::new();
        let _ = writeln!(text, ".kernel {name}");
        Asm {
            name: name.to_string(),
            text,
            next_reg: FIRST_REG,
            labels: 0,
            tiling: Vec::new(),
            overflow: false,
            instructions: 0,
        }
    }

    /// Whether the kernel has grown past [`MAX_KERNEL_INSTRUCTIONS`] (its text is no longer
    /// kept, and `finish` fails).
    fn too_long(&self) -> bool {
        self.instructions > MAX_KERNEL_INSTRUCTIONS
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A register no other part of the kernel uses.
    pub fn reg(&mut self) -> Reg {
        if self.next_reg >= REG_COUNT {
            self.overflow = true;
            return Reg(REG_COUNT - 1);
        }
        let r = Reg(self.next_reg);
        self.next_reg += 1;
        r
    }

    /// Records a tiling parameter (shown in the dump's header and the kernel's description).
    pub fn tiling(&mut self, name: &str, value: i64) {
        if self.too_long() {
            return;
        }
        let _ = writeln!(self.text, "# tiling {name} = {value}");
        self.tiling.push((name.to_string(), value));
    }

    /// A comment line.
    pub fn comment(&mut self, text: impl Display) {
        if self.too_long() {
            return;
        }
        let _ = writeln!(self.text, "    # {text}");
    }

    /// One instruction.
    pub fn ins(&mut self, text: impl Display) {
        self.instructions += 1;
        if self.too_long() {
            return;
        }
        let _ = writeln!(self.text, "    {text}");
    }

    /// A fresh label name (not yet placed).
    pub fn new_label(&mut self, stem: &str) -> String {
        self.labels += 1;
        format!("{stem}_{}", self.labels)
    }

    /// Places a label at the next instruction.
    pub fn place(&mut self, label: &str) {
        if self.too_long() {
            return;
        }
        let _ = writeln!(self.text, "{label}:");
    }

    /// `dst = value`.
    pub fn movi(&mut self, dst: Reg, value: i64) {
        self.ins(format_args!("movi      {dst}, {value}"));
    }

    /// A register holding `value`.
    pub fn constant(&mut self, value: i64) -> Reg {
        let r = self.reg();
        self.movi(r, value);
        r
    }

    /// A register holding an assembler expression (`f32(-1.0)`, `0x8000`).
    pub fn constant_expr(&mut self, expr: &str) -> Reg {
        let r = self.reg();
        self.ins(format_args!("movi      {r}, {expr}"));
        r
    }

    /// Loads argument `index` (a u64 of the argument array) into a new register.
    pub fn arg(&mut self, args: Reg, index: usize) -> Reg {
        let r = self.reg();
        self.ins(format_args!("ld.gm.u64 {r}, {args}, off={}", index * 8));
        r
    }

    /// `dst += value` (nothing for 0).
    pub fn add_imm(&mut self, dst: Reg, value: i64) {
        if value == 0 {
            return;
        }
        if i32::try_from(value).is_ok() {
            self.ins(format_args!("addi      {dst}, {dst}, {value}"));
        } else {
            let t = self.reg();
            self.movi(t, value);
            self.ins(format_args!("add       {dst}, {dst}, {t}"));
        }
    }

    /// Puts the vector mask in counter mode for `count` elements.
    pub fn mask_count(&mut self, scratch: Reg, count: u64) {
        self.movi(scratch, count as i64);
        self.ins(format_args!("set_mask_count {scratch}"));
    }

    /// The text and the assembled program. Errors are the generator's bugs (a bad line, too
    /// many registers) or a shape too large for the kernel's unrolled code, reported with the
    /// kernel's name.
    pub fn finish(self) -> Result<Finished, String> {
        if self.too_long() {
            return Err(format!(
                "kernel {} would have {} instructions or more, past the {MAX_KERNEL_INSTRUCTIONS} \
                 a kernel may have; its shapes are too large for this lowering",
                self.name, self.instructions
            ));
        }
        if self.overflow {
            return Err(format!(
                "kernel {} needs more than {} scalar registers",
                self.name,
                REG_COUNT - FIRST_REG
            ));
        }
        let mut text = self.text;
        text.push_str("    end\n");
        let program = assemble(&text, &self.name).map_err(|e| format!("{e}\n{text}"))?;
        Ok(Finished {
            source: text,
            program,
            tiling: self.tiling,
        })
    }
}
