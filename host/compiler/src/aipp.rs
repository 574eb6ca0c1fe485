//! atc's static AIPP (`--insert_op_conf`): image pre-processing done on the AI core in front of
//! the first layer. The configuration file (protobuf text, `aipp_op { key: value ... }`) is
//! parsed here; [`insert`] turns the model input it names into the uint8 image the camera or
//! decoder delivers (NHWC, `src_image_size_h × src_image_size_w`) and puts an `Aipp` node
//! between it and the network, which computes in the hardware's order (GE's AIPP documentation):
//!
//! ```text
//!   channel swap (rbuv_swap_switch) ─ crop (load_start_pos, crop_size) ─ colour-space
//!   conversion (csc_switch: y = ((M · (x − input_bias)) >> 8) + output_bias, clamped to a
//!   byte) ─ normalisation: (y − mean_chn − min_chn) · var_reci_chn ─ fp16 (or fp32) NCHW
//! ```
//!
//! Input formats: `RGB888_U8`, `XRGB8888_U8` (the X byte skipped) and `YUV400_U8`. Dynamic AIPP,
//! YUV420SP input, resizing, padding and rotation are refused with a message that says so.
//! The `Aipp` node carries everything as attributes ([`Params::of`]), so shape inference, the
//! reference evaluator and the kernel (`lower::aipp`) read one description.

use std::collections::BTreeMap;

use gearsim_isa::aipp::{self as isa_aipp, AippConfig};

use crate::ir::{Attr, DataType, Format, Graph, Node, NodeId, Tensor, TensorDesc, Value};
use crate::options::OptionError;
use crate::symbolic::Dim;

/// The operator type of the inserted node.
pub const OP: &str = "Aipp";

/// An AIPP input image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    /// Interleaved R, G, B bytes.
    Rgb888,
    /// Interleaved X, R, G, B bytes (X ignored).
    Xrgb8888,
    /// One luma byte per pixel.
    Yuv400,
}

impl InputFormat {
    const ALL: [InputFormat; 3] = [
        InputFormat::Rgb888,
        InputFormat::Xrgb8888,
        InputFormat::Yuv400,
    ];

    /// atc's spelling.
    pub fn name(self) -> &'static str {
        match self {
            InputFormat::Rgb888 => "RGB888_U8",
            InputFormat::Xrgb8888 => "XRGB8888_U8",
            InputFormat::Yuv400 => "YUV400_U8",
        }
    }

    fn parse(s: &str) -> Option<InputFormat> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }

    /// Bytes per source pixel.
    pub fn pixel_bytes(self) -> u64 {
        match self {
            InputFormat::Rgb888 => 3,
            InputFormat::Xrgb8888 => 4,
            InputFormat::Yuv400 => 1,
        }
    }

    /// Channels the network sees.
    pub fn channels(self) -> u64 {
        match self {
            InputFormat::Yuv400 => 1,
            _ => 3,
        }
    }

    /// Byte of a pixel that holds channel 0.
    pub fn first_byte(self) -> u64 {
        match self {
            InputFormat::Xrgb8888 => 1,
            _ => 0,
        }
    }
}

/// Colour-space conversion: `y_c = ((Σ_k matrix[c][k] · (x_k − input_bias_k)) >> 8) +
/// output_bias_c`, clamped to 0..=255.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Csc {
    /// `matrix_r<c>c<k>`.
    pub matrix: [[i64; 3]; 3],
    /// `input_bias_<k>`.
    pub input_bias: [i64; 3],
    /// `output_bias_<c>`.
    pub output_bias: [i64; 3],
}

/// One `aipp_op` block of the configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct AippOp {
    /// Line of the block's `aipp_op`.
    pub line: usize,
    /// `related_input_rank`: which model input (data inputs in order).
    pub rank: usize,
    /// `input_format`.
    pub format: InputFormat,
    /// `src_image_size_h`, `src_image_size_w` (0: the model input's).
    pub src: (u64, u64),
    /// `crop`.
    pub crop: bool,
    /// `load_start_pos_h`, `load_start_pos_w`.
    pub start: (u64, u64),
    /// `crop_size_h`, `crop_size_w` (0: the model input's).
    pub size: (u64, u64),
    /// `rbuv_swap_switch`.
    pub swap: bool,
    /// `csc_switch` with its matrix and biases.
    pub csc: Option<Csc>,
    /// `mean_chn_<c>` (integers), `min_chn_<c>`, `var_reci_chn_<c>`.
    pub mean: [f32; 3],
    /// See `mean`.
    pub min: [f32; 3],
    /// See `mean`.
    pub var_reci: [f32; 3],
}

