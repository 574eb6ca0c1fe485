//! Every builder method round-trips: an instruction rebuilt through its typed method and
//! setters is the same instruction, encodes and decodes to itself, and a built program's
//! listing assembles back to the same program.

use gearsim_isa::{
    Cmp, DType, FieldKind, Instruction, Opcode, ProgramBuilder, Reg, Target, assemble, decode,
    decode_all, encode,
};
use proptest::prelude::*;

use crate::arbitrary::instruction;

/// Branch targets point at instruction 0, so a one-instruction program is valid.
fn target_zero(instr: Instruction) -> Instruction {
    let spec = instr.spec();
    let mut raw = [0u64; gearsim_isa::spec::MAX_FIELDS];
    let n = instr.raw_fields(&mut raw);
    for (f, v) in spec.fields.iter().zip(raw.iter_mut()) {
        if f.kind == FieldKind::Target {
            *v = 0;
        }
    }
    Instruction::from_raw_fields(instr.opcode(), &raw[..n]).unwrap()
}

fn rebuilt(instr: Instruction) -> Instruction {
    let mut b = ProgramBuilder::new("one");
    b.instruction(instr);
    let (program, comments) = b.finish().unwrap();
    assert!(comments.is_empty());
    assert_eq!(program.instrs.len(), 1);
    program.instrs[0]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn rebuilding_from_fields_gives_the_same_instruction(instr in instruction()) {
        let instr = target_zero(instr);
        let back = rebuilt(instr);
        prop_assert_eq!(back, instr);
        prop_assert_eq!(decode(&encode(&back).unwrap(), 0).unwrap(), instr);
    }

    #[test]
    fn listings_assemble_back(
        instrs in proptest::collection::vec(instruction(), 1..30),
        notes in proptest::collection::vec(any::<bool>(), 30),
    ) {
        let mut b = ProgramBuilder::new("listed");
        for (i, (instr, note)) in instrs.iter().zip(&notes).enumerate() {
            if *note {
                b.comment(format!("before {i}: # and ; are only text here"));
            }
            b.instruction(target_zero(*instr));
        }
        b.comment("after the last instruction");
        let (program, comments) = b.finish().unwrap();
        let text = program.listing(&comments);
        let back = assemble(&text, "listing.s").unwrap();
        // Absolute targets gain an `L0` label in the text; everything else is identical.
        prop_assert_eq!(&back.instrs, &program.instrs);
        prop_assert_eq!(&back.source_lines, &program.source_lines);
        prop_assert_eq!(&back.name, &program.name);
        prop_assert_eq!(decode_all(&program.encode().unwrap()).unwrap(), program.instrs);
    }
}

/// One instruction of every opcode, each field at a value other than its default where the
/// table allows one, through the typed path.
#[test]
fn every_opcode_rebuilds() {
    for &op in Opcode::ALL {
        let spec = op.spec();
        let raw: Vec<u64> = spec
            .fields
            .iter()
            .map(|f| match f.kind {
                FieldKind::Reg => 7,
                FieldKind::Bool => 1,
                FieldKind::Enum(_) if f.name == "ty" && !spec.types.is_empty() => {
                    DType::ALL.iter().position(|d| *d == spec.types[0]).unwrap() as u64
                }
                FieldKind::Enum(_) if f.name == "dst_ty" => 1,
                FieldKind::Enum(_) => 0,
                FieldKind::Target => 0,
                FieldKind::Unsigned | FieldKind::Signed => (1u64 << (f.bits - 1)) - 1,
            })
            .collect();
        let instr = Instruction::from_raw_fields(op, &raw).unwrap();
        assert_eq!(instr.validate(), Ok(()), "{}", spec.mnemonic);
        assert_eq!(rebuilt(instr), instr, "{}", spec.mnemonic);
    }
}

/// The builder and the assembler agree on a small kernel written both ways, labels, names and
/// source lines included.
#[test]
fn built_equals_assembled() {
    let mut b = ProgramBuilder::new("k");
    let top = b.new_label("top");
    let done = b.new_label("done");
    b.comment("count down");
    b.movi(Reg::X1, 3);
    b.place(top);
    b.vcmps(Cmp::Eq, DType::I32, Reg::X2, Reg::X3, Reg::X4)
        .repeat(2)
        .src_rep(0);
    b.beq(Reg::X1, Reg::X0, done);
    b.r#loop(Reg::X1, top);
    b.place(done);
    b.end();
    let (program, comments) = b.finish().unwrap();
    let text = program.listing(&comments);
    assert_eq!(
        text,
        ".kernel k\n    # count down\n    movi x1, 3\ntop:\n    vcmps.eq.i32 x2, x3, x4, \
         repeat=2, src_rep=0\n    beq x1, x0, done\n    loop x1, top\ndone:\n    end\n"
    );
    assert_eq!(assemble(&text, "k.s").unwrap(), program);
    assert_eq!(program.source_lines, vec![3, 5, 6, 7, 9]);
    assert_eq!(
        program.labels,
        vec![("done".to_string(), 4), ("top".to_string(), 1)]
    );
}

#[test]
fn absolute_targets_are_accepted() {
    let mut b = ProgramBuilder::new("abs");
    b.jmp(Target(1));
    b.end();
    let (program, _) = b.finish().unwrap();
    assert_eq!(program.disasm_at(0), "jmp L1");
}
