//! Lowered element-wise ops run on the simulated chip through `firmware::Device` and match
//! references computed here (f64, numpy broadcasting, ONNX / C semantics), on random inputs
//! including odd sizes (tails, one-element tensors, 4-D shapes) and every broadcast pattern.

use gearsim_compiler::ir::{Attr, DataType, Tensor};
use gearsim_host::oprun::{In, Ran, run_op_optional};
use gearsim_isa::numeric;
use gearsim_sim::{ChipConfig, ExecMode};
use half::f16;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::device_run::{constant, data, f32s, preset, rand_f32, run_op};

/// The shared `assert_close`, with infinities compared exactly (its error bound is NaN there).
fn assert_close(got: &[f32], want: &[f64], rtol: f64, atol: f64, what: &str) {
    let (mut g, mut w) = (got.to_vec(), want.to_vec());
    for (g, w) in g.iter_mut().zip(w.iter_mut()) {
        if w.is_infinite() && f64::from(*g) == *w {
            (*g, *w) = (0.0, 0.0);
        }
    }
    super::device_run::assert_close(&g, &w, rtol, atol, what);
}

// ---- references ------------------------------------------------------------------------------

/// The numpy broadcast of shapes.
fn bshape(shapes: &[&[i64]]) -> Vec<i64> {
    let r = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    (0..r)
        .map(|j| {
            shapes
                .iter()
                .map(|s| {
                    let k = j as isize - (r - s.len()) as isize;
                    if k < 0 { 1 } else { s[k as usize] }
                })
                .fold(1, |acc, d| if d == 1 { acc } else { d })
        })
        .collect()
}

/// For each element of `out` (row-major), the flat index of the element of `shape` it reads.
fn bindex(out: &[i64], shape: &[i64]) -> Vec<usize> {
    let n: i64 = out.iter().product();
    let r = out.len();
    let pad = r - shape.len();
    (0..n)
        .map(|mut flat| {
            let mut idx = 0i64;
            let mut stride = 1i64;
            for j in (0..r).rev() {
                let i = flat % out[j];
                flat /= out[j];
                if j >= pad {
                    let d = shape[j - pad];
                    if d != 1 {
                        idx += i * stride;
                    }
                    stride *= d;
                }
            }
            idx as usize
        })
        .collect()
}

/// `f` over the broadcast of `a` and `b`, as f64.
fn map2(a: &Tensor, b: &Tensor, f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    let out = bshape(&[&a.dims, &b.dims]);
    let (av, bv) = (a.to_f64s(), b.to_f64s());
    let (ia, ib) = (bindex(&out, &a.dims), bindex(&out, &b.dims));
    ia.iter().zip(&ib).map(|(&i, &j)| f(av[i], bv[j])).collect()
}

fn binary_ref(op: &str, a: f64, b: f64) -> f64 {
    match op {
        "Add" => a + b,
        "Sub" => a - b,
        "Mul" => a * b,
        "Div" => a / b,
        _ => unreachable!(),
    }
}

