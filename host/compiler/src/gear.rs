//! MultiBatchClonePass (gear spec §4): turns a graph with gear-controlled inputs into a root
//! graph that selects a branch at run time and one static branch subgraph per gear.
//!
//! ```text
//!  root:  Data (max-gear shapes) ─────────────────────────────┐
//!         ascend_mbatch_shape_data ─▶ ascend_mbatch_shape_mapindex ─▶ ascend_mbatch_shape_case ─▶ NetOutput
//!         ascend_mbatch_shape_const ─┘            (branch index)   ▲ Batch_0 .. Batch_{G-1}
//!         original Consts (weights, once) ─────────────────────────┘
//! ```
//!
//! In GetNext sink mode a `GetNext` node replaces the user `Data` nodes and
//! `ascend_mbatch_get_dynamic_dims_node` (GetDynamicDims, fed by its shape outputs) replaces
//! the shape Data; the NetOutput gets one more input, the gear vector, to read back.
//! Names, attributes and input order follow GE exactly; the branch subgraphs are copies of the
//! original body with every node renamed `<name>_ascend_mbatch_batch_<i>`, the user inputs
//! given gear i's shapes, the constants turned into `Data` inputs of the Case, and every node
//! labelled `_batch_label = "Batch_<i>"` (MultiBatchPass).

use std::collections::BTreeMap;

use super::ir::{
    Attr, DataType, Graph, Model, Node, NodeId, Tensor, TensorDesc, Value, fixed_shape,
};

pub use gearsim_isa::gear::SHAPE_DATA;
/// Name of the GetDynamicDims node (sink mode).
pub const GET_DYNAMIC_DIMS: &str = "ascend_mbatch_get_dynamic_dims_node";
/// Name of the gear table constant.
pub const SHAPE_CONST: &str = "ascend_mbatch_shape_const";
/// Name of the MapIndex node.
pub const MAPINDEX: &str = "ascend_mbatch_shape_mapindex";
/// Name of the Case node.
pub const CASE: &str = "ascend_mbatch_shape_case";
/// Name of the GetNext node gearsim inserts in sink mode.
pub const GETNEXT: &str = "ascend_mbatch_getnext";

/// One gear-controlled input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GearInput {
    /// Name of the input's `Data` node.
    pub name: String,
    /// Its dims as the user declared them, `-1` for gear axes.
    pub user_dims: Vec<i64>,
    /// Its dims under each gear.
    pub per_gear_dims: Vec<Vec<i64>>,
    /// The gear whose shape the root `Data` takes (largest element count, §3.3).
    pub max_gear: usize,
}

/// What the pass needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GearSpec {
    /// `mbatch_dynamic_type` (1 batch, 2 image size, 3 dims).
    pub mode: u32,
    /// The gears in the order written.
    pub gears: Vec<Vec<i64>>,
    /// The gear-controlled inputs, in gear-vector order.
    pub inputs: Vec<GearInput>,
    /// `user_designate_shape_order`: the `--input_shape` names in the order written.
    pub shape_order: Vec<String>,
    /// GetNext sink mode.
    pub getnext_sink: bool,
    /// Gear table layout code (0 gear-major, 1 dim-major padded to 8).
    pub table_layout: u32,
    /// MapIndex engine code (0 AI core, 1 AI CPU).
    pub mapindex_engine: u32,
}

/// The model after the pass: root and branches, plus where things ended up.
#[derive(Debug, Clone)]
pub struct Cloned {
    /// Root graph and the `Batch_i` subgraphs.
    pub model: Model,
    /// For each branch, the seeds for shape inference: branch `Data` nodes standing for root
    /// constants, with the constants' values.
    pub const_inputs: Vec<Vec<(NodeId, Tensor)>>,
    /// Positions of the original NetOutput inputs that are direct outputs (fed by a `Data`).
    pub direct_outputs: Vec<usize>,
}

