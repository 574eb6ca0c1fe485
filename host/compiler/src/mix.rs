//! A cube kernel written for coupled cores, split into a MIX kernel for a separated chip.
//!
//! On a coupled core the cube's results leave L0C through the vector pipe (`copy_l0c_to_ub`)
//! and the vector unit finishes them (conversion, epilogue, store). A separated chip has no
//! such path: its cube core (AIC) writes L0C out through the FIXPIPE and only its vector core
//! (AIV) has a UB, the two meeting in GM and synchronising with cross-core flags. The split
//! keeps the kernel's own tiling and pipelining and gives each side its instructions:
//!
//! ```text
//!   scalar code, MTE2 barriers, flags on one side ─▶ the side(s) they belong to
//!   L1 loads, MTE1, mmad                          ─▶ AIC
//!   UB loads, vector, MTE3                        ─▶ AIV
//!   flags between the vector pipe and the cube    ─▶ AIC, with FIX standing for V
//!   copy_l0c_to_ub (one drain)                    ─▶ AIC: wait slot free, copy_l0c_to_gm_nz
//!                                                       to this block's GM slot, flag ready
//!                                                    AIV: wait ready, V→MTE2 order, load the
//!                                                       slot into the same UB bytes, MTE2→V,
//!                                                       flag the slot free
//! ```
//!
//! The result is a 1:1 MIX kernel (one AIC and one AIV per block, `KERNEL_MIX_ONE_VECTOR`):
//! both programs run the same scalar code, so every address and loop count agrees. Two
//! registers the kernel never uses hold the block's GM slot (the workspace argument appended
//! after the kernel's own). A kernel that needs what has no separated form (a bias broadcast
//! from UB into L0C, a scalar access to UB or L1) is an error naming it.

use gearsim_isa::units::FRACTAL_ROW_BYTES_F32 as FILL_ROW;
use gearsim_isa::{
    Comments, CrossFlagId, CrossMode, DType, FieldKind, Flag, Instruction, L0cFill, L0cToUb, Mem,
    Pipe, PipeSide, Program, ReadSReg, Reg, Rri, Rrr, SReg, SType, Space,
};

/// Cross-core flag: the cube core wrote a drain into the slot.
const READY: CrossFlagId = flag_id(0);
/// Cross-core flag: the vector core read the slot, which may be written again.
const FREE: CrossFlagId = flag_id(1);
/// Cross-core flag: the vector core wrote bias rows into the block's bias slot.
const BIAS_READY: CrossFlagId = flag_id(2);
/// Cross-core flag: the cube core read the bias slot.
const BIAS_FREE: CrossFlagId = flag_id(3);
/// The first cross-core flag id of the MTE3 <-> MTE2 flags.
const FIRST_DUAL: usize = 4;

/// L1 bytes a split kernel's bias fills stage their rows in, at the top of L1: the compiler
/// tiles a separated chip's kernels for the L1 below it (`Target::core.l1_bytes`).
pub const BIAS_L1_BYTES: u64 = 4096;

const fn flag_id(n: u8) -> CrossFlagId {
    match CrossFlagId::new(n) {
        Some(id) => id,
        None => panic!("a cross-core flag id the ISA has"),
    }
}

/// The two programs of a split kernel.
#[derive(Debug, Clone)]
pub struct MixSplit {
    /// The cube core's program.
    pub cube: Program,
    /// Its comments, at the new instruction indices.
    pub cube_comments: Comments,
    /// The vector core's program.
    pub vector: Program,
    /// Its comments.
    pub vector_comments: Comments,
    /// GM bytes of one block's drain slot.
    pub slot_bytes: u64,
}

/// The side of the split a pipe, flag or instruction belongs to.
type Side = PipeSide;

fn pipe_side(p: Pipe) -> Side {
    p.side()
}

/// Where a flag between `src` and `dst` lives; `None` when it joins the two sides.
fn flag_side(src: Pipe, dst: Pipe) -> Option<Side> {
    match (pipe_side(src), pipe_side(dst)) {
        (Side::Both, s) | (s, Side::Both) => Some(s),
        (a, b) if a == b => Some(a),
        _ => None,
    }
}

