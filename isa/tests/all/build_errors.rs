//! Builder errors are typed values naming the instruction and the field, sticky until `finish`.

use gearsim_isa::units::{BURST_COUNT_MAX, REPEAT_MAX};
use gearsim_isa::{BuildError, DType, Pipe, ProgramBuilder, Reg};

fn first_error(b: ProgramBuilder) -> BuildError {
    b.finish().unwrap_err()
}

#[test]
fn a_field_past_its_declared_width_names_instruction_and_field() {
    let mut b = ProgramBuilder::new("k");
    b.nop();
    b.copy_gm_to_ub(Reg::X1, Reg::X2, BURST_COUNT_MAX + 1, 1);
    assert_eq!(
        first_error(b),
        BuildError::FieldRange {
            pc: 1,
            mnemonic: "copy_gm_to_ub",
            field: "nburst",
            value: 4096,
            min: 0,
            max: 4095,
        }
    );
}

#[test]
fn a_keyed_setter_is_range_checked() {
    let mut b = ProgramBuilder::new("k");
    b.vadd(DType::F16, Reg::X1, Reg::X2, Reg::X3)
        .repeat(REPEAT_MAX + 1);
    let e = first_error(b);
    assert_eq!(
        e,
        BuildError::FieldRange {
            pc: 0,
            mnemonic: "vadd",
            field: "repeat",
            value: 256,
            min: 0,
            max: 255,
        }
    );
    assert_eq!(
        e.to_string(),
        "instruction 0 (vadd): operand `repeat` = 256 is outside 0..=255"
    );
}

#[test]
fn negative_and_signed_values() {
    let mut b = ProgramBuilder::new("k");
    b.copy_ub_to_gm(Reg::X1, Reg::X2, 1, 1).dst_gap(-1);
    assert!(matches!(
        first_error(b),
        BuildError::FieldRange {
            field: "dst_gap",
            value: -1,
            ..
        }
    ));
    let mut b = ProgramBuilder::new("k");
    b.addi(Reg::X1, Reg::X1, i64::from(i32::MIN));
    b.addi(Reg::X1, Reg::X1, i64::from(i32::MAX) + 1);
    assert!(matches!(
        first_error(b),
        BuildError::FieldRange { pc: 1, mnemonic: "addi", field: "imm", min, max, .. }
            if min == i128::from(i32::MIN) && max == i128::from(i32::MAX)
    ));
    let mut b = ProgramBuilder::new("k");
    b.set_flag(Pipe::Mte2, Pipe::V, 16u8);
    assert!(matches!(
        first_error(b),
        BuildError::FieldRange {
            mnemonic: "set_flag",
            field: "id",
            max: 15,
            ..
        }
    ));
}

#[test]
fn table_constraints_are_checked() {
    let mut b = ProgramBuilder::new("k");
    b.vadd(DType::I16, Reg::X1, Reg::X2, Reg::X3);
    assert!(matches!(
        first_error(b),
        BuildError::Constraint {
            pc: 0,
            mnemonic: "vadd",
            ..
        }
    ));
    let mut b = ProgramBuilder::new("k");
    b.vconv(DType::I16, DType::F16, Reg::X1, Reg::X2);
    assert!(matches!(
        first_error(b),
        BuildError::Constraint {
            mnemonic: "vconv",
            ..
        }
    ));
    // Bytes only widen to f16, and no arithmetic takes them.
    let mut b = ProgramBuilder::new("k");
    b.vconv(DType::F32, DType::U8, Reg::X1, Reg::X2);
    assert!(matches!(
        first_error(b),
        BuildError::Constraint {
            mnemonic: "vconv",
            ..
        }
    ));
    let mut b = ProgramBuilder::new("k");
    b.vadd(DType::U8, Reg::X1, Reg::X2, Reg::X3);
    assert!(matches!(
        first_error(b),
        BuildError::Constraint {
            mnemonic: "vadd",
            ..
        }
    ));
}

#[test]
fn the_first_error_sticks() {
    let mut b = ProgramBuilder::new("k");
    b.movi(Reg::X1, 1);
    b.copy_gm_to_l1(Reg::X1, Reg::X2, 1, 70_000);
    b.copy_gm_to_ub(Reg::X1, Reg::X2, 9_999, 1);
    b.end();
    assert!(b.error().is_some());
    assert!(matches!(
        first_error(b),
        BuildError::FieldRange {
            pc: 1,
            mnemonic: "copy_gm_to_l1",
            field: "len",
            ..
        }
    ));
}

#[test]
fn the_instruction_count_is_bounded() {
    let mut b = ProgramBuilder::new("k").max_instructions(3);
    for _ in 0..10 {
        b.nop();
    }
    assert_eq!(b.len(), 3);
    assert_eq!(
        first_error(b),
        BuildError::TooManyInstructions {
            program: "k".into(),
            max: 3
        }
    );
}

#[test]
fn names_must_read_back() {
    assert!(matches!(
        first_error(ProgramBuilder::new("2k")),
        BuildError::BadName { what: "kernel", .. }
    ));
    let mut b = ProgramBuilder::new("k");
    b.new_label("has space");
    assert!(matches!(
        first_error(b),
        BuildError::BadName { what: "label", .. }
    ));
}
