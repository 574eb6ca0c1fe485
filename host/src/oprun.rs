//! Runs one node on the simulated device, the way the lowering tests and `gearsim bench
//! kernels` need it: the one-node graph is built and inferred, the node lowered, inputs,
//! derived constants and workspace put in device memory, every kernel launched through
//! `firmware::Device`, and the outputs read back.

use gearsim_firmware::kernels::{AiCpuKernelId, AiCpuOpArgs};
use gearsim_firmware::{Device, DevicePtr, LaunchReport};
use gearsim_sim::{ChipConfig, ExecMode};
use gearsim_traces::{NullSink, TraceSink};

use crate::target;
use crate::verify::verify_launch;
use gearsim_compiler::infer::infer_graph;
use gearsim_compiler::ir::{Attr, DataType, Graph, Node, Tensor, TensorDesc, Value};
use gearsim_compiler::lower::{Kernel, LowerCtx, Lowered, Operand, lower_node};
use gearsim_compiler::ops;

/// An input of the node under test.
#[derive(Debug, Clone)]
pub struct In {
    /// The value.
    pub tensor: Tensor,
    /// Whether it is a constant (a weight the lowering may prepare at compile time).
    pub constant: bool,
}

/// A runtime input.
pub fn data(t: Tensor) -> In {
    In {
        tensor: t,
        constant: false,
    }
}

/// A constant input.
pub fn constant(t: Tensor) -> In {
    In {
        tensor: t,
        constant: true,
    }
}

/// What a run produced.
pub struct Ran {
    /// The outputs.
    pub outputs: Vec<Tensor>,
    /// One report per kernel launch.
    pub launches: Vec<LaunchReport>,
    /// The kernels.
    pub kernels: Vec<Kernel>,
}

/// Lowers `op` with `attrs` over `inputs` (opset 18, `outputs` outputs) and runs it on a fresh
/// device of chip `cfg` in `mode`.
pub fn run_op(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: Vec<In>,
    outputs: usize,
    mode: ExecMode,
) -> Result<Ran, String> {
    run_op_optional(
        cfg,
        op,
        attrs,
        inputs.into_iter().map(Some).collect(),
        outputs,
        mode,
    )
}

/// [`run_op`] with optional inputs: `None` is an absent input (an empty name in ONNX, such as
/// Clip's `min` when only `max` is given).
pub fn run_op_optional(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: Vec<Option<In>>,
    outputs: usize,
    mode: ExecMode,
) -> Result<Ran, String> {
    run_op_formats(cfg, op, attrs, inputs, &[], outputs, mode)
}

/// [`run_op_optional`] with the layout pass's formats: input `i` is stored in `formats[i]`
/// (its bytes already in that layout) and the outputs in `formats[inputs.len() + k]`
/// (read back in that layout); missing entries keep the plain layout.
pub fn run_op_formats(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: Vec<Option<In>>,
    formats: &[gearsim_compiler::ir::Format],
    outputs: usize,
    mode: ExecMode,
) -> Result<Ran, String> {
    run_op_traced(cfg, op, attrs, inputs, formats, outputs, mode, NullSink).map(|(r, _)| r)
}

