//! Resize (opsets 11 to 19): the output size and, per resized axis, which input rows each
//! output row reads and with what weights — computed once here for shape inference, the
//! evaluator and the device lowering.
//!
//! Resize is separable: an N-D resize is one 1-D resize per axis, each output row along the
//! axis a weighted sum of a few input rows ([`AxisPass`]). The coordinate transformations,
//! the nearest rounding modes, the linear and cubic kernels (with antialiasing and
//! `exclude_outside`) and the tap selection follow the ONNX operator definition and its
//! reference implementation, in f64.
//!
//! ```text
//!   output index y ─coordinate mode─▶ x in the input ─kernel─▶ taps (index, weight) per y
//! ```

use super::super::infer::{OpCtx, OpDef, OpError};
use super::super::ir::{DataType, Tensor, TensorDesc};
use super::super::symbolic::Dim;
use super::{FLOATS, Src, attr_flag, attr_float, attr_ints, attr_str, norm_axes, opt_input};

/// The Resize definition: X, then roi, scales and sizes known at compile time.
pub(super) fn defs() -> Vec<OpDef> {
    vec![OpDef {
        op: "Resize",
        min_inputs: 1,
        max_inputs: 4,
        verify: verify_resize,
        infer: infer_resize,
        fold: None,
        // Output sizes and sampling positions are compiled into the kernels.
        static_inputs: &[1, 2, 3],
    }]
}

/// Interpolation mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeMode {
    /// The nearest input element.
    Nearest,
    /// Linear interpolation (two taps, more with antialiasing).
    Linear,
    /// Cubic convolution (four taps, more with antialiasing).
    Cubic,
}

/// Everything Resize's attributes and parameter inputs say, before the input dims are known.
#[derive(Debug, Clone)]
pub struct ResizeSpec {
    /// The interpolation.
    pub mode: ResizeMode,
    coordinate: String,
    nearest: String,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
    policy: String,
    /// Value written where `tf_crop_and_resize` samples outside the input.
    pub extrapolation: f64,
    /// The resized axes, in the order given.
    axes: Vec<usize>,
    /// Per axis of `axes`: the scale, or the size.
    scales: Option<Vec<f64>>,
    sizes: Option<Vec<i64>>,
    /// Per axis of `axes`: the region's start and end (normalised).
    roi: Option<Vec<(f64, f64)>>,
}

/// One 1-D resize along `axis`: output row `y` is `sum_k weight[y*taps+k] *
/// input[index[y*taps+k]]` (indices already clamped into the input), or `extrapolation` where
/// `extrapolated[y]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisPass {
    /// The axis.
    pub axis: usize,
    /// Input length along it.
    pub input: usize,
    /// Output length along it.
    pub output: usize,
    /// Taps per output row.
    pub taps: usize,
    /// Input row of each tap.
    pub index: Vec<usize>,
    /// Weight of each tap.
    pub weight: Vec<f64>,
    /// Output rows that take the extrapolation value instead (`tf_crop_and_resize`).
    pub extrapolated: Vec<bool>,
}

impl AxisPass {
    /// Whether every output row copies one input row (a gather): one tap of weight 1 (after
    /// zero-weight taps are dropped) and nothing extrapolated. A row whose taps all weigh 0
    /// is a row of zeros, given as index `input` (one past the last input row).
    pub fn copy_rows(&self) -> Option<Vec<usize>> {
        if self.extrapolated.iter().any(|e| *e) {
            return None;
        }
        (0..self.output)
            .map(|y| {
                let taps = &self.weight[y * self.taps..(y + 1) * self.taps];
                let live: Vec<usize> = (0..self.taps).filter(|k| taps[*k] != 0.0).collect();
                match live[..] {
                    [] => Some(self.input),
                    [k] if taps[k] == 1.0 => Some(self.index[y * self.taps + k]),
                    _ => None,
                }
            })
            .collect()
    }
}

/// Most taps one axis's tables may hold (16 Mi entries of an index and a weight).
const MAX_TAPS: usize = 1 << 24;

const COORDINATE_MODES: [&str; 6] = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
];
const NEAREST_MODES: [&str; 4] = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"];
const POLICIES: [&str; 3] = ["stretch", "not_larger", "not_smaller"];

/// A string attribute that must be one of `allowed`.
fn one_of(ctx: &OpCtx<'_>, name: &str, default: &str, allowed: &[&str]) -> Result<String, OpError> {
    let v = attr_str(ctx, name, default)?;
    if allowed.contains(&v.as_str()) {
        Ok(v)
    } else {
        Err(OpError::attr(
            name,
            format!("one of {}", allowed.join(", ")),
            format!("{v:?}"),
            "use a value the ONNX operator definition lists",
        ))
    }
}

