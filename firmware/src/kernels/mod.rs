//! The firmware's built-in device kernels and the argument blocks that launch them.
//!
//! AI CPU kernels are launched by an `AiCpuKernel` task whose `kernel` field is an
//! [`AiCpuKernelId`] and whose `args` point at an argument block in device memory, laid out
//! little-endian as each `*Args` type documents; `encode` builds the block on the host side and
//! `decode` parses it on the device, so the layout is written once.

pub mod map_index;

use gearsim_isa::aicpu_op::AiCpuOp;
use gearsim_isa::om::{Decoder, Encoder};
use gearsim_isa::task::{AiCpuKernel, Task};

use crate::memory::HOST_BASE;

/// The firmware's AI CPU kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AiCpuKernelId {
    /// MapIndex, AI CPU engine.
    MapIndex = 1,
    /// GetDynamicDims.
    GetDynamicDims = 2,
    /// GetNext.
    GetNext = 3,
    /// A graph operator placed on the AI CPU ([`AiCpuOpArgs`]).
    Op = 4,
}

impl AiCpuKernelId {
    /// The kernel with this id.
    pub fn from_u32(v: u32) -> Option<AiCpuKernelId> {
        match v {
            1 => Some(AiCpuKernelId::MapIndex),
            2 => Some(AiCpuKernelId::GetDynamicDims),
            3 => Some(AiCpuKernelId::GetNext),
            4 => Some(AiCpuKernelId::Op),
            _ => None,
        }
    }

    /// The task that runs this kernel with the argument block at `args` (`size` bytes).
    pub fn task(self, args: u64, size: u32) -> Task {
        Task::AiCpuKernel(AiCpuKernel {
            kernel: self as u32,
            block_dim: 1,
            args,
            args_size: size,
        })
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            AiCpuKernelId::MapIndex => "MapIndex",
            AiCpuKernelId::GetDynamicDims => "GetDynamicDims",
            AiCpuKernelId::GetNext => "GetNext",
            AiCpuKernelId::Op => "AiCpuOp",
        }
    }
}

/// Little-endian reader over an argument block that reports what is missing.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    fn take<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let end = self.at + N;
        let slice = self.bytes.get(self.at..end).ok_or_else(|| {
            format!(
                "argument block is {} bytes, too short for `{what}` at byte {}",
                self.bytes.len(),
                self.at
            )
        })?;
        self.at = end;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.take(what)?))
    }
}

/// A graph operator's arguments: the operator as [`AiCpuOp::encode`] writes it, then the
/// input and the output buffers, each list a u32 count of `(address, bytes)` u64 pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AiCpuOpArgs {
    /// The operator.
    pub op: AiCpuOp,
    /// Input buffers (address, bytes).
    pub inputs: Vec<(u64, u64)>,
    /// Output buffers (address, bytes).
    pub outputs: Vec<(u64, u64)>,
}

impl AiCpuOpArgs {
    /// The argument block.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        self.op.encode(&mut e);
        for list in [&self.inputs, &self.outputs] {
            e.len(list.len());
            for (addr, bytes) in list {
                e.u64(*addr);
                e.u64(*bytes);
            }
        }
        e.bytes
    }

    /// Parses an argument block.
    pub fn decode(bytes: &[u8]) -> Result<AiCpuOpArgs, String> {
        let mut d = Decoder::new(bytes, "AI CPU op arguments");
        let op = AiCpuOp::decode(&mut d).map_err(|e| e.to_string())?;
        let mut lists = [Vec::new(), Vec::new()];
        for (list, field) in lists.iter_mut().zip(["inputs", "outputs"]) {
            let n = d.len(field, 16).map_err(|e| e.to_string())?;
            for _ in 0..n {
                let addr = d.u64(field).map_err(|e| e.to_string())?;
                let size = d.u64(field).map_err(|e| e.to_string())?;
                list.push((addr, size));
            }
        }
        let [inputs, outputs] = lists;
        Ok(AiCpuOpArgs {
            op,
            inputs,
            outputs,
        })
    }
}

/// MapIndex (AI CPU engine) arguments: `x, table, level_index (0 = none), y: u64`,
/// `n, gears, layout: u32`, 4 reserved bytes (40 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapIndexArgs {
    /// Query vector (i32[n]).
    pub x: u64,
    /// Gear table in `layout`.
    pub table: u64,
    /// Optional remap table (i32[gears]); 0 when absent.
    pub level_index: u64,
    /// Output (one i32).
    pub y: u64,
    /// The shape.
    pub shape: map_index::MapIndexShape,
}

