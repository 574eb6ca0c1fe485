//! The calibration suite's fast subset: ResNet-18 at batch 1 on `ascend310p` (target M1), and
//! what a calibration outcome must hold whatever its ratio: the kernels it reports ran inside
//! the execution, one after another on the model's stream, and account for most of it.

use gearsim_host::calibrate::{
    ChipOverride, Row, TARGETS, kernel_table, parse_targets, run_row, run_row_on, table,
};
use gearsim_sim::{ChipConfig, Setting};

/// Target M1 at batch 1 (ResNet-18 on `ascend310p`), the suite's fast row.
fn m1_batch1() -> Row {
    parse_targets(TARGETS, "targets.csv")
        .unwrap()
        .into_iter()
        .find(|r| r.id == "M1" && r.batch == 1)
        .expect("M1 batch 1 is a committed target")
}

#[test]
fn resnet18_batch1_on_310p_is_reported_with_its_kernels() {
    let row = &m1_batch1();
    let x = run_row(row);
    assert!(x.error.is_none(), "{:?}", x.error);
    assert!(x.simulated_us > 0.0 && x.ratio().is_finite());
    // 20 convolutions and the classifier at least (fused epilogues may merge the rest).
    assert!(x.kernels.len() >= 21, "{} kernels", x.kernels.len());
    let sum: f64 = x.kernels.iter().map(|k| k.us).sum();
    assert!(
        sum <= x.execute_us * 1.001 && sum >= 0.8 * x.execute_us,
        "kernels {sum} us of {} us",
        x.execute_us
    );
    // ais_bench times the aclmdlExecute call: the host's submission and wake-up are in the
    // figure, beside the device's execution, and the row says how much they are.
    let host = x.simulated_us - x.execute_us;
    assert!(
        host > 0.0,
        "{} us against {} us",
        x.simulated_us,
        x.execute_us
    );
    assert!(
        x.notes.iter().any(|n| n.contains("aclmdlExecute call")),
        "{:?}",
        x.notes
    );
    for k in &x.kernels {
        assert!((0.0..=1.0).contains(&k.cube), "{k:?}");
        assert!((0.0..=1.0).contains(&k.mte2), "{k:?}");
    }
    assert!(table(std::slice::from_ref(&x)).contains("M1"));
    // The kernel table's heading says what crossed HBM and its time at the preset's rate.
    assert_eq!(x.hbm_bytes_per_second, 204_800_000_000);
    let hbm: u64 = x.kernels.iter().map(|k| k.traffic.hbm_bytes()).sum();
    assert!(hbm > 0);
    let heading = kernel_table(&x)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let want = format!(
        "{:.1} MB through HBM, {:.1} us of it at 204.8 GB/s",
        hbm as f64 / 1e6,
        hbm as f64 / 204.8e3
    );
    assert!(heading.ends_with(&want), "{heading}");
}

/// A changed chip runs the rows of the preset it changes, says so in their notes, and moves
/// their times (half the clock: slower); rows of other presets are untouched.
#[test]
fn a_changed_chip_runs_the_rows_of_its_preset() {
    let row = &m1_batch1();
    let mut cfg = ChipConfig::preset(&row.chip).unwrap();
    cfg.core.clock_mhz /= 2;
    let slow = ChipOverride {
        file: Some((cfg, "half_clock.toml".into())),
        settings: Vec::new(),
    };
    assert!(slow.applies_to(row));
    let (base, changed) = (
        run_row(row),
        run_row_on(row, Some(&slow), Default::default()),
    );
    assert!(changed.error.is_none(), "{:?}", changed.error);
    // The device's part: the host's submission and wake-up do not run on the AI core clock.
    assert!(
        changed.execute_us > 1.3 * base.execute_us,
        "{} us at half the clock, {} us at the preset's",
        changed.execute_us,
        base.execute_us
    );
    assert!(changed.notes.iter().any(|n| n.contains("half_clock.toml")));
    let other = ChipOverride {
        file: Some((ChipConfig::preset("ascend910").unwrap(), "910.toml".into())),
        settings: Vec::new(),
    };
    assert!(!other.applies_to(row));
    assert_eq!(
        run_row_on(row, Some(&other), Default::default()).simulated_us,
        base.simulated_us
    );
}

