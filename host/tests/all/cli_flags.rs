//! The shared flag groups as a user meets them: `--chip_config` and `--clock_mhz` are accepted
//! (and applied) by every subcommand that builds a chip, and `run` refuses a chip other than
//! the one its model was compiled for.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn gearsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gearsim"))
        .args(args)
        .output()
        .expect("run gearsim")
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn path(p: PathBuf) -> String {
    p.display().to_string()
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli_flags");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// `tests/models/tiny_add.onnx` compiled once for the default chip.
fn tiny_om() -> String {
    let out = scratch("tiny_add");
    let o = gearsim(&[
        "compile",
        "--model",
        &path(root().join("tests/models/tiny_add.onnx")),
        "--output",
        &path(out.clone()),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    path(out.with_extension("om"))
}

/// Every subcommand that builds a chip, with the other arguments it needs (none of which is
/// looked at before the chip is built, except the model `run` and `verify` read it from).
fn chip_commands(om: &str) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let kernel = path(root().join("host/examples/kernels/dma_stream.s"));
    let out = path(scratch("out"));
    vec![
        s(&["kernel", "run", &kernel]),
        s(&["kernel", "demo"]),
        s(&["compile", "--model", "absent.onnx", "--output", &out]),
        s(&["run", "--model", om]),
        s(&["verify", "--model", om]),
        s(&["bench", "kernels"]),
        s(&["bench", "runtime"]),
        s(&["bench", "speed"]),
        s(&["demo"]),
        s(&["conformance"]),
        s(&["study", "gears", "--output_dir", &out]),
        s(&[
            "study",
            "advise",
            "--model",
            "absent.onnx",
            "--input_shape",
            "x:-1,4",
            "--shapes",
            "absent.txt",
            "--output_dir",
            &out,
        ]),
    ]
}

#[test]
fn every_chip_building_subcommand_reads_chip_config_and_clock_mhz() {
    let om = tiny_om();
    let missing = path(scratch("no-such-chip.toml"));
    let preset = path(root().join("sim/presets/ascend910.toml"));
    for cmd in chip_commands(&om) {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        // The chip file is read before anything else runs: a missing one is the error.
        let mut with_file = args.clone();
        with_file.extend(["--chip_config", &missing]);
        let o = gearsim(&with_file);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot read {missing}")),
            "{cmd:?}: {stderr}"
        );
        // The clock override is applied (and checked) to the file's chip.
        let mut with_clock = args.clone();
        with_clock.extend(["--chip_config", &preset, "--clock_mhz", "0"]);
        let o = gearsim(&with_clock);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {stderr}");
        assert!(stderr.contains("`core.clock_mhz` = 0"), "{cmd:?}: {stderr}");
        // A setting naming a key the chip does not have is refused, naming the key.
        let mut with_typo = args.clone();
        with_typo.extend(["--set", "scheduler.kernel_launch=2000"]);
        let o = gearsim(&with_typo);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {stderr}");
        assert!(
            stderr.contains("no key `kernel_launch` in `scheduler`"),
            "{cmd:?}: {stderr}"
        );
    }
}

/// `--set` reaches the simulation: a slower clock set on the preset makes the same kernel take
/// more time, and calibrate refuses a bad setting before running anything, writing no CSV.
#[test]
fn a_setting_reaches_the_simulation_and_a_bad_one_writes_nothing() {
    let kernel = path(root().join("host/examples/kernels/dma_stream.s"));
    let time_us = |extra: &[&str]| -> f64 {
        let mut args = vec!["kernel", "run", &kernel, "--soc_version", "ascend310p"];
        args.extend(["--args", "zeros:4096,4096"]);
        args.extend(extra);
        let o = gearsim(&args);
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // "total cycles: 524 (0.484 us at 1080 MHz); ..."
        let line = stdout
            .lines()
            .find(|l| l.starts_with("total cycles:"))
            .unwrap_or_else(|| panic!("no total line in {stdout}"));
        line.split_once('(')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|w| w.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no time in {line}"))
    };
    let base = time_us(&[]);
    let slow = time_us(&["--set", "core.clock_mhz=540"]);
    assert!(
        slow > 1.5 * base,
        "{slow} us at 540 MHz, {base} us at the preset's clock"
    );

    let csv = scratch("set_typo.csv");
    std::fs::write(&csv, "kept").unwrap();
    let models = scratch("set_typo_models");
    let _ = std::fs::remove_dir_all(&models);
    let o = gearsim(&[
        "calibrate",
        "--only",
        "M1",
        "--batch",
        "1",
        "--set",
        "scheduler.kernel_launch_ns=2us",
        "--csv",
        &path(csv.clone()),
        "--models_dir",
        &path(models.clone()),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("expected an integer, got `2us`"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&csv).unwrap(), "kept");
    assert!(!models.exists(), "no workload is written either");
}

#[test]
fn a_chip_file_and_a_clock_reach_the_simulation() {
    let kernel = path(root().join("host/examples/kernels/dma_stream.s"));
    let preset = path(root().join("sim/presets/ascend910.toml"));
    let o = gearsim(&[
        "kernel",
        "run",
        &kernel,
        "--chip_config",
        &preset,
        "--clock_mhz",
        "1500",
        "--args",
        "zeros:4096,4096",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("(32 cores @ 1500 MHz)"), "{stdout}");
    // A model compiled for the chip file's chip verifies for it, at any clock.
    let om = tiny_om();
    let o = gearsim(&[
        "verify",
        "--model",
        &om,
        "--chip_config",
        &preset,
        "--clock_mhz",
        "1500",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn run_defaults_to_the_models_chip_and_refuses_another() {
    let om = tiny_om();
    // Without --input the chip is accepted and the run makes its inputs up (zeros).
    let o = gearsim(&["run", "--model", &om, "--clock_mhz", "1500"]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("output 0 `c`: f32 [2,3]"), "{stdout}");
    let o = gearsim(&["run", "--model", &om, "--soc_version", "ascend310p"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("compiled for ascend910, not ascend310p"),
        "{stderr}"
    );
}
