//! AI core kernel dispatch: the kernel images in device memory (their format, and the cache of
//! images already decoded and loaded on the chip), the kernel runs in flight, and the dispatch
//! of their blocks onto free cores — the lowest free core first, `block_dispatch_ns` apart,
//! in waves when `block_dim` exceeds the cores. It knows which task a run is for and sets that
//! task's done timer; it knows nothing else of streams.
//!
//! On a separated chip a kernel runs on the cores of its kind ([`KernelKind`]): a cube kernel's
//! blocks on cube cores, a vector kernel's on vector cores, and a MIX kernel's block `b` on one
//! whole AI core at once — its cube core runs the image's cube program as block `b` of
//! `block_dim`, its vector cores the vector program as blocks `v·b + s` of `v·block_dim`, after
//! the MIX start-up (`scheduler.mix_launch_ns`).

use std::collections::BTreeMap;

use gearsim_isa::task::{
    AiCoreKernel, KERNEL_MIX_ONE_VECTOR, KernelKind, L2_SECTION_BYTES, L2Action, L2Section,
    MAX_L2_SECTIONS,
};
use gearsim_isa::{Pipe, PipeSide, Program};
use gearsim_sim::{
    Architecture, BlockLaunch, Chip, ChipConfig, CoreKind, CoreStats, CrossGroup, ExecMode, Kernel,
    LANES, Tick, Traffic,
};
use gearsim_traces::TraceSink;

use crate::context::{Ctx, bad};
use crate::error::{DeviceError, TaskRef};
use crate::timers::{Fw, ns};

/// Magic bytes at the start of a kernel image.
pub const KERNEL_MAGIC: [u8; 8] = *b"GEARKRN\0";
/// Size of a kernel image's header: magic, instruction count (u32), flags (u32).
pub const KERNEL_HEADER_BYTES: u64 = 16;
pub use gearsim_isa::task::KERNEL_NEEDS_VALUES;
/// Longest kernel image the scheduler decodes.
pub const MAX_KERNEL_INSTRUCTIONS: u32 = 1 << 20;

/// The kernel image of `program` with image `flags`: header, then the encoded instructions.
pub(crate) fn encode_image(program: &Program, flags: u32) -> Result<Vec<u8>, DeviceError> {
    let words = program
        .encode()
        .map_err(|(pc, e)| DeviceError::InvalidLaunch(format!("kernel instruction {pc}: {e}")))?;
    let count = u32::try_from(program.instrs.len()).unwrap_or(u32::MAX);
    let mut image = Vec::with_capacity(KERNEL_HEADER_BYTES as usize + words.len());
    image.extend_from_slice(&KERNEL_MAGIC);
    image.extend_from_slice(&count.to_le_bytes());
    image.extend_from_slice(&flags.to_le_bytes());
    image.extend_from_slice(&words);
    Ok(image)
}

/// The MIX image of a cube program and a vector program: the cube program's image (flagged
/// [`KernelKind::Mix`]) followed by the vector program's (flagged [`KernelKind::Vector`]).
pub(crate) fn encode_mix_image(
    cube: &Program,
    vector: &Program,
    flags: u32,
) -> Result<Vec<u8>, DeviceError> {
    let rest = flags & !gearsim_isa::task::KERNEL_KIND_MASK;
    let mut image = encode_image(cube, rest | KernelKind::Mix.flags())?;
    image.extend(encode_image(vector, rest | KernelKind::Vector.flags())?);
    Ok(image)
}

