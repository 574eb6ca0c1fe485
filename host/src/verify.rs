//! The verifier: checks a compiled model's task streams and every kernel launch without running
//! the model, and reports every violation it finds, not the first.
//!
//! - **Task streams**: every address lies inside its region (weights, feature maps, input and
//!   output buffers) for the bytes the task touches; labels are set once and every jump targets
//!   a label set in the same stream; kernel, stream and label numbers exist; the head stream
//!   ends with EndGraph.
//! - **Kernels**, per launch and block: the scalar program is followed with the simulator's own
//!   scalar semantics (`sim::scalar::step`) on concrete values, with each argument buffer at a
//!   synthetic address so every GM access can be traced back to the argument it came from.
//!   Every pipe instruction's ranges come from the simulator's planning (`sim::touches`) and are
//!   checked: local buffers against their sizes and alignment, GM against the argument's buffer.
//!   Flags are paired in program order: a `wait_flag` nothing set, or a `set_flag` on a flag
//!   still set, would deadlock the core; a flag left set at `end` is reported too.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use gearsim_isa::gear::SHAPE_TENSOR_BYTES;
use gearsim_isa::om::ModelDesc;
use gearsim_isa::omtask::{Addr, KernelArg, ModelTasks, OmTask, Region};
use gearsim_isa::task::{KernelKind, MAX_L2_SECTIONS};
use gearsim_isa::{FMatrix, Instruction, Opcode, Pipe, Program, SReg, Space};
use gearsim_sim::scalar::{self, Step};
use gearsim_sim::{Architecture, Buffer, ChipConfig, CoreKind, MaskState, touches};

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Where: stream, task, kernel, block, pc and instruction as far as they apply.
    pub at: String,
    /// What is wrong.
    pub message: String,
}

/// What the verifier found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Every violation.
    pub violations: Vec<Violation>,
    /// What could not be checked and why (not violations).
    pub notes: Vec<String>,
    /// Distinct kernel launches checked.
    pub launches: usize,
    /// Blocks followed.
    pub blocks: usize,
    /// Instructions followed.
    pub instructions: u64,
}

impl Report {
    /// Whether nothing is wrong.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "verifier: {} violation(s); {} launch(es), {} block(s), {} instruction(s) followed",
            self.violations.len(),
            self.launches,
            self.blocks,
            self.instructions
        )?;
        for v in &self.violations {
            writeln!(f, "  {}: {}", v.at, v.message)?;
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        Ok(())
    }
}

/// The parts of a compiled model the verifier reads.
pub struct ModelView<'a> {
    /// The description (input and output buffer sizes).
    pub desc: &'a ModelDesc,
    /// The task streams.
    pub tasks: &'a ModelTasks,
    /// The kernels, in `.om` order.
    pub kernels: &'a [Program],
    /// Their image flags (empty: none has any); a MIX kernel's vector program is the next
    /// kernel, checked with the launch of its cube program.
    pub kernel_flags: &'a [u32],
    /// Bytes of the weight region.
    pub weight_bytes: u64,
}

/// Most instructions followed per block before giving up on it (with a note).
const MAX_STEPS: u64 = 20_000_000;
/// Most instructions followed in one verification, over all launches and blocks: a model whose
/// shapes make every block loop long (a huge gear, a damaged `.om`) is checked as far as this
/// goes, with a note, instead of keeping `gearsim compile` or `verify` busy for minutes.
const MAX_TOTAL_STEPS: u64 = 100_000_000;
/// Blocks of a launch followed: all up to this many, else the first ones and the last.
const MAX_BLOCKS: u32 = 64;