/// erf by its Maclaurin series (|x| < 2.5, f64-accurate to about 1e-14).
fn erf_series(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for n in 1..200 {
        term *= -x * x / f64::from(n);
        let t = term / f64::from(2 * n + 1);
        sum += t;
        if t.abs() < 1e-18 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

/// erfc for x >= 0: 1 - series below 2.5, the continued fraction above.
fn erfc_ref(x: f64) -> f64 {
    if x < 2.5 {
        return 1.0 - erf_series(x);
    }
    let mut t = x;
    for k in (1..300).rev() {
        t = x + f64::from(k) / 2.0 / t;
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / t
}

fn erf_ref(x: f64) -> f64 {
    if x.abs() < 2.5 {
        erf_series(x)
    } else {
        x.signum() * (1.0 - erfc_ref(x.abs()))
    }
}

fn gelu_ref(x: f64) -> f64 {
    let z = x / std::f64::consts::SQRT_2;
    let phi = if x >= 0.0 {
        1.0 - 0.5 * erfc_ref(z)
    } else {
        0.5 * erfc_ref(-z)
    };
    x * phi
}

/// `x (1 + tanh u) / 2`, written `x / (1 + e^(-2u))` so that f64 does not cancel to 0 where
/// tanh u rounds to -1.
fn gelu_tanh_ref(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

// ---- tensors of every type ---------------------------------------------------------------------

fn tensor(dtype: DataType, dims: &[i64], bytes: Vec<u8>) -> Tensor {
    Tensor::new(dtype, dims.to_vec(), bytes).unwrap()
}

fn f16_tensor(dims: &[i64], v: &[f32]) -> Tensor {
    let b = v
        .iter()
        .flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes())
        .collect();
    tensor(DataType::F16, dims, b)
}

fn bytes_tensor(dtype: DataType, dims: &[i64], v: &[u8]) -> Tensor {
    tensor(dtype, dims, v.to_vec())
}

fn rand_bytes(n: usize, hi: u8, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(0..=hi)).collect()
}

fn n_of(dims: &[i64]) -> usize {
    dims.iter().product::<i64>() as usize
}

/// Raw output bytes.
fn out_bytes(r: &Ran) -> Vec<u8> {
    r.outputs[0].data.to_vec()
}

fn run_opt(op: &str, attrs: &[(&str, Attr)], inputs: Vec<Option<In>>) -> Result<Ran, String> {
    run_op_optional(&preset(), op, attrs, inputs, 1, ExecMode::Full)
}

fn cast_to(t: DataType) -> Vec<(&'static str, Attr)> {
    vec![("to", Attr::Int(i64::from(t.onnx_code())))]
}

// ---- arithmetic ------------------------------------------------------------------------------

#[test]
fn binary_ops_on_equal_shapes_match_for_odd_sizes() {
    for (i, dims) in [
        vec![1],
        vec![7],
        vec![3, 1000],
        vec![2, 3, 5, 7, 11],
        vec![64 * 1024 + 3],
    ]
    .iter()
    .enumerate()
    {
        for op in ["Add", "Sub", "Mul", "Div"] {
            let a = rand_f32(dims, -4.0, 4.0, 10 + i as u64);
            let b = rand_f32(dims, 0.5, 3.0, 20 + i as u64);
            let r = run_op(op, &[], vec![data(a.clone()), data(b.clone())]).unwrap();
            let want = map2(&a, &b, |x, y| binary_ref(op, x, y));
            assert_close(
                &f32s(&r.outputs[0]),
                &want,
                1e-6,
                0.0,
                &format!("{op} {dims:?}"),
            );
        }
    }
}

#[test]
fn binary_ops_with_a_scalar_operand_on_either_side() {
    let x = rand_f32(&[5, 333], -4.0, 4.0, 1);
    for s in [
        Tensor::from_f32s(vec![1], &[1.75]),
        Tensor::from_f32s(vec![], &[-0.625]),
        Tensor::from_f32s(vec![1, 1], &[3.5]),
    ] {
        for op in ["Add", "Sub", "Mul", "Div"] {
            for scalar_first in [false, true] {
                let (a, b) = if scalar_first {
                    (s.clone(), x.clone())
                } else {
                    (x.clone(), s.clone())
                };
                let r = run_op(op, &[], vec![data(a.clone()), data(b.clone())]).unwrap();
                let want = map2(&a, &b, |p, q| binary_ref(op, p, q));
                assert_close(
                    &f32s(&r.outputs[0]),
                    &want,
                    1e-6,
                    1e-7,
                    &format!("{op} {:?} scalar_first={scalar_first}", s.dims),
                );
            }
        }
    }
}

/// Every canonical broadcast pattern, both argument orders, every arithmetic op.
#[test]
fn binary_ops_broadcast_in_every_pattern() {
    let patterns: &[(&[i64], &[i64])] = &[
        (&[300, 129], &[129]),          // row, replicated over short rows
        (&[37, 3000], &[3000]),         // row, long rows read in place per row
        (&[300, 129], &[300, 1]),       // column
        (&[5, 7, 33], &[5, 1, 33]),     // middle axis
        (&[61, 1], &[1, 45]),           // both sides broadcast (outer product)
        (&[77], &[3, 4, 77]),           // rank difference
        (&[2, 3, 4, 5], &[2, 1, 1, 5]), // 4-D attention-mask shape
        (&[2, 3, 4, 5], &[1, 3, 1, 5]), // alternating patterns
        (&[2, 70001], &[2, 1]),         // few long rows: chunk mode with per-row scalars
        (&[3, 1, 50001], &[3, 2, 1]),   // chunk mode, both broadcast
        (&[1000, 5], &[5]),             // tiny rows
        (&[9, 1, 1], &[1, 8, 1]),       // size-1 axes dropped
        (&[2, 1, 3, 1, 2, 1, 3, 1], &[1, 2, 1, 3, 1, 2, 1, 9]), // eight canonical axes
        (&[3, 1, 2, 1, 40], &[1, 5, 1, 7, 40]), // five axes, row mode with three outer
    ];
    for (k, (sa, sb)) in patterns.iter().enumerate() {
        for swap in [false, true] {
            let a = rand_f32(sa, -4.0, 4.0, 100 + k as u64);
            let b = rand_f32(sb, 0.5, 3.0, 200 + k as u64);
            let (a, b) = if swap { (b, a) } else { (a, b) };
            for op in ["Add", "Sub", "Mul", "Div"] {
                let r = run_op(op, &[], vec![data(a.clone()), data(b.clone())]).unwrap();
                let want = map2(&a, &b, |x, y| binary_ref(op, x, y));
                assert_eq!(r.outputs[0].dims, bshape(&[&a.dims, &b.dims]));
                assert_close(
                    &f32s(&r.outputs[0]),
                    &want,
                    1e-6,
                    0.0,
                    &format!("{op} {:?} {:?}", a.dims, b.dims),
                );
            }
        }
    }
}

#[test]
fn broadcast_arithmetic_in_f16_and_i32() {
    let mut rng = StdRng::seed_from_u64(5);
    let av: Vec<f32> = (0..17 * 40)
        .map(|_| rng.random_range(-8.0..8.0f32))
        .collect();
    let bv: Vec<f32> = (0..40).map(|_| rng.random_range(0.5..4.0f32)).collect();
    let (a, b) = (f16_tensor(&[17, 40], &av), f16_tensor(&[40], &bv));
    for op in ["Add", "Mul", "Div"] {
        let r = run_op(op, &[], vec![data(a.clone()), data(b.clone())]).unwrap();
        // The unit computes once in f32 and rounds to f16: the correctly rounded result.
        let want: Vec<f64> = map2(&a, &b, |x, y| binary_ref(op, x, y))
            .iter()
            .map(|v| f16::from_f64(*v).to_f64())
            .collect();
        assert_close(&f32s(&r.outputs[0]), &want, 0.0, 0.0, &format!("f16 {op}"));
    }
    // Column and scalar f16 operands (splats of 16-bit values).
    for sb in [&[17i64, 1][..], &[][..]] {
        let b = f16_tensor(sb, &bv[..n_of(sb)]);
        for op in ["Sub", "Div"] {
            let r = run_op(op, &[], vec![data(b.clone()), data(a.clone())]).unwrap();
            let want: Vec<f64> = map2(&b, &a, |x, y| binary_ref(op, x, y))
                .iter()
                .map(|v| f16::from_f64(*v).to_f64())
                .collect();
            assert_close(
                &f32s(&r.outputs[0]),
                &want,
                0.0,
                0.0,
                &format!("f16 {op} {sb:?}"),
            );
        }
    }
    let ai: Vec<i32> = (0..6 * 7).map(|i| i * 7919 - 100_000).collect();
    let (a, b) = (
        Tensor::from_i32s(vec![6, 7], &ai),
        Tensor::from_i32s(vec![6, 1], &[3, -5, 7, 11, -13, 1 << 20]),
    );
    for op in ["Add", "Sub", "Mul"] {
        let r = run_op(op, &[], vec![data(a.clone()), data(b.clone())]).unwrap();
        // Exact in f64 (|products| < 2^53), then wrapped to i32.
        let want: Vec<i64> = map2(&a, &b, |x, y| binary_ref(op, x, y))
            .iter()
            .map(|v| i64::from(*v as i64 as i32))
            .collect();
        assert_eq!(r.outputs[0].to_i64s(), want, "i32 {op}");
    }
}

/// The vector unit divides floats only: integer division runs on the AI CPU (see
/// `arithmetic_without_a_vector_kernel_runs_on_the_ai_cpu`), truncating toward zero.
#[test]
fn integer_division_runs_on_the_ai_cpu() {
    let a = Tensor::from_i32s(vec![4], &[1, -9, 3, 40]);
    let b = Tensor::from_i32s(vec![4], &[2, 2, 3, -7]);
    let r = run_op("Div", &[], vec![data(a), data(b)]).unwrap();
    assert!(r.launches.is_empty());
    assert_eq!(r.outputs[0].to_i64s(), [0, -4, 1, -5]);
}

// ---- unary -----------------------------------------------------------------------------------

/// Values spanning what activations see, plus the edges: zeros, tiny, huge, infinities.
fn activation_inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut v: Vec<f32> = (0..n)
        .map(|i| match i % 4 {
            0 => rng.random_range(-6.0..6.0f32),
            1 => rng.random_range(-0.7..0.7f32),
            2 => rng.random_range(-30.0..30.0f32),
            _ => rng.random_range(-1e-3..1e-3f32),
        })
        .collect();
    let edges = [
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        1e-7,
        -2e-5,
        0.124,
        0.126,
        0.499,
        0.501,
        -0.5,
        2.4,
        2.6,
        9.0,
        -9.0,
        -13.0,
        87.0,
        -87.0,
        100.0,
        -100.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
    ];
    v[..edges.len()].copy_from_slice(&edges);
    v
}

#[test]
fn activations_match_f64_references_over_their_range() {
    type Reference = fn(f64) -> f64;
    let cases: [(&str, Option<&str>, Reference, f64); 6] = [
        ("Sigmoid", None, |x| 1.0 / (1.0 + (-x).exp()), 1e-5),
        ("Tanh", None, f64::tanh, 1e-5),
        ("Erf", None, erf_ref, 1e-5),
        // The tail's relative error grows like x^2 2^-24 (the rounding of the exponent).
        ("Gelu", None, gelu_ref, 2e-5),
        ("Gelu", Some("none"), gelu_ref, 2e-5),
        ("Gelu", Some("tanh"), gelu_tanh_ref, 1e-5),
    ];
    for (k, (op, mode, f, rtol)) in cases.iter().enumerate() {
        for n in [1usize, 7, 1000, 64 * 1024 + 3] {
            let v = activation_inputs(n.max(24), 40 + k as u64);
            let v = &v[v.len() - n..];
            let x = Tensor::from_f32s(vec![n as i64], v);
            let attrs: Vec<(&str, Attr)> = mode
                .map(|m| vec![("approximate", Attr::Str(m.into()))])
                .unwrap_or_default();
            let r = run_op(op, &attrs, vec![data(x.clone())]).unwrap();
            let want: Vec<f64> = x.to_f64s().iter().map(|v| f(*v)).collect();
            // Results below the f32 normal range (1.2e-38) lose relative precision.
            assert_close(
                &f32s(&r.outputs[0]),
                &want,
                *rtol,
                1e-37,
                &format!("{op} {mode:?} n={n}"),
            );
        }
    }
}

#[test]
fn erf_meets_rtol_1e4_atol_1e6_on_a_dense_grid() {
    let v: Vec<f32> = (-4000..=4000).map(|i| i as f32 * 1e-3).collect();
    let x = Tensor::from_f32s(vec![v.len() as i64], &v);
    let r = run_op("Erf", &[], vec![data(x.clone())]).unwrap();
    let want: Vec<f64> = x.to_f64s().iter().map(|v| erf_ref(*v)).collect();
    assert_close(&f32s(&r.outputs[0]), &want, 1e-4, 1e-6, "Erf grid");
    assert_close(&f32s(&r.outputs[0]), &want, 2e-6, 0.0, "Erf grid (tight)");
}

#[test]
fn activations_in_f16_and_on_4d_shapes() {
    let mut rng = StdRng::seed_from_u64(9);
    let v: Vec<f32> = (0..3 * 5 * 7 * 11)
        .map(|_| rng.random_range(-5.0..5.0f32))
        .collect();
    let x = f16_tensor(&[3, 5, 7, 11], &v);
    for (op, f) in [
        ("Sigmoid", (|x| 1.0 / (1.0 + (-x).exp())) as fn(f64) -> f64),
        ("Tanh", f64::tanh),
        ("Erf", erf_ref),
        ("Gelu", gelu_ref),
    ] {
        let r = run_op(op, &[], vec![data(x.clone())]).unwrap();
        assert_eq!(r.outputs[0].dtype, DataType::F16);
        let want: Vec<f64> = x.to_f64s().iter().map(|v| f(*v)).collect();
        // f32 result rounded once to f16: within half an f16 ulp plus the f32 error.
        assert_close(
            &f32s(&r.outputs[0]),
            &want,
            1e-3,
            1e-6,
            &format!("f16 {op}"),
        );
    }
}

#[test]
fn unary_ops_match() {
    let x = rand_f32(&[4, 3, 999], -4.0, 4.0, 3);
    let r = run_op("Relu", &[], vec![data(x.clone())]).unwrap();
    let want: Vec<f64> = x.to_f64s().iter().map(|v| v.max(0.0)).collect();
    assert_close(&f32s(&r.outputs[0]), &want, 0.0, 0.0, "Relu");
    let x = rand_f32(&[4, 3, 999], 0.0, 100.0, 4);
    let r = run_op("Sqrt", &[], vec![data(x.clone())]).unwrap();
    let want: Vec<f64> = x.to_f64s().iter().map(|v| v.sqrt()).collect();
    assert_close(&f32s(&r.outputs[0]), &want, 1e-6, 0.0, "Sqrt");
    let xi = Tensor::from_i32s(vec![7], &[-3, 0, 5, i32::MIN, i32::MAX, -1, 1]);
    let r = run_op("Relu", &[], vec![data(xi)]).unwrap();
    assert_eq!(
        r.outputs[0].to_i64s(),
        vec![0, 0, 5, 0, i64::from(i32::MAX), 0, 1]
    );
}

// ---- Clip ------------------------------------------------------------------------------------

#[test]
fn clip_with_every_combination_of_bounds() {
    let mut v: Vec<f32> = rand_f32(&[1003], -5.0, 5.0, 11)
        .to_f64s()
        .iter()
        .map(|v| *v as f32)
        .collect();
    v[0] = f32::NAN;
    v[1] = f32::INFINITY;
    v[2] = f32::NEG_INFINITY;
    let x = Tensor::from_f32s(vec![1003], &v);
    let lo = Tensor::from_f32s(vec![], &[-1.5]);
    let hi = Tensor::from_f32s(vec![1], &[2.25]);
    type Case = (Option<bool>, Option<bool>);
    // (min, max): None = absent, Some(true) = constant, Some(false) = runtime tensor.
    let cases: [Case; 9] = [
        (None, None),
        (Some(true), None),
        (Some(false), None),
        (None, Some(true)),
        (None, Some(false)),
        (Some(true), Some(true)),
        (Some(false), Some(false)),
        (Some(true), Some(false)),
        (Some(false), Some(true)),
    ];
    for (cmin, cmax) in cases {
        let wrap = |t: &Tensor, c: Option<bool>| {
            c.map(|k| {
                if k {
                    constant(t.clone())
                } else {
                    data(t.clone())
                }
            })
        };
        let mut ins = vec![Some(data(x.clone())), wrap(&lo, cmin), wrap(&hi, cmax)];
        while ins.len() > 1 && ins.last().is_some_and(Option::is_none) {
            ins.pop();
        }
        let r = run_opt("Clip", &[], ins).unwrap();
        let want: Vec<f64> = x
            .to_f64s()
            .iter()
            .map(|&p| {
                let mut q = p;
                if cmin.is_some() && q < -1.5 {
                    q = -1.5;
                }
                if cmax.is_some() && q > 2.25 {
                    q = 2.25;
                }
                q
            })
            .collect();
        assert_close(
            &f32s(&r.outputs[0]),
            &want,
            0.0,
            0.0,
            &format!("Clip {cmin:?} {cmax:?}"),
        );
    }
    // min above max: every element becomes max (ONNX: min(max(x, lo), hi)).
    let r = run_op(
        "Clip",
        &[],
        vec![
            data(x.clone()),
            constant(Tensor::from_f32s(vec![], &[3.0])),
            data(Tensor::from_f32s(vec![], &[1.0])),
        ],
    )
    .unwrap();
    let got = f32s(&r.outputs[0]);
    assert!(
        got[1..].iter().all(|v| *v == 1.0) && got[0].is_nan(),
        "{:?}",
        &got[..4]
    );
    let xi = Tensor::from_i32s(vec![6], &[-100, -3, 0, 3, 100, 7]);
    let r = run_op(
        "Clip",
        &[],
        vec![
            data(xi),
            data(Tensor::from_i32s(vec![], &[-3])),
            constant(Tensor::from_i32s(vec![], &[5])),
        ],
    )
    .unwrap();
    assert_eq!(r.outputs[0].to_i64s(), vec![-3, -3, 0, 3, 5, 5]);
}

// ---- Pow -------------------------------------------------------------------------------------

/// C's pow in f64, rounded to f32 (results beyond the f32 range are infinite there too).
fn pow_ref(a: f64, b: f64) -> f64 {
    f64::from(a.powf(b) as f32)
}

#[test]
fn pow_with_constant_exponents() {
    let mut v: Vec<f32> = rand_f32(&[2, 517], -3.0, 3.0, 21)
        .to_f64s()
        .iter()
        .map(|v| *v as f32)
        .collect();
    let edges = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-20,
    ];
    v[..edges.len()].copy_from_slice(&edges);
    let x = Tensor::from_f32s(vec![2, 517], &v);
    for e in [
        2.0f32, 3.0, 4.0, 0.5, -1.0, -2.0, 0.0, 1.0, 2.5, -1.5, 7.0, -3.0, 0.25,
    ] {
        let b = Tensor::from_f32s(vec![], &[e]);
        let r = run_op("Pow", &[], vec![data(x.clone()), constant(b.clone())]).unwrap();
        let want = map2(&x, &b, pow_ref);
        assert_close(
            &f32s(&r.outputs[0]),
            &want,
            1e-5,
            1e-37,
            &format!("Pow x^{e}"),
        );
    }
    let p = run_op(
        "Pow",
        &[],
        vec![data(x.clone()), constant(Tensor::from_i32s(vec![1], &[3]))],
    )
    .unwrap();
    assert_close(
        &f32s(&p.outputs[0]),
        &map2(&x, &Tensor::from_f32s(vec![], &[3.0]), pow_ref),
        1e-5,
        1e-37,
        "Pow x^int3",
    );
}