/// The core kind a program needs on a separated chip: a vector core when it uses the vector
/// pipes (V, MTE3), a cube core when it uses the cube pipes (M, MTE1, FIXPIPE), and a vector
/// core when it uses neither (a scalar or copy kernel); using both is an error naming one
/// instruction of each side.
pub fn core_kind_of(program: &Program) -> Result<CoreKind, String> {
    let side = |want: PipeSide| {
        program
            .instrs
            .iter()
            .enumerate()
            .find(|(_, i)| i.pipe().side() == want)
    };
    match (side(PipeSide::Cube), side(PipeSide::Vector)) {
        (Some((c, ci)), Some((v, vi))) => Err(format!(
            "it uses the cube side (pc {c}: {}) and the vector side (pc {v}: {}), which are \
             different cores on a separated chip: split it into a MIX kernel",
            ci.spec().mnemonic,
            vi.spec().mnemonic
        )),
        (Some(_), None) => Ok(CoreKind::Cube),
        (None, _) => Ok(CoreKind::Vector),
    }
}

/// Where a loaded kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// One program on cores of one kind.
    Single(usize, CoreKind),
    /// A cube program on a cube core and a vector program on `vectors` of its AI core's
    /// vector cores.
    Mix {
        cube: usize,
        vector: usize,
        vectors: u32,
    },
}

struct KernelEntry {
    placement: Placement,
    needs_values: bool,
}

struct KernelRun {
    task: TaskRef,
    placement: Placement,
    /// Its cross-core group (the run's number and block counts).
    group: CrossGroup,
    /// Blocks on cores (a MIX block counts its cube core and each vector core).
    parts: u32,
    /// Address of its kernel image.
    image: u64,
    block_dim: u32,
    args: u64,
    mode: ExecMode,
    next_block: u32,
    done: u32,
    ready_at: Tick,
    first_start: Option<Tick>,
    end: Tick,
    cores: Vec<bool>,
    /// When the task started (before `kernel_launch_ns`).
    launched: Tick,
    /// The work of its finished blocks, summed (profiling only).
    work: CoreStats,
    /// Per pipe, the time its finished blocks ran on cores that have the pipe (profiling only).
    pipe_ps: [u64; LANES],
    /// The chip's traffic counters when it was launched.
    traffic_at_launch: Traffic,
    /// The L2 ranges its launch forgets when its last block ends.
    l2_drops: Vec<(u64, u64)>,
}

/// One finished AI core kernel run, as msprof's op summary shows it: when it ran, on how many
/// cores, and what its blocks kept each pipe busy with (summed over its blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelProfile {
    /// The task that launched it.
    pub task: TaskRef,
    /// The kernel's name (the op it was lowered from).
    pub name: String,
    /// `block_dim` of the launch.
    pub block_dim: u32,
    /// Distinct cores its blocks ran on (cube and vector cores both count).
    pub cores_used: u32,
    /// Which cores it ran on.
    pub kind: KernelKind,
    /// When its task started.
    pub launched: Tick,
    /// When its first block started (after the launch cost and block dispatch).
    pub first_start: Tick,
    /// When its last block finished.
    pub end: Tick,
    /// Busy cycles and instructions per pipe and cube MACs, summed over its blocks.
    pub work: CoreStats,
    /// Per pipe (indexed like [`Pipe::EXECUTING`]), the time its blocks ran on cores that have
    /// that pipe, summed, in picoseconds: what a pipe's busy cycles are a share of.
    pub pipe_ps: [u64; LANES],
    /// Device-memory traffic from its launch to its end, chip-wide: on one stream that is
    /// its own plus the write-backs of lines its predecessors left dirty in the L2.
    pub traffic: Traffic,
}

/// Timing of the most recent AI core kernel run (for `Device::launch`'s report).
#[derive(Debug, Clone, Default)]
pub(crate) struct RunSummary {
    pub first_start: Option<Tick>,
    pub end: Tick,
    pub cores_used: u32,
}

