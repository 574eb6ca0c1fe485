//! Movement kernels (Transpose, Concat, Slice, Gather, Expand) run on the simulated chip and
//! match references computed here byte for byte, on random data of several element types and
//! odd shapes (tails in every tiled axis, unit axes, empty inputs).

use gearsim_compiler::ir::{Attr, DataType, Tensor};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::device_run::{Ran, constant, data, run_op};

/// Random element bytes (booleans are 0 or 1).
fn rand_tensor(dt: DataType, dims: &[i64], seed: u64) -> Tensor {
    let n: i64 = dims.iter().product();
    let mut rng = StdRng::seed_from_u64(seed);
    let bytes: Vec<u8> = (0..n as usize * dt.size())
        .map(|_| {
            if dt == DataType::Bool {
                rng.random_range(0..2u8)
            } else {
                rng.random_range(0..=255u8)
            }
        })
        .collect();
    Tensor::new(dt, dims.to_vec(), bytes).unwrap()
}

fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The multi-index of flat position `i` in `dims`.
fn unravel(mut i: i64, dims: &[i64]) -> Vec<i64> {
    let mut idx = vec![0i64; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = i % dims[a];
        i /= dims[a];
    }
    idx
}

/// A tensor of shape `dims` whose element at each multi-index is `src`'s element at the flat
/// position `at(index)`.
fn build(src: &Tensor, dims: &[i64], at: impl Fn(&[i64]) -> i64) -> Tensor {
    let e = src.dtype.size();
    let n: i64 = dims.iter().product();
    let mut out = Vec::with_capacity(n as usize * e);
    for i in 0..n {
        let p = at(&unravel(i, dims)) as usize;
        out.extend_from_slice(&src.data[p * e..(p + 1) * e]);
    }
    Tensor::new(src.dtype, dims.to_vec(), out).unwrap()
}

fn assert_same(got: &Tensor, want: &Tensor, what: &str) {
    assert_eq!(got.dims, want.dims, "{what}: dims");
    assert_eq!(got.dtype, want.dtype, "{what}: dtype");
    if got.data != want.data {
        let e = want.dtype.size();
        let i = got
            .data
            .chunks(e)
            .zip(want.data.chunks(e))
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "{what}: element {i} of {} (index {:?}) is {:?}, expected {:?}",
            want.len(),
            unravel(i as i64, &want.dims),
            &got.data[i * e..(i + 1) * e],
            &want.data[i * e..(i + 1) * e]
        );
    }
}

fn run1(op: &str, attrs: &[(&str, Attr)], inputs: Vec<gearsim_host::oprun::In>) -> Ran {
    run_op(op, attrs, inputs).unwrap_or_else(|e| panic!("{op}: {e}"))
}

fn transpose_ref(x: &Tensor, perm: &[usize]) -> Tensor {
    let out: Vec<i64> = perm.iter().map(|&p| x.dims[p]).collect();
    let s = strides(&x.dims);
    build(x, &out, |o| {
        perm.iter().enumerate().map(|(j, &p)| o[j] * s[p]).sum()
    })
}

fn check_transpose(dt: DataType, dims: &[i64], perm: &[usize], seed: u64) -> Ran {
    let x = rand_tensor(dt, dims, seed);
    let p: Vec<i64> = perm.iter().map(|&v| v as i64).collect();
    let r = run1(
        "Transpose",
        &[("perm", Attr::Ints(p))],
        vec![data(x.clone())],
    );
    assert_same(
        &r.outputs[0],
        &transpose_ref(&x, perm),
        &format!("Transpose {} {dims:?} perm {perm:?}", dt.name()),
    );
    r
}

/// Every permutation of `0..n`.
fn perms(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for p in perms(n - 1) {
        for pos in 0..=p.len() {
            let mut q = p.clone();
            q.insert(pos, n - 1);
            out.push(q);
        }
    }
    out
}

