//! The gear-set advisor (`gearsim study advise`): from a distribution of observed input shapes,
//! proposes the gear set that minimises the expected simulated time per request under a gear
//! budget and a device-memory budget, and reports the whole trade-off curve.
//!
//! ```text
//!  shapes file ──parse──▶ observed gear vectors with counts ──▶ candidates (the distinct vectors)
//!  candidates ──compile (≤ the MapIndex limit per model, hybrid .om)──▶ per candidate, simulated
//!      timing-only: t = its gear's run (non-sink), h = the hybrid dynamic path + host cost per op,
//!      memory = its feature-map plan and I/O buffers
//!  dynamic batch: padding check (batch b+1 and b on the device, full mode, first b rows compared)
//!  optimiser (exact) ──▶ per gear count k, the set minimising Σ share · cost under the budget
//!  every curve point compiled and run again ──▶ advise.csv, advise_candidates.csv, advise.svg
//! ```
//!
//! **Cost of a request** with gear vector `s` under a gear set `G`: a gear equal to `s` runs it
//! (the runtime picks it: `t(s)`); else, when padding is allowed, the application pads it up to
//! the smallest gear `g > s` if that beats the dynamic path (`min(t(g), h(s))`); else the hybrid
//! dynamic path runs it (`h(s)`). Only the batch axis is padded (dynamic batch mode), and only
//! when the model's rows are independent of each other, which the padding check shows on the
//! device. Costs are device times; the dynamic path's host work (shape inference, tiling, one
//! launch per op) is charged per op by `host_us_per_op`, the study's own parameter so that it
//! can be swept (`ascend-hardware.md` §6.4 has no solid figure; the runtime's host model, the
//! preset's `[host]` costs, shows in a run's end-to-end time).
//!
//! **Why the optimum is exact.** Without padding the expected cost is `Σ h` minus one saving per
//! chosen gear, so the best `k`-set holds the `k` largest savings; with padding it is a sum of
//! segments between consecutive gears, solved by dynamic programming over the sorted candidates.
//! A set's memory is the weights, its gear table, its largest feature-map plan and its largest
//! I/O buffers (branches are overlaid), so both optimisers run on the candidates under each
//! (feature-map, I/O) threshold pair and keep the best set that fits: the optimal set is found
//! under its own pair.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use gearsim_isa::gear::{MapIndexEngine, TableLayout};
use gearsim_isa::om::ModelDesc;
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::NullSink;

use super::svg::{Figure, Panel, Series, render};
use super::{Shard, StudyError, parallel_map};
use crate::pad::{PadCheck, compare_rows};
use crate::runtime::session::{data_inputs, io_type};
use crate::runtime::{ModelId, RunPath, Runtime, RuntimeOptions};
use crate::target;
use gearsim_compiler::ir::{DataType, Tensor};
use gearsim_compiler::options::{DynamicMode, GearOptions, InputShape, parse_input_shape};
use gearsim_compiler::pipeline::{CompileOptions, compile};

/// Whether the advisor may pad a batch up to a larger gear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadPolicy {
    /// In dynamic batch mode, when the padding check passes.
    Auto,
    /// Never: a shape without its own gear runs on the dynamic path.
    Never,
}

impl PadPolicy {
    /// `auto` or `never`.
    pub fn parse(s: &str) -> Option<PadPolicy> {
        match s {
            "auto" => Some(PadPolicy::Auto),
            "never" => Some(PadPolicy::Never),
            _ => None,
        }
    }
}

/// What the advisor is asked.
#[derive(Debug, Clone)]
pub struct AdviseOptions {
    /// The ONNX bytes.
    pub onnx: Vec<u8>,
    /// The model's file name (messages).
    pub file: String,
    /// `--input_shape`, with `-1` on the gear axes.
    pub input_shape: String,
    /// `--input_format`.
    pub input_format: Option<String>,
    /// The gear option to use; `None` picks one from where the `-1` axes are.
    pub mode: Option<DynamicMode>,
    /// The observed gear vectors with their counts.
    pub shapes: Observed,
    /// Most gears in a proposed set (at least 2: GE's E10035).
    pub gear_budget: u32,
    /// Most device bytes the proposed model may hold (weights, feature maps, I/O).
    pub memory_budget: Option<u64>,
    /// Padding policy.
    pub pad: PadPolicy,
    /// Host time charged per op the dynamic path runs (µs).
    pub host_us_per_op: f64,
    /// The chip.
    pub chip: ChipConfig,
    /// Host threads for the simulations.
    pub threads: usize,
}

// ---- the shapes file ------------------------------------------------------------------------

/// Observed gear vectors: each distinct vector once, in ascending order, with its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `(gear vector, count)`, sorted by vector.
    pub vectors: Vec<(Vec<i64>, u64)>,
}

impl Observed {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.vectors.iter().map(|(_, c)| c).sum()
    }
}

/// The gear option `--input_shape` calls for when none is named: dynamic batch when every `-1`
/// is an axis 0, image size when the `-1`s are exactly axes 2 and 3 of one 4-D input (NCHW),
/// dims otherwise.
pub fn default_mode(inputs: &[InputShape]) -> DynamicMode {
    let minus: Vec<(usize, usize)> = inputs
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            s.dims
                .iter()
                .enumerate()
                .filter(|(_, d)| **d == -1)
                .map(move |(a, _)| (i, a))
        })
        .collect();
    if !minus.is_empty() && minus.iter().all(|(_, a)| *a == 0) {
        DynamicMode::Batch
    } else if let [(i, 2), (j, 3)] = minus.as_slice()
        && i == j
        && inputs[*i].dims.len() == 4
    {
        DynamicMode::ImageSize
    } else {
        DynamicMode::Dims
    }
}