/// Kernel images, kernel runs and the cores they occupy.
pub(crate) struct Dispatch {
    /// Image address -> its kernel on the chip.
    kernels: BTreeMap<u64, KernelEntry>,
    names: BTreeMap<u64, String>,
    runs: BTreeMap<u32, KernelRun>,
    next_run: u32,
    /// The run each core's block belongs to.
    core_run: Vec<Option<u32>>,
    /// When the (serial) block dispatch is next free.
    block_slot: Tick,
    /// Whether kernels compute values or only times (those needing values always compute).
    pub mode: ExecMode,
    /// The most recent finished run.
    pub last_run: Option<RunSummary>,
    /// Finished runs, oldest first, while profiling is on (`None`: off).
    pub profile: Option<Vec<KernelProfile>>,
    /// Each busy core's statistics when its current block started (profiling only).
    block_base: Vec<CoreStats>,
    /// When each busy core's current block started (profiling only).
    block_start: Vec<Tick>,
    /// Which of [`Pipe::EXECUTING`] each core has.
    core_pipes: Vec<[bool; LANES]>,
    launch_ns: u64,
    mix_launch_ns: u64,
    dispatch_ns: u64,
    max_block_dim: u32,
    architecture: Architecture,
    vectors_per_core: u32,
}

impl Dispatch {
    pub(crate) fn new(cfg: &ChipConfig) -> Dispatch {
        Dispatch {
            kernels: BTreeMap::new(),
            names: BTreeMap::new(),
            runs: BTreeMap::new(),
            next_run: 0,
            core_run: vec![None; cfg.total_cores() as usize],
            block_slot: Tick::ZERO,
            mode: ExecMode::Full,
            last_run: None,
            profile: None,
            block_base: vec![CoreStats::default(); cfg.total_cores() as usize],
            block_start: vec![Tick::ZERO; cfg.total_cores() as usize],
            core_pipes: cfg
                .core_slots()
                .iter()
                .map(|slot| Pipe::EXECUTING.map(|p| slot.kind.has_pipe(p)))
                .collect(),
            launch_ns: cfg.scheduler.kernel_launch_ns,
            mix_launch_ns: cfg.scheduler.mix_launch_ns,
            dispatch_ns: cfg.scheduler.block_dispatch_ns,
            max_block_dim: cfg.scheduler.max_block_dim,
            architecture: cfg.core.architecture,
            vectors_per_core: cfg.core.vector_cores_per_core,
        }
    }

    /// Records the image at `addr` (flags as in its header) whose programs the chip already
    /// holds: `chip_ids` is the one program, or a MIX kernel's cube and vector programs;
    /// `needs` is [`core_kind_of`] its (first) program.
    pub(crate) fn register(
        &mut self,
        addr: u64,
        chip_ids: (usize, Option<usize>),
        flags: u32,
        name: String,
        needs: Result<CoreKind, String>,
    ) -> Result<(), String> {
        let placement = self.placement(chip_ids, flags, needs)?;
        self.kernels.insert(
            addr,
            KernelEntry {
                placement,
                needs_values: flags & KERNEL_NEEDS_VALUES != 0,
            },
        );
        self.names.insert(addr, name);
        Ok(())
    }

    /// Where a kernel of `kind` runs on this chip, checked against the chip's architecture.
    fn placement(
        &self,
        chip_ids: (usize, Option<usize>),
        flags: u32,
        needs: Result<CoreKind, String>,
    ) -> Result<Placement, String> {
        let kind = KernelKind::of_flags(flags);
        let separated = self.architecture == Architecture::Separated;
        match (kind, chip_ids.1) {
            (KernelKind::AiCore, None) if !separated => {
                Ok(Placement::Single(chip_ids.0, CoreKind::Coupled))
            }
            (KernelKind::AiCore, None) => Ok(Placement::Single(chip_ids.0, needs?)),
            (KernelKind::Cube | KernelKind::Vector | KernelKind::Mix, _) if !separated => {
                Err(format!(
                    "a {kind:?} kernel needs a separated chip (cube and vector cores); this one \
                     has coupled AI cores"
                ))
            }
            (KernelKind::Cube, None) => Ok(Placement::Single(chip_ids.0, CoreKind::Cube)),
            (KernelKind::Vector, None) => Ok(Placement::Single(chip_ids.0, CoreKind::Vector)),
            (KernelKind::Mix, Some(vector)) => Ok(Placement::Mix {
                cube: chip_ids.0,
                vector,
                vectors: if flags & KERNEL_MIX_ONE_VECTOR != 0 {
                    1
                } else {
                    self.vectors_per_core
                },
            }),
            (KernelKind::Mix, None) => Err("a MIX kernel needs a vector program".into()),
            (KernelKind::AiCore | KernelKind::Cube | KernelKind::Vector, Some(_)) => {
                Err("only a MIX kernel has a second program".into())
            }
        }
    }