/// Verifies a model for chip `cfg`.
pub fn verify(m: &ModelView<'_>, cfg: &ChipConfig) -> Report {
    let mut r = Report::default();
    let regions = RegionSizes::of(m);
    check_streams(m, &regions, &mut r);
    let mut seen = BTreeSet::new();
    for (s, tasks) in m.tasks.streams.iter().enumerate() {
        for (i, t) in tasks.iter().enumerate() {
            let OmTask::AiCore {
                kernel,
                block_dim,
                args,
                ..
            } = &t.task
            else {
                continue;
            };
            let Some(program) = m.kernels.get(*kernel as usize) else {
                continue; // reported by check_streams
            };
            let args: Vec<ArgBuf> = args
                .iter()
                .map(|a| ArgBuf {
                    bytes: a.bytes,
                    align: a.addr.offset % ALLOC_ALIGN,
                })
                .collect();
            let key = (*kernel, *block_dim, args.clone());
            if !seen.insert(key) {
                continue;
            }
            r.launches += 1;
            let at = format!(
                "stream {s} task {i} (`{}`), kernel `{}`",
                t.name,
                program.display_name()
            );
            check_launch(program, *block_dim, &args, cfg, &at, &mut r);
            let flags = m.kernel_flags.get(*kernel as usize).copied().unwrap_or(0);
            if KernelKind::of_flags(flags) == KernelKind::Mix {
                match m.kernels.get(*kernel as usize + 1) {
                    Some(vector) => {
                        let at = format!("{at}, its vector program `{}`", vector.display_name());
                        check_launch(vector, *block_dim, &args, cfg, &at, &mut r);
                    }
                    None => r.violations.push(Violation {
                        at,
                        message: "a MIX kernel without its vector program".into(),
                    }),
                }
            }
        }
    }
    r
}

/// Verifies one kernel launch outside a model: argument `i` is a buffer of `args[i].0` bytes
/// at an address `args[i].1` (only its alignment matters). This is what the one-node runner
/// checks before every launch.
pub fn verify_launch(
    program: &Program,
    block_dim: u32,
    args: &[(u64, u64)],
    cfg: &ChipConfig,
) -> Report {
    let mut r = Report {
        launches: 1,
        ..Report::default()
    };
    let args: Vec<ArgBuf> = args
        .iter()
        .map(|&(bytes, addr)| ArgBuf {
            bytes,
            align: addr % ALLOC_ALIGN,
        })
        .collect();
    let at = format!("kernel `{}`", program.display_name());
    check_launch(program, block_dim, &args, cfg, &at, &mut r);
    r
}

/// What the verifier says of an access whose addresses come from tensor data.
const DATA_DEPENDENT: &str = "its addresses depend on values the verifier cannot know";

/// Every region and GM allocation starts on this boundary, so an argument's address modulo it
/// is known at compile time (scalar loads need natural alignment).
const ALLOC_ALIGN: u64 = 512;

struct RegionSizes {
    weights: u64,
    feature_map: u64,
    inputs: Vec<u64>,
    outputs: Vec<u64>,
}

impl RegionSizes {
    fn of(m: &ModelView<'_>) -> RegionSizes {
        let sink = m.desc.dynamic.as_ref().is_some_and(|d| d.getnext_sink);
        RegionSizes {
            weights: m.weight_bytes,
            feature_map: m.tasks.feature_map_bytes,
            inputs: if sink {
                Vec::new()
            } else {
                m.desc.inputs.iter().map(|i| i.bytes).collect()
            },
            outputs: m.desc.outputs.iter().map(|o| o.bytes).collect(),
        }
    }

    fn size(&self, region: Region) -> Option<u64> {
        match region {
            Region::Weights => Some(self.weights),
            Region::FeatureMap => Some(self.feature_map),
            Region::Input(i) => self.inputs.get(i as usize).copied(),
            Region::Output(i) => self.outputs.get(i as usize).copied(),
        }
    }

    /// `bytes` from `a` lie inside its region.
    fn check(&self, a: Addr, bytes: u64, what: &str) -> Result<(), String> {
        let Some(size) = self.size(a.region) else {
            return Err(format!("{what} at {a}: the model has no such region"));
        };
        if a.offset.checked_add(bytes).is_none_or(|e| e > size) {
            return Err(format!(
                "{what} at {a} for {bytes} bytes runs past the end of its region ({size} bytes)"
            ));
        }
        Ok(())
    }
}