impl MapIndexArgs {
    /// The argument block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40);
        for v in [self.x, self.table, self.level_index, self.y] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.shape.n, self.shape.gears, self.shape.layout.code(), 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses an argument block.
    pub fn decode(bytes: &[u8]) -> Result<MapIndexArgs, String> {
        let mut r = Reader::new(bytes);
        let (x, table, level_index, y) = (
            r.u64("x")?,
            r.u64("table")?,
            r.u64("level_index")?,
            r.u64("y")?,
        );
        let (n, gears, layout) = (r.u32("n")?, r.u32("gears")?, r.u32("layout")?);
        let layout = map_index::TableLayout::from_code(layout).ok_or_else(|| {
            format!(
                "field `layout` = {layout}: expected 0 (gear-major), 1 (dim-major padded to 8) \
                 or 2 (sorted for binary search)"
            )
        })?;
        Ok(MapIndexArgs {
            x,
            table,
            level_index,
            y,
            shape: map_index::MapIndexShape {
                n,
                gears,
                layout,
                level_index: level_index != 0,
            },
        })
    }
}

pub use gearsim_isa::gear::{MAX_RANK, SHAPE_TENSOR_BYTES};

/// Encodes a runtime shape as a shape tensor.
pub fn encode_shape(dims: &[i64]) -> Vec<u8> {
    let mut b = vec![0u8; SHAPE_TENSOR_BYTES as usize];
    b[..8].copy_from_slice(&(dims.len() as i64).to_le_bytes());
    for (i, d) in dims.iter().take(MAX_RANK).enumerate() {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&d.to_le_bytes());
    }
    b
}

/// Decodes a shape tensor.
pub fn decode_shape(b: &[u8]) -> Result<Vec<i64>, String> {
    let mut r = Reader::new(b);
    let rank = r.i64("rank")?;
    if !(0..=MAX_RANK as i64).contains(&rank) {
        return Err(format!(
            "shape tensor rank {rank} is outside [0, {MAX_RANK}]"
        ));
    }
    (0..rank).map(|i| r.i64(&format!("dim {i}"))).collect()
}

/// GetDynamicDims arguments: `out: u64`, `out_dtype: u32` (0 = int32, 1 = int64), `n: u32`
/// (the `N` attr), `shape_info_len: u32`, 4 reserved bytes, then `n` shape-tensor addresses
/// (u64) and `shape_info_len` i64 values of the `shape_info` attr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetDynamicDimsArgs {
    /// Output buffer.
    pub out: u64,
    /// Whether the output is int64 (else int32).
    pub out_i64: bool,
    /// The `N` attribute.
    pub n: u32,
    /// Shape tensors, one per input (written by GetNext).
    pub shapes: Vec<u64>,
    /// The `shape_info` attribute: per input `[rank, d0, ..., d(rank-1)]`, `-1` marking gear dims.
    pub shape_info: Vec<i64>,
}

