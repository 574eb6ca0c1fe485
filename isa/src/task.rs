//! Task descriptors: the fixed-size records a host writes into a stream's submission queue and
//! the firmware's scheduler reads back, declared once in the table below.
//!
//! Every descriptor is 64 bytes, little-endian: an 8-byte header (kind, flags, task id) and a
//! 56-byte payload whose layout depends on the kind. Kind numbers follow the Ascend runtime's
//! `tsTaskType_t` where a task has a counterpart there.

use thiserror::Error;
use zerocopy::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Size of one descriptor in bytes.
pub const TASK_BYTES: usize = 64;
/// Size of a descriptor's payload in bytes.
pub const PAYLOAD_BYTES: usize = TASK_BYTES - 8;

/// One encoded descriptor.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct TaskDescriptor {
    /// Task kind (see [`TaskKind`]).
    pub kind: U16,
    /// Reserved flags, zero.
    pub flags: U16,
    /// Id assigned by the submitter, echoed in traces.
    pub task_id: U32,
    /// Kind-specific payload, zero-padded.
    pub payload: [u8; PAYLOAD_BYTES],
}

/// A descriptor that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TaskDecodeError {
    /// Unknown kind.
    #[error("task {task_id}: unknown task kind {kind}")]
    UnknownKind {
        /// The task id in the header.
        task_id: u32,
        /// The kind number.
        kind: u16,
    },
    /// A field holds a value outside its enum.
    #[error("task {task_id} ({kind}): field `{field}` = {value} is not valid")]
    BadField {
        /// The task id in the header.
        task_id: u32,
        /// Kind name.
        kind: &'static str,
        /// Field name.
        field: &'static str,
        /// Raw value.
        value: u64,
    },
    /// Bytes past the payload of this kind are not zero, or flags are set.
    #[error("task {task_id} ({kind}): reserved bytes are not zero")]
    Reserved {
        /// The task id in the header.
        task_id: u32,
        /// Kind name.
        kind: &'static str,
    },
}

/// A plain value that is stored little-endian in a descriptor.
pub trait LeField: Copy {
    /// Its zerocopy little-endian representation.
    type Le: FromBytes + IntoBytes + Immutable + KnownLayout + Unaligned + Copy;
    /// To the stored form.
    fn to_le(self) -> Self::Le;
    /// From the stored form; `None` if the value names nothing.
    fn from_le(le: Self::Le) -> Option<Self>;
    /// The stored value as a number, for error messages.
    fn raw(le: Self::Le) -> u64;
}

impl LeField for u32 {
    type Le = U32;
    fn to_le(self) -> U32 {
        U32::new(self)
    }
    fn from_le(le: U32) -> Option<u32> {
        Some(le.get())
    }
    fn raw(le: U32) -> u64 {
        u64::from(le.get())
    }
}

impl LeField for u64 {
    type Le = U64;
    fn to_le(self) -> U64 {
        U64::new(self)
    }
    fn from_le(le: U64) -> Option<u64> {
        Some(le.get())
    }
    fn raw(le: U64) -> u64 {
        le.get()
    }
}

impl LeField for i64 {
    type Le = I64;
    fn to_le(self) -> I64 {
        I64::new(self)
    }
    fn from_le(le: I64) -> Option<i64> {
        Some(le.get())
    }
    fn raw(le: I64) -> u64 {
        le.get() as u64
    }
}