fn check_streams(m: &ModelView<'_>, regions: &RegionSizes, r: &mut Report) {
    let mut label_set: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    for (s, tasks) in m.tasks.streams.iter().enumerate() {
        for (i, t) in tasks.iter().enumerate() {
            if let OmTask::LabelSet { label } = t.task
                && let Some((s0, i0)) = label_set.insert(label, (s, i))
            {
                r.violations.push(Violation {
                    at: format!("stream {s} task {i} (`{}`)", t.name),
                    message: format!("label {label} is already set at stream {s0} task {i0}"),
                });
            }
        }
    }
    for (s, tasks) in m.tasks.streams.iter().enumerate() {
        for (i, t) in tasks.iter().enumerate() {
            let at = format!("stream {s} task {i} (`{}`)", t.name);
            let mut bad = |message: String| {
                r.violations.push(Violation {
                    at: at.clone(),
                    message,
                })
            };
            let mut region = |a: Addr, bytes: u64, what: &str| {
                if let Err(e) = regions.check(a, bytes, what) {
                    bad(e);
                }
            };
            let target = |l: u32| -> Option<String> {
                match label_set.get(&l) {
                    None => Some(format!("label {l} is never set")),
                    Some((s2, _)) if *s2 != s => Some(format!(
                        "label {l} is set in stream {s2}, a jump must stay in its stream"
                    )),
                    _ => None,
                }
            };
            match &t.task {
                OmTask::AiCore {
                    kernel,
                    block_dim,
                    args,
                    l2,
                } => {
                    for (k, c) in l2.iter().enumerate() {
                        region(c.addr, c.bytes, &format!("L2 control section {k}"));
                    }
                    if l2.len() > MAX_L2_SECTIONS as usize {
                        r.violations.push(Violation {
                            at: at.clone(),
                            message: format!(
                                "{} L2 control sections (at most {MAX_L2_SECTIONS})",
                                l2.len()
                            ),
                        });
                    }
                    if *kernel as usize >= m.kernels.len() {
                        r.violations.push(Violation {
                            at: at.clone(),
                            message: format!(
                                "kernel {kernel} does not exist ({} kernels)",
                                m.kernels.len()
                            ),
                        });
                    }
                    if *block_dim == 0 {
                        r.violations.push(Violation {
                            at: at.clone(),
                            message: "block_dim is 0".into(),
                        });
                    }
                    for (k, a) in args.iter().enumerate() {
                        if let Err(e) = regions.check(a.addr, a.bytes, &format!("argument {k}")) {
                            r.violations.push(Violation {
                                at: at.clone(),
                                message: e,
                            });
                        }
                    }
                }
                OmTask::MapIndex {
                    layout,
                    n,
                    gears,
                    x,
                    table,
                    y,
                    ..
                } => {
                    region(*x, 4 * u64::from(*n), "the query");
                    region(*table, 4 * layout.table_len(*gears, *n), "the gear table");
                    region(*y, 4, "the result");
                }
                OmTask::GetNext { outputs } => {
                    for (k, o) in outputs.iter().enumerate() {
                        region(o.data, o.capacity, &format!("output {k}"));
                        region(o.shape, SHAPE_TENSOR_BYTES, &format!("shape tensor {k}"));
                    }
                }
                OmTask::GetDynamicDims {
                    shapes,
                    out,
                    shape_info,
                } => {
                    for (k, a) in shapes.iter().enumerate() {
                        region(*a, SHAPE_TENSOR_BYTES, &format!("shape tensor {k}"));
                    }
                    let dims = shape_info.len() as u64;
                    region(*out, 4 * dims.max(1), "the gear vector");
                }
                OmTask::LabelSwitch { index, labels } => {
                    region(*index, 4, "the index");
                    if labels.is_empty() {
                        bad("the label list is empty".into());
                    }
                    for l in labels {
                        if let Some(e) = target(*l) {
                            bad(e);
                        }
                    }
                }
                OmTask::LabelGoto { label } => {
                    if let Some(e) = target(*label) {
                        bad(e);
                    }
                }
                OmTask::StreamActive { stream: Some(st) }
                    if *st as usize >= m.tasks.streams.len() =>
                {
                    bad(format!("stream {st} does not exist"));
                }
                OmTask::Memcpy { dst, src, size } => {
                    region(*dst, *size, "the destination");
                    region(*src, *size, "the source");
                }
                OmTask::AiCpu {
                    op,
                    inputs,
                    outputs,
                } => {
                    for (k, a) in inputs.iter().enumerate() {
                        region(a.addr, a.bytes, &format!("input {k}"));
                    }
                    for (k, a) in outputs.iter().enumerate() {
                        region(a.addr, a.bytes, &format!("output {k}"));
                    }
                    let sizes = |l: &[KernelArg]| l.iter().map(|a| a.bytes).collect::<Vec<_>>();
                    if let Err(e) = op.check(&sizes(inputs), &sizes(outputs)) {
                        bad(e);
                    }
                }
                OmTask::LabelSet { .. }
                | OmTask::StreamActive { .. }
                | OmTask::EventRecord { .. }
                | OmTask::StreamWaitEvent { .. }
                | OmTask::EndGraph => {}
            }
        }
    }
    match m.tasks.streams.first().and_then(|s| s.last()) {
        Some(t) if t.task == OmTask::EndGraph => {}
        _ => r.violations.push(Violation {
            at: "stream 0".into(),
            message: "the head stream does not end with EndGraph".into(),
        }),
    }
}

