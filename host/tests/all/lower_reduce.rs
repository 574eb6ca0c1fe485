//! Reductions, Softmax, LayerNormalization and BatchNormalization run on the simulated chip and
//! match f64 references computed here (rtol 1e-4 for these f32 vector paths), on random inputs
//! of odd shapes: every reduced-axis pattern, keepdims both ways, tails that are not multiples
//! of a vector repeat, and rows longer than a tile.

use gearsim_compiler::ir::{Attr, Tensor};

use super::device_run::{assert_close, constant, data, f32s, rand_f32, run_op};

/// Row-major strides.
fn strides(dims: &[i64]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1] as usize;
    }
    s
}

/// Sum (or mean) of `x` over `axes`; the result in the order of the kept axes.
fn reduce_ref(x: &Tensor, axes: &[usize], mean: bool) -> Vec<f64> {
    let v = x.to_f64s();
    let dims = &x.dims;
    let st = strides(dims);
    let kept: Vec<usize> = (0..dims.len()).filter(|a| !axes.contains(a)).collect();
    let out_dims: Vec<i64> = kept.iter().map(|&a| dims[a]).collect();
    let out_n: i64 = out_dims.iter().product();
    let out_st = strides(&out_dims);
    let count: i64 = axes.iter().map(|&a| dims[a]).product();
    let mut out = vec![0f64; out_n as usize];
    for (i, x) in v.iter().enumerate() {
        let mut o = 0;
        for (k, &a) in kept.iter().enumerate() {
            o += (i / st[a]) % dims[a] as usize * out_st[k];
        }
        out[o] += x;
    }
    if mean {
        out.iter_mut().for_each(|s| *s /= count as f64);
    }
    out
}

fn check_reduce(op: &str, dims: &[i64], axes: &[i64], keepdims: bool, seed: u64) {
    let x = rand_f32(dims, -2.0, 2.0, seed);
    let r = run_op(
        op,
        &[("keepdims", Attr::Int(i64::from(keepdims)))],
        vec![
            data(x.clone()),
            constant(Tensor::from_i64s(vec![axes.len() as i64], axes)),
        ],
    )
    .unwrap_or_else(|e| panic!("{op} {dims:?} axes {axes:?}: {e}"));
    let rank = dims.len() as i64;
    let norm: Vec<usize> = axes
        .iter()
        .map(|a| (if *a < 0 { a + rank } else { *a }) as usize)
        .collect();
    let want = reduce_ref(&x, &norm, op == "ReduceMean");
    let expect_dims: Vec<i64> = (0..dims.len())
        .filter_map(|a| {
            if !norm.contains(&a) {
                Some(dims[a])
            } else if keepdims {
                Some(1)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        r.outputs[0].dims, expect_dims,
        "{op} {dims:?} axes {axes:?}"
    );
    assert_close(
        &f32s(&r.outputs[0]),
        &want,
        1e-4,
        1e-5,
        &format!("{op} {dims:?} axes {axes:?}"),
    );
}

#[test]
fn reductions_over_every_axis_pattern() {
    for (k, (dims, axes)) in [
        (&[7, 13][..], &[1][..]),
        (&[7, 13], &[0]),
        (&[3, 5, 37], &[-1]),
        (&[3, 5, 37], &[1]),
        (&[3, 5, 37], &[0, 2]),
        (&[2, 3, 4, 5], &[1, 2, 3]),
        (&[1, 4099], &[1]),
        (&[65, 3], &[0, 1]),
        (&[8, 64, 7, 7], &[2, 3]),
    ]
    .iter()
    .enumerate()
    {
        for op in ["ReduceSum", "ReduceMean"] {
            for keepdims in [true, false] {
                check_reduce(op, dims, axes, keepdims, k as u64);
            }
        }
    }
}

fn softmax_ref(x: &[f64], rows: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0f64; x.len()];
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
        for (i, v) in row.iter().enumerate() {
            out[r * n + i] = (v - m).exp() / s;
        }
    }
    out
}

#[test]
fn softmax_on_the_last_axis_with_odd_rows_and_large_values() {
    for (k, dims) in [
        vec![3, 5],
        vec![2, 4, 33],
        vec![1, 4, 128, 128],
        vec![7, 1000],
        vec![1, 5000],
    ]
    .into_iter()
    .enumerate()
    {
        // Values up to +-40: exp overflows f32 without the max subtraction.
        let x = rand_f32(&dims, -40.0, 40.0, k as u64);
        let r = run_op("Softmax", &[("axis", Attr::Int(-1))], vec![data(x.clone())])
            .unwrap_or_else(|e| panic!("Softmax {dims:?}: {e}"));
        let n = *dims.last().unwrap() as usize;
        let want = softmax_ref(&x.to_f64s(), x.to_f64s().len() / n, n);
        assert_close(
            &f32s(&r.outputs[0]),
            &want,
            1e-4,
            1e-7,
            &format!("Softmax {dims:?}"),
        );
    }
}