/// A graph that the pass cannot transform.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GearError(pub String);

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn strs(v: Vec<String>) -> Attr {
    Attr::Strs(v)
}

fn shape_of(dims: &[i64]) -> Vec<super::symbolic::Dim> {
    fixed_shape(dims)
}

/// Runs the pass on `model` (its root graph must have exactly one `NetOutput`).
pub fn multi_batch_clone(model: &Model, spec: &GearSpec) -> Result<Cloned, GearError> {
    let g = &model.graph;
    let outputs = g.of_type("NetOutput");
    let [net_output] = outputs.as_slice() else {
        return Err(GearError(format!(
            "the graph must have exactly one NetOutput, it has {}",
            outputs.len()
        )));
    };
    let mut data_nodes = g.of_type("Data");
    if data_nodes.is_empty() {
        return Err(GearError("the graph has no Data node (input)".into()));
    }
    if spec.getnext_sink {
        // GetNext's outputs are bound to the gear vector positionally (GE's GETNEXT mode), so
        // they come in gear-vector order: the gear inputs as written, then the others.
        data_nodes.sort_by_key(|d| {
            let name = g.node(*d).name.as_str();
            spec.inputs
                .iter()
                .position(|i| i.name == name)
                .unwrap_or(usize::MAX)
        });
    }
    let const_nodes = g.of_type("Const");
    let gear_count = spec.gears.len();
    let gear_len = spec.gears.first().map_or(0, Vec::len);
    let by_name: BTreeMap<&str, &GearInput> =
        spec.inputs.iter().map(|i| (i.name.as_str(), i)).collect();
    for input in &spec.inputs {
        if g.find(&input.name).is_none_or(|id| g.node(id).op != "Data") {
            return Err(GearError(format!(
                "input `{}` of --input_shape is not a Data node of the graph",
                input.name
            )));
        }
    }
    let net = g.node(*net_output);
    // Direct outputs (Data -> NetOutput) bypass the Case; a GetNext output is not a Data, so in
    // sink mode every output goes through the branches.
    let direct_outputs: Vec<usize> = net
        .inputs
        .iter()
        .enumerate()
        .filter(|(_, v)| !spec.getnext_sink && v.is_some_and(|v| g.node(v.node).op == "Data"))
        .map(|(i, _)| i)
        .collect();

    let mut root = Graph::new(g.name.clone());
    // 1. The user inputs: Data nodes at their largest gear, or one GetNext in sink mode.
    let mut root_inputs: Vec<Value> = Vec::new(); // value feeding Case input 1 + k, per original Data
    let mut dynamic_indexes: Vec<i64> = Vec::new();
    let mut getnext = None;
    if spec.getnext_sink {
        let mut outs = Vec::new();
        let mut shapes = Vec::new();
        for &d in &data_nodes {
            let node = g.node(d);
            let mut desc = node.outputs[0].clone();
            if let Some(gi) = by_name.get(node.name.as_str()) {
                desc.shape = shape_of(&gi.per_gear_dims[gi.max_gear]);
            }
            shapes.push(TensorDesc::new(
                DataType::I64,
                fixed_shape(&[desc.shape.len() as i64]),
            ));
            outs.push(desc);
        }
        let d = data_nodes.len();
        outs.extend(shapes);
        let mut n = Node::new(GETNEXT, "GetNext", vec![], outs);
        n.attrs.insert(
            "output_names".into(),
            strs(data_nodes.iter().map(|d| g.node(*d).name.clone()).collect()),
        );
        n.attrs
            .insert("mbatch-inserted-node".into(), Attr::Bool(true));
        let id = root.add(n);
        getnext = Some(id);
        for k in 0..d {
            root_inputs.push(Value {
                node: id,
                output: k as u32,
            });
        }
    } else {
        for (k, &d) in data_nodes.iter().enumerate() {
            let node = g.node(d);
            let mut n = Node::new(node.name.clone(), "Data", vec![], node.outputs.clone());
            n.attrs = node.attrs.clone();
            n.attrs.insert("index".into(), Attr::Int(k as i64));
            if let Some(gi) = by_name.get(node.name.as_str()) {
                n.outputs[0].shape = shape_of(&gi.per_gear_dims[gi.max_gear]);
                let dtype = node.outputs[0].dtype;
                let format = node.outputs[0].format;
                n.attrs
                    .insert("_mbatch_origin_input_dims".into(), ints(&gi.user_dims));
                n.attrs
                    .insert("mbatch-switch-name".into(), Attr::Str(CASE.into()));
                let unknown: Vec<i64> = gi
                    .user_dims
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| **v < 0)
                    .map(|(i, _)| i as i64)
                    .collect();
                n.attrs
                    .insert("_dynamic_batch_unknown_dim_index".into(), ints(&unknown));
                let all: Vec<String> = gi
                    .per_gear_dims
                    .iter()
                    .map(|dims| {
                        let bytes = dims.iter().product::<i64>().max(0) as usize * dtype.size();
                        let joined: Vec<String> = dims.iter().map(i64::to_string).collect();
                        format!(
                            "{}:{}:{}:{bytes}:{}:{}",
                            format.name(),
                            dtype.ge_name(),
                            node.name,
                            dims.len(),
                            joined.join(",")
                        )
                    })
                    .collect();
                n.attrs.insert("_all_origin_gears_inputs".into(), strs(all));
                dynamic_indexes.push(k as i64);
            }
            let id = root.add(n);
            root_inputs.push(Value {
                node: id,
                output: 0,
            });
        }
    }
    // 2. The gear vector: a Data input, or GetDynamicDims over GetNext's shape outputs.
    let gear_vector = if let Some(gn) = getnext {
        let d = data_nodes.len();
        let mut shape_info = Vec::new();
        for &dn in &data_nodes {
            let node = g.node(dn);
            match by_name.get(node.name.as_str()) {
                Some(gi) => {
                    shape_info.push(gi.user_dims.len() as i64);
                    shape_info.extend(&gi.user_dims);
                }
                None => {
                    let dims: Vec<i64> = node.outputs[0]
                        .shape
                        .iter()
                        .map(|x| x.fixed().unwrap_or(-1))
                        .collect();
                    shape_info.push(dims.len() as i64);
                    shape_info.extend(dims);
                }
            }
        }
        let inputs = (0..d)
            .map(|k| {
                Some(Value {
                    node: gn,
                    output: (d + k) as u32,
                })
            })
            .collect();
        let mut n = Node::new(
            GET_DYNAMIC_DIMS,
            "GetDynamicDims",
            inputs,
            vec![TensorDesc::new(
                DataType::I32,
                fixed_shape(&[gear_len as i64]),
            )],
        );
        n.attrs.insert("N".into(), Attr::Int(d as i64));
        n.attrs.insert("shape_info".into(), ints(&shape_info));
        n.attrs
            .insert("mbatch-inserted-node".into(), Attr::Bool(true));
        Value {
            node: root.add(n),
            output: 0,
        }
    } else {
        let mut n = Node::new(
            SHAPE_DATA,
            "Data",
            vec![],
            vec![TensorDesc::new(
                DataType::I32,
                fixed_shape(&[gear_len as i64]),
            )],
        );
        n.attrs
            .insert("index".into(), Attr::Int(data_nodes.len() as i64));
        n.attrs
            .insert("_is_multi_batch_shape_data".into(), Attr::Bool(true));
        n.attrs
            .insert("mbatch-inserted-node".into(), Attr::Bool(true));
        n.attrs.insert(
            "_ge_attr_lowering_func".into(),
            Attr::Str("multi_batch_shape_data".into()),
        );
        n.attrs.insert("_host_tensor".into(), Attr::Bool(true));
        n.attrs.insert(
            "_dynamic_batch_unknown_data_index".into(),
            ints(&dynamic_indexes),
        );
        n.control_inputs = dynamic_indexes
            .iter()
            .map(|k| root_inputs[*k as usize].node)
            .collect();
        Value {
            node: root.add(n),
            output: 0,
        }
    };
    // 3. The gear table, gear-major int32.
    let table: Vec<i32> = spec.gears.iter().flatten().map(|v| *v as i32).collect();
    let mut c = Node::new(SHAPE_CONST, "Const", vec![], vec![]);
    let t = Tensor::from_i32s(vec![table.len() as i64], &table);
    c.outputs = vec![TensorDesc::of(&t)];
    c.attrs.insert("value".into(), Attr::Tensor(t));
    let table_id = root.add(c);
    // 4. MapIndex.
    let mut m = Node::new(
        MAPINDEX,
        "MapIndex",
        vec![
            Some(gear_vector),
            Some(Value {
                node: table_id,
                output: 0,
            }),
        ],
        vec![TensorDesc::new(DataType::I32, vec![])],
    );
    m.attrs.insert(
        "_gear_table_layout".into(),
        Attr::Int(i64::from(spec.table_layout)),
    );
    m.attrs.insert(
        "_mapindex_engine".into(),
        Attr::Int(i64::from(spec.mapindex_engine)),
    );
    m.attrs
        .insert("mbatch-inserted-node".into(), Attr::Bool(true));
    let map_id = root.add(m);
    // 5. The constants move to the root, once.
    let mut root_consts = Vec::new();
    for &cn in &const_nodes {
        let node = g.node(cn).clone();
        root_consts.push(Value {
            node: root.add(node),
            output: 0,
        });
    }
    // 6. The Case.
    let mut case_inputs = vec![Some(Value {
        node: map_id,
        output: 0,
    })];
    case_inputs.extend(root_inputs.iter().map(|v| Some(*v)));
    case_inputs.extend(root_consts.iter().map(|v| Some(*v)));
    let case_outputs = net.inputs.len() - direct_outputs.len();
    let mut case = Node::new(
        CASE,
        "Case",
        case_inputs,
        vec![TensorDesc::new(DataType::F32, vec![]); case_outputs],
    );
    case.attrs
        .insert("_batch_num".into(), Attr::Int(gear_count as i64));
    for (i, gear) in spec.gears.iter().enumerate() {
        case.attrs.insert(format!("_pred_value_{i}"), ints(gear));
    }
    case.attrs.insert(
        "user_designate_shape_order".into(),
        strs(spec.shape_order.clone()),
    );
    case.attrs
        .insert("mbatch-inserted-node".into(), Attr::Bool(true));
    case.attrs.insert(
        "mbatch_dynamic_type".into(),
        Attr::Int(i64::from(spec.mode)),
    );
    case.subgraphs = (0..gear_count).map(|i| format!("Batch_{i}")).collect();
    let case_id = root.add(case);
    root.attrs
        .insert("_enable_dynamic_batch".into(), Attr::Bool(true));
    // 7. NetOutput: Case outputs, direct outputs from the root inputs, the gear vector in sink mode.
    let mut out_inputs = Vec::new();
    let mut k = 0u32;
    for (i, v) in net.inputs.iter().enumerate() {
        if direct_outputs.contains(&i) {
            let d = v.and_then(|v| data_nodes.iter().position(|x| *x == v.node));
            out_inputs.push(d.map(|d| root_inputs[d]));
        } else {
            out_inputs.push(Some(Value {
                node: case_id,
                output: k,
            }));
            k += 1;
        }
    }
    if spec.getnext_sink {
        out_inputs.push(Some(gear_vector));
    }
    let mut no = Node::new(net.name.clone(), "NetOutput", out_inputs, vec![]);
    no.attrs = net.attrs.clone();
    no.control_inputs = vec![case_id];
    if spec.getnext_sink {
        no.attrs
            .insert("getnext_sink_dynamic".into(), Attr::Bool(true));
    }
    root.add(no);

    // The branches.
    let mut subgraphs = Vec::with_capacity(gear_count);
    let mut const_inputs = Vec::with_capacity(gear_count);
    for i in 0..gear_count {
        let (b, seeds) = branch(g, i, &data_nodes, &const_nodes, &direct_outputs, &by_name);
        subgraphs.push(b);
        const_inputs.push(seeds);
    }
    Ok(Cloned {
        model: Model {
            graph: root,
            subgraphs,
            opset: model.opset,
        },
        const_inputs,
        direct_outputs,
    })
}

