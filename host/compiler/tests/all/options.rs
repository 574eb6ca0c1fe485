//! The atc gear options (gear spec §2–§3): a table of option strings with the outcome GE gives
//! for each (the gears, or the error code of the first failing check), then the binding of the
//! gears to a graph's inputs: names, ranks, appended inputs, the split of each gear among the
//! inputs, the max-gear choice, and the MapIndex limits.

use gearsim_compiler::ir::Format;
use gearsim_compiler::options::{
    Binding, DynamicMode, GEARSIM_CODE, GearOptions, GraphInput, InputShape, OptionError,
    ParsedOptions, bind_inputs, check_gears, check_map_index_limit, check_options, erase_end_comma,
    erase_end_semicolon, parse_input_shape, split,
};

/// Builds options from `(key, value)` pairs; keys are short names of the atc flags.
fn opts(pairs: &[(&str, &str)]) -> GearOptions {
    let mut o = GearOptions::default();
    for (k, v) in pairs {
        let v = Some((*v).to_string());
        match *k {
            "shape" => o.input_shape = v,
            "batch" => o.dynamic_batch_size = v,
            "image" => o.dynamic_image_size = v,
            "dims" => o.dynamic_dims = v,
            "format" => o.input_format = v,
            "range" => o.input_shape_range = v,
            "hint" => o.input_hint_shape = v,
            "aipp" => o.insert_op_conf = v,
            other => panic!("unknown option key {other}"),
        }
    }
    o
}

/// Options written `key=value | key=value` (the keys of [`opts`]); values keep their spaces.
fn opts_str(s: &str) -> GearOptions {
    let pairs: Vec<(&str, &str)> = s
        .split(" | ")
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').expect("key=value"))
        .collect();
    opts(&pairs)
}

/// Gears written as `--dynamic_dims` writes them: `1,2;3,4`.
fn gears_str(s: &str) -> Vec<Vec<i64>> {
    s.split(';')
        .map(|g| g.split(',').map(|v| v.parse().unwrap()).collect())
        .collect()
}

/// Runs `check_options` then `check_gears`, as the compiler does.
fn run(o: &GearOptions) -> Result<Option<ParsedOptions>, OptionError> {
    let parsed = check_options(o)?;
    if let Some(p) = &parsed {
        check_gears(p)?;
    }
    Ok(parsed)
}

/// Whether an outcome matches an expectation written `none` (no gear option), `gears 1;2`
/// (both checks pass with these gears), `E10003` (the first failing check has this code) or
/// `E10003 text` (and its message contains the text).
fn matches(expect: &str, got: &Result<Option<ParsedOptions>, OptionError>) -> bool {
    match (expect.split_once(' '), got) {
        (_, Ok(None)) => expect == "none",
        (Some(("gears", g)), Ok(Some(p))) => p.gears == gears_str(g),
        (_, Ok(Some(_))) => false,
        (_, Err(e)) => error_matches(expect, e),
    }
}

/// Whether an error matches an expectation written `E10003` or `E10003 text`.
fn error_matches(expect: &str, e: &OptionError) -> bool {
    match expect.split_once(' ') {
        None => e.code == expect,
        Some((code, text)) => e.code == code && e.message.contains(text),
    }
}