/// Reads a shapes file: one observed request per line, in `--input_shape` form with every
/// input of `inputs` and the real values on its `-1` axes, then an optional count (default 1);
/// `#` starts a comment. Lines with the same vector add up. Errors name `file:line`.
pub fn parse_shapes(
    text: &str,
    file: &str,
    inputs: &[InputShape],
    mode: DynamicMode,
) -> Result<Observed, StudyError> {
    let mut counts: BTreeMap<Vec<i64>, u64> = BTreeMap::new();
    let names: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
    for (n, raw) in text.lines().enumerate() {
        let at = format!("{file}:{}", n + 1);
        let err = |m: String| StudyError::Options(format!("{at}: {m}"));
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (shape, count) = match line.rsplit_once(char::is_whitespace) {
            Some((s, c)) if c.bytes().all(|b| b.is_ascii_digit()) => {
                let count: u64 = c
                    .parse()
                    .map_err(|_| err(format!("count `{c}`: expected a whole number below 2^64")))?;
                (s.trim(), count)
            }
            _ => (line, 1),
        };
        if count == 0 {
            return Err(err("count 0: expected a positive count".into()));
        }
        let given = parse_input_shape(shape, false).map_err(|e| err(e.to_string()))?;
        let mut vector = Vec::new();
        for want in inputs {
            let found: Vec<&InputShape> = given.iter().filter(|g| g.name == want.name).collect();
            let [got] = found.as_slice() else {
                return Err(err(format!(
                    "input `{}` appears {} times; every line gives each input of --input_shape \
                     ({}) once",
                    want.name,
                    found.len(),
                    names.join(", ")
                )));
            };
            if got.dims.len() != want.dims.len() {
                return Err(err(format!(
                    "input `{}` has {} dims, --input_shape gives it {}",
                    want.name,
                    got.dims.len(),
                    want.dims.len()
                )));
            }
            for (axis, (&g, &w)) in got.dims.iter().zip(&want.dims).enumerate() {
                if w == -1 {
                    vector.push(g);
                } else if g != w {
                    return Err(err(format!(
                        "input `{}` axis {axis} is {g}, --input_shape fixes it at {w}",
                        want.name
                    )));
                }
            }
        }
        if let Some(extra) = given.iter().find(|g| !names.contains(&g.name.as_str())) {
            return Err(err(format!(
                "input `{}` is not in --input_shape (expected {})",
                extra.name,
                names.join(", ")
            )));
        }
        if mode == DynamicMode::Batch {
            if let Some(v) = vector.iter().find(|v| **v != vector[0]) {
                return Err(err(format!(
                    "dynamic batch: every input's batch must be the same, got {} and {v}",
                    vector[0]
                )));
            }
            vector.truncate(1);
        }
        let slot = counts.entry(vector).or_insert(0);
        *slot = slot
            .checked_add(count)
            .ok_or_else(|| err("the counts add up past 2^64".into()))?;
    }
    if counts.is_empty() {
        return Err(StudyError::Options(format!(
            "{file}: no shapes (expected lines like `{}` with an optional count)",
            example_line(inputs)
        )));
    }
    let vectors: Vec<(Vec<i64>, u64)> = counts.into_iter().collect();
    let total = vectors
        .iter()
        .try_fold(0u64, |a, (_, c)| a.checked_add(*c))
        .ok_or_else(|| StudyError::Options(format!("{file}: the counts add up past 2^64")))?;
    debug_assert!(total > 0);
    Ok(Observed { vectors })
}

/// A shapes-file line for `inputs` with 1 on every gear axis.
fn example_line(inputs: &[InputShape]) -> String {
    let entries: Vec<String> = inputs
        .iter()
        .map(|i| {
            let dims: Vec<String> = i
                .dims
                .iter()
                .map(|d| if *d == -1 { "1".into() } else { d.to_string() })
                .collect();
            format!("{}:{}", i.name, dims.join(","))
        })
        .collect();
    format!("{} 10", entries.join(";"))
}

/// A gear list as the gear option takes it.
pub fn gear_list(mode: DynamicMode, gears: &[Vec<i64>]) -> String {
    let sep = if mode == DynamicMode::Batch { "," } else { ";" };
    let each: Vec<String> = gears
        .iter()
        .map(|g| {
            g.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    each.join(sep)
}

/// The atc option name of `mode`.
pub fn option_name(mode: DynamicMode) -> &'static str {
    match mode {
        DynamicMode::Batch => "--dynamic_batch_size",
        DynamicMode::ImageSize => "--dynamic_image_size",
        DynamicMode::Dims => "--dynamic_dims",
    }
}

// ---- the optimiser --------------------------------------------------------------------------

/// The optimisation problem over the candidates (in ascending vector order).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    /// Each candidate's share of the requests.
    pub share: Vec<f64>,
    /// Time of a request on its gear (any unit, the same for all).
    pub gear: Vec<f64>,
    /// Time of a request on the dynamic path.
    pub hybrid: Vec<f64>,
    /// Feature-map bytes of the candidate's gear.
    pub feature_map: Vec<u64>,
    /// Input and output buffer bytes of the candidate's gear.
    pub io: Vec<u64>,
    /// Whether a request may run padded on a larger gear (candidates are then sorted batch
    /// values, so "larger" is "later").
    pub pad: bool,
    /// Bytes every set holds (weights without the gear table).
    pub base_bytes: u64,
    /// Gear table bytes, by gear count.
    pub table_bytes: Vec<u64>,
    /// The memory budget.
    pub budget: Option<u64>,
}

/// A gear set and what it is predicted to cost.
#[derive(Debug, Clone, PartialEq)]
pub struct Solution {
    /// Chosen candidates, ascending.
    pub chosen: Vec<usize>,
    /// Expected time per request.
    pub cost: f64,
    /// Device bytes.
    pub bytes: u64,
}

impl Problem {
    /// Candidates.
    pub fn len(&self) -> usize {
        self.share.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.share.is_empty()
    }

    /// The bytes of a set.
    pub fn bytes(&self, chosen: &[usize]) -> u64 {
        let fm = chosen
            .iter()
            .map(|&i| self.feature_map[i])
            .max()
            .unwrap_or(0);
        let io = chosen.iter().map(|&i| self.io[i]).max().unwrap_or(0);
        let table = self.table_bytes.get(chosen.len()).copied().unwrap_or(0);
        self.base_bytes + table + fm + io
    }

    /// Where each candidate's requests run under `chosen`: its own gear, a larger gear
    /// (padded) or the dynamic path.
    pub fn serving(&self, chosen: &[usize]) -> Vec<Serve> {
        (0..self.len())
            .map(|s| {
                if chosen.contains(&s) {
                    return Serve::Exact;
                }
                if self.pad
                    && let Some(&g) = chosen.iter().find(|&&g| g > s)
                    && self.gear[g] < self.hybrid[s]
                {
                    return Serve::Padded(g);
                }
                Serve::Hybrid
            })
            .collect()
    }

    /// Expected time per request under `chosen` (evaluated directly: the reference the
    /// optimisers are tested against).
    pub fn cost(&self, chosen: &[usize]) -> f64 {
        self.serving(chosen)
            .iter()
            .enumerate()
            .map(|(s, how)| {
                self.share[s]
                    * match how {
                        Serve::Exact => self.gear[s],
                        Serve::Padded(g) => self.gear[*g],
                        Serve::Hybrid => self.hybrid[s],
                    }
            })
            .sum()
    }

    /// The best set of exactly `k` gears for every `k` in `2..=max_k` (index `k`), `None` where
    /// no set of that size fits the budget.
    pub fn optimise(&self, max_k: usize) -> Vec<Option<Solution>> {
        let n = self.len();
        let max_k = max_k.min(n);
        let mut best: Vec<Option<Solution>> = vec![None; max_k + 1];
        for allowed in self.allowed_sets() {
            let found = if self.pad {
                self.best_padded(&allowed, max_k)
            } else {
                self.best_exact(&allowed, max_k)
            };
            for (k, chosen) in found.into_iter().enumerate() {
                let Some(chosen) = chosen else { continue };
                if k < 2 {
                    continue;
                }
                let bytes = self.bytes(&chosen);
                if self.budget.is_some_and(|b| bytes > b) {
                    continue;
                }
                let cost = self.cost(&chosen);
                let better = match &best[k] {
                    None => true,
                    Some(b) => cost < b.cost || (cost == b.cost && bytes < b.bytes),
                };
                if better {
                    best[k] = Some(Solution {
                        chosen,
                        cost,
                        bytes,
                    });
                }
            }
        }
        best
    }