#[test]
fn pow_with_runtime_exponents_follows_c_special_cases() {
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    let pairs: [(f32, f32); 24] = [
        (0.0, 0.0),
        (nan, 0.0),
        (1.0, nan),
        (-1.0, inf),
        (-1.0, -inf),
        (-2.0, 3.0),
        (-2.0, 2.0),
        (-2.0, 0.5),
        (-0.0, -1.0),
        (-0.0, 3.0),
        (-0.0, 0.5),
        (0.0, -2.0),
        (-inf, 3.0),
        (-inf, 0.5),
        (-inf, -1.0),
        (2.0, -inf),
        (0.5, inf),
        (2.0, inf),
        (-8.0, 1.0 / 3.0),
        (-1.0, nan),
        (3.0, 1e7 + 1.0),
        (-1.0, 16_777_217.0),
        (1.5, -3.25),
        (10.0, 38.0),
    ];
    let (av, bv): (Vec<f32>, Vec<f32>) = pairs.iter().copied().unzip();
    let a = Tensor::from_f32s(vec![pairs.len() as i64], &av);
    let b = Tensor::from_f32s(vec![pairs.len() as i64], &bv);
    let r = run_op("Pow", &[], vec![data(a.clone()), data(b.clone())]).unwrap();
    assert_close(
        &f32s(&r.outputs[0]),
        &map2(&a, &b, pow_ref),
        1e-5,
        0.0,
        "Pow specials",
    );
    // Broadcast: negative bases against a row of integer and non-integer exponents.
    let a = rand_f32(&[33, 1], -3.0, 3.0, 31);
    let b = Tensor::from_f32s(
        vec![1, 9],
        &[-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 0.5, -1.5],
    );
    let r = run_op("Pow", &[], vec![data(a.clone()), data(b.clone())]).unwrap();
    assert_close(
        &f32s(&r.outputs[0]),
        &map2(&a, &b, pow_ref),
        1e-5,
        0.0,
        "Pow outer",
    );
    // int32 exponents: parity from the integer, even beyond 2^24.
    let a = Tensor::from_f32s(vec![6], &[-1.0, -1.0, -2.0, 2.0, -0.5, 0.0]);
    let b = Tensor::from_i32s(vec![6], &[16_777_217, 16_777_216, 5, -3, -2, 0]);
    let r = run_op("Pow", &[], vec![data(a.clone()), data(b.clone())]).unwrap();
    assert_close(
        &f32s(&r.outputs[0]),
        &map2(&a, &b, pow_ref),
        1e-5,
        0.0,
        "Pow int exponent",
    );
    // f16 base.
    let a = f16_tensor(&[5], &[1.5, -2.0, 0.25, 3.0, -0.5]);
    let b = Tensor::from_f32s(vec![1], &[3.0]);
    let r = run_op("Pow", &[], vec![data(a.clone()), data(b.clone())]).unwrap();
    let want: Vec<f64> = map2(&a, &b, pow_ref)
        .iter()
        .map(|v| f16::from_f64(*v).to_f64())
        .collect();
    assert_close(&f32s(&r.outputs[0]), &want, 1e-3, 0.0, "Pow f16");
}

