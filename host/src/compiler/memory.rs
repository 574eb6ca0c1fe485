//! The memory plan: where every tensor lives in device memory.
//!
//! - **Weights** (constants) are stored once: the root's constants, and any constant a branch
//!   produced by folding, deduplicated by content, so every branch shares them.
//! - **Feature maps** are planned per branch from the tensors' live ranges: a tensor's block is
//!   freed after its last consumer and reused first-fit by later tensors. Tensors that feed the
//!   `NetOutput` are not in it: they are written straight into the output buffers (GE's
//!   zero-copy outputs), sized for the largest gear. Blocks are only reused within one branch (GE's `_batch_label` rule), and every
//!   branch's plan starts at the same base, so the region is the largest branch's size — the
//!   max over gears, not the sum.
//! - **Inputs** get buffers sized for their largest gear, plus the gear vector.

use std::collections::BTreeMap;

use super::infer::Registry;
use super::ir::{Attr, Graph, NodeId, Tensor, Value, element_count};

/// Alignment of every block.
pub const ALIGN: u64 = 512;

fn aligned(b: u64) -> u64 {
    b.max(1).div_ceil(ALIGN) * ALIGN
}

/// A tensor's block in a branch's feature-map region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The tensor.
    pub value: Value,
    /// Offset from the region's base.
    pub offset: u64,
    /// Size in bytes.
    pub bytes: u64,
}

/// One branch's feature-map plan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BranchPlan {
    /// Every tensor's block.
    pub blocks: Vec<Block>,
    /// Bytes the branch needs.
    pub bytes: u64,
}

impl BranchPlan {
    /// The block of a value.
    pub fn block(&self, v: Value) -> Option<&Block> {
        self.blocks.iter().find(|b| b.value == v)
    }
}

/// A constant's place in the weight region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightRef {
    /// Offset in the weight region.
    pub offset: u64,
    /// Size in bytes.
    pub bytes: u64,
}

/// The weight region: constants stored once, deduplicated by content.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    /// The region's bytes (the `.om` WEIGHTS section).
    pub data: Vec<u8>,
    index: BTreeMap<u64, Vec<(u64, u64)>>,
}

impl Weights {
    /// Adds a constant (or finds an identical one) and returns where it is.
    pub fn add(&mut self, t: &Tensor) -> WeightRef {
        let bytes = t.data.len() as u64;
        let key = gearsim_isa::checksum::checksum(&t.data);
        if let Some(hits) = self.index.get(&key) {
            for &(off, len) in hits {
                if len == bytes && self.data[off as usize..(off + len) as usize] == t.data[..] {
                    return WeightRef { offset: off, bytes };
                }
            }
        }
        let offset = self.data.len() as u64;
        self.data.extend_from_slice(&t.data);
        self.data
            .resize(aligned(self.data.len() as u64) as usize, 0);
        self.index.entry(key).or_default().push((offset, bytes));
        WeightRef { offset, bytes }
    }

    /// Size of the region.
    pub fn bytes(&self) -> u64 {
        self.data.len() as u64
    }
}

/// A branch that cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("memory plan of graph `{graph}`: tensor {node}:{output} has no static size ({desc})")]
pub struct PlanError {
    /// Graph name.
    pub graph: String,
    /// Node name.
    pub node: String,
    /// Output index.
    pub output: u32,
    /// Its descriptor.
    pub desc: String,
}

/// Whether every consumer of `id`'s output reads it through a compile-time input (an
/// operator's [`OpDef::static_inputs`](super::infer::OpDef::static_inputs)): such a constant becomes a kernel parameter and is
/// never stored. A constant nobody reads is not stored either.
pub fn only_static_uses(graph: &Graph, id: NodeId, registry: &Registry) -> bool {
    graph.nodes.iter().all(|n| {
        n.inputs.iter().enumerate().all(|(k, v)| {
            v.is_none_or(|v| v.node != id)
                || registry
                    .get(&n.op)
                    .is_some_and(|d| d.static_inputs.contains(&k))
        })
    })
}

