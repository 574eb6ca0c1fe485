//! Text assembler, derived from the instruction table.
//!
//! # Grammar
//!
//! ```text
//! program     := { line "\n" }
//! line        := [ label ":" ] [ directive | instruction ] [ comment ]
//! comment     := ( "#" | "//" | ";" ) { any character }
//! directive   := ".kernel" name                 (names the program)
//!              | ".equ" name "," expr           (defines a constant usable in later expressions)
//! instruction := mnemonic { "." suffix } [ operand { "," operand } ]
//! operand     := value                          (positional, in table order)
//!              | key "=" value                  (keyed, any order, optional: the table has a default)
//! value       := "x" 0..31                      (register)
//!              | expr                           (immediate; must fit the field's width)
//!              | "true" | "false"               (flag)
//!              | name                           (enum value such as f16, MTE2, eq, block_idx)
//!              | "@" number | label             (branch target)
//! expr        := or-expr with | & << >> + - * / % unary-minus, parentheses,
//!                decimal / 0x hex / 0b binary integers, .equ names,
//!                f16(1.5) and f32(1.5) (the IEEE bit pattern of a float literal)
//! ```
//!
//! Mnemonics follow one scheme: scalar operations are bare (`add`, `ld.gm.u32`), vector
//! operations start with `v` (`vadd.f16`, `vcmps.eq.i32`, `vconv.f32.f16`), data movement is
//! `copy_<from>_to_<to>` / `load_<to>` / `img2col_<to>`, the cube is `mmad`, and
//! synchronisation is `set_flag` / `wait_flag` / `pipe_barrier` / `end`. Type and mode
//! suffixes follow the base name in the order the format declares them.

use std::collections::BTreeMap;

use thiserror::Error;

use crate::encode::{EncodeError, encode};
use crate::operand::FieldKind;
use crate::program::Program;
use crate::spec::{FieldSpec, InstrSpec, MAX_FIELDS, Placement};
use crate::table::{Instruction, Opcode, SPECS};

/// The deepest nesting of parentheses and unary minuses a constant expression may have: far
/// beyond any hand-written kernel, and shallow enough that the recursive parser cannot exhaust
/// the stack on hostile input.
pub const MAX_EXPR_DEPTH: usize = 64;

/// An assembly error with its source position.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}:{line}:{col}: {message}")]
pub struct AsmError {
    /// Source file name as given to the assembler.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
    /// What was expected and what was found.
    pub message: String,
}

/// Assembles a whole source file into a program.
pub fn assemble(source: &str, file: &str) -> Result<Program, AsmError> {
    Assembler::new(file).run(source)
}

/// Parses a single instruction (no labels: targets must be `@N` or numbers).
pub fn parse_instruction(text: &str) -> Result<Instruction, AsmError> {
    let mut asm = Assembler::new("<instruction>");
    let line = Line {
        text: text.trim(),
        number: 1,
    };
    if let Some((col, c)) = line.text.char_indices().find(|(_, c)| !c.is_ascii()) {
        return Err(asm.err(&line, col, format!("unexpected non-ASCII character `{c}`")));
    }
    let (instr, fixups) = asm.instruction(&line, 0)?;
    if let Some(f) = fixups.first() {
        return Err(asm.err(&line, f.col, format!("unknown label `{}`", f.label)));
    }
    Ok(instr)
}

struct Line<'a> {
    text: &'a str,
    number: usize,
}

struct Fixup {
    instr: usize,
    field: usize,
    label: String,
    line: usize,
    col: usize,
}

struct Assembler {
    file: String,
    consts: BTreeMap<String, i64>,
    labels: BTreeMap<String, u32>,
    by_mnemonic: BTreeMap<&'static str, Opcode>,
}

impl Assembler {
    fn new(file: &str) -> Assembler {
        let by_mnemonic = SPECS
            .iter()
            .filter_map(|s| Opcode::from_u8(s.opcode).map(|op| (s.mnemonic, op)))
            .collect();
        Assembler {
            file: file.to_string(),
            consts: BTreeMap::new(),
            labels: BTreeMap::new(),
            by_mnemonic,
        }
    }

    fn err(&self, line: &Line<'_>, col: usize, message: String) -> AsmError {
        AsmError {
            file: self.file.clone(),
            line: line.number,
            col: col + 1,
            message,
        }
    }