/// An optional parameter input: absent, or present but empty, is `None`.
fn param<'a>(ctx: &OpCtx<'a>, i: usize) -> Result<Option<&'a Tensor>, OpError> {
    let Some(d) = opt_input(ctx, i) else {
        return Ok(None);
    };
    if d.shape.iter().any(|s| s.fixed() == Some(0)) {
        return Ok(None);
    }
    ctx.value(i).map(Some)
}

impl ResizeSpec {
    /// Parses the attributes and the parameter inputs (whose values must be known).
    pub fn parse(ctx: &OpCtx<'_>) -> Result<ResizeSpec, OpError> {
        let x = ctx.input(0)?;
        let rank = x.shape.len();
        let mode = match one_of(ctx, "mode", "nearest", &["nearest", "linear", "cubic"])?.as_str() {
            "linear" => ResizeMode::Linear,
            "cubic" => ResizeMode::Cubic,
            _ => ResizeMode::Nearest,
        };
        let antialias = attr_flag(ctx, "antialias", false)?;
        if antialias && mode == ResizeMode::Nearest {
            return Err(OpError::attr(
                "antialias",
                "0 with mode \"nearest\" (antialiasing filters linear and cubic resizes only)",
                "1",
                "set antialias to 0 or use mode linear or cubic",
            ));
        }
        let axes = match attr_ints(ctx, "axes")? {
            None => (0..rank).collect(),
            Some(a) => norm_axes(Src::Attr("axes"), &a, rank)?,
        };
        let n = axes.len();
        let scales = param(ctx, 2)?;
        let sizes = param(ctx, 3)?;
        let (scales, sizes) = match (scales, sizes) {
            (Some(_), Some(_)) => {
                return Err(OpError::input(
                    3,
                    "no sizes when scales are given (exactly one of the two)",
                    "both scales and sizes",
                    "give either scales or sizes, the other empty or absent",
                ));
            }
            (None, None) => {
                return Err(OpError::input(
                    2,
                    "scales or sizes",
                    "neither",
                    "give the scales (input 2) or the output sizes (input 3)",
                ));
            }
            (Some(s), None) => {
                let v = s.to_f64s();
                if v.len() != n || v.iter().any(|s| !(s.is_finite() && *s > 0.0)) {
                    return Err(OpError::input(
                        2,
                        format!("{n} positive finite scale(s), one per resized axis"),
                        format!("{v:?}"),
                        "give one positive scale per axis",
                    ));
                }
                (Some(v), None)
            }
            (None, Some(s)) => {
                let v = s.to_i64s();
                if v.len() != n || v.iter().any(|s| *s <= 0) {
                    return Err(OpError::input(
                        3,
                        format!("{n} positive size(s), one per resized axis"),
                        format!("{v:?}"),
                        "give one positive size per axis",
                    ));
                }
                (None, Some(v))
            }
        };
        let coordinate = one_of(
            ctx,
            "coordinate_transformation_mode",
            "half_pixel",
            &COORDINATE_MODES,
        )?;
        let roi = if coordinate == "tf_crop_and_resize" {
            let t = param(ctx, 1)?.ok_or_else(|| {
                OpError::input(
                    1,
                    "a region of interest (tf_crop_and_resize crops it)",
                    "none",
                    "give roi as [starts..., ends...]",
                )
            })?;
            let v = t.to_f64s();
            let pairs = if v.len() == 2 * n {
                (0..n).map(|i| (v[i], v[n + i])).collect()
            } else if v.len() == 2 * rank {
                axes.iter().map(|a| (v[*a], v[rank + *a])).collect()
            } else {
                return Err(OpError::input(
                    1,
                    format!("{} values (starts then ends of the resized axes)", 2 * n),
                    format!("{}", v.len()),
                    "give a start and an end per resized axis",
                ));
            };
            Some(pairs)
        } else {
            None
        };
        Ok(ResizeSpec {
            mode,
            coordinate,
            nearest: one_of(ctx, "nearest_mode", "round_prefer_floor", &NEAREST_MODES)?,
            cubic_a: f64::from(attr_float(ctx, "cubic_coeff_a", -0.75)?),
            exclude_outside: attr_flag(ctx, "exclude_outside", false)?,
            antialias,
            policy: one_of(ctx, "keep_aspect_ratio_policy", "stretch", &POLICIES)?,
            extrapolation: f64::from(attr_float(ctx, "extrapolation_value", 0.0)?),
            axes,
            scales,
            sizes,
            roi,
        })
    }