// ---- Equal and Where -------------------------------------------------------------------------

#[test]
fn equal_in_every_type_and_broadcast() {
    let mut rng = StdRng::seed_from_u64(51);
    let small = |n: usize, rng: &mut StdRng| -> Vec<f32> {
        (0..n).map(|_| rng.random_range(0..4) as f32).collect()
    };
    for (sa, sb) in [
        (vec![1001i64], vec![1001i64]),
        (vec![33, 17], vec![17]),
        (vec![33, 17], vec![33, 1]),
        (vec![5, 1, 7], vec![1, 6, 7]),
        (vec![300], vec![]),
    ] {
        let mut av = small(n_of(&sa), &mut rng);
        av[0] = f32::NAN;
        let bv = small(n_of(&sb), &mut rng);
        let a = Tensor::from_f32s(sa.clone(), &av);
        let b = Tensor::from_f32s(sb.clone(), &bv);
        let r = run_op("Equal", &[], vec![data(a.clone()), data(b.clone())]).unwrap();
        assert_eq!(r.outputs[0].dtype, DataType::Bool);
        let want: Vec<u8> = map2(&a, &b, |x, y| f64::from(u8::from(x == y)))
            .iter()
            .map(|v| *v as u8)
            .collect();
        assert_eq!(out_bytes(&r), want, "f32 {sa:?} == {sb:?}");
        // The same values as int32, int64 (high words differing too), uint8, int8, bool.
        let ai: Vec<i64> = av
            .iter()
            .map(|v| if v.is_nan() { 9 } else { *v as i64 })
            .collect();
        let bi: Vec<i64> = bv.iter().map(|v| *v as i64).collect();
        let want_i: Vec<u8> = {
            let (ta, tb) = (
                Tensor::from_i64s(sa.clone(), &ai),
                Tensor::from_i64s(sb.clone(), &bi),
            );
            map2(&ta, &tb, |x, y| f64::from(u8::from(x == y)))
                .iter()
                .map(|v| *v as u8)
                .collect()
        };
        let i32s = |v: &[i64]| v.iter().map(|x| *x as i32).collect::<Vec<_>>();
        let r = run_op(
            "Equal",
            &[],
            vec![
                data(Tensor::from_i32s(sa.clone(), &i32s(&ai))),
                data(Tensor::from_i32s(sb.clone(), &i32s(&bi))),
            ],
        )
        .unwrap();
        assert_eq!(out_bytes(&r), want_i, "i32 {sa:?}");
        let shift = |v: &[i64]| v.iter().map(|x| x * (1 << 33) + 5).collect::<Vec<_>>();
        let r = run_op(
            "Equal",
            &[],
            vec![
                data(Tensor::from_i64s(sa.clone(), &shift(&ai))),
                data(Tensor::from_i64s(sb.clone(), &shift(&bi))),
            ],
        )
        .unwrap();
        assert_eq!(out_bytes(&r), want_i, "i64 {sa:?}");
        for dt in [DataType::U8, DataType::I8] {
            let bytes = |v: &[i64]| {
                v.iter()
                    .map(|x| (*x as u8).wrapping_mul(71))
                    .collect::<Vec<_>>()
            };
            let r = run_op(
                "Equal",
                &[],
                vec![
                    data(bytes_tensor(dt, &sa, &bytes(&ai))),
                    data(bytes_tensor(dt, &sb, &bytes(&bi))),
                ],
            )
            .unwrap();
            assert_eq!(out_bytes(&r), want_i, "{dt:?} {sa:?}");
        }
        let bools = |v: &[i64]| v.iter().map(|x| u8::from(*x % 2 == 1)).collect::<Vec<_>>();
        let (ta, tb) = (
            bytes_tensor(DataType::Bool, &sa, &bools(&ai)),
            bytes_tensor(DataType::Bool, &sb, &bools(&bi)),
        );
        let r = run_op("Equal", &[], vec![data(ta.clone()), data(tb.clone())]).unwrap();
        let want_b: Vec<u8> = map2(&ta, &tb, |x, y| f64::from(u8::from(x == y)))
            .iter()
            .map(|v| *v as u8)
            .collect();
        assert_eq!(out_bytes(&r), want_b, "bool {sa:?}");
    }
}

