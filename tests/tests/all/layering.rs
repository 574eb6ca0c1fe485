//! The layering of DESIGN.md §1, checked by reading every crate's Cargo.toml:
//!
//! ```text
//! isa  <-  traces  <-  sim  <-  firmware  <-  host  <-  python
//!   ^                                          ^
//!   +--- gearsim-compiler (isa only) ----------+
//! ```
//!
//! (`python` is the extension module of the `gearsim` Python package: a user of the host
//! library, as the command line is.)
//!
//! plus what each layer must not know: `isa` no files, time or memory systems; `sim` no file IO
//! or file formats beyond its compiled-in presets; the compiler never runs the chip (its only
//! internal dependency is `isa`, so it cannot).

use std::collections::BTreeMap;
use std::path::Path;

use gearsim_tests::workspace_root;

/// Internal dependencies each crate may have.
const ALLOWED: &[(&str, &[&str])] = &[
    ("gearsim-isa", &[]),
    ("gearsim-traces", &["gearsim-isa"]),
    ("gearsim-sim", &["gearsim-isa", "gearsim-traces"]),
    (
        "gearsim-firmware",
        &["gearsim-isa", "gearsim-traces", "gearsim-sim"],
    ),
    ("gearsim-compiler", &["gearsim-isa"]),
    (
        "gearsim-host",
        &[
            "gearsim-isa",
            "gearsim-traces",
            "gearsim-sim",
            "gearsim-firmware",
            "gearsim-compiler",
        ],
    ),
    (
        "gearsim-python",
        &[
            "gearsim-isa",
            "gearsim-traces",
            "gearsim-sim",
            "gearsim-host",
        ],
    ),
    (
        "gearsim-tests",
        &[
            "gearsim-isa",
            "gearsim-traces",
            "gearsim-sim",
            "gearsim-firmware",
            "gearsim-compiler",
            "gearsim-host",
        ],
    ),
];

/// External crates a layer must not use, and why.
const FORBIDDEN_EXTERNAL: &[(&str, &str, &str)] = &[
    ("gearsim-isa", "memmap2", "isa knows nothing of files"),
    (
        "gearsim-isa",
        "toml",
        "isa knows nothing of files or configuration",
    ),
    ("gearsim-isa", "serde_json", "isa knows nothing of files"),
    (
        "gearsim-compiler",
        "memmap2",
        "the compiler turns bytes into bytes; the CLI reads and writes the files",
    ),
    ("gearsim-sim", "memmap2", "sim does no file IO"),
    (
        "gearsim-sim",
        "serde_json",
        "only traces serialises trace data",
    ),
    (
        "gearsim-firmware",
        "memmap2",
        "firmware runs on the chip and reads no files",
    ),
];

fn manifests() -> BTreeMap<String, (String, toml::Table)> {
    let root = workspace_root();
    let ws: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let members = ws["workspace"]["members"].as_array().unwrap();
    members
        .iter()
        .map(|m| {
            let dir = m.as_str().unwrap();
            let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
            let table: toml::Table = toml::from_str(&text).unwrap();
            let name = table["package"]["name"].as_str().unwrap().to_string();
            (name, (dir.to_string(), table))
        })
        .collect()
}

fn deps(table: &toml::Table, section: &str) -> Vec<String> {
    table
        .get(section)
        .and_then(|d| d.as_table())
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn every_crate_is_in_the_layer_table() {
    let found: Vec<String> = manifests().into_keys().collect();
    let mut known: Vec<String> = ALLOWED.iter().map(|(n, _)| n.to_string()).collect();
    known.sort();
    assert_eq!(
        found, known,
        "workspace members and the layering table disagree"
    );
}

#[test]
fn no_dependency_edge_that_the_design_forbids() {
    let mut violations = Vec::new();
    for (name, (_, table)) in manifests() {
        let allowed = ALLOWED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .unwrap_or(&[]);
        for section in ["dependencies", "build-dependencies"] {
            for dep in deps(&table, section) {
                if dep.starts_with("gearsim-") && !allowed.contains(&dep.as_str()) {
                    violations.push(format!(
                        "{name} depends on {dep} ({section}): not allowed by DESIGN.md §1"
                    ));
                }
                for (crate_name, ext, why) in FORBIDDEN_EXTERNAL {
                    if *crate_name == name && dep == *ext {
                        violations.push(format!("{name} depends on {dep}: {why}"));
                    }
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "layering violations:\n{}",
        violations.join("\n")
    );
}

fn visit(dir: &Path, f: &mut dyn FnMut(&Path, &str)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            visit(&p, f);
        } else if p.extension().is_some_and(|x| x == "rs") {
            f(&p, &std::fs::read_to_string(&p).unwrap());
        }
    }
}

/// Every source file starts with a `//!` line saying what it is for.
#[test]
fn every_source_file_says_what_it_is_for() {
    let root = workspace_root();
    let mut missing = Vec::new();
    for (_, (dir, _)) in manifests() {
        visit(&root.join(dir), &mut |path, text| {
            if path.components().any(|c| c.as_os_str() == "target") {
                return;
            }
            if !text.lines().take(40).any(|l| l.starts_with("//!")) {
                missing.push(path.display().to_string());
            }
        });
    }
    assert!(missing.is_empty(), "files without a //! line: {missing:?}");
}
