//! `gearsim study advise`: the optimiser finds the true optimum (checked against brute force
//! over every subset, with and without padding and memory budgets); the shapes file's errors
//! name file and line; on the CNN the proposal is the curve's best point, its prediction holds
//! when the set is compiled and run, and the output is deterministic; a model that mixes the
//! rows of its batch is never padded.

use gearsim_compiler::onnx::proto::{AttributeProto, AttributeType};
use gearsim_compiler::options::{DynamicMode, parse_input_shape};
use gearsim_host::study::advise::{
    self, AdviseOptions, Observed, PadPolicy, Problem, Serve, parse_shapes,
};
use gearsim_sim::ChipConfig;
use proptest::prelude::*;
use prost::Message as _;

use crate::onnx_build::{model, node};

// ---- the optimiser ------------------------------------------------------------------------

/// The best cost over every subset of exactly `k` candidates that fits the budget.
fn brute_force(p: &Problem, k: usize) -> Option<f64> {
    let n = p.len();
    (0u32..1 << n)
        .filter(|m| m.count_ones() as usize == k)
        .map(|m| (0..n).filter(|i| m >> i & 1 == 1).collect::<Vec<usize>>())
        .filter(|set| p.budget.is_none_or(|b| p.bytes(set) <= b))
        .map(|set| p.cost(&set))
        .min_by(f64::total_cmp)
}