/// What one instruction of the coupled program becomes.
enum Role {
    Both,
    Cube,
    Vector,
    /// A flag between the vector pipe and a cube pipe: on the cube core, FIX stands for V.
    CrossFlag(Flag, bool),
    /// A flag between MTE3 and MTE2: GM a vector core's MTE3 writes that an L1 load reads (or
    /// the reverse); the vector core keeps it and a cross-core flag carries it to the cube core.
    DualFlag(Flag, bool),
    Drain(L0cToUb),
    /// Bias rows from UB into L0C (`broadcast_ub_to_l0c`): the vector core writes them to
    /// GM, the cube core brings them through L1 and the bias table (`broadcast_l1_to_l0c`).
    Fill(L0cFill),
    /// A scalar access to a local buffer: fine in a kernel of one side, which keeps it.
    ScalarLocal(Side),
}

impl Role {
    /// An instruction kept whole on one side, or on both.
    fn on(side: Side) -> Role {
        match side {
            Side::Both => Role::Both,
            Side::Cube => Role::Cube,
            Side::Vector => Role::Vector,
        }
    }
}

fn role(instr: &Instruction, pc: usize) -> Result<Role, String> {
    let unsupported = |what: &str| {
        Err(format!(
            "pc {pc}: {} {what}, which has no form on a separated chip",
            instr.spec().mnemonic
        ))
    };
    Ok(match instr {
        Instruction::SetFlag(f) | Instruction::WaitFlag(f)
            if matches!(
                (f.src, f.dst),
                (Pipe::Mte3, Pipe::Mte2) | (Pipe::Mte2, Pipe::Mte3)
            ) =>
        {
            Role::DualFlag(*f, matches!(instr, Instruction::SetFlag(_)))
        }
        Instruction::SetFlag(f) | Instruction::WaitFlag(f) => match flag_side(f.src, f.dst) {
            Some(side) => Role::on(side),
            None if f.src == Pipe::V || f.dst == Pipe::V => {
                Role::CrossFlag(*f, matches!(instr, Instruction::SetFlag(_)))
            }
            None => return unsupported("joins the cube and vector sides other than through V"),
        },
        Instruction::PipeBarrier(b) => Role::on(pipe_side(b.pipe)),
        Instruction::CopyL0cToUb(f) => Role::Drain(*f),
        Instruction::BroadcastUbToL0c(f) => Role::Fill(*f),
        Instruction::CrossCoreSetFlag(_) | Instruction::CrossCoreWaitFlag(_) => {
            return unsupported("is a cross-core flag already");
        }
        Instruction::Ld(m) | Instruction::St(m) if m.space != Space::Gm => {
            Role::ScalarLocal(if m.space == Space::Ub {
                Side::Vector
            } else {
                Side::Cube
            })
        }
        Instruction::CopyGmToL1(_)
        | Instruction::CopyGmToL1Nd2nz(_)
        | Instruction::LoadImageL1(_) => Role::Cube,
        // The other MTE2 copies fill the UB.
        i if i.pipe() == Pipe::Mte2 => Role::Vector,
        i => Role::on(pipe_side(i.pipe())),
    })
}

/// The registers an instruction reads and writes (bit masks). Scalar-unit instructions write
/// their `dst` (a load its `reg`, a loop its counter); every other register field is read,
/// pipe instructions' included (their addresses are read at dispatch).
fn uses_defs(instr: &Instruction) -> (u32, u32) {
    let mut raw = [0u64; gearsim_isa::spec::MAX_FIELDS];
    let n = instr.raw_fields(&mut raw);
    let scalar = instr.pipe() == Pipe::S;
    let (mut uses, mut defs) = (0u32, 0u32);
    for (f, v) in instr.spec().fields[..n].iter().zip(&raw) {
        if f.kind != FieldKind::Reg {
            continue;
        }
        let bit = 1u32 << *v;
        let written = scalar
            && (f.name == "dst"
                || (f.name == "reg" && matches!(instr, Instruction::Ld(_)))
                || f.name == "counter");
        if written {
            defs |= bit;
        }
        if !written || f.name == "counter" {
            uses |= bit;
        }
    }
    (uses, defs)
}

