//! atc gear options: `--input_shape` with one of `--dynamic_batch_size`, `--dynamic_image_size`
//! or `--dynamic_dims`, parsed and validated with GE's rules, order and error codes (gear spec
//! §2–§3, offline path), then bound to the graph's inputs.
//!
//! ```text
//!   GearOptions (raw strings)
//!     ─▶ check_options          option-time checks (§2.2), then the gear list (InitDynamicParams)
//!     ─▶ check_gears            CheckNegativeCountOfOptions, CheckDynamicParams (§2.3 items 5–6)
//!     ─▶ check_map_index_limit  the MapIndex kernel's limits on the target soc_version
//!     ─▶ bind_inputs            CheckAndParseDynamicData, ParserDataToDynamicInfo, CalcShape,
//!                               the max-gear choice (§2.3 items 7–10, §3.1, §3.3)
//! ```
//!
//! Every error carries GE's code and GE's message text with its arguments filled in. Where GE
//! has no code for a situation (or the situation only exists in gearsim), the error says so in
//! the code's comment and uses the closest GE code or [`GEARSIM_CODE`].
//!
//! ```
//! use gearsim_compiler::options::{GearOptions, check_gears, check_options};
//! let o = GearOptions {
//!     input_shape: Some("x:-1,3,224,224".into()),
//!     dynamic_batch_size: Some("1,2,4".into()),
//!     ..GearOptions::default()
//! };
//! let parsed = check_options(&o).unwrap().unwrap();
//! check_gears(&parsed).unwrap();
//! assert_eq!(parsed.gears, vec![vec![1], vec![2], vec![4]]);
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::ir::Format;

/// Error code of the errors that are gearsim's own (GE has no equivalent check).
pub const GEARSIM_CODE: &str = "GEARSIM";

/// Fewest gears GE accepts (`kMinShapesCount`).
pub const MIN_GEARS: usize = 2;

/// A rejected option, with GE's error code (`"E10001"` and so on) and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct OptionError {
    /// GE's error code, or [`GEARSIM_CODE`].
    pub code: &'static str,
    /// The message, with its parameters filled in.
    pub message: String,
}

impl OptionError {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> Self {
        OptionError {
            code,
            message: message.into(),
        }
    }
}

/// Which gear option is set; the value GE stamps as `mbatch_dynamic_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DynamicMode {
    /// `--dynamic_batch_size`.
    Batch,
    /// `--dynamic_image_size`.
    ImageSize,
    /// `--dynamic_dims`.
    Dims,
}

impl DynamicMode {
    /// GE's `mbatch_dynamic_type`: 1 batch, 2 image size, 3 dims (0, fixed, has no mode).
    pub fn mbatch_dynamic_type(self) -> u32 {
        match self {
            DynamicMode::Batch => 1,
            DynamicMode::ImageSize => 2,
            DynamicMode::Dims => 3,
        }
    }

    /// The mode with this `mbatch_dynamic_type`.
    pub fn from_mbatch_dynamic_type(v: u32) -> Option<DynamicMode> {
        [
            DynamicMode::Batch,
            DynamicMode::ImageSize,
            DynamicMode::Dims,
        ]
        .into_iter()
        .find(|m| m.mbatch_dynamic_type() == v)
    }

    /// The atc option name, without the leading `--`.
    pub fn option_name(self) -> &'static str {
        match self {
            DynamicMode::Batch => "dynamic_batch_size",
            DynamicMode::ImageSize => "dynamic_image_size",
            DynamicMode::Dims => "dynamic_dims",
        }
    }
}

/// One `name:d0,d1,...` entry of `--input_shape`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputShape {
    /// Input name (whitespace trimmed; may contain `:`).
    pub name: String,
    /// Dims; `-1` marks a gear axis, an empty list a scalar.
    pub dims: Vec<i64>,
}

/// The raw option strings, as the user wrote them. `None` and `Some("")` both mean "not set",
/// as an empty flag does in atc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GearOptions {
    /// `--input_shape`.
    pub input_shape: Option<String>,
    /// `--dynamic_batch_size`.
    pub dynamic_batch_size: Option<String>,
    /// `--dynamic_image_size`.
    pub dynamic_image_size: Option<String>,
    /// `--dynamic_dims`.
    pub dynamic_dims: Option<String>,
    /// `--input_format` (atc's default for ONNX models, `NCHW`, applies when unset).
    pub input_format: Option<String>,
    /// `--input_shape_range` (deprecated; only for the mutual-exclusion checks).
    pub input_shape_range: Option<String>,
    /// `--input_hint_shape` (only for the mutual-exclusion checks).
    pub input_hint_shape: Option<String>,
    /// `--insert_op_conf`: the AIPP configuration file's path, as written.
    pub insert_op_conf: Option<String>,
    /// The text of that file (the command line reads it; the compiler parses it).
    pub insert_op_conf_text: Option<String>,
    /// `--enable_small_channel=1`: a first convolution of at most 4 input channels reads the
    /// image through AIPP as C04 (4 channels a pixel instead of 16).
    pub enable_small_channel: bool,
}

/// atc's `--enable_small_channel` value: `0` or `1` (E10001 otherwise).
pub fn parse_small_channel(value: &str) -> Result<bool, OptionError> {
    match value.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        v => Err(e10001(
            v,
            "--enable_small_channel",
            "The current value is not within the valid range (0 or 1).",
        )),
    }
}

