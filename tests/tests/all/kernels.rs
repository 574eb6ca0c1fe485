//! Example kernels give results equal to references computed here.

use gearsim_sim::ExecMode;
use gearsim_tests::*;
use gearsim_traces::NullSink;
use half::f16;

/// fp16 add is exact-then-rounded: the f32 sum of two f16 values rounded once to f16
/// (round to nearest, ties to even) is the correctly rounded f16 sum.
#[test]
fn vector_add_1mi_fp16_over_32_cores_matches_reference() {
    let mut dev = device("ascend910", NullSink);
    let n = 1 << 20;
    let (x, y, z, report) = run_vadd(&mut dev, n, 32, ExecMode::Full, 7);
    assert_eq!(report.cores_used, 32);
    for i in 0..n {
        let want = f16::from_f32(x[i].to_f32() + y[i].to_f32());
        assert_eq!(
            z[i].to_bits(),
            want.to_bits(),
            "element {i}: {} + {}",
            x[i],
            y[i]
        );
    }
}