/// One row per rule of gear spec §2.2 and §2.3 (items 4–6), with accepted strings around each.
/// Kept one row per line (hence unformatted) so that it reads as a table.
#[rustfmt::skip]
const OPTION_ROWS: &[(&str, &str, &str)] = &[
    // Without a gear option there is nothing to do, but a static input_shape is still checked.
    ("no options", "", "none"),
    ("static shape only", "shape=x:1,3", "none"),
    ("empty strings are unset", "shape= | batch=", "none"),
    ("0 without a gear option", "shape=x:0,3", "E10011"),
    ("-1 without a gear option", "shape=x:-1,3", "E10011 The error value in the shape is -1."),
    ("range alone", "range=x:[1~4,3]", "none"),
    // Item 1 of §2.2 rejects '~' with a gear option; a set shape range wins and skips the check.
    ("tilde with batch", "shape=x:1~4,3 | batch=1,2", "E10040 must have -1 axes and cannot have '~'."),
    ("tilde with dims", "shape=x:1~4,-1 | dims=1;2", "E10040"),
    ("tilde but range set", "shape=x:1~4,3 | range=x:[1~4,3] | batch=1,2", "E10009"),
    // Item 2 rejects input_hint_shape with a gear option, before the mutual exclusion.
    ("hint with dims", "shape=x:-1 | hint=0:[4] | dims=1;2", "E10001 input_hint_shape cannot be used"),
    ("hint with two gear options", "hint=0:[4] | batch=1,2 | dims=1;2", "E10001"),
    ("hint without gear option", "shape=x:1 | hint=0:[4]", "none"),
    // Item 3 checks the mutual exclusion, then an empty input_shape.
    ("batch and dims", "shape=x:-1 | batch=1,2 | dims=1;2", "E10009"),
    ("batch and image", "shape=x:-1 | batch=1,2 | image=1,2;3,4", "E10009"),
    ("range and dims", "range=x:[1~4] | dims=1;2", "E10009"),
    ("batch without shape", "batch=1,2", "E10004 Value for --input_shape is empty."),
    ("dims with empty shape", "shape= | dims=1;2", "E10004"),
    // ParseInputShape runs with a gear option set, in GE's order of checks per value.
    ("float", "shape=x:1.5,-1 | dims=1;2", "E10002 The float number is unsupported"),
    ("not a digit", "shape=x:1a,-1 | dims=1;2", "E10002 It is not a digit"),
    ("plus sign", "shape=x:+1,-1 | dims=1;2", "E10002"),
    ("no colon", "shape=x1,-1 | dims=1;2", "E10002 two parts: name and value"),
    ("trailing ; in shape", "shape=x:-1; | dims=1;2", "E10002"),
    // The digit check comes before `stol` (issue 16: `data:-1,3,x,8` was E10014).
    ("letters are not digits", "shape=data:-1,3,x,8 | dims=1;2", "E10002 It is not a digit"),
    ("empty dim", "shape=x:1,,-1 | dims=1;2", "E10014"),
    ("lone minus", "shape=x:-,-1 | dims=1;2", "E10014"),
    ("out of range", "shape=x:99999999999999999999,-1 | dims=1;2", "E10013 Value 99999999999999999999 for --input_shape is out of range."),
    ("negative out of range", "shape=x:-99999999999999999999,-1 | dims=1;2", "E10013"),
    ("spaces around values", "batch=1,2 | shape= x : -1 , 3 ", "gears 1;2"),
    ("0 and -2 pass with a gear option", "shape=x:-1,0;y:-2 | batch=1,2", "gears 1;2"),
    ("name containing colons", "shape=a:b:-1,3 | batch=1,2", "gears 1;2"),
    // The rows below are batch mode.
    ("batch ok", "shape=x:-1,3,224,224 | batch=1,2,4", "gears 1;2;4"),
    ("batch empty value skipped", "shape=x:-1,3 | batch=1,,8", "gears 1;8"),
    ("batch trailing comma", "shape=x:-1,3 | batch=1,2,", "gears 1;2"),
    ("batch two trailing commas", "shape=x:-1,3 | batch=1,2,,", "gears 1;2"),
    ("batch only a comma", "shape=x:-1,3 | batch=,", "E10035 has 0 profiles"),
    ("batch scalar entry", "shape=x:-1,3;s: | batch=1,2", "E10012 the dimension count of the dynamic-shape input configured in --input_shape is less than 1."),
    // The batch checks walk the entries by name (GE's std::map), and the first entry of a name wins.
    ("batch entries by name: a's E10012 first", "shape=b:-1,-2;a: | batch=1,2", "E10012"),
    ("batch entries by name: a's E10018 first", "shape=b:;a:-1,-2 | batch=1,2", "E10018 Value -2 for shape 1 is invalid."),
    ("batch first entry of a name wins", "shape=x:-1,3;x:1,3 | batch=1,2", "gears 1;2"),
    ("batch first entry of a name wins, static", "shape=x:1,3;x:-1,3 | batch=1,2", "E10031"),
    ("batch other axis -1", "shape=x:-1,3,-1 | batch=1,2", "E10018 Value -1 for shape 2 is invalid."),
    ("batch other axis negative", "shape=x:-1,-2 | batch=1,2", "E10018"),
    ("batch no dim0 -1", "shape=x:1,-1 | batch=1,2", "E10031 none of the nodes specified in --input_shape has a batch size equaling -1."),
    ("batch no -1 at all", "shape=x:1,3 | batch=1,2", "E10031"),
    ("batch dim0 0", "shape=x:0,-1 | batch=1,2", "E10031"),
    ("batch -1 elsewhere tolerated", "shape=x:-1,3;y:1,-1 | batch=1,2", "gears 1;2"),
    ("batch letters", "shape=x:-1,3 | batch=1,a", "E10003 It can only contain digits and \",\"."),
    ("batch space", "shape=x:-1,3 | batch=1, 2", "E10003"),
    ("batch chars checked before the trailing comma goes", "shape=x:-1,3 | batch=1,a,", "E10003 Value 1,a, for parameter --dynamic_batch_size"),
    ("batch semicolon", "shape=x:-1,3 | batch=1;2", "E10003"),
    ("batch negative", "shape=x:-1,3 | batch=-1,2", "E10003"),
    ("batch one gear", "shape=x:-1,3 | batch=4", "E10035 has 1 profiles, which is less than the minimum 2."),
    ("batch duplicates", "shape=x:-1,3 | batch=1,2,1", "E10039 The --dynamic_batch_size, --dynamic_image_size, or --dynamic_dims argument have duplicate profiles."),
    ("batch 0 accepted", "shape=x:-1,3 | batch=0,1", "gears 0;1"),
    ("batch with aipp", "shape=x:-1,3 | batch=1,2 | aipp=aipp.cfg", "gears 1;2"),
    ("batch unknown format", "shape=x:-1,3 | batch=1,2 | format=NC1HWC0", "E10001 --input_format"),
    // The rows below are image size mode.
    ("image NCHW default", "shape=x:1,3,-1,-1 | image=224,224;448,448", "gears 224,224;448,448"),
    ("image NHWC", "shape=x:1,-1,-1,3 | image=224,224;448,448 | format=NHWC", "gears 224,224;448,448"),
    ("image trailing semicolon", "shape=x:1,3,-1,-1 | image=1,2;3,4;", "gears 1,2;3,4"),
    ("image static side input", "shape=x:1,3,-1,-1;y:1,5 | image=1,2;3,4", "gears 1,2;3,4"),
    ("image unknown format", "shape=x:1,3,-1,-1 | image=1,2;3,4 | format=FOO", "E10003 This format is not supported."),
    ("image ND format", "shape=x:1,3,-1,-1 | image=1,2;3,4 | format=ND", "E10003 only supports NCHW or NHWC"),
    ("image rank 3", "shape=x:3,-1,-1 | image=1,2;3,4", "E10019"),
    ("image three -1", "shape=x:-1,3,-1,-1 | image=1,2;3,4", "E10019 When --dynamic_image_size is included, only the height and width axes can be -1 in --input_shape."),
    ("image W not -1", "shape=x:1,3,-1,-2 | image=1,2;3,4", "E10019"),
    ("image wrong axes for NCHW", "shape=x:1,-1,-1,3 | image=1,2;3,4", "E10019"),
    ("image no dynamic entry", "shape=x:1,3,4,4 | image=1,2;3,4", "E10019"),
    ("image letters", "shape=x:1,3,-1,-1 | image=1,2;a,b", "E10003 It can only contain digits, \",\", \" \" and \";\"."),
    ("image chars checked after the trailing ; goes", "shape=x:1,3,-1,-1 | image=1,2;a,b;", "E10003 Value 1,2;a,b for parameter --dynamic_image_size"),
    ("image group of 1", "shape=x:1,3,-1,-1 | image=1,2;3", "E10020 Value 1,2;3 for parameter --dynamic_image_size is invalid."),
    ("image group of 3", "shape=x:1,3,-1,-1 | image=1,2,3;4,5,6", "E10020"),
    ("image empty group", "shape=x:1,3,-1,-1 | image=1,2;;3,4", "E10020"),
    ("image spaces pass the option check", "shape=x:1,3,-1,-1 | image=1, 2;3,4", "E19999 should not have non-digital character"),
    ("image short gear", "shape=x:1,3,-1,-1 | image=1,2;3,", "E10037 A profile has 2 dimensions while another has 1 dimensions."),
    ("image empty gear skipped", "shape=x:1,3,-1,-1 | image=,;3,4", "E10035"),
    ("image duplicates", "shape=x:1,3,-1,-1 | image=1,2;1,2", "E10039"),
    // The rows below are dims mode.
    ("dims ok", "shape=x:1,-1;y:-1 | dims=1,2;3,4", "gears 1,2;3,4"),
    ("dims no -1", "shape=x:1,2 | dims=1;2", "E10001 At least one dim should be -1 when dynamic_dims is set."),
    ("dims only a semicolon", "shape=x:-1 | dims=;", "E10058 Parameter --dynamic_dims is not configured or is empty."),
    ("dims count mismatch", "shape=x:-1,-1 | dims=1;2", "E10003 consistent with the number of -1"),
    ("dims count message shows the value without its trailing ;", "shape=x:-1,-1 | dims=1;2;", "E10003 Value 1;2 for parameter --dynamic_dims is invalid."),
    ("dims count before characters, group by group", "shape=x:-1 | dims=a;1,2", "E10001 Value a for parameter --dynamic_dims"),
    ("dims letter", "shape=x:-1,-1 | dims=1,a;2,3", "E10001 Dynamic dims must be a positive integer."),
    ("dims minus", "shape=x:-1 | dims=1;-2", "E10001 Value -2 for parameter --dynamic_dims"),
    ("dims space", "shape=x:-1,-1 | dims= 1,2;3,4", "E10001"),
    ("dims empty group skipped", "shape=x:-1 | dims=4;;8", "gears 4;8"),
    ("dims trailing semicolon", "shape=x:-1,-1 | dims=1,2;3,4;", "gears 1,2;3,4"),
    ("dims two trailing semicolons", "shape=x:-1,-1 | dims=1,2;3,4;;", "E10003"),
    ("dims scalar entry", "shape=s:;x:-1 | dims=1;2", "gears 1;2"),
    ("dims empty value", "shape=x:-1,-1 | dims=1,;3,4", "E10001 Value 1 for parameter dynamic_dims's per dims count is invalid. Reason: dynamic_dims's per dims count should be equal to input_shape's dim size."),
    // The option check counts -1s once per name (std::map), the gear check once per entry.
    ("dims name listed twice", "shape=x:-1;x:-1 | dims=1;2", "E10001 dynamic_dims's per dims count"),
    ("dims with aipp", "shape=x:-1 | dims=1;2 | aipp=aipp.cfg", "E10001 The dynamic dims function does not support AIPP."),
    ("dims one gear", "shape=x:-1,-1 | dims=1,2", "E10035"),
    ("dims trailing ; is not a gear", "shape=x:-1 | dims=4;", "E10035 has 1 profiles"),
    ("dims duplicates", "shape=x:-1,-1 | dims=1,2;1,2", "E10039"),
    ("dims 0 accepted", "shape=x:-1,-1 | dims=0,2;1,2", "gears 0,2;1,2"),
    ("dims ND format", "shape=x:-1 | dims=1;2 | format=ND", "gears 1;2"),
];