    /// Per resized axis (in `axes` order): the scale and the output length, given the
    /// input's length along each axis (`None` when not static; such an axis must keep its
    /// length).
    fn sizes_of(&self, dims: &[Option<i64>]) -> Result<Vec<(f64, Option<i64>)>, OpError> {
        let need = |a: usize| {
            dims[a].ok_or_else(|| {
                OpError::input(
                    0,
                    format!("a static length along resized axis {a}"),
                    "a symbolic one",
                    "resize only axes whose length is the same in every gear",
                )
            })
        };
        if let Some(scales) = &self.scales {
            return self
                .axes
                .iter()
                .zip(scales)
                .map(|(a, s)| {
                    if *s == 1.0 {
                        return Ok((1.0, dims[*a]));
                    }
                    // numpy's `astype(int)` of the product: truncation.
                    Ok((*s, Some((s * need(*a)? as f64) as i64)))
                })
                .collect();
        }
        let sizes = self.sizes.as_deref().unwrap_or_default();
        let mut scales = Vec::with_capacity(sizes.len());
        for (a, s) in self.axes.iter().zip(sizes) {
            scales.push(*s as f64 / need(*a)? as f64);
        }
        if self.policy == "stretch" {
            return Ok(scales
                .into_iter()
                .zip(sizes.iter().map(|s| Some(*s)))
                .collect());
        }
        let pick = if self.policy == "not_larger" {
            scales.iter().copied().fold(f64::INFINITY, f64::min)
        } else {
            scales.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        };
        self.axes
            .iter()
            .map(|a| Ok((pick, Some((pick * need(*a)? as f64 + 0.5) as i64))))
            .collect()
    }

    /// The output shape for an input shape.
    pub fn output_shape(&self, shape: &[Dim]) -> Result<Vec<Dim>, OpError> {
        let dims: Vec<Option<i64>> = shape.iter().map(Dim::fixed).collect();
        let mut out = shape.to_vec();
        for (a, (_, len)) in self.axes.iter().zip(self.sizes_of(&dims)?) {
            if let Some(len) = len {
                if len <= 0 {
                    return Err(OpError::input(
                        0,
                        format!("a positive output length along axis {a}"),
                        len.to_string(),
                        "use scales that leave at least one element",
                    ));
                }
                out[*a] = Dim::Fixed(len);
            }
        }
        Ok(out)
    }

    /// The 1-D passes for static input dims, skipping axes the resize leaves as they are.
    pub fn passes(&self, dims: &[i64]) -> Result<Vec<AxisPass>, OpError> {
        let known: Vec<Option<i64>> = dims.iter().map(|d| Some(*d)).collect();
        let sizes = self.sizes_of(&known)?;
        let mut passes = Vec::new();
        for (i, (&axis, (scale, len))) in self.axes.iter().zip(sizes).enumerate() {
            let input = dims[axis] as usize;
            let output = len.unwrap_or(dims[axis]) as usize;
            let roi = self.roi.as_ref().map(|r| r[i]);
            let identity = (scale - 1.0).abs() <= 1e-9
                && output == input
                && roi.is_none_or(|(s, e)| s.abs() <= 1e-9 && (e - 1.0).abs() <= 1e-9);
            if identity || output == 0 {
                continue;
            }
            // The tables hold a tap per output row and kernel position: refuse sizes that
            // would make them unreasonably large (or take unbounded time to build).
            let taps = self.coefficients(0.5, scale).len();
            if output.saturating_mul(taps) > MAX_TAPS {
                return Err(OpError::input(
                    0,
                    format!("at most {MAX_TAPS} taps (output length x taps per row) per axis"),
                    format!("{output} x {taps} along axis {axis}"),
                    "resize to a smaller size, or downscale in several steps",
                ));
            }
            passes.push(self.pass(axis, input, output, scale, roi));
        }
        Ok(passes)
    }