/// Kernel time in cycles of the 1 GHz chip and effective bandwidth (bytes read + written per
/// second) of a run.
fn timing(r: &Ran, bytes: u64) -> (f64, f64) {
    let ps: u64 = r.launches.iter().map(|l| l.end.0 - l.first_start.0).sum();
    let s = ps as f64 * 1e-12;
    (ps as f64 / 1000.0, bytes as f64 / s / 1e9)
}

#[test]
fn transpose_every_perm_of_rank_3_and_4() {
    for (i, p) in perms(3).iter().enumerate() {
        check_transpose(DataType::F32, &[5, 7, 9], p, i as u64);
    }
    for (i, p) in perms(4).iter().enumerate() {
        check_transpose(DataType::F32, &[3, 5, 2, 7], p, 100 + i as u64);
    }
}

#[test]
fn transpose_of_every_element_size() {
    for (i, dt) in [
        DataType::F16,
        DataType::I64,
        DataType::Bool,
        DataType::U8,
        DataType::I32,
    ]
    .into_iter()
    .enumerate()
    {
        let s = 10 * i as u64;
        check_transpose(dt, &[37, 53], &[1, 0], s);
        check_transpose(dt, &[3, 19, 45], &[0, 2, 1], s + 1);
        check_transpose(dt, &[2, 5, 3, 6], &[0, 2, 3, 1], s + 2);
        check_transpose(dt, &[4, 6, 5, 3], &[0, 2, 1, 3], s + 3);
    }
}

#[test]
fn transpose_tiles_with_tails_in_both_axes() {
    // Several tiles per axis plus a remainder, on each element size.
    check_transpose(DataType::F32, &[300, 270], &[1, 0], 1);
    check_transpose(DataType::F16, &[2, 300, 150], &[0, 2, 1], 2);
    // f16 tiles of many vtranspose repeats and row groups, and a column tail: NCHW planes of
    // 2000 pixels into 40-channel rows.
    check_transpose(DataType::F16, &[3, 40, 2000], &[0, 2, 1], 5);
    check_transpose(DataType::I64, &[130, 70], &[1, 0], 3);
    check_transpose(DataType::U8, &[70, 600], &[1, 0], 4);
    // Short kept runs transpose as wider elements: 2 x f32 = 8 bytes, 2 x u8 = 2 bytes.
    check_transpose(DataType::F32, &[40, 50, 2], &[1, 0, 2], 5);
    check_transpose(DataType::U8, &[40, 50, 2], &[1, 0, 2], 6);
    // A kept run of 12 bytes moves as bursts.
    check_transpose(DataType::F32, &[20, 30, 3], &[1, 0, 2], 7);
}

#[test]
fn transpose_moving_only_unit_axes_is_an_alias() {
    let r = check_transpose(DataType::F32, &[1, 6, 1, 7], &[2, 1, 0, 3], 1);
    assert!(r.kernels.is_empty());
    let r = check_transpose(DataType::F32, &[5, 1, 4], &[1, 0, 2], 2);
    assert!(r.kernels.is_empty());
}