#[test]
fn where_selects_with_three_way_broadcast() {
    let patterns: &[(&[i64], &[i64], &[i64])] = &[
        (&[2049], &[2049], &[2049]),
        (&[1], &[7], &[7]),
        (&[2, 1, 4, 5], &[2, 3, 4, 5], &[]),
        (&[4, 1], &[1, 33], &[4, 33]),
        (&[33], &[4, 33], &[1]),
        (&[5, 1, 64], &[5, 3, 64], &[5, 3, 1]),
    ];
    for (k, (sc, sx, sy)) in patterns.iter().enumerate() {
        let c = bytes_tensor(DataType::Bool, sc, &rand_bytes(n_of(sc), 1, 60 + k as u64));
        let x = rand_f32(sx, -4.0, 4.0, 70 + k as u64);
        let y = rand_f32(sy, -4.0, 4.0, 80 + k as u64);
        let r = run_op(
            "Where",
            &[],
            vec![data(c.clone()), data(x.clone()), data(y.clone())],
        )
        .unwrap();
        let out = bshape(&[sc, sx, sy]);
        let (ic, ix, iy) = (bindex(&out, sc), bindex(&out, sx), bindex(&out, sy));
        let (cv, xv, yv) = (c.to_i64s(), x.to_f64s(), y.to_f64s());
        let want: Vec<f64> = (0..ic.len())
            .map(|i| if cv[ic[i]] != 0 { xv[ix[i]] } else { yv[iy[i]] })
            .collect();
        assert_eq!(r.outputs[0].dims, out);
        assert_close(
            &f32s(&r.outputs[0]),
            &want,
            0.0,
            0.0,
            &format!("Where {sc:?} {sx:?} {sy:?}"),
        );
        // The same selection over int64 and bool branches.
        let xi: Vec<i64> = xv.iter().map(|v| (*v * 1e9) as i64).collect();
        let yi: Vec<i64> = yv.iter().map(|v| (*v * -1e9) as i64).collect();
        let r = run_op(
            "Where",
            &[],
            vec![
                data(c.clone()),
                data(Tensor::from_i64s(sx.to_vec(), &xi)),
                data(Tensor::from_i64s(sy.to_vec(), &yi)),
            ],
        )
        .unwrap();
        let want_i: Vec<i64> = (0..ic.len())
            .map(|i| if cv[ic[i]] != 0 { xi[ix[i]] } else { yi[iy[i]] })
            .collect();
        assert_eq!(r.outputs[0].to_i64s(), want_i, "Where int64 {sc:?}");
        let xb: Vec<u8> = xi.iter().map(|v| u8::from(*v > 0)).collect();
        let yb: Vec<u8> = yi.iter().map(|v| u8::from(*v > 0)).collect();
        let r = run_op(
            "Where",
            &[],
            vec![
                data(c.clone()),
                data(bytes_tensor(DataType::Bool, sx, &xb)),
                data(bytes_tensor(DataType::Bool, sy, &yb)),
            ],
        )
        .unwrap();
        let want_b: Vec<u8> = (0..ic.len())
            .map(|i| if cv[ic[i]] != 0 { xb[ix[i]] } else { yb[iy[i]] })
            .collect();
        assert_eq!(out_bytes(&r), want_b, "Where bool {sc:?}");
    }
    // f16 branches broadcast against an i32 condition row: rows padded for 2-byte elements.
    let c = bytes_tensor(DataType::Bool, &[4, 1], &[1, 0, 1, 0]);
    let xv: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let x = f16_tensor(&[4, 8], &xv);
    let y = f16_tensor(&[8], &[-1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0]);
    let r = run_op("Where", &[], vec![data(c), data(x), data(y)]).unwrap();
    let want: Vec<f32> = (0..32)
        .map(|i| {
            if (i / 8) % 2 == 0 {
                i as f32
            } else {
                -((i % 8) as f32) - 1.0
            }
        })
        .collect();
    assert_eq!(f32s(&r.outputs[0]), want, "Where f16 rows");
    // f16 branches, and a condition byte other than 0 and 1 counts as true.
    let c = bytes_tensor(DataType::Bool, &[6], &[0, 1, 2, 255, 0, 1]);
    let x = f16_tensor(&[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = f16_tensor(&[1], &[-1.0]);
    let r = run_op("Where", &[], vec![data(c), data(x), data(y)]).unwrap();
    assert_eq!(f32s(&r.outputs[0]), vec![-1.0, 2.0, 3.0, 4.0, -1.0, 6.0]);
}

// ---- Cast ------------------------------------------------------------------------------------

/// Values exercising Cast's rounding: halves, negatives, large magnitudes.
fn cast_values() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        0.49999997,
        0.9999999,
        -0.9999999,
        127.5,
        255.9,
        -128.7,
        65504.0,
        65519.99,
        65520.0,
        -70000.0,
        1e-8,
        5.96e-8,
        2049.0,
        2051.0,
        16_777_217.0,
        1e9,
        -1e9,
        2_147_483_520.0,
        -2_147_483_648.0,
        3.0e9,
        -3.3e9,
        1.0e15,
        -4.5e18,
        9.2e18,
    ];
    let mut rng = StdRng::seed_from_u64(77);
    v.extend((0..1000).map(|_| rng.random_range(-300.0..300.0f32)));
    v
}

