//! Lowered ops run on the simulated chip through `firmware::Device` and match references
//! computed here, on random inputs including odd sizes (tails, one-block tensors).

use gearsim_host::compiler::ir::Tensor;

use super::device_run::{assert_close, data, f32s, rand_f32, run_op};

fn binary_ref(op: &str, a: f64, b: f64) -> f64 {
    match op {
        "Add" => a + b,
        "Sub" => a - b,
        "Mul" => a * b,
        "Div" => a / b,
        _ => unreachable!(),
    }
}

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
            let want: Vec<f64> = a
                .to_f64s()
                .iter()
                .zip(b.to_f64s())
                .map(|(x, y)| binary_ref(op, *x, y))
                .collect();
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
    let s = Tensor::from_f32s(vec![1], &[1.75]);
    for op in ["Add", "Sub", "Mul", "Div"] {
        for scalar_first in [false, true] {
            let (a, b) = if scalar_first {
                (s.clone(), x.clone())
            } else {
                (x.clone(), s.clone())
            };
            let r = run_op(op, &[], vec![data(a.clone()), data(b.clone())]).unwrap();
            let (av, bv) = (a.to_f64s(), b.to_f64s());
            let want: Vec<f64> = (0..x.len())
                .map(|i| {
                    let ai = if scalar_first { av[0] } else { av[i] };
                    let bi = if scalar_first { bv[i] } else { bv[0] };
                    binary_ref(op, ai, bi)
                })
                .collect();
            assert_close(
                &f32s(&r.outputs[0]),
                &want,
                1e-6,
                1e-7,
                &format!("{op} scalar_first={scalar_first}"),
            );
        }
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
}