#[test]
fn option_rules_table() {
    // No maximum at option time: 150 gears pass GE's checks (the MapIndex limit comes later).
    let many: Vec<String> = (1..=150).map(|i| i.to_string()).collect();
    let many_opts = format!("shape=x:-1,3 | batch={}", many.join(","));
    let many_expect = format!("gears {}", many.join(";"));
    let mut rows: Vec<(&str, &str, &str)> = OPTION_ROWS.to_vec();
    rows.push(("batch no maximum", &many_opts, &many_expect));
    let failures: Vec<String> = rows
        .iter()
        .filter_map(|(label, o, expect)| {
            let got = run(&opts_str(o));
            (!matches(expect, &got)).then(|| format!("{label}: expected {expect}, got {got:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn error_display_is_code_then_message() {
    let e = check_options(&opts(&[("batch", "1,2")])).unwrap_err();
    assert_eq!(e.to_string(), "E10004: Value for --input_shape is empty.");
    let e = check_options(&opts(&[
        ("shape", "x:-1"),
        ("batch", "1,2"),
        ("dims", "1;2"),
    ]))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "E10009: --dynamic_batch_size, --dynamic_image_size, --input_shape_range, and \
         --dynamic_dims are mutually exclusive."
    );
    let e = check_options(&opts(&[("shape", "x:1.5,-1"), ("dims", "1;2")])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "E10002: Value x:1.5,-1 for parameter --input_shape is invalid. Reason: The float number \
         is unsupported. The value must be formatted as \"input_name1:1,3,224,224\"."
    );
}

#[test]
fn parsed_options_carry_mode_inputs_and_format() {
    let p = check_options(&opts(&[
        ("shape", "a:b:-1,3; s :;y:1,-1"),
        ("dims", "1,2;3,4"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(p.mode, DynamicMode::Dims);
    assert_eq!(p.mode.mbatch_dynamic_type(), 3);
    assert_eq!(p.format, Format::Nchw);
    assert_eq!(
        p.inputs,
        vec![
            InputShape {
                name: "a:b".into(),
                dims: vec![-1, 3]
            },
            InputShape {
                name: "s".into(),
                dims: vec![]
            },
            InputShape {
                name: "y".into(),
                dims: vec![1, -1]
            },
        ]
    );
    let p = check_options(&opts(&[
        ("shape", "x:-1"),
        ("batch", "1,2"),
        ("format", "NHWC"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!((p.mode, p.format), (DynamicMode::Batch, Format::Nhwc));
    assert_eq!(DynamicMode::Batch.mbatch_dynamic_type(), 1);
    assert_eq!(DynamicMode::ImageSize.mbatch_dynamic_type(), 2);
}

#[test]
fn split_has_metadef_semantics() {
    assert_eq!(split("", ','), vec![""]);
    assert_eq!(split("1,,8", ','), vec!["1", "", "8"]);
    assert_eq!(split("1,2,", ','), vec!["1", "2", ""]);
    assert_eq!(split(",", ','), vec!["", ""]);
    assert_eq!(split("4;;8", ';'), vec!["4", "", "8"]);
    assert_eq!(erase_end_semicolon("1;2;;"), "1;2;");
    assert_eq!(erase_end_semicolon(""), "");
    assert_eq!(erase_end_comma("1,2,,"), "1,2,");
}

#[test]
fn parse_input_shape_splits_at_the_last_colon() {
    let s = parse_input_shape("ns:data:1,-1;x:", true).unwrap();
    assert_eq!(
        s[0],
        InputShape {
            name: "ns:data".into(),
            dims: vec![1, -1]
        }
    );
    assert_eq!(
        s[1],
        InputShape {
            name: "x".into(),
            dims: vec![]
        }
    );
    assert_eq!(parse_input_shape("x:-1", false).unwrap_err().code, "E10011");
    assert_eq!(parse_input_shape("x:3", false).unwrap()[0].dims, vec![3]);
}

fn gi(name: &str, dims: &[i64]) -> GraphInput {
    GraphInput {
        name: name.into(),
        dims: dims.to_vec(),
        format: Format::Nchw,
    }
}

fn bind(o: &[(&str, &str)], graph: &[GraphInput]) -> Result<Binding, OptionError> {
    let p = check_options(&opts(o))?.expect("a gear option is set");
    check_gears(&p)?;
    bind_inputs(&p, graph)
}

/// Graph inputs written `name:d0,d1 | name/NHWC:d0,...` (the format is NCHW unless given).
fn graph_str(s: &str) -> Vec<GraphInput> {
    s.split(" | ")
        .map(|item| {
            let (head, dims) = item.rsplit_once(':').expect("name:dims");
            let (name, format) = match head.split_once('/') {
                Some((n, f)) => (n, Format::parse(f).expect("a format")),
                None => (head, Format::Nchw),
            };
            let dims = if dims.is_empty() {
                Vec::new()
            } else {
                dims.split(',').map(|d| d.parse().unwrap()).collect()
            };
            GraphInput {
                name: name.into(),
                dims,
                format,
            }
        })
        .collect()
}

/// One row per rule of the graph-dependent checks (gear spec §2.3 items 7–9, §3.1): options,
/// graph inputs, and `ok` or the expected code (optionally followed by text the message
/// contains). Kept one row per line, as the table above.
#[rustfmt::skip]
const BIND_ROWS: &[(&str, &str, &str, &str)] = &[
    ("all listed", "shape=x:-1,3 | batch=1,2", "x:-1,3", "ok"),
    ("missing name", "shape=nope:-1,3 | batch=1,2", "x:-1,3", "E10016 Opname nope specified in --input_shape is not found in the model."),
    ("listed twice", "shape=x:-1,3;x:-1,3 | batch=1,2", "x:-1,3", "E10001"),
    ("rank mismatch", "shape=x:-1,3 | batch=1,2", "x:-1,3,4", "E10001"),
    ("dim mismatch", "shape=x:-1,3 | batch=1,2", "x:-1,4", "E10001"),
    ("scalar listed", "shape=s:;x:-1 | dims=1;2", "x:-1 | s:", "ok"),
    ("scalar against a tensor", "shape=s:;x:-1 | dims=1;2", "x:-1 | s:1", "E10001"),
    ("user fixes an unknown dim", "shape=x:-1,3 | batch=1,2", "x:-1,-1", "ok"),
    ("user -1 over a known dim", "shape=x:-1,3 | batch=1,2", "x:8,3", "ok"),
    ("static unlisted input ignored", "shape=x:-1,3 | batch=1,2", "w:2,2 | x:-1,3", "ok"),
    ("batch unlisted appended", "shape=x:-1,3 | batch=1,2", "y:-1,5 | x:-1,3", "ok"),
    ("batch unlisted two unknown", "shape=x:-1,3 | batch=1,2", "x:-1,3 | y:-1,-1", "E10018 Value -1 for shape 1 is invalid."),
    ("batch unlisted axis 0 known", "shape=x:-1,3 | batch=1,2", "x:-1,3 | y:3,-1", "E10001"),
    ("image unlisted appended", "shape=x:1,3,-1,-1 | image=1,2;3,4", "x:1,3,-1,-1 | y:1,3,-1,-1", "ok"),
    ("image unlisted NHWC", "shape=x:1,3,-1,-1 | image=1,2;3,4", "x:1,3,-1,-1 | y/NHWC:1,-1,-1,3", "ok"),
    ("image unlisted ND is Others", "shape=x:1,3,-1,-1 | image=1,2;3,4", "x:1,3,-1,-1 | y/ND:1,3,-1,-1", "E10003 Value Others for parameter --input_format is invalid. Reason: When --dynamic_image_size is set, the input format only supports NCHW or NHWC."),
    ("image unlisted rank 5, H and W at 2 and 3", "shape=x:1,3,-1,-1 | image=1,2;3,4", "x:1,3,-1,-1 | y:1,3,-1,-1,8", "ok"),
    ("image unlisted NHWC rank 3", "shape=x:1,3,-1,-1 | image=1,2;3,4", "x:1,3,-1,-1 | y/NHWC:1,-1,-1", "ok"),
    ("image unlisted rank 3", "shape=x:1,3,-1,-1 | image=1,2;3,4", "x:1,3,-1,-1 | y:3,-1,-1", "E10019"),
    ("image unlisted bad axes", "shape=x:1,3,-1,-1 | image=1,2;3,4", "x:1,3,-1,-1 | y:-1,3,4,4", "E10019"),
    ("dims unlisted dynamic", "shape=x:-1 | dims=1;2", "x:-1 | y:-1", "E10001 All dynamic nodes must be set in --input_shape."),
    ("dims gear split over inputs", "shape=a:-1,-1;b:-1 | dims=1,2,3;4,5,6", "a:-1,-1 | b:-1", "ok"),
    ("dims overflow", "shape=a:-1,-1;b:-1,-2 | dims=1,2,3;4,5,6", "a:-1,-1 | b:-1,-1", "E10045 exceeds the dimension count per profile"),
    ("dims too few values", "shape=a:-1,-2 | dims=1;2", "a:-1,-1", "E10046 is greater than the dimension count per profile"),
    // §2.3 item 9: the product of a gear's values (zeros skipped) must fit an int64.
    ("product overflows", "shape=x:-1,-1 | dims=4294967296,4294967296;1,1", "x:-1,-1", "E19999 The shape [4294967296, 4294967296] size will overflow after multi"),
    ("zeros skipped in the product", "shape=x:-1,-1 | dims=0,4294967296;1,1", "x:-1,-1", "ok"),
];

#[test]
fn binding_rules_table() {
    let failures: Vec<String> = BIND_ROWS
        .iter()
        .filter_map(|(label, o, graph, expect)| {
            let got = run(&opts_str(o))
                .and_then(|p| bind_inputs(&p.expect("a gear option is set"), &graph_str(graph)));
            let ok = match &got {
                Ok(_) => *expect == "ok",
                Err(e) => error_matches(expect, e),
            };
            (!ok).then(|| format!("{label}: expected {expect}, got {got:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn mode(name: &str) -> DynamicMode {
    match name {
        "batch" => DynamicMode::Batch,
        "image" => DynamicMode::ImageSize,
        "dims" => DynamicMode::Dims,
        other => panic!("unknown mode {other}"),
    }
}

/// Gears written `1,2;3,4`; `none` is no gear and an empty group an empty gear.
fn hand_gears(s: &str) -> Vec<Vec<i64>> {
    if s == "none" {
        return Vec::new();
    }
    s.split(';')
        .map(|g| {
            g.split(',')
                .filter(|v| !v.is_empty())
                .map(|v| v.parse().unwrap())
                .collect()
        })
        .collect()
}

/// What option strings cannot reach: gear lists with negative values or none at all, and
/// graphs without a dynamic input (E10031, E10019 or E10001 come first). Mode,
/// `--input_shape`, gears, graph inputs, and `ok` or the expected code and text. Rows without
/// graph inputs run `check_gears`, rows with them `bind_inputs` alone.
#[rustfmt::skip]
const HAND_ROWS: &[(&str, &str, &str, &str, &str, &str)] = &[
    ("negative value", "image", "x:1,3,-1,-1", "1,2;-3,4;5", "", "E10038 Dimension size -3 is invalid. The value must be greater than 0."),
    ("length checked before sign, gear by gear", "image", "x:1,3,-1,-1", "1,2;5;-3,4", "", "E10037 A profile has 2 dimensions while another has 1 dimensions."),
    ("sign checked before duplicates", "batch", "x:-1,3", "1;1;-1", "", "E10038 Dimension size -1"),
    ("0 passes", "image", "x:1,3,-1,-1", "0,0;1,2", "", "ok"),
    ("empty list", "batch", "x:-1,3", "none", "", "E10035 has 0 profiles, which is less than the minimum 2."),
    ("dims count checked before the minimum", "dims", "x:-1,-1", "1", "", "E10001 dynamic_dims's per dims count"),
    ("dims count checked before negative values", "dims", "x:-1,-1", "1,2;-1", "", "E10001 dynamic_dims's per dims count"),
    ("no dynamic input in batch mode", "batch", "x:2,3", "1;2", "x:2,3", "E10040"),
    ("no dynamic input in image size mode", "image", "x:1,3,4,4", "1,2;3,4", "x:1,3,4,4", "E10040"),
    ("no dynamic input in dims mode is not E10040", "dims", "x:2,3", ";", "x:2,3", "ok"),
];

#[test]
fn hand_built_gear_lists_table() {
    let failures: Vec<String> = HAND_ROWS
        .iter()
        .filter_map(|(label, m, shape, gears, graph, expect)| {
            let p = ParsedOptions {
                mode: mode(m),
                inputs: parse_input_shape(shape, true).expect("a valid --input_shape"),
                format: Format::Nchw,
                gears: hand_gears(gears),
            };
            let got = if graph.is_empty() {
                check_gears(&p)
            } else {
                bind_inputs(&p, &graph_str(graph)).map(|_| ())
            };
            let ok = match &got {
                Ok(()) => *expect == "ok",
                Err(e) => error_matches(expect, e),
            };
            (!ok).then(|| format!("{label}: expected {expect}, got {got:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn binding_error_messages_name_the_input() {
    let e = bind(
        &[("shape", "nope:-1,3"), ("batch", "1,2")],
        &[gi("x", &[-1, 3])],
    )
    .unwrap_err();
    assert!(
        e.message
            .starts_with("Opname nope specified in --input_shape is not found"),
        "{e}"
    );
    let e = bind(
        &[("shape", "x:-1,3"), ("batch", "1,2")],
        &[gi("x", &[-1, 4])],
    )
    .unwrap_err();
    assert!(
        e.message
            .contains("Axis 1 of input x is 3 in --input_shape but 4 in the model"),
        "{e}"
    );
    let e = bind(
        &[("shape", "x:-1"), ("dims", "1;2")],
        &[gi("x", &[-1]), gi("y", &[-1])],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "E10001: Value y for parameter --dynamic_dims is invalid. Reason: All dynamic nodes must \
         be set in --input_shape."
    );
}

#[test]
fn seed_example_splits_each_gear_among_the_inputs() {
    let graph = [
        gi("mask", &[-1, -1]),
        gi("data", &[1, 1, 40, -1]),
        gi("label", &[1, -1]),
    ];
    let b = bind(
        &[
            ("shape", "data:1,1,40,-1;label:1,-1;mask:-1,-1"),
            ("dims", "20,20,1,1;40,40,2,2;80,60,4,4"),
        ],
        &graph,
    )
    .unwrap();
    assert_eq!(
        b.gears,
        vec![vec![20, 20, 1, 1], vec![40, 40, 2, 2], vec![80, 60, 4, 4]]
    );
    assert_eq!(b.shape_order(), vec!["data", "label", "mask"]);
    let [data, label, mask] = &b.inputs[..] else {
        panic!("three inputs expected: {b:?}")
    };
    assert_eq!(
        (data.graph_index, label.graph_index, mask.graph_index),
        (1, 2, 0)
    );
    assert_eq!(data.slices, vec![vec![20], vec![40], vec![80]]);
    assert_eq!(label.slices, vec![vec![20], vec![40], vec![60]]);
    assert_eq!(mask.slices, vec![vec![1, 1], vec![2, 2], vec![4, 4]]);
    assert_eq!(
        data.per_gear_dims,
        vec![vec![1, 1, 40, 20], vec![1, 1, 40, 40], vec![1, 1, 40, 80]]
    );
    assert_eq!(
        label.per_gear_dims,
        vec![vec![1, 20], vec![1, 40], vec![1, 60]]
    );
    assert_eq!(mask.per_gear_dims, vec![vec![1, 1], vec![2, 2], vec![4, 4]]);
    assert_eq!((data.max_gear, label.max_gear, mask.max_gear), (2, 2, 2));
    assert_eq!(data.max_dims(), &[1, 1, 40, 80]);
    assert_eq!(data.unknown_dim_index, vec![3]);
    assert_eq!(mask.unknown_dim_index, vec![0, 1]);
    assert_eq!(data.user_dims, vec![1, 1, 40, -1]);
}

#[test]
fn max_gear_is_the_largest_product_per_input_first_on_ties_zeros_skipped() {
    let graph = [gi("a", &[-1]), gi("b", &[-1, 2])];
    // Input a gets 5, 0 and 0 (products 5, 1, 1); input b gets 1, 2 and 3.
    let b = bind(&[("shape", "a:-1;b:-1,2"), ("dims", "5,1;0,2;0,3")], &graph).unwrap();
    assert_eq!((b.inputs[0].max_gear, b.inputs[1].max_gear), (0, 2));
    // Ties: the first of the largest wins.
    let b = bind(&[("shape", "a:-1;b:-1,2"), ("dims", "1,4;3,2;3,4")], &graph).unwrap();
    assert_eq!((b.inputs[0].max_gear, b.inputs[1].max_gear), (1, 0));
    // All-zero slices leave gear 0.
    let b = bind(&[("shape", "a:-1;b:-1,2"), ("dims", "0,1;0,2")], &graph).unwrap();
    assert_eq!(b.inputs[0].max_gear, 0);
    assert_eq!(b.inputs[0].max_dims(), &[0]);
    // Per input, by element count of that input only, not an element-wise max.
    let b = bind(
        &[("shape", "x:-1,-1"), ("dims", "8,1;2,3;1,8")],
        &[gi("x", &[-1, -1])],
    )
    .unwrap();
    assert_eq!(b.inputs[0].max_gear, 0);
    assert_eq!(b.inputs[0].max_dims(), &[8, 1]);
}

#[test]
fn batch_mode_gives_the_whole_gear_to_every_batch_input_and_appends_unlisted_ones() {
    let graph = [
        gi("extra2", &[-1, 7]),
        gi("x", &[-1, 3]),
        gi("w", &[4, 4]),
        gi("extra1", &[-1, 5]),
        gi("y", &[2, 2]),
    ];
    let b = bind(&[("shape", "y:2,2;x:-1,3"), ("batch", "1,8,4")], &graph).unwrap();
    let names: Vec<&str> = b.inputs.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, vec!["y", "x", "extra2", "extra1"]);
    assert_eq!(b.shape_order(), vec!["y", "x"]);
    let [y, x, e2, e1] = &b.inputs[..] else {
        panic!("four inputs expected")
    };
    assert!(!y.is_dynamic());
    assert_eq!(y.slices, vec![Vec::<i64>::new(); 3]);
    assert_eq!(y.per_gear_dims, vec![vec![2, 2]; 3]);
    assert_eq!(x.slices, vec![vec![1], vec![8], vec![4]]);
    assert_eq!(x.max_gear, 1);
    assert_eq!(x.max_dims(), &[8, 3]);
    assert!(!e2.from_input_shape && !e1.from_input_shape);
    assert_eq!(e2.per_gear_dims, vec![vec![1, 7], vec![8, 7], vec![4, 7]]);
    assert_eq!((e2.graph_index, e1.graph_index), (0, 3));
    // A listed -1 outside axis 0 receives the batch value too, as in GE.
    let b = bind(
        &[("shape", "x:-1,3;y:1,-1"), ("batch", "1,2")],
        &[gi("x", &[-1, 3]), gi("y", &[1, -1])],
    )
    .unwrap();
    assert_eq!(b.inputs[1].per_gear_dims, vec![vec![1, 1], vec![1, 2]]);
}

#[test]
fn image_mode_gives_height_and_width_to_every_image_input() {
    let graph = [
        gi("x", &[1, 3, -1, -1]),
        GraphInput {
            name: "y".into(),
            dims: vec![1, -1, -1, 3],
            format: Format::Nhwc,
        },
    ];
    let b = bind(
        &[("shape", "x:1,3,-1,-1"), ("image", "224,224;320,480")],
        &graph,
    )
    .unwrap();
    assert_eq!(
        b.inputs[0].per_gear_dims,
        vec![vec![1, 3, 224, 224], vec![1, 3, 320, 480]]
    );
    assert_eq!(
        b.inputs[1].per_gear_dims,
        vec![vec![1, 224, 224, 3], vec![1, 320, 480, 3]]
    );
    assert_eq!(b.inputs[0].max_gear, 1);
    assert_eq!(b.inputs[0].unknown_dim_index, vec![2, 3]);
}

#[test]
fn map_index_limit_is_the_kernels_not_ges() {
    // The TIK kernel takes 100 gears of 400 values; the Ascend 950 (arch35) one 256 of 24000.
    assert!(check_map_index_limit(100, 4, 100, 400).is_ok());
    let e = check_map_index_limit(101, 4, 100, 400).unwrap_err();
    assert_eq!(e.code, GEARSIM_CODE);
    assert!(
        e.message.contains("101 profiles") && e.message.contains("at most 100"),
        "{e}"
    );
    assert!(
        e.message.contains("MapIndex") && e.message.contains("soc_version"),
        "{e}"
    );
    assert!(check_map_index_limit(256, 4, 256, 24000).is_ok());
    assert_eq!(
        check_map_index_limit(257, 4, 256, 24000).unwrap_err().code,
        GEARSIM_CODE
    );
    let e = check_map_index_limit(2, 401, 100, 400).unwrap_err();
    assert!(
        e.message.contains("401 values") && e.message.contains("at most 400"),
        "{e}"
    );
    // GE's own checks accept 150 gears; only the kernel limit rejects them.
    let p = check_options(&opts(&[
        ("shape", "x:-1,3"),
        (
            "batch",
            &(1..=150)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
    ]))
    .unwrap()
    .unwrap();
    assert!(check_gears(&p).is_ok());
    assert!(check_map_index_limit(p.gears.len(), 1, 100, 400).is_err());
    assert!(check_map_index_limit(p.gears.len(), 1, 256, 24000).is_ok());
}

/// `--enable_small_channel` takes 0 or 1; anything else is GE's E10001 naming the option.
#[test]
fn small_channel_is_zero_or_one() {
    use gearsim_compiler::options::parse_small_channel;
    assert_eq!(parse_small_channel("0"), Ok(false));
    assert_eq!(parse_small_channel(" 1"), Ok(true));
    let e = parse_small_channel("2").unwrap_err();
    assert_eq!(e.code, "E10001");
    assert!(e.to_string().contains("--enable_small_channel"), "{e}");
}
