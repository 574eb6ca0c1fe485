//! The instruction reference (`isa/ISA.md`), generated from the table so it cannot drift.

use std::fmt::Write as _;

use crate::operand::FieldKind;
use crate::spec::{PipeClass, Placement};
use crate::table::SPECS;

/// Markdown reference of every instruction: syntax, pipe, timing class, operands and doc.
pub fn markdown() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# gearsim ISA reference\n");
    let _ = writeln!(
        out,
        "Generated from `isa/src/table.rs` by `gearsim isa reference`; do not edit by hand.\n\
         Every instruction is one 16-byte word: byte 0 the opcode, then the operand fields \
         packed least-significant bit first. The assembler grammar is in `isa/src/asm.rs`.\n\n\
         Every instruction is also a method of the typed builder `ProgramBuilder` \
         (`isa/src/build.rs`) named after its mnemonic (`loop` is `r#loop`): the suffix and \
         positional operands are its arguments in the order shown, each bracketed keyed \
         operand a chained setter on the result (`b.vadd(F16, X2, X3, X4).repeat(2)`), and \
         numeric operands are range-checked against the bit widths below.\n"
    );
    let _ = writeln!(out, "| opcode | syntax | pipe | timing | description |");
    let _ = writeln!(out, "| --- | --- | --- | --- | --- |");
    for spec in SPECS {
        let mut syntax = spec.mnemonic.to_string();
        let mut operands = Vec::new();
        for f in spec.fields {
            match f.placement {
                Placement::Suffix => {
                    let _ = write!(syntax, ".<{}>", f.name);
                }
                Placement::Positional => operands.push(f.name.to_string()),
                Placement::Keyed(d) => {
                    let def = match f.kind {
                        FieldKind::Enum(names) => {
                            names.get(d() as usize).copied().unwrap_or("?").to_string()
                        }
                        FieldKind::Bool => (d() != 0).to_string(),
                        _ => (d() as i64).to_string(),
                    };
                    operands.push(format!("[{}={def}]", f.name));
                }
            }
        }
        if !operands.is_empty() {
            let _ = write!(syntax, " {}", operands.join(", "));
        }
        let pipe = match spec.pipe {
            PipeClass::Fixed(p) => p.name().to_string(),
            PipeClass::Routed => "by operand".to_string(),
        };
        let mut doc = spec.doc.trim().replace('\n', " ");
        if !spec.types.is_empty() {
            let types: Vec<&str> = spec.types.iter().map(|t| t.name()).collect();
            let _ = write!(doc, " Types: {}.", types.join(", "));
        }
        let _ = writeln!(
            out,
            "| `{:#04x}` | `{syntax}` | {pipe} | {:?} | {doc} |",
            spec.opcode, spec.timing
        );
    }
    let _ = writeln!(out, "\n## Operand fields\n");
    let _ = writeln!(out, "| format | field | bits | kind |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    let mut seen = std::collections::BTreeSet::new();
    for spec in SPECS {
        if !seen.insert(spec.format) {
            continue;
        }
        for f in spec.fields {
            let kind = match f.kind {
                FieldKind::Reg => "register".to_string(),
                FieldKind::Unsigned => "unsigned".to_string(),
                FieldKind::Signed => "signed".to_string(),
                FieldKind::Bool => "bool".to_string(),
                FieldKind::Target => "branch target".to_string(),
                FieldKind::Enum(names) => names.join(" / "),
            };
            let _ = writeln!(
                out,
                "| {} | `{}` | {} | {kind} |",
                spec.format, f.name, f.bits
            );
        }
    }
    out
}