#[test]
fn softmax_on_an_inner_axis() {
    // Opset 13 Softmax normalises one axis: axis 1 of [2, 6, 5].
    let dims = [2i64, 6, 5];
    let x = rand_f32(&dims, -3.0, 3.0, 9);
    let r = run_op("Softmax", &[("axis", Attr::Int(1))], vec![data(x.clone())])
        .unwrap_or_else(|e| panic!("Softmax axis 1: {e}"));
    let v = x.to_f64s();
    let mut want = vec![0f64; v.len()];
    for b in 0..2 {
        for c in 0..5 {
            let idx: Vec<usize> = (0..6).map(|j| b * 30 + j * 5 + c).collect();
            let m = idx.iter().map(|&i| v[i]).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = idx.iter().map(|&i| (v[i] - m).exp()).sum();
            for &i in &idx {
                want[i] = (v[i] - m).exp() / s;
            }
        }
    }
    assert_close(&f32s(&r.outputs[0]), &want, 1e-4, 1e-7, "Softmax axis 1");
}

#[test]
fn layer_norm_over_the_last_axis_with_scale_and_bias() {
    for (k, dims) in [vec![4, 64], vec![1, 37, 64], vec![2, 3, 333], vec![5, 4096]]
        .into_iter()
        .enumerate()
    {
        let n = *dims.last().unwrap();
        // A large offset: a naive E[x^2] - E[x]^2 would cancel catastrophically.
        let x = rand_f32(&dims, 99.0, 101.0, k as u64);
        let scale = rand_f32(&[n], 0.5, 1.5, 100 + k as u64);
        let bias = rand_f32(&[n], -0.5, 0.5, 200 + k as u64);
        let eps = 1e-5f32;
        let r = run_op(
            "LayerNormalization",
            &[("axis", Attr::Int(-1)), ("epsilon", Attr::Float(eps))],
            vec![
                data(x.clone()),
                constant(scale.clone()),
                constant(bias.clone()),
            ],
        )
        .unwrap_or_else(|e| panic!("LayerNorm {dims:?}: {e}"));
        let (v, s, b) = (x.to_f64s(), scale.to_f64s(), bias.to_f64s());
        let n = n as usize;
        let mut want = vec![0f64; v.len()];
        for (r, row) in v.chunks(n).enumerate() {
            let mean = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            for i in 0..n {
                want[r * n + i] = (row[i] - mean) * inv * s[i] + b[i];
            }
        }
        // The input's own f32 rounding (1e2 * 2^-24 per element) bounds how well the
        // normalised value can be known: about 1e-3 absolute after dividing by sigma 0.58.
        assert_close(
            &f32s(&r.outputs[0]),
            &want,
            1e-4,
            2e-4,
            &format!("LayerNorm {dims:?}"),
        );
    }
}

#[test]
fn batch_norm_inference_per_channel() {
    for (k, dims) in [vec![1, 16, 32, 32], vec![3, 17, 7, 5], vec![2, 3, 1, 1]]
        .into_iter()
        .enumerate()
    {
        let c = dims[1];
        let x = rand_f32(&dims, -3.0, 3.0, k as u64);
        let p: Vec<Tensor> = (0..4)
            .map(|i| {
                let (lo, hi) = if i == 3 { (0.5, 2.0) } else { (-1.0, 1.0) };
                rand_f32(&[c], lo, hi, 10 * k as u64 + i)
            })
            .collect();
        let eps = 1e-5f32;
        let r = run_op(
            "BatchNormalization",
            &[("epsilon", Attr::Float(eps))],
            vec![
                data(x.clone()),
                constant(p[0].clone()),
                constant(p[1].clone()),
                constant(p[2].clone()),
                constant(p[3].clone()),
            ],
        )
        .unwrap_or_else(|e| panic!("BatchNorm {dims:?}: {e}"));
        let v = x.to_f64s();
        let (g, b, m, var) = (
            p[0].to_f64s(),
            p[1].to_f64s(),
            p[2].to_f64s(),
            p[3].to_f64s(),
        );
        let plane = (dims[2] * dims[3]) as usize;
        let want: Vec<f64> = v
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let ch = (i / plane) % c as usize;
                (x - m[ch]) / (var[ch] + f64::from(eps)).sqrt() * g[ch] + b[ch]
            })
            .collect();
        assert_close(
            &f32s(&r.outputs[0]),
            &want,
            1e-4,
            1e-5,
            &format!("BatchNorm {dims:?}"),
        );
    }
}