    /// The candidate sets under each (feature-map, I/O) threshold pair, each once (all the
    /// candidates when there is no budget).
    fn allowed_sets(&self) -> Vec<Vec<bool>> {
        let n = self.len();
        if self.budget.is_none() {
            return vec![vec![true; n]];
        }
        let mut fms: Vec<u64> = self.feature_map.clone();
        fms.sort_unstable();
        fms.dedup();
        let mut ios: Vec<u64> = self.io.clone();
        ios.sort_unstable();
        ios.dedup();
        let mut sets: Vec<Vec<bool>> = Vec::new();
        for &f in &fms {
            for &i in &ios {
                let set: Vec<bool> = (0..n)
                    .map(|c| self.feature_map[c] <= f && self.io[c] <= i)
                    .collect();
                if set.iter().filter(|a| **a).count() >= 2 && !sets.contains(&set) {
                    sets.push(set);
                }
            }
        }
        sets
    }

    /// Without padding: per `k`, the `k` allowed candidates that save most over the dynamic
    /// path (a saving may be negative: a slow gear still takes its shape).
    fn best_exact(&self, allowed: &[bool], max_k: usize) -> Vec<Option<Vec<usize>>> {
        let mut order: Vec<usize> = (0..self.len()).filter(|&c| allowed[c]).collect();
        let saving = |c: usize| self.share[c] * (self.hybrid[c] - self.gear[c]);
        order.sort_by(|&a, &b| saving(b).total_cmp(&saving(a)).then(a.cmp(&b)));
        (0..=max_k)
            .map(|k| {
                (k <= order.len()).then(|| {
                    let mut set = order[..k].to_vec();
                    set.sort_unstable();
                    set
                })
            })
            .collect()
    }

    /// With padding: dynamic programming over the sorted candidates. `dp[j][i]` is the least
    /// cost of the requests up to candidate `i` with `j` gears, the largest being `i`.
    fn best_padded(&self, allowed: &[bool], max_k: usize) -> Vec<Option<Vec<usize>>> {
        let n = self.len();
        // seg(p, i): requests after gear p (or from the start) up to gear i, served by i.
        let seg = |p: Option<usize>, i: usize| -> f64 {
            let from = p.map_or(0, |p| p + 1);
            (from..i)
                .map(|s| self.share[s] * self.gear[i].min(self.hybrid[s]))
                .sum::<f64>()
                + self.share[i] * self.gear[i]
        };
        // tail[i]: requests after candidate i, all on the dynamic path.
        let mut tail = vec![0.0; n + 1];
        for s in (0..n).rev() {
            tail[s] = tail[s + 1] + self.share[s] * self.hybrid[s];
        }
        let segs: Vec<Vec<f64>> = (0..n)
            .map(|i| (0..i).map(|p| seg(Some(p), i)).collect())
            .collect();
        let inf = f64::INFINITY;
        let mut dp = vec![vec![inf; n]; max_k + 1];
        let mut from = vec![vec![usize::MAX; n]; max_k + 1];
        for i in (0..n).filter(|&i| allowed[i]) {
            if max_k >= 1 {
                dp[1][i] = seg(None, i);
            }
        }
        for j in 2..=max_k {
            for i in (0..n).filter(|&i| allowed[i]) {
                for p in (0..i).filter(|&p| allowed[p]) {
                    let c = dp[j - 1][p] + segs[i][p];
                    if c < dp[j][i] {
                        dp[j][i] = c;
                        from[j][i] = p;
                    }
                }
            }
        }
        (0..=max_k)
            .map(|k| {
                if k == 0 {
                    return None;
                }
                let last = (0..n).filter(|&i| dp[k][i].is_finite()).min_by(|&a, &b| {
                    (dp[k][a] + tail[a + 1]).total_cmp(&(dp[k][b] + tail[b + 1]))
                })?;
                let mut set = vec![last];
                let (mut j, mut i) = (k, last);
                while j > 1 {
                    i = from[j][i];
                    j -= 1;
                    set.push(i);
                }
                set.reverse();
                Some(set)
            })
            .collect()
    }
}

/// Where a candidate's requests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// On its own gear.
    Exact,
    /// Padded up to this candidate's gear.
    Padded(usize),
    /// On the dynamic path.
    Hybrid,
}

// ---- measuring ------------------------------------------------------------------------------

/// One candidate gear as simulated.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The gear vector.
    pub vector: Vec<i64>,
    /// Requests observed with it.
    pub count: u64,
    /// Device time of a run on its gear (ps).
    pub gear_ps: u64,
    /// Device time of a run on the dynamic path (ps).
    pub hybrid_device_ps: u64,
    /// Ops the dynamic path runs.
    pub hybrid_ops: u64,
    /// Its gear's feature-map plan (bytes).
    pub feature_map_bytes: u64,
    /// Its gear's input and output buffers (bytes).
    pub io_bytes: u64,
}

/// One point of the trade-off curve: the best set of one size, predicted and measured.
#[derive(Debug, Clone, PartialEq)]
pub struct CurvePoint {
    /// The gears.
    pub gears: Vec<Vec<i64>>,
    /// Predicted expected time per request (ps).
    pub predicted_ps: f64,
    /// Predicted device bytes.
    pub predicted_bytes: u64,
    /// Expected time per request, measured on a model compiled for these gears (ps).
    pub measured_ps: f64,
    /// Device bytes of that model (weights, feature maps, I/O).
    pub measured_bytes: u64,
    /// Shares of the requests run on their own gear, padded, and on the dynamic path.
    pub exact: f64,
    /// See `exact`.
    pub padded: f64,
    /// See `exact`.
    pub hybrid: f64,
}

/// The advisor's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    /// The model.
    pub file: String,
    /// The gear option used.
    pub mode: DynamicMode,
    /// `--input_shape`.
    pub input_shape: String,
    /// The candidates, ascending.
    pub candidates: Vec<Candidate>,
    /// The padding check (dynamic batch only).
    pub pad: PadCheck,
    /// The curve, by gear count from 2.
    pub curve: Vec<CurvePoint>,
    /// Index into `curve` of the proposal: least measured time within the budgets.
    pub proposed: usize,
    /// Expected time with no gears at all (every request on the dynamic path, ps).
    pub all_hybrid_ps: f64,
    /// Host time charged per dynamic-path op (ps).
    pub host_ps_per_op: u64,
    /// The budgets.
    pub gear_budget: u32,
    /// See `gear_budget`.
    pub memory_budget: Option<u64>,
    /// The chip.
    pub chip: String,
}

impl Advice {
    /// The proposed curve point.
    pub fn proposal(&self) -> &CurvePoint {
        &self.curve[self.proposed]
    }
}