/// The values of a configuration error: E10001 on `--insert_op_conf`, with the file and line.
fn bad(path: &str, line: usize, reason: impl std::fmt::Display) -> OptionError {
    OptionError {
        code: "E10001",
        message: format!(
            "Value {path} for parameter --insert_op_conf is invalid. Reason: line {line}: {reason}"
        ),
    }
}

/// A token of the protobuf text format, with its line.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Word(String),
    Open,
    Close,
    Colon,
}

fn tokens(text: &str, path: &str) -> Result<Vec<(Tok, usize)>, OptionError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let code = raw.split('#').next().unwrap_or("");
        let mut chars = code.char_indices().peekable();
        while let Some(&(at, c)) = chars.peek() {
            match c {
                c if c.is_whitespace() => {
                    chars.next();
                }
                '{' | '}' | ':' => {
                    chars.next();
                    out.push((
                        match c {
                            '{' => Tok::Open,
                            '}' => Tok::Close,
                            _ => Tok::Colon,
                        },
                        line,
                    ));
                }
                '"' => {
                    return Err(bad(
                        path,
                        line,
                        format!("a quoted value at column {}; values are bare words", at + 1),
                    ));
                }
                _ => {
                    let mut end = code.len();
                    while let Some(&(j, d)) = chars.peek() {
                        if d.is_whitespace() || matches!(d, '{' | '}' | ':' | '#') {
                            end = j;
                            break;
                        }
                        chars.next();
                    }
                    out.push((Tok::Word(code[at..end].to_string()), line));
                }
            }
        }
    }
    Ok(out)
}

/// Keys gearsim knows, by what it does with them.
const KEYS: &[&str] = &[
    "aipp_mode",
    "related_input_rank",
    "input_format",
    "src_image_size_w",
    "src_image_size_h",
    "crop",
    "load_start_pos_w",
    "load_start_pos_h",
    "crop_size_w",
    "crop_size_h",
    "csc_switch",
    "rbuv_swap_switch",
    "ax_swap_switch",
    "single_line_mode",
    "matrix_r0c0",
    "matrix_r0c1",
    "matrix_r0c2",
    "matrix_r1c0",
    "matrix_r1c1",
    "matrix_r1c2",
    "matrix_r2c0",
    "matrix_r2c1",
    "matrix_r2c2",
    "input_bias_0",
    "input_bias_1",
    "input_bias_2",
    "output_bias_0",
    "output_bias_1",
    "output_bias_2",
    "mean_chn_0",
    "mean_chn_1",
    "mean_chn_2",
    "mean_chn_3",
    "min_chn_0",
    "min_chn_1",
    "min_chn_2",
    "min_chn_3",
    "var_reci_chn_0",
    "var_reci_chn_1",
    "var_reci_chn_2",
    "var_reci_chn_3",
];

/// AIPP features gearsim does not model: accepted only at their off value.
const UNSUPPORTED: &[&str] = &[
    "resize",
    "resize_input_w",
    "resize_input_h",
    "resize_output_w",
    "resize_output_h",
    "padding",
    "left_padding_size",
    "right_padding_size",
    "top_padding_size",
    "bottom_padding_size",
    "padding_value",
    "max_src_image_size",
    "support_rotation",
];