/// The branch of gear `i`: the original body, renamed and relabelled, with gear i's shapes.
fn branch(
    g: &Graph,
    i: usize,
    data_nodes: &[NodeId],
    const_nodes: &[NodeId],
    direct_outputs: &[usize],
    by_name: &BTreeMap<&str, &GearInput>,
) -> (Graph, Vec<(NodeId, Tensor)>) {
    let suffix = format!("_ascend_mbatch_batch_{i}");
    let label = Attr::Str(format!("Batch_{i}"));
    let mut b = g.clone();
    b.name = format!("Batch_{i}");
    let mut seeds = Vec::new();
    for (id, node) in b.nodes.iter_mut().enumerate() {
        let id = NodeId(id as u32);
        node.name.push_str(&suffix);
        if let Some(pos) = data_nodes.iter().position(|d| *d == id) {
            node.attrs
                .insert("_parent_node_index".into(), Attr::Int(pos as i64 + 1));
            node.attrs.insert("index".into(), Attr::Int(pos as i64));
            let name = g.node(id).name.as_str();
            if let Some(gi) = by_name.get(name) {
                node.outputs[0].shape = shape_of(&gi.per_gear_dims[i]);
                node.attrs
                    .insert("_mbatch_origin_input_dims".into(), ints(&gi.user_dims));
            }
        } else if let Some(pos) = const_nodes.iter().position(|c| *c == id) {
            // Constants become inputs of the branch; their values stay at the root, once.
            if let Some(Attr::Tensor(t)) = node.attrs.remove("value") {
                seeds.push((id, t));
            }
            node.op = "Data".into();
            node.attrs
                .insert("index".into(), Attr::Int((data_nodes.len() + pos) as i64));
            node.attrs.insert(
                "_parent_node_index".into(),
                Attr::Int((data_nodes.len() + pos) as i64 + 1),
            );
        } else if node.op == "NetOutput" {
            let kept: Vec<Option<Value>> = node
                .inputs
                .iter()
                .enumerate()
                .filter(|(k, _)| !direct_outputs.contains(k))
                .map(|(_, v)| *v)
                .collect();
            node.inputs = kept;
            node.attrs.remove("output_names");
            let parents: Vec<i64> = (0..node.inputs.len() as i64).collect();
            node.attrs
                .insert("_parent_node_index".into(), Attr::Ints(parents));
        }
        node.attrs.insert("_batch_label".into(), label.clone());
    }
    (b, seeds)
}

