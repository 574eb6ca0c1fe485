//! GatherElements and GatherND by constant indices: the data viewed as rows (GatherND's slices,
//! or single elements for GatherElements) gathered by a constant row table with the Gather
//! kernel ([`crate::ops::GatherMap`]).

use super::cube::Build;
use super::{LowerCtx, LowerError, Lowered, Operand, Step, compose};
use crate::ir::{Attr, DataType, TensorDesc, fixed_shape};

/// The GatherElements and GatherND lowering.
pub fn lower(ctx: &LowerCtx<'_>) -> Result<Lowered, LowerError> {
    let x = ctx.input(0)?;
    let op = ctx.op_ctx();
    let m = crate::ops::gather_map(&op)
        .map_err(|e| ctx.op_error(e))?
        .ok_or_else(|| {
            ctx.error("the indices are computed at run time (the kernel is compiled for constant indices)")
        })?;
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
