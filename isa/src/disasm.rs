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
    let spec = instr.spec();
    let mut raw = [0u64; MAX_FIELDS];
    instr.raw_fields(&mut raw);
    let mut out = String::from(spec.mnemonic);
    for (f, &v) in spec.fields.iter().zip(&raw) {
        if matches!(f.placement, Placement::Suffix) {
            out.push('.');
            out.push_str(&value_text(f.kind, v, target));
        }
    }
    let mut first = true;
    for (f, &v) in spec.fields.iter().zip(&raw) {
        let text = match f.placement {
            Placement::Suffix => continue,
            Placement::Positional => value_text(f.kind, v, target),
            Placement::Keyed(default) => {
                if default() == v {
                    continue;
                }
                format!("{}={}", f.name, value_text(f.kind, v, target))
            }
        };
        out.push_str(if first { " " } else { ", " });
        first = false;
        out.push_str(&text);
    }
    out
}

fn value_text(kind: FieldKind, v: u64, target: &dyn Fn(u32) -> String) -> String {
    match kind {
        FieldKind::Reg => format!("x{v}"),
        FieldKind::Bool => (if v == 0 { "false" } else { "true" }).to_string(),
        FieldKind::Enum(names) => names.get(v as usize).copied().unwrap_or("?").to_string(),
        FieldKind::Target => target(u32::try_from(v).unwrap_or(u32::MAX)),
        FieldKind::Unsigned => {
            if v >= 1 << 16 {
                format!("{v:#x}")
            } else {
                v.to_string()
            }
        }
        FieldKind::Signed => {
            let s = v as i64;
            let mut t = String::new();
            if s.unsigned_abs() >= 1 << 16 {
                if s < 0 {
                    let _ = write!(t, "-{:#x}", s.unsigned_abs());
                } else {
                    let _ = write!(t, "{s:#x}");
                }
            } else {
                let _ = write!(t, "{s}");
            }
            t
        }
    }
}