#[test]
fn cast_between_floats_and_int32_rounds_like_onnx() {
    let v = cast_values();
    let x = Tensor::from_f32s(vec![v.len() as i64], &v);
    // f32 -> f16: round to nearest even, overflow to infinity.
    let r = run_op("Cast", &cast_to(DataType::F16), vec![data(x.clone())]).unwrap();
    let want: Vec<u16> = v.iter().map(|x| f16::from_f32(*x).to_bits()).collect();
    let got: Vec<u16> = out_bytes(&r)
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(got, want, "f32 -> f16");
    // f16 -> f32 is exact.
    let h = f16_tensor(&[v.len() as i64], &v);
    let r = run_op("Cast", &cast_to(DataType::F32), vec![data(h.clone())]).unwrap();
    assert_close(&f32s(&r.outputs[0]), &h.to_f64s(), 0.0, 0.0, "f16 -> f32");
    // f32 -> i32 truncates toward zero (inputs within the i32 range).
    let inr: Vec<f32> = v.iter().copied().filter(|x| x.abs() < 2.1e9).collect();
    let xi = Tensor::from_f32s(vec![inr.len() as i64], &inr);
    let r = run_op("Cast", &cast_to(DataType::I32), vec![data(xi.clone())]).unwrap();
    let want: Vec<i64> = inr.iter().map(|x| i64::from(x.trunc() as i32)).collect();
    assert_eq!(r.outputs[0].to_i64s(), want, "f32 -> i32");
    // f16 -> i32.
    let small: Vec<f32> = inr.iter().copied().filter(|x| x.abs() < 65000.0).collect();
    let hs = f16_tensor(&[small.len() as i64], &small);
    let r = run_op("Cast", &cast_to(DataType::I32), vec![data(hs.clone())]).unwrap();
    let want: Vec<i64> = hs.to_f64s().iter().map(|x| x.trunc() as i64).collect();
    assert_eq!(r.outputs[0].to_i64s(), want, "f16 -> i32");
    // i32 -> f32 and -> f16 round to nearest even.
    let ints: Vec<i32> = vec![
        0,
        1,
        -1,
        2049,
        2051,
        16_777_217,
        16_777_219,
        -16_777_217,
        i32::MAX,
        i32::MIN,
        65504,
        65520,
        123_456_789,
    ];
    let t = Tensor::from_i32s(vec![ints.len() as i64], &ints);
    let r = run_op("Cast", &cast_to(DataType::F32), vec![data(t.clone())]).unwrap();
    let want: Vec<f32> = ints.iter().map(|i| *i as f32).collect();
    assert_eq!(f32s(&r.outputs[0]), want, "i32 -> f32");
    let r = run_op("Cast", &cast_to(DataType::F16), vec![data(t)]).unwrap();
    let want: Vec<u16> = ints
        .iter()
        .map(|i| f16::from_f64(f64::from(*i)).to_bits())
        .collect();
    let got: Vec<u16> = out_bytes(&r)
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    assert_eq!(got, want, "i32 -> f16");
    // Same type: no kernel.
    let r = run_op("Cast", &cast_to(DataType::F32), vec![data(x)]).unwrap();
    assert!(r.kernels.is_empty());
}

#[test]
fn cast_to_and_from_bytes_and_int64() {
    let v = cast_values();
    let n = v.len() as i64;
    let x = Tensor::from_f32s(vec![n], &v);
    // float -> bool: non-zero (NaN included) is true.
    let mut vb = v.clone();
    vb[3] = f32::NAN;
    let xb = Tensor::from_f32s(vec![n], &vb);
    let r = run_op("Cast", &cast_to(DataType::Bool), vec![data(xb)]).unwrap();
    let want: Vec<u8> = vb.iter().map(|x| u8::from(*x != 0.0)).collect();
    assert_eq!(out_bytes(&r), want, "f32 -> bool");
    // float -> uint8 / int8: truncate, then wrap (in range for the inputs checked).
    let bytes_in: Vec<f32> = v
        .iter()
        .copied()
        .filter(|x| (-128.0..256.0).contains(x))
        .collect();
    let xs = Tensor::from_f32s(vec![bytes_in.len() as i64], &bytes_in);
    for (dt, f) in [
        (
            DataType::U8,
            (|x: f32| (x.trunc() as i32) as u8) as fn(f32) -> u8,
        ),
        (DataType::I8, |x: f32| (x.trunc() as i32) as i8 as u8),
    ] {
        let r = run_op("Cast", &cast_to(dt), vec![data(xs.clone())]).unwrap();
        let want: Vec<u8> = bytes_in.iter().map(|x| f(*x)).collect();
        assert_eq!(out_bytes(&r), want, "f32 -> {dt:?}");
    }
    // Bytes -> f32, i32, f16.
    let raw: Vec<u8> = (0..=255u8).chain(rand_bytes(77, 255, 3)).collect();
    let m = raw.len() as i64;
    for (dt, f) in [
        (DataType::U8, (|b: u8| f64::from(b)) as fn(u8) -> f64),
        (DataType::I8, |b: u8| f64::from(b as i8)),
        (DataType::Bool, |b: u8| f64::from(u8::from(b != 0))),
    ] {
        let t = bytes_tensor(dt, &[m], &raw);
        let want: Vec<f64> = raw.iter().map(|b| f(*b)).collect();
        for to in [DataType::F32, DataType::I32, DataType::F16, DataType::I64] {
            let r = run_op("Cast", &cast_to(to), vec![data(t.clone())]).unwrap();
            assert_eq!(r.outputs[0].to_f64s(), want, "{dt:?} -> {to:?}");
        }
        for to in [DataType::U8, DataType::I8, DataType::Bool] {
            if to == dt {
                continue;
            }
            let r = run_op("Cast", &cast_to(to), vec![data(t.clone())]).unwrap();
            let want_b: Vec<u8> = want
                .iter()
                .map(|v| {
                    if to == DataType::Bool {
                        u8::from(*v != 0.0)
                    } else {
                        *v as i64 as u8
                    }
                })
                .collect();
            assert_eq!(out_bytes(&r), want_b, "{dt:?} -> {to:?}");
        }
    }
    // int32 -> bytes wraps; int32 <-> int64 sign-extends and wraps.
    let ints: Vec<i32> = vec![
        0,
        1,
        -1,
        127,
        128,
        255,
        256,
        -129,
        70000,
        i32::MIN,
        i32::MAX,
    ];
    let t = Tensor::from_i32s(vec![ints.len() as i64], &ints);
    let r = run_op("Cast", &cast_to(DataType::U8), vec![data(t.clone())]).unwrap();
    assert_eq!(
        out_bytes(&r),
        ints.iter().map(|i| *i as u8).collect::<Vec<_>>(),
        "i32 -> u8"
    );
    let r = run_op("Cast", &cast_to(DataType::I64), vec![data(t.clone())]).unwrap();
    assert_eq!(
        r.outputs[0].to_i64s(),
        ints.iter().map(|i| i64::from(*i)).collect::<Vec<_>>(),
        "i32 -> i64"
    );
    let longs: Vec<i64> = vec![
        0,
        -1,
        5,
        -5,
        1 << 31,
        -(1 << 31) - 1,
        (1 << 40) + 7,
        -(1 << 40) - 7,
        i64::MAX,
        i64::MIN,
        16_777_217,
        -2_147_483_648,
        2_147_483_647,
        1 << 53,
    ];
    let t = Tensor::from_i64s(vec![longs.len() as i64], &longs);
    let r = run_op("Cast", &cast_to(DataType::I32), vec![data(t.clone())]).unwrap();
    assert_eq!(
        r.outputs[0].to_i64s(),
        longs
            .iter()
            .map(|v| i64::from(*v as i32))
            .collect::<Vec<_>>(),
        "i64 -> i32"
    );
    let r = run_op("Cast", &cast_to(DataType::Bool), vec![data(t.clone())]).unwrap();
    assert_eq!(
        out_bytes(&r),
        longs.iter().map(|v| u8::from(*v != 0)).collect::<Vec<_>>(),
        "i64 -> bool"
    );
    // int64 -> f32: exact below 2^31, within one f32 ulp beyond.
    let r = run_op("Cast", &cast_to(DataType::F32), vec![data(t.clone())]).unwrap();
    let want: Vec<f64> = longs.iter().map(|v| f64::from(*v as f32)).collect();
    let got = f32s(&r.outputs[0]);
    for ((g, w), l) in got.iter().zip(&want).zip(&longs) {
        if l.unsigned_abs() < 1 << 31 {
            assert_eq!(f64::from(*g), *w, "i64 -> f32 of {l}");
        } else {
            assert!(
                (f64::from(*g) - w).abs() <= w.abs() * 1.2e-7,
                "i64 -> f32 of {l}: {g} vs {w}"
            );
        }
    }
    // f32 -> int64 truncates, exactly over the whole int64 range.
    let r = run_op("Cast", &cast_to(DataType::I64), vec![data(x.clone())]).unwrap();
    let want: Vec<i64> = v.iter().map(|x| x.trunc() as i64).collect();
    assert_eq!(r.outputs[0].to_i64s(), want, "f32 -> i64");
    let h = f16_tensor(&[n], &v);
    let r = run_op("Cast", &cast_to(DataType::I64), vec![data(h.clone())]).unwrap();
    let want: Vec<i64> = h
        .to_f64s()
        .iter()
        .map(|x| if x.is_finite() { x.trunc() as i64 } else { 0 })
        .collect();
    let got = r.outputs[0].to_i64s();
    for ((g, w), hv) in got.iter().zip(&want).zip(h.to_f64s()) {
        if hv.is_finite() {
            assert_eq!(g, w, "f16 -> i64 of {hv}");
        }
    }
}