/// A compiled gear model for some candidates.
struct Build {
    om: Vec<u8>,
    desc: ModelDesc,
}

/// The layout and engine the advisor compiles with (the compiler's defaults).
fn layout() -> TableLayout {
    TableLayout::default()
}

fn compile_gears(
    a: &AdviseOptions,
    mode: DynamicMode,
    gears: &[Vec<i64>],
    point: usize,
) -> Result<Build, StudyError> {
    let list = gear_list(mode, gears);
    let mut gear = GearOptions {
        input_shape: Some(a.input_shape.clone()),
        input_format: a.input_format.clone(),
        ..GearOptions::default()
    };
    match mode {
        DynamicMode::Batch => gear.dynamic_batch_size = Some(list.clone()),
        DynamicMode::ImageSize => gear.dynamic_image_size = Some(list.clone()),
        DynamicMode::Dims => gear.dynamic_dims = Some(list.clone()),
    }
    let opts = CompileOptions {
        gear,
        getnext_sink: false,
        table_layout: layout(),
        mapindex_engine: MapIndexEngine::default(),
        fusion: Default::default(),
        precision: Default::default(),
        target: target::for_chip(&a.chip),
    };
    let fail = |message: String| StudyError::Compile {
        point,
        what: format!("{} \"{list}\"", option_name(mode)),
        message,
    };
    let c = compile(&a.onnx, &a.file, &opts).map_err(|e| fail(e.to_string()))?;
    let om = c.hybrid_om_bytes().map_err(fail)?;
    Ok(Build {
        om,
        desc: c.desc.clone(),
    })
}

/// A runtime with `om` loaded.
fn load(
    chip: &ChipConfig,
    om: &[u8],
    mode: ExecMode,
) -> Result<(Runtime<NullSink>, ModelId), String> {
    let opts = RuntimeOptions {
        exec_mode: mode,
        ..RuntimeOptions::default()
    };
    let mut rt = Runtime::new(chip.clone(), NullSink, opts).map_err(|e| e.to_string())?;
    let m = rt.load(om).map_err(|e| e.to_string())?;
    Ok((rt, m))
}

/// The model's data inputs at gear vector `v` (its `-1` dims, in `--input_shape` order), with
/// `fill` giving each input's bytes.
fn inputs_for(
    desc: &ModelDesc,
    inputs: &[InputShape],
    mode: DynamicMode,
    v: &[i64],
    fill: &mut dyn FnMut(DataType, usize) -> Vec<u8>,
) -> Result<Vec<Tensor>, String> {
    let mut values = v.iter();
    let mut by_name: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for s in inputs {
        let dims: Vec<i64> = s
            .dims
            .iter()
            .map(|&d| {
                if d != -1 {
                    return d;
                }
                if mode == DynamicMode::Batch {
                    v[0]
                } else {
                    values.next().copied().unwrap_or(1)
                }
            })
            .collect();
        by_name.insert(&s.name, dims);
    }
    (0..data_inputs(desc))
        .map(|i| {
            let io = &desc.inputs[i];
            let dtype = io_type(io).map_err(|e| e.to_string())?;
            let dims = by_name
                .get(io.name.as_str())
                .cloned()
                .unwrap_or_else(|| io.max_dims.clone());
            let count = dims.iter().product::<i64>().max(0) as usize;
            Tensor::new(dtype, dims, fill(dtype, count))
        })
        .collect()
}

fn zeros(dtype: DataType, count: usize) -> Vec<u8> {
    vec![0; count * dtype.size()]
}

/// Candidate `j` of `build`: its gear and dynamic-path times and its memory.
fn measure_candidate(
    a: &AdviseOptions,
    inputs: &[InputShape],
    mode: DynamicMode,
    build: &Build,
    j: usize,
    (vector, count): (&[i64], u64),
) -> Result<Candidate, String> {
    let (mut rt, m) = load(&a.chip, &build.om, ExecMode::TimingOnly)?;
    let x = inputs_for(&build.desc, inputs, mode, vector, &mut zeros)?;
    let r = rt.run(m, &x).map_err(|e| e.to_string())?;
    if r.gear != Some(j) {
        return Err(format!(
            "the gear run chose {:?}, expected gear {j} {vector:?}",
            r.gear
        ));
    }
    let gear_ps = r.device_time_ps;
    // The first dynamic run lowers and allocates; the second is the steady state.
    rt.run_dynamic_path(m, &x).map_err(|e| e.to_string())?;
    let before = rt
        .dynamic_stats(m)
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let h = rt.run_dynamic_path(m, &x).map_err(|e| e.to_string())?;
    let after = rt
        .dynamic_stats(m)
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    let hybrid_ops = (after.lowered + after.cache_hits) - (before.lowered + before.cache_hits);
    let d = build
        .desc
        .dynamic
        .as_ref()
        .ok_or("the model has no gears")?;
    let input_bytes: u64 =
        x.iter().map(|t| t.data.len() as u64).sum::<u64>() + gear_vector_bytes(&build.desc);
    let output_bytes: u64 = d.output_bytes.get(j).map_or(0, |o| o.iter().sum());
    Ok(Candidate {
        vector: vector.to_vec(),
        count,
        gear_ps,
        hybrid_device_ps: h.device_time_ps,
        hybrid_ops,
        feature_map_bytes: build
            .desc
            .memory
            .per_gear_feature_map
            .get(j)
            .copied()
            .unwrap_or(0),
        io_bytes: input_bytes + output_bytes,
    })
}

/// Bytes of the gear-vector input (`ascend_mbatch_shape_data`), the same at every gear.
fn gear_vector_bytes(desc: &ModelDesc) -> u64 {
    desc.inputs[data_inputs(desc)..]
        .iter()
        .map(|i| i.bytes)
        .sum()
}

/// Deterministic values in [-1, 1) for a float input, zeros for an integer one.
fn random_fill(seed: &mut u64) -> impl FnMut(DataType, usize) -> Vec<u8> + '_ {
    move |dtype, count| {
        let mut next = || {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
        };
        match dtype {
            DataType::F32 => (0..count)
                .flat_map(|_| (next() as f32).to_le_bytes())
                .collect(),
            DataType::F16 => (0..count)
                .flat_map(|_| half::f16::from_f64(next()).to_le_bytes())
                .collect(),
            _ => zeros(dtype, count),
        }
    }
}

