//! The scalar unit's register arithmetic and branch conditions as pure functions of the
//! register file: the cores execute them, and static analysis (the compiler's verifier) follows
//! a kernel's control flow with the very same semantics.

use gearsim_isa::Instruction;

/// Signed division: x/0 = -1 and MIN/-1 = MIN, as RISC-V.
pub fn div_signed(a: u64, d: u64) -> u64 {
    let (a, d) = (a as i64, d as i64);
    if d == 0 {
        u64::MAX
    } else {
        a.wrapping_div(d) as u64
    }
}

/// Signed remainder: x%0 = x.
pub fn rem_signed(a: u64, d: u64) -> u64 {
    let (a, d) = (a as i64, d as i64);
    if d == 0 {
        a as u64
    } else {
        a.wrapping_rem(d) as u64
    }
}

/// The register an ALU instruction writes and the value, or `None` for any other instruction.
pub fn alu(instr: &Instruction, r: &[u64; 32]) -> Option<(usize, u64)> {
    use Instruction as I;
    let rrr = |f: &gearsim_isa::Rrr, op: fn(u64, u64) -> u64| {
        Some((f.dst.index(), op(r[f.a.index()], r[f.b.index()])))
    };
    let rri = |f: &gearsim_isa::Rri, op: fn(u64, u64) -> u64| {
        Some((f.dst.index(), op(r[f.a.index()], i64::from(f.imm) as u64)))
    };
    let rr = |f: &gearsim_isa::Rr, op: fn(u64) -> u64| Some((f.dst.index(), op(r[f.src.index()])));
    match instr {
        I::Add(f) => rrr(f, u64::wrapping_add),
        I::Sub(f) => rrr(f, u64::wrapping_sub),
        I::Mul(f) => rrr(f, u64::wrapping_mul),
        I::Div(f) => rrr(f, div_signed),
        I::Divu(f) => rrr(f, |a, d| a.checked_div(d).unwrap_or(u64::MAX)),
        I::Rem(f) => rrr(f, rem_signed),
        I::Remu(f) => rrr(f, |a, d| a.checked_rem(d).unwrap_or(a)),
        I::And(f) => rrr(f, |a, b| a & b),
        I::Or(f) => rrr(f, |a, b| a | b),
        I::Xor(f) => rrr(f, |a, b| a ^ b),
        I::Shl(f) => rrr(f, |a, b| a << (b & 63)),
        I::Shr(f) => rrr(f, |a, b| a >> (b & 63)),
        I::Sra(f) => rrr(f, |a, b| ((a as i64) >> (b & 63)) as u64),
        I::Min(f) => rrr(f, |a, b| (a as i64).min(b as i64) as u64),
        I::Max(f) => rrr(f, |a, b| (a as i64).max(b as i64) as u64),
        I::Minu(f) => rrr(f, u64::min),
        I::Maxu(f) => rrr(f, u64::max),
        I::Slt(f) => rrr(f, |a, b| u64::from((a as i64) < (b as i64))),
        I::Sltu(f) => rrr(f, |a, b| u64::from(a < b)),
        I::Seq(f) => rrr(f, |a, b| u64::from(a == b)),
        I::Addi(f) => rri(f, u64::wrapping_add),
        I::Muli(f) => rri(f, u64::wrapping_mul),
        I::Andi(f) => rri(f, |a, b| a & b),
        I::Ori(f) => rri(f, |a, b| a | b),
        I::Xori(f) => rri(f, |a, b| a ^ b),
        I::Shli(f) => rri(f, |a, b| a << (b & 63)),
        I::Shri(f) => rri(f, |a, b| a >> (b & 63)),
        I::Srai(f) => rri(f, |a, b| ((a as i64) >> (b & 63)) as u64),
        I::Slti(f) => rri(f, |a, b| u64::from((a as i64) < (b as i64))),
        I::Movi(f) => Some((f.dst.index(), f.imm as u64)),
        I::Mov(f) => rr(f, |a| a),
        I::Ctz(f) => rr(f, |a| u64::from(a.trailing_zeros())),
        I::Clz(f) => rr(f, |a| u64::from(a.leading_zeros())),
        I::Popc(f) => rr(f, |a| u64::from(a.count_ones())),
        _ => None,
    }
}

/// The registers an ALU instruction reads.
pub fn alu_sources(instr: &Instruction) -> Option<Vec<usize>> {
    use Instruction as I;
    Some(match instr {
        I::Add(f)
        | I::Sub(f)
        | I::Mul(f)
        | I::Div(f)
        | I::Divu(f)
        | I::Rem(f)
        | I::Remu(f)
        | I::And(f)
        | I::Or(f)
        | I::Xor(f)
        | I::Shl(f)
        | I::Shr(f)
        | I::Sra(f)
        | I::Min(f)
        | I::Max(f)
        | I::Minu(f)
        | I::Maxu(f)
        | I::Slt(f)
        | I::Sltu(f)
        | I::Seq(f) => {
            vec![f.a.index(), f.b.index()]
        }
        I::Addi(f)
        | I::Muli(f)
        | I::Andi(f)
        | I::Ori(f)
        | I::Xori(f)
        | I::Shli(f)
        | I::Shri(f)
        | I::Srai(f)
        | I::Slti(f) => vec![f.a.index()],
        I::Movi(_) => Vec::new(),
        I::Mov(f) | I::Ctz(f) | I::Clz(f) | I::Popc(f) => vec![f.src.index()],
        _ => return None,
    })
}

/// Whether a conditional branch is taken, its target, and the registers it compares; `None`
/// for any other instruction.
pub fn branch(instr: &Instruction, r: &[u64; 32]) -> Option<(bool, u32, [usize; 2])> {
    use Instruction as I;
    let c = |f: &gearsim_isa::Branch, cond: fn(u64, u64) -> bool| {
        let (a, b) = (f.a.index(), f.b.index());
        Some((cond(r[a], r[b]), f.target.0, [a, b]))
    };
    match instr {
        I::Beq(f) => c(f, |x, y| x == y),
        I::Bne(f) => c(f, |x, y| x != y),
        I::Blt(f) => c(f, |x, y| (x as i64) < (y as i64)),
        I::Bge(f) => c(f, |x, y| (x as i64) >= (y as i64)),
        I::Bltu(f) => c(f, |x, y| x < y),
        I::Bgeu(f) => c(f, |x, y| x >= y),
        _ => None,
    }
}
