//! Builder labels: forward and backward references resolve at `finish`; a label placed twice,
//! never placed, created twice or foreign is an error; comments stay with their positions.

use gearsim_isa::{BuildError, ProgramBuilder, Reg, Target};

#[test]
fn forward_and_backward_labels_resolve() {
    let mut b = ProgramBuilder::new("k");
    let back = b.new_label("back");
    let fwd = b.new_label("fwd");
    b.place(back);
    b.movi(Reg::X1, 2);
    b.bne(Reg::X1, Reg::X2, fwd);
    b.jmp(back);
    b.place(fwd);
    b.r#loop(Reg::X1, back);
    b.end();
    let (p, _) = b.finish().unwrap();
    assert_eq!(p.disasm_at(1), "bne x1, x2, fwd");
    assert_eq!(p.disasm_at(2), "jmp back");
    match (p.instrs[1], p.instrs[2], p.instrs[3]) {
        (
            gearsim_isa::Instruction::Bne(b1),
            gearsim_isa::Instruction::Jmp(j),
            gearsim_isa::Instruction::LoopNz(l),
        ) => {
            assert_eq!(b1.target, Target(3));
            assert_eq!(j.target, Target(0));
            assert_eq!(l.target, Target(0));
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn an_unplaced_label_is_an_error() {
    let mut b = ProgramBuilder::new("k");
    let never = b.new_label("never");
    b.jmp(never);
    b.end();
    assert_eq!(
        b.finish().unwrap_err(),
        BuildError::LabelUnplaced {
            name: "never".into()
        }
    );
    // Unused, too: a label is made to be placed.
    let mut b = ProgramBuilder::new("k");
    b.new_label("idle");
    b.end();
    assert!(matches!(b.finish(), Err(BuildError::LabelUnplaced { .. })));
}

#[test]
fn a_label_placed_twice_is_an_error() {
    let mut b = ProgramBuilder::new("k");
    let l = b.new_label("twice");
    b.place(l);
    b.nop();
    b.place(l);
    b.end();
    assert_eq!(
        b.finish().unwrap_err(),
        BuildError::LabelPlacedTwice {
            name: "twice".into(),
            first: 0,
            second: 1
        }
    );
}

#[test]
fn a_duplicate_or_foreign_label_is_an_error() {
    let mut b = ProgramBuilder::new("k");
    b.new_label("same");
    b.new_label("same");
    assert!(matches!(b.finish(), Err(BuildError::DuplicateLabel { .. })));
    let mut other = ProgramBuilder::new("other");
    let foreign = other.new_label("x");
    let mut b = ProgramBuilder::new("k");
    b.jmp(foreign);
    assert!(matches!(
        b.finish(),
        Err(BuildError::ForeignLabel { index: 0 })
    ));
}

#[test]
fn a_branch_past_the_end_is_an_error() {
    let mut b = ProgramBuilder::new("k");
    let end = b.new_label("end_of_program");
    b.jmp(end);
    b.place(end);
    assert!(matches!(
        b.finish(),
        Err(BuildError::TargetPastEnd {
            pc: 0,
            target: 1,
            len: 1,
            ..
        })
    ));
}

#[test]
fn comments_keep_their_positions() {
    let mut b = ProgramBuilder::new("k");
    b.comment("first\nsecond");
    b.nop();
    b.nop();
    b.comment("tail");
    let (p, c) = b.finish().unwrap();
    assert_eq!(c.at(0).collect::<Vec<_>>(), ["first", "second"]);
    assert_eq!(c.at(1).count(), 0);
    assert_eq!(c.at(2).collect::<Vec<_>>(), ["tail"]);
    assert_eq!(
        p.listing(&c),
        ".kernel k\n    # first\n    # second\n    nop\n    nop\n    # tail\n"
    );
}
