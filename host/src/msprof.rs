//! Profiles in the shape Ascend's tools write them, so that the scripts users already have for
//! msprof and ais_bench read gearsim's too: `op_summary.csv` (one row per operator task),
//! `task_time.csv` (one row per task), and ais_bench's summary of NPU compute time over the
//! loops with its throughput (1000 · batch / mean ms).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gearsim_isa::omtask::TensorInfo;
use gearsim_traces::atomic;
use serde_json::json;

use crate::runtime::{OpRow, RunProfile};

/// op_summary's columns, in msprof's names and order (the ones gearsim has).
pub const OP_SUMMARY_COLUMNS: [&str; 25] = [
    "Model Name",
    "Infer ID",
    "Stream ID",
    "Task ID",
    "Op Name",
    "OP Type",
    "Task Type",
    "Task Start Time(us)",
    "Task Duration(us)",
    "Task Wait Time(us)",
    "Block Dim",
    "aicore_time(us)",
    "mac_ratio",
    "vec_ratio",
    "scalar_ratio",
    "mte1_ratio",
    "mte2_ratio",
    "mte3_ratio",
    "fixpipe_ratio",
    "Input Shapes",
    "Input Data Types",
    "Input Formats",
    "Output Shapes",
    "Output Data Types",
    "Output Formats",
];

/// task_time's columns.
pub const TASK_TIME_COLUMNS: [&str; 9] = [
    "Infer ID",
    "kernel_name",
    "kernel_type",
    "stream_id",
    "task_id",
    "task_time(us)",
    "task_start(us)",
    "task_stop(us)",
    "task_wait(us)",
];

fn us(ps: u64) -> String {
    format!("{:.3}", ps as f64 / 1e6)
}

fn ratio(v: f64) -> String {
    format!("{v:.6}")
}

/// One CSV field, quoted when it holds a comma, a quote or a line break.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn line(out: &mut String, fields: &[String]) {
    let cells: Vec<String> = fields.iter().map(|f| field(f)).collect();
    out.push_str(&cells.join(","));
    out.push('\n');
}

