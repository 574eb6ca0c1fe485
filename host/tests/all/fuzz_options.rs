//! Fuzz targets of the atc option parser (`compiler::options`): `--input_shape`,
//! `--dynamic_batch_size`, `--dynamic_image_size`, `--dynamic_dims` and `--input_format` as
//! random strings and as near-valid strings assembled from names, dims, gear values and
//! separators (boundary and overflowing numbers, `~`, floats, signs, stray spaces), run through
//! the checks in the compiler's order and bound to a graph's inputs, and a few of them through
//! the whole compile of a gear model.
//!
//! Each case must be an option error with GE's code and a message, or a result consistent with
//! the strings (the parsed inputs are what `parse_input_shape` gives, every bound input has
//! non-negative dims under every gear); never a panic. `PROPTEST_CASES=20000 cargo test -p
//! gearsim-host fuzz_options` runs them longer.

use gearsim_compiler::ir::Format;
use gearsim_compiler::options::{
    GearOptions, GraphInput, OptionError, bind_inputs, check_gears, check_map_index_limit,
    check_options, parse_input_shape,
};
use gearsim_compiler::pipeline::compile;
use proptest::prelude::*;

use crate::fuzz_onnx::SEEDS;
use crate::mutate::{boundary_value, fuzz_config, timed};

fn assert_well_formed(e: &OptionError) {
    assert!(!e.code.is_empty() && !e.message.is_empty(), "{e:?}");
}

/// The graph inputs the options are bound to: gear_dims' three inputs.
fn graph_inputs() -> Vec<GraphInput> {
    let input = |name: &str, dims: &[i64], format| GraphInput {
        name: name.into(),
        dims: dims.to_vec(),
        format,
    };
    vec![
        input("data", &[1, 1, 40, -1], Format::Nchw),
        input("label", &[1, -1], Format::Nd),
        input("mask", &[-1, -1], Format::Nd),
    ]
}

/// Every check the compiler runs on the options before and after reading the model.
fn check(o: &GearOptions) {
    let parsed = match check_options(o) {
        Ok(Some(p)) => p,
        Ok(None) => return,
        Err(e) => return assert_well_formed(&e),
    };
    let shape = o.input_shape.as_deref().unwrap_or("");
    assert_eq!(parse_input_shape(shape, true).unwrap(), parsed.inputs);
    if let Err(e) = check_gears(&parsed) {
        return assert_well_formed(&e);
    }
    let gear_len = parsed.gears.first().map_or(0, Vec::len);
    if let Err(e) = check_map_index_limit(parsed.gears.len(), gear_len, 100, 64) {
        return assert_well_formed(&e);
    }
    match bind_inputs(&parsed, &graph_inputs()) {
        Ok(b) => {
            assert_eq!(b.gears, parsed.gears);
            for input in &b.inputs {
                assert!(input.max_gear < parsed.gears.len().max(1));
                for dims in &input.per_gear_dims {
                    assert!(dims.iter().all(|d| *d >= 0), "{input:?}");
                }
            }
        }
        Err(e) => assert_well_formed(&e),
    }
}

/// A number as a user might mistype it.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => (0i64..300).prop_map(|v| v.to_string()),
        1 => Just("-1".to_string()),
        1 => boundary_value().prop_map(|v| v.to_string()),
        1 => boundary_value().prop_map(|v| format!("-{v}")),
        1 => Just("99999999999999999999999".to_string()),
        1 => Just("~".to_string()),
        1 => Just("3.5".to_string()),
        1 => Just("+3".to_string()),
        1 => Just(" 4 ".to_string()),
        1 => Just("".to_string()),
        1 => Just("1e3".to_string()),
        1 => Just("0x10".to_string()),
    ]
}

fn joined(
    items: impl Strategy<Value = String>,
    seps: &'static [&'static str],
    max: usize,
) -> impl Strategy<Value = String> {
    proptest::collection::vec((items, proptest::sample::select(seps)), 0..max).prop_map(|v| {
        let mut s = String::new();
        for (i, (item, sep)) in v.iter().enumerate() {
            if i > 0 {
                s.push_str(sep);
            }
            s.push_str(item);
        }
        s
    })
}

/// `--input_shape` from real and unknown names, dims and separators.
fn input_shape() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("data"),
        Just("label"),
        Just("mask"),
        Just("x"),
        Just(" data "),
        Just("a:b"),
        Just(""),
    ];
    let entry =
        (name, joined(number(), &[",", ", ", ",,"], 6)).prop_map(|(n, dims)| format!("{n}:{dims}"));
    joined(entry, &[";", ";;", "; "], 5)
}

/// A gear option's value: groups of numbers.
fn gear_value() -> impl Strategy<Value = String> {
    let group = joined(number(), &[",", ", ", " "], 5);
    joined(group, &[";", ";;", ","], 6)
}

fn format() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        Just("NCHW".to_string()),
        Just("NHWC".to_string()),
        Just("ND".to_string()),
        Just("NC1HWC0".to_string()),
        Just("nchw".to_string()),
        "\\PC{0,6}",
    ])
}

/// Options assembled from near-valid pieces, one gear option (or, now and then, two).
fn near_valid() -> impl Strategy<Value = GearOptions> {
    (
        proptest::option::of(input_shape()),
        0usize..4,
        gear_value(),
        proptest::option::of(gear_value()),
        format(),
    )
        .prop_map(|(shape, mode, gears, second, format)| {
            let mut o = GearOptions {
                input_shape: shape,
                input_format: format,
                ..GearOptions::default()
            };
            match mode {
                0 => o.dynamic_batch_size = Some(gears),
                1 => o.dynamic_image_size = Some(gears),
                2 => o.dynamic_dims = Some(gears),
                _ => {}
            }
            if let Some(g) = second.filter(|_| mode == 3) {
                o.dynamic_dims = Some(g.clone());
                o.dynamic_batch_size = Some(g);
            }
            o
        })
}