/// Parses a configuration file's text (`path` names it in errors).
pub fn parse(text: &str, path: &str) -> Result<Vec<AippOp>, OptionError> {
    let toks = tokens(text, path)?;
    let mut ops = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let (tok, line) = &toks[i];
        match tok {
            Tok::Word(w) if w == "aipp_op" => {}
            other => {
                return Err(bad(
                    path,
                    *line,
                    format!("expected `aipp_op {{`, found {}", show(other)),
                ));
            }
        }
        let line = *line;
        if toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Open) {
            return Err(bad(path, line, "expected `{` after `aipp_op`"));
        }
        i += 2;
        let mut fields: BTreeMap<String, (String, usize)> = BTreeMap::new();
        loop {
            let Some((tok, at)) = toks.get(i) else {
                return Err(bad(
                    path,
                    line,
                    "the `aipp_op` block is not closed with `}`",
                ));
            };
            match tok {
                Tok::Close => {
                    i += 1;
                    break;
                }
                Tok::Word(key) => {
                    let value = match (toks.get(i + 1), toks.get(i + 2)) {
                        (Some((Tok::Colon, _)), Some((Tok::Word(v), _))) => v.clone(),
                        _ => {
                            return Err(bad(path, *at, format!("expected `{key}: value`")));
                        }
                    };
                    if !KEYS.contains(&key.as_str()) && !UNSUPPORTED.contains(&key.as_str()) {
                        return Err(bad(path, *at, format!("unknown field `{key}`")));
                    }
                    if fields.insert(key.clone(), (value, *at)).is_some() {
                        return Err(bad(path, *at, format!("field `{key}` is set twice")));
                    }
                    i += 3;
                }
                other => {
                    return Err(bad(
                        path,
                        *at,
                        format!("expected a field or `}}`, found {}", show(other)),
                    ));
                }
            }
        }
        ops.push(op_of(&fields, line, path)?);
    }
    if ops.is_empty() {
        return Err(bad(path, 1, "no `aipp_op` block"));
    }
    for (k, op) in ops.iter().enumerate() {
        if ops[..k].iter().any(|o| o.rank == op.rank) {
            return Err(bad(
                path,
                op.line,
                format!("a second aipp_op for related_input_rank {}", op.rank),
            ));
        }
    }
    Ok(ops)
}

fn show(t: &Tok) -> String {
    match t {
        Tok::Word(w) => format!("`{w}`"),
        Tok::Open => "`{`".into(),
        Tok::Close => "`}`".into(),
        Tok::Colon => "`:`".into(),
    }
}

/// One block's fields checked and typed.
fn op_of(
    fields: &BTreeMap<String, (String, usize)>,
    line: usize,
    path: &str,
) -> Result<AippOp, OptionError> {
    let int = |key: &str, lo: i64, hi: i64, default: i64| -> Result<i64, OptionError> {
        let Some((v, at)) = fields.get(key) else {
            return Ok(default);
        };
        let n: i64 = v
            .parse()
            .map_err(|_| bad(path, *at, format!("{key}: expected an integer, got `{v}`")))?;
        if !(lo..=hi).contains(&n) {
            return Err(bad(
                path,
                *at,
                format!("{key}: expected {lo}..={hi}, got {n}"),
            ));
        }
        Ok(n)
    };
    let flag = |key: &str| -> Result<bool, OptionError> {
        match fields.get(key) {
            None => Ok(false),
            Some((v, at)) => match v.as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(bad(
                    path,
                    *at,
                    format!("{key}: expected true or false, got `{v}`"),
                )),
            },
        }
    };
    let float = |key: &str, default: f32| -> Result<f32, OptionError> {
        let Some((v, at)) = fields.get(key) else {
            return Ok(default);
        };
        v.parse::<f32>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| bad(path, *at, format!("{key}: expected a number, got `{v}`")))
    };
    if let Some((mode, at)) = fields.get("aipp_mode") {
        match mode.as_str() {
            "static" => {}
            "dynamic" => {
                return Err(bad(
                    path,
                    *at,
                    "aipp_mode dynamic (parameters set per run with aclmdlSetInputAIPP) is not \
                     supported by gearsim; use static",
                ));
            }
            other => {
                return Err(bad(
                    path,
                    *at,
                    format!("aipp_mode: expected static or dynamic, got `{other}`"),
                ));
            }
        }
    }
    for key in UNSUPPORTED {
        if let Some((v, at)) = fields.get(*key)
            && !matches!(v.as_str(), "false" | "0")
        {
            return Err(bad(
                path,
                *at,
                format!("{key}: resizing, padding and rotation are not supported by gearsim"),
            ));
        }
    }
    for key in ["ax_swap_switch", "single_line_mode"] {
        if flag(key)? {
            let at = fields[key].1;
            return Err(bad(
                path,
                at,
                format!("{key}: true is not supported by gearsim"),
            ));
        }
    }
    let format = match fields.get("input_format") {
        None => return Err(bad(path, line, "input_format is required")),
        Some((v, at)) => InputFormat::parse(v).ok_or_else(|| {
            let known: Vec<&str> = InputFormat::ALL.iter().map(|f| f.name()).collect();
            let why = if v.starts_with("YUV420SP") || v.starts_with("YVU420SP") {
                format!(
                    "input_format {v} is not supported by gearsim (supported: {})",
                    known.join(", ")
                )
            } else {
                format!(
                    "input_format: expected one of {}, got `{v}`",
                    known.join(", ")
                )
            };
            bad(path, *at, why)
        })?,
    };
    let size = |key: &str| int(key, 0, 8192, 0).map(|v| v as u64);
    let csc = if flag("csc_switch")? {
        if format == InputFormat::Yuv400 {
            return Err(bad(
                path,
                line,
                "csc_switch needs three channels; YUV400_U8 has one",
            ));
        }
        let mut c = Csc {
            matrix: [[0; 3]; 3],
            input_bias: [0; 3],
            output_bias: [0; 3],
        };
        for r in 0..3 {
            for k in 0..3 {
                c.matrix[r][k] = int(&format!("matrix_r{r}c{k}"), -32768, 32767, 0)?;
            }
            c.input_bias[r] = int(&format!("input_bias_{r}"), 0, 255, 0)?;
            c.output_bias[r] = int(&format!("output_bias_{r}"), 0, 255, 0)?;
        }
        Some(c)
    } else {
        None
    };
    let mut mean = [0f32; 3];
    let mut min = [0f32; 3];
    let mut var_reci = [1f32; 3];
    for c in 0..3 {
        mean[c] = int(&format!("mean_chn_{c}"), 0, 255, 0)? as f32;
        min[c] = float(&format!("min_chn_{c}"), 0.0)?;
        var_reci[c] = float(&format!("var_reci_chn_{c}"), 1.0)?;
    }
    Ok(AippOp {
        line,
        rank: int("related_input_rank", 0, 1023, 0)? as usize,
        format,
        src: (size("src_image_size_h")?, size("src_image_size_w")?),
        crop: flag("crop")?,
        start: (size("load_start_pos_h")?, size("load_start_pos_w")?),
        size: (size("crop_size_h")?, size("crop_size_w")?),
        swap: flag("rbuv_swap_switch")?,
        csc,
        mean,
        min,
        var_reci,
    })
}

