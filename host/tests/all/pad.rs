//! Pad-to-gear execution: a batch between gears runs padded on the next larger gear and gives
//! the outputs of an unpadded run (the hybrid model's dynamic path at that exact batch); a
//! model whose rows mix is refused, as are batches no gear can hold.

use std::path::Path;

use super::advise::batch_mixing_model;
use super::cli::gearsim;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pad");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn compile(onnx: &Path, name: &str, shape: &str, gears: &str, hybrid: bool) -> String {
    let out = scratch(name);
    let mut args = vec![
        "compile".to_string(),
        "--model".into(),
        onnx.display().to_string(),
        "--output".into(),
        out.display().to_string(),
        "--input_shape".into(),
        shape.into(),
        "--dynamic_batch_size".into(),
        gears.into(),
        "--soc_version".into(),
        "ascend310p".into(),
    ];
    if hybrid {
        args.push("--hybrid".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = gearsim(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    format!("{}.om", out.display())
}

/// The first output of a run of `model` at made-up batch `b` (seed `b`), with `extra` flags.
fn output(model: &str, b: i64, extra: &[&str], tag: &str) -> (Vec<f64>, String) {
    let dir = scratch(&format!("{tag}_{b}"));
    let batch = b.to_string();
    let mut args = vec![
        "run",
        "--model",
        model,
        "--dymBatch",
        &batch,
        "--input_gen",
        "random",
        "--seed",
        &batch,
    ];
    let out = dir.display().to_string();
    args.extend_from_slice(&["--output_dir", &out]);
    args.extend_from_slice(extra);
    let o = gearsim(&args);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t = gearsim_host::npy::read(&dir.join("output_0.npy")).unwrap();
    assert_eq!(t.dims[0], b, "{stdout}");
    (t.to_f64s(), stdout)
}

#[test]
fn padded_runs_match_unpadded_ones_at_every_batch_between_gears() {
    let onnx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/models/cnn.onnx");
    let model = compile(&onnx, "cnn_pad", "input:-1,3,32,32", "1,4,8", true);
    for b in 1..=8 {
        let (padded, text) = output(&model, b, &["--pad_to_gear"], "padded");
        let (exact, reference) = output(&model, b, &[], "exact");
        let gear = [1, 4, 8].contains(&b);
        if gear {
            assert!(!text.contains("padded:"), "{text}");
            assert_eq!(padded, exact, "batch {b} is a gear: the same run");
        } else {
            let to = if b < 4 { 4 } else { 8 };
            let wasted = 100.0 * (1.0 - b as f64 / to as f64);
            assert!(
                text.contains(&format!(
                    "padded: batch {b} -> gear {} (batch {to}), {wasted:.1}% of its rows padding",
                    if to == 4 { 1 } else { 2 }
                )),
                "{text}"
            );
            assert!(text.contains("rows are independent"), "{text}");
            assert!(reference.contains("path dynamic"), "{reference}");
            let scale = exact.iter().fold(0f64, |m, v| m.max(v.abs()));
            let worst = padded
                .iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0f64, f64::max);
            assert!(
                worst <= 1e-2 * scale,
                "batch {b}: padded differs from unpadded by {worst} of {scale}"
            );
        }
    }
}

#[test]
fn models_that_mix_rows_and_batches_beyond_the_gears_are_refused() {
    let onnx = scratch("mix.onnx");
    std::fs::write(&onnx, batch_mixing_model()).unwrap();
    let model = compile(&onnx, "mix_pad", "x:-1,16", "1,2,4", false);
    let out = scratch("mix_out");
    let _ = std::fs::remove_dir_all(&out);
    let refused = |batch: &str, says: &str| {
        let o = gearsim(&[
            "run",
            "--model",
            &model,
            "--dymBatch",
            batch,
            "--pad_to_gear",
            "--output_dir",
            &out.display().to_string(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{err}");
        assert!(!out.join("output_0.npy").exists(), "nothing is written");
    };
    refused(
        "3",
        "--pad_to_gear refused: output `y`'s first 1 row(s) change",
    );
    refused("3", "mixes rows of the batch");
    refused("5", "batch 5 is larger than every gear (1,2,4)");
    // At a gear nothing is padded, so the model runs.
    let o = gearsim(&["run", "--model", &model, "--dymBatch", "2", "--pad_to_gear"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
