//! Example kernels give results equal to references computed here.

use gearsim_sim::ExecMode;
use gearsim_tests::*;
use gearsim_traces::NullSink;
use half::f16;

/// fp16 add is exact-then-rounded: the f32 sum of two f16 values rounded once to f16
/// (round to nearest, ties to even) is the correctly rounded f16 sum.
#[test]
fn vector_add_1mi_fp16_over_32_cores_matches_reference() {
    let mut dev = device("ascend910", NullSink);
    let n = 1 << 20;
    let (x, y, z, report) = run_vadd(&mut dev, n, 32, ExecMode::Full, 7);
    assert_eq!(report.cores_used, 32);
    for i in 0..n {
        let want = f16::from_f32(x[i].to_f32() + y[i].to_f32());
        assert_eq!(
            z[i].to_bits(),
            want.to_bits(),
            "element {i}: {} + {}",
            x[i],
            y[i]
        );
    }
}

/// 256x256x256 matmul tiled over four blocks (nd2nz, load2d, mmad, L0C -> UB -> GM) equals an
/// f32 reference. The cube multiplies f16 values exactly in f32 and accumulates in f32 in
/// ascending k order, so the reference below (same order) matches bit for bit.
#[test]
fn matmul_256_tiling_matches_reference() {
    let mut dev = device("ascend910", NullSink);
    let n = 256;
    let mut rng = Rng::new(11);
    let a = rng.f16s(n * n, -2.0, 2.0);
    let b = rng.f16s(n * n, -2.0, 2.0);
    let pa = upload(&mut dev, &f16_bytes(&a));
    let pb = upload(&mut dev, &f16_bytes(&b));
    let pc = dev.alloc((n * n * 4) as u64).unwrap();
    let k = dev.load_kernel(example_kernel("matmul_256")).unwrap();
    let report = dev
        .launch(k, 4, &[pa.0, pb.0, pc.0], ExecMode::Full)
        .unwrap();
    assert_eq!(report.cube_macs(), (n * n * n) as u64);
    let c = f32_from_bytes(&download(&mut dev, pc, n * n * 4));
    for i in 0..n {
        for j in 0..n {
            let mut acc = 0f32;
            for kk in 0..n {
                acc += a[i * n + kk].to_f32() * b[kk * n + j].to_f32();
            }
            assert_eq!(c[i * n + j], acc, "C[{i}][{j}]");
        }
    }
}