    fn run(mut self, source: &str) -> Result<Program, AsmError> {
        let mut instrs: Vec<Instruction> = Vec::new();
        let mut lines: Vec<u32> = Vec::new();
        let mut fixups: Vec<Fixup> = Vec::new();
        let mut name: Option<String> = None;
        for (i, raw) in source.lines().enumerate() {
            let line = Line {
                text: strip_comment(raw),
                number: i + 1,
            };
            if let Some((col, c)) = line.text.char_indices().find(|(_, c)| !c.is_ascii()) {
                return Err(self.err(&line, col, format!("unexpected non-ASCII character `{c}`")));
            }
            let mut pos = skip_ws(line.text, 0);
            // Labels: `name:` (several allowed on one line).
            loop {
                let (word, end) = take_ident(line.text, pos);
                if !word.is_empty() && line.text[end..].starts_with(':') {
                    if self.labels.contains_key(word) {
                        return Err(self.err(&line, pos, format!("label `{word}` defined twice")));
                    }
                    let pc = u32::try_from(instrs.len()).map_err(|_| {
                        self.err(&line, pos, "program longer than 2^32 instructions".into())
                    })?;
                    self.labels.insert(word.to_string(), pc);
                    pos = skip_ws(line.text, end + 1);
                } else {
                    break;
                }
            }
            if pos >= line.text.len() {
                continue;
            }
            if line.text[pos..].starts_with('.') {
                self.directive(&line, pos, &mut name)?;
                continue;
            }
            let (instr, mut fx) = self.instruction(&line, pos)?;
            for f in &mut fx {
                f.instr = instrs.len();
            }
            fixups.extend(fx);
            instrs.push(instr);
            lines.push(u32::try_from(line.number).unwrap_or(u32::MAX));
        }
        for f in fixups {
            let line = Line {
                text: "",
                number: f.line,
            };
            let pc = *self
                .labels
                .get(&f.label)
                .ok_or_else(|| self.err(&line, f.col, format!("unknown label `{}`", f.label)))?;
            let mut raw = [0u64; MAX_FIELDS];
            let n = instrs[f.instr].raw_fields(&mut raw);
            raw[f.field] = u64::from(pc);
            instrs[f.instr] = Instruction::from_raw_fields(instrs[f.instr].opcode(), &raw[..n])
                .ok_or_else(|| self.err(&line, f.col, "label does not fit".into()))?;
        }
        for (pc, instr) in instrs.iter().enumerate() {
            check_targets(instr, instrs.len()).map_err(|m| {
                let line = Line {
                    text: "",
                    number: lines[pc] as usize,
                };
                self.err(&line, 0, m)
            })?;
        }
        Ok(Program::with_source(
            name,
            instrs,
            self.labels.into_iter().collect(),
            lines,
        ))
    }

    fn directive(
        &mut self,
        line: &Line<'_>,
        pos: usize,
        name: &mut Option<String>,
    ) -> Result<(), AsmError> {
        let (word, end) = take_ident(line.text, pos + 1);
        match word {
            "kernel" => {
                let p = skip_ws(line.text, end);
                let (n, e) = take_ident(line.text, p);
                if n.is_empty() {
                    return Err(self.err(line, p, "expected a kernel name after .kernel".into()));
                }
                expect_end(self, line, e)?;
                *name = Some(n.to_string());
                Ok(())
            }
            "equ" => {
                let p = skip_ws(line.text, end);
                let (n, e) = take_ident(line.text, p);
                if n.is_empty() {
                    return Err(self.err(line, p, "expected a constant name after .equ".into()));
                }
                let p = skip_ws(line.text, e);
                if !line.text[p..].starts_with(',') {
                    return Err(self.err(line, p, format!("expected `,` after `.equ {n}`")));
                }
                let (v, e) = self.expr(line, p + 1)?;
                expect_end(self, line, e)?;
                if self.consts.insert(n.to_string(), v).is_some() {
                    return Err(self.err(line, p, format!("constant `{n}` defined twice")));
                }
                Ok(())
            }
            _ => Err(self.err(
                line,
                pos,
                format!("unknown directive `.{word}` (expected .kernel or .equ)"),
            )),
        }
    }

