//! The table's own rules: unique mnemonics, type lists only on formats with a `ty` field,
//! routed pipes only on the synchronisation instructions, and every format fits the word.

use gearsim_isa::spec::{MAX_FIELDS, PAYLOAD_BITS};
use gearsim_isa::{Opcode, PipeClass, SPECS};

#[test]
fn mnemonics_and_opcodes_are_unique() {
    let mut names: Vec<_> = SPECS.iter().map(|s| s.mnemonic).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "two instructions share a mnemonic");
    for op in Opcode::ALL {
        assert_eq!(Opcode::from_u8(*op as u8), Some(*op));
        assert_eq!(op.spec().opcode, *op as u8);
    }
    assert_eq!(
        Opcode::from_u8(0),
        None,
        "a zeroed word must not be an instruction"
    );
}

#[test]
fn type_lists_restrict_a_ty_field() {
    for s in SPECS {
        if !s.types.is_empty() {
            assert!(
                s.field_index("ty").is_some(),
                "{} lists types but has no `ty` field",
                s.mnemonic
            );
        }
        if s.field_index("ty").is_some() {
            assert!(
                !s.types.is_empty(),
                "{} has a `ty` field but lists no types",
                s.mnemonic
            );
        }
    }
}

#[test]
fn only_sync_instructions_are_routed() {
    let routed: Vec<_> = SPECS
        .iter()
        .filter(|s| s.pipe == PipeClass::Routed)
        .map(|s| s.mnemonic)
        .collect();
    assert_eq!(
        routed,
        [
            "set_flag",
            "wait_flag",
            "pipe_barrier",
            "cross_set",
            "cross_wait"
        ]
    );
}

#[test]
fn formats_fit_the_word() {
    for s in SPECS {
        let bits: u32 = s.fields.iter().map(|f| f.bits).sum();
        assert!(bits <= PAYLOAD_BITS, "{} needs {bits} bits", s.mnemonic);
        assert!(
            s.fields.len() <= MAX_FIELDS,
            "{} has too many fields",
            s.mnemonic
        );
        assert!(!s.doc.trim().is_empty(), "{} has no doc", s.mnemonic);
    }
}

#[test]
fn a_cross_core_flag_id_past_ten_is_refused_by_the_assembler_the_builder_and_the_decoder() {
    use gearsim_isa::{CrossMode, Instruction, Pipe, ProgramBuilder, assemble, decode, encode};
    let ok = assemble("cross_set.aic_aiv FIX, 10\ncross_wait S, 0\nend\n", "k.s").unwrap();
    assert_eq!(ok.instrs.len(), 3);
    let e = assemble("cross_set.all MTE3, 11\nend\n", "k.s")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("operand `id` = 11 is out of range (expected 0..=10)"),
        "{e}"
    );
    let mut b = ProgramBuilder::new("k");
    b.cross_set(CrossMode::Aiv, Pipe::V, 11u8);
    b.end();
    let e = b.finish().unwrap_err().to_string();
    assert!(e.contains("id"), "{e}");
    // A word whose id field holds 11 decodes to nothing.
    let Instruction::CrossCoreWaitFlag(f) = ok.instrs[1] else {
        panic!("{:?}", ok.instrs[1])
    };
    let mut word = encode(&Instruction::CrossCoreWaitFlag(f)).unwrap();
    // The id field follows the 3-bit pipe field at the start of the payload.
    word.payload[0] = (word.payload[0] & 0x07) | (11 << 3);
    assert!(decode(&word, 0).is_err());
}