/// Options of random strings.
fn random() -> impl Strategy<Value = GearOptions> {
    let s = || proptest::option::of("[-0-9a-z,;: ~.+]{0,24}");
    (s(), s(), s(), s(), s()).prop_map(|(shape, batch, image, dims, format)| GearOptions {
        input_shape: shape,
        dynamic_batch_size: batch,
        dynamic_image_size: image,
        dynamic_dims: dims,
        input_format: format,
        ..GearOptions::default()
    })
}

proptest! {
    #![proptest_config(fuzz_config(512))]

    #[test]
    fn random_options_are_rejected_or_parsed_consistently(o in random()) {
        timed("random options", || check(&o));
    }

    #[test]
    fn near_valid_options_are_rejected_or_parsed_consistently(o in near_valid()) {
        timed("near-valid options", || check(&o));
    }

    #[test]
    fn unicode_options_are_rejected_or_parsed_consistently(
        shape in "\\PC{0,16}",
        gears in "\\PC{0,16}",
        mode in 0usize..3,
    ) {
        let mut o = GearOptions { input_shape: Some(shape), ..GearOptions::default() };
        match mode {
            0 => o.dynamic_batch_size = Some(gears),
            1 => o.dynamic_image_size = Some(gears),
            _ => o.dynamic_dims = Some(gears),
        }
        timed("unicode options", || check(&o));
    }
}

/// The seed model's own `--input_shape` with extreme `--dynamic_dims` values: most pass the
/// option checks, so the compiler meets huge, zero and odd gear shapes.
fn extreme_dims() -> impl Strategy<Value = GearOptions> {
    let value = prop_oneof![
        3 => (1i64..100).prop_map(|v| v.to_string()),
        1 => Just("0".to_string()),
        1 => boundary_value().prop_map(|v| v.to_string()),
        1 => (1u32..40).prop_map(|b| (1u64 << b).to_string()),
    ];
    let gear = proptest::collection::vec(value, 4).prop_map(|v| v.join(","));
    proptest::collection::vec(gear, 2..4).prop_map(|g| GearOptions {
        input_shape: Some("data:1,1,40,-1;label:1,-1;mask:-1,-1".into()),
        dynamic_dims: Some(g.join(";")),
        ..GearOptions::default()
    })
}

proptest! {
    #![proptest_config(fuzz_config(64))]

    #[test]
    fn near_valid_options_compile_a_gear_model_or_are_rejected(
        o in prop_oneof![near_valid(), extreme_dims()],
    ) {
        let seed = SEEDS.iter().find(|s| s.name == "gear_dims.onnx").unwrap();
        let mut opts = seed.options();
        opts.gear = o;
        timed("compile with near-valid options", || {
            let _ = compile(seed.bytes(), seed.name, &opts);
        });
    }
}

/// Compiles the gear_dims seed with these `--dynamic_dims` and its own `--input_shape`.
fn compile_dims(dims: &str) -> Result<(), String> {
    let seed = SEEDS.iter().find(|s| s.name == "gear_dims.onnx").unwrap();
    let mut opts = seed.options();
    opts.gear.dynamic_dims = Some(dims.into());
    compile(seed.bytes(), seed.name, &opts)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Regression (fuzzing): a gear value of i64::MAX overflowed the product of an input's dims
/// in the gear pass (a panic); an input too large to plan under a gear is now an error naming
/// the model, the input and the gear.
#[test]
fn a_gear_too_large_for_any_tensor_is_an_error() {
    let e = compile_dims("1,1,1,9223372036854775807;1,1,2,1").unwrap_err();
    assert!(
        e.starts_with("gear_dims.onnx: input `mask`: under gear 0 (1,1,1,9223372036854775807)")
            && e.contains("larger than the 1099511627776 bytes (1 TiB)"),
        "{e}"
    );
    // A zero dim does not hide the others: [2^62, 0] is still too large.
    let e = compile_dims("1,1,4611686018427387904,0;1,1,2,1").unwrap_err();
    assert!(e.contains("input `mask`"), "{e}");
}

/// Regression (fuzzing): a reduction over a [2^38, 0] tensor unrolled into a kernel of
/// hundreds of millions of instructions and aborted on a 3 GiB allocation; a kernel is now
/// limited to `MAX_KERNEL_INSTRUCTIONS`.
#[test]
fn a_kernel_too_long_to_write_is_an_error() {
    let e = compile_dims("20,20,17179869184,0;40,40,2,2").unwrap_err();
    assert!(
        e.contains("ReduceSum") && e.contains("past the 1048576 a kernel may have"),
        "{e}"
    );
}

/// Regression: an `--input_shape` name the model lacks was reported without the model's name
/// (E10016 alone); binding errors now start with the file.
#[test]
fn binding_errors_name_the_model() {
    let seed = SEEDS.iter().find(|s| s.name == "tiny_add.onnx").unwrap();
    let mut opts = seed.options();
    opts.gear.input_shape = Some("nope:2,3".into());
    let e = compile(seed.bytes(), seed.name, &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("tiny_add.onnx: E10016: Opname nope"), "{e}");
    let e = compile_dims("1,1,1;2,2,2").unwrap_err();
    assert!(
        e.starts_with("E10003: ") && !e.contains("gear_dims.onnx"),
        "an option error before the model is read keeps GE's form: {e}"
    );
}