/// Builds the one-node graph of `op` over `inputs` (the input and output `formats` in order)
/// and lowers the node for chip `cfg` without running it: the node, as inferred, and its
/// lowering.
pub fn lower_op_formats(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: &[Option<In>],
    formats: &[gearsim_compiler::ir::Format],
    outputs: usize,
) -> Result<(Node, Lowered), String> {
    // The one-node graph.
    let mut g = Graph::new("test");
    let mut ins = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let Some(input) = input else {
            ins.push(None);
            continue;
        };
        let desc = TensorDesc::of(&input.tensor);
        let n = if input.constant {
            let mut n = Node::new(format!("c{i}"), "Const", vec![], vec![desc]);
            n.attrs
                .insert("value".into(), Attr::Tensor(input.tensor.clone()));
            n
        } else {
            let mut n = Node::new(format!("x{i}"), "Data", vec![], vec![desc]);
            n.attrs.insert("index".into(), Attr::Int(i as i64));
            n
        };
        ins.push(Some(Value {
            node: g.add(n),
            output: 0,
        }));
    }
    let placeholder = TensorDesc::new(DataType::F32, vec![]);
    let mut node = Node::new("node", op, ins, vec![placeholder; outputs]);
    for (k, v) in attrs {
        node.attrs.insert((*k).to_string(), v.clone());
    }
    let id = g.add(node);
    let registry = ops::standard();
    let outs = (0..outputs as u32)
        .map(|k| {
            Some(Value {
                node: id,
                output: k,
            })
        })
        .collect();
    g.add(Node::new("out", "NetOutput", outs, vec![]));
    infer_graph(&mut g, &registry, 18).map_err(|e| e.to_string())?;
    let mut node = g.node(id).clone();
    for (k, d) in node.outputs.iter_mut().enumerate() {
        if let Some(f) = formats.get(inputs.len() + k) {
            d.format = *f;
        }
    }
    let in_descs: Vec<Option<TensorDesc>> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_ref().map(|t| {
                let mut d = TensorDesc::of(&t.tensor);
                if let Some(f) = formats.get(i) {
                    d.format = *f;
                }
                d
            })
        })
        .collect();
    let target = target::for_chip(cfg);
    let ctx = LowerCtx {
        node: &node,
        inputs: in_descs.iter().map(Option::as_ref).collect(),
        values: inputs
            .iter()
            .map(|i| i.as_ref().and_then(|i| i.constant.then_some(&i.tensor)))
            .collect(),
        outputs: &node.outputs,
        target: &target,
    };
    let lowered = lower_node(&ctx).map_err(|e| e.to_string())?;
    Ok((node, lowered))
}