/// The options after the option-time checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedOptions {
    /// Which gear option is set.
    pub mode: DynamicMode,
    /// The `--input_shape` entries, in the order written.
    pub inputs: Vec<InputShape>,
    /// `--input_format`, or `NCHW` when unset.
    pub format: Format,
    /// The gears in the order written (empty groups and values skipped, as GE does).
    pub gears: Vec<Vec<i64>>,
}

impl ParsedOptions {
    /// Number of `-1` axes over all `--input_shape` entries.
    pub fn minus_one_count(&self) -> usize {
        self.inputs
            .iter()
            .map(|i| i.dims.iter().filter(|d| **d == -1).count())
            .sum()
    }
}

/// An input of the graph, as the compiler's front end sees it (before `--input_shape`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphInput {
    /// Name of the input (the `Data` node).
    pub name: String,
    /// Dims in the model, `-1` for an unknown dim.
    pub dims: Vec<i64>,
    /// Layout of the input's tensor.
    pub format: Format,
}

/// One gear-controlled (or listed) input after binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundInput {
    /// Input name.
    pub name: String,
    /// Position of the input in the `graph_inputs` given to [`bind_inputs`].
    pub graph_index: usize,
    /// Whether the input is listed in `--input_shape` (otherwise it is an unlisted dynamic input
    /// GE appends in batch and image size modes).
    pub from_input_shape: bool,
    /// Its dims as declared (`--input_shape`, or the model for an appended input), `-1` kept.
    pub user_dims: Vec<i64>,
    /// The part of each gear this input receives (§3.1); empty for a static input.
    pub slices: Vec<Vec<i64>>,
    /// Its dims under each gear (`CalcShape`).
    pub per_gear_dims: Vec<Vec<i64>>,
    /// The gear whose shape the root `Data` takes (§3.3).
    pub max_gear: usize,
    /// Axes that are `-1` in `user_dims` (`_dynamic_batch_unknown_dim_index`).
    pub unknown_dim_index: Vec<usize>,
}

impl BoundInput {
    /// The input's dims under its max gear (the root `Data` shape).
    pub fn max_dims(&self) -> &[i64] {
        self.per_gear_dims
            .get(self.max_gear)
            .map_or(self.user_dims.as_slice(), Vec::as_slice)
    }

    /// Whether any axis of the input is gear-controlled.
    pub fn is_dynamic(&self) -> bool {
        self.user_dims.iter().any(|d| *d < 0)
    }
}

/// The gears bound to the graph's inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The `--input_shape` entries in the order written, then the appended unlisted dynamic
    /// inputs in graph order.
    pub inputs: Vec<BoundInput>,
    /// The gears in the order written; gear i is branch `Batch_i`.
    pub gears: Vec<Vec<i64>>,
}

impl Binding {
    /// Names of the `--input_shape` entries in gear-vector order (GE's
    /// `_user_designate_shape_order`); appended inputs are not part of it.
    pub fn shape_order(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .filter(|i| i.from_input_shape)
            .map(|i| i.name.as_str())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Messages. Each function renders GE's registered message for its code (GE's
// `error_code.json`), with the arguments GE passes.

const SAMPLE_NAMED: &str = "\"input_name1:n1,c1,h1,w1\"";
const SAMPLE_VALUES: &str = "\"input_name1:1,3,224,224\"";
const SPLIT_ERROR: &str = "The shape must contain two parts: name and value";
const FLOAT_ERROR: &str = "The float number is unsupported";
const DIGIT_ERROR: &str = "It is not a digit";
const BATCH_CHARS_ERROR: &str = "It can only contain digits and \",\".";
const IMAGE_CHARS_ERROR: &str = "It can only contain digits, \",\", \" \" and \";\".";

fn e10001(value: &str, parameter: &str, reason: &str) -> OptionError {
    OptionError::new(
        "E10001",
        format!("Value {value} for parameter {parameter} is invalid. Reason: {reason}"),
    )
}

fn e10002(shape: &str, reason: &str, sample: &str) -> OptionError {
    OptionError::new(
        "E10002",
        format!(
            "Value {shape} for parameter --input_shape is invalid. Reason: {reason}. \
             The value must be formatted as {sample}."
        ),
    )
}

fn e10003(value: &str, parameter: &str, reason: &str) -> OptionError {
    OptionError::new(
        "E10003",
        format!("Value {value} for parameter --{parameter} is invalid. Reason: {reason}"),
    )
}

fn e10019() -> OptionError {
    OptionError::new(
        "E10019",
        "When --dynamic_image_size is included, only the height and width axes can be -1 in \
         --input_shape.",
    )
}

fn e10040() -> OptionError {
    OptionError::new(
        "E10040",
        "As the --dynamic_batch_size, --dynamic_image_size, or --dynamic_dims argument is \
         included, the corresponding nodes specified in --input_shape must have -1 axes and \
         cannot have '~'.",
    )
}

fn e19999(message: String) -> OptionError {
    OptionError::new("E19999", message)
}

/// Renders dims as GE's `ToString(std::vector)` does: `[1, 3, -1, -1]`.
fn dims_str(dims: &[i64]) -> String {
    let mut s = String::from("[");
    for (i, d) in dims.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{d}");
    }
    s.push(']');
    s
}

/// Renders dims as `GeShape::ToString` does: `1,3,-1,-1` (no brackets).
fn ge_shape_str(dims: &[i64]) -> String {
    let mut s = String::new();
    for (i, d) in dims.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{d}");
    }
    s
}