    fn instruction(
        &mut self,
        line: &Line<'_>,
        pos: usize,
    ) -> Result<(Instruction, Vec<Fixup>), AsmError> {
        let text = line.text;
        let start = pos;
        let mut end = pos;
        while end < text.len() && !text.as_bytes()[end].is_ascii_whitespace() {
            end += 1;
        }
        let full = &text[start..end];
        let mut parts = full.split('.');
        let base = parts.next().unwrap_or("");
        let suffixes: Vec<&str> = parts.collect();
        let op = *self.by_mnemonic.get(base).ok_or_else(|| {
            self.err(
                line,
                start,
                format!("unknown mnemonic `{base}`{}", suggest(base)),
            )
        })?;
        let spec = op.spec();
        let mut raw = [0u64; MAX_FIELDS];
        let mut set = [false; MAX_FIELDS];
        let mut fixups = Vec::new();

        // Suffix fields.
        let suffix_fields: Vec<usize> = field_indices(spec, |p| matches!(p, Placement::Suffix));
        if suffixes.len() != suffix_fields.len() {
            let want: Vec<String> = suffix_fields
                .iter()
                .map(|&i| format!(".<{}>", spec.fields[i].name))
                .collect();
            return Err(self.err(
                line,
                start,
                format!(
                    "`{base}` takes {} suffix(es) {}, found `{full}`",
                    suffix_fields.len(),
                    want.join("")
                ),
            ));
        }
        let mut col = start + base.len() + 1;
        for (&fi, sfx) in suffix_fields.iter().zip(&suffixes) {
            raw[fi] = self.enum_value(line, col, &spec.fields[fi], sfx)?;
            set[fi] = true;
            col += sfx.len() + 1;
        }

        // Operands.
        let positional: Vec<usize> = field_indices(spec, |p| matches!(p, Placement::Positional));
        let mut next_positional = 0;
        let mut p = skip_ws(text, end);
        let mut first = true;
        while p < text.len() {
            if !first {
                if !text[p..].starts_with(',') {
                    return Err(self.err(
                        line,
                        p,
                        format!("expected `,` or end of line, found `{}`", rest(text, p)),
                    ));
                }
                p = skip_ws(text, p + 1);
            }
            first = false;
            let (key, kend) = take_ident(text, p);
            let after = skip_ws(text, kend);
            let (fi, vstart) =
                if !key.is_empty() && text[after..].starts_with('=') {
                    let fi = spec
                        .field_index(key)
                        .filter(|&i| matches!(spec.fields[i].placement, Placement::Keyed(_)));
                    let fi =
                        fi.ok_or_else(|| {
                            let keys: Vec<&str> = spec
                                .fields
                                .iter()
                                .filter(|f| matches!(f.placement, Placement::Keyed(_)))
                                .map(|f| f.name)
                                .collect();
                            self.err(
                        line,
                        p,
                        format!(
                            "`{base}` has no optional operand `{key}` (expected one of: {})",
                            if keys.is_empty() { "none".to_string() } else { keys.join(", ") }
                        ),
                    )
                        })?;
                    if set[fi] {
                        return Err(self.err(line, p, format!("operand `{key}` given twice")));
                    }
                    (fi, skip_ws(text, after + 1))
                } else {
                    let fi = *positional.get(next_positional).ok_or_else(|| {
                        self.err(
                            line,
                            p,
                            format!(
                                "`{base}` takes {} positional operand(s) ({}), found another: `{}`",
                                positional.len(),
                                names(spec, &positional),
                                rest(text, p)
                            ),
                        )
                    })?;
                    next_positional += 1;
                    (fi, p)
                };
            let field = &spec.fields[fi];
            let (value, vend) = self.value(line, vstart, field, &mut |label, col| {
                fixups.push(Fixup {
                    instr: 0,
                    field: fi,
                    label,
                    line: line.number,
                    col,
                });
            })?;
            raw[fi] = value;
            set[fi] = true;
            p = skip_ws(text, vend);
        }
        if next_positional < positional.len() {
            return Err(self.err(
                line,
                text.len(),
                format!(
                    "`{base}` expects {} operand(s) ({}), found {}",
                    positional.len(),
                    names(spec, &positional),
                    next_positional
                ),
            ));
        }
        for (i, field) in spec.fields.iter().enumerate() {
            if !set[i]
                && let Some(d) = field.default_raw()
            {
                raw[i] = d;
            }
        }
        let instr = Instruction::from_raw_fields(op, &raw[..spec.fields.len()])
            .ok_or_else(|| self.err(line, start, "operand out of range".into()))?;
        match encode(&instr) {
            Ok(_) => Ok((instr, fixups)),
            Err(EncodeError::Constraint { reason, .. }) => {
                Err(self.err(line, start, format!("`{full}`: {reason}")))
            }
            Err(e) => Err(self.err(line, start, e.to_string())),
        }
    }

