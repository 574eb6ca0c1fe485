//! gearsim's instruction set: every AI core instruction and every task descriptor, declared
//! once, with everything else derived from those declarations.
//!
//! ```text
//!                 table.rs (formats! + instructions!)
//!                               |
//!      +-----------+------------+-------------+---------------+
//!      v           v            v             v               v
//!   Opcode    Instruction   encode/decode   assemble      disasm      (+ the simulator's
//!   enum      enum          (16-byte Word)  (text -> IR)  (IR -> text)   cost lookup by
//!                                                                        TimingClass)
//! ```
//!
//! `isa` knows nothing of time, memory systems or files: it defines what an instruction *is*,
//! not what it costs or does. The simulator gives each [`TimingClass`] its cycles and each
//! [`Instruction`] its effect, with exhaustive matches so a new opcode does not build until
//! every consumer handles it.
//!
//! ```
//! use gearsim_isa::{assemble, decode_all, disasm};
//!
//! let program = assemble(
//!     "    movi x1, 128\nloop_top:\n    vadd.f16 x2, x3, x4, repeat=2\n    loop x1, loop_top\n    end\n",
//!     "example.s",
//! ).unwrap();
//! assert_eq!(disasm(&program.instrs[1]), "vadd.f16 x2, x3, x4, repeat=2");
//! let bytes = program.encode().unwrap();
//! assert_eq!(bytes.len(), 4 * 16);
//! assert_eq!(decode_all(&bytes).unwrap(), program.instrs);
//! ```

mod asm;
pub mod checksum;
mod disasm;
mod encode;
pub mod gear;
pub mod om;
pub mod omtask;
pub mod operand;
mod program;
pub mod reference;
pub mod spec;
mod table;
pub mod task;
pub mod tensor;

pub use asm::{AsmError, MAX_EXPR_DEPTH, assemble, parse_instruction};
pub use disasm::{disasm, disasm_with};
pub use encode::{
    DecodeError, EncodeError, Word, conversion_supported, decode, decode_all, encode, encode_all,
};
pub use operand::{
    Cmp, DType, FieldKind, FieldType, Pipe, ReduceOp, Reg, Round, SReg, SType, Space, Target,
};
pub use program::{Program, branch_target};
pub use spec::{FieldSpec, Format, InstrSpec, PipeClass, Placement, TimingClass, WORD_BYTES};
pub use table::*;