    /// The name of the kernel image at `addr`.
    pub(crate) fn name(&self, addr: u64) -> Option<&str> {
        self.names.get(&addr).map(String::as_str)
    }

    /// Reads and decodes the one image at `addr`: its flags and program.
    fn read_image<S: TraceSink>(
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        addr: u64,
        name: &str,
    ) -> Result<(u32, Program, u64), DeviceError> {
        const K: &str = "AiCoreKernel";
        let cap = cx.chip.memory().capacity();
        if addr
            .checked_add(KERNEL_HEADER_BYTES)
            .is_none_or(|e| e > cap)
        {
            return Err(bad(
                at,
                K,
                "kernel",
                format!("kernel pointer {addr:#x} is outside device memory ({cap} bytes)"),
            ));
        }
        let mut header = [0u8; KERNEL_HEADER_BYTES as usize];
        cx.chip.read_mem(addr, &mut header)?;
        if header[..8] != KERNEL_MAGIC {
            return Err(bad(
                at,
                K,
                "kernel",
                format!("no kernel image at {addr:#x} (bad magic)"),
            ));
        }
        let count = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        let flags = u32::from_le_bytes([header[12], header[13], header[14], header[15]]);
        if count == 0 || count > MAX_KERNEL_INSTRUCTIONS {
            return Err(bad(
                at,
                K,
                "kernel",
                format!(
                    "kernel image at {addr:#x} claims {count} instructions (expected 1..={MAX_KERNEL_INSTRUCTIONS})"
                ),
            ));
        }
        let len = u64::from(count) * gearsim_isa::WORD_BYTES as u64;
        let body = addr + KERNEL_HEADER_BYTES;
        cx.check_range(at, K, "kernel", body, len)?;
        let mut words = vec![0u8; len as usize];
        cx.chip.read_mem(body, &mut words)?;
        let program = Program::decode(Some(name.to_string()), &words)
            .map_err(|e| bad(at, K, "kernel", format!("kernel image at {addr:#x}: {e}")))?;
        Ok((flags, program, body + len))
    }