    fn enum_value(
        &self,
        line: &Line<'_>,
        col: usize,
        field: &FieldSpec,
        text: &str,
    ) -> Result<u64, AsmError> {
        match field.kind {
            FieldKind::Enum(names) => names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(text))
                .map(|i| i as u64)
                .ok_or_else(|| {
                    self.err(
                        line,
                        col,
                        format!(
                            "expected {} ({}), found `{text}`",
                            field.name,
                            names.join(", ")
                        ),
                    )
                }),
            _ => Err(self.err(line, col, format!("`{}` cannot be a suffix", field.name))),
        }
    }

    fn value(
        &self,
        line: &Line<'_>,
        pos: usize,
        field: &FieldSpec,
        fixup: &mut dyn FnMut(String, usize),
    ) -> Result<(u64, usize), AsmError> {
        let text = line.text;
        match field.kind {
            FieldKind::Reg => {
                let (word, end) = take_ident(text, pos);
                let n = word
                    .strip_prefix('x')
                    .and_then(|d| d.parse::<u8>().ok())
                    .filter(|&n| usize::from(n) < crate::operand::NUM_REGS);
                match n {
                    Some(n) if word.len() > 1 => Ok((u64::from(n), end)),
                    _ => Err(self.err(
                        line,
                        pos,
                        format!(
                            "expected register x0..x31 for `{}`, found `{}`",
                            field.name,
                            token(text, pos)
                        ),
                    )),
                }
            }
            FieldKind::Enum(_) => {
                let (word, end) = take_ident(text, pos);
                Ok((self.enum_value(line, pos, field, word)?, end))
            }
            FieldKind::Bool => {
                let (word, end) = take_ident(text, pos);
                match word {
                    "true" | "1" => Ok((1, end)),
                    "false" | "0" => Ok((0, end)),
                    _ => Err(self.err(
                        line,
                        pos,
                        format!(
                            "expected true or false for `{}`, found `{}`",
                            field.name,
                            token(text, pos)
                        ),
                    )),
                }
            }
            FieldKind::Target => {
                if let Some(stripped) = text[pos..].strip_prefix('@') {
                    let _ = stripped;
                    let (v, end) = self.expr(line, pos + 1)?;
                    let v = u32::try_from(v).map_err(|_| {
                        self.err(
                            line,
                            pos,
                            format!("branch target {v} is not an instruction index"),
                        )
                    })?;
                    return Ok((u64::from(v), end));
                }
                let (word, end) = take_ident(text, pos);
                if !word.is_empty() && !word.as_bytes()[0].is_ascii_digit() {
                    fixup(word.to_string(), pos);
                    return Ok((0, end));
                }
                let (v, end) = self.expr(line, pos)?;
                let v = u32::try_from(v).map_err(|_| {
                    self.err(
                        line,
                        pos,
                        format!("branch target {v} is not an instruction index"),
                    )
                })?;
                Ok((u64::from(v), end))
            }
            FieldKind::Unsigned | FieldKind::Signed => {
                let (v, end) = self.expr(line, pos)?;
                let raw = v as u64;
                let ok = match field.kind {
                    FieldKind::Unsigned => v >= 0 && field.fits(raw),
                    _ => field.fits(raw),
                };
                if !ok {
                    let range = match field.kind {
                        FieldKind::Unsigned => format!("0..={}", field.max),
                        _ => format!(
                            "{}..={}",
                            -(1i128 << (field.bits - 1)),
                            (1i128 << (field.bits - 1)) - 1
                        ),
                    };
                    return Err(self.err(
                        line,
                        pos,
                        if field.kind == FieldKind::Unsigned
                            && field.max < crate::spec::width_max(field.bits, u64::MAX)
                        {
                            format!(
                                "operand `{}` = {v} is out of range (expected {range})",
                                field.name
                            )
                        } else {
                            format!(
                                "operand `{}` = {v} does not fit in {} bits (expected {range})",
                                field.name, field.bits
                            )
                        },
                    ));
                }
                Ok((raw, end))
            }
        }
    }

    // ---- expressions: precedence climbing over | & << >> + - * / % ------------------------

    fn expr(&self, line: &Line<'_>, pos: usize) -> Result<(i64, usize), AsmError> {
        self.nested_expr(line, pos, 0)
    }

    /// An expression inside `depth` parentheses or unary minuses; deeper than
    /// [`MAX_EXPR_DEPTH`] is an error rather than a stack overflow.
    fn nested_expr(
        &self,
        line: &Line<'_>,
        pos: usize,
        depth: usize,
    ) -> Result<(i64, usize), AsmError> {
        if depth > MAX_EXPR_DEPTH {
            return Err(self.too_deep(line, pos));
        }
        self.binary(line, pos, 0, depth)
    }

    fn too_deep(&self, line: &Line<'_>, pos: usize) -> AsmError {
        self.err(
            line,
            pos,
            format!(
                "constant expression nested deeper than {MAX_EXPR_DEPTH} levels of parentheses \
                 and unary minus"
            ),
        )
    }

    fn binary(
        &self,
        line: &Line<'_>,
        pos: usize,
        level: usize,
        depth: usize,
    ) -> Result<(i64, usize), AsmError> {
        const LEVELS: [&[&str]; 5] = [&["|"], &["&"], &["<<", ">>"], &["+", "-"], &["*", "/", "%"]];
        if level == LEVELS.len() {
            return self.unary(line, pos, depth);
        }
        let (mut acc, mut p) = self.binary(line, pos, level + 1, depth)?;
        loop {
            let q = skip_ws(line.text, p);
            let op = LEVELS[level]
                .iter()
                .find(|op| line.text[q..].starts_with(**op));
            let Some(op) = op else { return Ok((acc, p)) };
            // `x | y` but not `||`-like garbage; `-` must not be confused with nothing else here.
            let (rhs, e) = self.binary(line, q + op.len(), level + 1, depth)?;
            let overflow = || self.err(line, q, format!("constant expression overflows at `{op}`"));
            acc = match *op {
                "|" => acc | rhs,
                "&" => acc & rhs,
                "<<" => acc
                    .checked_shl(u32::try_from(rhs).map_err(|_| overflow())?)
                    .ok_or_else(overflow)?,
                ">>" => acc
                    .checked_shr(u32::try_from(rhs).map_err(|_| overflow())?)
                    .ok_or_else(overflow)?,
                "+" => acc.checked_add(rhs).ok_or_else(overflow)?,
                "-" => acc.checked_sub(rhs).ok_or_else(overflow)?,
                "*" => acc.checked_mul(rhs).ok_or_else(overflow)?,
                "/" | "%" => {
                    if rhs == 0 {
                        return Err(self.err(
                            line,
                            q,
                            "division by zero in constant expression".into(),
                        ));
                    }
                    if *op == "/" {
                        acc.checked_div(rhs)
                    } else {
                        acc.checked_rem(rhs)
                    }
                    .ok_or_else(overflow)?
                }
                _ => unreachable!("operator table and match agree"),
            };
            p = e;
        }
    }

    fn unary(&self, line: &Line<'_>, pos: usize, depth: usize) -> Result<(i64, usize), AsmError> {
        let text = line.text;
        let p = skip_ws(text, pos);
        let rest_s = &text[p..];
        if rest_s.starts_with('-') {
            if depth >= MAX_EXPR_DEPTH {
                return Err(self.too_deep(line, p));
            }
            let (v, e) = self.unary(line, p + 1, depth + 1)?;
            return v
                .checked_neg()
                .map(|n| (n, e))
                .ok_or_else(|| self.err(line, p, "constant expression overflows".into()));
        }
        if rest_s.starts_with('(') {
            let (v, e) = self.nested_expr(line, p + 1, depth + 1)?;
            let e = skip_ws(text, e);
            if !text[e..].starts_with(')') {
                return Err(self.err(line, e, format!("expected `)`, found `{}`", token(text, e))));
            }
            return Ok((v, e + 1));
        }
        let first = rest_s.chars().next();
        match first {
            Some(c) if c.is_ascii_digit() => {
                let (word, end) = take_ident(text, p);
                let parsed =
                    if let Some(h) = word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
                        u64::from_str_radix(&h.replace('_', ""), 16).map(|v| v as i64)
                    } else if let Some(b) = word.strip_prefix("0b") {
                        u64::from_str_radix(&b.replace('_', ""), 2).map(|v| v as i64)
                    } else {
                        word.replace('_', "").parse::<i64>()
                    };
                parsed
                    .map(|v| (v, end))
                    .map_err(|_| self.err(line, p, format!("expected an integer, found `{word}`")))
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let (word, end) = take_ident(text, p);
                if (word == "f16" || word == "f32") && text[end..].starts_with('(') {
                    let close = text[end..].find(')').map(|i| end + i).ok_or_else(|| {
                        self.err(line, end, format!("expected `)` to close `{word}(`"))
                    })?;
                    let lit = text[end + 1..close].trim();
                    let f: f64 = lit.parse().map_err(|_| {
                        self.err(
                            line,
                            end + 1,
                            format!("expected a float literal, found `{lit}`"),
                        )
                    })?;
                    let bits = if word == "f16" {
                        i64::from(half::f16::from_f64(f).to_bits())
                    } else {
                        i64::from((f as f32).to_bits())
                    };
                    return Ok((bits, close + 1));
                }
                self.consts.get(word).map(|&v| (v, end)).ok_or_else(|| {
                    self.err(
                        line,
                        p,
                        format!("unknown constant `{word}` (define it with .equ)"),
                    )
                })
            }
            _ => Err(self.err(
                line,
                p,
                format!("expected a value, found `{}`", token(text, p)),
            )),
        }
    }
}