/// Whether the model's rows are independent: batch `b + 1` and the first `b` of those rows on
/// the device's dynamic path (full mode) give the same first `b` output rows.
fn pad_check(
    a: &AdviseOptions,
    inputs: &[InputShape],
    build: &Build,
    b: i64,
) -> Result<PadCheck, String> {
    let (mut rt, m) = load(&a.chip, &build.om, ExecMode::Full)?;
    let mut seed = 0x5eed;
    let big = inputs_for(
        &build.desc,
        inputs,
        DynamicMode::Batch,
        &[b + 1],
        &mut random_fill(&mut seed),
    )?;
    let small: Vec<Tensor> = big
        .iter()
        .map(|t| {
            let row = t.data.len() / (b as usize + 1);
            let mut dims = t.dims.clone();
            dims[0] = b;
            Tensor::new(t.dtype, dims, t.data[..row * b as usize].to_vec())
        })
        .collect::<Result<_, _>>()?;
    let rb = rt.run_dynamic_path(m, &big).map_err(|e| e.to_string())?;
    let rs = rt.run_dynamic_path(m, &small).map_err(|e| e.to_string())?;
    let names: Vec<String> = build.desc.outputs.iter().map(|o| o.name.clone()).collect();
    let mut c = compare_rows(&names, &rb.outputs, &rs.outputs, b);
    if c.allowed {
        c.reason = format!(
            "rows are independent: the first {b} output row(s) at batch {} match batch {b} on \
             the device",
            b + 1
        );
    }
    Ok(c)
}

/// Splits `n` candidates into chunks of at most `limit` (and at least 2).
fn chunks(n: usize, limit: usize) -> Vec<std::ops::Range<usize>> {
    let count = n.div_ceil(limit.max(2));
    (0..count)
        .map(|c| (c * n / count)..((c + 1) * n / count))
        .collect()
}

/// Runs the advisor: every candidate measured, then the curve and the proposal.
pub fn advise(a: &AdviseOptions) -> Result<Advice, StudyError> {
    advise_with(a, None)
}

/// Runs the advisor on candidates measured before, by the shards of a sharded run
/// ([`measure_shard`]): `measured` holds each observed gear vector once, with its count.
pub fn advise_measured(a: &AdviseOptions, measured: Vec<Candidate>) -> Result<Advice, StudyError> {
    advise_with(a, Some(measured))
}

/// The checked options: the parsed input shapes and the gear option.
fn prepare(a: &AdviseOptions) -> Result<(Vec<InputShape>, DynamicMode), StudyError> {
    let opt = |m: String| StudyError::Options(m);
    let inputs =
        parse_input_shape(&a.input_shape, true).map_err(|e| opt(format!("--input_shape: {e}")))?;
    let mode = a.mode.unwrap_or_else(|| default_mode(&inputs));
    let vectors = &a.shapes.vectors;
    if vectors.len() < 2 {
        return Err(opt(format!(
            "E10035: the shapes give {} distinct gear vector(s); a gear model needs at least 2 \
             profiles, so there is nothing to choose",
            vectors.len()
        )));
    }
    if a.gear_budget < 2 {
        return Err(opt(format!(
            "--gear_budget {}: expected at least 2 (GE needs 2 profiles or more, E10035)",
            a.gear_budget
        )));
    }
    if !(a.host_us_per_op.is_finite() && a.host_us_per_op >= 0.0) {
        return Err(opt(format!(
            "--host_us_per_op {}: expected a non-negative number",
            a.host_us_per_op
        )));
    }
    Ok((inputs, mode))
}

/// The observed vectors split into the gear models that measure them (a model holds at most
/// the chip's MapIndex gear limit).
fn parts(a: &AdviseOptions) -> Vec<std::ops::Range<usize>> {
    chunks(
        a.shapes.vectors.len(),
        a.chip.kernels.map_index_max_gears as usize,
    )
}

/// Measures the candidates of `shard` (the observed vectors `p` with `p % N == I`), each on the
/// gear model the whole run measures it on, so that the shards' candidates together are the
/// whole run's. Also returns the builds made, by part.
fn measure(
    a: &AdviseOptions,
    inputs: &[InputShape],
    mode: DynamicMode,
    shard: Shard,
) -> Result<(Vec<Option<Build>>, Vec<Candidate>), StudyError> {
    let vectors = &a.shapes.vectors;
    let parts = parts(a);
    let needed: Vec<usize> = (0..parts.len())
        .filter(|&c| parts[c].clone().any(|p| shard.takes(p)))
        .collect();
    let built: Vec<Result<Build, StudyError>> = parallel_map(
        &needed,
        a.threads,
        |&c| {
            let r = &parts[c];
            let gears: Vec<Vec<i64>> = vectors[r.clone()].iter().map(|(v, _)| v.clone()).collect();
            compile_gears(a, mode, &gears, r.start)
        },
        |_, _| {},
    );
    let mut builds: Vec<Option<Build>> = (0..parts.len()).map(|_| None).collect();
    for (c, b) in needed.iter().zip(built) {
        builds[*c] = Some(b?);
    }
    let jobs: Vec<(usize, usize)> = parts
        .iter()
        .enumerate()
        .flat_map(|(c, r)| r.clone().map(move |i| (c, i)))
        .filter(|&(_, i)| shard.takes(i))
        .collect();
    let measured = parallel_map(
        &jobs,
        a.threads,
        |&(c, i)| {
            let (v, count) = &vectors[i];
            let build = builds[c].as_ref().ok_or_else(|| StudyError::Run {
                point: i,
                what: format!("candidate {v:?}"),
                message: "internal error: its gear model was not built".into(),
            })?;
            measure_candidate(a, inputs, mode, build, i - parts[c].start, (v, *count)).map_err(
                |message| StudyError::Run {
                    point: i,
                    what: format!("candidate {v:?}"),
                    message,
                },
            )
        },
        |_, _| {},
    );
    let candidates = measured.into_iter().collect::<Result<_, _>>()?;
    Ok((builds, candidates))
}

/// One shard's part of a sharded advisor run: its candidates measured (write them with
/// [`candidates_csv_of`]; [`advise_measured`] takes every shard's).
pub fn measure_shard(a: &AdviseOptions, shard: Shard) -> Result<Vec<Candidate>, StudyError> {
    let (inputs, mode) = prepare(a)?;
    Ok(measure(a, &inputs, mode, shard)?.1)
}

