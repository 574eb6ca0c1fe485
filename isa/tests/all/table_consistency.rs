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
    assert_eq!(routed, ["set_flag", "wait_flag", "pipe_barrier"]);
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