// ---------------------------------------------------------------------------------------------
// What follows is the string handling of GE's parsers.

/// Splits like metadef's `StringUtils::Split`: an empty string gives one empty item,
/// consecutive delimiters give empty items and a trailing delimiter gives a trailing empty item.
pub fn split(s: &str, delim: char) -> Vec<&str> {
    // Rust's `str::split` has exactly these semantics.
    s.split(delim).collect()
}

/// Removes one trailing `;` (GE's `EraseEndSemicolon`, applied to `dynamic_dims` and
/// `dynamic_image_size`).
pub fn erase_end_semicolon(s: &str) -> &str {
    s.strip_suffix(';').unwrap_or(s)
}

/// Removes one trailing `,` (applied to `dynamic_batch_size` after its character check).
pub fn erase_end_comma(s: &str) -> &str {
    s.strip_suffix(',').unwrap_or(s)
}

/// Whitespace as C's `isspace` sees it in the "C" locale.
fn is_c_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
}

/// metadef's `StringUtils::Trim`.
fn trim(s: &str) -> &str {
    s.trim_matches(is_c_space)
}

/// Why `std::stol` throws.
enum StolError {
    /// `std::invalid_argument`: no digits.
    Invalid,
    /// `std::out_of_range`: the value does not fit a 64-bit `long`.
    OutOfRange,
}

/// `std::stol` (base 10): leading whitespace, an optional sign, then as many digits as there
/// are; anything after the digits is ignored.
fn stol(s: &str) -> Result<i64, StolError> {
    let rest = s.trim_start_matches(is_c_space);
    let (negative, rest) = match rest.as_bytes().first() {
        Some(b'-') => (true, &rest[1..]),
        Some(b'+') => (false, &rest[1..]),
        _ => (false, rest),
    };
    let digits: Vec<i64> = rest
        .bytes()
        .take_while(u8::is_ascii_digit)
        .map(|b| i64::from(b - b'0'))
        .collect();
    if digits.is_empty() {
        return Err(StolError::Invalid);
    }
    // Accumulating towards the sign keeps `i64::MIN` representable.
    let mut value: i64 = 0;
    for d in digits {
        let next = value.checked_mul(10).and_then(|v| {
            if negative {
                v.checked_sub(d)
            } else {
                v.checked_add(d)
            }
        });
        value = next.ok_or(StolError::OutOfRange)?;
    }
    Ok(value)
}

/// `strtol` of an all-digit string: saturates at `i64::MAX` instead of failing, as GE's
/// `ChangeStrToNum` (which does not check `errno`) does.
fn strtol_digits(s: &str) -> i64 {
    s.bytes().fold(0i64, |acc, b| {
        acc.saturating_mul(10)
            .saturating_add(i64::from(b.wrapping_sub(b'0')))
    })
}

fn all_digits(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit())
}