    /// The placement and "needs values" flag of the image at `addr`, decoding it from device
    /// memory the first time.
    fn resolve<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        addr: u64,
    ) -> Result<(Placement, bool), DeviceError> {
        if let Some(e) = self.kernels.get(&addr) {
            return Ok((e.placement, e.needs_values));
        }
        const K: &str = "AiCoreKernel";
        let name = self
            .names
            .get(&addr)
            .cloned()
            .unwrap_or_else(|| format!("kernel@{addr:#x}"));
        let (flags, program, end) = Self::read_image(cx, at, addr, &name)?;
        let second = if KernelKind::of_flags(flags) == KernelKind::Mix {
            let (vflags, vector, _) = Self::read_image(cx, at, end, &name)?;
            if KernelKind::of_flags(vflags) != KernelKind::Vector {
                return Err(bad(
                    at,
                    K,
                    "kernel",
                    format!(
                        "MIX kernel image at {addr:#x}: the image after its cube program is not a vector program"
                    ),
                ));
            }
            Some(vector)
        } else {
            None
        };
        let needs = core_kind_of(&program);
        let mut load = |p: Program| {
            cx.chip
                .load_kernel(Kernel::new(p))
                .map_err(|e| bad(at, K, "kernel", e.to_string()))
        };
        let first = load(program)?;
        let second = second.map(&mut load).transpose()?;
        self.register(addr, (first, second), flags, name, needs)
            .map_err(|e| bad(at, K, "kernel", format!("kernel image at {addr:#x}: {e}")))?;
        let e = &self.kernels[&addr];
        Ok((e.placement, e.needs_values))
    }

    /// An `AiCoreKernel` task: its blocks queue for the cores after `kernel_launch_ns` (and a
    /// MIX kernel's start-up).
    pub(crate) fn start<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        at: TaskRef,
        k: &AiCoreKernel,
    ) -> Result<(), DeviceError> {
        let (placement, needs_values) = self.resolve(cx, at, k.kernel)?;
        let max = self.max_block_dim;
        if k.block_dim == 0 || k.block_dim > max {
            return Err(bad(
                at,
                "AiCoreKernel",
                "block_dim",
                format!("{} is outside [1, {max}]", k.block_dim),
            ));
        }
        if k.args != 0 {
            cx.check_range(at, "AiCoreKernel", "args", k.args, 8)?;
        }
        let l2_drops = apply_l2_control(cx, at, k)?;
        let mode = if needs_values {
            ExecMode::Full
        } else {
            self.mode
        };
        let now = cx.now();
        let cores = cx.chip.core_count() as usize;
        let id = self.next_run;
        self.next_run += 1;
        let (group, parts, start_up) = match placement {
            Placement::Single(_, kind) => (
                CrossGroup::solo(id, kind, k.block_dim),
                k.block_dim,
                self.launch_ns,
            ),
            Placement::Mix { vectors: v, .. } => (
                CrossGroup {
                    id,
                    mix: true,
                    cube_blocks: k.block_dim,
                    vector_blocks: k.block_dim * v,
                    vectors_per_core: v,
                },
                k.block_dim * (1 + v),
                self.launch_ns + self.mix_launch_ns,
            ),
        };
        self.runs.insert(
            id,
            KernelRun {
                task: at,
                placement,
                group,
                parts,
                image: k.kernel,
                block_dim: k.block_dim,
                args: k.args,
                mode,
                next_block: 0,
                done: 0,
                ready_at: now + ns(start_up),
                first_start: None,
                end: now,
                cores: vec![false; cores],
                launched: now,
                work: CoreStats::default(),
                pipe_ps: [0; LANES],
                traffic_at_launch: cx.chip.traffic(),
                l2_drops,
            },
        );
        self.dispatch_blocks(cx.chip)
    }

    /// Whether `core` can take a block now.
    fn core_free<S: TraceSink>(&self, chip: &Chip<S>, core: u32) -> bool {
        self.core_run[core as usize].is_none() && chip.core_free_at(core).is_some()
    }

    /// The cores the next block of a kernel placed so would run on: the lowest free core of its
    /// kind, or for a MIX kernel the lowest AI core whose cube core and vector cores are all
    /// free (cube core first).
    fn free_cores<S: TraceSink>(&self, chip: &Chip<S>, placement: Placement) -> Option<Vec<u32>> {
        let n = chip.config().core.count;
        match placement {
            Placement::Single(_, CoreKind::Coupled) => (0..chip.core_count())
                .find(|&c| self.core_free(chip, c))
                .map(|c| vec![c]),
            Placement::Single(_, CoreKind::Cube) => {
                (0..n).find(|&c| self.core_free(chip, c)).map(|c| vec![c])
            }
            Placement::Single(_, CoreKind::Vector) => (n..chip.core_count())
                .find(|&c| self.core_free(chip, c))
                .map(|c| vec![c]),
            Placement::Mix { vectors, .. } => (0..n)
                .map(|a| {
                    std::iter::once(a)
                        .chain((0..vectors).map(|s| chip.config().vector_core_id(a, s)))
                        .collect::<Vec<u32>>()
                })
                .find(|group| group.iter().all(|&c| self.core_free(chip, c))),
        }
    }

    /// Hands pending blocks to free cores, one per dispatch slot, oldest kernel first.
    fn dispatch_blocks<S: TraceSink>(&mut self, chip: &mut Chip<S>) -> Result<(), DeviceError> {
        let now = chip.now();
        let dispatch = ns(self.dispatch_ns);
        let ids: Vec<u32> = self.runs.keys().copied().collect();
        for id in ids {
            while let Some(run) = self.runs.get(&id) {
                if run.next_block >= run.block_dim {
                    break;
                }
                let Some(cores) = self.free_cores(chip, run.placement) else {
                    return Ok(());
                };
                let free_at = cores
                    .iter()
                    .filter_map(|&c| chip.core_free_at(c))
                    .max()
                    .unwrap_or(now);
                let start = now.max(run.ready_at).max(free_at).max(self.block_slot);
                let b = run.next_block;
                let launch =
                    |kernel: usize, block_idx: u32, block_dim: u32, sub_block: u8| BlockLaunch {
                        kernel,
                        block_idx,
                        block_dim,
                        sub_block,
                        group: run.group,
                        args: run.args,
                        mode: run.mode,
                    };
                let launches: Vec<(u32, BlockLaunch)> = match run.placement {
                    Placement::Single(kernel, _) => {
                        vec![(cores[0], launch(kernel, b, run.block_dim, 0))]
                    }
                    // The cube core first, then the vector cores in order.
                    Placement::Mix {
                        cube,
                        vector,
                        vectors: v,
                    } => std::iter::once(launch(cube, b, run.block_dim, 0))
                        .chain(
                            (0..v).map(|s| launch(vector, b * v + s, run.block_dim * v, s as u8)),
                        )
                        .zip(cores.iter().copied())
                        .map(|(l, c)| (c, l))
                        .collect(),
                };
                for (core, launch) in launches {
                    chip.start_block(core, launch, start)?;
                    if self.profile.is_some() {
                        self.block_base[core as usize] = chip.core_stats(core).unwrap_or_default();
                        self.block_start[core as usize] = start;
                    }
                    self.core_run[core as usize] = Some(id);
                    if let Some(run) = self.runs.get_mut(&id) {
                        run.cores[core as usize] = true;
                    }
                }
                self.block_slot = start + dispatch;
                if let Some(run) = self.runs.get_mut(&id) {
                    run.next_block += 1;
                    run.first_start.get_or_insert(start);
                }
            }
        }
        Ok(())
    }

    /// A block finished on `core` at `at`: when it was its run's last, the run's task is done
    /// then; the core takes the next block.
    pub(crate) fn block_finished<S: TraceSink>(
        &mut self,
        cx: &mut Ctx<'_, S>,
        core: u32,
        at: Tick,
    ) -> Result<(), DeviceError> {
        let Some(id) = self.core_run.get_mut(core as usize).and_then(Option::take) else {
            return Ok(());
        };
        let profiling = self.profile.is_some();
        let finished = match self.runs.get_mut(&id) {
            Some(run) => {
                if profiling {
                    let now = cx.chip.core_stats(core).unwrap_or_default();
                    add_delta(&mut run.work, &now, &self.block_base[core as usize]);
                    let ran = at.0.saturating_sub(self.block_start[core as usize].0);
                    if let Some(has) = self.core_pipes.get(core as usize) {
                        for (ps, has) in run.pipe_ps.iter_mut().zip(has) {
                            if *has {
                                *ps += ran;
                            }
                        }
                    }
                }
                run.done += 1;
                run.end = run.end.max(at);
                run.done == run.parts
            }
            None => false,
        };
        if finished && let Some(run) = self.runs.remove(&id) {
            cx.chip
                .release_group(run.group.id)
                .map_err(DeviceError::Fault)?;
            for &(start, len) in &run.l2_drops {
                cx.chip.l2_drop(start, len);
                let sink = cx.chip.sink_mut();
                cx.lanes
                    .l2_control(sink, run.task, "l2_drop", start, len, run.end);
            }
            self.last_run = Some(RunSummary {
                first_start: run.first_start,
                end: run.end,
                cores_used: run.cores.iter().filter(|c| **c).count() as u32,
            });
            if let Some(profile) = self.profile.as_mut() {
                profile.push(KernelProfile {
                    task: run.task,
                    name: self.names.get(&run.image).cloned().unwrap_or_default(),
                    block_dim: run.block_dim,
                    cores_used: run.cores.iter().filter(|c| **c).count() as u32,
                    kind: match run.placement {
                        Placement::Single(_, CoreKind::Coupled) => KernelKind::AiCore,
                        Placement::Single(_, CoreKind::Cube) => KernelKind::Cube,
                        Placement::Single(_, CoreKind::Vector) => KernelKind::Vector,
                        Placement::Mix { .. } => KernelKind::Mix,
                    },
                    launched: run.launched,
                    first_start: run.first_start.unwrap_or(run.end),
                    end: run.end,
                    work: run.work,
                    pipe_ps: run.pipe_ps,
                    traffic: cx.chip.traffic().since(&run.traffic_at_launch),
                });
            }
            cx.timer(
                run.end,
                Fw::Done {
                    stream: run.task.stream,
                    index: run.task.index,
                },
            );
        }
        self.dispatch_blocks(cx.chip)
    }
}

