//! Pad-to-gear execution, as vLLM pads a batch up to its next CUDA-graph size: a request whose
//! batch lies between two gears of a dynamic-batch model is padded with zero rows up to the
//! next larger gear, runs on that branch, and its outputs are cut back to the request's rows.
//!
//! That is only right when the model's rows are independent and every output follows the
//! batch, which [`check`] shows on the device before the first padded run: the first gear's
//! rows, run alone and as the first rows of the second gear, must give the same output rows
//! (within [`PAD_RTOL`]: two branches tile differently, which moves f16 rounding, not values).
//! A model that fails is refused with the reason, never run padded.

use gearsim_isa::om::{ModelDesc, OmFile};
use gearsim_isa::tensor::Tensor;
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::NullSink;

use crate::inputs::{self, Fill, GearChoice};
use crate::runtime::session::data_inputs;
use crate::runtime::{Runtime, RuntimeOptions};

/// Relative tolerance of the padding check, of the largest magnitude of an output.
pub const PAD_RTOL: f64 = 1e-2;

/// The padding check's finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PadCheck {
    /// Whether requests may be padded up to a larger batch.
    pub allowed: bool,
    /// Why (or why not), for the report.
    pub reason: String,
}

/// A request padded up to a gear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    /// The request's batch.
    pub from: i64,
    /// The gear's batch it runs at.
    pub to: i64,
    /// That gear's index.
    pub gear: usize,
}

impl Padding {
    /// The share of the gear's rows that are padding.
    pub fn wasted(&self) -> f64 {
        1.0 - self.from as f64 / self.to as f64
    }

    /// `batch 3 -> gear 2 (batch 4), 25.0% of its rows padding`.
    pub fn text(&self) -> String {
        format!(
            "batch {} -> gear {} (batch {}), {:.1}% of its rows padding",
            self.from,
            self.gear,
            self.to,
            100.0 * self.wasted()
        )
    }
}

/// The axis each data input's batch is on (its `-1`), or an error naming an input without one.
fn batch_axes(desc: &ModelDesc) -> Result<Vec<usize>, String> {
    desc.inputs[..data_inputs(desc)]
        .iter()
        .map(|io| {
            io.dims.iter().position(|d| *d == -1).ok_or_else(|| {
                format!(
                    "input `{}` ([{}]) has no batch axis to pad",
                    io.name,
                    join(&io.dims)
                )
            })
        })
        .collect()
}