/// Parses `--input_shape` as GE's `ParseInputShape` does: entries split on `;`, each split at
/// its last `:` into a (trimmed) name and a value; an empty value is a scalar; dims split on `,`.
/// With `dynamic` (a gear option is set) values ≤ 0 are accepted; without it they are E10011.
///
/// Errors, in GE's order per value: a `.` (E10002), a character other than digits after one
/// leading `-` (E10002), `stol` failing (E10014 invalid, E10013 out of range), then ≤ 0 (E10011).
/// Whitespace around a value is trimmed before the checks.
pub fn parse_input_shape(s: &str, dynamic: bool) -> Result<Vec<InputShape>, OptionError> {
    let mut out = Vec::new();
    for item in split(s, ';') {
        let Some(pos) = item.rfind(':') else {
            return Err(e10002(item, SPLIT_ERROR, SAMPLE_NAMED));
        };
        let name = trim(&item[..pos]).to_string();
        let value = &item[pos + 1..];
        if value.is_empty() {
            out.push(InputShape {
                name,
                dims: Vec::new(),
            });
            continue;
        }
        let mut dims = Vec::new();
        for raw in split(value, ',') {
            if raw.contains('.') {
                return Err(e10002(item, FLOAT_ERROR, SAMPLE_VALUES));
            }
            // GE trims the value in place before `stol`, so the later checks see it trimmed.
            let v = trim(raw);
            // The digit check comes before the conversion (spec §2.2), so `x` is E10002, not
            // `stol`'s E10014; an empty value or a lone `-` passes it and fails in `stol`.
            if !all_digits(v.strip_prefix('-').unwrap_or(v)) {
                return Err(e10002(item, DIGIT_ERROR, SAMPLE_VALUES));
            }
            let n = match stol(v) {
                Ok(n) => n,
                Err(StolError::OutOfRange) => {
                    return Err(OptionError::new(
                        "E10013",
                        format!("Value {v} for --input_shape is out of range."),
                    ));
                }
                Err(StolError::Invalid) => {
                    return Err(OptionError::new(
                        "E10014",
                        format!("Value {v} for parameter --input_shape is invalid."),
                    ));
                }
            };
            if !dynamic && n <= 0 {
                return Err(OptionError::new(
                    "E10011",
                    format!(
                        "Value {item} for parameter --input_shape is invalid. Shape values must \
                         be positive integers. The error value in the shape is {n}."
                    ),
                ));
            }
            dims.push(n);
        }
        out.push(InputShape { name, dims });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// What follows are the option-time checks (§2.2).

fn non_empty(o: &Option<String>) -> Option<&str> {
    o.as_deref().filter(|s| !s.is_empty())
}

/// GE's `CheckDynamicBatchShape`: `Ok(true)` when dim 0 is `-1` (and no other dim is
/// negative, else E10018), `Ok(false)` when dim 0 is not `-1`.
fn check_dynamic_batch_shape(shape: &[i64]) -> Result<bool, OptionError> {
    if shape.first() != Some(&-1) {
        return Ok(false);
    }
    for (i, d) in shape.iter().enumerate().skip(1) {
        if *d < 0 {
            return Err(OptionError::new(
                "E10018",
                format!(
                    "Value {d} for shape {i} is invalid. When --dynamic_batch_size is included, \
                     only batch size N can be -1 in --input_shape."
                ),
            ));
        }
    }
    Ok(true)
}

/// GE's `CheckDynamicImageSizeShape` for a rank-4 shape: the format must be NCHW or NHWC
/// (E10003), H and W must be `-1` and be the only `-1`s (E10019). GE reports E10019 right after
/// the format's E10003; the first reported error is the one returned here.
fn check_dynamic_image_size_shape(shape: &[i64], format: &str) -> Result<(), OptionError> {
    let (h, w) = match format {
        "NCHW" => (shape.get(2), shape.get(3)),
        "NHWC" => (shape.get(1), shape.get(2)),
        _ => {
            return Err(e10003(
                format,
                "input_format",
                "When --dynamic_image_size is set, the input format only supports NCHW or NHWC.",
            ));
        }
    };
    let minus_ones = shape.iter().filter(|d| **d == -1).count();
    if h == Some(&-1) && w == Some(&-1) && minus_ones == 2 {
        Ok(())
    } else {
        Err(e10019())
    }
}

/// `CheckDynamicBatchSizeInputShapeValid`; returns the value with one trailing `,` removed.
fn check_batch<'a>(
    shape_map: &BTreeMap<&str, &[i64]>,
    batch: &'a str,
) -> Result<&'a str, OptionError> {
    let mut dynamic = 0usize;
    for shape in shape_map.values() {
        if shape.is_empty() {
            return Err(OptionError::new(
                "E10012",
                "--dynamic_batch_size is included, but the dimension count of the dynamic-shape \
                 input configured in --input_shape is less than 1.",
            ));
        }
        if !shape.contains(&-1) {
            continue;
        }
        if check_dynamic_batch_shape(shape)? {
            dynamic += 1;
        }
    }
    if dynamic == 0 {
        return Err(OptionError::new(
            "E10031",
            "--dynamic_batch_size is included, but none of the nodes specified in --input_shape \
             has a batch size equaling -1.",
        ));
    }
    if !batch.chars().all(|c| c.is_ascii_digit() || c == ',') {
        return Err(e10003(batch, "dynamic_batch_size", BATCH_CHARS_ERROR));
    }
    Ok(erase_end_comma(batch))
}

/// `CheckDynamicImagesizeInputShapeValid`; returns the value with one trailing `;` removed.
fn check_image<'a>(
    shape_map: &BTreeMap<&str, &[i64]>,
    format: &str,
    image: &'a str,
) -> Result<&'a str, OptionError> {
    if Format::parse(format).is_none() {
        return Err(e10003(
            format,
            "input_format",
            "This format is not supported.",
        ));
    }
    let mut dynamic = 0usize;
    for shape in shape_map.values() {
        let has_minus_one = shape.contains(&-1);
        if shape.len() != 4 {
            if has_minus_one {
                return Err(e10019());
            }
            continue;
        }
        if !has_minus_one {
            continue;
        }
        check_dynamic_image_size_shape(shape, format)?;
        dynamic += 1;
    }
    if dynamic == 0 {
        return Err(e10019());
    }
    let image = erase_end_semicolon(image);
    let chars_ok = image
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, ',' | ' ' | ';'));
    if !chars_ok {
        return Err(e10003(image, "dynamic_image_size", IMAGE_CHARS_ERROR));
    }
    for group in split(image, ';') {
        if split(group, ',').len() != 2 {
            return Err(OptionError::new(
                "E10020",
                format!("Value {image} for parameter --dynamic_image_size is invalid."),
            ));
        }
    }
    Ok(image)
}