/// An argument buffer: its size and its address modulo [`ALLOC_ALIGN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct ArgBuf {
    bytes: u64,
    align: u64,
}

/// Where the argument array seems to live while following a kernel.
const ARGS_BASE: u64 = 0xa << 44;

/// Where argument `i`'s buffer seems to live (its alignment is kept).
fn arg_base(i: usize, a: &ArgBuf) -> u64 {
    ((i as u64 + 1) << 40) + a.align
}

fn check_launch(
    program: &Program,
    block_dim: u32,
    args: &[ArgBuf],
    cfg: &ChipConfig,
    at: &str,
    r: &mut Report,
) {
    let blocks: Vec<u32> = if block_dim <= MAX_BLOCKS {
        (0..block_dim).collect()
    } else {
        (0..MAX_BLOCKS - 1)
            .chain(std::iter::once(block_dim - 1))
            .collect()
    };
    if block_dim > MAX_BLOCKS {
        r.notes.push(format!(
            "{at}: {} of {block_dim} blocks followed",
            blocks.len()
        ));
    }
    // On a separated chip the kernel runs on the cores its instructions need, which must be
    // of one kind (a cube and a vector side are a MIX kernel's two programs).
    let kind = match cfg.core.architecture {
        Architecture::Coupled => CoreKind::Coupled,
        Architecture::Separated => match gearsim_firmware::core_kind_of(program) {
            Ok(k) => k,
            Err(e) => {
                r.violations.push(Violation {
                    at: at.to_string(),
                    message: format!("on {}: {e}", cfg.name),
                });
                return;
            }
        },
    };
    let mut found: BTreeMap<(u32, String), (u32, u64)> = BTreeMap::new(); // (pc, msg) -> (first block, count)
    for b in blocks {
        let budget = MAX_STEPS.min(MAX_TOTAL_STEPS.saturating_sub(r.instructions));
        if budget == 0 {
            r.notes.push(format!(
                "{at}: block {b} and later not followed: the verifier's budget of \
                 {MAX_TOTAL_STEPS} instructions is spent"
            ));
            break;
        }
        r.blocks += 1;
        let mut run = Run {
            program,
            args,
            cfg,
            kind,
            block: b,
            block_dim,
            regs: [0; 32],
            known: 0,
            mask: MaskState::Normal(u128::MAX),
            mask_known: true,
            fmatrix: FMatrix::RESET,
            flags: BTreeMap::new(),
            found: &mut found,
        };
        let (steps, note) = run.follow(budget);
        r.instructions += steps;
        if let Some(n) = note {
            r.notes.push(format!("{at}, block {b}: {n}"));
        }
    }
    for ((pc, msg), (block, count)) in found {
        let instr = program.disasm_at(pc as usize);
        let times = if count > 1 {
            format!(" ({count} times)")
        } else {
            String::new()
        };
        let at = format!("{at}, block {block}, pc {pc} (`{}`)", instr.trim());
        if msg == DATA_DEPENDENT {
            // Not a violation: the simulator checks these accesses against the memory map when
            // they run (a gather's indices, say).
            r.notes
                .push(format!("{at}: {msg}{times}; checked at run time only"));
        } else {
            r.violations.push(Violation {
                at,
                message: format!("{msg}{times}"),
            });
        }
    }
}