/// [`run_op_formats`] recording the device's trace into `sink` (returned with the run).
#[allow(clippy::too_many_arguments)]
pub fn run_op_traced<S: TraceSink>(
    cfg: &ChipConfig,
    op: &str,
    attrs: &[(&str, Attr)],
    inputs: Vec<Option<In>>,
    formats: &[gearsim_compiler::ir::Format],
    outputs: usize,
    mode: ExecMode,
    sink: S,
) -> Result<(Ran, S), String> {
    let (node, lowered) = lower_op_formats(cfg, op, attrs, &inputs, formats, outputs)?;
    let mut dev = Device::new(cfg.clone(), sink);
    let put = |dev: &mut Device<S>, bytes: &[u8]| -> Result<u64, String> {
        let p = dev
            .alloc(bytes.len().max(1) as u64)
            .map_err(|e| e.to_string())?;
        dev.write(p, bytes).map_err(|e| e.to_string())?;
        Ok(p.0)
    };
    let in_ptrs: Vec<u64> = inputs
        .iter()
        .map(|i| i.as_ref().map_or(Ok(0), |i| put(&mut dev, &i.tensor.data)))
        .collect::<Result<_, _>>()?;
    let mut aicpu = None;
    let (kernels, derived, workspace) = match lowered {
        Lowered::Alias { input } => {
            let t = &inputs[input]
                .as_ref()
                .ok_or_else(|| format!("the output aliases absent input {input}"))?
                .tensor;
            let out = Tensor::new(
                t.dtype,
                node.outputs[0]
                    .shape
                    .iter()
                    .map(|d| d.fixed().unwrap_or(-1))
                    .collect(),
                t.data.to_vec(),
            )?;
            return Ok((
                Ran {
                    outputs: vec![out],
                    launches: Vec::new(),
                    kernels: Vec::new(),
                },
                dev.into_sink(),
            ));
        }
        Lowered::Kernels {
            kernels,
            derived,
            workspace_bytes,
        } => (kernels, derived, workspace_bytes),
        Lowered::AiCpu { op } => {
            aicpu = Some(op);
            (Vec::new(), Vec::new(), 0)
        }
    };
    let derived_ptrs: Vec<u64> = derived
        .iter()
        .map(|t| put(&mut dev, &t.data))
        .collect::<Result<_, _>>()?;
    let ws = if workspace > 0 {
        dev.alloc(workspace).map_err(|e| e.to_string())?.0
    } else {
        0
    };
    // Outputs start filled with a NaN-ish pattern so a kernel that skips elements shows.
    let out_ptrs: Vec<(u64, TensorDesc)> = node
        .outputs
        .iter()
        .map(|d| {
            let bytes = d.bytes().unwrap_or(0);
            let p = dev.alloc(bytes.max(1)).map_err(|e| e.to_string())?;
            dev.fill(p, bytes, 0xff).map_err(|e| e.to_string())?;
            Ok((p.0, d.clone()))
        })
        .collect::<Result<_, String>>()?;
    if let Some(op) = aicpu {
        let inputs = inputs
            .iter()
            .zip(&in_ptrs)
            .take(op.input_count())
            .map(|(i, p)| (*p, i.as_ref().map_or(0, |i| i.tensor.data.len() as u64)))
            .collect();
        let outputs = out_ptrs
            .iter()
            .map(|(p, d)| (*p, d.bytes().unwrap_or(0)))
            .collect();
        let block = AiCpuOpArgs {
            op,
            inputs,
            outputs,
        }
        .encode();
        let args = put(&mut dev, &block)?;
        let task = AiCpuKernelId::Op.task(args, block.len() as u32);
        let stream = dev.default_stream().map_err(|e| e.to_string())?;
        dev.submit(stream, task, Some(&node.name))
            .map_err(|e| e.to_string())?;
        dev.synchronize(stream).map_err(|e| e.to_string())?;
    }
    let mut launches = Vec::new();
    for k in &kernels {
        let handle =
            crate::runtime::load::load_lowered(&mut dev, k, 0).map_err(|e| e.to_string())?;
        let bufs: Vec<(u64, u64)> = k
            .args
            .iter()
            .map(|a| match *a {
                Operand::Input(i) | Operand::InputFrom(i, _) => (
                    inputs[i]
                        .as_ref()
                        .map_or(0, |t| t.tensor.data.len() as u64)
                        .saturating_sub(a.offset()),
                    in_ptrs[i] + a.offset(),
                ),
                Operand::Output(i) | Operand::OutputFrom(i, _) => (
                    out_ptrs[i]
                        .1
                        .bytes()
                        .unwrap_or(0)
                        .saturating_sub(a.offset()),
                    out_ptrs[i].0 + a.offset(),
                ),
                Operand::Derived(i) => (derived[i].data.len() as u64, derived_ptrs[i]),
                Operand::Workspace(off) => (workspace - off, ws + off),
            })
            .collect();
        // Every lowering test checks its kernels statically too: a read or write outside an
        // argument's bytes would go unnoticed on the device when the neighbour is padding.
        let programs = std::iter::once(&k.program).chain(k.mix.as_ref().map(|m| &m.vector));
        for program in programs {
            let report = verify_launch(program, k.block_dim, &bufs, cfg);
            if !report.is_ok() {
                return Err(format!("kernel {}: {report}", k.name));
            }
        }
        let args: Vec<u64> = bufs.iter().map(|b| b.1).collect();
        let r = dev
            .launch(handle, k.block_dim, &args, mode)
            .map_err(|e| format!("kernel {}: {e}\n{}", k.name, k.listing()))?;
        launches.push(r);
    }
    let outputs = out_ptrs
        .iter()
        .map(|(p, d)| {
            let bytes = d.bytes().unwrap_or(0) as usize;
            let mut buf = vec![0u8; bytes];
            dev.read(DevicePtr(*p), &mut buf)
                .map_err(|e| e.to_string())?;
            Tensor::new(
                d.dtype,
                d.shape.iter().map(|x| x.fixed().unwrap_or(-1)).collect(),
                buf,
            )
        })
        .collect::<Result<_, _>>()?;
    Ok((
        Ran {
            outputs,
            launches,
            kernels,
        },
        dev.into_sink(),
    ))
}