/// `CheckDynamicDimsInputShapeValid` and `CheckAndParseDynamicDims`; returns the value with
/// one trailing `;` removed.
fn check_dims<'a>(
    shape_map: &BTreeMap<&str, &[i64]>,
    dims: &'a str,
) -> Result<&'a str, OptionError> {
    let minus_ones: usize = shape_map
        .values()
        .map(|s| s.iter().filter(|d| **d == -1).count())
        .sum();
    if minus_ones == 0 {
        return Err(e10001(
            "0",
            "--input_shape's dynamic dim num",
            "At least one dim should be -1 when dynamic_dims is set.",
        ));
    }
    let dims = erase_end_semicolon(dims);
    if dims.is_empty() {
        return Err(OptionError::new(
            "E10058",
            "Parameter --dynamic_dims is not configured or is empty.",
        ));
    }
    // GE checks each group's count and then its characters before moving to the next group.
    for group in split(dims, ';') {
        let values = split(group, ',');
        if values.len() != minus_ones {
            return Err(e10003(
                dims,
                "dynamic_dims",
                "Each setting needs to be consistent with the number of -1 in the input shape.",
            ));
        }
        for v in values {
            if !all_digits(v) {
                return Err(e10001(
                    v,
                    "--dynamic_dims",
                    "Dynamic dims must be a positive integer.",
                ));
            }
        }
    }
    Ok(dims)
}

/// GE's `ChangeStrToNum` as `InitDynamicParams` uses it.
fn gear_value(s: &str, mode: DynamicMode, whole: &str) -> Result<i64, OptionError> {
    if all_digits(s) {
        Ok(strtol_digits(s))
    } else {
        // GE fails a GE_ASSERT here, which is reported as an inner error.
        Err(e19999(format!(
            "Option {}[{whole}] should not have non-digital character",
            mode.option_name()
        )))
    }
}

/// Builds the gear list as `InitDynamicParams` does (§2.3 item 4): every batch value is a
/// one-value gear; image size and dims groups are gears (`ParseDynamicSize`). Empty groups and
/// empty values are skipped.
fn build_gears(mode: DynamicMode, value: &str) -> Result<Vec<Vec<i64>>, OptionError> {
    let mut gears = Vec::new();
    match mode {
        DynamicMode::Batch => {
            for v in split(value, ',') {
                if !v.is_empty() {
                    gears.push(vec![gear_value(v, mode, value)?]);
                }
            }
        }
        DynamicMode::ImageSize | DynamicMode::Dims => {
            for group in split(value, ';') {
                let mut gear = Vec::new();
                for v in split(group, ',') {
                    if !v.is_empty() {
                        gear.push(gear_value(v, mode, value)?);
                    }
                }
                if !gear.is_empty() {
                    gears.push(gear);
                }
            }
        }
    }
    Ok(gears)
}

/// Runs the option-time checks of gear spec §2.2 in GE's order, then builds the gear list.
/// Returns `None` when no gear option is set.
///
/// Order: `~` in `--input_shape` (E10040); `--input_hint_shape` with a gear option (E10001);
/// more than one of the gear options and `--input_shape_range` (E10009); `--input_shape` empty
/// (E10004); `--input_shape` values (E10002, E10013, E10014); the mode's own checks; AIPP with
/// `--dynamic_dims` (E10001). `--input_shape_range`, when set, wins over `--input_shape` (which
/// GE then clears) and skips the `~` check.
///
/// Without a gear option, a non-empty `--input_shape` is still checked as a static shape, so
/// values ≤ 0 are E10011. (GE would send an `--input_shape` containing `-1` or `~` to its
/// dynamic-shape path as a shape range; gearsim does not simulate that path, so `-1` without a
/// gear option is E10011 like any other value ≤ 0.)
pub fn check_options(o: &GearOptions) -> Result<Option<ParsedOptions>, OptionError> {
    let range = non_empty(&o.input_shape_range);
    let batch = non_empty(&o.dynamic_batch_size);
    let image = non_empty(&o.dynamic_image_size);
    let dims = non_empty(&o.dynamic_dims);
    let any_gear = batch.is_some() || image.is_some() || dims.is_some();
    // This is `CheckAndTransferInputShapeToRange`: a shape range wins and clears `--input_shape`.
    let input_shape = if range.is_some() {
        None
    } else {
        non_empty(&o.input_shape)
    };
    if range.is_none() && any_gear && input_shape.is_some_and(|s| s.contains('~')) {
        return Err(e10040());
    }
    // This is `CheckHintShapeConflictWithDynamicParam`.
    if let (Some(hint), true) = (non_empty(&o.input_hint_shape), any_gear) {
        return Err(e10001(
            hint,
            "--input_hint_shape",
            "input_hint_shape cannot be used with dynamic_batch_size, dynamic_image_size or \
             dynamic_dims.",
        ));
    }
    // This is `CheckDynamicInputParamValid`.
    let set_count = [batch, image, dims, range]
        .iter()
        .filter(|o| o.is_some())
        .count();
    if set_count > 1 {
        return Err(OptionError::new(
            "E10009",
            "--dynamic_batch_size, --dynamic_image_size, --input_shape_range, and --dynamic_dims \
             are mutually exclusive.",
        ));
    }
    let (mode, raw) = match (batch, image, dims) {
        (Some(b), _, _) => (DynamicMode::Batch, b),
        (_, Some(i), _) => (DynamicMode::ImageSize, i),
        (_, _, Some(d)) => (DynamicMode::Dims, d),
        (None, None, None) => {
            if let Some(shape) = input_shape {
                parse_input_shape(shape, false)?;
            }
            return Ok(None);
        }
    };
    let Some(shape) = input_shape else {
        return Err(OptionError::new(
            "E10004",
            "Value for --input_shape is empty.",
        ));
    };
    let inputs = parse_input_shape(shape, true)?;
    // GE runs the mode checks over a `std::map`: sorted by name, the first entry of a name wins.
    let mut shape_map: BTreeMap<&str, &[i64]> = BTreeMap::new();
    for i in &inputs {
        shape_map
            .entry(i.name.as_str())
            .or_insert(i.dims.as_slice());
    }
    // atc fills in the framework's default format (NCHW for ONNX) before these checks.
    let format_str = non_empty(&o.input_format).unwrap_or("NCHW");
    let value = match mode {
        DynamicMode::Batch => check_batch(&shape_map, raw)?,
        DynamicMode::ImageSize => check_image(&shape_map, format_str, raw)?,
        DynamicMode::Dims => check_dims(&shape_map, raw)?,
    };
    if let (DynamicMode::Dims, Some(aipp)) = (mode, non_empty(&o.insert_op_conf)) {
        return Err(e10001(
            aipp,
            "--insert_op_conf",
            "The dynamic dims function does not support AIPP.",
        ));
    }
    // Image size mode has rejected an unknown format above (E10003). In the other modes GE
    // rejects it in `CheckInputFormat` with E10001; gearsim knows only ND, NCHW and NHWC.
    let Some(format) = Format::parse(format_str) else {
        return Err(e10001(
            format_str,
            "--input_format",
            "The current value is not within the valid range.",
        ));
    };
    let gears = build_gears(mode, value)?;
    Ok(Some(ParsedOptions {
        mode,
        inputs,
        format,
        gears,
    }))
}