impl GetDynamicDimsArgs {
    /// The argument block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.out.to_le_bytes());
        b.extend_from_slice(&u32::from(self.out_i64).to_le_bytes());
        b.extend_from_slice(&self.n.to_le_bytes());
        b.extend_from_slice(&(self.shape_info.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for s in &self.shapes {
            b.extend_from_slice(&s.to_le_bytes());
        }
        for v in &self.shape_info {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses an argument block. The number of shape addresses is the number of inputs the
    /// launch wired; it is read from the block's size.
    pub fn decode(bytes: &[u8]) -> Result<GetDynamicDimsArgs, String> {
        let mut r = Reader::new(bytes);
        let out = r.u64("out")?;
        let dtype = r.u32("out_dtype")?;
        let out_i64 = match dtype {
            0 => false,
            1 => true,
            _ => {
                return Err(format!(
                    "field `out_dtype` = {dtype}: expected 0 (int32) or 1 (int64)"
                ));
            }
        };
        let n = r.u32("N")?;
        let info_len = r.u32("shape_info_len")? as usize;
        r.u32("reserved")?;
        let rest = bytes.len().saturating_sub(24);
        if rest < info_len * 8 {
            return Err(format!(
                "argument block too short for shape_info of {info_len} values"
            ));
        }
        let inputs = (rest - info_len * 8) / 8;
        let shapes = (0..inputs)
            .map(|i| r.u64(&format!("shape {i}")))
            .collect::<Result<_, _>>()?;
        let shape_info = (0..info_len)
            .map(|i| r.i64(&format!("shape_info[{i}]")))
            .collect::<Result<_, _>>()?;
        Ok(GetDynamicDimsArgs {
            out,
            out_i64,
            n,
            shapes,
            shape_info,
        })
    }
}

/// GetDynamicDims semantics (gear spec §5): the input count must equal `N` and the number of
/// `shape_info` groups; each runtime shape must have its group's rank; the runtime dims at the
/// configured `-1` positions are collected in input order.
pub fn get_dynamic_dims(
    n: u32,
    shape_info: &[i64],
    shapes: &[Vec<i64>],
) -> Result<Vec<i64>, String> {
    let mut groups = Vec::new();
    let mut i = 0;
    while i < shape_info.len() {
        let rank = shape_info[i];
        if rank < 0 || i + 1 + rank as usize > shape_info.len() {
            return Err(format!(
                "shape_info group at {i} has rank {rank}, which runs past the attribute's {} values",
                shape_info.len()
            ));
        }
        groups.push(&shape_info[i + 1..i + 1 + rank as usize]);
        i += 1 + rank as usize;
    }
    if shapes.len() != n as usize || groups.len() != n as usize {
        return Err(format!(
            "input count {} must equal N = {n} and the {} shape_info groups (KERNEL_STATUS_PARAM_INVALID)",
            shapes.len(),
            groups.len()
        ));
    }
    let mut dims = Vec::new();
    for (k, (group, shape)) in groups.iter().zip(shapes).enumerate() {
        if group.len() != shape.len() {
            return Err(format!(
                "input {k}: runtime rank {} differs from configured rank {} (KERNEL_STATUS_PARAM_INVALID)",
                shape.len(),
                group.len()
            ));
        }
        for (c, r) in group.iter().zip(shape) {
            if *c == -1 {
                dims.push(*r);
            }
        }
    }
    Ok(dims)
}

/// One output of a GetNext: where the tensor's data and its shape tensor go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GetNextOutput {
    /// Data buffer.
    pub data: u64,
    /// Its capacity in bytes.
    pub capacity: u64,
    /// Shape tensor (see [`SHAPE_TENSOR_BYTES`]).
    pub shape: u64,
}

/// GetNext arguments: `queue: u32`, `count: u32`, `timeout_us: u64` (0 = wait forever), then
/// `count` outputs of `data: u64, capacity: u64, shape: u64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetNextArgs {
    /// Data queue id.
    pub queue: u32,
    /// Longest wait for data, microseconds; 0 waits forever.
    pub timeout_us: u64,
    /// Outputs, one per tensor of a queue item.
    pub outputs: Vec<GetNextOutput>,
}

impl GetNextArgs {
    /// The argument block.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&self.queue.to_le_bytes());
        b.extend_from_slice(&(self.outputs.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.timeout_us.to_le_bytes());
        for o in &self.outputs {
            for v in [o.data, o.capacity, o.shape] {
                b.extend_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    /// Parses an argument block.
    pub fn decode(bytes: &[u8]) -> Result<GetNextArgs, String> {
        let mut r = Reader::new(bytes);
        let queue = r.u32("queue")?;
        let count = r.u32("count")?;
        let timeout_us = r.u64("timeout_us")?;
        if u64::from(count) * 24 > bytes.len() as u64 {
            return Err(format!(
                "field `count` = {count}: more outputs than the argument block holds"
            ));
        }
        let outputs = (0..count)
            .map(|i| {
                Ok(GetNextOutput {
                    data: r.u64(&format!("output {i} data"))?,
                    capacity: r.u64(&format!("output {i} capacity"))?,
                    shape: r.u64(&format!("output {i} shape"))?,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(GetNextArgs {
            queue,
            timeout_us,
            outputs,
        })
    }
}

/// Whether an address is a host address (so not usable where a device address is expected).
pub fn is_host_address(addr: u64) -> bool {
    addr >= HOST_BASE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_dynamic_dims_spec_example() {
        let info = [4, 3, 2, -1, 1, 3, 1, 2, 1, 5, 16, -1, -1, 3, 4];
        let shapes = vec![vec![3, 2, 4, 1], vec![1, 2, 1], vec![16, 112, 112, 3, 4]];
        assert_eq!(
            get_dynamic_dims(3, &info, &shapes).unwrap(),
            vec![4, 112, 112]
        );
        assert!(
            get_dynamic_dims(2, &info, &shapes)
                .unwrap_err()
                .contains("must equal N = 2")
        );
        let bad = vec![vec![3, 2, 4], vec![1, 2, 1], vec![16, 112, 112, 3, 4]];
        assert!(
            get_dynamic_dims(3, &info, &bad)
                .unwrap_err()
                .contains("input 0: runtime rank 3 differs from configured rank 4")
        );
    }

    #[test]
    fn argument_blocks_round_trip() {
        let a = GetDynamicDimsArgs {
            out: 1,
            out_i64: true,
            n: 2,
            shapes: vec![7, 8],
            shape_info: vec![1, -1, 2, -1, 3],
        };
        assert_eq!(GetDynamicDimsArgs::decode(&a.encode()).unwrap(), a);
        let g = GetNextArgs {
            queue: 3,
            timeout_us: 9,
            outputs: vec![GetNextOutput {
                data: 1,
                capacity: 2,
                shape: 3,
            }],
        };
        assert_eq!(GetNextArgs::decode(&g.encode()).unwrap(), g);
        assert!(GetNextArgs::decode(&g.encode()[..20]).is_err());
        assert_eq!(decode_shape(&encode_shape(&[2, 3])).unwrap(), vec![2, 3]);
    }
}