fn problem() -> impl Strategy<Value = Problem> {
    (2usize..=7).prop_flat_map(|n| {
        (
            prop::collection::vec(1u32..100, n),
            prop::collection::vec(10u32..1000, n),
            prop::collection::vec(10u32..1500, n),
            prop::collection::vec(1u64..50, n),
            prop::collection::vec(1u64..50, n),
            any::<bool>(),
            prop::option::of(20u64..140),
        )
            .prop_map(|(count, gear, hybrid, fm, io, pad, budget)| {
                let total: u32 = count.iter().sum();
                let n = count.len();
                Problem {
                    share: count
                        .iter()
                        .map(|c| f64::from(*c) / f64::from(total))
                        .collect(),
                    gear: gear.into_iter().map(f64::from).collect(),
                    hybrid: hybrid.into_iter().map(f64::from).collect(),
                    feature_map: fm,
                    io,
                    pad,
                    base_bytes: 10,
                    table_bytes: (0..=n as u64).map(|k| 2 * k).collect(),
                    budget,
                }
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_optimiser_finds_the_brute_force_optimum(p in problem()) {
        let best = p.optimise(p.len());
        for (k, found) in best.iter().enumerate().skip(2) {
            let want = brute_force(&p, k);
            match (found, want) {
                (None, None) => {}
                (Some(s), Some(w)) => {
                    prop_assert!((s.cost - w).abs() <= 1e-9 * w.abs().max(1.0),
                        "k {}: optimiser {} (set {:?}), brute force {}", k, s.cost, s.chosen, w);
                    prop_assert_eq!(s.chosen.len(), k);
                    prop_assert!(p.budget.is_none_or(|b| s.bytes <= b));
                    prop_assert_eq!(s.bytes, p.bytes(&s.chosen));
                    prop_assert!((s.cost - p.cost(&s.chosen)).abs() < 1e-9);
                }
                (got, want) => prop_assert!(false, "k {}: optimiser {:?}, brute force {:?}", k, got, want),
            }
        }
    }
}

#[test]
fn padding_serves_a_shape_on_the_next_gear_only_when_that_is_faster() {
    let p = Problem {
        share: vec![0.25; 4],
        gear: vec![100.0, 200.0, 300.0, 400.0],
        hybrid: vec![150.0, 350.0, 250.0, 500.0],
        feature_map: vec![1; 4],
        io: vec![1; 4],
        pad: true,
        base_bytes: 0,
        table_bytes: vec![0; 5],
        budget: None,
    };
    // Under {0, 3}: 1 pads to 3? 400 > 350, no; 2 pads to 3? 400 > 250, no.
    assert_eq!(
        p.serving(&[0, 3]),
        vec![Serve::Exact, Serve::Hybrid, Serve::Hybrid, Serve::Exact]
    );
    // Under {2, 3}: 0 pads to 2 (300 > 150: no); 1 pads to 2 (300 < 350: yes).
    assert_eq!(
        p.serving(&[2, 3]),
        vec![Serve::Hybrid, Serve::Padded(2), Serve::Exact, Serve::Exact]
    );
    let no_pad = Problem { pad: false, ..p };
    assert_eq!(
        no_pad.serving(&[2, 3]),
        vec![Serve::Hybrid, Serve::Hybrid, Serve::Exact, Serve::Exact]
    );
}

// ---- the shapes file -----------------------------------------------------------------------

fn parse(text: &str, shape: &str) -> Result<Observed, String> {
    let inputs = parse_input_shape(shape, true).unwrap();
    let mode = advise::default_mode(&inputs);
    parse_shapes(text, "obs.txt", &inputs, mode).map_err(|e| e.to_string())
}

#[test]
fn shapes_files_add_up_counts_per_gear_vector() {
    let o = parse(
        "# batch sizes\ninput:4,3,8,8 10\n\ninput:1,3,8,8\ninput:4,3,8,8\t5  # again\n",
        "input:-1,3,8,8",
    )
    .unwrap();
    assert_eq!(o.vectors, vec![(vec![1], 1), (vec![4], 15)]);
    assert_eq!(o.total(), 16);
    // Dims mode: the -1 values in --input_shape order, whatever the line's order.
    let o = parse("b:1,7;a:2,1,3 2\na:2,1,3;b:1,7\n", "a:-1,1,-1;b:1,-1").unwrap();
    assert_eq!(o.vectors, vec![(vec![2, 3, 7], 3)]);
}

#[test]
fn bad_shapes_lines_are_errors_naming_file_and_line() {
    let shape = "x:-1,4;y:-1,2";
    let cases = [
        (
            "x:1,4;y:1,2\nx:1,5;y:1,2\n",
            "obs.txt:2: input `x` axis 1 is 5, --input_shape fixes it at 4",
        ),
        (
            "x:1,4;y:1,2 0\n",
            "obs.txt:1: count 0: expected a positive count",
        ),
        ("x:1,4\n", "obs.txt:1: input `y` appears 0 times"),
        (
            "x:1,4;y:1,2;z:3\n",
            "obs.txt:1: input `z` is not in --input_shape (expected x, y)",
        ),
        (
            "x:1,4,1;y:1,2\n",
            "obs.txt:1: input `x` has 3 dims, --input_shape gives it 2",
        ),
        (
            "x:2,4;y:3,2\n",
            "obs.txt:1: dynamic batch: every input's batch must be the same, got 2 and 3",
        ),
        (
            "\n# nothing\n",
            "obs.txt: no shapes (expected lines like `x:1,4;y:1,2 10`",
        ),
        (
            "x:1,4;y:1,2 99999999999999999999\n",
            "obs.txt:1: count `99999999999999999999`",
        ),
        (
            "x:1,4;y:1,2 18446744073709551615\nx:1,4;y:1,2 1\n",
            "obs.txt:2: the counts add up past 2^64",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text, shape).unwrap_err();
        assert!(e.starts_with(want), "{text:?}: {e}");
    }
    // A value <= 0 is GE's E10011 through the --input_shape parser.
    let e = parse("x:0,4;y:0,2\n", shape).unwrap_err();
    assert!(e.starts_with("obs.txt:1: E10011"), "{e}");
}

// ---- end to end --------------------------------------------------------------------------

fn chip() -> ChipConfig {
    ChipConfig::preset("ascend910").unwrap()
}

fn options(onnx: Vec<u8>, file: &str, shape: &str, shapes: &str, budget: u32) -> AdviseOptions {
    let inputs = parse_input_shape(shape, true).unwrap();
    let mode = advise::default_mode(&inputs);
    AdviseOptions {
        onnx,
        file: file.into(),
        input_shape: shape.into(),
        input_format: None,
        mode: Some(mode),
        shapes: parse_shapes(shapes, "obs.txt", &inputs, mode).unwrap(),
        gear_budget: budget,
        memory_budget: None,
        pad: PadPolicy::Auto,
        host_us_per_op: 5.0,
        chip: chip(),
        threads: 2,
    }
}

const CNN_SHAPES: &str = "input:1,3,32,32 60\ninput:2,3,32,32 20\ninput:3,3,32,32 12\n\
                          input:5,3,32,32 8\n";

#[test]
fn the_cnn_proposal_is_the_best_measured_point_and_its_prediction_holds() {
    let onnx = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/models/cnn.onnx"
    ))
    .unwrap();
    let a = options(onnx, "cnn.onnx", "input:-1,3,32,32", CNN_SHAPES, 3);
    let adv = advise::advise(&a).unwrap();
    assert_eq!(adv.mode, DynamicMode::Batch);
    assert!(adv.pad.allowed, "{}", adv.pad.reason);
    assert_eq!(adv.candidates.len(), 4);
    assert_eq!(
        adv.curve.iter().map(|p| p.gears.len()).collect::<Vec<_>>(),
        vec![2, 3]
    );
    for p in &adv.curve {
        // The candidates were measured in a model with all four gears; the set's own model
        // scans a shorter table, so the measurement is close to, not equal to, the prediction.
        let rel = (p.measured_ps - p.predicted_ps).abs() / p.predicted_ps;
        assert!(
            rel < 0.01,
            "{:?}: predicted {} measured {}",
            p.gears,
            p.predicted_ps,
            p.measured_ps
        );
        assert_eq!(p.measured_bytes, p.predicted_bytes, "{:?}", p.gears);
        assert!((p.exact + p.padded + p.hybrid - 1.0).abs() < 1e-9);
        // Batch 5 has no larger gear to pad to: every set has it.
        assert_eq!(p.gears.last(), Some(&vec![5]), "{:?}", p.gears);
        assert!(p.measured_ps < adv.all_hybrid_ps);
    }
    let best = adv.proposal();
    assert!(adv.curve.iter().all(|p| best.measured_ps <= p.measured_ps));
    // Some shape runs padded on the 2-gear set (2 up to 3 or 5): the check allowed it.
    assert!(adv.curve[0].padded > 0.0);
    let text = advise::summary(&adv);
    assert!(text.contains("--dynamic_batch_size \""), "{text}");
    // Deterministic: the same question gives the same files.
    let dir = std::env::temp_dir().join(format!("gearsim-advise-{}", std::process::id()));
    let files = advise::write_outputs(&dir, &adv).unwrap();
    let again = advise::advise(&a).unwrap();
    assert_eq!(advise::curve_csv(&again), advise::curve_csv(&adv));
    assert_eq!(advise::candidates_csv(&again), advise::candidates_csv(&adv));
    let csv = std::fs::read_to_string(&files[0]).unwrap();
    assert!(csv.starts_with("gears,gear_list,predicted_us,measured_us,"));
    assert_eq!(csv.lines().count(), 3);
    assert!(
        std::fs::read_to_string(&files[2])
            .unwrap()
            .starts_with("<svg")
    );
    std::fs::remove_dir_all(dir).unwrap();
    // A memory budget below every set is an error naming the smallest set's bytes.
    let mut tight = a.clone();
    tight.memory_budget = Some(1000);
    let e = advise::advise(&tight).unwrap_err().to_string();
    assert!(
        e.starts_with("no set of 2 to 3 gears fits --memory_budget 1000 bytes"),
        "{e}"
    );
}

#[test]
fn shards_measure_the_whole_runs_candidates_and_their_files_merge_into_its_advice() {
    use gearsim_host::study::Shard;
    let onnx = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/models/cnn.onnx"
    ))
    .unwrap();
    let a = options(onnx, "cnn.onnx", "input:-1,3,32,32", CNN_SHAPES, 3);
    let whole = advise::advise(&a).unwrap();
    let total = a.shapes.total();
    let files: Vec<String> = (0..3)
        .map(|i| {
            let shard = Shard { index: i, count: 3 };
            let measured = advise::measure_shard(&a, shard).unwrap();
            advise::candidates_csv_of(whole.mode, &measured, total, whole.host_ps_per_op)
        })
        .collect();
    // Shard 0 has candidates 0 and 3, shard 1 candidate 1, shard 2 candidate 2.
    assert_eq!(files[0].lines().count(), 3);
    let read = |which: &[usize]| {
        let mut all = Vec::new();
        for &i in which {
            all.extend(advise::parse_candidates(&files[i], &format!("s{i}.csv")).unwrap());
        }
        all
    };
    let merged = advise::advise_measured(&a, read(&[2, 0, 1])).unwrap();
    assert_eq!(
        advise::candidates_csv(&merged),
        advise::candidates_csv(&whole)
    );
    assert_eq!(advise::curve_csv(&merged), advise::curve_csv(&whole));
    assert_eq!(merged, whole);
    // A missing shard, a shard given twice, a damaged file: each named.
    let e = advise::advise_measured(&a, read(&[0, 1]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no measurement of gear [3] (is a shard's file missing?)"),
        "{e}"
    );
    let e = advise::advise_measured(&a, read(&[0, 1, 2, 1]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("gear [2] is measured twice"), "{e}");
    let damaged = files[1].replace(",20,", ",2x,");
    let e = advise::parse_candidates(&damaged, "s1.csv")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("s1.csv:2: count: expected a whole number, got `2x`"),
        "{e}"
    );
    let e = advise::parse_candidates("gear,count\n", "old.csv")
        .unwrap_err()
        .to_string();
    assert!(e.contains("old.csv:1: no `gear_ps` column"), "{e}");
}

/// `y = x - mean(x over the batch)`: every row depends on every other.
pub(crate) fn batch_mixing_model() -> Vec<u8> {
    let mut mean = node("ReduceMean", "mean", &["x"], &["m"]);
    mean.attribute.push(AttributeProto {
        name: "axes".into(),
        ints: vec![0],
        r#type: AttributeType::Ints as i32,
        ..Default::default()
    });
    let sub = node("Sub", "sub", &["x", "m"], &["y"]);
    model(
        17,
        vec![mean, sub],
        &[("x", &[None, Some(16)])],
        &[("y", &[None, Some(16)])],
        vec![],
    )
    .encode_to_vec()
}

#[test]
fn a_model_that_mixes_its_batch_is_never_padded() {
    let shapes = "x:1,16 50\nx:2,16 30\nx:3,16 20\n";
    let a = options(batch_mixing_model(), "mix.onnx", "x:-1,16", shapes, 2);
    let adv = advise::advise(&a).unwrap();
    assert!(!adv.pad.allowed);
    assert!(
        adv.pad.reason.contains("mixes rows of the batch"),
        "{}",
        adv.pad.reason
    );
    let p = adv.proposal();
    assert_eq!(p.padded, 0.0);
    // Two gears, three shapes: the shape that is no gear takes the dynamic path (which one
    // depends on what each path costs), none is padded.
    assert_eq!(p.gears.len(), 2);
    let share = [(1, 0.5), (2, 0.3), (3, 0.2)]
        .iter()
        .find(|(b, _)| !p.gears.contains(&vec![*b]))
        .map(|(_, s)| *s)
        .unwrap();
    assert!((p.hybrid - share).abs() < 1e-9, "{} vs {share}", p.hybrid);
    // The same model with padding off says why.
    let mut never = a.clone();
    never.pad = PadPolicy::Never;
    assert_eq!(advise::advise(&never).unwrap().pad.reason, "--pad never");
}