// ---------------------------------------------------------------------------------------------
// What follows are the checks of the gear list (§2.3 items 5–6).

/// `CheckNegativeCountOfOptions` (dims mode: every gear has as many values as there are `-1`s
/// in `--input_shape`, else E10001) then `CheckDynamicParams`: fewer than 2 gears (E10035),
/// gears of different lengths (E10037), a value < 0 (E10038; 0 passes as in GE-new), duplicate
/// gears (E10039). As in GE-new there is no maximum here; see [`check_map_index_limit`].
///
/// GE skips the multi-batch pass altogether when the gear list is empty (for example
/// `--dynamic_batch_size=","`), leaving the `-1` axes to its dynamic-shape path, which gearsim
/// does not simulate; an empty list is therefore E10035 with 0 profiles here.
pub fn check_gears(p: &ParsedOptions) -> Result<(), OptionError> {
    if p.mode == DynamicMode::Dims {
        let minus_ones = p.minus_one_count();
        for gear in &p.gears {
            if gear.len() != minus_ones {
                return Err(e10001(
                    &gear.len().to_string(),
                    "dynamic_dims's per dims count",
                    "dynamic_dims's per dims count should be equal to input_shape's dim size.",
                ));
            }
        }
    }
    if p.gears.len() < MIN_GEARS {
        return Err(OptionError::new(
            "E10035",
            format!(
                "--dynamic_batch_size, --dynamic_image_size, or --dynamic_dims has {} profiles, \
                 which is less than the minimum {MIN_GEARS}.",
                p.gears.len()
            ),
        ));
    }
    let first_len = p.gears.first().map_or(0, Vec::len);
    let mut seen = BTreeSet::new();
    for gear in &p.gears {
        if gear.len() != first_len {
            return Err(OptionError::new(
                "E10037",
                format!(
                    "The profiles configured in --dynamic_batch_size, --dynamic_image_size, or \
                     --dynamic_dims have inconsistent dimension counts. A profile has {first_len} \
                     dimensions while another has {} dimensions.",
                    gear.len()
                ),
            ));
        }
        if let Some(d) = gear.iter().find(|d| **d < 0) {
            return Err(OptionError::new(
                "E10038",
                format!("Dimension size {d} is invalid. The value must be greater than 0."),
            ));
        }
        seen.insert(gear.as_slice());
    }
    if seen.len() != p.gears.len() {
        // GE's registered text, word for word ("argument have"; the spec paraphrases it as
        // "has").
        return Err(OptionError::new(
            "E10039",
            "The --dynamic_batch_size, --dynamic_image_size, or --dynamic_dims argument have \
             duplicate profiles.",
        ));
    }
    Ok(())
}