#[test]
fn transformer_transposes_are_fast() {
    // [B, S, H, D] -> [B, H, S, D]: the innermost axis stays, 256-byte runs.
    let r = check_transpose(DataType::F32, &[8, 128, 12, 64], &[0, 2, 1, 3], 1);
    let bytes = 2 * 8 * 128 * 12 * 64 * 4;
    let (cycles, gbs) = timing(&r, bytes);
    eprintln!("Transpose f32 [8,128,12,64] perm [0,2,1,3]: {cycles:.0} cycles, {gbs:.0} GB/s");
    assert!(gbs > 500.0, "[0,2,1,3] at {gbs:.0} GB/s");
    // A matrix transpose through UB tiles.
    let r = check_transpose(DataType::F32, &[1024, 1024], &[1, 0], 2);
    let (cycles, gbs) = timing(&r, 2 * 1024 * 1024 * 4);
    eprintln!("Transpose f32 [1024,1024] perm [1,0]: {cycles:.0} cycles, {gbs:.0} GB/s");
    assert!(gbs > 300.0, "[1,0] at {gbs:.0} GB/s");
    // K^T of attention ([B, H, S, D] -> [B, H, D, S]) and [B, S, H, D] -> [B, H, D, S], f16.
    for (dims, perm) in [
        ([8, 12, 128, 64], [0, 1, 3, 2]),
        ([8, 128, 12, 64], [0, 2, 3, 1]),
    ] {
        let r = check_transpose(DataType::F16, &dims, &perm, 3);
        let (cycles, gbs) = timing(&r, 2 * 8 * 128 * 12 * 64 * 2);
        eprintln!("Transpose f16 {dims:?} perm {perm:?}: {cycles:.0} cycles, {gbs:.0} GB/s");
        assert!(gbs > 250.0, "{perm:?} at {gbs:.0} GB/s");
    }
    // Few rows per matrix (NCHW -> NHWC with 3 channels): matrices stack in one tile.
    let r = check_transpose(DataType::F32, &[8, 3, 64, 64], &[0, 2, 3, 1], 4);
    let (cycles, gbs) = timing(&r, 2 * 8 * 3 * 64 * 64 * 4);
    eprintln!("Transpose f32 [8,3,64,64] perm [0,2,3,1]: {cycles:.0} cycles, {gbs:.0} GB/s");
    assert!(gbs > 100.0, "NCHW -> NHWC at {gbs:.0} GB/s");
}

fn concat_ref(xs: &[Tensor], axis: usize) -> Tensor {
    let mut dims = xs[0].dims.clone();
    dims[axis] = xs.iter().map(|x| x.dims[axis]).sum();
    let e = xs[0].dtype.size();
    let outer: i64 = dims[..axis].iter().product();
    let mut out = Vec::new();
    for o in 0..outer as usize {
        for x in xs {
            let run = x.dims[axis..].iter().product::<i64>() as usize * e;
            out.extend_from_slice(&x.data[o * run..(o + 1) * run]);
        }
    }
    Tensor::new(xs[0].dtype, dims, out).unwrap()
}

#[test]
fn concat_on_every_axis_with_empty_inputs() {
    for (i, dt) in [DataType::F32, DataType::F16, DataType::I64, DataType::Bool]
        .into_iter()
        .enumerate()
    {
        for axis in 0..3usize {
            let s = 100 * i as u64 + 10 * axis as u64;
            let shape = |n: i64| {
                let mut d = vec![3i64, 5, 7];
                d[axis] = n;
                d
            };
            let xs = vec![
                rand_tensor(dt, &shape(2), s),
                rand_tensor(dt, &shape(0), s + 1),
                rand_tensor(dt, &shape(9), s + 2),
                rand_tensor(dt, &shape(1), s + 3),
            ];
            // Negative axes count from the end.
            let a = if axis == 2 { -1 } else { axis as i64 };
            let r = run1(
                "Concat",
                &[("axis", Attr::Int(a))],
                xs.iter().map(|x| data(x.clone())).collect(),
            );
            assert_same(
                &r.outputs[0],
                &concat_ref(&xs, axis),
                &format!("Concat {} axis {axis}", dt.name()),
            );
        }
    }
}

#[test]
fn concat_of_large_blocks_and_many_inputs() {
    // Runs larger than a tile (split into pieces) and a dozen inputs in one kernel.
    let xs = vec![
        rand_tensor(DataType::F32, &[2, 70_000], 1),
        rand_tensor(DataType::F32, &[2, 33], 2),
    ];
    let r = run1(
        "Concat",
        &[("axis", Attr::Int(1))],
        xs.iter().map(|x| data(x.clone())).collect(),
    );
    assert_same(&r.outputs[0], &concat_ref(&xs, 1), "Concat large runs");
    assert_eq!(r.kernels.len(), 1);
    let xs: Vec<Tensor> = (0..12)
        .map(|i| rand_tensor(DataType::F16, &[4, 1 + i, 6], 50 + i as u64))
        .collect();
    let r = run1(
        "Concat",
        &[("axis", Attr::Int(1))],
        xs.iter().map(|x| data(x.clone())).collect(),
    );
    assert_same(&r.outputs[0], &concat_ref(&xs, 1), "Concat 12 inputs");
}