/// `v` stored as type `t` with ONNX Cast semantics from a wider value: floats round to nearest
/// even, float to integer truncates toward zero, integers wrap, non-zero is true.
fn encode(t: DataType, v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| -> Vec<u8> {
            let int = x.trunc() as i64;
            match t {
                DataType::F32 => (x as f32).to_le_bytes().to_vec(),
                DataType::F16 => f16::from_f64(x).to_le_bytes().to_vec(),
                DataType::I32 => (int as i32).to_le_bytes().to_vec(),
                DataType::I64 => int.to_le_bytes().to_vec(),
                DataType::U8 | DataType::I8 => vec![int as u8],
                DataType::Bool => vec![u8::from(x != 0.0)],
                _ => unreachable!(),
            }
        })
        .collect()
}

#[test]
fn cast_covers_every_pair_of_supported_types() {
    use DataType::{Bool, F16, F32, I8, I32, I64, U8};
    let types = [F32, F16, I32, I64, Bool, U8, I8];
    let values = [
        0.0, 1.0, -1.0, 2.0, -3.0, 100.0, -100.0, 127.0, -128.0, 42.0, 2.5, -2.5, 0.75, -0.75,
        255.0, 200.0, -0.0, 7.0,
    ];
    for from in types {
        let x = tensor(from, &[values.len() as i64], encode(from, &values));
        let exact = x.to_f64s();
        for to in types {
            if to == from {
                continue;
            }
            let r = run_op("Cast", &cast_to(to), vec![data(x.clone())]).unwrap();
            assert_eq!(r.outputs[0].dtype, to);
            assert_eq!(
                out_bytes(&r),
                encode(to, &exact),
                "Cast {from:?} -> {to:?} of {exact:?}"
            );
        }
    }
}

/// A Cast the vector unit cannot do (float64, bfloat16, float8, 4-bit, u16) runs as one AI
/// CPU task, with no AI core kernel, and gives the evaluator's bytes (the ONNX conversions,
/// which `numeric`'s tests pin to ml_dtypes' patterns); the task's time is the AI CPU's
/// launch plus its per-element loop.
#[test]
fn casts_without_a_vector_kernel_run_on_the_ai_cpu() {
    use DataType::{BF16, F4E2M1, F8E4M3FN, F8E5M2FNUZ, F16, F32, F64, I4, I32, U16};
    let x = rand_f32(&[300], -500.0, 500.0, 3);
    let with_specials: Vec<u8> = x
        .data
        .iter()
        .copied()
        .chain(
            [f32::NAN, f32::INFINITY, -0.0, 1e-9]
                .iter()
                .flat_map(|v| v.to_le_bytes()),
        )
        .collect();
    let x = tensor(F32, &[304], with_specials);
    let cfg = preset();
    for (from, to) in [
        (F32, F64),
        (F32, BF16),
        (F32, F8E4M3FN),
        (F32, F4E2M1),
        (F32, I4),
        (F16, F8E5M2FNUZ),
        (I32, U16),
        (F64, F16),
        (BF16, F32),
    ] {
        let mode = numeric::CastMode::default();
        let src = tensor(from, &[304], numeric::cast(F32, from, &x.data, mode));
        let r = run_op("Cast", &cast_to(to), vec![data(src.clone())]).unwrap();
        assert!(
            r.launches.is_empty(),
            "{from:?} -> {to:?} launched AI core kernels"
        );
        assert_eq!(r.outputs[0].dtype, to);
        assert_eq!(
            out_bytes(&r),
            numeric::cast(from, to, &src.data, mode),
            "Cast {from:?} -> {to:?}"
        );
    }
    // The time: one AI CPU span, the launch plus 304 elements.
    let (_, sink) = gearsim_host::oprun::run_op_traced(
        &cfg,
        "Cast",
        &cast_to(BF16),
        vec![Some(data(x))],
        &[],
        1,
        ExecMode::Full,
        AiCpuSpans::default(),
    )
    .unwrap();
    let spans = sink.spans;
    let a = &cfg.aicpu;
    let compute_ps = 304 * a.cycles_per_element * 1_000_000 / a.clock_mhz;
    assert_eq!(spans.len(), 1, "one AI CPU span named Cast");
    assert!(
        spans[0] >= a.launch_ns * 1000 + compute_ps,
        "the Cast span lasts {} ps",
        spans[0]
    );
}

/// A trace sink keeping the durations of the spans named `Cast` on AI CPU lanes.
#[derive(Default)]
struct AiCpuSpans {
    names: Vec<String>,
    lanes: Vec<gearsim_traces::Lane>,
    spans: Vec<u64>,
}

impl gearsim_traces::TraceSink for AiCpuSpans {
    fn intern(&mut self, s: &str) -> gearsim_traces::StrId {
        self.names.push(s.to_string());
        gearsim_traces::StrId(self.names.len() as u32 - 1)
    }
    fn lane(&mut self, lane: gearsim_traces::Lane) -> gearsim_traces::LaneId {
        self.lanes.push(lane);
        gearsim_traces::LaneId(self.lanes.len() as u16 - 1)
    }
    fn record(&mut self, record: gearsim_traces::Record) {
        if let gearsim_traces::Record::Span {
            lane,
            name,
            start,
            end,
            ..
        } = record
        {
            let on_aicpu = self.lanes[lane.0 as usize].kind == gearsim_traces::LaneKind::AiCpu;
            if on_aicpu && self.names[name.0 as usize] == "Cast" {
                self.spans.push(end - start);
            }
        }
    }
    fn meta(&mut self, _key: &str, _value: &str) {}
}

#[test]
fn unsupported_types_give_a_lower_error_naming_the_node() {
    let a = tensor(DataType::F64, &[4], vec![0; 32]);
    let e = run_op("Exp", &[], vec![data(a)]).err().unwrap();
    assert!(e.contains("node `node` (Exp)") && e.contains("f64"), "{e}");
}

