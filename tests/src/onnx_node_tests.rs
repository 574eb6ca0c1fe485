//! Provisioning of the ONNX backend node tests (`onnx/backend/test/data/node/*`) that the
//! conformance suite runs: the data ships inside the onnx wheel, so a fresh machine gets it
//! with pip and Python's `zipfile`, under `target/`, once.
//!
//! ```text
//!   $GEARSIM_ONNX_NODE_TESTS set ──▶ that directory (checked, never written)
//!   target/onnx-node-tests/onnx-<V>/node exists ──▶ it
//!   otherwise: pip download onnx==<V> ──▶ target/onnx-node-tests/wheel/*.whl
//!              unzip onnx/backend/test/data/node/** ──▶ .extract-<pid>/ ──rename──▶ onnx-<V>/node
//! ```
//!
//! The rename is the last step, so an interrupted run leaves at most a stray `.extract-*`
//! directory (removed by the next run), never a half-filled `node` directory. Anything that
//! cannot be done (no python3, no pip, no network, a bad wheel) panics with what failed and how
//! to provide the data by hand.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::workspace_root;

/// The onnx release whose node tests the suite runs.
pub const ONNX_VERSION: &str = "1.22.0";

/// Environment variable naming an extracted `node` directory to use instead of provisioning.
pub const NODE_TESTS_ENV: &str = "GEARSIM_ONNX_NODE_TESTS";

/// Where the wheel's node tests live inside it.
const WHEEL_NODE_PREFIX: &str = "onnx/backend/test/data/node/";

/// The platform asked of pip: any wheel carries the same data files, and naming one makes the
/// download independent of the local Python version and machine.
const WHEEL_PLATFORM: &str = "manylinux_2_28_x86_64";
/// The Python version asked of pip (see [`WHEEL_PLATFORM`]).
const WHEEL_PYTHON: &str = "3.11";

/// The provisioning root, `target/onnx-node-tests`.
pub fn provisioning_root() -> PathBuf {
    workspace_root().join("target").join("onnx-node-tests")
}

/// The extracted node-test directory, `target/onnx-node-tests/onnx-<V>/node`.
pub fn default_node_dir() -> PathBuf {
    provisioning_root()
        .join(format!("onnx-{ONNX_VERSION}"))
        .join("node")
}

/// The node-test directory (one sub-directory per test with `model.onnx` and
/// `test_data_set_0/`): `$GEARSIM_ONNX_NODE_TESTS` if set, else the provisioned one, downloading
/// and extracting the wheel first if it is not there yet.
///
/// # Panics
///
/// When the data is not there and cannot be provisioned: the message names the step that
/// failed and how to provide the directory by hand.
pub fn ensure_node_tests() -> PathBuf {
    if let Some(dir) = std::env::var_os(NODE_TESTS_ENV) {
        let dir = PathBuf::from(dir);
        if let Err(problem) = check_node_dir(&dir) {
            panic!(
                "{NODE_TESTS_ENV}={}: {problem}; it must name the extracted \
                 `{WHEEL_NODE_PREFIX}` directory of the onnx {ONNX_VERSION} wheel (one \
                 sub-directory per test, each with model.onnx)",
                dir.display()
            );
        }
        return dir;
    }
    let node = default_node_dir();
    if node.is_dir() {
        return node;
    }
    // Tests of one binary run on several threads: one provisions, the others wait for it.
    static PROVISIONING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = PROVISIONING.lock().unwrap_or_else(|p| p.into_inner());
    if node.is_dir() {
        return node;
    }
    if let Err(problem) = provision(&node) {
        panic!(
            "cannot provision the ONNX node tests into {}: {problem}\n\
             To provide them by hand: download the onnx {ONNX_VERSION} wheel (any platform, e.g. \
             `python3 -m pip download onnx=={ONNX_VERSION} --no-deps --only-binary=:all: -d \
             DIR`), unzip its `{WHEEL_NODE_PREFIX}` directory and set \
             {NODE_TESTS_ENV}=<that node directory>",
            node.display()
        );
    }
    node
}

