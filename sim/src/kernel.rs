//! A kernel loaded onto the chip and how its blocks run: shared by the chip, which loads and
//! starts kernels, and the AI cores, which execute them.

use gearsim_isa::Program;

/// Whether a block computes values or only times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecMode {
    /// Compute every value and every time.
    Full,
    /// Compute times only; vector, cube and DMA data are not moved or computed. The timeline is
    /// identical to the full mode as long as the scalar unit never reads computed data (if it
    /// does, the block stops with [`StopReason::ValueNeeded`]).
    TimingOnly,
}

/// A kernel program ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// Name used in traces and reports.
    pub name: String,
    /// The instructions.
    pub program: Program,
    /// The pipe each instruction runs on, looked up once here instead of per execution.
    pub(crate) pipes: Vec<gearsim_isa::Pipe>,
    /// Each instruction's timing class from the table, likewise looked up once.
    pub(crate) timing: Vec<gearsim_isa::TimingClass>,
}

impl Kernel {
    /// A kernel named after its program.
    pub fn new(program: Program) -> Kernel {
        let pipes = program
            .instrs
            .iter()
            .map(gearsim_isa::Instruction::pipe)
            .collect();
        let timing = program.instrs.iter().map(|i| i.spec().timing).collect();
        Kernel {
            name: program.display_name().to_string(),
            program,
            pipes,
            timing,
        }
    }
}