/// Tensors as msprof lists them: shapes `1,64,56,56;64`, types and formats `;`-separated.
fn tensors(ts: &[TensorInfo]) -> [String; 3] {
    let shapes = ts
        .iter()
        .map(|t| {
            t.dims
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(";");
    let types = ts
        .iter()
        .map(|t| t.dtype.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let formats = ts
        .iter()
        .map(|t| t.format.as_str())
        .collect::<Vec<_>>()
        .join(";");
    [shapes, types, formats]
}

/// The op_summary fields of one row (`N/A` where msprof has none: an AI CPU task's pipes).
pub fn op_fields(model: &str, infer: usize, o: &OpRow) -> Vec<String> {
    let na = || "N/A".to_string();
    let [in_shapes, in_types, in_formats] = tensors(&o.inputs);
    let [out_shapes, out_types, out_formats] = tensors(&o.outputs);
    let r = o.ratios;
    let pick =
        |f: fn(&crate::runtime::PipeRatios) -> f64| r.as_ref().map_or_else(na, |r| ratio(f(r)));
    vec![
        model.to_string(),
        infer.to_string(),
        o.task.stream.to_string(),
        o.task.index.to_string(),
        o.name.clone(),
        o.op_type.clone(),
        o.task_type.to_string(),
        us(o.task.start_ps),
        us(o.duration_ps()),
        us(o.task.wait_ps),
        o.block_dim.to_string(),
        o.aicore_ps.map_or_else(na, us),
        pick(|r| r.mac),
        pick(|r| r.vec),
        pick(|r| r.scalar),
        pick(|r| r.mte1),
        pick(|r| r.mte2),
        pick(|r| r.mte3),
        pick(|r| r.fixpipe),
        in_shapes,
        in_types,
        in_formats,
        out_shapes,
        out_types,
        out_formats,
    ]
}

/// The columns of [`OP_SUMMARY_COLUMNS`] that hold text (the rest hold numbers).
const TEXT_COLUMNS: [&str; 10] = [
    "Model Name",
    "Op Name",
    "OP Type",
    "Task Type",
    "Input Shapes",
    "Input Data Types",
    "Input Formats",
    "Output Shapes",
    "Output Data Types",
    "Output Formats",
];

/// One op_summary row as a JSON object keyed by msprof's column names (without the model name
/// and Infer ID): numbers as numbers, `N/A` as null.
pub fn op_record(o: &OpRow) -> serde_json::Map<String, serde_json::Value> {
    OP_SUMMARY_COLUMNS
        .iter()
        .zip(op_fields("", 0, o))
        .skip(2)
        .map(|(k, v)| {
            let value = if v == "N/A" {
                serde_json::Value::Null
            } else if TEXT_COLUMNS.contains(k) {
                serde_json::Value::String(v)
            } else {
                v.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map_or(serde_json::Value::String(v), serde_json::Value::Number)
            };
            (k.to_string(), value)
        })
        .collect()
}

/// `op_summary.csv` of the runs (`runs[i]` is Infer ID i).
pub fn op_summary_csv(model: &str, runs: &[&RunProfile]) -> String {
    let mut out = String::new();
    line(&mut out, &OP_SUMMARY_COLUMNS.map(str::to_string));
    for (i, p) in runs.iter().enumerate() {
        for o in &p.ops {
            line(&mut out, &op_fields(model, i, o));
        }
    }
    out
}

/// `task_time.csv` of the runs.
pub fn task_time_csv(runs: &[&RunProfile]) -> String {
    let mut out = String::new();
    line(&mut out, &TASK_TIME_COLUMNS.map(str::to_string));
    for (i, p) in runs.iter().enumerate() {
        for t in &p.tasks {
            line(
                &mut out,
                &[
                    i.to_string(),
                    t.name.clone(),
                    t.kind.to_string(),
                    t.stream.to_string(),
                    t.index.to_string(),
                    us(t.end_ps.saturating_sub(t.start_ps)),
                    us(t.start_ps),
                    us(t.end_ps),
                    us(t.wait_ps),
                ],
            );
        }
    }
    out
}

/// ais_bench's summary of NPU compute time over the loops, in milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputeTime {
    /// Loops.
    pub count: usize,
    /// Shortest.
    pub min_ms: f64,
    /// Longest.
    pub max_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Median (the mean of the two middle loops for an even count).
    pub median_ms: f64,
    /// The batch the throughput counts.
    pub batch: u64,
    /// 1000 · batch / mean, per second.
    pub throughput: f64,
}

impl ComputeTime {
    /// The summary of `execute_ps` (one `aclmdlExecute` call per loop, as ais_bench's host
    /// timer takes it) at batch `batch`; `None` without loops.
    pub fn of(execute_ps: &[u64], batch: u64) -> Option<ComputeTime> {
        if execute_ps.is_empty() {
            return None;
        }
        let mut ms: Vec<f64> = execute_ps.iter().map(|p| *p as f64 / 1e9).collect();
        ms.sort_by(f64::total_cmp);
        let n = ms.len();
        let mean = ms.iter().sum::<f64>() / n as f64;
        Some(ComputeTime {
            count: n,
            min_ms: ms[0],
            max_ms: ms[n - 1],
            mean_ms: mean,
            median_ms: crate::stats::median(&ms),
            batch,
            throughput: if mean > 0.0 {
                1000.0 * batch as f64 / mean
            } else {
                0.0
            },
        })
    }

    /// ais_bench's lines.
    pub fn text(&self) -> Vec<String> {
        vec![
            format!(
                "NPU_compute_time (ms): min = {:.6}, max = {:.6}, mean = {:.6}, median = {:.6} ({} loop{})",
                self.min_ms,
                self.max_ms,
                self.mean_ms,
                self.median_ms,
                self.count,
                if self.count == 1 { "" } else { "s" }
            ),
            format!(
                "throughput 1000*batchsize.mean({})/NPU_compute_time.mean({:.6}): {:.3}",
                self.batch, self.mean_ms, self.throughput
            ),
        ]
    }

    /// As JSON.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "loops": self.count,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "mean_ms": self.mean_ms,
            "median_ms": self.median_ms,
            "batch": self.batch,
            "throughput": self.throughput,
        })
    }
}

/// The phases of a run as text (`h2d 12.345 us, ...`).
pub fn phases_text(p: &RunProfile) -> String {
    let mut s = String::new();
    for (i, ph) in p.phases.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        let _ = write!(s, "{} {:.3} us", ph.name, ph.ps() as f64 / 1e6);
    }
    s
}

/// The files of a profile directory, written whole or not at all: `op_summary.csv`,
/// `task_time.csv` and `summary.json` (with `summary.txt`, its text).
pub fn write_dir(dir: &Path, files: &[(&str, String)]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the profile directory {}", dir.display()))?;
    let staged = files
        .iter()
        .map(|(name, text)| atomic::stage(&dir.join(name), text.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut written = Vec::new();
    for temp in staged {
        let path = temp.dest().to_path_buf();
        temp.persist()?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_with_commas_are_quoted() {
        assert_eq!(field("1,3,224,224"), "\"1,3,224,224\"");
        assert_eq!(field("a\"b"), "\"a\"\"b\"");
        assert_eq!(field("Conv2D"), "Conv2D");
    }

    #[test]
    fn compute_time_is_ais_bench_s() {
        let t = ComputeTime::of(
            &[4_000_000_000, 2_000_000_000, 3_000_000_000, 1_000_000_000],
            8,
        )
        .unwrap();
        assert_eq!(
            (t.min_ms, t.max_ms, t.mean_ms, t.median_ms),
            (1.0, 4.0, 2.5, 2.5)
        );
        assert!((t.throughput - 3200.0).abs() < 1e-9);
        assert!(ComputeTime::of(&[], 1).is_none());
    }
}