struct Run<'a> {
    program: &'a Program,
    args: &'a [ArgBuf],
    cfg: &'a ChipConfig,
    kind: CoreKind,
    block: u32,
    block_dim: u32,
    regs: [u64; 32],
    /// Bit i: register i holds a value the verifier knows (not data read from memory).
    known: u32,
    mask: MaskState,
    mask_known: bool,
    fmatrix: FMatrix,
    flags: BTreeMap<(Pipe, Pipe, u8), u32>,
    found: &'a mut BTreeMap<(u32, String), (u32, u64)>,
}

impl Run<'_> {
    fn report(&mut self, pc: u32, message: String) {
        let e = self.found.entry((pc, message)).or_insert((self.block, 0));
        e.1 += 1;
    }

    fn set(&mut self, r: usize, v: u64, known: bool) {
        self.regs[r] = v;
        if known {
            self.known |= 1 << r;
        } else {
            self.known &= !(1 << r);
        }
    }

    fn is_known(&self, r: usize) -> bool {
        self.known & (1 << r) != 0
    }

    fn local_size(&self, b: Buffer) -> u64 {
        let c = &self.cfg.core;
        match b {
            Buffer::Gm => u64::MAX,
            Buffer::Ub => c.ub_bytes,
            Buffer::L1 => c.l1_bytes,
            Buffer::L0a => c.l0a_bytes,
            Buffer::L0b => c.l0b_bytes,
            Buffer::L0c => c.l0c_bytes,
            Buffer::Bt => c.bt_bytes,
            Buffer::Fb => c.fb_bytes,
        }
    }

    /// Checks a GM range against the argument buffers; returns the argument it belongs to.
    fn check_gm(&mut self, pc: u32, start: u64, end: u64, what: &str) -> Option<usize> {
        for (i, a) in self.args.iter().enumerate() {
            let base = arg_base(i, a);
            if start >= base - a.align && start < base - a.align + (1 << 40) {
                if start < base || end > base + a.bytes {
                    self.report(
                        pc,
                        format!(
                            "{what} touches bytes {}..{} of argument {i}, whose buffer has {} bytes",
                            start as i128 - base as i128,
                            end as i128 - base as i128,
                            a.bytes
                        ),
                    );
                }
                return Some(i);
            }
        }
        self.report(
            pc,
            format!("{what} at GM address {start:#x} does not come from any argument"),
        );
        None
    }

    /// Follows the block to its end, at most `limit` instructions; returns the instructions
    /// followed and why it stopped early.
    fn follow(&mut self, limit: u64) -> (u64, Option<String>) {
        let mut pc: u32 = 0;
        let mut steps = 0u64;
        loop {
            if steps >= limit {
                return (steps, Some(format!("stopped after {limit} instructions")));
            }
            steps += 1;
            let Some(instr) = self.program.instrs.get(pc as usize).copied() else {
                self.report(
                    pc,
                    "pc runs past the end of the kernel (a block must end with `end`)".into(),
                );
                return (steps, None);
            };
            let mut next = pc + 1;
            match scalar::step(&instr, &self.regs) {
                Step::End => {
                    let left: Vec<String> = self
                        .flags
                        .iter()
                        .filter(|(_, n)| **n > 0)
                        .map(|((s, d, id), _)| format!("{s}->{d} #{id}"))
                        .collect();
                    if !left.is_empty() {
                        self.report(pc, format!("flags left set at end: {}", left.join(", ")));
                    }
                    return (steps, None);
                }
                Step::ReadSpecial(f) => {
                    let (v, known) = match f.which {
                        SReg::BlockIdx => (u64::from(self.block), true),
                        SReg::BlockNum => (u64::from(self.block_dim), true),
                        SReg::Args => (ARGS_BASE, true),
                        SReg::CoreId => (u64::from(self.block % self.cfg.core.count.max(1)), true),
                        SReg::Cycle => (0, false),
                        SReg::SubBlockIdx => (0, true),
                    };
                    self.set(f.dst.index(), v, known);
                }
                Step::Write { dst, value, srcs } => {
                    let known = srcs.as_slice().iter().all(|s| self.is_known(*s));
                    self.set(dst, value, known);
                }
                Step::Branch {
                    taken,
                    target,
                    srcs,
                } => {
                    if !srcs.as_slice().iter().all(|s| self.is_known(*s)) {
                        return (
                            steps,
                            Some(format!(
                                "pc {pc}: branch depends on data; path not followed further"
                            )),
                        );
                    }
                    if taken {
                        next = target;
                    }
                }
                Step::Loop {
                    counter,
                    value,
                    taken,
                    target,
                } => {
                    if !self.is_known(counter) {
                        return (
                            steps,
                            Some(format!(
                                "pc {pc}: loop count depends on data; path not followed further"
                            )),
                        );
                    }
                    self.regs[counter] = value;
                    if taken {
                        next = target;
                    }
                }
                Step::Memory(f, load) => {
                    if !self.is_known(f.base.index()) {
                        return (
                            steps,
                            Some(format!(
                                "pc {pc}: scalar address depends on data; path not followed further"
                            )),
                        );
                    }
                    let addr = self.regs[f.base.index()].wrapping_add(i64::from(f.off) as u64);
                    let size = f.width.size() as u64;
                    if !addr.is_multiple_of(size) {
                        self.report(
                            pc,
                            format!("scalar access at {addr:#x} is not {size}-byte aligned"),
                        );
                    }
                    let (value, known) = match f.space {
                        Space::Gm => {
                            let args_end = ARGS_BASE + 8 * self.args.len() as u64;
                            if (ARGS_BASE..args_end).contains(&addr) {
                                if !load {
                                    self.report(pc, "a store into the argument array".into());
                                }
                                let i = ((addr - ARGS_BASE) / 8) as usize;
                                if size != 8 || !addr.is_multiple_of(8) {
                                    self.report(
                                        pc,
                                        "an argument is read other than as one u64".into(),
                                    );
                                }
                                (arg_base(i, &self.args[i]), true)
                            } else if (args_end..ARGS_BASE + (1 << 40)).contains(&addr) {
                                self.report(
                                    pc,
                                    format!(
                                        "reads argument {} of {}",
                                        (addr - ARGS_BASE) / 8,
                                        self.args.len()
                                    ),
                                );
                                (0, false)
                            } else {
                                self.check_gm(pc, addr, addr + size, "scalar access");
                                (0, false)
                            }
                        }
                        Space::Ub | Space::L1 => {
                            let b = if f.space == Space::Ub {
                                Buffer::Ub
                            } else {
                                Buffer::L1
                            };
                            let limit = self.local_size(b);
                            if addr.checked_add(size).is_none_or(|e| e > limit) {
                                self.report(pc, format!("scalar access at {b} {addr:#x} is outside its {limit} bytes"));
                            }
                            (0, false)
                        }
                    };
                    if load {
                        self.set(f.reg.index(), value, known);
                    }
                }
                Step::SetMask { mask, srcs } => {
                    self.mask_known = srcs.as_slice().iter().all(|s| self.is_known(*s));
                    self.mask = mask;
                }
                Step::SetFmatrix(f) => self.fmatrix = *f,
                Step::SetFlag(f) | Step::WaitFlag(f) => {
                    let set = instr.opcode() == Opcode::SetFlag;
                    if u32::from(f.id) >= u32::from(self.cfg.core.event_ids) {
                        self.report(
                            pc,
                            format!(
                                "flag id {} is past the chip's {} event ids",
                                f.id, self.cfg.core.event_ids
                            ),
                        );
                    }
                    let key = (f.src, f.dst, f.id);
                    let n = self.flags.entry(key).or_insert(0);
                    if set {
                        if *n > 0 {
                            self.report(pc, "set_flag on a flag still set: the core would wait forever for a wait_flag that comes later".into());
                        } else {
                            *n = 1;
                        }
                    } else if *n == 0 {
                        self.report(
                            pc,
                            "wait_flag on a flag nothing has set: the pipe would wait forever"
                                .into(),
                        );
                    } else {
                        *n = 0;
                    }
                }
                Step::CrossSet(gearsim_isa::CrossSet { id, .. })
                | Step::CrossWait(gearsim_isa::CrossWait { id, .. }) => {
                    let ids = self.cfg.core.cross_core_flag_ids;
                    if ids == 0 {
                        self.report(
                            pc,
                            format!(
                                "cross-core flags exist on separated chips only; {} has coupled AI cores",
                                self.cfg.name
                            ),
                        );
                    } else if id.get() >= ids {
                        self.report(
                            pc,
                            format!("cross-core flag id {id} is past the chip's {ids} ids"),
                        );
                    }
                    self.pipe_instruction(pc, &instr);
                }
                // A barrier touches nothing but goes through the same check as a pipe
                // instruction.
                Step::Barrier(_) | Step::Dispatched => self.pipe_instruction(pc, &instr),
                Step::Nop => {}
            }
            pc = next;
        }
    }

    fn pipe_instruction(&mut self, pc: u32, instr: &Instruction) {
        let pipe = instr.pipe();
        if !self.kind.has_pipe(pipe) {
            self.report(
                pc,
                format!(
                    "{} runs on the {pipe} pipe, which {} does not have",
                    instr.spec().mnemonic,
                    self.kind.long_name()
                ),
            );
            return;
        }
        // Registers the verifier does not know are tried with two values: ranges that change
        // depend on data and cannot be checked statically.
        let mut low = self.regs;
        let mut high = self.regs;
        for i in 0..32 {
            if !self.is_known(i) {
                low[i] = 0;
                high[i] = 1 << 50;
            }
        }
        let Some(a) = touches(instr, &low, self.mask, self.fmatrix, self.cfg) else {
            return;
        };
        let b = touches(instr, &high, self.mask, self.fmatrix, self.cfg);
        let ranges = match a {
            Ok(t) => t,
            Err(e) => {
                self.report(pc, e);
                return;
            }
        };
        if b.as_ref().is_none_or(|b| b.as_ref().ok() != Some(&ranges)) || !self.mask_known {
            self.report(pc, DATA_DEPENDENT.into());
            return;
        }
        for t in ranges {
            match t.buffer {
                Buffer::Gm => {
                    let what = if t.write { "a write" } else { "a read" };
                    self.check_gm(pc, t.start, t.end, what);
                }
                other if !self.kind.has_buffer(other) => self.report(
                    pc,
                    format!(
                        "{} uses {other}, which {} does not have",
                        instr.spec().mnemonic,
                        self.kind.long_name()
                    ),
                ),
                other => {
                    let limit = self.local_size(other);
                    if t.end > limit {
                        self.report(
                            pc,
                            format!(
                                "{} {other} bytes {:#x}..{:#x}, past its {limit} bytes",
                                if t.write { "writes" } else { "reads" },
                                t.start,
                                t.end
                            ),
                        );
                    }
                }
            }
        }
    }
}