/// What the `Aipp` node computes, read back from its attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The source image format.
    pub format: InputFormat,
    /// Crop start row and column, crop height and width.
    pub crop: [u64; 4],
    /// R and B swapped.
    pub swap: bool,
    /// Colour-space conversion.
    pub csc: Option<Csc>,
    /// Per output channel.
    pub mean: Vec<f32>,
    /// Per output channel.
    pub min: Vec<f32>,
    /// Per output channel.
    pub var_reci: Vec<f32>,
}

impl Params {
    /// The node's parameters, or what is missing.
    pub fn of(node: &Node) -> Result<Params, String> {
        let format = node
            .string("input_format")
            .and_then(InputFormat::parse)
            .ok_or("an `input_format` attribute naming a supported format")?;
        let crop: [u64; 4] = node
            .ints("crop")
            .and_then(|c| <[i64; 4]>::try_from(c).ok())
            .filter(|c| c.iter().all(|v| *v >= 0) && c[2] > 0 && c[3] > 0)
            .map(|c| c.map(|v| v as u64))
            .ok_or("a `crop` attribute [h0, w0, height, width]")?;
        let floats = |name: &str| -> Result<Vec<f32>, String> {
            match node.attr(name) {
                Some(Attr::Floats(v)) if v.len() as u64 == format.channels() => Ok(v.clone()),
                _ => Err(format!(
                    "a `{name}` attribute with {} value(s)",
                    format.channels()
                )),
            }
        };
        let csc = match node.ints("csc") {
            None => None,
            Some(v) if v.len() == 15 => {
                let m = |r: usize| [v[3 * r], v[3 * r + 1], v[3 * r + 2]];
                Some(Csc {
                    matrix: [m(0), m(1), m(2)],
                    input_bias: [v[9], v[10], v[11]],
                    output_bias: [v[12], v[13], v[14]],
                })
            }
            Some(_) => return Err("a `csc` attribute of 15 integers".into()),
        };
        Ok(Params {
            format,
            crop,
            swap: node.int("swap").unwrap_or(0) != 0,
            csc,
            mean: floats("mean")?,
            min: floats("min")?,
            var_reci: floats("var_reci")?,
        })
    }