fn check_targets(instr: &Instruction, len: usize) -> Result<(), String> {
    let spec = instr.spec();
    let mut raw = [0u64; MAX_FIELDS];
    instr.raw_fields(&mut raw);
    for (f, v) in spec.fields.iter().zip(raw) {
        if f.kind == FieldKind::Target && v as usize >= len {
            return Err(format!(
                "{}: branch target @{v} is past the end of the program ({len} instructions)",
                spec.mnemonic
            ));
        }
    }
    Ok(())
}

fn field_indices(spec: &InstrSpec, pred: impl Fn(&Placement) -> bool) -> Vec<usize> {
    spec.fields
        .iter()
        .enumerate()
        .filter(|(_, f)| pred(&f.placement))
        .map(|(i, _)| i)
        .collect()
}

fn names(spec: &InstrSpec, idx: &[usize]) -> String {
    idx.iter()
        .map(|&i| spec.fields[i].name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn suggest(base: &str) -> String {
    let close: Vec<&str> = SPECS
        .iter()
        .map(|s| s.mnemonic)
        .filter(|m| {
            m.starts_with(base.get(..2).unwrap_or(base))
                || base.starts_with(m.get(..3).unwrap_or(m))
        })
        .take(6)
        .collect();
    if close.is_empty() {
        String::new()
    } else {
        format!(" (did you mean one of: {})", close.join(", "))
    }
}

fn expect_end(asm: &Assembler, line: &Line<'_>, pos: usize) -> Result<(), AsmError> {
    let p = skip_ws(line.text, pos);
    if p < line.text.len() {
        return Err(asm.err(
            line,
            p,
            format!("expected end of line, found `{}`", rest(line.text, p)),
        ));
    }
    Ok(())
}

fn strip_comment(line: &str) -> &str {
    let mut end = line.len();
    for pat in ["#", "//", ";"] {
        if let Some(i) = line.find(pat) {
            end = end.min(i);
        }
    }
    line[..end].trim_end()
}

fn skip_ws(text: &str, mut pos: usize) -> usize {
    let b = text.as_bytes();
    while pos < b.len() && b[pos].is_ascii_whitespace() {
        pos += 1;
    }
    pos
}

fn take_ident(text: &str, pos: usize) -> (&str, usize) {
    let b = text.as_bytes();
    let mut end = pos;
    while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
        end += 1;
    }
    (&text[pos..end], end)
}

fn token(text: &str, pos: usize) -> &str {
    let b = text.as_bytes();
    if pos >= b.len() {
        return "end of line";
    }
    let mut end = pos + 1;
    while end < b.len() && !b[end].is_ascii_whitespace() && b[end] != b',' {
        end += 1;
    }
    &text[pos..end]
}

fn rest(text: &str, pos: usize) -> &str {
    if pos >= text.len() {
        "end of line"
    } else {
        text[pos..].trim()
    }
}