/// Checks the gear table against the MapIndex kernel of the target soc_version: at most
/// `max_gears` gears (table rows) and at most `max_dims` values per gear (the query vector).
/// GE itself sets no maximum; these limits are the kernel's, so the error is gearsim's own.
pub fn check_map_index_limit(
    gears: usize,
    gear_len: usize,
    max_gears: u32,
    max_dims: u32,
) -> Result<(), OptionError> {
    let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    if wide(gears) > u64::from(max_gears) {
        return Err(OptionError::new(
            GEARSIM_CODE,
            format!(
                "{gears} profiles are configured, but the MapIndex kernel on this soc_version \
                 accepts at most {max_gears} profiles (rows of its gear table). GE sets no \
                 maximum of its own; this is the kernel's limit. Use at most {max_gears} \
                 profiles in --dynamic_batch_size, --dynamic_image_size or --dynamic_dims."
            ),
        ));
    }
    if wide(gear_len) > u64::from(max_dims) {
        return Err(OptionError::new(
            GEARSIM_CODE,
            format!(
                "Each profile has {gear_len} values, but the MapIndex kernel on this soc_version \
                 accepts at most {max_dims} values per profile (the length of its query \
                 vector). GE sets no maximum of its own; this is the kernel's limit. Use fewer \
                 -1 axes in --input_shape."
            ),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// What follows binds the gears to the graph's inputs (§2.3 items 7–10, §3).

/// An input taking part in `ParserDataToDynamicInfo`.
struct Entry {
    name: String,
    graph_index: usize,
    from_input_shape: bool,
    dims: Vec<i64>,
}

/// `ParserDataToDynamicInfo` (§3.1): the part of every gear each entry receives.
fn split_gears(gears: &[Vec<i64>], entries: &[Entry]) -> Result<Vec<Vec<Vec<i64>>>, OptionError> {
    let mut all = Vec::with_capacity(entries.len());
    let mut cursor = 0usize;
    for e in entries {
        let k = e.dims.iter().filter(|d| **d < 0).count();
        let mut slices = Vec::with_capacity(gears.len());
        for gear in gears {
            if gear.len() == k {
                slices.push(gear.clone());
            } else if gear.len() > k {
                let Some(slice) = gear.get(cursor..cursor + k) else {
                    return Err(OptionError::new(
                        "E10045",
                        "The number of -1 axes in the --input_shape argument exceeds the \
                         dimension count per profile in --dynamic_dims.",
                    ));
                };
                slices.push(slice.to_vec());
            } else {
                return Err(OptionError::new(
                    "E10046",
                    "The total number of -1 axes in the --input_shape argument is greater than \
                     the dimension count per profile in --dynamic_dims.",
                ));
            }
        }
        cursor += k;
        all.push(slices);
    }
    Ok(all)
}

/// `CalcShape`: the negative dims replaced left to right by the slice, whose length must equal
/// the number of negative dims. GE substitutes in place, so its message shows the shape as far
/// as the substitution got (`GeShape::ToString`, no brackets). The split of §3.1 always gives
/// an input as many values as it has negative dims, so the mismatch is a guard that option
/// strings cannot reach (in GE too).
fn calc_shape(slice: &[i64], dims: &[i64]) -> Result<Vec<i64>, OptionError> {
    let mismatch = |shape: &[i64]| {
        e19999(format!(
            "the batch shape count {}, does not match the data shape {}",
            slice.len(),
            ge_shape_str(shape)
        ))
    };
    let mut out = dims.to_vec();
    let mut values = slice.iter();
    for i in 0..out.len() {
        if out.get(i).is_some_and(|d| *d < 0) {
            let Some(v) = values.next() else {
                return Err(mismatch(&out));
            };
            if let Some(slot) = out.get_mut(i) {
                *slot = *v;
            }
        }
    }
    if values.next().is_some() {
        return Err(mismatch(&out));
    }
    Ok(out)
}

/// The max-gear choice (§3.3): the gear whose slice has the largest product (zeros skipped),
/// the first one on ties; all-zero or empty slices leave gear 0.
fn max_gear(slices: &[Vec<i64>]) -> Result<usize, OptionError> {
    let mut best = 0usize;
    let mut best_size = 0i64;
    for (i, slice) in slices.iter().enumerate() {
        let mut size = 1i64;
        for d in slice {
            if *d == 0 {
                continue;
            }
            let overflow = || {
                e19999(format!(
                    "The shape {} size will overflow after multi",
                    dims_str(slice)
                ))
            };
            // This is GE's test, which also rejects negative values.
            if i64::MAX / *d < size {
                return Err(overflow());
            }
            size = size.checked_mul(*d).ok_or_else(overflow)?;
        }
        if size > best_size {
            best_size = size;
            best = i;
        }
    }
    Ok(best)
}

/// Binds the gears to the graph's inputs (offline path): what GE does between parsing the
/// model with `--input_shape` and building the Case (§2.3 items 7–10, §3.1, §3.3). Run
/// [`check_gears`] first.
///
/// 1. Every `--input_shape` name must be a graph input: E10016, the code GE's parser reports
///    (`CheckInputShapeNode`) for a name that is not in the model. A name listed twice is
///    rejected with E10001 (a gearsim check; GE would silently bind the input twice).
/// 2. Each listed entry must have the input's rank and, wherever neither side is `-1`, the
///    model's dim: E10001 with the reason spelled out (modelled on GE's online
///    `CheckSequenceOfData`; offline GE silently replaces the model's shape).
/// 3. Inputs with unknown dims not listed (`CheckAndParseDynamicData`), in graph order: in
///    batch mode they must pass the batch shape check (E10018, or E10001 when axis 0 is known,
///    a case GE fails without an error code); in image size mode the image size shape check
///    with the tensor's own format, `Others` unless NCHW or NHWC (E10003, E10019); in dims mode
///    they are E10001 "All dynamic nodes must be set in --input_shape.". Accepted ones are
///    appended after the listed ones.
/// 4. `ParserDataToDynamicInfo` splits each gear among the inputs (E10045, E10046).
/// 5. No dynamic input at all in batch or image size mode: E10040.
/// 6. `CalcShape` gives each input's dims per gear, and its max gear is chosen (E19999 on a
///    mismatch or an overflow), input by input in graph order.
pub fn bind_inputs(p: &ParsedOptions, graph_inputs: &[GraphInput]) -> Result<Binding, OptionError> {
    let mut entries: Vec<Entry> = Vec::new();
    for input in &p.inputs {
        let Some(graph_index) = graph_inputs.iter().position(|g| g.name == input.name) else {
            return Err(OptionError::new(
                "E10016",
                format!(
                    "Opname {} specified in --input_shape is not found in the model. Confirm \
                     whether this node name exists, or the node is not split with the specified \
                     delimiter ';'.",
                    input.name
                ),
            ));
        };
        if entries.iter().any(|e| e.name == input.name) {
            return Err(e10001(
                &input.name,
                "--input_shape",
                "The input is listed more than once in --input_shape.",
            ));
        }
        entries.push(Entry {
            name: input.name.clone(),
            graph_index,
            from_input_shape: true,
            dims: input.dims.clone(),
        });
    }
    for e in &entries {
        let model = graph_inputs
            .get(e.graph_index)
            .map_or(&[][..], |g| g.dims.as_slice());
        if model.len() != e.dims.len() {
            return Err(e10001(
                &dims_str(&e.dims),
                "--input_shape",
                &format!(
                    "Input {} has the shape {} (rank {}) in the model, but --input_shape gives \
                     it {} dims.",
                    e.name,
                    dims_str(model),
                    model.len(),
                    e.dims.len()
                ),
            ));
        }
        for (axis, (user, known)) in e.dims.iter().zip(model).enumerate() {
            if *user != -1 && *known != -1 && user != known {
                return Err(e10001(
                    &dims_str(&e.dims),
                    "--input_shape",
                    &format!(
                        "Axis {axis} of input {} is {user} in --input_shape but {known} in the \
                         model (shape {}); only -1 axes may differ from the model.",
                        e.name,
                        dims_str(model)
                    ),
                ));
            }
        }
    }
    for (graph_index, g) in graph_inputs.iter().enumerate() {
        if entries.iter().any(|e| e.name == g.name) || g.dims.iter().all(|d| *d >= 0) {
            continue;
        }
        match p.mode {
            DynamicMode::Batch => {
                if !check_dynamic_batch_shape(&g.dims)? {
                    return Err(e10001(
                        &g.name,
                        "--input_shape",
                        &format!(
                            "Input {} has the shape {} in the model and is not set in \
                             --input_shape; with --dynamic_batch_size only axis 0 (the batch N) \
                             of such an input may be unknown.",
                            g.name,
                            dims_str(&g.dims)
                        ),
                    ));
                }
            }
            DynamicMode::ImageSize => {
                // GE names the tensor's format NCHW, NHWC or "Others" and reads H and W at
                // fixed positions without checking the rank (so a rank-5 NCHW input with -1 at
                // axes 2 and 3 passes). Where GE would read past the end, no axis is -1 here,
                // hence E10019.
                let format = match g.format {
                    Format::Nchw => "NCHW",
                    Format::Nhwc => "NHWC",
                    Format::Nd | Format::Nc1hwc0 => "Others",
                };
                check_dynamic_image_size_shape(&g.dims, format)?;
            }
            DynamicMode::Dims => {
                return Err(e10001(
                    &g.name,
                    "--dynamic_dims",
                    "All dynamic nodes must be set in --input_shape.",
                ));
            }
        }
        entries.push(Entry {
            name: g.name.clone(),
            graph_index,
            from_input_shape: false,
            dims: g.dims.clone(),
        });
    }
    let slices = split_gears(&p.gears, &entries)?;
    let dynamic_count = entries
        .iter()
        .filter(|e| e.dims.iter().any(|d| *d < 0))
        .count();
    if dynamic_count == 0 && p.mode != DynamicMode::Dims {
        return Err(e10040());
    }
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_by_key(|i| entries.get(*i).map_or(usize::MAX, |e| e.graph_index));
    let mut computed: Vec<Option<(Vec<Vec<i64>>, usize)>> = vec![None; entries.len()];
    for i in order {
        let (Some(e), Some(s)) = (entries.get(i), slices.get(i)) else {
            continue;
        };
        let per_gear = s
            .iter()
            .map(|slice| calc_shape(slice, &e.dims))
            .collect::<Result<Vec<_>, _>>()?;
        let max = max_gear(s)?;
        if let Some(slot) = computed.get_mut(i) {
            *slot = Some((per_gear, max));
        }
    }
    let inputs = entries
        .into_iter()
        .zip(slices)
        .zip(computed)
        .map(|((e, slices), c)| {
            let (per_gear_dims, max_gear) = c.unwrap_or_default();
            let unknown_dim_index = e
                .dims
                .iter()
                .enumerate()
                .filter(|(_, d)| **d == -1)
                .map(|(i, _)| i)
                .collect();
            BoundInput {
                name: e.name,
                graph_index: e.graph_index,
                from_input_shape: e.from_input_shape,
                user_dims: e.dims,
                slices,
                per_gear_dims,
                max_gear,
                unknown_dim_index,
            }
        })
        .collect();
    Ok(Binding {
        inputs,
        gears: p.gears.clone(),
    })
}