/// `--set`: a setting changes every row's preset by that one value, and says so. ResNet-18 at
/// batch 1 launches 24 kernels, so 10 us more per launch is 240 us more on the device.
#[test]
fn a_setting_changes_the_rows_preset_by_that_value() {
    let row = &m1_batch1();
    let launch = ChipConfig::preset(&row.chip)
        .unwrap()
        .scheduler
        .kernel_launch_ns;
    let setting = format!("scheduler.kernel_launch_ns={}", launch + 10_000);
    let slow = ChipOverride {
        file: None,
        settings: vec![Setting::parse(&setting).unwrap()],
    };
    let (base, changed) = (
        run_row(row),
        run_row_on(row, Some(&slow), Default::default()),
    );
    assert!(changed.error.is_none(), "{:?}", changed.error);
    assert_eq!(changed.kernels.len(), base.kernels.len());
    let added = changed.execute_us - base.execute_us;
    let expected = 10.0 * base.kernels.len() as f64;
    assert!(
        (added - expected).abs() < 0.05 * expected,
        "{added} us added, {expected} expected"
    );
    assert!(
        changed
            .notes
            .iter()
            .any(|n| n == &format!("set: {setting}")),
        "{:?}",
        changed.notes
    );
    // A key the preset does not have is an error naming it, not an unchanged run.
    let typo = ChipOverride {
        file: None,
        settings: vec![Setting::parse("scheduler.kernel_launch=1").unwrap()],
    };
    let e = run_row_on(row, Some(&typo), Default::default())
        .error
        .expect("an unknown key is refused");
    assert!(e.contains("no key `kernel_launch` in `scheduler`"), "{e}");
}

#[test]
fn resnet50s_residual_pointwise_layers_fall_off_the_l2_between_batch_4_and_8() {
    // A public measurement outside the targets (Huawei's msadvisor documentation, CANN 7.0:
    // ResNet-50 int8 on an Atlas inference card): res2a/b/c_branch2c, the residual 1×1
    // convolutions at 56×56, take 3.8-5.2x longer at batch 8 than at batch 4, because their
    // data no longer fits the L2. The same layers here must show the cliff, not the 2x of
    // twice the work.
    let rows = parse_targets(TARGETS, "targets.csv").unwrap();
    let residual_layers = |batch: i64| -> Vec<f64> {
        let row = rows
            .iter()
            .find(|r| r.id == "M2" && r.batch == batch)
            .expect("M2 is a committed target");
        let x = run_row(row);
        assert!(x.error.is_none(), "{:?}", x.error);
        let name = format!("Conv_f16_{batch}x256x56x56_5hd_relu");
        let times: Vec<f64> = x
            .kernels
            .iter()
            .filter(|k| k.name == name)
            .map(|k| k.us)
            .collect();
        assert_eq!(times.len(), 3, "{name} in {:?}", x.kernels);
        times
    };
    let (b4, b8) = (residual_layers(4), residual_layers(8));
    for (i, (a, b)) in b4.iter().zip(&b8).enumerate() {
        assert!(
            b / a > 2.8,
            "layer {i}: {a} us at batch 4, {b} us at batch 8"
        );
    }
}

#[test]
fn shards_of_the_table_concatenate_by_row_into_the_whole_run() {
    use super::cli::gearsim;
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("calibrate_shards");
    std::fs::create_dir_all(&dir).unwrap();
    // The K10 rows: five quantised GEMMs, quick to simulate.
    let run = |shard: &str, out: &str| -> Vec<String> {
        let path = dir.join(out);
        let o = gearsim(&[
            "calibrate",
            "--only",
            "K10",
            "--threads",
            "2",
            "--shard",
            shard,
            "--csv",
            &path.display().to_string(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    };
    let whole = run("0/1", "whole.csv");
    assert!(whole[0].starts_with("row,id,net,"));
    assert_eq!(whole.len(), 6);
    let mut merged: Vec<String> = Vec::new();
    for i in 0..3 {
        let part = run(&format!("{i}/3"), &format!("s{i}.csv"));
        assert_eq!(part[0], whole[0]);
        merged.extend(part.into_iter().skip(1));
    }
    merged.sort_by_key(|l| l.split(',').next().unwrap().parse::<usize>().unwrap());
    assert_eq!(merged, whole[1..]);
    // More shards than rows: the empty ones say so.
    let o = gearsim(&["calibrate", "--only", "K10", "--shard", "7/8"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--shard 7/8: no selected row"));
}