fn advise_with(a: &AdviseOptions, measured: Option<Vec<Candidate>>) -> Result<Advice, StudyError> {
    let opt = |m: String| StudyError::Options(m);
    let (inputs, mode) = prepare(a)?;
    let inputs = &inputs;
    let vectors = &a.shapes.vectors;
    let parts = parts(a);
    let (first, candidates) = match measured {
        None => {
            let (mut builds, candidates) = measure(a, inputs, mode, Shard::ALL)?;
            let first = builds[0]
                .take()
                .ok_or_else(|| opt("no gear model was built".into()))?;
            (first, candidates)
        }
        Some(mut given) => {
            given.sort_by(|x, y| x.vector.cmp(&y.vector));
            check_coverage(&given, vectors)?;
            let gears: Vec<Vec<i64>> = vectors[parts[0].clone()]
                .iter()
                .map(|(v, _)| v.clone())
                .collect();
            (compile_gears(a, mode, &gears, 0)?, given)
        }
    };
    let pad = match (mode, a.pad) {
        (DynamicMode::Batch, PadPolicy::Auto) => pad_check(a, inputs, &first, vectors[0].0[0])
            .map_err(|message| StudyError::Run {
                point: 0,
                what: "padding check".into(),
                message,
            })?,
        (DynamicMode::Batch, PadPolicy::Never) => PadCheck {
            allowed: false,
            reason: "--pad never".into(),
        },
        _ => PadCheck {
            allowed: false,
            reason: format!(
                "only a batch is padded ({} gears run exact shapes)",
                option_name(mode)
            ),
        },
    };
    let host_ps_per_op = (a.host_us_per_op * 1e6).round() as u64;
    let total = a.shapes.total() as f64;
    let d0 = first
        .desc
        .dynamic
        .as_ref()
        .map_or(0, |d| d.gears.first().map_or(0, Vec::len));
    // The table is one constant of the weight region, which aligns every constant.
    let table = |k: usize| {
        (layout().table_len(k as u32, d0 as u32) * 4)
            .max(1)
            .div_ceil(gearsim_compiler::memory::ALIGN)
            * gearsim_compiler::memory::ALIGN
    };
    let problem = Problem {
        share: candidates.iter().map(|c| c.count as f64 / total).collect(),
        gear: candidates.iter().map(|c| c.gear_ps as f64).collect(),
        hybrid: candidates
            .iter()
            .map(|c| (c.hybrid_device_ps + c.hybrid_ops * host_ps_per_op) as f64)
            .collect(),
        feature_map: candidates.iter().map(|c| c.feature_map_bytes).collect(),
        io: candidates.iter().map(|c| c.io_bytes).collect(),
        pad: pad.allowed,
        base_bytes: first
            .desc
            .memory
            .weight_bytes
            .saturating_sub(table(parts[0].len())),
        table_bytes: (0..=candidates.len()).map(table).collect(),
        budget: a.memory_budget,
    };
    let solutions = problem.optimise(a.gear_budget as usize);
    let found: Vec<Solution> = solutions.into_iter().flatten().collect();
    if found.is_empty() {
        let smallest = (0..problem.len())
            .flat_map(|i| ((i + 1)..problem.len()).map(move |j| [i, j]))
            .map(|s| problem.bytes(&s))
            .min()
            .unwrap_or(0);
        return Err(opt(format!(
            "no set of 2 to {} gears fits --memory_budget {} bytes: the smallest needs {smallest}",
            a.gear_budget,
            a.memory_budget.unwrap_or(0)
        )));
    }
    let verified = parallel_map(
        &found,
        a.threads,
        |s| verify(a, inputs, mode, &problem, s, host_ps_per_op),
        |_, _| {},
    );
    let curve: Vec<CurvePoint> = verified.into_iter().collect::<Result<_, _>>()?;
    let fits = |p: &CurvePoint| a.memory_budget.is_none_or(|b| p.measured_bytes <= b);
    let proposed = (0..curve.len())
        .filter(|&i| fits(&curve[i]))
        .min_by(|&x, &y| curve[x].measured_ps.total_cmp(&curve[y].measured_ps))
        .ok_or_else(|| {
            opt(format!(
                "every proposed set exceeds --memory_budget {} bytes once compiled (the \
                 prediction missed the table's alignment); raise the budget slightly",
                a.memory_budget.unwrap_or(0)
            ))
        })?;
    Ok(Advice {
        file: a.file.clone(),
        mode,
        input_shape: a.input_shape.clone(),
        all_hybrid_ps: problem.cost(&[]),
        candidates,
        pad,
        curve,
        proposed,
        host_ps_per_op,
        gear_budget: a.gear_budget,
        memory_budget: a.memory_budget,
        chip: a.chip.name.clone(),
    })
}

/// Compiles `s`'s gears and runs every observed shape as the policy says: on its gear, padded
/// up to its gear, or on the dynamic path (plus the host cost of its ops).
fn verify(
    a: &AdviseOptions,
    inputs: &[InputShape],
    mode: DynamicMode,
    problem: &Problem,
    s: &Solution,
    host_ps_per_op: u64,
) -> Result<CurvePoint, StudyError> {
    let vectors = &a.shapes.vectors;
    let gears: Vec<Vec<i64>> = s.chosen.iter().map(|&i| vectors[i].0.clone()).collect();
    let point = gears.len();
    let fail = |message: String| StudyError::Run {
        point,
        what: format!("{} \"{}\"", option_name(mode), gear_list(mode, &gears)),
        message,
    };
    let build = compile_gears(a, mode, &gears, point)?;
    let (mut rt, m) = load(&a.chip, &build.om, ExecMode::TimingOnly).map_err(&fail)?;
    let serving = problem.serving(&s.chosen);
    let (mut sum, mut exact, mut padded, mut hybrid) = (0.0, 0.0, 0.0, 0.0);
    for (c, how) in serving.iter().enumerate() {
        let share = problem.share[c];
        let runs_at = match how {
            Serve::Padded(g) => &vectors[*g].0,
            _ => &vectors[c].0,
        };
        let x = inputs_for(&build.desc, inputs, mode, runs_at, &mut zeros).map_err(&fail)?;
        let mut r = rt.run(m, &x).map_err(|e| fail(e.to_string()))?;
        let want = if *how == Serve::Hybrid {
            RunPath::Dynamic
        } else {
            RunPath::Gear
        };
        if r.path != want {
            return Err(fail(format!(
                "shape {runs_at:?} ran on the {} path, the plan says {}",
                r.path.name(),
                want.name()
            )));
        }
        let mut ops = 0;
        if r.path == RunPath::Dynamic {
            // Steady state, as for the candidates: the second run of the shape.
            let mid = rt
                .dynamic_stats(m)
                .map_err(|e| fail(e.to_string()))?
                .unwrap_or_default();
            r = rt.run(m, &x).map_err(|e| fail(e.to_string()))?;
            let after = rt
                .dynamic_stats(m)
                .map_err(|e| fail(e.to_string()))?
                .unwrap_or_default();
            ops = (after.lowered + after.cache_hits) - (mid.lowered + mid.cache_hits);
            hybrid += share;
        } else if matches!(how, Serve::Padded(_)) {
            padded += share;
        } else {
            exact += share;
        }
        sum += share * (r.device_time_ps + ops * host_ps_per_op) as f64;
    }
    let mem = &build.desc.memory;
    Ok(CurvePoint {
        gears,
        predicted_ps: s.cost,
        predicted_bytes: s.bytes,
        measured_ps: sum,
        measured_bytes: mem.weight_bytes
            + mem.feature_map_bytes
            + mem.input_bytes
            + mem.output_bytes,
        exact,
        padded,
        hybrid,
    })
}

// ---- output -----------------------------------------------------------------------------------

/// Picoseconds as microseconds with three decimals.
fn us(ps: f64) -> String {
    format!("{:.3}", ps / 1e6)
}

/// Quotes a CSV field.
fn quoted(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The curve as CSV.
pub fn curve_csv(adv: &Advice) -> String {
    let mut out = String::from(
        "gears,gear_list,predicted_us,measured_us,predicted_bytes,measured_bytes,exact_share,\
         padded_share,hybrid_share,proposed\n",
    );
    for (i, p) in adv.curve.iter().enumerate() {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{:.6},{:.6},{:.6},{}",
            p.gears.len(),
            quoted(&gear_list(adv.mode, &p.gears)),
            us(p.predicted_ps),
            us(p.measured_ps),
            p.predicted_bytes,
            p.measured_bytes,
            p.exact,
            p.padded,
            p.hybrid,
            u8::from(i == adv.proposed)
        );
    }
    out
}

