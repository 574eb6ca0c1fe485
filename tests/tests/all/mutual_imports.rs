//! No two modules of a crate refer to each other: in every workspace crate's `src/`, each
//! `crate::a::b`, `super::a` or `self::a` path (in `use` lines or inline, grouped
//! `crate::{a, b::c}` included) is an edge from its file's module to the longest module path it
//! names, and a pair of modules with edges both ways fails the test. Two files that import each
//! other are one object split in two; the fix is a third module both use, or one owner that
//! passes the other what it needs.
//!
//! Paths relative to a module without `crate`, `super` or `self` are not read; comments and
//! string literals are skipped; `super` inside an inline `mod x { .. }` means the file's own
//! module. A pair ARCHITECTURE.md documents, with its reason, goes in [`ALLOWED`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use gearsim_tests::workspace_root;

/// Pairs of modules allowed to refer to each other: (crate directory, module, module), each
/// with the reason ARCHITECTURE.md gives, or the issue that will remove it.
const ALLOWED: &[(&str, &str, &str)] = &[
    // ARCHITECTURE.md, "The table's macros and what they generate name each other": spec.rs
    // holds the macros table.rs invokes, and their expansions implement table.rs's enums and
    // build.rs's builder methods with spec.rs's types.
    ("isa", "build", "spec"),
    ("isa", "spec", "table"),
];

/// Module path of a file under `src/` (`lib.rs` is the root, ``; `a/mod.rs` is `a`).
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_string();
        if stem != "mod" && !(parts.is_empty() && stem == "lib") {
            parts.push(stem);
        }
    }
    parts.join("::")
}

