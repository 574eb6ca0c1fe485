//! The unit constants: field limits follow the table's declared widths.

use gearsim_isa::units::*;
use gearsim_isa::{Opcode, Placement};

#[test]
fn field_limits_come_from_the_table() {
    let nburst = Opcode::CopyGmToUb
        .spec()
        .fields
        .iter()
        .find(|f| f.name == "nburst")
        .unwrap();
    assert_eq!(BURST_COUNT_MAX, (1 << nburst.bits) - 1);
    assert_eq!(BURST_COUNT_MAX, 4095);
    assert_eq!(BURST_LEN_MAX, 0xffff);
    assert_eq!(BURST_GAP_MAX, 0xffff);
    assert_eq!(PAD_BURST_LEN_MAX, (1 << 21) - 1);
    assert_eq!(REPEAT_MAX, 255);
    assert_eq!(BLOCK_STRIDE_MAX, 255);
    assert_eq!(REPEAT_STRIDE_MAX, 255);
    assert_eq!(FLAG_ID_MAX, 15);
    assert_eq!(IMG2COL_STRIDE_MAX, 63);
    let repeat = Opcode::Vadd
        .spec()
        .fields
        .iter()
        .find(|f| f.name == "repeat")
        .unwrap();
    assert!(matches!(repeat.placement, Placement::Keyed(_)));
}

#[test]
fn data_units() {
    assert_eq!(BLOCK_BYTES * BLOCKS_PER_REPEAT, REPEAT_BYTES);
    assert_eq!(FRACTAL_ROWS * C0 * 2, FRACTAL_BYTES);
    assert_eq!(FRACTAL_BYTES, 512);
    assert_eq!(FRACTAL_BYTES_F32, 1024);
    assert_eq!(MASK_BITS, REPEAT_BYTES / 2);
}