/// The instructions control may go to after `pc`.
fn successors(program: &Program, pc: usize) -> Vec<usize> {
    let instr = &program.instrs[pc];
    let next = pc + 1;
    match (instr, gearsim_isa::branch_target(instr)) {
        (Instruction::End(_), _) => Vec::new(),
        (Instruction::Jmp(_), Some(t)) => vec![t as usize],
        (_, Some(t)) => vec![t as usize, next],
        (_, None) => vec![next],
    }
}

/// Per instruction, the registers live before it (read later on some path before written).
fn live_in(program: &Program) -> Vec<u32> {
    let n = program.instrs.len();
    let ud: Vec<(u32, u32)> = program.instrs.iter().map(uses_defs).collect();
    let succ: Vec<Vec<usize>> = (0..n).map(|pc| successors(program, pc)).collect();
    let mut live = vec![0u32; n];
    loop {
        let mut changed = false;
        for pc in (0..n).rev() {
            let out = succ[pc]
                .iter()
                .filter(|&&s| s < n)
                .fold(0u32, |acc, &s| acc | live[s]);
            let (uses, defs) = ud[pc];
            let new = uses | (out & !defs);
            if new != live[pc] {
                live[pc] = new;
                changed = true;
            }
        }
        if !changed {
            return live;
        }
    }
}

/// An event id of the pair (src, dst) the program never uses.
fn free_event(program: &Program, src: Pipe, dst: Pipe, ids: u8) -> Option<u8> {
    (0..ids).find(|&id| {
        !program.instrs.iter().any(|i| {
            matches!(i, Instruction::SetFlag(f) | Instruction::WaitFlag(f)
                if f.src == src && f.dst == dst && f.id == id)
        })
    })
}

/// Retargets a branch through `map` (old index to new).
fn retarget(instr: Instruction, map: &[u32]) -> Instruction {
    let spec = instr.spec();
    let Some(t) = spec.fields.iter().position(|f| f.kind == FieldKind::Target) else {
        return instr;
    };
    let mut raw = [0u64; gearsim_isa::spec::MAX_FIELDS];
    let n = instr.raw_fields(&mut raw);
    raw[t] = u64::from(map[raw[t] as usize]);
    Instruction::from_raw_fields(instr.opcode(), &raw[..n]).unwrap_or(instr)
}

/// One side's program under construction.
struct Side1 {
    instrs: Vec<Instruction>,
    /// Per old pc, the new index of its first instruction.
    map: Vec<u32>,
}