/// Reads a launch's L2 control sections (GE's `rtSmDesc_t`): applies its keeps now and returns
/// its drops, which apply when the kernel ends. Every section is checked before any applies.
fn apply_l2_control<S: TraceSink>(
    cx: &mut Ctx<'_, S>,
    at: TaskRef,
    k: &AiCoreKernel,
) -> Result<Vec<(u64, u64)>, DeviceError> {
    const K: &str = "AiCoreKernel";
    if k.l2_sections == 0 {
        return Ok(Vec::new());
    }
    if k.l2_sections > MAX_L2_SECTIONS {
        return Err(bad(
            at,
            K,
            "l2_sections",
            format!("{} is outside [0, {MAX_L2_SECTIONS}]", k.l2_sections),
        ));
    }
    let len = u64::from(k.l2_sections) * L2_SECTION_BYTES as u64;
    cx.check_range(at, K, "l2ctrl", k.l2ctrl, len)?;
    let mut bytes = vec![0u8; len as usize];
    cx.chip.read_mem(k.l2ctrl, &mut bytes)?;
    let mut sections = Vec::with_capacity(k.l2_sections as usize);
    for (i, chunk) in bytes.chunks_exact(L2_SECTION_BYTES).enumerate() {
        let mut raw = [0u8; L2_SECTION_BYTES];
        raw.copy_from_slice(chunk);
        let s = L2Section::decode(&raw)
            .map_err(|e| bad(at, K, "l2ctrl", format!("L2 control section {i}: {e}")))?;
        cx.check_range(at, K, "l2ctrl", s.addr, s.bytes)?;
        sections.push(s);
    }
    let mut drops = Vec::new();
    let now = cx.now();
    for s in sections {
        match s.action {
            L2Action::Keep => {
                cx.chip.l2_keep(s.addr, s.bytes);
                let sink = cx.chip.sink_mut();
                cx.lanes
                    .l2_control(sink, at, "l2_keep", s.addr, s.bytes, now);
            }
            L2Action::Drop => drops.push((s.addr, s.bytes)),
        }
    }
    Ok(drops)
}

/// Adds `now - base` (one block's work on a core) to `sum`.
fn add_delta(sum: &mut CoreStats, now: &CoreStats, base: &CoreStats) {
    for ((s, n), b) in sum.pipes.iter_mut().zip(&now.pipes).zip(&base.pipes) {
        s.busy_cycles += n.busy_cycles.saturating_sub(b.busy_cycles);
        s.instructions += n.instructions.saturating_sub(b.instructions);
    }
    sum.cube_macs += now.cube_macs.saturating_sub(base.cube_macs);
}