/// The candidates as CSV: one row per observed gear vector with its share of the requests,
/// its times (µs, and exactly in ps) and memory.
pub fn candidates_csv(adv: &Advice) -> String {
    let total: u64 = adv.candidates.iter().map(|c| c.count).sum();
    candidates_csv_of(adv.mode, &adv.candidates, total, adv.host_ps_per_op)
}

/// [`candidates_csv`] of some candidates (a shard's), shares taken of `total` requests; the
/// same rows as the whole run's for these vectors, so the shards' files read back with
/// [`parse_candidates`] give the whole run's candidates.
pub fn candidates_csv_of(
    mode: DynamicMode,
    candidates: &[Candidate],
    total: u64,
    host_ps_per_op: u64,
) -> String {
    let mut out = String::from(
        "gear,count,share,gear_us,hybrid_device_us,hybrid_ops,hybrid_us,feature_map_bytes,\
         io_bytes,gear_ps,hybrid_device_ps\n",
    );
    for c in candidates {
        let hybrid = c.hybrid_device_ps + c.hybrid_ops * host_ps_per_op;
        let _ = writeln!(
            out,
            "{},{},{:.6},{},{},{},{},{},{},{},{}",
            quoted(&gear_list(mode, std::slice::from_ref(&c.vector))),
            c.count,
            c.count as f64 / total.max(1) as f64,
            us(c.gear_ps as f64),
            us(c.hybrid_device_ps as f64),
            c.hybrid_ops,
            us(hybrid as f64),
            c.feature_map_bytes,
            c.io_bytes,
            c.gear_ps,
            c.hybrid_device_ps
        );
    }
    out
}

/// Splits a CSV line into fields (`"..."` quoting, `""` an escaped quote).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                if let Some(f) = fields.last_mut() {
                    f.push('"');
                }
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => {
                if let Some(f) = fields.last_mut() {
                    f.push(c);
                }
            }
        }
    }
    fields
}

/// Reads candidates back from an `advise_candidates.csv` (`file` names it in errors).
pub fn parse_candidates(text: &str, file: &str) -> Result<Vec<Candidate>, StudyError> {
    let bad = |line: usize, what: String| StudyError::Options(format!("{file}:{line}: {what}"));
    let mut lines = text.lines().enumerate();
    let header = match lines.next() {
        Some((_, h)) => csv_fields(h),
        None => {
            return Err(bad(
                1,
                "empty file; expected the header of advise_candidates.csv".into(),
            ));
        }
    };
    let column = |name: &str| {
        header.iter().position(|h| h == name).ok_or_else(|| {
            bad(
                1,
                format!(
                    "no `{name}` column (an advise_candidates.csv of this version has gear, \
                     count, hybrid_ops, feature_map_bytes, io_bytes, gear_ps and \
                     hybrid_device_ps)"
                ),
            )
        })
    };
    let cols = [
        column("gear")?,
        column("count")?,
        column("gear_ps")?,
        column("hybrid_device_ps")?,
        column("hybrid_ops")?,
        column("feature_map_bytes")?,
        column("io_bytes")?,
    ];
    let mut out = Vec::new();
    for (i, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let f = csv_fields(line);
        if f.len() != header.len() {
            return Err(bad(
                i + 1,
                format!("expected {} fields, got {}", header.len(), f.len()),
            ));
        }
        let number = |k: usize| -> Result<u64, StudyError> {
            let (col, text) = (&header[cols[k]], &f[cols[k]]);
            text.trim().parse().map_err(|_| {
                bad(
                    i + 1,
                    format!("{col}: expected a whole number, got `{text}`"),
                )
            })
        };
        let vector = f[cols[0]]
            .split(',')
            .map(|v| v.trim().parse::<i64>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                bad(
                    i + 1,
                    format!("gear: expected comma-separated dims, got `{}`", f[cols[0]]),
                )
            })?;
        out.push(Candidate {
            vector,
            count: number(1)?,
            gear_ps: number(2)?,
            hybrid_device_ps: number(3)?,
            hybrid_ops: number(4)?,
            feature_map_bytes: number(5)?,
            io_bytes: number(6)?,
        });
    }
    Ok(out)
}

