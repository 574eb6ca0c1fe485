//! Tidy checks on the sources: no `match` over instructions, opcodes or task kinds has a `_ =>`
//! arm (STYLE.md point 5), so a new opcode or task kind does not build until every consumer
//! handles it; no assembly text is built or parsed outside `isa` and the `kernel` command
//! (programs are built with the typed builders); no limit of the ISA table is restated as a
//! literal outside `isa` (`isa::units` derives them from the field widths).
//!
//! The scan is textual and needs no parser: comments and literals are blanked, each `match`
//! body is split into arms by bracket depth, and a match counts as one over instructions when
//! an arm's pattern names `Instruction::`, `Opcode::`, `I::` (the usual alias of
//! `Instruction`), `Task::`, `TaskKind::` or `OmTask::`. Matches nested in an arm are checked
//! on their own, so a `_ =>` over a pipe or an integer inside an instruction arm is fine.

use std::path::Path;

use gearsim_tests::workspace_root;

/// Enums a match must handle exhaustively, as they appear before `::` in a pattern.
const EXHAUSTIVE: &[&str] = &["Instruction", "Opcode", "I", "Task", "TaskKind", "OmTask"];

/// Crates whose `src/` trees are scanned.
const CRATES: &[&str] = &["isa", "traces", "sim", "firmware", "host/compiler", "host"];

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The source with comments, string literals and char literals replaced by spaces (line
/// breaks kept), so brackets and words inside them do not count.
fn blank(src: &str) -> Vec<char> {
    let c: Vec<char> = src.chars().collect();
    let mut out = c.clone();
    let wipe = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in &mut out[from..to.min(c.len())] {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    let at = |i: usize, s: &str| s.chars().enumerate().all(|(k, x)| c.get(i + k) == Some(&x));
    let mut i = 0;
    while i < c.len() {
        let free = i == 0 || !is_ident(c[i - 1]);
        if at(i, "//") {
            let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
            wipe(&mut out, i, end);
            i = end;
        } else if at(i, "/*") {
            let (mut j, mut depth) = (i, 0);
            while j < c.len() {
                if at(j, "/*") {
                    depth += 1;
                    j += 2;
                } else if at(j, "*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            wipe(&mut out, i, j);
            i = j;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            wipe(&mut out, i + 1, j);
            i = j + 1;
        } else if c[i] == 'r' && (free || (c[i - 1] == 'b' && (i < 2 || !is_ident(c[i - 2])))) {
            let hashes = (i + 1..c.len()).take_while(|&j| c[j] == '#').count();
            if c.get(i + 1 + hashes) != Some(&'"') {
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let start = i + 2 + hashes;
            let end = (start..c.len()).find(|&j| at(j, &close)).unwrap_or(c.len());
            wipe(&mut out, start, end);
            i = end + close.len();
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\'', '\u{..}'); otherwise a lifetime or label.
            let end = if c.get(i + 1) == Some(&'\\') {
                (i + 3..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    wipe(&mut out, i + 1, e);
                    i = e + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// An arm's pattern without its guard, and whether it had one.
fn unguarded(arm: &str) -> (&str, bool) {
    let b = arm.as_bytes();
    let guard = (0..b.len()).find(|&i| {
        arm[i..].starts_with("if")
            && (i == 0 || !is_ident(char::from(b[i - 1])))
            && b.get(i + 2).is_none_or(|&x| !is_ident(char::from(x)))
    });
    match guard {
        Some(i) => (&arm[..i], true),
        None => (arm, false),
    }
}

/// Whether a pattern names one of the enums that must be matched exhaustively (a guard that
/// merely compares with one does not count).
fn names_exhaustive_enum(arm: &str) -> bool {
    let p: Vec<char> = unguarded(arm).0.chars().collect();
    EXHAUSTIVE.iter().any(|name| {
        let n: Vec<char> = format!("{name}::").chars().collect();
        (0..p.len()).any(|i| p[i..].starts_with(&n) && (i == 0 || !is_ident(p[i - 1])))
    })
}

/// Whether an arm without a guard matches anything: `_`, alone or as an alternative.
fn is_wildcard(arm: &str) -> bool {
    let (pattern, guarded) = unguarded(arm);
    !guarded && pattern.split('|').any(|alt| alt.trim() == "_")
}

/// The arms of the match whose body opens at `open` (the `{`): each pattern with the index of
/// its first character. Only arms at the body's own depth are returned.
fn arms(c: &[char], open: usize) -> Vec<(usize, String)> {
    let mut arms = Vec::new();
    let (mut depth, mut in_body) = (0usize, false);
    let (mut pattern, mut start) = (String::new(), open);
    let mut j = open + 1;
    while j < c.len() {
        let ch = c[j];
        match ch {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth == 0 => break,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
        if depth == 0 && !in_body && ch == '=' && c.get(j + 1) == Some(&'>') {
            arms.push((start, std::mem::take(&mut pattern)));
            in_body = true;
            j += 2;
            continue;
        }
        if depth == 0 && in_body && ch == ',' {
            in_body = false;
        } else if depth == 0 && in_body && ch == '}' {
            // A block-like arm body (`{ .. }`, `if .. else { .. }`, `match .. { .. }`) may end
            // here without a comma; it goes on only with `else`, a method call or an operator.
            let k = (j + 1..c.len())
                .find(|&k| !c[k].is_whitespace())
                .unwrap_or(c.len());
            let word: String = c[k..].iter().take_while(|&&x| is_ident(x)).collect();
            let next = c.get(k).copied().unwrap_or('}');
            let goes_on = word == "else"
                || word == "as"
                || ".?+*/%^<>=!".contains(next)
                || (next == '|' && c.get(k + 1) == Some(&'|'))
                || (next == '&' && c.get(k + 1) == Some(&'&'));
            if !goes_on {
                in_body = false;
                if next == ',' {
                    j = k;
                }
            }
        } else if !in_body {
            if pattern.trim().is_empty() && !ch.is_whitespace() {
                start = j;
            }
            pattern.push(ch);
        }
        j += 1;
    }
    arms
}

/// 1-based lines of the `_ =>` arms of matches over instructions, opcodes or task kinds.
fn wildcard_arms(src: &str) -> Vec<usize> {
    let c = blank(src);
    let line = |i: usize| 1 + c[..i].iter().filter(|&&x| x == '\n').count();
    let mut found = Vec::new();
    for i in 0..c.len() {
        let keyword = c[i..].starts_with(&['m', 'a', 't', 'c', 'h'])
            && (i == 0 || !is_ident(c[i - 1]))
            && c.get(i + 5).is_some_and(|x| x.is_whitespace());
        if !keyword {
            continue;
        }
        // The body opens at the first `{` outside the scrutinee's brackets.
        let mut depth = 0usize;
        let mut open = None;
        for (j, &ch) in c.iter().enumerate().skip(i + 5) {
            match ch {
                '(' | '[' => depth += 1,
                ')' | ']' if depth == 0 => break,
                ')' | ']' => depth -= 1,
                '{' if depth == 0 => {
                    open = Some(j);
                    break;
                }
                ';' if depth == 0 => break,
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let arms = arms(&c, open);
        if arms.iter().any(|(_, p)| names_exhaustive_enum(p)) {
            found.extend(
                arms.iter()
                    .filter(|(_, p)| is_wildcard(p))
                    .map(|(at, _)| line(*at)),
            );
        }
    }
    found
}

fn visit(dir: &Path, f: &mut dyn FnMut(&Path, &str)) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            visit(&p, f);
        } else if p.extension().is_some_and(|x| x == "rs") {
            f(&p, &std::fs::read_to_string(&p).unwrap());
        }
    }
}

#[test]
fn no_wildcard_arm_over_instructions_opcodes_or_task_kinds() {
    let root = workspace_root();
    let mut violations = Vec::new();
    let mut files = 0;
    for krate in CRATES {
        visit(&root.join(krate).join("src"), &mut |path, text| {
            files += 1;
            for l in wildcard_arms(text) {
                let rel = path.strip_prefix(&root).unwrap_or(path);
                violations.push(format!(
                    "{}:{l}: `_ =>` in a match over instructions, opcodes or task kinds; list the variants",
                    rel.display()
                ));
            }
        });
    }
    assert!(files > 50, "only {files} source files found under {root:?}");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_scanner_finds_a_wildcard_arm_and_only_where_it_counts() {
    let src = r#"
fn f(i: &Instruction, n: u32, t: &OmTask) -> u32 {
    // match i { Instruction::Nop(_) => 0, _ => 1 }
    let s = "match i { Instruction::Nop(_) => 0, _ => 1 }";
    let c = '{';
    let a = match i {
        Instruction::Add(f) => {
            match n {
                0 => 1,
                _ => 2,
            }
        }
        Instruction::Sub(_) if n > 0 => if n > 1 { 3 } else { 4 }
        _ => 0,
    };
    let b = match n {
        1 => 1,
        _ => 0,
    };
    match t {
        OmTask::StreamActive { stream: Some(st) } if *st > 0 => {}
        OmTask::Memcpy { .. } => {}
        _ => {}
    }
    match i {
        I::Add(_) | I::Sub(_) => 1,
        I::Nop(_) | _ => 0,
    }
    match i {
        Instruction::Add(_) => 1,
        Instruction::Sub(_) => match n {
            _ => 3,
        },
        _ if n == 4 => 4,
        Instruction::Nop(_) => 0,
    }
    match Some(t) {
        Some(t) if *t == OmTask::EndGraph => 1,
        _ => 0,
    }
}
"#;
    assert_eq!(wildcard_arms(src), vec![14, 23, 27]);
}

/// Whole-word occurrences of `word` in blanked source (comments and literals removed), as
/// 1-based line numbers; a word is delimited by characters that cannot continue a token.
fn word_lines(src: &str, word: &str) -> Vec<usize> {
    let c = blank(src);
    let w: Vec<char> = word.chars().collect();
    let cont = |ch: Option<&char>| ch.is_some_and(|&x| is_ident(x) || x == '.');
    let mut lines = Vec::new();
    let mut line = 1;
    for i in 0..c.len() {
        if c[i] == '\n' {
            line += 1;
        }
        let starts_word = word.starts_with('.') || i == 0 || !cont(c.get(i - 1));
        if starts_word
            && c[i..].starts_with(&w)
            && (word.ends_with('(') || !cont(c.get(i + w.len())))
        {
            lines.push(line);
        }
    }
    lines
}

/// `(file, line, word)` for every occurrence of `words` in the scanned crates outside `isa`,
/// skipping the files in `allowed` (paths relative to the workspace root).
fn occurrences(words: &[&str], allowed: &[&str]) -> Vec<String> {
    let root = workspace_root();
    let mut found = Vec::new();
    for krate in CRATES.iter().filter(|k| **k != "isa") {
        visit(&root.join(krate).join("src"), &mut |path, text| {
            let rel = path.strip_prefix(&root).unwrap_or(path);
            let rel = rel.display().to_string().replace('\\', "/");
            if allowed.contains(&rel.as_str()) {
                return;
            }
            for w in words {
                for l in word_lines(text, w) {
                    found.push(format!("{rel}:{l}: `{w}`"));
                }
            }
        });
    }
    found
}

/// Programs are built with `isa`'s typed builders; assembly text is read only by the `kernel`
/// command (hand-written kernels) and written only by the disassembler.
#[test]
fn no_assembly_text_built_or_parsed_outside_isa() {
    let found = occurrences(
        &[
            "assemble(",
            "parse_instruction(",
            "parse_instruction_with_label(",
            ".ins(",
        ],
        &["host/src/cli/kernel.rs"],
    );
    assert!(
        found.is_empty(),
        "assembly text outside isa (build the program with ProgramBuilder):\n{}",
        found.join("\n")
    );
}

/// The ISA table's field limits (burst count 4095, burst length and gap 0xffff) come from
/// `isa::units`, which derives them from the declared field widths.
#[test]
fn no_isa_limit_restated_as_a_literal() {
    let found = occurrences(&["4095", "0xfff", "0xffff", "65535", "0x0fff"], &[]);
    assert!(
        found.is_empty(),
        "ISA limits restated outside isa (use gearsim_isa::units):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_word_scanner_skips_comments_literals_and_longer_tokens() {
    let src =
        "let a = 4095; // 4095\nlet s = \"4095\";\nlet b = 40950 + 1.4095;\nk.ins(x); y.ins (z);\n";
    assert_eq!(word_lines(src, "4095"), vec![1]);
    assert_eq!(word_lines(src, ".ins("), vec![4]);
}