/// Declares a `u32`-stored enum usable as a descriptor field.
macro_rules! task_enum {
    ($(#[doc = $d:literal])* $name:ident { $( $(#[doc = $vd:literal])* $v:ident = $n:literal ),* $(,)? }) => {
        $(#[doc = $d])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum $name { $( $(#[doc = $vd])* $v = $n ),* }
        impl LeField for $name {
            type Le = U32;
            fn to_le(self) -> U32 { U32::new(self as u32) }
            fn from_le(le: U32) -> Option<$name> {
                match le.get() { $( $n => Some($name::$v), )* _ => None }
            }
            fn raw(le: U32) -> u64 { u64::from(le.get()) }
        }
    };
}

task_enum! {
    /// Direction of a memcpy task.
    MemcpyKind {
        /// Host to device over PCIe.
        HostToDevice = 1,
        /// Device to host over PCIe.
        DeviceToHost = 2,
        /// Device to device.
        DeviceToDevice = 3,
    }
}

task_enum! {
    /// Condition of a stream switch.
    SwitchCond {
        /// Equal.
        Eq = 0,
        /// Not equal.
        Ne = 1,
        /// Less than.
        Lt = 2,
        /// Less or equal.
        Le = 3,
        /// Greater than.
        Gt = 4,
        /// Greater or equal.
        Ge = 5,
    }
}

task_enum! {
    /// What an L2 control section of a kernel launch does to its range (the data sections of
    /// GE's per-launch `rtL2Ctrl_t` under `--buffer_optimize=l2_optimize`).
    L2Action {
        /// From the kernel's start, the range's lines stay in L2 (reserved pages): streaming
        /// data evicts them only from a set whose every way is kept.
        Keep = 1,
        /// At the kernel's end, the range's lines are forgotten without a write to device
        /// memory (`L2_load_to_ddr = 0`: the data is dead) and any keep on it ends.
        Drop = 2,
    }
}

/// Kernel image flag: the kernel's addresses or control flow depend on the data it reads (a
/// MapIndex scanning its compare bits, a Gather addressing rows by its indices), so it always
/// runs in full mode, also inside a timing-only run. The one definition of the bit, for the
/// device image header and the `.om`'s kernel flags alike.
pub const KERNEL_NEEDS_VALUES: u32 = 1;

/// Kernel image flag bits 1-2: which cores the kernel runs on ([`KernelKind`]).
pub const KERNEL_KIND_MASK: u32 = 0b110;
const KERNEL_KIND_SHIFT: u32 = 1;

/// Kernel image flag of a [`KernelKind::Mix`] image: each block is a cube core and one vector
/// core (the runtime's `KERNEL_TYPE_MIX_AIC_1_1`) instead of all of its AI core's vector cores.
pub const KERNEL_MIX_ONE_VECTOR: u32 = 1 << 3;

/// Every kernel image flag this build knows.
pub const KERNEL_FLAGS_KNOWN: u32 = KERNEL_NEEDS_VALUES | KERNEL_KIND_MASK | KERNEL_MIX_ONE_VECTOR;

/// Which cores a kernel image runs on (the runtime's `KERNEL_AICORE`, `KERNEL_AIVEC` and
/// `KERNEL_MIX_AIC` task types, ascend-hardware.md §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelKind {
    /// An AI core kernel: on a coupled chip any core; on a separated chip the cores its
    /// instructions need (vector pipes: a vector core; cube pipes: a cube core).
    AiCore,
    /// Cube cores only (AIC).
    Cube,
    /// Vector cores only (AIV).
    Vector,
    /// A cube core and its AI core's vector cores together; the image holds the cube core's
    /// program, then a second image with the vector cores' program.
    Mix,
}

impl KernelKind {
    /// The kind in image flags.
    pub const fn of_flags(flags: u32) -> KernelKind {
        match (flags & KERNEL_KIND_MASK) >> KERNEL_KIND_SHIFT {
            0 => KernelKind::AiCore,
            1 => KernelKind::Cube,
            2 => KernelKind::Vector,
            _ => KernelKind::Mix,
        }
    }

    /// Its bits in image flags.
    pub const fn flags(self) -> u32 {
        (match self {
            KernelKind::AiCore => 0,
            KernelKind::Cube => 1,
            KernelKind::Vector => 2,
            KernelKind::Mix => 3,
        }) << KERNEL_KIND_SHIFT
    }
}

/// Most L2 control sections one launch carries (`rtL2Ctrl_t` has eight data sections).
pub const MAX_L2_SECTIONS: u32 = 8;

/// Bytes of one L2 control section in device memory: address (u64), bytes (u64), action
/// ([`L2Action`], u32) and four zero bytes, little-endian.
pub const L2_SECTION_BYTES: usize = 24;

/// One L2 control section of a kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct L2Section {
    /// First byte of the range.
    pub addr: u64,
    /// Its length.
    pub bytes: u64,
    /// What happens to it.
    pub action: L2Action,
}

