//! GatherElements and GatherND with indices known at compile time: which elements of the data
//! each output element copies, computed once for folding, the evaluator and the lowering (a
//! row gather by a constant table). Exporters emit both for masks and position buffers whose
//! indices are shape computations, so they fold or become constant per gear; with indices
//! computed at run time the gather runs on the AI CPU, with the same index code
//! (`isa::aicpu_op::gather_elements_rows` and `gather_nd_rows`).

use gearsim_isa::aicpu_op::{IndexOutOfRange, gather_elements_rows, gather_nd_rows};

use super::super::infer::{OpCtx, OpDef, OpError};
use super::super::ir::{Tensor, TensorDesc, shape_values};
use super::super::symbolic::Dim;
use super::{INDEX, Src, attr_int, input_of, known, norm_axis, shape_str};

/// The definitions.
pub(super) fn defs() -> Vec<OpDef> {
    let def = |op, verify, infer, fold| OpDef {
        op,
        min_inputs: 2,
        max_inputs: 2,
        verify,
        infer,
        fold: Some(fold),
        // The index table is compiled into the kernel.
        static_inputs: &[1],
    };
    vec![
        def(
            "GatherElements",
            |ctx| infer_gather_nd(ctx).map(|_| ()),
            infer_gather_nd,
            fold_gather_nd,
        ),
        def(
            "GatherND",
            |ctx| infer_gather_nd(ctx).map(|_| ()),
            infer_gather_nd,
            fold_gather_nd,
        ),
    ]
}

/// What a gather copies: output element `p` is data element `map[p]`; the output dims; and
/// the length of the runs the map moves whole (`row` consecutive elements, for GatherND's
/// slices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherMap {
    /// Output dims.
    pub dims: Vec<i64>,
    /// Per output row, the data row it copies (rows of `row` elements).
    pub rows: Vec<usize>,
    /// Elements per row.
    pub row: usize,
}

fn bad_index(e: IndexOutOfRange) -> OpError {
    OpError::input(
        1,
        format!("indices in [-{}, {}] {}", e.len, e.len - 1, e.at),
        e.value.to_string(),
        "fix the indices",
    )
}

/// The map of a GatherElements or GatherND node whose data dims and indices are known.
pub fn gather_map(ctx: &OpCtx<'_>) -> Result<Option<GatherMap>, OpError> {
    let x = ctx.input(0)?;
    let i = input_of(ctx, 1, INDEX, "int32 or int64 indices")?;
    let r = x.shape.len();
    if r == 0 {
        return Err(OpError::input(
            0,
            "a tensor of rank 1 or more",
            "a scalar",
            "give a tensor",
        ));
    }
    let (Some(dd), Some(id)) = (shape_values(&x.shape), shape_values(&i.shape)) else {
        return Ok(None);
    };
    let Some(idx) = ctx.values.get(1).copied().flatten() else {
        return Ok(None);
    };
    let iv = idx.to_i64s();
    if ctx.node.op == "GatherElements" {
        let axis = norm_axis(Src::Attr("axis"), attr_int(ctx, "axis", 0)?, r)?;
        if id.len() != r || (0..r).any(|a| a != axis && id[a] > dd[a]) {
            return Err(OpError::input(
                1,
                format!("indices of rank {r} no larger than the data off the axis"),
                format!("{id:?} for data {dd:?}"),
                "give indices shaped like the data",
            ));
        }
        let rows = gather_elements_rows(&dd, &id, axis, &iv).map_err(bad_index)?;
        return Ok(Some(GatherMap {
            dims: id,
            rows,
            row: 1,
        }));
    }
    let b = attr_int(ctx, "batch_dims", 0)?;
    let q = id.len();
    let k = id.last().copied().unwrap_or(0);
    if q == 0 || b < 0 || b as usize >= q || (b as usize) + (k as usize) > r || k < 1 {
        return Err(OpError::input(
            1,
            format!("indices [..., k] with batch_dims {b} + k <= the data's rank {r}"),
            format!("{id:?}"),
            "give indices whose last dim counts the data's indexed leading dims",
        ));
    }
    let (b, k) = (b as usize, k as usize);
    if id[..b] != dd[..b] {
        return Err(OpError::input(
            1,
            format!("batch dims {:?} like the data's", &dd[..b]),
            format!("{:?}", &id[..b]),
            "the first batch_dims dims of data and indices must agree",
        ));
    }
    let (rows, row) = gather_nd_rows(&dd, &id, b, &iv).map_err(bad_index)?;
    let mut dims = id[..q - 1].to_vec();
    dims.extend(&dd[b + k..]);
    Ok(Some(GatherMap { dims, rows, row }))
}

/// The output shape, which needs no index value: GatherElements' is the indices' shape,
/// GatherND's the indices' leading dims and the data's dims past the indexed ones.
fn infer_gather_nd(ctx: &OpCtx<'_>) -> Result<Vec<TensorDesc>, OpError> {
    let x = ctx.input(0)?;
    let i = input_of(ctx, 1, INDEX, "int32 or int64 indices")?;
    if let Some(m) = gather_map(ctx)? {
        return Ok(vec![TensorDesc::new(
            x.dtype,
            m.dims.iter().map(|d| Dim::Fixed(*d)).collect(),
        )]);
    }
    if ctx.node.op == "GatherElements" {
        if i.shape.len() != x.shape.len() {
            return Err(OpError::input(
                1,
                format!("indices of the data's rank {}", x.shape.len()),
                shape_str(&i.shape),
                "give indices shaped like the data",
            ));
        }
        return Ok(vec![TensorDesc::new(x.dtype, i.shape.clone())]);
    }
    let b = attr_int(ctx, "batch_dims", 0)?.max(0) as usize;
    let k = i.shape.last().and_then(Dim::fixed).ok_or_else(|| {
        OpError::input(
            1,
            "indices whose last dim is static",
            shape_str(&i.shape),
            "fix the indices' last dim",
        )
    })? as usize;
    if i.shape.len() <= b || b + k > x.shape.len() || k == 0 {
        return Err(OpError::input(
            1,
            format!("indices [..., k] with batch_dims {b} + k <= the data's rank"),
            shape_str(&i.shape),
            "give indices whose last dim counts the data's indexed leading dims",
        ));
    }
    let mut shape = i.shape[..i.shape.len() - 1].to_vec();
    shape.extend(x.shape[b + k..].iter().cloned());
    Ok(vec![TensorDesc::new(x.dtype, shape)])
}

fn fold_gather_nd(ctx: &OpCtx<'_>) -> Result<Vec<Tensor>, OpError> {
    let Some(t) = known(ctx, 0) else {
        return Ok(vec![]);
    };
    let Some(m) = gather_map(ctx)? else {
        return Ok(vec![]);
    };
    if !super::values::foldable(&m.dims) {
        return Ok(vec![]);
    }
    Ok(vec![take_rows(t, &m)])
}

/// The gathered tensor on the host.
pub fn take_rows(t: &Tensor, m: &GatherMap) -> Tensor {
    let e = t.dtype.size() * m.row;
    let mut b = Vec::with_capacity(m.rows.len() * e);
    for r in &m.rows {
        b.extend_from_slice(&t.data[r * e..(r + 1) * e]);
    }
    Tensor {
        dtype: t.dtype,
        dims: m.dims.clone(),
        data: std::sync::Arc::new(b),
    }
}
