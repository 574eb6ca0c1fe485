//! `decode(encode(x)) == x`, `parse(disasm(x)) == x` and the declared width, for arbitrary
//! instructions; and `encode(decode(w)) == w` for the words that decode.

use gearsim_isa::{
    Program, WORD_BYTES, Word, assemble, decode, decode_all, disasm, encode, parse_instruction,
};
use proptest::prelude::*;
use zerocopy::{FromBytes, IntoBytes};

use crate::arbitrary::instruction;

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn decode_inverts_encode(instr in instruction()) {
        let word = encode(&instr).unwrap();
        prop_assert_eq!(word.as_bytes().len(), WORD_BYTES);
        prop_assert_eq!(decode(&word, 0).unwrap(), instr);
    }

    #[test]
    fn parse_inverts_disasm(instr in instruction()) {
        let text = disasm(&instr);
        let parsed = parse_instruction(&text);
        prop_assert_eq!(parsed, Ok(instr), "text: {}", text);
    }

    #[test]
    fn words_that_decode_encode_back(bytes in proptest::collection::vec(any::<u8>(), 16)) {
        let word = Word::read_from_bytes(&bytes).unwrap();
        if let Ok(instr) = decode(&word, 3) {
            prop_assert_eq!(encode(&instr).unwrap(), word);
        }
    }

    #[test]
    fn programs_round_trip_through_text(instrs in proptest::collection::vec(instruction(), 1..40)) {
        // Keep branch targets inside the program so the text can name them with labels.
        let n = instrs.len() as u32;
        let instrs: Vec<_> = instrs.into_iter().map(|i| clamp_target(i, n)).collect();
        let program = Program::new(Some("p".into()), instrs.clone());
        let text = program.disassemble();
        let back = assemble(&text, "roundtrip.s").unwrap();
        prop_assert_eq!(&back.instrs, &instrs);
        prop_assert_eq!(decode_all(&program.encode().unwrap()).unwrap(), instrs);
    }
}

fn clamp_target(i: gearsim_isa::Instruction, n: u32) -> gearsim_isa::Instruction {
    use gearsim_isa::Instruction as I;
    match i {
        I::Beq(mut b) => {
            b.target.0 %= n;
            I::Beq(b)
        }
        I::Bne(mut b) => {
            b.target.0 %= n;
            I::Bne(b)
        }
        I::Blt(mut b) => {
            b.target.0 %= n;
            I::Blt(b)
        }
        I::Bge(mut b) => {
            b.target.0 %= n;
            I::Bge(b)
        }
        I::Bltu(mut b) => {
            b.target.0 %= n;
            I::Bltu(b)
        }
        I::Bgeu(mut b) => {
            b.target.0 %= n;
            I::Bgeu(b)
        }
        I::Jmp(mut j) => {
            j.target.0 %= n;
            I::Jmp(j)
        }
        I::LoopNz(mut l) => {
            l.target.0 %= n;
            I::LoopNz(l)
        }
        other => other,
    }
}