/// Drops the root constants that no branch reads any more (after folding, a branch often
/// needs none of the shape constants it was exported with), with their Case inputs and branch
/// `Data` stand-ins, renumbering `_parent_node_index` / `index`; GE's
/// `SubgraphConstMigrationPass` has the same effect on the weights. Returns how many went.
pub fn prune_unused_constants(model: &mut Model) -> usize {
    let Some(case_id) = model.graph.find(CASE) else {
        return 0;
    };
    let case_inputs = model.graph.node(case_id).inputs.len();
    // Which Case inputs (by parent index) some branch still reads.
    let mut used = vec![false; case_inputs];
    used[0] = true;
    for b in &model.subgraphs {
        let consumers = b.consumers();
        for (i, n) in b.nodes.iter().enumerate() {
            if n.op != "Data" {
                continue;
            }
            let Some(p) = n.int("_parent_node_index") else {
                continue;
            };
            let read = consumers.keys().any(|v| v.node == NodeId(i as u32));
            if let (true, Some(u)) = (read, used.get_mut(p as usize)) {
                *u = true;
            }
        }
    }
    // Inputs that are not constants always stay.
    for (p, u) in used.iter_mut().enumerate() {
        if !is_const_slot(&model.graph, case_id, p as i64) {
            *u = true;
        }
    }
    let dropped = used.iter().filter(|u| !**u).count();
    if dropped == 0 {
        return 0;
    }
    let mut new_index = vec![None; case_inputs];
    let mut k = 0i64;
    for (p, u) in used.iter().enumerate() {
        if *u {
            new_index[p] = Some(k);
            k += 1;
        }
    }
    let case = model.graph.node_mut(case_id);
    case.inputs = case
        .inputs
        .iter()
        .zip(&used)
        .filter(|(_, u)| **u)
        .map(|(v, _)| *v)
        .collect();
    model.graph.remove_dead();
    for b in &mut model.subgraphs {
        let keep: Vec<bool> = b
            .nodes
            .iter()
            .map(
                |n| match n.int("_parent_node_index").filter(|_| n.op == "Data") {
                    Some(p) => new_index.get(p as usize).copied().flatten().is_some(),
                    None => true,
                },
            )
            .collect();
        b.retain(&keep);
        for n in &mut b.nodes {
            if n.op != "Data" {
                continue;
            }
            if let Some(p) = n.int("_parent_node_index")
                && let Some(Some(q)) = new_index.get(p as usize)
            {
                n.attrs.insert("_parent_node_index".into(), Attr::Int(*q));
                n.attrs.insert("index".into(), Attr::Int(*q - 1));
            }
        }
    }
    dropped
}