/// Whether `given` (sorted) holds each observed vector exactly once, with its count.
fn check_coverage(given: &[Candidate], vectors: &[(Vec<i64>, u64)]) -> Result<(), StudyError> {
    let opt = |m: String| StudyError::Options(m);
    for w in given.windows(2) {
        if w[0].vector == w[1].vector {
            return Err(opt(format!(
                "--candidates: gear {:?} is measured twice (are two shards' files from the \
                 same shard?)",
                w[0].vector
            )));
        }
    }
    for (v, count) in vectors {
        match given.iter().find(|c| &c.vector == v) {
            None => {
                return Err(opt(format!(
                    "--candidates: no measurement of gear {v:?} (is a shard's file missing?)"
                )));
            }
            Some(c) if c.count != *count => {
                return Err(opt(format!(
                    "--candidates: gear {v:?} was measured with {} requests, the shapes file \
                     has {count} (the shards ran on another shapes file)",
                    c.count
                )));
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = given
        .iter()
        .find(|c| !vectors.iter().any(|(v, _)| *v == c.vector))
    {
        return Err(opt(format!(
            "--candidates: gear {:?} is not in the shapes file",
            extra.vector
        )));
    }
    Ok(())
}

/// The trade-off figure: expected time and device memory against the gear count.
pub fn figure(adv: &Advice) -> Figure {
    let xs: Vec<f64> = adv.curve.iter().map(|p| p.gears.len() as f64).collect();
    let line = |label: &str, color: &str, dashed: bool, ys: Vec<f64>| Series {
        label: label.into(),
        color: color.into(),
        dashed,
        points: xs.iter().copied().zip(ys).collect(),
    };
    let time = Panel {
        title: "expected time per request".into(),
        y_label: Some("time per request (us)".into()),
        series: vec![
            line(
                "measured",
                "#1f77b4",
                false,
                adv.curve.iter().map(|p| p.measured_ps / 1e6).collect(),
            ),
            line(
                "predicted",
                "#ff7f0e",
                true,
                adv.curve.iter().map(|p| p.predicted_ps / 1e6).collect(),
            ),
            line(
                "no gears (all dynamic path)",
                "#7f7f7f",
                true,
                xs.iter().map(|_| adv.all_hybrid_ps / 1e6).collect(),
            ),
        ],
    };
    let memory = Panel {
        title: "device memory".into(),
        y_label: Some("device memory (MiB)".into()),
        series: vec![
            line(
                "measured",
                "#1f77b4",
                false,
                adv.curve
                    .iter()
                    .map(|p| p.measured_bytes as f64 / 1048576.0)
                    .collect(),
            ),
            line(
                "predicted",
                "#ff7f0e",
                true,
                adv.curve
                    .iter()
                    .map(|p| p.predicted_bytes as f64 / 1048576.0)
                    .collect(),
            ),
        ],
    };
    Figure {
        title: format!("gear-set advisor: {} ({})", adv.file, adv.chip),
        subtitle: format!(
            "best set per gear count, {}; padding {}; dynamic path + {} us host per op",
            option_name(adv.mode),
            if adv.pad.allowed { "on" } else { "off" },
            us(adv.host_ps_per_op as f64)
        ),
        x_label: "gears in the set (count)".into(),
        y_label: String::new(),
        columns: 2,
        panels: vec![time, memory],
        shared_y: false,
        x_log_ticks: false,
        mark: Some((
            adv.proposal().gears.len() as f64,
            format!("proposed ({} gears)", adv.proposal().gears.len()),
        )),
    }
}

/// A human summary: candidates, curve and the proposal as atc options.
pub fn summary(adv: &Advice) -> String {
    let mut out = String::new();
    let total: u64 = adv.candidates.iter().map(|c| c.count).sum();
    let _ = writeln!(
        out,
        "{}: {} distinct gear vectors over {total} requests ({}); padding: {} — {}",
        adv.file,
        adv.candidates.len(),
        option_name(adv.mode),
        if adv.pad.allowed { "allowed" } else { "off" },
        adv.pad.reason
    );
    let _ = writeln!(
        out,
        "\ncandidates (simulated on {}, timing-only; dynamic path + {} us per op):",
        adv.chip,
        us(adv.host_ps_per_op as f64)
    );
    let gw = adv
        .candidates
        .iter()
        .map(|c| gear_list(adv.mode, std::slice::from_ref(&c.vector)).len())
        .max()
        .unwrap_or(0)
        .max(4);
    let _ = writeln!(
        out,
        "  {:<gw$} {:>7} {:>10} {:>12} {:>5} {:>14} {:>12}",
        "gear", "share", "gear us", "dynamic us", "ops", "feature maps", "io bytes"
    );
    for c in &adv.candidates {
        let _ = writeln!(
            out,
            "  {:<gw$} {:>6.1}% {:>10} {:>12} {:>5} {:>14} {:>12}",
            gear_list(adv.mode, std::slice::from_ref(&c.vector)),
            100.0 * c.count as f64 / total as f64,
            us(c.gear_ps as f64),
            us((c.hybrid_device_ps + c.hybrid_ops * adv.host_ps_per_op) as f64),
            c.hybrid_ops,
            c.feature_map_bytes,
            c.io_bytes
        );
    }
    let budget = adv
        .memory_budget
        .map_or("none".to_string(), |b| format!("{b} bytes"));
    let _ = writeln!(
        out,
        "\ntrade-off (gear budget {}, memory budget {budget}):",
        adv.gear_budget
    );
    let sets: Vec<String> = adv
        .curve
        .iter()
        .map(|p| gear_list(adv.mode, &p.gears))
        .collect();
    let w = sets.iter().map(String::len).max().unwrap_or(0).max(3);
    let _ = writeln!(
        out,
        "  {:>5}  {:<w$} {:>12} {:>12} {:>12} {:>6} {:>6} {:>7}",
        "gears", "set", "predicted us", "measured us", "bytes", "exact", "padded", "dynamic"
    );
    for (i, p) in adv.curve.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:>5}  {:<w$} {:>12} {:>12} {:>12} {:>5.1}% {:>5.1}% {:>6.1}%{}",
            p.gears.len(),
            sets[i],
            us(p.predicted_ps),
            us(p.measured_ps),
            p.measured_bytes,
            100.0 * p.exact,
            100.0 * p.padded,
            100.0 * p.hybrid,
            if i == adv.proposed {
                "  <- proposed"
            } else {
                ""
            }
        );
    }
    let p = adv.proposal();
    let _ = writeln!(
        out,
        "\nproposal: --input_shape \"{}\" {} \"{}\"\n  {} us per request expected ({} gears, {} \
         device bytes); with no gears every request takes the dynamic path: {} us",
        adv.input_shape,
        option_name(adv.mode),
        gear_list(adv.mode, &p.gears),
        us(p.measured_ps),
        p.gears.len(),
        p.measured_bytes,
        us(adv.all_hybrid_ps)
    );
    out
}

/// Writes `advise.csv`, `advise_candidates.csv` and `advise.svg` into `dir` (each atomically).
pub fn write_outputs(dir: &Path, adv: &Advice) -> Result<Vec<PathBuf>, StudyError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| StudyError::Io(format!("cannot create {}: {e}", dir.display())))?;
    let io = |e: gearsim_traces::atomic::WriteError| StudyError::Io(e.to_string());
    let files = [
        ("advise.csv", curve_csv(adv)),
        ("advise_candidates.csv", candidates_csv(adv)),
        ("advise.svg", render(&figure(adv))),
    ];
    let mut out = Vec::new();
    for (name, text) in files {
        let path = dir.join(name);
        gearsim_traces::atomic::write_atomic(&path, text.as_bytes()).map_err(io)?;
        out.push(path);
    }
    Ok(out)
}

/// Parses a byte count: a whole number with an optional `K`, `M`, `G` (or `KiB`, `MiB`,
/// `GiB`, powers of 1024) suffix.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(s: &str) -> Vec<InputShape> {
        parse_input_shape(s, true).unwrap()
    }

    #[test]
    fn modes_follow_the_minus_one_axes() {
        assert_eq!(default_mode(&shape("x:-1,3,8,8")), DynamicMode::Batch);
        assert_eq!(default_mode(&shape("x:-1,3;y:-1,2")), DynamicMode::Batch);
        assert_eq!(default_mode(&shape("x:1,3,-1,-1")), DynamicMode::ImageSize);
        assert_eq!(default_mode(&shape("x:1,-1;y:-1,2")), DynamicMode::Dims);
        assert_eq!(default_mode(&shape("x:1,3,-1,8")), DynamicMode::Dims);
    }

    #[test]
    fn bytes_parse_with_units() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64MiB"), Some(64 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("3 K"), Some(3 << 10));
        assert_eq!(parse_bytes("1.5M"), None);
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes("99999999999999999999G"), None);
    }

    #[test]
    fn chunks_respect_the_limit_and_hold_two() {
        assert_eq!(chunks(5, 100), vec![0..5]);
        assert_eq!(chunks(101, 100), vec![0..50, 50..101]);
        for n in 2..400 {
            let c = chunks(n, 100);
            assert_eq!(c.first().unwrap().start, 0);
            assert_eq!(c.last().unwrap().end, n);
            assert!(
                c.iter().all(|r| r.len() >= 2 && r.len() <= 100),
                "{n}: {c:?}"
            );
            assert!(c.windows(2).all(|w| w[0].end == w[1].start));
        }
    }
}