    /// The value of output channel `c` for the source bytes `x` of one pixel's channels (in
    /// the source's channel order), computed as the kernel does it in f32.
    pub fn pixel(&self, x: &[f32; 3], c: usize) -> f32 {
        self.config().channel(x, c)
    }

    /// The parameter block the AI core's AIPP unit reads (`gearsim_isa::aipp`), whose
    /// arithmetic [`Params::pixel`] is.
    pub fn config(&self) -> AippConfig {
        let per_channel = |v: &[f32]| {
            let mut out = [0f32; 4];
            for (o, x) in out.iter_mut().zip(v) {
                *o = *x;
            }
            out
        };
        AippConfig {
            channels: self.format.channels() as u32,
            first_byte: self.format.first_byte() as u32,
            swap: self.swap,
            csc: self.csc.map(|m| isa_aipp::Csc {
                matrix: m.matrix.map(|r| r.map(|v| v as i32)),
                input_bias: m.input_bias.map(|v| v as i32),
                output_bias: m.output_bias.map(|v| v as i32),
            }),
            mean: per_channel(&self.mean),
            min: per_channel(&self.min),
            var_reci: per_channel(&self.var_reci),
        }
    }
}

/// The `Aipp` node's attributes for `op` with its resolved crop [h0, w0, height, width].
fn node_attrs(op: &AippOp, crop: [u64; 4]) -> BTreeMap<String, Attr> {
    let c = op.format.channels() as usize;
    let mut attrs = BTreeMap::new();
    attrs.insert("input_format".into(), Attr::Str(op.format.name().into()));
    attrs.insert(
        "crop".into(),
        Attr::Ints(crop.iter().map(|v| *v as i64).collect()),
    );
    attrs.insert("swap".into(), Attr::Int(i64::from(op.swap)));
    if let Some(m) = &op.csc {
        let mut v: Vec<i64> = m.matrix.iter().flatten().copied().collect();
        v.extend(m.input_bias);
        v.extend(m.output_bias);
        attrs.insert("csc".into(), Attr::Ints(v));
    }
    attrs.insert("mean".into(), Attr::Floats(op.mean[..c].to_vec()));
    attrs.insert("min".into(), Attr::Floats(op.min[..c].to_vec()));
    attrs.insert("var_reci".into(), Attr::Floats(op.var_reci[..c].to_vec()));
    attrs
}

/// Puts an `Aipp` node behind every model input an `aipp_op` names: the input becomes the
/// uint8 NHWC image, the node gives the network what it read before. The inputs must have
/// static NCHW shapes with the format's channel count, and the crop must be the network's
/// input size (gearsim does not resize or pad).
pub fn insert(g: &mut Graph, ops: &[AippOp], path: &str) -> Result<(), OptionError> {
    for op in ops {
        // Looked up per block: each insertion moves the nodes after it.
        let data = g.of_type("Data");
        let Some(&id) = data.get(op.rank) else {
            return Err(bad(
                path,
                op.line,
                format!(
                    "related_input_rank {} but the model has {} input(s)",
                    op.rank,
                    data.len()
                ),
            ));
        };
        let input = g.node(id).name.clone();
        let desc = g.node(id).outputs[0].clone();
        let dims: Vec<i64> = desc.shape.iter().filter_map(Dim::fixed).collect();
        if dims.len() != 4 || desc.shape.len() != 4 || dims.iter().any(|d| *d <= 0) {
            return Err(bad(
                path,
                op.line,
                format!("input `{input}` must have a static 4-D NCHW shape for AIPP, it is {desc}"),
            ));
        }
        if desc.format == Format::Nhwc {
            return Err(bad(
                path,
                op.line,
                format!(
                    "input `{input}` is NHWC; gearsim applies AIPP to NCHW inputs only \
                     (--input_format)"
                ),
            ));
        }
        if !desc.dtype.is_float() {
            return Err(bad(
                path,
                op.line,
                format!("input `{input}` must be a float tensor for AIPP, it is {desc}"),
            ));
        }
        let (n, c, h, w) = (dims[0], dims[1] as u64, dims[2] as u64, dims[3] as u64);
        if c != op.format.channels() {
            return Err(bad(
                path,
                op.line,
                format!(
                    "input `{input}` has {c} channel(s); {} gives {}",
                    op.format.name(),
                    op.format.channels()
                ),
            ));
        }
        let src = (
            if op.src.0 == 0 { h } else { op.src.0 },
            if op.src.1 == 0 { w } else { op.src.1 },
        );
        let (start, size) = if op.crop {
            let size = (
                if op.size.0 == 0 { h } else { op.size.0 },
                if op.size.1 == 0 { w } else { op.size.1 },
            );
            (op.start, size)
        } else {
            ((0, 0), src)
        };
        if start.0 + size.0 > src.0 || start.1 + size.1 > src.1 {
            return Err(bad(
                path,
                op.line,
                format!(
                    "the crop ({}x{} from row {}, column {}) leaves the {}x{} source image",
                    size.0, size.1, start.0, start.1, src.0, src.1
                ),
            ));
        }
        if size != (h, w) {
            return Err(bad(
                path,
                op.line,
                format!(
                    "the AIPP output is {}x{} but input `{input}` is {h}x{w} (gearsim does not \
                     resize or pad: set the crop or the source size to the input's)",
                    size.0, size.1
                ),
            ));
        }
        let crop = [start.0, start.1, size.0, size.1];
        let attrs = node_attrs(op, crop);
        g.node_mut(id).outputs[0] = TensorDesc {
            dtype: DataType::U8,
            shape: [
                n,
                src.0 as i64,
                src.1 as i64,
                op.format.pixel_bytes() as i64,
            ]
            .iter()
            .map(|v| Dim::Fixed(*v))
            .collect(),
            format: Format::Nhwc,
        };
        insert_after(
            g,
            id,
            Node {
                name: format!("{input}_aipp"),
                op: OP.into(),
                inputs: vec![Some(Value {
                    node: id,
                    output: 0,
                })],
                outputs: vec![desc],
                attrs,
                control_inputs: Vec::new(),
                subgraphs: Vec::new(),
            },
        );
    }
    Ok(())
}

