//! A kernel program: decoded instructions with their labels, and its binary form.

use std::fmt::Write as _;

use crate::disasm::{disasm_into, disasm_with};
use crate::encode::{DecodeError, EncodeError, decode_all, encode_all};
use crate::operand::FieldKind;
use crate::spec::MAX_FIELDS;
use crate::table::Instruction;

/// A kernel: a sequence of instructions that one AI core block runs from index 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Kernel name (from `.kernel`, or given by whoever built it).
    pub name: Option<String>,
    /// The instructions.
    pub instrs: Vec<Instruction>,
    /// Label names and the instruction index they mark, sorted by name.
    pub labels: Vec<(String, u32)>,
    /// Source line of each instruction: of the text it was assembled from, or of its
    /// [`Program::listing`] when it was built with [`crate::ProgramBuilder`] (empty for a
    /// program made with [`Program::new`] or decoded).
    pub source_lines: Vec<u32>,
}

impl Program {
    /// A program without labels or source lines.
    pub fn new(name: Option<String>, instrs: Vec<Instruction>) -> Program {
        Program {
            name,
            instrs,
            labels: Vec::new(),
            source_lines: Vec::new(),
        }
    }

    pub(crate) fn with_source(
        name: Option<String>,
        instrs: Vec<Instruction>,
        labels: Vec<(String, u32)>,
        source_lines: Vec<u32>,
    ) -> Program {
        Program {
            name,
            instrs,
            labels,
            source_lines,
        }
    }

    /// The kernel name, or `kernel` when it has none.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or("kernel")
    }

    /// The binary form: 16 bytes per instruction.
    pub fn encode(&self) -> Result<Vec<u8>, (usize, EncodeError)> {
        encode_all(&self.instrs)
    }

    /// Decodes a binary program.
    pub fn decode(name: Option<String>, bytes: &[u8]) -> Result<Program, DecodeError> {
        Ok(Program::new(name, decode_all(bytes)?))
    }

    /// The first label (by name) that marks instruction `pc`.
    pub fn label_at(&self, pc: u32) -> Option<&str> {
        self.labels
            .iter()
            .find(|(_, p)| *p == pc)
            .map(|(n, _)| n.as_str())
    }

    /// Disassembly of one instruction with label names for branch targets.
    pub fn disasm_at(&self, pc: usize) -> String {
        disasm_with(&self.instrs[pc], &|t| self.target_name(t))
    }

    /// Appends [`Program::disasm_at`]'s text to `out`.
    pub fn disasm_at_into(&self, pc: usize, out: &mut String) {
        disasm_into(out, &self.instrs[pc], &|t| self.target_name(t));
    }

    fn target_name(&self, pc: u32) -> String {
        self.label_at(pc)
            .map_or_else(|| format!("L{pc}"), str::to_string)
    }

    /// The whole program as assembly text that assembles back to the same instructions.
    pub fn disassemble(&self) -> String {
        let mut targets = std::collections::BTreeSet::new();
        for instr in &self.instrs {
            if let Some(t) = branch_target(instr) {
                targets.insert(t);
            }
        }
        let mut out = String::new();
        if let Some(n) = &self.name {
            let _ = writeln!(out, ".kernel {n}");
        }
        for pc in 0..self.instrs.len() {
            let pc32 = u32::try_from(pc).unwrap_or(u32::MAX);
            let mut labelled = false;
            for (name, _) in self.labels.iter().filter(|(_, p)| *p == pc32) {
                let _ = writeln!(out, "{name}:");
                labelled = true;
            }
            if !labelled && targets.contains(&pc32) {
                let _ = writeln!(out, "L{pc}:");
            }
            let _ = writeln!(out, "    {}", self.disasm_at(pc));
        }
        out
    }
}

