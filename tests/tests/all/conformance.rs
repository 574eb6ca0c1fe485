//! The ONNX backend node-test conformance suite (`gearsim_host::conformance`): provisions the
//! onnx wheel's node tests under `target/`, compiles and runs every test whose operators the
//! compiler knows, prints the scoreboard's summary, and fails when the committed
//! `tests/conformance/SCOREBOARD.md` differs from this run's (`GEARSIM_BLESS=1` rewrites it) or
//! when fewer than 95% of the supported tests of the compiler's operators pass; and checks on a
//! doctored copy of three tests that a wrong output fails and an unknown operator is unsupported.

use std::time::Instant;

use gearsim_host::conformance::{self, Outcome, REQUIRED_PASS_RATE, SCOREBOARD_PATH, run_suite};
use gearsim_tests::onnx_node_tests::{self, ensure_node_tests};
use gearsim_tests::workspace_root;

/// Where the committed scoreboard and this run's first differ: line number, old and new line.
fn first_difference(old: &str, new: &str) -> (usize, String, String) {
    let mut old_lines = old.lines();
    let mut new_lines = new.lines();
    let mut n = 1;
    loop {
        match (old_lines.next(), new_lines.next()) {
            (Some(a), Some(b)) if a == b => n += 1,
            (a, b) => {
                return (
                    n,
                    a.unwrap_or("<end>").to_string(),
                    b.unwrap_or("<end>").to_string(),
                );
            }
        }
    }
}

#[test]
fn onnx_node_tests_match_the_committed_scoreboard() {
    assert_eq!(
        onnx_node_tests::ONNX_VERSION,
        conformance::ONNX_VERSION,
        "the provisioned wheel and the scoreboard must name the same onnx release"
    );
    assert_eq!(
        onnx_node_tests::default_node_dir(),
        workspace_root().join(conformance::DEFAULT_NODE_DIR),
        "`gearsim conformance` must find the directory the test provisions"
    );
    assert_eq!(onnx_node_tests::NODE_TESTS_ENV, conformance::NODE_TESTS_ENV);
    let dir = ensure_node_tests();
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    let start = Instant::now();
    let board = run_suite(&dir, jobs).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "{}({} tests from {} on {jobs} thread(s) in {:.1} s)",
        board.summary(),
        board.cases.len(),
        dir.display(),
        start.elapsed().as_secs_f64()
    );
    let text = board.markdown();
    let path = workspace_root().join(SCOREBOARD_PATH);
    if std::env::var_os("GEARSIM_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &text).unwrap();
    } else {
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run `GEARSIM_BLESS=1 cargo test --release -p gearsim-tests --test all \
                 -- conformance` to write it",
                path.display()
            )
        });
        if committed != text {
            let (line, old, new) = first_difference(&committed, &text);
            panic!(
                "{} is stale: it differs from this run at line {line}:\n  committed: {old}\n  \
                 now:       {new}\nIf the change is intended, run `GEARSIM_BLESS=1 cargo test \
                 --release -p gearsim-tests --test all -- conformance` and review the diff.",
                path.display()
            );
        }
    }
    let t = board.op_list_totals();
    assert!(
        board.meets_target(),
        "only {} of {} supported node tests of the compiler's operators pass ({:.1}%, need \
         {:.0}%); see {}",
        t.passed,
        t.supported(),
        100.0 * t.pass_rate(),
        100.0 * REQUIRED_PASS_RATE,
        path.display()
    );
}

#[test]
fn a_wrong_expected_output_fails_and_an_unknown_operator_is_unsupported() {
    let node = ensure_node_tests();
    let dir = std::env::temp_dir().join(format!("gearsim-conformance-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for test in ["test_acos", "test_add", "test_relu"] {
        let set = dir.join(test).join("test_data_set_0");
        std::fs::create_dir_all(&set).unwrap();
        std::fs::copy(
            node.join(test).join("model.onnx"),
            dir.join(test).join("model.onnx"),
        )
        .unwrap();
        for entry in std::fs::read_dir(node.join(test).join("test_data_set_0")).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), set.join(entry.file_name())).unwrap();
        }
    }
    // x + y is expected to be x: same type and dims, other values.
    let add = dir.join("test_add").join("test_data_set_0");
    std::fs::copy(add.join("input_0.pb"), add.join("output_0.pb")).unwrap();
    let board = run_suite(&dir, 2).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let outcome = |name: &str| &board.cases.iter().find(|c| c.name == name).unwrap().outcome;
    assert_eq!(
        outcome("test_acos"),
        &Outcome::Unsupported("operator Acos not supported".to_string())
    );
    assert!(
        matches!(outcome("test_add"), Outcome::Fail(why) if why.contains("output 0 `sum`") && why.contains("worst at")),
        "{:?}",
        outcome("test_add")
    );
    assert_eq!(outcome("test_relu"), &Outcome::Pass);
}

/// On a separated chip (ascend910b2: cube kernels become MIX kernels, vector kernels run on the
/// vector cores) every node test has the outcome it has on the coupled default chip.
#[test]
fn node_tests_have_the_same_outcomes_on_a_separated_chip() {
    let dir = ensure_node_tests();
    let jobs = std::thread::available_parallelism().map_or(2, usize::from);
    let coupled = run_suite(&dir, jobs).unwrap_or_else(|e| panic!("{e}"));
    let chip = gearsim_sim::ChipConfig::preset("ascend910b2").unwrap();
    let separated = conformance::run_suite_on(&dir, jobs, &chip).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(coupled.cases.len(), separated.cases.len());
    let differ: Vec<String> = coupled
        .cases
        .iter()
        .zip(&separated.cases)
        .filter(|(a, b)| a.outcome != b.outcome)
        .map(|(a, b)| format!("{}: {:?} vs {:?}", a.name, a.outcome, b.outcome))
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n"));
    assert_eq!(coupled.op_list_totals(), separated.op_list_totals());
}
