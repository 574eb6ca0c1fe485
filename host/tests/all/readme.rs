//! The README stays true: every ```sh block runs as written, and every ```text block that
//! starts with a `gearsim` command line holds that command's output.
//!
//! The blocks run with bash (`-euo pipefail`) in a scratch directory that looks like a fresh
//! checkout (`tests/`, `host/` and `sim/` linked, `docs/` copied, so commands that write there
//! leave the repository alone), with this build's `gearsim` first on the PATH. Lines starting
//! with `cargo` or running `tests/run-all.sh` are skipped: the test suite is what runs them.
//! The Slurm recipes run as a one-task array (the whole sweep; `tests/slurm/run.sh` runs them
//! as real arrays). Output blocks are compared line by line after masking what depends on the
//! host (simulator speed, host seconds, thread counts); `GEARSIM_BLESS=1` rewrites them and
//! copies the figures the commands wrote under `docs/` back, which is how the README's figures
//! are regenerated.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A fenced block of the README.
struct Block {
    /// `sh` or `text`.
    kind: String,
    /// 1-based line of the opening fence.
    line: usize,
    /// The lines between the fences.
    body: Vec<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn blocks(readme: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in readme.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(kind)) => {
                open = Some(Block {
                    kind: kind.trim().to_string(),
                    line: i + 1,
                    body: Vec::new(),
                })
            }
            (Some(_), Some("")) => out.extend(open.take()),
            (Some(b), _) => b.body.push(line.to_string()),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "README.md: a fenced block is not closed");
    out
}

/// The command line an output block starts with (`gearsim ...` or `$ gearsim ...`).
fn output_command(b: &Block) -> Option<String> {
    let first = b.body.first()?;
    let cmd = first.strip_prefix("$ ").unwrap_or(first);
    (b.kind == "text" && cmd.starts_with("gearsim ")).then(|| cmd.to_string())
}

/// Replaces what depends on the host, not on the simulation, by a placeholder.
fn mask(line: &str) -> String {
    let mut out = String::new();
    let words: Vec<&str> = line.split(' ').collect();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        let next = words.get(i + 1).copied().unwrap_or("");
        let after = words.get(i + 2).copied().unwrap_or("");
        let number = |s: &str| !s.is_empty() && s.parse::<f64>().is_ok();
        // "34.4 M cycles/s," / "10.9 M instr/s"
        if number(w)
            && next == "M"
            && (after.starts_with("cycles/s") || after.starts_with("instr/s"))
        {
            out.push_str("<rate> ");
            out.push_str(after);
            i += 3;
        // "206 runs in 1.00 s thread-cpu]" and "in 4.0 s on 2 thread(s)"
        } else if w == "in" && number(next) && after == "s" {
            out.push_str("in <host seconds>");
            i += 3;
        } else if w == "on" && number(next) && after.starts_with("thread") {
            out.push_str("on <threads> ");
            out.push_str(after);
            i += 3;
        } else if number(w) && next == "runs" {
            out.push_str("<runs> runs");
            i += 2;
        } else {
            out.push_str(w);
            i += 1;
        }
        if i < words.len() {
            out.push(' ');
        }
    }
    out.trim_end().to_string()
}

/// A scratch directory that looks like a fresh checkout.
fn checkout() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for d in ["tests", "host", "sim"] {
        std::os::unix::fs::symlink(root().join(d).canonicalize().unwrap(), dir.join(d)).unwrap();
    }
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dir.join("docs").join(e.file_name())).unwrap();
        }
    }
    dir
}

fn bash(dir: &Path, script: &str) -> std::process::Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_gearsim"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .env("SLURM_ARRAY_TASK_ID", "0")
        .env("SLURM_ARRAY_TASK_COUNT", "1")
        .output()
        .unwrap()
}

fn tail(s: &[u8]) -> String {
    let s = String::from_utf8_lossy(s);
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[test]
fn every_readme_command_runs_and_every_output_block_is_current() {
    let readme_path = root().join("README.md");
    let readme = std::fs::read_to_string(&readme_path).unwrap();
    let blocks = blocks(&readme);
    let dir = checkout();
    let bless = std::env::var_os("GEARSIM_BLESS").is_some();
    let mut stale = Vec::new();
    let mut regenerated: Vec<(usize, Vec<String>)> = Vec::new();
    let mut ran = 0;
    for b in &blocks {
        if b.kind == "sh" {
            let script: Vec<&str> = b
                .body
                .iter()
                .map(String::as_str)
                .filter(|l| {
                    let l = l.trim_start();
                    !l.starts_with("cargo ") && !l.starts_with("tests/run-all.sh")
                })
                .collect();
            if script.iter().all(|l| l.trim().is_empty()) {
                continue;
            }
            let o = bash(&dir, &script.join("\n"));
            assert!(
                o.status.success(),
                "README.md line {}: the block fails ({}):\n{}\nstderr:\n{}",
                b.line,
                o.status,
                script.join("\n"),
                tail(&o.stderr)
            );
            ran += 1;
        } else if let Some(cmd) = output_command(b) {
            let o = bash(&dir, &cmd);
            assert!(
                o.status.success(),
                "README.md line {}: `{cmd}` fails:\n{}",
                b.line,
                tail(&o.stderr)
            );
            let got: Vec<String> = String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_string)
                .collect();
            let want = &b.body[1..];
            let same =
                got.len() == want.len() && got.iter().zip(want).all(|(g, w)| mask(g) == mask(w));
            if !same {
                stale.push(format!(
                    "README.md line {}: `{cmd}` now prints:\n{}",
                    b.line,
                    got.join("\n")
                ));
                regenerated.push((b.line, got));
            }
            ran += 1;
        }
    }
    assert!(ran >= 10, "only {ran} README blocks ran");
    if bless && !regenerated.is_empty() {
        let mut lines: Vec<String> = readme.lines().map(str::to_string).collect();
        // From the bottom up, so earlier line numbers stay valid.
        for (line, got) in regenerated.iter().rev() {
            let b = blocks.iter().find(|b| b.line == *line).unwrap();
            let first = *line + 1; // 0-based index of the command line is `line`
            lines.splice(first..first + b.body.len() - 1, got.iter().cloned());
        }
        std::fs::write(&readme_path, lines.join("\n") + "\n").unwrap();
    }
    if bless {
        for e in std::fs::read_dir(dir.join("docs")).unwrap() {
            let e = e.unwrap();
            let dst = root().join("docs").join(e.file_name());
            if std::fs::read(e.path()).ok() != std::fs::read(&dst).ok() {
                std::fs::copy(e.path(), &dst).unwrap();
            }
        }
        return;
    }
    assert!(
        stale.is_empty(),
        "README output blocks are stale (GEARSIM_BLESS=1 rewrites them):\n{}",
        stale.join("\n\n")
    );
}

#[test]
fn masking_hides_host_figures_only() {
    assert_eq!(
        mask(
            "cnn b1 full: 34.4 M cycles/s, 10.9 M instr/s  [167103 cycles, 52895 instr per run; 206 runs in 1.00 s thread-cpu]"
        ),
        "cnn b1 full: <rate> cycles/s, <rate> instr/s  [167103 cycles, 52895 instr per run; <runs> runs in <host seconds> thread-cpu]"
    );
    assert_eq!(
        mask("adv/advise.csv written in 4.0 s on 2 thread(s)"),
        "adv/advise.csv written in <host seconds> on <threads> thread(s)"
    );
    assert_eq!(mask("  MatMul 74304 cycles"), "  MatMul 74304 cycles");
}