    /// The taps of one axis.
    fn pass(
        &self,
        axis: usize,
        input: usize,
        output: usize,
        scale: f64,
        roi: Option<(f64, f64)>,
    ) -> AxisPass {
        let width = scale * input as f64;
        let last = (input - 1) as f64;
        let mut index = Vec::new();
        let mut weight = Vec::new();
        let mut extrapolated = Vec::with_capacity(output);
        let mut taps = 0;
        for y in 0..output {
            let yf = y as f64;
            let (x, outside) = match self.coordinate.as_str() {
                "align_corners" if width == 1.0 => (0.0, false),
                "align_corners" => (yf * last / (width - 1.0), false),
                "asymmetric" => (yf / scale, false),
                "tf_crop_and_resize" => {
                    let (s, e) = roi.unwrap_or((0.0, 1.0));
                    let x = if width == 1.0 {
                        (e - s) * last / 2.0
                    } else {
                        yf * (e - s) * last / (width - 1.0)
                    } + s * last;
                    (x, x < 0.0 || x > last)
                }
                "pytorch_half_pixel" if width == 1.0 => (-0.5, false),
                "half_pixel_symmetric" => {
                    let adjustment = output as f64 / width;
                    let center = input as f64 / 2.0;
                    (
                        center * (1.0 - adjustment) + (yf + 0.5) / scale - 0.5,
                        false,
                    )
                }
                _ => ((yf + 0.5) / scale - 0.5, false),
            };
            let ratio = if x == x.floor() { 1.0 } else { x - x.floor() };
            let mut coeffs = self.coefficients(ratio, scale);
            let n = coeffs.len();
            taps = n;
            // The n taps nearest to x, ties to the smaller index (the reference's window).
            let pad = n.div_ceil(2) as f64;
            let xp = x + pad;
            let p = xp.floor();
            let frac = xp - p;
            let half = (n / 2) as f64;
            let offset = if n.is_multiple_of(2) {
                if frac == 0.0 { -half } else { -half + 1.0 }
            } else {
                let base = -(((n - 1) / 2) as f64);
                if frac <= 0.5 { base } else { base + 1.0 }
            };
            let start = p + offset - pad;
            let idx: Vec<i64> = (0..n).map(|k| start as i64 + k as i64).collect();
            if self.exclude_outside {
                for (c, i) in coeffs.iter_mut().zip(&idx) {
                    if *i < 0 || *i >= input as i64 {
                        *c = 0.0;
                    }
                }
                let sum: f64 = coeffs.iter().sum();
                let sum = if sum == 0.0 { 1.0 } else { sum };
                for c in &mut coeffs {
                    *c /= sum;
                }
            }
            index.extend(idx.iter().map(|i| (*i).clamp(0, input as i64 - 1) as usize));
            weight.extend(coeffs);
            extrapolated.push(outside);
        }
        AxisPass {
            axis,
            input,
            output,
            taps,
            index,
            weight,
            extrapolated,
        }
    }

