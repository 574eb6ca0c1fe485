//! The calibration suite's fast subset: ResNet-18 at batch 1 on `ascend310p` (target M1), and
//! what a calibration outcome must hold whatever its ratio: the kernels it reports ran inside
//! the execution, one after another on the model's stream, and account for most of it.

use gearsim_host::calibrate::{TARGETS, parse_targets, run_row, table};

#[test]
fn resnet18_batch1_on_310p_is_reported_with_its_kernels() {
    let rows = parse_targets(TARGETS, "targets.csv").unwrap();
    let row = rows
        .iter()
        .find(|r| r.id == "M1" && r.batch == 1)
        .expect("M1 batch 1 is a committed target");
    let x = run_row(row);
    assert!(x.error.is_none(), "{:?}", x.error);
    assert!(x.simulated_us > 0.0 && x.ratio().is_finite());
    // 20 convolutions and the classifier at least (fused epilogues may merge the rest).
    assert!(x.kernels.len() >= 21, "{} kernels", x.kernels.len());
    let sum: f64 = x.kernels.iter().map(|k| k.us).sum();
    assert!(
        sum <= x.simulated_us * 1.001 && sum >= 0.8 * x.simulated_us,
        "kernels {sum} us of {} us",
        x.simulated_us
    );
    for k in &x.kernels {
        assert!((0.0..=1.0).contains(&k.cube), "{k:?}");
        assert!((0.0..=1.0).contains(&k.mte2), "{k:?}");
    }
    assert!(table(std::slice::from_ref(&x)).contains("M1"));
}