/// `(start, len, step)` of each axis of a slice, clamped as ONNX says.
fn slice_ref(x: &Tensor, bounds: &[(usize, i64, i64, i64)]) -> Tensor {
    let r = x.dims.len();
    let mut start = vec![0i64; r];
    let mut step = vec![1i64; r];
    let mut len = x.dims.clone();
    for &(a, s, e, st) in bounds {
        let d = x.dims[a];
        let norm = |v: i64| if v < 0 { v + d } else { v };
        let (s, n) = if st > 0 {
            let s = norm(s).clamp(0, d);
            let e = norm(e).clamp(0, d);
            (s, ((e - s).max(0) + st - 1) / st)
        } else {
            let s = norm(s).clamp(0, d - 1);
            let e = norm(e).clamp(-1, d - 1);
            (s, ((s - e).max(0) - st - 1) / -st)
        };
        start[a] = s;
        step[a] = st;
        len[a] = n;
    }
    let sx = strides(&x.dims);
    build(x, &len, |o| {
        (0..r).map(|a| (start[a] + o[a] * step[a]) * sx[a]).sum()
    })
}

fn check_slice(dt: DataType, dims: &[i64], bounds: &[(usize, i64, i64, i64)], seed: u64) -> Ran {
    let x = rand_tensor(dt, dims, seed);
    let col = |f: fn(&(usize, i64, i64, i64)) -> i64| {
        let v: Vec<i64> = bounds.iter().map(f).collect();
        constant(Tensor::from_i64s(vec![v.len() as i64], &v))
    };
    let inputs = vec![
        data(x.clone()),
        col(|b| b.1),
        col(|b| b.2),
        col(|b| b.0 as i64),
        col(|b| b.3),
    ];
    let r = run1("Slice", &[], inputs);
    assert_same(
        &r.outputs[0],
        &slice_ref(&x, bounds),
        &format!("Slice {} {dims:?} {bounds:?}", dt.name()),
    );
    r
}

/// A Slice case: the input dims and its (axis, start, end, step) per sliced axis.
type SliceCase = (Vec<i64>, Vec<(usize, i64, i64, i64)>);

#[test]
fn slice_with_steps_negative_steps_and_clamped_bounds() {
    // (dims, [(axis, start, end, step)]).
    let cases: Vec<SliceCase> = vec![
        (vec![10, 20], vec![(1, 3, 17, 1)]),
        (vec![10, 20], vec![(0, -7, 100, 1), (1, -100, -2, 1)]),
        (vec![9, 11, 13], vec![(1, 1, 10, 2), (2, 0, 13, 3)]),
        (vec![9, 11, 13], vec![(0, 8, -100, -1)]),
        (vec![9, 11, 13], vec![(2, 100, 0, -1)]),
        (vec![9, 11, 13], vec![(1, -1, 0, -3), (2, 12, 1, -2)]),
        (
            vec![4, 5, 6, 7],
            vec![(3, 1, 6, 2), (1, 4, -6, -1), (0, 1, 3, 1)],
        ),
        (vec![300, 33], vec![(0, 299, -301, -1)]),
        (vec![6, 40_000], vec![(1, 1, 39_999, 1)]),
    ];
    for (i, dt) in [DataType::F32, DataType::F16, DataType::I64, DataType::Bool]
        .into_iter()
        .enumerate()
    {
        for (j, (dims, b)) in cases.iter().enumerate() {
            check_slice(dt, dims, b, (i * 100 + j) as u64);
        }
    }
}