fn join(v: &[i64]) -> String {
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

/// The gears' batches, in gear order; an error for a model without dynamic batch.
fn batches(desc: &ModelDesc) -> Result<Vec<i64>, String> {
    match desc.dynamic.as_ref() {
        Some(d) if d.mode == 1 => Ok(d.gears.iter().map(|g| g[0]).collect()),
        _ => Err(format!(
            "pad-to-gear pads the batch: model `{}` has no dynamic batch (compile it with \
             --dynamic_batch_size)",
            desc.name
        )),
    }
}

/// How `inputs` would run padded: `None` when their batch is a gear, the padding when a larger
/// gear exists, an error when none does or the inputs disagree on the batch.
pub fn plan(desc: &ModelDesc, inputs: &[Tensor]) -> Result<Option<Padding>, String> {
    let gears = batches(desc)?;
    let axes = batch_axes(desc)?;
    let mut batch = None;
    for ((t, axis), io) in inputs.iter().zip(&axes).zip(&desc.inputs) {
        let b = *t.dims.get(*axis).ok_or_else(|| {
            format!(
                "input `{}` has rank {}, the model's is {}",
                io.name,
                t.dims.len(),
                io.dims.len()
            )
        })?;
        match batch {
            None => batch = Some(b),
            Some(first) if first != b => {
                return Err(format!(
                    "the inputs disagree on the batch: {first} and {b} (input `{}`)",
                    io.name
                ));
            }
            Some(_) => {}
        }
    }
    let Some(b) = batch else {
        return Ok(None);
    };
    if gears.contains(&b) {
        return Ok(None);
    }
    let next = gears
        .iter()
        .enumerate()
        .filter(|(_, g)| **g > b)
        .min_by_key(|(_, g)| **g);
    match next {
        Some((gear, &to)) if b > 0 => Ok(Some(Padding { from: b, to, gear })),
        _ => Err(format!(
            "batch {b} is larger than every gear ({}): there is no gear to pad it up to",
            join(&gears)
        )),
    }
}

/// `t` with `n` rows along `axis`: its first `n` rows, then zero rows up to `n`.
fn rows(t: &Tensor, axis: usize, n: i64) -> Result<Tensor, String> {
    let have = t.dims[axis];
    let outer: i64 = t.dims[..axis].iter().product();
    let inner = t.dims[axis + 1..].iter().product::<i64>() as usize * t.dtype.size();
    let mut data = Vec::with_capacity(outer as usize * n as usize * inner);
    for o in 0..outer as usize {
        let block = &t.data[o * have as usize * inner..(o + 1) * have as usize * inner];
        let keep = have.min(n) as usize * inner;
        data.extend_from_slice(&block[..keep]);
        data.resize(data.len() + (n as usize * inner - keep), 0);
    }
    let mut dims = t.dims.clone();
    dims[axis] = n;
    Tensor::new(t.dtype, dims, data)
}

/// The inputs padded with zero rows up to `p.to`.
pub fn pad(desc: &ModelDesc, inputs: &[Tensor], p: &Padding) -> Result<Vec<Tensor>, String> {
    let axes = batch_axes(desc)?;
    inputs
        .iter()
        .zip(axes)
        .map(|(t, axis)| rows(t, axis, p.to))
        .collect()
}

/// The outputs of the padded run cut back to the request's rows (every output's batch is on
/// axis 0, which [`check`] makes sure of).
pub fn trim(outputs: &[Tensor], p: &Padding) -> Result<Vec<Tensor>, String> {
    outputs.iter().map(|t| rows(t, 0, p.from)).collect()
}

/// Compares the outputs of a run at batch `big` with one of its first `small` rows: whether
/// every output follows the batch on axis 0 and its first rows agree (`names` name them).
pub fn compare_rows(names: &[String], big: &[Tensor], small: &[Tensor], b: i64) -> PadCheck {
    for (k, (yb, ys)) in big.iter().zip(small).enumerate() {
        let name = names.get(k).map_or("?", String::as_str);
        let bb = yb.dims.first().copied().unwrap_or(0);
        if ys.dims.first() != Some(&b) || bb <= b || yb.dims[1..] != ys.dims[1..] {
            return PadCheck {
                allowed: false,
                reason: format!(
                    "output `{name}` does not follow the batch (shape [{}] at batch {bb}, [{}] \
                     at batch {b})",
                    join(&yb.dims),
                    join(&ys.dims)
                ),
            };
        }
        let (vb, vs) = (yb.to_f64s(), ys.to_f64s());
        let scale = vs.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
        // A NaN on one side only is a difference; NaN on both is agreement.
        let worst = vs
            .iter()
            .zip(&vb)
            .map(|(s, l)| match (s.is_nan(), l.is_nan()) {
                (false, false) => (s - l).abs(),
                (true, true) => 0.0,
                _ => f64::INFINITY,
            })
            .fold(0f64, f64::max);
        if worst > PAD_RTOL * scale {
            return PadCheck {
                allowed: false,
                reason: format!(
                    "output `{name}`'s first {b} row(s) change by {worst:.3e} (of {scale:.3e}) \
                     when rows are added: the model mixes rows of the batch"
                ),
            };
        }
    }
    PadCheck {
        allowed: true,
        reason: format!("rows are independent: the first {b} output row(s) agree"),
    }
}

/// The padding check of the model in `file` on chip `cfg`: seeded random inputs at its second
/// smallest gear, and their first rows at the smallest, run in full mode on a device of
/// their own; every output must follow the batch and its first rows agree.
pub fn check(cfg: &ChipConfig, file: &OmFile<'_>, desc: &ModelDesc) -> Result<PadCheck, String> {
    let mut gears = batches(desc)?;
    let axes = batch_axes(desc)?;
    gears.sort_unstable();
    gears.dedup();
    let [small, big, ..] = gears[..] else {
        return Ok(PadCheck {
            allowed: false,
            reason: format!(
                "one gear ({}) is not enough to show that rows are independent",
                join(&gears)
            ),
        });
    };
    let mut rt = Runtime::new(
        cfg.clone(),
        NullSink,
        RuntimeOptions {
            exec_mode: ExecMode::Full,
            ..RuntimeOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let m = rt
        .load_parsed(file, desc.clone())
        .map_err(|e| e.to_string())?;
    let sink = rt.is_sink(m).map_err(|e| e.to_string())?;
    let big_in = inputs::generate(desc, &GearChoice::Batch(big), Fill::Random { seed: 0x5eed })
        .map_err(|e| e.to_string())?;
    let small_in = big_in
        .iter()
        .zip(&axes)
        .map(|(t, axis)| rows(t, *axis, small))
        .collect::<Result<Vec<_>, _>>()?;
    let mut run = |x: &[Tensor]| {
        if sink {
            rt.run_sink(m, x)
        } else {
            rt.run(m, x)
        }
        .map(|r| r.outputs)
        .map_err(|e| format!("padding check: {e}"))
    };
    let yb = run(&big_in)?;
    let ys = run(&small_in)?;
    let names: Vec<String> = desc.outputs.iter().map(|o| o.name.clone()).collect();
    let mut c = compare_rows(&names, &yb, &ys, small);
    if c.allowed {
        c.reason = format!(
            "rows are independent: the first {small} output row(s) at gear batch {big} match \
             gear batch {small} on the device"
        );
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearsim_isa::tensor::DataType;

    #[test]
    fn rows_cut_and_pad_along_any_axis() {
        // [2, 3] i32: rows along axis 1.
        let t = Tensor::from_i32s(vec![2, 3], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(rows(&t, 1, 2).unwrap().to_i64s(), [1, 2, 4, 5]);
        assert_eq!(rows(&t, 1, 4).unwrap().to_i64s(), [1, 2, 3, 0, 4, 5, 6, 0]);
        assert_eq!(
            rows(&t, 0, 3).unwrap().to_i64s(),
            [1, 2, 3, 4, 5, 6, 0, 0, 0]
        );
        let p = Padding {
            from: 3,
            to: 4,
            gear: 2,
        };
        assert!((p.wasted() - 0.25).abs() < 1e-12);
        assert_eq!(
            p.text(),
            "batch 3 -> gear 2 (batch 4), 25.0% of its rows padding"
        );
        let _ = DataType::F32;
    }

    #[test]
    fn mixed_rows_and_batchless_outputs_are_refused() {
        let names = vec!["y".to_string()];
        let big = [Tensor::from_f32s(vec![2, 1], &[1.0, 2.0])];
        let same = [Tensor::from_f32s(vec![1, 1], &[1.0])];
        let moved = [Tensor::from_f32s(vec![1, 1], &[1.5])];
        assert!(compare_rows(&names, &big, &same, 1).allowed);
        let c = compare_rows(&names, &big, &moved, 1);
        assert!(
            !c.allowed && c.reason.contains("mixes rows"),
            "{}",
            c.reason
        );
        let fixed = [Tensor::from_f32s(vec![2, 1], &[1.0, 2.0])];
        let c = compare_rows(&names, &big, &fixed, 1);
        assert!(
            !c.allowed && c.reason.contains("does not follow the batch"),
            "{}",
            c.reason
        );
    }
}