/// The text with comments and the contents of string and character literals removed (line
/// breaks kept).
fn code(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]))
            && matches!(next, Some('"') | Some('#'))
        {
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if c[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                if c.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c[i] == '\'' && next == Some('\\') {
            // An escaped character literal: skip to its closing quote.
            i += 2;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The crate-absolute paths a file of module `module` names through `crate::`, `super::` and
/// `self::`, with groups expanded: `crate::{a::{b, c}, d}` gives `a::b`, `a::c` and `d`.
fn crate_paths(code: &str, module: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let segs = |m: &str| -> Vec<String> {
        m.split("::")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    // The module each open brace belongs to; inline `mod x {` opens a child.
    let mut scopes: Vec<Vec<String>> = vec![segs(module)];
    let mut pending_mod: Option<String> = None;
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let b = bytes[pos];
        let starts_word = pos == 0 || !(ident(bytes[pos - 1]) || bytes[pos - 1] == b':');
        if b == b'{' {
            let mut scope = scopes.last().cloned().unwrap_or_default();
            if let Some(m) = pending_mod.take() {
                scope.push(m);
            }
            scopes.push(scope);
            pos += 1;
        } else if b == b'}' {
            if scopes.len() > 1 {
                scopes.pop();
            }
            pos += 1;
        } else if b == b';' {
            pending_mod = None;
            pos += 1;
        } else if starts_word && code[pos..].starts_with("mod ") {
            let rest = &code[pos + 4..];
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            pending_mod = Some(name);
            pos += 4;
        } else if starts_word
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|p| code[pos..].starts_with(p))
        {
            let mut base = scopes.last().cloned().unwrap_or_default();
            if code[pos..].starts_with("crate::") {
                base.clear();
                pos += "crate::".len();
            } else if code[pos..].starts_with("self::") {
                pos += "self::".len();
            } else {
                while code[pos..].starts_with("super::") {
                    base.pop();
                    pos += "super::".len();
                }
            }
            pos = expand(code, pos, base.join("::"), &mut out);
        } else {
            pos += 1;
        }
    }
    out
}

/// Reads the path (or group) starting at `pos`, prefixed by `prefix`, into `out`; returns where
/// it ends.
fn expand(code: &str, mut pos: usize, prefix: String, out: &mut Vec<String>) -> usize {
    let bytes = code.as_bytes();
    let skip_ws = |mut p: usize| {
        while p < bytes.len() && bytes[p].is_ascii_whitespace() {
            p += 1;
        }
        p
    };
    pos = skip_ws(pos);
    if pos < bytes.len() && bytes[pos] == b'{' {
        pos += 1;
        loop {
            pos = skip_ws(pos);
            if pos >= bytes.len() {
                return pos;
            }
            match bytes[pos] {
                b'}' => return pos + 1,
                b',' => pos += 1,
                _ => pos = expand(code, pos, prefix.clone(), out),
            }
        }
    }
    let start = pos;
    while pos < bytes.len() && (bytes[pos].is_ascii_alphanumeric() || bytes[pos] == b'_') {
        pos += 1;
    }
    let seg = &code[start..pos];
    let path = if seg.is_empty() || seg == "self" {
        prefix
    } else if prefix.is_empty() {
        seg.to_string()
    } else {
        format!("{prefix}::{seg}")
    };
    if code[pos..].starts_with("::") && !seg.is_empty() {
        return expand(code, pos + 2, path, out);
    }
    if !path.is_empty() {
        out.push(path);
    }
    // Skip the rest of the item (`as x`, `*`) up to a separator.
    while pos < bytes.len() && !matches!(bytes[pos], b',' | b'}' | b';' | b'\n') {
        if bytes[pos] == b'{' {
            break;
        }
        pos += 1;
    }
    pos
}

/// The module a path names: its longest prefix that is a module of the crate (the root when
/// none is).
fn target(path: &str, modules: &BTreeSet<String>) -> String {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains(m))
        .unwrap_or_default()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every pair of modules that refer to each other, per crate directory.
fn mutual_pairs() -> Vec<(String, String, String)> {
    let root = workspace_root();
    let ws: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let members = ws["workspace"]["members"].as_array().unwrap();
    let mut pairs = Vec::new();
    for m in members {
        let dir = m.as_str().unwrap();
        let src = root.join(dir).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let by_module: BTreeMap<String, String> = files
            .iter()
            .map(|f| {
                let rel = f.strip_prefix(&src).unwrap();
                (module_of(rel), std::fs::read_to_string(f).unwrap())
            })
            .collect();
        let modules: BTreeSet<String> = by_module.keys().cloned().collect();
        let mut edges = BTreeSet::new();
        for (module, text) in &by_module {
            for path in crate_paths(&code(text), module) {
                let to = target(&path, &modules);
                if &to != module {
                    edges.insert((module.clone(), to));
                }
            }
        }
        for (a, b) in &edges {
            if a < b && edges.contains(&(b.clone(), a.clone())) {
                pairs.push((dir.to_string(), a.clone(), b.clone()));
            }
        }
    }
    pairs
}

#[test]
fn no_two_modules_refer_to_each_other() {
    let found = mutual_pairs();
    let name = |(d, a, b): &(String, String, String)| format!("{d}/src: {a} <-> {b}");
    let unexpected: Vec<String> = found
        .iter()
        .filter(|(d, a, b)| !ALLOWED.contains(&(d.as_str(), a.as_str(), b.as_str())))
        .map(name)
        .collect();
    assert!(
        unexpected.is_empty(),
        "modules that refer to each other (give them a third module both use, or an owner that \
         passes each what it needs):\n{}",
        unexpected.join("\n")
    );
}

#[test]
fn every_allowed_pair_still_exists() {
    let found = mutual_pairs();
    let stale: Vec<String> = ALLOWED
        .iter()
        .filter(|(d, a, b)| {
            !found
                .iter()
                .any(|(fd, fa, fb)| fd == d && fa == a && fb == b)
        })
        .map(|(d, a, b)| format!("{d}/src: {a} <-> {b}"))
        .collect();
    assert!(
        stale.is_empty(),
        "allowed pairs that no longer refer to each other; remove them from ALLOWED:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_scanner_reads_grouped_and_nested_paths() {
    let text = "use crate::{a::{b, c as d}, e::*};\nlet x = crate::f::g(1); // crate::h\n\
                let s = \"crate::i\"; use super::j::{self, K};\n\
                #[cfg(test)] mod tests { use super::*; use super::super::l; }";
    assert_eq!(
        crate_paths(&code(text), "m::n"),
        [
            "a::b", "a::c", "e", "f::g", "m::j", "m::j::K", "m::n", "m::l"
        ]
    );
    let modules: BTreeSet<String> = ["a", "a::b", "f"].map(String::from).into();
    assert_eq!(target("a::b::X", &modules), "a::b");
    assert_eq!(target("a::c", &modules), "a");
    assert_eq!(target("f::g", &modules), "f");
    assert_eq!(target("Top", &modules), "");
    assert_eq!(module_of(Path::new("lib.rs")), "");
    assert_eq!(module_of(Path::new("a/mod.rs")), "a");
    assert_eq!(module_of(Path::new("a/b.rs")), "a::b");
}
