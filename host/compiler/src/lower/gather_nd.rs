//! GatherElements and GatherND by constant indices: the data viewed as rows (GatherND's slices,
//! or single elements for GatherElements) gathered by a constant row table with the Gather
//! kernel ([`crate::ops::GatherMap`]); by indices computed at run time, on the AI CPU.

use gearsim_isa::aicpu_op::{AiCpuOp, Operand as AiOperand};

use super::cube::Build;
use super::{LowerCtx, LowerError, Lowered, Operand, Step, compose};
use crate::ir::{Attr, DataType, TensorDesc, fixed_shape};

/// Indices computed at run time: the gather runs on the AI CPU, which reads them (GE's AI
/// core gathers take run-time indices too, but the vector unit here has no indexed load).
fn on_aicpu(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let (x, i, out) = (ctx.input(0)?, ctx.input(1)?, ctx.outputs.first());
    let out = out.ok_or_else(|| ctx.error("the node has no output"))?;
    let operand = |d: &TensorDesc| -> Result<AiOperand, LowerError> {
        Ok(AiOperand {
            dtype: d.dtype,
            dims: super::cube::dims_of(ctx, d)?
                .iter()
                .map(|v| *v as i64)
                .collect(),
        })
    };
    let (data, indices, output) = (operand(x)?, operand(i)?, operand(out)?);
    let nd = ctx.node.op == "GatherND";
    let attr = if nd {
        ctx.node.int("batch_dims").unwrap_or(0)
    } else {
        let axis = ctx.node.int("axis").unwrap_or(0);
        if axis < 0 {
            axis + data.dims.len() as i64
        } else {
            axis
        }
    };
    let sizes = [x, i].map(|d| d.bytes().unwrap_or(0));
    let op = AiCpuOp::Gather {
        nd,
        attr,
        data,
        indices,
        output,
    };
    op.check(&sizes, &[out.bytes().unwrap_or(0)])
        .map_err(|e| ctx.error(e))?;
    Ok(Lowered::AiCpu { op })
}

/// The GatherElements and GatherND lowering.
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let op = ctx.op_ctx();
    let Some(m) = crate::ops::gather_map(&op).map_err(|e| ctx.op_error(e))? else {
        return on_aicpu(ctx);
    };
    let total = super::cube::dims_of(ctx, x)?.iter().product::<u64>() as i64;
    let row = m.row as i64;
    if m.rows.is_empty() || row == 0 {
        return Ok(Build::default().finish());
    }
    let mut b = Build::default();
    let table: Vec<u8> = m
        .rows
        .iter()
        .flat_map(|r| (*r as i32).to_le_bytes())
        .collect();
    let table = b.derive(DataType::I32, table);
    let j = m.rows.len() as i64;
    let desc = |dtype, dims: &[i64]| TensorDesc::new(dtype, fixed_shape(dims));
    compose(
        ctx,
        &mut b,
        &Step {
            op: "Gather",
            attrs: &[("axis", Attr::Int(0))],
            ins: &[
                desc(x.dtype, &[total / row, row]),
                desc(DataType::I32, &[j]),
            ],
            values: &[],
            out: desc(x.dtype, &[j, row]),
            from: &[Operand::Input(0), table],
            to: Operand::Output(0),
        },
        &ctx.node.op,
    )?;
    Ok(b.finish())
}