/// Steps through the last axis (a strided convolution's subsampling) run the row-gather
/// kernel: rows loaded whole, every `sw`-th element packed by `vgather`. Tasks cross planes
/// where the rows stay evenly spaced (`H = sh · Ho`) and stay in one plane otherwise; rows
/// longer than a repeat, offsets, rank 1 and both element sizes.
#[test]
fn slices_stepping_through_the_last_axis_gather_rows() {
    let cases: Vec<SliceCase> = vec![
        (vec![3, 4, 8, 10], vec![(2, 0, 8, 2), (3, 0, 10, 2)]),
        (vec![2, 3, 57, 57], vec![(2, 0, 57, 2), (3, 0, 57, 2)]),
        (vec![2, 5, 7, 300], vec![(2, 1, 7, 3), (3, 1, 299, 2)]),
        (vec![6, 41], vec![(1, 2, 40, 4)]),
        (vec![100], vec![(0, 1, 100, 3)]),
        (vec![2, 16, 14, 14], vec![(2, 0, 14, 2), (3, 1, 14, 2)]),
    ];
    for (i, dt) in [DataType::F16, DataType::F32, DataType::I32]
        .into_iter()
        .enumerate()
    {
        for (j, (dims, b)) in cases.iter().enumerate() {
            let r = check_slice(dt, dims, b, (i * 100 + j + 50) as u64);
            let gathered = r
                .kernels
                .iter()
                .any(|k| k.tiling.iter().any(|(n, _)| n == "rows_per_task"));
            assert!(gathered, "{} {dims:?} {b:?} ran the copy engine", dt.name());
        }
    }
}

#[test]
fn slice_taking_everything_is_an_alias_and_empty_slices_have_no_kernel() {
    let x = rand_tensor(DataType::F32, &[4, 5], 1);
    let r = run1(
        "Slice",
        &[],
        vec![
            data(x.clone()),
            constant(Tensor::from_i64s(vec![1], &[0])),
            constant(Tensor::from_i64s(vec![1], &[i64::MAX])),
        ],
    );
    assert!(r.kernels.is_empty());
    assert_same(&r.outputs[0], &x, "Slice [0, max)");
    check_slice(DataType::F32, &[4, 5], &[(1, 3, 3, 1)], 2);
}

fn gather_ref(x: &Tensor, idx: &[i64], idims: &[i64], axis: usize) -> Tensor {
    let d = x.dims[axis];
    let mut dims = x.dims[..axis].to_vec();
    dims.extend(idims);
    dims.extend(&x.dims[axis + 1..]);
    let sx = strides(&x.dims);
    let k = idims.len();
    let ist = strides(idims);
    build(x, &dims, |o| {
        let flat: i64 = (0..k).map(|t| o[axis + t] * ist[t]).sum();
        // Negative indices count from the end; others outside the axis clamp (gearsim's
        // documented choice for what ONNX leaves undefined).
        let mut i = idx[flat as usize];
        if i < 0 {
            i += d;
        }
        let i = i.clamp(0, d - 1);
        let mut p = i * sx[axis];
        for a in 0..axis {
            p += o[a] * sx[a];
        }
        for a in axis + 1..x.dims.len() {
            p += o[a + k - 1] * sx[a];
        }
        p
    })
}

#[allow(clippy::too_many_arguments)] // one argument per property the cases vary
fn check_gather(
    dt: DataType,
    dims: &[i64],
    axis: usize,
    idx: &[i64],
    idims: &[i64],
    i32_indices: bool,
    constant_indices: bool,
    seed: u64,
) {
    let x = rand_tensor(dt, dims, seed);
    let it = if i32_indices {
        let v: Vec<i32> = idx.iter().map(|&v| v as i32).collect();
        Tensor::from_i32s(idims.to_vec(), &v)
    } else {
        Tensor::from_i64s(idims.to_vec(), idx)
    };
    let ii = if constant_indices {
        constant(it)
    } else {
        data(it)
    };
    let r = run1(
        "Gather",
        &[("axis", Attr::Int(axis as i64))],
        vec![data(x.clone()), ii],
    );
    assert_same(
        &r.outputs[0],
        &gather_ref(&x, idx, idims, axis),
        &format!(
            "Gather {} {dims:?} axis {axis} indices {idims:?}",
            dt.name()
        ),
    );
}