/// Splits `program` (whose kernel takes `nargs` arguments) into a MIX kernel's cube and
/// vector programs, or `None` when it uses one side only (it then runs as it is). `bias_l1`
/// is the L1 address of the [`BIAS_L1_BYTES`] its bias fills may use.
pub fn split(
    program: &Program,
    comments: &Comments,
    nargs: usize,
    event_ids: u8,
    bias_l1: u64,
) -> Result<Option<MixSplit>, String> {
    let roles = program
        .instrs
        .iter()
        .enumerate()
        .map(|(pc, i)| role(i, pc))
        .collect::<Result<Vec<_>, _>>()?;
    let has = |want: fn(&Role) -> bool| roles.iter().any(want);
    // MTE3 <-> MTE2 flags alone do not make a kernel two-sided.
    let cube = has(|r| {
        matches!(
            r,
            Role::Cube
                | Role::Drain(_)
                | Role::Fill(_)
                | Role::CrossFlag(..)
                | Role::ScalarLocal(Side::Cube)
        )
    });
    let vector = has(|r| {
        matches!(
            r,
            Role::Vector
                | Role::Drain(_)
                | Role::Fill(_)
                | Role::CrossFlag(..)
                | Role::ScalarLocal(Side::Vector)
        )
    });
    if !(cube && vector) {
        return Ok(None);
    }
    if let Some(pc) = roles.iter().position(|r| matches!(r, Role::ScalarLocal(_))) {
        return Err(format!(
            "pc {pc}: {} accesses a local buffer from the scalar unit, which a kernel split \
             between a cube and a vector core cannot do",
            program.instrs[pc].spec().mnemonic
        ));
    }
    let live = live_in(program);
    let reg = |r: u32| Reg::new(r as u8).ok_or_else(|| format!("x{r} is not a register"));
    let no_id = |pair: &str| format!("no free {pair} event id for the drains' order");
    let to_v =
        free_event(program, Pipe::Mte2, Pipe::V, event_ids).ok_or_else(|| no_id("MTE2->V"))?;
    let from_v =
        free_event(program, Pipe::V, Pipe::Mte2, event_ids).ok_or_else(|| no_id("V->MTE2"))?;
    // The slot holds the largest drain, gaps included.
    let slot_bytes = roles
        .iter()
        .filter_map(|r| match r {
            Role::Drain(f) => Some(drain_bytes(f)),
            _ => None,
        })
        .max()
        .unwrap_or(0)
        .div_ceil(512)
        * 512;
    let bias_bytes = roles
        .iter()
        .filter_map(|r| match r {
            Role::Fill(f) => Some(u64::from(f.nblk) * FILL_ROW),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    if bias_bytes > BIAS_L1_BYTES {
        return Err(format!(
            "a bias fill of {bias_bytes} bytes exceeds the {BIAS_L1_BYTES} L1 bytes set aside for it"
        ));
    }
    let fills = bias_bytes > 0;
    let slot_bytes = slot_bytes + bias_bytes.div_ceil(512) * 512;
    let stride = i32::try_from(slot_bytes).map_err(|_| "a drain slot over 2 GiB".to_string())?;
    let drain_part = i32::try_from(slot_bytes - bias_bytes.div_ceil(512) * 512).unwrap_or(0);
    let bias_l1 = i64::try_from(bias_l1).map_err(|_| "an L1 address past 2^63".to_string())?;
    let v_as = vector_stand_ins(program, &roles, event_ids)?;
    let nargs = i32::try_from(8 * nargs).map_err(|_| "too many kernel arguments".to_string())?;
    // slot = args[nargs] + block_idx * slot_bytes, in two registers dead at the drain.
    let slot_address = |pc: usize| -> Result<(Reg, Reg, [Instruction; 5]), String> {
        let mut dead = (0..32u32).rev().filter(|r| live[pc] & (1 << r) == 0);
        let (Some(a), Some(t)) = (dead.next(), dead.next()) else {
            return Err(format!(
                "pc {pc}: no two registers are free at this drain for its GM slot's address"
            ));
        };
        let (a, t) = (reg(a)?, reg(t)?);
        Ok((
            a,
            t,
            [
                Instruction::Sreg(ReadSReg {
                    dst: t,
                    which: SReg::Args,
                }),
                Instruction::Ld(Mem {
                    space: Space::Gm,
                    width: SType::U64,
                    reg: a,
                    base: t,
                    off: nargs,
                }),
                Instruction::Sreg(ReadSReg {
                    dst: t,
                    which: SReg::BlockIdx,
                }),
                Instruction::Muli(Rri {
                    dst: t,
                    a: t,
                    imm: stride,
                }),
                Instruction::Add(Rrr { dst: a, a, b: t }),
            ],
        ))
    };
    let (mut c, mut v) = (
        Side1 {
            instrs: Vec::new(),
            map: Vec::new(),
        },
        Side1 {
            instrs: Vec::new(),
            map: Vec::new(),
        },
    );
    // Each MTE3 <-> MTE2 flag gets a cross-core flag id of its own, after READY and FREE.
    let mut duals: Vec<(Pipe, Pipe, u8)> = Vec::new();
    for r in &roles {
        if let Role::DualFlag(f, _) = r
            && !duals.contains(&(f.src, f.dst, f.id))
        {
            duals.push((f.src, f.dst, f.id));
        }
    }
    let dual_id = |f: &Flag| -> Result<CrossFlagId, String> {
        let k = duals
            .iter()
            .position(|d| *d == (f.src, f.dst, f.id))
            .unwrap_or(0);
        u8::try_from(k + FIRST_DUAL)
            .ok()
            .and_then(CrossFlagId::new)
            .ok_or_else(|| {
                format!(
                    "more MTE3<->MTE2 flags ({}) than cross-core flag ids",
                    duals.len()
                )
            })
    };
    // The slots start free.
    v.instrs.push(cross_set(Pipe::S, FREE));
    if fills {
        c.instrs.push(cross_set(Pipe::S, BIAS_FREE));
    }
    let fill_ids = if fills {
        let id = |src, dst| {
            free_event(program, src, dst, event_ids).ok_or_else(|| no_id(&format!("{src}->{dst}")))
        };
        [
            id(Pipe::V, Pipe::S)?,
            id(Pipe::Mte2, Pipe::Mte1)?,
            id(Pipe::Fix, Pipe::S)?,
            id(Pipe::Mte1, Pipe::Mte2)?,
        ]
    } else {
        [0; 4]
    };
    for (pc, (instr, role)) in program.instrs.iter().zip(&roles).enumerate() {
        c.map.push(c.instrs.len() as u32);
        v.map.push(v.instrs.len() as u32);
        match role {
            Role::Both => {
                c.instrs.push(*instr);
                v.instrs.push(*instr);
            }
            Role::Cube => c.instrs.push(*instr),
            Role::ScalarLocal(_) => {
                return Err(format!("pc {pc}: a scalar local access in a split kernel"));
            }
            Role::Vector => v.instrs.push(*instr),
            Role::CrossFlag(f, set) => {
                let on_cube = v_as
                    .get(&(f.src, f.dst, f.id))
                    .copied()
                    .ok_or_else(|| format!("pc {pc}: a flag with no stand-in"))?;
                c.instrs.push(if *set {
                    Instruction::SetFlag(on_cube)
                } else {
                    Instruction::WaitFlag(on_cube)
                });
            }
            Role::DualFlag(f, set) => {
                let x = dual_id(f)?;
                let intra = if *set {
                    Instruction::SetFlag(*f)
                } else {
                    Instruction::WaitFlag(*f)
                };
                match (f.src == Pipe::Mte3, *set) {
                    // MTE3 wrote GM: the vector core's own MTE2 and the cube core's hear it.
                    (true, true) => {
                        v.instrs.push(intra);
                        v.instrs.push(cross_set(Pipe::Mte3, x));
                    }
                    (true, false) => {
                        v.instrs.push(intra);
                        c.instrs.push(cross_wait(Pipe::Mte2, x));
                    }
                    // MTE2 read GM: MTE3 waits for both cores' reads.
                    (false, true) => {
                        v.instrs.push(intra);
                        c.instrs.push(cross_set(Pipe::Mte2, x));
                    }
                    (false, false) => {
                        v.instrs.push(intra);
                        v.instrs.push(cross_wait(Pipe::Mte3, x));
                    }
                }
            }
            Role::Fill(f) => {
                // Back-to-back fills would set a V -> MTE3 (or FIX -> MTE1) flag again before
                // its waiter consumed it, so the scalar unit waits instead: it dispatches the
                // copy (or the fill) only once the pipe before it has got there.
                let [v_s, m2_m1, fix_s, m1_m2] = fill_ids;
                let (slot, tmp, address) = slot_address(pc)?;
                let bias_slot = Instruction::Addi(Rri {
                    dst: slot,
                    a: slot,
                    imm: drain_part,
                });
                let rows = u16::try_from(u64::from(f.nblk) * FILL_ROW / 32)
                    .map_err(|_| "a bias fill over 2 MiB".to_string())?;
                v.instrs.extend(address);
                v.instrs.push(bias_slot);
                v.instrs.push(cross_wait(Pipe::Mte3, BIAS_FREE));
                v.instrs.push(flag(true, Pipe::V, Pipe::S, v_s));
                v.instrs.push(flag(false, Pipe::V, Pipe::S, v_s));
                v.instrs.push(Instruction::CopyUbToGm(gearsim_isa::Dma {
                    dst: slot,
                    src: f.src,
                    nburst: 1,
                    len: rows,
                    src_gap: 0,
                    dst_gap: 0,
                }));
                v.instrs.push(cross_set(Pipe::Mte3, BIAS_READY));
                c.instrs.extend(address);
                c.instrs.push(bias_slot);
                c.instrs.push(Instruction::Movi(gearsim_isa::Ri {
                    dst: tmp,
                    imm: bias_l1,
                }));
                c.instrs.push(cross_wait(Pipe::Mte2, BIAS_READY));
                c.instrs.push(Instruction::CopyGmToL1(gearsim_isa::Dma {
                    dst: tmp,
                    src: slot,
                    nburst: 1,
                    len: rows,
                    src_gap: 0,
                    dst_gap: 0,
                }));
                c.instrs.push(cross_set(Pipe::Mte2, BIAS_FREE));
                c.instrs.push(flag(true, Pipe::Mte2, Pipe::Mte1, m2_m1));
                c.instrs.push(flag(false, Pipe::Mte2, Pipe::Mte1, m2_m1));
                // The fill follows the drains of L0C before it, as on the vector pipe.
                c.instrs.push(flag(true, Pipe::Fix, Pipe::S, fix_s));
                c.instrs.push(flag(false, Pipe::Fix, Pipe::S, fix_s));
                c.instrs
                    .push(Instruction::BroadcastL1ToL0c(L0cFill { src: tmp, ..*f }));
                // The staging rows are read before the next fill's load.
                c.instrs.push(flag(true, Pipe::Mte1, Pipe::Mte2, m1_m2));
                c.instrs.push(flag(false, Pipe::Mte1, Pipe::Mte2, m1_m2));
            }
            Role::Drain(f) => {
                let fr = fractal_bytes(f.ty);
                let (slot, _, address) = slot_address(pc)?;
                c.instrs.extend(address);
                v.instrs.extend(address);
                c.instrs.push(cross_wait(Pipe::Fix, FREE));
                c.instrs
                    .push(Instruction::CopyL0cToGmNz(L0cToUb { dst: slot, ..*f }));
                c.instrs.push(cross_set(Pipe::Fix, READY));
                v.instrs.push(cross_wait(Pipe::Mte2, READY));
                v.instrs.push(flag(true, Pipe::V, Pipe::Mte2, from_v));
                v.instrs.push(flag(false, Pipe::V, Pipe::Mte2, from_v));
                let gap = u64::from(f.dst_gap) * fr / 32;
                let gap =
                    u16::try_from(gap).map_err(|_| "a drain's gap is too wide".to_string())?;
                v.instrs.push(Instruction::CopyGmToUb(gearsim_isa::Dma {
                    dst: f.dst,
                    src: slot,
                    nburst: f.nfrac,
                    len: (fr / 32) as u16,
                    src_gap: gap,
                    dst_gap: gap,
                }));
                v.instrs.push(flag(true, Pipe::Mte2, Pipe::V, to_v));
                v.instrs.push(flag(false, Pipe::Mte2, Pipe::V, to_v));
                v.instrs.push(cross_set(Pipe::Mte2, FREE));
            }
        }
    }
    let finish = |s: Side1, name: &str| -> (Program, Comments) {
        let mut map = s.map;
        map.push(s.instrs.len() as u32);
        let instrs = s.instrs.into_iter().map(|i| retarget(i, &map)).collect();
        let labels = program
            .labels
            .iter()
            .map(|(n, pc)| (n.clone(), map[*pc as usize]))
            .collect();
        let p = Program {
            name: Some(format!("{}_{name}", program.display_name())),
            instrs,
            labels,
            source_lines: Vec::new(),
        };
        (p, comments.remapped(|pc| map[pc as usize]))
    };
    let (cube, cube_comments) = finish(c, "aic");
    let (vector, vector_comments) = finish(v, "aiv");
    Ok(Some(MixSplit {
        cube,
        cube_comments,
        vector,
        vector_comments,
        slot_bytes,
    }))
}

/// For each flag between the vector pipe and a cube pipe, the cube core's flag that stands for
/// it: V becomes FIX where the vector pipe drained L0C around it, MTE1 where it filled L0C with
/// bias, and the flag takes an id its new pipe pair does not use. A set is placed by the nearest
/// drain or fill before it, a wait by the nearest after it; every occurrence of one flag must
/// agree.
fn vector_stand_ins(
    program: &Program,
    roles: &[Role],
    event_ids: u8,
) -> Result<std::collections::BTreeMap<(Pipe, Pipe, u8), Flag>, String> {
    let pipes = stand_in_pipes(program, roles)?;
    let mut taken: Vec<(Pipe, Pipe, u8)> = Vec::new();
    let mut out = std::collections::BTreeMap::new();
    for (pc, r) in roles.iter().enumerate() {
        let Role::CrossFlag(f, _) = r else { continue };
        let key = (f.src, f.dst, f.id);
        if out.contains_key(&key) {
            continue;
        }
        let stand_in = pipes.get(&key).copied().unwrap_or(Pipe::Fix);
        let (src, dst) = (
            if f.src == Pipe::V { stand_in } else { f.src },
            if f.dst == Pipe::V { stand_in } else { f.dst },
        );
        let id = (0..event_ids)
            .find(|&id| {
                !taken.contains(&(src, dst, id))
                    && !program.instrs.iter().any(|i| {
                        matches!(i, Instruction::SetFlag(g) | Instruction::WaitFlag(g)
                            if g.src == src && g.dst == dst && g.id == id)
                    })
            })
            .ok_or_else(|| format!("pc {pc}: no free {src}->{dst} event id for a drain's flag"))?;
        taken.push((src, dst, id));
        out.insert(key, Flag { src, dst, id });
    }
    Ok(out)
}

/// The cube pipe standing for V in each flag between V and a cube pipe (see
/// [`vector_stand_ins`]).
fn stand_in_pipes(
    program: &Program,
    roles: &[Role],
) -> Result<std::collections::BTreeMap<(Pipe, Pipe, u8), Pipe>, String> {
    let boundary = |r: &Role| match r {
        Role::Drain(_) => Some(Pipe::Fix),
        Role::Fill(_) => Some(Pipe::Mte1),
        _ => None,
    };
    let mut out: std::collections::BTreeMap<(Pipe, Pipe, u8), Pipe> = Default::default();
    for (pc, r) in roles.iter().enumerate() {
        let Role::CrossFlag(f, set) = r else { continue };
        // The V end's instruction: a set from V or a wait on V.
        let on_v = (*set && f.src == Pipe::V) || (!*set && f.dst == Pipe::V);
        if !on_v {
            continue;
        }
        let found = if *set {
            roles[..pc].iter().rev().find_map(boundary)
        } else {
            roles[pc + 1..].iter().find_map(boundary)
        };
        let Some(p) = found else { continue };
        match out.insert((f.src, f.dst, f.id), p) {
            Some(q) if q != p => {
                return Err(format!(
                    "pc {pc}: {} orders both a drain and a bias fill",
                    program.instrs[pc].spec().mnemonic
                ));
            }
            _ => {}
        }
    }
    Ok(out)
}

fn fractal_bytes(ty: DType) -> u64 {
    256 * ty.size() as u64
}

/// GM bytes of one drain: its fractals and the gaps between them.
fn drain_bytes(f: &L0cToUb) -> u64 {
    let fr = fractal_bytes(f.ty);
    (u64::from(f.nfrac).max(1) - 1) * (1 + u64::from(f.dst_gap)) * fr + fr
}

fn cross_set(pipe: Pipe, id: CrossFlagId) -> Instruction {
    Instruction::CrossCoreSetFlag(gearsim_isa::CrossSet {
        mode: CrossMode::AicAiv,
        pipe,
        id,
    })
}

fn cross_wait(pipe: Pipe, id: CrossFlagId) -> Instruction {
    Instruction::CrossCoreWaitFlag(gearsim_isa::CrossWait { pipe, id })
}

fn flag(set: bool, src: Pipe, dst: Pipe, id: u8) -> Instruction {
    let f = Flag { src, dst, id };
    if set {
        Instruction::SetFlag(f)
    } else {
        Instruction::WaitFlag(f)
    }
}