/// Whether Case input `p` is fed by a root `Const`.
fn is_const_slot(root: &Graph, case_id: NodeId, p: i64) -> bool {
    usize::try_from(p)
        .ok()
        .and_then(|p| root.node(case_id).inputs.get(p).copied().flatten())
        .is_some_and(|v| root.node(v.node).op == "Const")
}

/// GE's output-shape table (`_dynamic_output_dims` on the root NetOutput), as
/// `GetDynamicOutputShape` writes it: first `"<branch>,<i>,<d0>,<d1>,..."` for every Case output
/// i and branch, then, offline (not in sink mode), `"-1,<n>,<dims>"` for each NetOutput input n
/// not fed by the Case whose number is not already a Case output index (GE keys both by number,
/// so a direct output placed before a Case output is shadowed). `branch_dims[j][i]` are the
/// dims of Case output i in branch j.
pub fn output_shape_table(root: &Graph, branch_dims: &[Vec<Vec<i64>>], sink: bool) -> Vec<String> {
    let Some(net) = root.nodes.iter().find(|n| n.op == "NetOutput") else {
        return Vec::new();
    };
    let case = root.find(CASE);
    let case_outputs = case.map_or(0, |c| root.node(c).outputs.len());
    let join = |d: &[i64]| d.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let mut table = Vec::new();
    for i in 0..case_outputs {
        for (j, dims) in branch_dims.iter().enumerate() {
            if let Some(d) = dims.get(i) {
                table.push(format!("{j},{i},{}", join(d)));
            }
        }
    }
    if !sink {
        for (n, v) in net.inputs.iter().enumerate() {
            let Some(v) = v else { continue };
            if Some(v.node) == case || n < case_outputs {
                continue;
            }
            let dims: Vec<i64> = root
                .desc(*v)
                .shape
                .iter()
                .map(|d| d.fixed().unwrap_or(-1))
                .collect();
            table.push(format!("-1,{n},{}", join(&dims)));
        }
    }
    table
}