/// Plans one graph's feature maps; also adds its stored `Const` nodes to `weights`.
pub fn plan_graph(
    graph: &Graph,
    weights: &mut Weights,
    registry: &Registry,
) -> Result<(BranchPlan, BTreeMap<NodeId, WeightRef>), PlanError> {
    let mut last_use: BTreeMap<Value, usize> = BTreeMap::new();
    let mut outputs = std::collections::BTreeSet::new();
    for (t, node) in graph.nodes.iter().enumerate() {
        if node.op == "NetOutput" {
            outputs.extend(node.inputs.iter().flatten().copied());
            continue;
        }
        for v in node.inputs.iter().flatten() {
            let e = last_use.entry(*v).or_insert(t);
            *e = (*e).max(t);
        }
    }
    let mut consts = BTreeMap::new();
    // Free list: offset -> size, coalesced; `top` is the end of the region.
    let mut free: BTreeMap<u64, u64> = BTreeMap::new();
    let mut top = 0u64;
    let mut live: Vec<(usize, u64, u64)> = Vec::new(); // (last use, offset, size)
    let mut blocks = Vec::new();
    for (t, node) in graph.nodes.iter().enumerate() {
        // Release every block whose last consumer ran before this node.
        live.retain(|&(until, off, size)| {
            if until < t {
                release(&mut free, off, size);
                false
            } else {
                true
            }
        });
        match node.op.as_str() {
            "Data" | "NetOutput" => continue,
            "Const" => {
                let id = NodeId(t as u32);
                if let Some(Attr::Tensor(v)) = node.attrs.get("value") {
                    if !only_static_uses(graph, id, registry) {
                        consts.insert(id, weights.add(v));
                    }
                }
                continue;
            }
            _ => {}
        }
        for (k, desc) in node.outputs.iter().enumerate() {
            let value = Value {
                node: NodeId(t as u32),
                output: k as u32,
            };
            if outputs.contains(&value) {
                continue;
            }
            let Some(count) = element_count(&desc.shape) else {
                return Err(PlanError {
                    graph: graph.name.clone(),
                    node: node.name.clone(),
                    output: k as u32,
                    desc: desc.to_string(),
                });
            };
            let size = aligned(count.max(0) as u64 * desc.dtype.size() as u64);
            let offset = take(&mut free, &mut top, size);
            let until = last_use.get(&value).copied().unwrap_or(t);
            live.push((until, offset, size));
            blocks.push(Block {
                value,
                offset,
                bytes: size,
            });
        }
    }
    Ok((BranchPlan { blocks, bytes: top }, consts))
}

fn take(free: &mut BTreeMap<u64, u64>, top: &mut u64, size: u64) -> u64 {
    let hit = free
        .iter()
        .find(|(_, s)| **s >= size)
        .map(|(o, s)| (*o, *s));
    match hit {
        Some((off, s)) => {
            free.remove(&off);
            if s > size {
                free.insert(off + size, s - size);
            }
            off
        }
        None => {
            // Grow into the top, starting inside a free block that ends at the top.
            let start = match free.iter().next_back() {
                Some((&o, &s)) if o + s == *top => {
                    free.remove(&o);
                    o
                }
                _ => *top,
            };
            *top = start + size;
            start
        }
    }
}

fn release(free: &mut BTreeMap<u64, u64>, off: u64, size: u64) {
    let (mut start, mut len) = (off, size);
    if let Some((&p, &ps)) = free.range(..off).next_back() {
        if p + ps == off {
            free.remove(&p);
            start = p;
            len += ps;
        }
    }
    if let Some(ns) = free.remove(&(off + size)) {
        len += ns;
    }
    free.insert(start, len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::ir::{DataType, Node, TensorDesc, fixed_shape};

    /// A chain a -> b -> c -> d of equal tensors reuses two blocks; `a`, read again at the end,
    /// keeps its own; the outputs (`e`, `d`) go to the output buffers.
    #[test]
    fn blocks_are_reused_after_their_last_use() {
        let mut g = Graph::new("g");
        let desc = || TensorDesc::new(DataType::F32, fixed_shape(&[256]));
        let x = g.add(Node::new("x", "Data", vec![], vec![desc()]));
        let v = |n: NodeId| Some(Value { node: n, output: 0 });
        let a = g.add(Node::new("a", "Relu", vec![v(x)], vec![desc()]));
        let b = g.add(Node::new("b", "Relu", vec![v(a)], vec![desc()]));
        let c = g.add(Node::new("c", "Relu", vec![v(b)], vec![desc()]));
        let d = g.add(Node::new("d", "Relu", vec![v(c)], vec![desc()]));
        let e = g.add(Node::new("e", "Add", vec![v(d), v(a)], vec![desc()]));
        g.add(Node::new("out", "NetOutput", vec![v(e), v(d)], vec![]));
        let (plan, _) = plan_graph(&g, &mut Weights::default(), &Registry::default()).unwrap();
        let off = |n: NodeId| plan.block(Value { node: n, output: 0 }).unwrap().offset;
        assert_eq!(plan.bytes, 3 * 1024);
        assert_ne!(off(b), off(c));
        assert!(
            off(a) != off(b) && off(a) != off(c),
            "a is read again at the end"
        );
        assert!(
            plan.block(Value { node: d, output: 0 }).is_none(),
            "d is an output"
        );
        assert!(
            plan.block(Value { node: e, output: 0 }).is_none(),
            "e is an output"
        );
    }

    #[test]
    fn weights_are_stored_once() {
        let mut w = Weights::default();
        let t = Tensor::from_f32s(vec![3], &[1.0, 2.0, 3.0]);
        let a = w.add(&t);
        let b = w.add(&t.clone());
        let c = w.add(&Tensor::from_f32s(vec![3], &[1.0, 2.0, 4.0]));
        assert_eq!(a, b);
        assert_ne!(a.offset, c.offset);
        assert_eq!(w.bytes(), 2 * ALIGN);
    }
}
