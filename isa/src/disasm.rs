//! Disassembler, derived from the instruction table.
//!
//! Prints the mnemonic with its suffixes, every positional operand, and each keyed operand
//! whose value differs from its default, so that `parse_instruction(&disasm(x)) == x`.

use std::fmt::Write as _;

use crate::operand::FieldKind;
use crate::spec::{MAX_FIELDS, Placement};
use crate::table::Instruction;

/// One instruction as text; branch targets print as `@N`.
pub fn disasm(instr: &Instruction) -> String {
    disasm_with(instr, &|pc| format!("@{pc}"))
}

/// One instruction as text, with branch targets printed by `target`.
pub fn disasm_with(instr: &Instruction, target: &dyn Fn(u32) -> String) -> String {
    let mut out = String::new();
    disasm_into(&mut out, instr, target);
    out
}

/// Appends [`disasm_with`]'s text to `out` (no allocation per operand: loading a kernel with
/// an instruction-level trace writes every instruction's text).
pub fn disasm_into(out: &mut String, instr: &Instruction, target: &dyn Fn(u32) -> String) {
    let spec = instr.spec();
    let mut raw = [0u64; MAX_FIELDS];
    instr.raw_fields(&mut raw);
    out.push_str(spec.mnemonic);
    for (f, &v) in spec.fields.iter().zip(&raw) {
        if matches!(f.placement, Placement::Suffix) {
            out.push('.');
            write_value(out, f.kind, v, target);
        }
    }
    let mut first = true;
    for (f, &v) in spec.fields.iter().zip(&raw) {
        let keyed = match f.placement {
            Placement::Suffix => continue,
            Placement::Positional => false,
            Placement::Keyed(default) => {
                if default() == v {
                    continue;
                }
                true
            }
        };
        out.push_str(if first { " " } else { ", " });
        first = false;
        if keyed {
            out.push_str(f.name);
            out.push('=');
        }
        write_value(out, f.kind, v, target);
    }
}

fn write_value(out: &mut String, kind: FieldKind, v: u64, target: &dyn Fn(u32) -> String) {
    match kind {
        FieldKind::Reg => {
            let _ = write!(out, "x{v}");
        }
        FieldKind::Bool => out.push_str(if v == 0 { "false" } else { "true" }),
        FieldKind::Enum(names) => out.push_str(names.get(v as usize).copied().unwrap_or("?")),
        FieldKind::Target => out.push_str(&target(u32::try_from(v).unwrap_or(u32::MAX))),
        FieldKind::Unsigned => {
            if v >= 1 << 16 {
                let _ = write!(out, "{v:#x}");
            } else {
                let _ = write!(out, "{v}");
            }
        }
        FieldKind::Signed => {
            let s = v as i64;
            if s.unsigned_abs() >= 1 << 16 {
                if s < 0 {
                    let _ = write!(out, "-{:#x}", s.unsigned_abs());
                } else {
                    let _ = write!(out, "{s:#x}");
                }
            } else {
                let _ = write!(out, "{s}");
            }
        }
    }
}