/// One line of a [`Program::listing`].
enum ListingLine<'a> {
    Kernel(&'a str),
    Comment(&'a str),
    Label(&'a str),
    Anonymous(u32),
    Instr(usize),
}

impl Program {
    /// The program as assembly text with `comments` interleaved (each line above the
    /// instruction it was attached to, above that instruction's labels) and every label shown,
    /// including one placed after the last instruction. It assembles back to this program,
    /// `source_lines` included, when the program came from [`crate::ProgramBuilder`] with these
    /// comments. Branch targets without a label print as `L<pc>` as in [`Program::disassemble`].
    pub fn listing(&self, comments: &Comments) -> String {
        let mut out = String::new();
        self.walk_listing(comments, |line| {
            let _ = match line {
                ListingLine::Kernel(name) => writeln!(out, ".kernel {name}"),
                ListingLine::Comment("") => writeln!(out, "    #"),
                ListingLine::Comment(text) => writeln!(out, "    # {text}"),
                ListingLine::Label(name) => writeln!(out, "{name}:"),
                ListingLine::Anonymous(pc) => writeln!(out, "L{pc}:"),
                ListingLine::Instr(pc) => writeln!(out, "    {}", self.disasm_at(pc)),
            };
        });
        out
    }

    /// The 1-based line of every instruction in [`Program::listing`].
    pub(crate) fn listing_lines(&self, comments: &Comments) -> Vec<u32> {
        let mut lines = Vec::with_capacity(self.instrs.len());
        let mut n = 0u32;
        self.walk_listing(comments, |line| {
            n = n.saturating_add(1);
            if let ListingLine::Instr(_) = line {
                lines.push(n);
            }
        });
        lines
    }

    fn walk_listing<'a>(&'a self, comments: &'a Comments, mut each: impl FnMut(ListingLine<'a>)) {
        let targets: std::collections::BTreeSet<u32> =
            self.instrs.iter().filter_map(branch_target).collect();
        // Labels by position (a stable sort keeps their order at one position), walked with a
        // cursor: one pass over the program, however many labels it has.
        let mut labels: Vec<(u32, &str)> =
            self.labels.iter().map(|(n, p)| (*p, n.as_str())).collect();
        labels.sort_by_key(|(p, _)| *p);
        let mut next_label = 0;
        if let Some(n) = &self.name {
            each(ListingLine::Kernel(n));
        }
        for pc in 0..=self.instrs.len() {
            let pc32 = u32::try_from(pc).unwrap_or(u32::MAX);
            for text in comments.at(pc32) {
                each(ListingLine::Comment(text));
            }
            let mut labelled = false;
            while next_label < labels.len() && labels[next_label].0 <= pc32 {
                if labels[next_label].0 == pc32 {
                    each(ListingLine::Label(labels[next_label].1));
                    labelled = true;
                }
                next_label += 1;
            }
            if !labelled && targets.contains(&pc32) {
                each(ListingLine::Anonymous(pc32));
            }
            if pc < self.instrs.len() {
                each(ListingLine::Instr(pc));
            }
        }
    }
}

/// The branch target of a control-flow instruction: its operand of kind
/// [`FieldKind::Target`] in the table, so every branch form has one.
pub fn branch_target(instr: &Instruction) -> Option<u32> {
    let i = instr
        .spec()
        .fields
        .iter()
        .position(|f| f.kind == FieldKind::Target)?;
    let mut raw = [0u64; MAX_FIELDS];
    instr.raw_fields(&mut raw);
    u32::try_from(raw[i]).ok()
}

/// Comment lines of a built program, each attached to the instruction it precedes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comments {
    pub(crate) lines: Vec<(u32, String)>,
}

impl Comments {
    /// The comment lines before instruction `pc` (at `pc == len`: after the last instruction).
    pub fn at(&self, pc: u32) -> impl Iterator<Item = &str> {
        let start = self.lines.partition_point(|(p, _)| *p < pc);
        self.lines[start..]
            .iter()
            .take_while(move |(p, _)| *p == pc)
            .map(|(_, text)| text.as_str())
    }

    /// Every comment line with the instruction index it precedes, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &str)> {
        self.lines.iter().map(|(p, t)| (*p, t.as_str()))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// The same lines before the instructions `at` maps their indices to (a rewritten
    /// program's); `at` must not reorder them.
    pub fn remapped(&self, at: impl Fn(u32) -> u32) -> Comments {
        Comments {
            lines: self
                .lines
                .iter()
                .map(|(p, t)| (at(*p), t.clone()))
                .collect(),
        }
    }
}