/// Puts `node` (which reads `at`'s output 0) right after `at` and moves every other reader of
/// that output onto `node`'s output.
fn insert_after(g: &mut Graph, at: NodeId, node: Node) {
    let old = std::mem::take(&mut g.nodes);
    let new_id = |i: u32| if i > at.0 { i + 1 } else { i };
    let inserted = NodeId(at.0 + 1);
    for (i, mut n) in old.into_iter().enumerate() {
        for v in n.inputs.iter_mut().flatten() {
            *v = if v.node == at && v.output == 0 {
                Value {
                    node: inserted,
                    output: 0,
                }
            } else {
                Value {
                    node: NodeId(new_id(v.node.0)),
                    output: v.output,
                }
            };
        }
        for c in &mut n.control_inputs {
            *c = NodeId(new_id(c.0));
        }
        g.nodes.push(n);
        if i as u32 == at.0 {
            g.nodes.push(node.clone());
        }
    }
}

/// The reference: the `Aipp` node on image `x` (u8 NHWC), giving `dtype` NCHW.
pub fn evaluate(node: &Node, x: &Tensor, dtype: DataType) -> Result<Tensor, String> {
    let p = Params::of(node)?;
    if x.dtype != DataType::U8 || x.dims.len() != 4 {
        return Err(format!(
            "an 8-bit NHWC image, got {:?} {:?}",
            x.dtype, x.dims
        ));
    }
    let (n, hs, ws, pb) = (x.dims[0], x.dims[1], x.dims[2], x.dims[3]);
    if pb as u64 != p.format.pixel_bytes() {
        return Err(format!(
            "{} bytes per pixel for {}, got {pb}",
            p.format.pixel_bytes(),
            p.format.name()
        ));
    }
    let [h0, w0, hc, wc] = p.crop;
    if h0 + hc > hs as u64 || w0 + wc > ws as u64 {
        return Err(format!("the crop {:?} leaves the {hs}x{ws} image", p.crop));
    }
    let c = p.format.channels() as usize;
    let conf = p.config();
    let mut out = Vec::with_capacity(n as usize * c * (hc * wc) as usize * dtype.size());
    let mut planes = vec![vec![0f32; (hc * wc) as usize]; c];
    for img in 0..n as u64 {
        for h in 0..hc {
            for w in 0..wc {
                let at = (((img * hs as u64 + h0 + h) * ws as u64 + w0 + w) * pb as u64
                    + p.format.first_byte()) as usize;
                let mut px = [0f32; 3];
                for (k, v) in px.iter_mut().enumerate().take(c) {
                    *v = f32::from(x.data[at + k]);
                }
                for (ch, plane) in planes.iter_mut().enumerate() {
                    plane[(h * wc + w) as usize] = conf.channel(&px, ch);
                }
            }
        }
        for plane in &planes {
            for v in plane {
                match dtype {
                    DataType::F16 => {
                        out.extend_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes())
                    }
                    _ => out.extend_from_slice(&v.to_le_bytes()),
                }
            }
        }
    }
    Tensor::new(dtype, vec![n, c as i64, hc as i64, wc as i64], out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calibration rows' configuration (a committed file of the host crate).
    const RESNET: &str = include_str!("../../src/calibrate/aipp_imagenet.cfg");

    #[test]
    fn parses_the_usual_imagenet_config() {
        let ops = parse(RESNET, "a.cfg").unwrap();
        assert_eq!(ops.len(), 1);
        let o = &ops[0];
        assert_eq!(o.format, InputFormat::Rgb888);
        assert_eq!((o.src, o.start, o.size), ((256, 256), (16, 16), (224, 224)));
        assert!(o.crop && !o.swap && o.csc.is_none());
        assert_eq!(o.min, [123.675, 116.28, 103.53]);
        assert_eq!(o.mean, [0.0; 3]);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let cases = [
            (
                "aipp_op { input_format: RGB888_U8 crop: yes }",
                "line 1: crop: expected true or false, got `yes`",
            ),
            (
                "aipp_op {\n input_format: RGB888_U8\n colour: 3 }",
                "line 3: unknown field `colour`",
            ),
            (
                "aipp_op { input_format: NV12 }",
                "input_format: expected one of",
            ),
            (
                "aipp_op { input_format: YUV420SP_U8 }",
                "not supported by gearsim",
            ),
            (
                "aipp_op { aipp_mode: dynamic input_format: RGB888_U8 }",
                "aipp_mode dynamic",
            ),
            (
                "aipp_op { input_format: RGB888_U8 resize: true }",
                "resizing, padding",
            ),
            ("aipp_op { crop: true }", "input_format is required"),
            ("aipp_op { input_format: RGB888_U8", "not closed"),
            ("aipp { }", "expected `aipp_op {`"),
            (
                "aipp_op { input_format: RGB888_U8 mean_chn_0: 300 }",
                "mean_chn_0: expected 0..=255, got 300",
            ),
            (
                "aipp_op { input_format: RGB888_U8 crop: true crop: false }",
                "set twice",
            ),
            ("", "no `aipp_op` block"),
        ];
        for (text, want) in cases {
            let e = parse(text, "my.cfg").unwrap_err();
            assert_eq!(e.code, "E10001", "{text}");
            assert!(e.message.contains("my.cfg"), "{}", e.message);
            assert!(e.message.contains(want), "{text}: {}", e.message);
        }
    }

    #[test]
    fn csc_follows_the_integer_formula() {
        // BT.601 wide YUV -> RGB (JPEG), for one pixel, against integer arithmetic.
        let text = "aipp_op { input_format: RGB888_U8 csc_switch: true
            matrix_r0c0: 256 matrix_r0c1: 0 matrix_r0c2: 359
            matrix_r1c0: 256 matrix_r1c1: -88 matrix_r1c2: -183
            matrix_r2c0: 256 matrix_r2c1: 454 matrix_r2c2: 0
            input_bias_0: 0 input_bias_1: 128 input_bias_2: 128 }";
        let op = &parse(text, "c.cfg").unwrap()[0];
        let p = Params {
            format: op.format,
            crop: [0, 0, 1, 1],
            swap: false,
            csc: op.csc,
            mean: vec![0.0; 3],
            min: vec![0.0; 3],
            var_reci: vec![1.0; 3],
        };
        let m = op.csc.unwrap();
        for (y, u, v) in [
            (0, 0, 0),
            (255, 255, 255),
            (81, 90, 240),
            (145, 54, 34),
            (16, 128, 128),
        ] {
            let x = [y as f32, u as f32, v as f32];
            for c in 0..3 {
                let xi = [y, u, v];
                let acc: i64 = (0..3)
                    .map(|k| m.matrix[c][k] * (xi[k] - m.input_bias[k]))
                    .sum();
                let want = ((acc >> 8) + m.output_bias[c]).clamp(0, 255) as f32;
                assert_eq!(p.pixel(&x, c), want, "yuv {y},{u},{v} channel {c}");
            }
        }
    }
}
