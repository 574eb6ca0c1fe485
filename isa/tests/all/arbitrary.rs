//! Proptest strategies for arbitrary valid instructions, derived from the table.

use gearsim_isa::{DType, FieldKind, Instruction, Opcode};
use proptest::prelude::*;

/// Any valid instruction of any opcode.
pub fn instruction() -> impl Strategy<Value = Instruction> {
    (
        0..Opcode::ALL.len(),
        proptest::collection::vec(any::<u64>(), 16),
    )
        .prop_filter_map("operands break a table constraint", |(i, seeds)| {
            let op = Opcode::ALL[i];
            let spec = op.spec();
            let raw: Vec<u64> = spec
                .fields
                .iter()
                .zip(&seeds)
                .map(|(f, &s)| match f.kind {
                    FieldKind::Reg => s % 32,
                    FieldKind::Bool => s % 2,
                    FieldKind::Enum(names) => {
                        if f.name == "ty" && !spec.types.is_empty() {
                            let t = spec.types[(s % spec.types.len() as u64) as usize];
                            DType::ALL.iter().position(|d| *d == t).unwrap() as u64
                        } else {
                            s % names.len() as u64
                        }
                    }
                    FieldKind::Target => s % (1 << 32),
                    FieldKind::Unsigned => {
                        if f.bits >= 64 {
                            s
                        } else {
                            s % (1u64 << f.bits)
                        }
                    }
                    FieldKind::Signed => {
                        if f.bits >= 64 {
                            s
                        } else {
                            let v = (s % (1u64 << f.bits)) as i64 - (1i64 << (f.bits - 1));
                            v as u64
                        }
                    }
                })
                .collect();
            let instr = Instruction::from_raw_fields(op, &raw)?;
            instr.validate().ok().map(|()| instr)
        })
}