/// Why `dir` is not a usable node-test directory, if it is not.
fn check_node_dir(dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read the directory: {e}"))?;
    let tests = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("model.onnx").is_file())
        .count();
    if tests == 0 {
        return Err("no sub-directory holds a model.onnx".to_string());
    }
    Ok(())
}

/// Downloads the wheel (unless one is already there) and extracts its node tests to `node`.
fn provision(node: &Path) -> Result<(), String> {
    let root = provisioning_root();
    let wheel_dir = root.join("wheel");
    let wheel = match find_wheel(&wheel_dir) {
        Some(w) => w,
        None => {
            download_wheel(&wheel_dir)?;
            find_wheel(&wheel_dir).ok_or_else(|| {
                format!(
                    "pip reported success but left no onnx-{ONNX_VERSION}-*.whl in {}",
                    wheel_dir.display()
                )
            })?
        }
    };
    extract_node_tests(&wheel, &root, node)
}

/// The onnx wheel in `dir`, if one was downloaded before.
fn find_wheel(dir: &Path) -> Option<PathBuf> {
    let prefix = format!("onnx-{ONNX_VERSION}-");
    let mut wheels: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
        })
        .collect();
    wheels.sort();
    wheels.into_iter().next()
}

/// Runs a command, returning its standard output or a message with its standard error.
fn run(mut cmd: Command, what: &str) -> Result<String, String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd.output().map_err(|e| {
        format!("{what}: cannot start `{program}` ({e}); is python3 installed and on PATH?")
    })?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `python3 -m pip download onnx==<V>` into `dir`.
fn download_wheel(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    eprintln!(
        "conformance: downloading the onnx {ONNX_VERSION} wheel into {} (once)",
        dir.display()
    );
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "download", &format!("onnx=={ONNX_VERSION}")])
        .args(["--no-deps", "--only-binary=:all:"])
        .args([
            "--platform",
            WHEEL_PLATFORM,
            "--python-version",
            WHEEL_PYTHON,
        ])
        .arg("-d")
        .arg(dir);
    run(
        cmd,
        &format!("`python3 -m pip download onnx=={ONNX_VERSION}` (needs pip and network access)"),
    )
    .map(drop)
}

/// Python that extracts the members under [`WHEEL_NODE_PREFIX`] of the wheel `argv[1]` into
/// `argv[2]` and prints how many files it wrote.
const EXTRACT_SCRIPT: &str = r#"
import sys, zipfile
prefix = sys.argv[3]
with zipfile.ZipFile(sys.argv[1]) as z:
    members = [m for m in z.namelist() if m.startswith(prefix)]
    z.extractall(sys.argv[2], members)
print(len(members))
"#;

/// Extracts the wheel's node tests into a scratch directory under `root`, then renames them to
/// `node` in one step.
fn extract_node_tests(wheel: &Path, root: &Path, node: &Path) -> Result<(), String> {
    remove_stale_scratch(root);
    let scratch = root.join(format!(".extract-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(EXTRACT_SCRIPT)
        .arg(wheel)
        .arg(&scratch)
        .arg(WHEEL_NODE_PREFIX);
    let result = run(
        cmd,
        &format!(
            "extracting {WHEEL_NODE_PREFIX} from {} with python3's zipfile (delete the wheel if \
             it is corrupt)",
            wheel.display()
        ),
    )
    .and_then(|count| {
        let extracted = scratch.join(WHEEL_NODE_PREFIX.trim_end_matches('/'));
        check_node_dir(&extracted).map_err(|problem| {
            format!(
                "{} holds no node tests under {WHEEL_NODE_PREFIX} ({} files extracted): {problem}",
                wheel.display(),
                count.trim()
            )
        })?;
        let parent = node.parent().unwrap_or(root);
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        match std::fs::rename(&extracted, node) {
            Ok(()) => Ok(()),
            // Another process finished first: its directory is complete too.
            Err(_) if node.is_dir() => Ok(()),
            Err(e) => Err(format!(
                "cannot rename {} to {}: {e}",
                extracted.display(),
                node.display()
            )),
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

/// Removes scratch directories that interrupted runs left behind (their process is gone;
/// where `/proc` does not tell, they are left alone).
fn remove_stale_scratch(root: &Path) {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(".extract-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || !proc.join(pid.to_string()).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