    /// The kernel's weights for a position `ratio` in (0, 1] past the tap left of it.
    fn coefficients(&self, ratio: f64, scale: f64) -> Vec<f64> {
        let a = self.cubic_a;
        match (self.mode, self.antialias) {
            (ResizeMode::Nearest, _) => {
                let right = match self.nearest.as_str() {
                    _ if ratio == 1.0 => true,
                    "round_prefer_ceil" => ratio >= 0.5,
                    "floor" => false,
                    "ceil" => true,
                    _ => ratio > 0.5,
                };
                vec![f64::from(u8::from(!right)), f64::from(u8::from(right))]
            }
            (ResizeMode::Linear, false) => vec![1.0 - ratio, ratio],
            (ResizeMode::Linear, true) => {
                let s = scale.min(1.0);
                let start = (-1.0 / s).floor() as i64 + 1;
                let footprint = 2 - 2 * start;
                let c: Vec<f64> = (start..start + footprint)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect();
                normalised(c)
            }
            (ResizeMode::Cubic, false) => {
                let r = ratio;
                let q = 1.0 - ratio;
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
            (ResizeMode::Cubic, true) => {
                let s = scale.min(1.0);
                let start = (-2.0 / s).floor() as i64 + 1;
                let end = 2 - start;
                let c: Vec<f64> = (start..end)
                    .map(|i| {
                        let x = (s * (i as f64 - ratio)).abs();
                        if x <= 1.0 {
                            (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
                        } else if x < 2.0 {
                            a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                        } else {
                            0.0
                        }
                    })
                    .collect();
                normalised(c)
            }
        }
    }
}

fn normalised(c: Vec<f64>) -> Vec<f64> {
    let sum: f64 = c.iter().sum();
    c.into_iter().map(|v| v / sum).collect()
}

/// Every pass of a resize applied on the host in f64 (row-major `data` of `dims`); returns
/// the values and the output dims.
pub fn resize_values(
    data: &[f64],
    dims: &[i64],
    passes: &[AxisPass],
    extrapolation: f64,
) -> (Vec<f64>, Vec<i64>) {
    let mut cur = data.to_vec();
    let mut dims = dims.to_vec();
    for p in passes {
        let outer: usize = dims[..p.axis].iter().product::<i64>() as usize;
        let inner: usize = dims[p.axis + 1..].iter().product::<i64>() as usize;
        let mut next = vec![0.0; outer * p.output * inner];
        for o in 0..outer {
            for y in 0..p.output {
                let dst = (o * p.output + y) * inner;
                if p.extrapolated[y] {
                    next[dst..dst + inner].fill(extrapolation);
                    continue;
                }
                for k in 0..p.taps {
                    let w = p.weight[y * p.taps + k];
                    let src = (o * p.input + p.index[y * p.taps + k]) * inner;
                    for i in 0..inner {
                        next[dst + i] += w * cur[src + i];
                    }
                }
            }
        }
        cur = next;
        dims[p.axis] = p.output as i64;
    }
    (cur, dims)
}

fn verify_resize(ctx: &OpCtx<'_>) -> Result<(), OpError> {
    infer_resize(ctx).map(|_| ())
}

fn infer_resize(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    let spec = ResizeSpec::parse(ctx)?;
    if spec.mode != ResizeMode::Nearest && !FLOATS.contains(&x.dtype) {
        return Err(OpError::input(
            0,
            "a float tensor (linear and cubic resizes interpolate; nearest moves any type)",
            x.dtype.name(),
            "cast the input to float32 first",
        ));
    }
    if let Some(d) = opt_input(ctx, 3).filter(|_| spec.sizes.is_some())
        && d.dtype != DataType::I64
    {
        return Err(OpError::input(
            3,
            "int64 sizes",
            d.dtype.name(),
            "give sizes as int64",
        ));
    }
    Ok(vec![TensorDesc::new(x.dtype, spec.output_shape(&x.shape)?)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass_of(mode: ResizeMode, coordinate: &str, input: usize, output: usize) -> AxisPass {
        pass_spec(mode, coordinate, output)
            .passes(&[input as i64])
            .unwrap()
            .remove(0)
    }

    fn pass_spec(mode: ResizeMode, coordinate: &str, output: usize) -> ResizeSpec {
        ResizeSpec {
            mode,
            coordinate: coordinate.into(),
            nearest: "round_prefer_floor".into(),
            cubic_a: -0.75,
            exclude_outside: false,
            antialias: false,
            policy: "stretch".into(),
            extrapolation: 0.0,
            axes: vec![0],
            scales: None,
            sizes: Some(vec![output as i64]),
            roi: None,
        }
    }

    #[test]
    fn nearest_doubling_repeats_every_row() {
        let p = pass_of(ResizeMode::Nearest, "asymmetric", 3, 6);
        assert_eq!(p.copy_rows(), Some(vec![0, 0, 1, 1, 2, 2]));
    }

    #[test]
    fn a_row_of_zero_weights_copies_the_zero_row() {
        let p = AxisPass {
            axis: 0,
            input: 2,
            output: 3,
            taps: 1,
            index: vec![0, 0, 1],
            weight: vec![1.0, 0.0, 1.0],
            extrapolated: vec![false; 3],
        };
        assert_eq!(p.copy_rows(), Some(vec![0, 2, 1]));
    }

    #[test]
    fn linear_half_pixel_doubling_mixes_neighbours_by_quarters() {
        let p = pass_of(ResizeMode::Linear, "half_pixel", 2, 4);
        // y = 1 samples x = 0.25: rows 0 and 1 with weights 0.75 and 0.25.
        assert_eq!(&p.index[2..4], &[0, 1]);
        assert_eq!(&p.weight[2..4], &[0.75, 0.25]);
        assert!(p.copy_rows().is_none());
        let (v, dims) = resize_values(&[1.0, 3.0], &[2], &[p], 0.0);
        assert_eq!(dims, vec![4]);
        assert_eq!(v, vec![1.0, 1.5, 2.5, 3.0]);
    }

    #[test]
    fn a_huge_output_is_refused_before_any_table_is_built() {
        let mut spec = pass_spec(ResizeMode::Linear, "half_pixel", 2_000_000_000);
        let e = spec.passes(&[2]).unwrap_err();
        assert!(e.got.contains("2000000000 x 2"), "{e:?}");
        // An extreme antialiased downscale has as many taps per row as the scale's inverse.
        spec.antialias = true;
        spec.sizes = Some(vec![1]);
        assert!(spec.passes(&[1 << 25]).is_err());
    }

    #[test]
    fn cubic_weights_sum_to_one() {
        let p = pass_of(ResizeMode::Cubic, "align_corners", 5, 8);
        for y in 0..p.output {
            let s: f64 = p.weight[y * 4..y * 4 + 4].iter().sum();
            assert!((s - 1.0).abs() < 1e-12, "row {y}: {s}");
        }
    }
}