#[test]
fn gather_on_the_first_and_a_middle_axis() {
    let mut rng = StdRng::seed_from_u64(7);
    for (i, dt) in [DataType::F32, DataType::F16, DataType::I64, DataType::Bool]
        .into_iter()
        .enumerate()
    {
        let s = 10 * i as u64;
        let idx: Vec<i64> = (0..12).map(|_| rng.random_range(-9..9)).collect();
        // Axis 0, 2-D indices, int64 and int32, runtime and constant.
        check_gather(dt, &[9, 5, 3], 0, &idx, &[3, 4], false, false, s);
        check_gather(dt, &[9, 5, 3], 0, &idx, &[3, 4], true, true, s + 1);
        // A middle axis, 1-D and scalar indices.
        let idx: Vec<i64> = (0..7).map(|_| rng.random_range(-6..6)).collect();
        check_gather(dt, &[4, 6, 11], 1, &idx, &[7], true, false, s + 2);
        check_gather(dt, &[4, 6, 11], 1, &[-2], &[], false, true, s + 3);
        // The last axis: one element per row.
        check_gather(dt, &[5, 13], 1, &idx, &[7], false, false, s + 4);
    }
}

#[test]
fn gather_of_embedding_rows_and_rows_larger_than_a_tile() {
    let mut rng = StdRng::seed_from_u64(8);
    let idx: Vec<i64> = (0..300).map(|_| rng.random_range(-1000..1000)).collect();
    check_gather(
        DataType::F16,
        &[1000, 96],
        0,
        &idx,
        &[2, 150],
        false,
        false,
        1,
    );
    let idx = [3, -1, 0];
    check_gather(DataType::F32, &[4, 30_000], 0, &idx, &[3], true, false, 2);
}

#[test]
fn gather_clamps_out_of_range_runtime_indices() {
    // ONNX leaves them undefined; the kernel clamps into the axis and never reads outside.
    let idx = [100, -100, 4, -5, 5, -6];
    check_gather(DataType::F32, &[5, 8], 0, &idx, &[6], false, false, 1);
    check_gather(DataType::I64, &[2, 5, 3], 1, &idx, &[2, 3], true, false, 2);
}

#[test]
fn gather_on_an_empty_axis_is_a_lower_error() {
    let x = rand_tensor(DataType::F32, &[0, 4], 1);
    let i = Tensor::from_i64s(vec![2], &[0, 1]);
    let e = run_op("Gather", &[("axis", Attr::Int(0))], vec![data(x), data(i)])
        .err()
        .expect("an empty gathered axis cannot be lowered");
    assert!(
        e.contains("cannot lower") && e.contains("out of range"),
        "{e}"
    );
}

fn expand_ref(x: &Tensor, shape: &[i64]) -> Tensor {
    let k = shape.len();
    let mut xd = vec![1i64; k - x.dims.len()];
    xd.extend(&x.dims);
    let out: Vec<i64> = (0..k).map(|j| xd[j].max(shape[j])).collect();
    let sx = strides(&xd);
    build(x, &out, |o| {
        (0..k)
            .map(|j| if xd[j] == 1 { 0 } else { o[j] * sx[j] })
            .sum()
    })
}

fn check_expand(dt: DataType, dims: &[i64], shape: &[i64], seed: u64) -> Ran {
    let x = rand_tensor(dt, dims, seed);
    let r = run1(
        "Expand",
        &[],
        vec![
            data(x.clone()),
            constant(Tensor::from_i64s(vec![shape.len() as i64], shape)),
        ],
    );
    assert_same(
        &r.outputs[0],
        &expand_ref(&x, shape),
        &format!("Expand {} {dims:?} to {shape:?}", dt.name()),
    );
    r
}

