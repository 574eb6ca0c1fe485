//! Bad input: malformed assembly names file:line:column and what was expected; a word with an
//! unknown opcode names the word and its offset; operands wider than their field are refused.

use gearsim_isa::{
    DType, DecodeError, EncodeError, Instruction, Reg, VBin, assemble, decode_all, encode,
};

fn err(src: &str) -> String {
    assemble(src, "k.s").unwrap_err().to_string()
}

#[test]
fn unknown_mnemonic_names_position() {
    assert_eq!(
        err("    movi x1, 1\n  vadx.f16 x1, x2, x3\n"),
        "k.s:2:3: unknown mnemonic `vadx` (did you mean one of: vadd, vand, vabs, vadds)"
    );
}

#[test]
fn bad_register_names_position_and_expectation() {
    let e = err("vadd.f16 x1, x99, x3");
    assert_eq!(
        e,
        "k.s:1:14: expected register x0..x31 for `src0`, found `x99`"
    );
}

#[test]
fn missing_operand_is_reported() {
    let e = err("vadd.f16 x1, x2");
    assert!(
        e.starts_with("k.s:1:16: `vadd` expects 3 operand(s) (dst, src0, src1), found 2"),
        "{e}"
    );
}

#[test]
fn wrong_suffix_lists_choices() {
    let e = err("vadd.f64 x1, x2, x3");
    assert_eq!(
        e,
        "k.s:1:6: expected ty (f16, f32, i32, i16, u8, bf16, i8), found `f64`"
    );
    let e = err("vdiv.i32 x1, x2, x3");
    assert!(
        e.contains("element type i32 is not supported (expected one of f16, f32)"),
        "{e}"
    );
}

#[test]
fn operand_wider_than_field_is_refused() {
    let e = err("copy_gm_to_ub x1, x2, 4096, 1");
    assert_eq!(
        e,
        "k.s:1:23: operand `nburst` = 4096 does not fit in 12 bits (expected 0..=4095)"
    );
    let e = err("vadd.f16 x1, x2, x3, repeat=256");
    assert!(
        e.contains("operand `repeat` = 256 does not fit in 8 bits"),
        "{e}"
    );
    let e = err("addi x1, x2, 0x80000000");
    assert!(e.contains("does not fit in 32 bits"), "{e}");
}

#[test]
fn unknown_keyed_operand_lists_keys() {
    let e = err("vadd.f16 x1, x2, x3, repeats=2");
    assert!(
        e.starts_with(
            "k.s:1:22: `vadd` has no optional operand `repeats` (expected one of: repeat, dst_blk"
        ),
        "{e}"
    );
}

#[test]
fn labels_and_constants() {
    let e = err("jmp nowhere");
    assert_eq!(e, "k.s:1:5: unknown label `nowhere`");
    let e = err("a:\na:\n end");
    assert_eq!(e, "k.s:2:1: label `a` defined twice");
    let e = err("movi x1, SIZE");
    assert_eq!(e, "k.s:1:10: unknown constant `SIZE` (define it with .equ)");
    let e = err(".equ A, 1/0");
    assert!(e.contains("division by zero"), "{e}");
    let e = err(".bogus 1");
    assert!(e.contains("unknown directive `.bogus`"), "{e}");
    let e = err("  add x1, x2, x3 x4");
    assert!(
        e.starts_with("k.s:1:18: expected `,` or end of line"),
        "{e}"
    );
    let e = err("movi x1, 1 # fine\n vadd.f16 x1, x2, é");
    assert!(e.starts_with("k.s:2:19: unexpected non-ASCII"), "{e}");
}

#[test]
fn constants_and_float_literals_evaluate() {
    let p = assemble(
        ".equ TILE, 128 * 2\n.equ HALF, TILE >> 1\nmovi x1, (TILE + HALF) | 1\nmovi x2, f16(1.5)\nmovi x3, f32(-2)\nmovi x4, -0x10\nend",
        "k.s",
    )
    .unwrap();
    let imms: Vec<i64> = p.instrs[..4]
        .iter()
        .map(|i| match i {
            Instruction::Movi(r) => r.imm,
            _ => panic!("not movi"),
        })
        .collect();
    assert_eq!(imms, vec![385, 0x3e00, i64::from((-2.0f32).to_bits()), -16]);
}

#[test]
fn branch_target_past_end_is_refused() {
    let e = err("jmp @5\nend");
    assert!(
        e.contains("branch target @5 is past the end of the program (2 instructions)"),
        "{e}"
    );
}

#[test]
fn unknown_opcode_word_names_word_and_offset() {
    let mut bytes = assemble("nop\nnop\nend", "k.s").unwrap().encode().unwrap();
    bytes[16] = 0xee;
    let e = decode_all(&bytes).unwrap_err();
    assert!(matches!(
        e,
        DecodeError::UnknownOpcode {
            index: 1,
            offset: 16,
            opcode: 0xee,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "word 1 (byte offset 0x10): unknown opcode 0xee in ee000000000000000000000000000000"
    );
    let e = decode_all(&bytes[..20]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "program is 20 bytes, not a multiple of the 16-byte instruction word"
    );
}

#[test]
fn stray_payload_bits_and_bad_enums_are_decode_errors() {
    let mut bytes = assemble("nop", "k.s").unwrap().encode().unwrap();
    bytes[15] = 1;
    let e = decode_all(&bytes).unwrap_err().to_string();
    assert!(e.contains("past the last operand are not zero"), "{e}");
    // vadd with ty raw value 7 (no such type).
    let mut bytes = assemble("vadd.f16 x1, x2, x3", "k.s")
        .unwrap()
        .encode()
        .unwrap();
    bytes[1] |= 0x7;
    let e = decode_all(&bytes).unwrap_err().to_string();
    assert!(e.contains("operand `ty` = 7 names no value"), "{e}");
}

#[test]
fn encoder_refuses_unsupported_types() {
    let r = |n| Reg::new(n).unwrap();
    let i = Instruction::Vdiv(VBin {
        ty: DType::I32,
        dst: r(1),
        src0: r(2),
        src1: r(3),
        repeat: 1,
        dst_blk: 1,
        src0_blk: 1,
        src1_blk: 1,
        dst_rep: 8,
        src0_rep: 8,
        src1_rep: 8,
    });
    assert!(matches!(
        encode(&i),
        Err(EncodeError::Constraint {
            mnemonic: "vdiv",
            ..
        })
    ));
}

/// Regression (fuzzing): 200 000 nested parentheses or unary minuses overflowed the parser's
/// stack and aborted the process; the nesting is now limited and reported.
#[test]
fn deeply_nested_expressions_are_an_error_not_a_stack_overflow() {
    let deep = 200_000;
    for expr in [
        format!("{}1{}", "(".repeat(deep), ")".repeat(deep)),
        format!("{}1", "-".repeat(deep)),
        format!("{}1{}", "(-".repeat(deep), ")".repeat(deep)),
    ] {
        let e = err(&format!("movi x1, {expr}"));
        assert!(
            e.contains("nested deeper than 64 levels of parentheses and unary minus"),
            "{}",
            &e[..e.len().min(200)]
        );
    }
    // The limit itself still assembles.
    let ok = format!(
        "movi x1, {}1{}",
        "(".repeat(gearsim_isa::MAX_EXPR_DEPTH),
        ")".repeat(gearsim_isa::MAX_EXPR_DEPTH)
    );
    assemble(&ok, "k.s").unwrap();
    let ok = format!("movi x1, {}1", "-".repeat(gearsim_isa::MAX_EXPR_DEPTH));
    assemble(&ok, "k.s").unwrap();
}