impl L2Section {
    /// The section's bytes in device memory.
    pub fn encode(&self) -> [u8; L2_SECTION_BYTES] {
        let mut out = [0u8; L2_SECTION_BYTES];
        out[..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        out[16..20].copy_from_slice(&(self.action as u32).to_le_bytes());
        out
    }

    /// A section read back, or why it is not one: the action's value when it names none, or
    /// the reserved bytes when they are not zero.
    pub fn decode(b: &[u8; L2_SECTION_BYTES]) -> Result<L2Section, String> {
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        let action = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
        if b[20..] != [0; 4] {
            return Err("reserved bytes 20..24 are not zero".into());
        }
        let action = L2Action::from_le(U32::new(action))
            .ok_or_else(|| format!("action {action} is not 1 (keep) or 2 (drop)"))?;
        Ok(L2Section {
            addr: word(0),
            bytes: word(8),
            action,
        })
    }
}

macro_rules! tasks {
    ( $(
        $(#[doc = $doc:literal])*
        $kind:ident = $num:literal { $( $(#[doc = $fdoc:literal])* $field:ident : $fty:ty ),* $(,)? }
    )* ) => {
        /// Task kind numbers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum TaskKind { $( $(#[doc = $doc])* $kind = $num ),* }

        impl TaskKind {
            /// Every kind.
            pub const ALL: &'static [TaskKind] = &[$(TaskKind::$kind),*];
            /// The kind's name.
            pub fn name(self) -> &'static str {
                match self { $( TaskKind::$kind => stringify!($kind) ),* }
            }
        }

        $(
            $(#[doc = $doc])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
            pub struct $kind { $( $(#[doc = $fdoc])* pub $field: $fty ),* }
        )*

        mod raw {
            #![allow(missing_docs)]
            use super::*;
            $(
                #[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy)]
                #[repr(C)]
                pub struct $kind { $( pub $field: <$fty as LeField>::Le ),* }
                const _: () = assert!(
                    core::mem::size_of::<$kind>() <= PAYLOAD_BYTES,
                    concat!("task payload ", stringify!($kind), " is larger than 56 bytes"),
                );
            )*
        }

        /// A decoded task.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Task { $( $(#[doc = $doc])* $kind($kind) ),* }

        impl Task {
            /// The kind.
            pub fn kind(&self) -> TaskKind {
                match self { $( Task::$kind(_) => TaskKind::$kind ),* }
            }

            /// Encodes the task with its id.
            pub fn encode(&self, task_id: u32) -> TaskDescriptor {
                let mut payload = [0u8; PAYLOAD_BYTES];
                match self { $( Task::$kind(t) => {
                    let r = raw::$kind { $( $field: LeField::to_le(t.$field) ),* };
                    let bytes = r.as_bytes();
                    payload[..bytes.len()].copy_from_slice(bytes);
                } ),* }
                TaskDescriptor {
                    kind: U16::new(self.kind() as u16),
                    flags: U16::new(0),
                    task_id: U32::new(task_id),
                    payload,
                }
            }
        }

        impl TaskDescriptor {
            /// Decodes the descriptor.
            pub fn decode(&self) -> Result<Task, TaskDecodeError> {
                let task_id = self.task_id.get();
                match self.kind.get() {
                    $( $num => {
                        let kind = stringify!($kind);
                        let size = core::mem::size_of::<raw::$kind>();
                        if self.flags.get() != 0 || self.payload[size..].iter().any(|&b| b != 0) {
                            return Err(TaskDecodeError::Reserved { task_id, kind });
                        }
                        let r = raw::$kind::read_from_bytes(&self.payload[..size])
                            .map_err(|_| TaskDecodeError::Reserved { task_id, kind })?;
                        Ok(Task::$kind($kind { $( $field: <$fty as LeField>::from_le(r.$field)
                            .ok_or(TaskDecodeError::BadField {
                                task_id, kind, field: stringify!($field),
                                value: <$fty as LeField>::raw(r.$field),
                            })? ),* }))
                    } )*
                    kind => Err(TaskDecodeError::UnknownKind { task_id, kind }),
                }
            }
        }
    };
}

/// The stream id a `StreamActive` names to activate no stream.
pub const NO_STREAM: u32 = u32::MAX;

tasks! {
    /// Launch an AI core kernel split into `block_dim` blocks.
    AiCoreKernel = 0 {
        /// Device address of the kernel image (see `firmware`'s kernel image format).
        kernel: u64,
        /// Device address of the argument array (u64 values).
        args: u64,
        /// Number of blocks.
        block_dim: u32,
        /// Device address of the launch's L2 control sections ([`L2Section`]s), 0 for none.
        l2ctrl: u64,
        /// How many sections are there (at most [`MAX_L2_SECTIONS`]).
        l2_sections: u32,
    }
    /// Launch an AI CPU kernel.
    AiCpuKernel = 1 {
        /// Firmware kernel id.
        kernel: u32,
        /// Number of AI CPU blocks.
        block_dim: u32,
        /// Device address of the argument block.
        args: u64,
        /// Size of the argument block in bytes.
        args_size: u32,
    }
    /// Record an event.
    EventRecord = 2 {
        /// Event id.
        event: u32,
    }
    /// Wait for an event recorded on another stream.
    StreamWaitEvent = 3 {
        /// Event id.
        event: u32,
    }
    /// Copy memory.
    Memcpy = 5 {
        /// Direction.
        kind: MemcpyKind,
        /// Destination address.
        dst: u64,
        /// Source address.
        src: u64,
        /// Bytes.
        size: u64,
    }
    /// Run a loaded model (its streams) to completion.
    ModelExecute = 13 {
        /// Model id.
        model: u32,
    }
    /// Wait for a notify.
    NotifyWait = 14 {
        /// Notify id.
        notify: u32,
    }
    /// Record a notify.
    NotifyRecord = 15 {
        /// Notify id.
        notify: u32,
    }
    /// Activate a stream if the value at `cond_ptr` compares true with `value`.
    StreamSwitch = 18 {
        /// Device address of the i64 condition value.
        cond_ptr: u64,
        /// Value compared against.
        value: i64,
        /// Comparison.
        cond: SwitchCond,
        /// Stream activated when true.
        true_stream: u32,
    }
    /// Activate a stream; [`NO_STREAM`] activates none (GE's StreamActive with an empty
    /// active list: it only costs its control time).
    StreamActive = 19 {
        /// Stream id, or [`NO_STREAM`].
        stream: u32,
    }
    /// Mark a label position in the stream.
    LabelSet = 20 {
        /// Label id.
        label: u32,
    }
    /// Continue the stream at a label.
    LabelGoto = 22 {
        /// Label id.
        label: u32,
    }
    /// Fill memory with a byte value.
    Memset = 32 {
        /// Destination address.
        dst: u64,
        /// Bytes.
        size: u64,
        /// Byte value (low 8 bits).
        value: u32,
    }
    /// End of a model's task list.
    ModelEndGraph = 67 {
        /// Model id.
        model: u32,
    }
    /// Read a u32 index from device memory and jump to that entry of a label list; an index
    /// at or past `max` goes to the last label.
    LabelSwitchByIndex = 75 {
        /// Device address of the u32 index.
        index_ptr: u64,
        /// Number of labels in the list.
        max: u32,
        /// Device address of the u32 label ids.
        label_list: u64,
    }
}