#[test]
fn expand_of_each_broadcast_pattern() {
    let cases: Vec<(Vec<i64>, Vec<i64>)> = vec![
        // Rows, columns, a middle axis, outer and inner axes, a scalar, a rank increase.
        (vec![1, 37], vec![50, 37]),
        (vec![45, 1], vec![45, 37]),
        (vec![3, 1, 20], vec![3, 7, 20]),
        (vec![5, 1, 1], vec![4, 5, 6, 7]),
        (vec![1], vec![1000]),
        (vec![6], vec![3, 4, 6]),
        (vec![2, 1, 3, 1], vec![2, 4, 3, 5]),
        (vec![1, 1, 1, 9], vec![2, 3, 1, 9]),
        (vec![7, 1], vec![7, 5000]),
        (vec![1, 3], vec![2000, 3]),
    ];
    for (i, dt) in [
        DataType::F32,
        DataType::F16,
        DataType::I64,
        DataType::Bool,
        DataType::U8,
    ]
    .into_iter()
    .enumerate()
    {
        for (j, (d, s)) in cases.iter().enumerate() {
            check_expand(dt, d, s, (i * 100 + j) as u64);
        }
    }
    // Nothing broadcast: the bytes are already right.
    let r = check_expand(DataType::F32, &[3, 4], &[1, 4], 1);
    assert!(r.kernels.is_empty());
}

#[test]
fn expand_of_an_attention_mask_is_fast() {
    let r = check_expand(DataType::F32, &[8, 1, 1, 128], &[8, 12, 128, 128], 1);
    let bytes = 8 * 12 * 128 * 128 * 4;
    let (cycles, gbs) = timing(&r, bytes);
    eprintln!(
        "Expand f32 [8,1,1,128] to [8,12,128,128]: {cycles:.0} cycles, {gbs:.0} GB/s written"
    );
    assert!(gbs > 300.0, "Expand at {gbs:.0} GB/s");
}

/// Runs Split into `sizes.len()` outputs along `axis` and checks each part byte for byte.
fn check_split(dt: DataType, dims: &[i64], axis: usize, sizes: &[i64], explicit: bool, seed: u64) {
    let x = rand_tensor(dt, dims, seed);
    let mut inputs = vec![data(x.clone())];
    if explicit {
        inputs.push(constant(Tensor::from_i64s(vec![sizes.len() as i64], sizes)));
    }
    let cfg = gearsim_sim::ChipConfig::preset("ascend910").unwrap();
    let mut attrs = vec![("axis", Attr::Int(axis as i64))];
    if !explicit {
        // Opset 18: equal parts need their number.
        attrs.push(("num_outputs", Attr::Int(sizes.len() as i64)));
    }
    let r = gearsim_host::oprun::run_op(
        &cfg,
        "Split",
        &attrs,
        inputs,
        sizes.len(),
        gearsim_sim::ExecMode::Full,
    )
    .unwrap_or_else(|e| panic!("Split {dims:?} axis {axis} {sizes:?}: {e}"));
    let st = strides(dims);
    let mut start = 0;
    for (k, &len) in sizes.iter().enumerate() {
        let mut od = dims.to_vec();
        od[axis] = len;
        let want = build(&x, &od, |idx| {
            idx.iter()
                .enumerate()
                .map(|(a, v)| (if a == axis { v + start } else { *v }) * st[a])
                .sum()
        });
        assert_same(
            &r.outputs[k],
            &want,
            &format!("Split {dims:?} axis {axis} part {k}"),
        );
        start += len;
    }
}

