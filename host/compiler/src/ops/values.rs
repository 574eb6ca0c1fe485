//! Compile-time tensor values for folding: typed element access that keeps dtypes exact
//! (integers wrap to their width, floats round once to their type), index maps for
//! broadcasting, slicing and transposing, and byte-level gathers that work for every dtype.

use super::super::infer::OpError;
use super::super::ir::{DataType, Tensor};
use super::node_err;
use gearsim_isa::numeric::{self, CastMode, Scalar};

/// Largest number of elements a fold computes; bigger results stay run-time values.
pub(super) const FOLD_LIMIT: usize = 1 << 22;

/// Elements of a tensor as the widest type of their kind.
pub(super) enum Elems {
    /// Integers and bools.
    Int(Vec<i64>),
    /// Floats.
    Float(Vec<f64>),
}

/// The elements of a tensor.
pub(super) fn elems(t: &Tensor) -> Elems {
    if t.dtype.is_float() {
        Elems::Float(t.to_f64s())
    } else {
        Elems::Int(t.to_i64s())
    }
}

/// An internal inconsistency found while folding (it means a bug, not a bad model).
fn internal(e: String) -> OpError {
    node_err(
        "a consistent folded value",
        e,
        "report this as a gearsim bug with the model",
    )
}

/// Element count of fixed dims, `None` on a negative dim or overflow. The product is taken
/// left to right in i64, as `Tensor::new` takes it, so a count that is `Some` never overflows
/// there either.
pub(super) fn count(dims: &[i64]) -> Option<usize> {
    let n = dims.iter().try_fold(
        1i64,
        |acc, d| {
            if *d < 0 { None } else { acc.checked_mul(*d) }
        },
    )?;
    usize::try_from(n).ok()
}

/// Whether a result of these dims is small enough to fold.
pub(super) fn foldable(dims: &[i64]) -> bool {
    count(dims).is_some_and(|n| n <= FOLD_LIMIT)
}

/// Encodes integers as `dtype` (wrapping to the type's width; bools are `v != 0`; integers
/// convert to floats with one rounding).
pub(super) fn from_ints(dtype: DataType, dims: Vec<i64>, v: &[i64]) -> Result<Tensor, OpError> {
    from_scalars(dtype, dims, v.iter().map(|x| Scalar::Int(i128::from(*x))))
}

/// Encodes floats as `dtype` (one rounding to a float type; truncation toward zero, saturating,
/// to an integer type; bools are `v != 0`).
pub(super) fn from_floats(dtype: DataType, dims: Vec<i64>, v: &[f64]) -> Result<Tensor, OpError> {
    from_scalars(dtype, dims, v.iter().map(|x| Scalar::Float(*x)))
}

/// Encodes values with [`numeric::encode`]'s conversions (float8 not saturating).
fn from_scalars(
    dtype: DataType,
    dims: Vec<i64>,
    v: impl ExactSizeIterator<Item = Scalar>,
) -> Result<Tensor, OpError> {
    let mode = CastMode {
        saturate: false,
        ..CastMode::default()
    };
    let mut b = Vec::with_capacity(v.len() * dtype.size());
    v.for_each(|x| numeric::encode(dtype, x, mode, &mut b));
    Tensor::new(dtype, dims, b).map_err(internal)
}

/// A tensor of `dims` whose element `k` is element `index[k]` of `src` (any dtype).
pub(super) fn gather(src: &Tensor, dims: Vec<i64>, index: &[usize]) -> Result<Tensor, OpError> {
    let size = src.dtype.size();
    let mut b = Vec::with_capacity(index.len() * size);
    for i in index {
        let chunk = src
            .data
            .get(i * size..(i + 1) * size)
            .ok_or_else(|| internal(format!("element {i} of a {}-element tensor", src.len())))?;
        b.extend_from_slice(chunk);
    }
    Tensor::new(src.dtype, dims, b).map_err(internal)
}

/// Row-major strides of fixed dims.
pub(super) fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        s[k] = s[k + 1].saturating_mul(dims[k + 1].max(0));
    }
    s
}

/// For every element of an output of `dims` (row-major), the flat index `base + Σ i_k * step_k`
/// into a source tensor. Steps may be zero (broadcast) or negative (reversed slices).
pub(super) fn affine_index(dims: &[i64], base: i64, steps: &[i64]) -> Result<Vec<usize>, OpError> {
    let n = count(dims).ok_or_else(|| internal(format!("a valid shape, got {dims:?}")))?;
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Ok(out);
    }
    let mut idx = vec![0i64; dims.len()];
    let mut cur = base;
    // Stepping past the end of an axis may leave the index range (a huge slice step) before
    // the step is taken back; wrapping arithmetic makes that harmless, and every index that
    // is pushed is exact.
    for _ in 0..n {
        out.push(usize::try_from(cur).map_err(|_| internal(format!("index {cur}")))?);
        for k in (0..dims.len()).rev() {
            let step = steps.get(k).copied().unwrap_or(0);
            idx[k] += 1;
            cur = cur.wrapping_add(step);
            if idx[k] < dims[k] {
                break;
            }
            cur = cur.wrapping_sub(step.wrapping_mul(dims[k]));
            idx[k] = 0;
        }
    }
    Ok(out)
}

/// The numpy broadcast of fixed shapes, `None` when they do not broadcast.
pub(super) fn broadcast_dims(shapes: &[&[i64]]) -> Option<Vec<i64>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1i64; rank];
    for s in shapes {
        for (k, d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + k];
            if *o == 1 {
                *o = *d;
            } else if *d != 1 && *d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// For every element of the broadcast output `out`, the flat index into a source of `dims`.
pub(super) fn broadcast_index(out: &[i64], dims: &[i64]) -> Result<Vec<usize>, OpError> {
    let src = strides(dims);
    let lead = out.len().saturating_sub(dims.len());
    let steps: Vec<i64> = (0..out.len())
        .map(|k| {
            if k < lead || dims[k - lead] == 1 {
                0
            } else {
                src[k - lead]
            }
        })
        .collect();
    affine_index(out, 0, &steps)
}
