//! Fuzz targets of the assembler: random text from the assembly alphabet, random lines built
//! from real mnemonics and operands, and damaged copies of the example kernels
//! (`host/examples/kernels/*.s`) — bytes flipped, lines dropped, duplicated or swapped, numbers
//! replaced by huge values and deeply nested expressions.
//!
//! Each case must give an error naming the file with a line and column inside the source, or a
//! program that encodes and survives `assemble(disassemble(p))` unchanged; never a panic, a
//! stack overflow or a long run. `PROPTEST_CASES=20000 cargo test -p gearsim-isa --release
//! fuzz_asm` runs them longer.

use gearsim_isa::{Opcode, Placement, assemble};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::mutate::{fuzz_config, mutated, mutations, timed};

/// The example kernels, as shipped.
const EXAMPLES: [(&str, &str); 4] = [
    (
        "dma_stream.s",
        include_str!("../../../host/examples/kernels/dma_stream.s"),
    ),
    (
        "matmul_256.s",
        include_str!("../../../host/examples/kernels/matmul_256.s"),
    ),
    (
        "mmad_loop.s",
        include_str!("../../../host/examples/kernels/mmad_loop.s"),
    ),
    (
        "vadd_f16_db.s",
        include_str!("../../../host/examples/kernels/vadd_f16_db.s"),
    ),
];

/// Assembles `text` and checks what comes back: an error inside the source, or a program that
/// encodes and round-trips through its disassembly.
fn check(text: &str, file: &str) {
    match assemble(text, file) {
        Ok(p) => {
            p.encode().expect("an assembled program encodes");
            let back = assemble(&p.disassemble(), "disassembly.s")
                .unwrap_or_else(|e| panic!("the disassembly does not assemble: {e}"));
            assert_eq!(back.instrs, p.instrs);
        }
        Err(e) => {
            assert_eq!(e.file, file);
            let lines = text.lines().count().max(1);
            assert!(
                (1..=lines).contains(&e.line),
                "line {} outside 1..={lines}: {e}",
                e.line
            );
            assert!(e.col >= 1, "{e}");
            assert!(!e.message.is_empty());
        }
    }
}

/// A line built from real mnemonics, keys and values, most of it nearly right.
fn assembly_line() -> impl Strategy<Value = String> {
    let mnemonic = (0..Opcode::ALL.len()).prop_map(|i| {
        let spec = Opcode::ALL[i].spec();
        let mut m = spec.mnemonic.to_string();
        for f in spec.fields {
            if let (Placement::Suffix, gearsim_isa::FieldKind::Enum(names)) = (f.placement, f.kind)
            {
                m.push('.');
                m.push_str(names[0]);
            }
        }
        m
    });
    let operand = prop_oneof![
        (0u32..40).prop_map(|r| format!("x{r}")),
        any::<i64>().prop_map(|v| v.to_string()),
        Just("0xffffffffffffffff".to_string()),
        Just("f16(1.5)".to_string()),
        Just("f32(nan)".to_string()),
        Just("@3".to_string()),
        Just("loop".to_string()),
        "[a-z_]{1,8}=[0-9]{1,4}",
        "[-+*/%()<>|&0-9 ]{1,16}",
    ];
    (
        "(lbl[0-9]: )?",
        mnemonic,
        proptest::collection::vec(operand, 0..5),
    )
        .prop_map(|(label, m, ops)| format!("{label}{m} {}", ops.join(", ")))
}

/// Line-level damage to a source file.
#[derive(Debug, Clone)]
enum LineEdit {
    Drop(Index),
    Duplicate(Index),
    Swap(Index, Index),
    Insert(Index, String),
    /// Replaces the first number on a line with another value.
    Number(Index, String),
}

fn line_edit() -> impl Strategy<Value = LineEdit> {
    let number = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        Just("99999999999999999999999".to_string()),
        Just("-9223372036854775808".to_string()),
        Just("0x".to_string()),
        Just("1 << 63".to_string()),
        Just("(1 << 62) * 4".to_string()),
        Just("-(-9223372036854775807 - 1)".to_string()),
        Just("1 / 0".to_string()),
        Just("7 % 0".to_string()),
        (1usize..3000).prop_map(|n| format!("{}1{}", "(".repeat(n), ")".repeat(n))),
        (1usize..3000).prop_map(|n| format!("{}1", "-".repeat(n))),
    ];
    prop_oneof![
        1 => any::<Index>().prop_map(LineEdit::Drop),
        1 => any::<Index>().prop_map(LineEdit::Duplicate),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| LineEdit::Swap(a, b)),
        1 => (any::<Index>(), assembly_line()).prop_map(|(i, l)| LineEdit::Insert(i, l)),
        2 => (any::<Index>(), number).prop_map(|(i, n)| LineEdit::Number(i, n)),
    ]
}

fn apply(text: &str, edits: &[LineEdit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for e in edits {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let n = lines.len();
        match e {
            LineEdit::Drop(i) => {
                lines.remove(i.index(n));
            }
            LineEdit::Duplicate(i) => {
                let l = lines[i.index(n)].clone();
                lines.insert(i.index(n), l);
            }
            LineEdit::Swap(a, b) => lines.swap(a.index(n), b.index(n)),
            LineEdit::Insert(i, l) => lines.insert(i.index(n + 1), l.clone()),
            LineEdit::Number(i, new) => {
                let line = &mut lines[i.index(n)];
                if let Some(start) = line.find(|c: char| c.is_ascii_digit()) {
                    let end = line[start..]
                        .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                        .map_or(line.len(), |e| start + e);
                    line.replace_range(start..end, new);
                }
            }
        }
    }
    lines.join("\n")
}

#[test]
fn the_examples_assemble() {
    for (name, text) in EXAMPLES {
        check(text, name);
        assert!(assemble(text, name).is_ok(), "{name}");
    }
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn random_text_is_rejected_or_assembled_consistently(
        text in "[a-z0-9_.,:=@()#;/ \t\n+*%<>|&x-]{0,200}",
    ) {
        timed("random assembly text", || check(&text, "random.s"));
    }

    #[test]
    fn random_lines_are_rejected_or_assembled_consistently(
        lines in proptest::collection::vec(assembly_line(), 1..8),
    ) {
        let text = lines.join("\n");
        timed("random assembly lines", || check(&text, "lines.s"));
    }

    #[test]
    fn damaged_example_lines_are_rejected_or_assembled_consistently(
        which in 0usize..EXAMPLES.len(),
        edits in proptest::collection::vec(line_edit(), 1..5),
    ) {
        let (name, text) = EXAMPLES[which];
        let text = apply(text, &edits);
        timed("damaged example kernel", || check(&text, name));
    }

    #[test]
    fn damaged_example_bytes_are_rejected_or_assembled_consistently(
        which in 0usize..EXAMPLES.len(),
        damage in mutations(),
    ) {
        let (name, text) = EXAMPLES[which];
        let bytes = mutated(text.as_bytes(), &damage);
        let text = String::from_utf8_lossy(&bytes);
        timed("damaged example bytes", || check(&text, name));
    }
}