#[test]
fn split_along_inner_outer_and_middle_axes() {
    // The attention projection's q, k, v split of the last axis.
    check_split(DataType::F32, &[1, 37, 192], 2, &[64, 64, 64], true, 1);
    // Uneven parts, an empty part, the first axis, a middle axis with odd sizes.
    check_split(DataType::F16, &[5, 7, 9], 2, &[2, 0, 7], true, 2);
    check_split(DataType::I32, &[6, 3], 0, &[1, 5], true, 3);
    check_split(DataType::U8, &[3, 11, 5], 1, &[4, 7], true, 4);
    // Equal parts without sizes.
    check_split(DataType::F32, &[2, 8, 3], 1, &[4, 4], false, 5);
}

/// Resize's `tf_crop_and_resize` writes the extrapolation value where it samples outside the
/// input, whatever the input holds: an extrapolated row reads an appended zero row (a zero
/// weight on a clamped input row made NaN of an infinity there). Inside the input the rows
/// interpolate as the ONNX reference does (0.2·inf is inf).
#[test]
fn resize_extrapolated_rows_hold_the_value_even_next_to_an_infinity() {
    let x = Tensor::from_f32s(vec![1, 1, 1, 4], &[f32::INFINITY, 1.0, 2.0, 3.0]);
    let roi = Tensor::from_f32s(vec![8], &[0.0, 0.0, 0.0, -0.4, 1.0, 1.0, 1.0, 0.6]);
    let sizes = Tensor::from_i64s(vec![4], &[1, 1, 1, 4]);
    let attrs = [
        ("mode", Attr::Str("linear".into())),
        (
            "coordinate_transformation_mode",
            Attr::Str("tf_crop_and_resize".into()),
        ),
        ("extrapolation_value", Attr::Float(10.0)),
    ];
    let r = gearsim_host::oprun::run_op_optional(
        &super::device_run::preset(),
        "Resize",
        &attrs,
        vec![
            Some(data(x)),
            Some(constant(roi)),
            None,
            Some(constant(sizes)),
        ],
        1,
        gearsim_sim::ExecMode::Full,
    )
    .unwrap();
    // Samples at x = -1.2, -0.2 (outside), 0.8 (0.2·inf + 0.8·1), 1.8 (0.2·1 + 0.8·2).
    let got: Vec<f64> = r.outputs[0].to_f64s();
    assert_eq!(&got[..3], &[10.0, 10.0, f64::INFINITY]);
    assert!((got[3] - 1.8).abs() < 1e-6, "{got:?}");
}

/// GatherElements and GatherND whose indices are computed at run time run on the AI CPU,
/// which reads the indices (the AI core kernels take a constant row table); an index out of
/// range is the kernel's error, naming the operator and the index.
#[test]
fn gathers_with_run_time_indices_run_on_the_ai_cpu() {
    let x = Tensor::from_f32s(vec![2, 3], &[10.0, 11.0, 12.0, 20.0, 21.0, 22.0]);
    let i = Tensor::from_i64s(vec![2, 2], &[2, -3, 1, 1]);
    let r = run_op(
        "GatherElements",
        &[("axis", Attr::Int(1))],
        vec![data(x.clone()), data(i)],
    )
    .unwrap();
    assert!(r.launches.is_empty(), "no AI core kernel");
    assert_eq!(r.outputs[0].to_f64s(), [12.0, 10.0, 21.0, 21.0]);
    let rows = Tensor::from_i64s(vec![2, 1], &[1, 0]);
    let r = run_op("GatherND", &[], vec![data(x.clone()), data(rows)]).unwrap();
    assert_eq!(r.outputs[0].dims, [2, 3]);
    assert_eq!(r.outputs[0].to_f64s(), [20.0, 21.0, 22.0, 10.0, 11.0, 12.0]);
    let bad = Tensor::from_i64s(vec![2, 2], &[0, 3, 0, 0]);
    let e = run_op(
        "GatherElements",
        &[("axis", Attr::Int(-1))],
        vec![data(x), data(bad)],
    )
    .err()
    .unwrap();
    assert!(
        e.contains("GatherElements") && e.contains("index 3 along axis 1 is outside [-3, 2]"),
        "{e}"
    );
}