/// Arithmetic and comparisons the vector unit has no kernel for (unsigned, int16 and int64
/// orderings, integer division, powers and Mod, float64) run as one AI CPU task with numpy's
/// semantics: integers wrap, division truncates, Mod takes the divisor's sign, inputs
/// broadcast.
#[test]
fn arithmetic_without_a_vector_kernel_runs_on_the_ai_cpu() {
    fn ints(t: DataType, v: &[i64]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| x.to_le_bytes()[..t.size()].to_vec())
            .collect()
    }
    let t = |ty: DataType, dims: &[i64], v: &[i64]| data(tensor(ty, dims, ints(ty, v)));
    use DataType::{Bool, I16, I32, I64, U16, U64};
    let cases: Vec<(&str, Vec<In>, Vec<u8>)> = vec![
        (
            "Add",
            vec![
                t(U16, &[2, 3], &[1, 2, 3, 65535, 5, 6]),
                t(U16, &[3], &[10, 20, 1]),
            ],
            ints(U16, &[11, 22, 4, 9, 25, 7]),
        ),
        (
            "Div",
            vec![t(I32, &[4], &[7, -7, 7, 9]), t(I32, &[4], &[2, 2, -2, 0])],
            ints(I32, &[3, -3, -3, 0]),
        ),
        (
            "Greater",
            vec![t(U64, &[3], &[-1, 5, 2]), t(U64, &[1], &[3])],
            ints(Bool, &[1, 1, 0]),
        ),
        (
            "LessOrEqual",
            vec![t(I64, &[3], &[-5, 3, 4]), t(I64, &[3], &[-5, 2, 9])],
            ints(Bool, &[1, 0, 1]),
        ),
        (
            "Max",
            vec![
                t(I16, &[3], &[1, -7, 3]),
                t(I16, &[3], &[-2, -8, 30]),
                t(I16, &[1], &[2]),
            ],
            ints(I16, &[2, 2, 30]),
        ),
        (
            "Pow",
            vec![t(I64, &[3], &[2, -3, 7]), t(I64, &[3], &[10, 3, 0])],
            ints(I64, &[1024, -27, 1]),
        ),
        (
            "Mod",
            vec![t(I32, &[4], &[-4, 7, 5, -7]), t(I32, &[4], &[3, -3, 0, -2])],
            ints(I32, &[2, -2, 0, -1]),
        ),
    ];
    for (op, inputs, want) in cases {
        let r = run_op(op, &[], inputs).unwrap();
        assert!(r.launches.is_empty(), "{op} launched AI core kernels");
        assert_eq!(out_bytes(&r), want, "{op}");
    }
}

// ---- performance -----------------------------------------------------------------------------

/// Bytes moved per cycle of the kernel's run (ascend910: 1 GHz, 1000 ps per cycle).
fn bytes_per_cycle(cfg: &ChipConfig, op: &str, ins: Vec<In>, moved: u64) -> f64 {
    let r = gearsim_host::oprun::run_op(cfg, op, &[], ins, 1, ExecMode::TimingOnly).unwrap();
    let ps: u64 = r.launches.iter().map(|l| l.end.0 - l.first_start.0).sum();
    moved as f64 / (ps as f64 / 1000.0)
}

#[test]
fn row_broadcast_streams_near_the_hbm_cap() {
    let cfg = ChipConfig::preset("ascend910").unwrap();
    let (m, n) = (1024i64, 4096i64);
    let a = Tensor::new(DataType::F32, vec![m, n], vec![0; (m * n * 4) as usize]).unwrap();
    let b = Tensor::new(DataType::F32, vec![n], vec![0; (n * 4) as usize]).unwrap();
    let moved = (2 * m * n * 4) as u64;
    let rate = bytes_per_cycle(&cfg, "Add", vec![data(a), data(b)], moved);
    assert!(
        rate > 0.8 * 1200.0,
        "row-broadcast Add moves {rate:.0} B/cycle"
    );
}

/// Issue 16's unary operators against f64 references, on one tile, many tiles and every core:
/// the piecewise activations over [-20, 20] (both branches and the switch point), Exp where
/// it stays finite, Log and Reciprocal on positive values, Floor and Ceil exactly.
#[test]
fn new_unary_ops_match_f64_references() {
    type Reference = fn(f64) -> f64;
    /// Op, attributes, reference, input range, relative tolerance.
    type Case = (
        &'static str,
        Vec<(&'static str, Attr)>,
        Reference,
        (f32, f32),
        f64,
    );
    let float = |n: &'static str, v: f32| (n, Attr::Float(v));
    let cases: Vec<Case> = vec![
        ("Exp", vec![], f64::exp, (-20.0, 20.0), 2e-6),
        ("Log", vec![], f64::ln, (1e-3, 1e3), 2e-6),
        ("Reciprocal", vec![], |x| 1.0 / x, (0.01, 100.0), 2e-6),
        ("Neg", vec![], |x| -x, (-20.0, 20.0), 0.0),
        ("Abs", vec![], f64::abs, (-20.0, 20.0), 0.0),
        ("Floor", vec![], f64::floor, (-20.0, 20.0), 0.0),
        ("Ceil", vec![], f64::ceil, (-20.0, 20.0), 0.0),
        ("Round", vec![], f64::round_ties_even, (-20.0, 20.0), 0.0),
        ("Sign", vec![], f64::signum, (-20.0, 20.0), 0.0),
        (
            "Softplus",
            vec![],
            |x| x.max(0.0) + (-x.abs()).exp().ln_1p(),
            (-20.0, 20.0),
            2e-6,
        ),
        (
            "Softsign",
            vec![],
            |x| x / (1.0 + x.abs()),
            (-20.0, 20.0),
            2e-6,
        ),
        (
            "LeakyRelu",
            vec![float("alpha", 0.1)],
            |x| if x < 0.0 { 0.1f32 as f64 * x } else { x },
            (-20.0, 20.0),
            1e-6,
        ),
        (
            "Elu",
            vec![],
            |x| if x < 0.0 { x.exp_m1() } else { x },
            (-20.0, 20.0),
            2e-6,
        ),
        (
            "Selu",
            vec![],
            |x| {
                1.050_701f32 as f64
                    * if x <= 0.0 {
                        1.673_263_2f32 as f64 * x.exp_m1()
                    } else {
                        x
                    }
            },
            (-20.0, 20.0),
            2e-6,
        ),
        (
            "Celu",
            vec![float("alpha", 2.0)],
            |x| x.max(0.0) + (2.0 * (x / 2.0).exp_m1()).min(0.0),
            (-20.0, 20.0),
            2e-6,
        ),
        (
            "HardSigmoid",
            vec![],
            |x| (0.2f32 as f64 * x + 0.5).clamp(0.0, 1.0),
            (-20.0, 20.0),
            1e-6,
        ),
        (
            "HardSwish",
            vec![],
            |x| x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            (-20.0, 20.0),
            1e-6,
        ),
        (
            "ThresholdedRelu",
            vec![float("alpha", 0.5)],
            |x| if x > 0.5 { x } else { 0.0 },
            (-20.0, 20.0),
            0.0,
        ),
    ];
    let mut rng = StdRng::seed_from_u64(16);
    for (op, attrs, f, (lo, hi), rtol) in &cases {
        for n in [7usize, 1000, 64 * 1024 + 3] {
            let v: Vec<f32> = (0..n).map(|_| rng.random_range(*lo..*hi)).collect();
            let x = Tensor::from_f32s(vec![n as i64], &v);
            let r = run_op(op, attrs, vec![data(x.clone())]).unwrap();
            let want: Vec<f64> = x.to_f64s().iter().map(|v| f(*v)).collect();
            // Values near 0 where a branch rounds once more (exp(x) - 1) get 1e-7 absolute.
            assert_close(
                &f32s(&r.outputs[0]),
                &want,
                *rtol,
                1e-7,
                &format!("{op} n={n}"),
            );
        }
    }
}
