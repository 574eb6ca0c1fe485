//! Lowered MatMul and Gemm run on the simulated chip through `firmware::Device` and match f64
//! references computed here: odd shapes (tails in every dimension, edge tiles, a K tail inside a
//! stage), 1-D operands, batched and broadcast operands, constant (packed) and runtime operands,
//! f16 and f32 tensors, Gemm's transposes, alpha, beta and every form of C; products large
//! enough for several tiles per core and several L1 stages per tile; and the reference
//! workload's efficiency in timing-only mode.
//!
//! Inputs are f16-representable, so the device's only errors are the f16 rounding of the output
//! (and of f32 inputs converted to f16, which are exact here) and f32 accumulation: each element
//! must be within `RTOL * |want| + ATOL * sum_k |a_ik b_kj|`.

use gearsim_compiler::ir::{Attr, DataType, Tensor};
use gearsim_compiler::lower::cube::gemm::{self, Addend, Gemm, InType, OutType, Plan, Src};
use gearsim_compiler::lower::writer::Asm;
use gearsim_firmware::{Device, DevicePtr};
use gearsim_host::oprun::Ran;
use gearsim_host::verify::verify_launch;
use gearsim_sim::ExecMode;
use gearsim_traces::NullSink;
use half::f16;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::device_run::{constant, data, f32s, preset, run_op};

const RTOL: f64 = 1e-2;
const ATOL: f64 = 1e-3;

/// Random f16-representable values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| f16::from_f32(rng.random_range(-1.0f32..1.0)).to_f32())
        .collect()
}

fn tensor(dtype: DataType, dims: &[i64], v: &[f32]) -> Tensor {
    match dtype {
        DataType::F16 => {
            let b = v
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes())
                .collect();
            Tensor::new(DataType::F16, dims.to_vec(), b).unwrap()
        }
        _ => Tensor::from_f32s(dims.to_vec(), v),
    }
}

fn rand_tensor(dtype: DataType, dims: &[i64], seed: u64) -> Tensor {
    let n: i64 = dims.iter().product();
    tensor(dtype, dims, &values(n as usize, seed))
}

/// `C[b] = A[b] · B[b]` over the numpy broadcast of the batch dims, with 1-D operands promoted
/// as MatMul does; returns (values, scales) where scale is sum_k |a||b| per element.
fn matmul_ref(a: &Tensor, b: &Tensor) -> (Vec<f64>, Vec<f64>) {
    let (mut ad, mut bd) = (a.dims.clone(), b.dims.clone());
    if ad.len() == 1 {
        ad.insert(0, 1);
    }
    if bd.len() == 1 {
        bd.push(1);
    }
    let (m, k, n) = (ad[ad.len() - 2], ad[ad.len() - 1], bd[bd.len() - 1]);
    let rank = ad.len().max(bd.len()) - 2;
    let pad = |d: &[i64]| -> Vec<i64> {
        let mut v = vec![1; rank + 2 - d.len()];
        v.extend_from_slice(&d[..d.len() - 2]);
        v
    };
    let (ab, bb) = (pad(&ad), pad(&bd));
    let ob: Vec<i64> = ab.iter().zip(&bb).map(|(x, y)| *x.max(y)).collect();
    let items: i64 = ob.iter().product();
    let (av, bv) = (a.to_f64s(), b.to_f64s());
    let (mut out, mut scale) = (Vec::new(), Vec::new());
    for item in 0..items {
        // The item's index in each operand's batch.
        let (mut rest, mut ia, mut ib, mut sa, mut sb) = (item, 0, 0, 1, 1);
        for d in (0..rank).rev() {
            let i = rest % ob[d];
            rest /= ob[d];
            if ab[d] != 1 {
                ia += i * sa;
            }
            if bb[d] != 1 {
                ib += i * sb;
            }
            sa *= ab[d];
            sb *= bb[d];
        }
        for r in 0..m {
            for c in 0..n {
                let (mut acc, mut s) = (0.0, 0.0);
                for kk in 0..k {
                    let x = av[(ia * m * k + r * k + kk) as usize];
                    let y = bv[(ib * k * n + kk * n + c) as usize];
                    acc += x * y;
                    s += (x * y).abs();
                }
                out.push(acc);
                scale.push(s);
            }
        }
    }
    (out, scale)
}

fn check(r: &Ran, want: &(Vec<f64>, Vec<f64>), what: &str) {
    let got = f32s(&r.outputs[0]);
    assert_eq!(got.len(), want.0.len(), "{what}: element count");
    for (i, ((g, w), s)) in got.iter().zip(&want.0).zip(&want.1).enumerate() {
        let err = (f64::from(*g) - w).abs();
        let bound = RTOL * w.abs() + ATOL * s + 1e-6;
        assert!(
            err <= bound,
            "{what}: element {i} of {} is {g}, expected {w} (error {err:.3e} > bound {bound:.3e})\n{}",
            got.len(),
            r.kernels
                .last()
                .map_or(String::new(), |k| format!("{:?}", k.tiling))
        );
    }
}

fn tiling(r: &Ran, key: &str) -> i64 {
    let k = r.kernels.last().unwrap();
    k.tiling
        .iter()
        .find(|(n, _)| n == key)
        .map_or_else(|| panic!("no tiling {key} in {:?}", k.tiling), |(_, v)| *v)
}

fn matmul_case(dtype: DataType, ad: &[i64], bd: &[i64], consts: (bool, bool), seed: u64) -> Ran {
    let a = rand_tensor(dtype, ad, seed);
    let b = rand_tensor(dtype, bd, seed + 1);
    let wrap = |t: Tensor, c: bool| if c { constant(t) } else { data(t) };
    let what = format!("MatMul {dtype:?} {ad:?} x {bd:?} constants {consts:?}");
    let r = run_op(
        "MatMul",
        &[],
        vec![wrap(a.clone(), consts.0), wrap(b.clone(), consts.1)],
    )
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    check(&r, &matmul_ref(&a, &b), &what);
    r
}

#[test]
fn matmul_f16_odd_shapes_with_runtime_operands() {
    for (i, (m, k, n)) in [
        (1, 1, 1),
        (5, 7, 3),
        (17, 33, 19),
        (64, 64, 64),
        (100, 300, 70),
        (33, 1000, 48),
        (300, 40, 513),
    ]
    .into_iter()
    .enumerate()
    {
        matmul_case(
            DataType::F16,
            &[m, k],
            &[k, n],
            (false, false),
            10 * i as u64,
        );
    }
}

#[test]
fn matmul_with_constant_operands_uses_packed_layouts() {
    for (i, (m, k, n, consts)) in [
        (20, 37, 50, (false, true)),
        (70, 200, 33, (true, false)),
        (48, 530, 260, (true, true)),
        (130, 90, 300, (false, true)),
    ]
    .into_iter()
    .enumerate()
    {
        matmul_case(DataType::F16, &[m, k], &[k, n], consts, 100 + 10 * i as u64);
        matmul_case(DataType::F32, &[m, k], &[k, n], consts, 200 + 10 * i as u64);
    }
}

#[test]
fn matmul_f32_tensors_are_multiplied_as_f16() {
    matmul_case(DataType::F32, &[45, 77], &[77, 29], (false, false), 300);
}

#[test]
fn matmul_one_dimensional_operands() {
    matmul_case(DataType::F16, &[40], &[40, 30], (false, false), 400);
    matmul_case(DataType::F16, &[25, 40], &[40], (false, false), 410);
    matmul_case(DataType::F32, &[19], &[19, 7], (false, true), 420);
}

#[test]
fn matmul_batched_and_broadcast() {
    /// A's dims, B's dims, which are constants.
    type Case<'a> = (&'a [i64], &'a [i64], (bool, bool));
    let cases: [Case<'_>; 7] = [
        (&[2, 3, 20, 30], &[2, 3, 30, 17], (false, false)),
        (&[3, 40, 50], &[50, 60], (false, false)),
        (&[3, 40, 50], &[50, 60], (false, true)),
        (&[40, 50], &[4, 50, 36], (false, false)),
        (&[40, 50], &[4, 50, 36], (true, false)),
        (&[2, 1, 24, 35], &[1, 3, 35, 21], (false, false)),
        (&[2, 1, 24, 35], &[1, 3, 35, 21], (true, true)),
    ];
    for (i, (ad, bd, consts)) in cases.into_iter().enumerate() {
        matmul_case(DataType::F16, ad, bd, consts, 500 + 10 * i as u64);
    }
}

#[test]
fn large_products_run_several_tiles_per_core_and_several_stages_per_tile() {
    // 1300 x 200 x 1700: edge tiles in M and N, about two tiles per block, several stages.
    let r = matmul_case(
        DataType::F16,
        &[1300, 200],
        &[200, 1700],
        (false, false),
        600,
    );
    assert!(
        tiling(&r, "tiles") > tiling(&r, "block_dim"),
        "{:?}",
        r.kernels[0].tiling
    );
    assert!(tiling(&r, "k_stages") >= 2, "{:?}", r.kernels[0].tiling);
    // One stage per tile, two tiles per block.
    let r = matmul_case(DataType::F16, &[1000, 96], &[96, 2100], (false, false), 605);
    assert!(
        tiling(&r, "tiles") > tiling(&r, "block_dim"),
        "{:?}",
        r.kernels[0].tiling
    );
    // The same with packed operands, and batched so that blocks cross batch items.
    matmul_case(
        DataType::F16,
        &[3, 200, 700],
        &[700, 300],
        (false, true),
        610,
    );
    matmul_case(DataType::F16, &[300, 900], &[900, 500], (true, true), 620);
}

// ---- Gemm ----------------------------------------------------------------------------------

/// `alpha · A' · B' + beta · C` with C broadcast to [M, N]; (values, scales).
#[allow(clippy::too_many_arguments)]
fn gemm_ref(
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
    ta: bool,
    tb: bool,
    alpha: f64,
    beta: f64,
) -> (Vec<f64>, Vec<f64>) {
    let (av, bv) = (a.to_f64s(), b.to_f64s());
    let (m, k) = if ta {
        (a.dims[1], a.dims[0])
    } else {
        (a.dims[0], a.dims[1])
    };
    let n = if tb { b.dims[0] } else { b.dims[1] };
    let cv = c.map(Tensor::to_f64s);
    let (mut out, mut scale) = (Vec::new(), Vec::new());
    for r in 0..m {
        for col in 0..n {
            let (mut acc, mut s) = (0.0, 0.0);
            for kk in 0..k {
                let x = if ta {
                    av[(kk * m + r) as usize]
                } else {
                    av[(r * k + kk) as usize]
                };
                let y = if tb {
                    bv[(col * k + kk) as usize]
                } else {
                    bv[(kk * n + col) as usize]
                };
                acc += x * y;
                s += (x * y).abs();
            }
            let mut v = alpha * acc;
            let mut sc = alpha.abs() * s;
            if let (Some(ct), Some(cv)) = (c, &cv) {
                let (rows, cols) = match ct.dims.len() {
                    2 => (ct.dims[0], ct.dims[1]),
                    1 => (1, ct.dims[0]),
                    _ => (1, 1),
                };
                let i = (if rows == 1 { 0 } else { r }) * cols + if cols == 1 { 0 } else { col };
                v += beta * cv[i as usize];
                sc += (beta * cv[i as usize]).abs();
            }
            out.push(v);
            scale.push(sc);
        }
    }
    (out, scale)
}

struct GemmCase<'a> {
    m: i64,
    k: i64,
    n: i64,
    ta: bool,
    tb: bool,
    alpha: Option<f32>,
    beta: Option<f32>,
    c: Option<&'a [i64]>,
    consts: (bool, bool, bool),
    dtype: DataType,
}

fn gemm_case(t: &GemmCase<'_>, seed: u64) {
    let ad = if t.ta { [t.k, t.m] } else { [t.m, t.k] };
    let bd = if t.tb { [t.n, t.k] } else { [t.k, t.n] };
    let a = rand_tensor(t.dtype, &ad, seed);
    let b = rand_tensor(t.dtype, &bd, seed + 1);
    let c = t.c.map(|d| rand_tensor(t.dtype, d, seed + 2));
    let wrap = |x: Tensor, cst: bool| if cst { constant(x) } else { data(x) };
    let mut inputs = vec![wrap(a.clone(), t.consts.0), wrap(b.clone(), t.consts.1)];
    if let Some(c) = &c {
        inputs.push(wrap(c.clone(), t.consts.2));
    }
    let mut attrs = vec![
        ("transA", Attr::Int(i64::from(t.ta))),
        ("transB", Attr::Int(i64::from(t.tb))),
    ];
    if let Some(al) = t.alpha {
        attrs.push(("alpha", Attr::Float(al)));
    }
    if let Some(be) = t.beta {
        attrs.push(("beta", Attr::Float(be)));
    }
    let what = format!(
        "Gemm {:?} {}x{}x{} trans ({}, {}) alpha {:?} beta {:?} C {:?} constants {:?}",
        t.dtype, t.m, t.k, t.n, t.ta, t.tb, t.alpha, t.beta, t.c, t.consts
    );
    let r = run_op("Gemm", &attrs, inputs).unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = gemm_ref(
        &a,
        &b,
        c.as_ref(),
        t.ta,
        t.tb,
        f64::from(t.alpha.unwrap_or(1.0)),
        f64::from(t.beta.unwrap_or(1.0)),
    );
    check(&r, &want, &what);
}

fn base(m: i64, k: i64, n: i64) -> GemmCase<'static> {
    GemmCase {
        m,
        k,
        n,
        ta: false,
        tb: false,
        alpha: None,
        beta: None,
        c: None,
        consts: (false, false, false),
        dtype: DataType::F32,
    }
}

#[test]
fn gemm_transposes_with_runtime_and_constant_operands() {
    let mut seed = 700;
    for ta in [false, true] {
        for tb in [false, true] {
            for consts in [
                (false, false, false),
                (true, true, false),
                (false, true, false),
            ] {
                for dtype in [DataType::F32, DataType::F16] {
                    let t = GemmCase {
                        ta,
                        tb,
                        consts,
                        dtype,
                        ..base(37, 83, 45)
                    };
                    gemm_case(&t, seed);
                    seed += 10;
                }
            }
        }
    }
    // Several tiles and stages with transposed runtime operands.
    let t = GemmCase {
        ta: true,
        tb: true,
        dtype: DataType::F16,
        ..base(300, 700, 290)
    };
    gemm_case(&t, seed);
}

#[test]
fn gemm_alpha_beta_and_every_form_of_c() {
    let c_shapes: [&[i64]; 6] = [&[1], &[45], &[1, 45], &[37, 1], &[37, 45], &[]];
    let mut seed = 900;
    for c in c_shapes {
        for cconst in [false, true] {
            for dtype in [DataType::F32, DataType::F16] {
                let t = GemmCase {
                    alpha: Some(0.5),
                    beta: Some(-1.5),
                    c: Some(c),
                    consts: (false, true, cconst),
                    dtype,
                    ..base(37, 60, 45)
                };
                gemm_case(&t, seed);
                seed += 10;
            }
        }
    }
    // Alpha alone, beta 0 (C ignored), and a bias on a product with several tiles.
    gemm_case(
        &GemmCase {
            alpha: Some(2.0),
            ..base(50, 20, 70)
        },
        seed,
    );
    gemm_case(
        &GemmCase {
            beta: Some(0.0),
            c: Some(&[50, 70]),
            ..base(50, 20, 70)
        },
        seed + 10,
    );
    gemm_case(
        &GemmCase {
            c: Some(&[600]),
            consts: (false, true, true),
            dtype: DataType::F16,
            ..base(520, 400, 600)
        },
        seed + 20,
    );
    gemm_case(
        &GemmCase {
            c: Some(&[330, 270]),
            beta: Some(0.25),
            ..base(330, 300, 270)
        },
        seed + 30,
    );
}

// ---- tiling -------------------------------------------------------------------------------

#[test]
fn every_plan_fits_the_core() {
    let core = gearsim_host::atc::target(&preset()).core;
    for (m, k, n) in [
        (1, 1, 1),
        (2048, 2048, 2048),
        (7, 5000, 9),
        (4096, 64, 4096),
    ] {
        let g = Gemm {
            in_type: InType::F16,
            factor: None,
            name: "t".into(),
            batch: Vec::new(),
            m,
            n,
            k,
            a: Src::Rows {
                arg: 0,
                trans: false,
                ld: k,
            },
            b: Src::Rows {
                arg: 1,
                trans: false,
                ld: n,
            },
            out: 2,
            out_type: OutType::F16,
            ldc: n,
            alpha: 1.0,
            addend: None,
            residual: None,
            relu: false,
        };
        let p = g.plan(&core).unwrap();
        let l1 = p.stages * p.ksub * (p.mb + p.nb) * p.kb * 512;
        assert!(l1 <= core.l1_bytes, "{m}x{k}x{n}: {p:?} needs {l1} B of L1");
        assert!(2 * p.mb * p.kb * 512 <= core.l0a_bytes, "{p:?}");
        assert!(2 * p.nb * p.kb * 512 <= core.l0b_bytes, "{p:?}");
        assert!(p.mb * p.nb * 1024 <= core.l0c_bytes, "{p:?}");
        assert!(u64::from(p.block_dim) <= u64::from(core.cores), "{p:?}");
    }
}

/// A residual is added in f16 next to the bias area's flags: a GEMM with an f32 output or a full
/// C addend cannot take one, and says so instead of emitting a kernel.
#[test]
fn a_residual_needs_an_f16_output_and_no_full_c() {
    let core = gearsim_host::atc::target(&preset()).core;
    let g = |out_type, addend| Gemm {
        in_type: InType::F16,
        factor: None,
        name: "t".into(),
        batch: Vec::new(),
        m: 32,
        n: 48,
        k: 16,
        a: Src::Packed { arg: 0 },
        b: Src::Rows {
            arg: 1,
            trans: false,
            ld: 48,
        },
        out: 2,
        out_type,
        ldc: 48,
        alpha: 1.0,
        addend,
        residual: Some(4),
        relu: true,
    };
    assert!(
        g(OutType::F16, Some(Addend::Rows { arg: 3 }))
            .plan(&core)
            .is_ok()
    );
    for bad in [
        g(OutType::F32, None),
        g(OutType::F16, Some(Addend::Full { arg: 3, beta: 1.0 })),
    ] {
        let e = bad.plan(&core).unwrap_err();
        assert!(e.contains("residual"), "{e}");
    }
}

#[test]
fn a_product_whose_panels_overflow_the_l2_walks_its_tiles_in_strips() {
    // Eight cores and an L2 of 16 sets (128 KiB on ascend910): B and an A
    // panel do not fit in half of it, so the blocks' first wave of tiles is a 2 x 4 block
    // instead of one row of eight. On a separated chip the split MIX kernel walks them too.
    let (ad, bd) = ([512i64, 32], [32i64, 2048]);
    let a = rand_tensor(DataType::F16, &ad, 61);
    let b = rand_tensor(DataType::F16, &bd, 62);
    for chip in ["ascend910", "ascend910b2"] {
        let mut cfg = gearsim_sim::ChipConfig::preset(chip).unwrap();
        cfg.core.count = 8;
        cfg.memory.l2_bytes = 16 * cfg.memory.l2_line_bytes * cfg.memory.l2_ways;
        let r = gearsim_host::oprun::run_op(
            &cfg,
            "MatMul",
            &[],
            vec![data(a.clone()), data(b.clone())],
            1,
            ExecMode::Full,
        )
        .unwrap();
        check(
            &r,
            &matmul_ref(&a, &b),
            &format!("MatMul in strips on {chip}"),
        );
        let strip = tiling(&r, "strip_rows");
        assert!(
            strip > 1,
            "{chip}: strip {strip}, {:?}",
            r.kernels.last().unwrap().tiling
        );
    }
    // The same product on the preset's 32 MiB L2 keeps row-major order.
    let r = run_op("MatMul", &[], vec![data(a), data(b)]).unwrap();
    assert_eq!(tiling(&r, "strip_rows"), 1);
}

#[test]
fn strips_cover_every_tile_once() {
    for (mt, nt) in [(1, 1), (4, 8), (6, 5), (16, 32)] {
        for strip in (1..=mt).filter(|s| mt % s == 0) {
            for batch in [1, 3] {
                let mut seen = vec![false; (batch * mt * nt) as usize];
                for t in 0..batch * mt * nt {
                    let (g, r, c) = gemm::tile_coords(t, strip, mt, nt);
                    assert!(g < batch && r < mt && c < nt, "{t}: {g} {r} {c}");
                    let i = ((g * mt + r) * nt + c) as usize;
                    assert!(!seen[i], "tile {t} repeats ({g}, {r}, {c})");
                    seen[i] = true;
                }
                // Within a strip, consecutive tiles walk its rows first.
                if strip > 1 && nt > 1 {
                    assert_eq!(gemm::tile_coords(1, strip, mt, nt), (0, 1, 0));
                }
            }
        }
    }
    assert_eq!(gemm::tile_coords(5, 1, 4, 3), (0, 1, 2));
}

#[test]
fn the_reference_matmul_reaches_85_percent_of_cube_peak() {
    let f = gearsim_host::bench::matmul(&preset()).unwrap();
    assert!(
        f.efficiency() >= f.target,
        "{}: {:.1}% of peak ({} cycles)",
        f.name,
        100.0 * f.efficiency(),
        f.cycles
    );
}

// ---- forced tilings --------------------------------------------------------------------------
//
// The planner picks one tiling per shape; these run the engine directly with chosen plans so
// that every schedule is exercised: one L1 stage (no overlap), short first stages, odd step
// counts (the L0 buffer parity changes between stages and tiles), a K tail in the last stage,
// edge tiles in both dimensions, several tiles per block (loads running ahead into the next
// tile, the previous tile drained during the next one's first stage) and drains that share UB
// buffer sets between groups.

/// Device bytes of f16 values.
fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| f16::from_f32(*x).to_bits().to_le_bytes())
        .collect()
}

/// Emits `g` with `plan`, checks it statically, runs it in full mode on `args` (the output
/// argument `g.out` allocated with `out_bytes`) and returns the output bytes.
fn run_plan(g: &Gemm, plan: &Plan, args: &[Vec<u8>], out_bytes: usize) -> Vec<u8> {
    let cfg = preset();
    let core = gearsim_host::atc::target(&cfg).core;
    let mut asm = Asm::new(&g.name);
    gemm::emit(g, plan, &core, &mut asm);
    let f = asm.finish().unwrap();
    let mut dev = Device::new(cfg.clone(), NullSink);
    let mut bufs = Vec::new();
    for (i, bytes) in args.iter().enumerate() {
        let len = if i == g.out { out_bytes } else { bytes.len() };
        let p = dev.alloc(len as u64).unwrap();
        if i == g.out {
            dev.fill(p, len as u64, 0xff).unwrap();
        } else {
            dev.write(p, bytes).unwrap();
        }
        bufs.push((len as u64, p.0));
    }
    let report = verify_launch(&f.program, plan.block_dim, &bufs, &cfg);
    assert!(report.is_ok(), "{plan:?}: {report}");
    let listing = f.program.listing(&f.comments);
    let handle = dev.load_kernel(f.program).unwrap();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.1).collect();
    dev.launch(handle, plan.block_dim, &ptrs, ExecMode::Full)
        .unwrap_or_else(|e| panic!("{plan:?}: {e}\n{listing}"));
    let mut out = vec![0u8; out_bytes];
    dev.read(DevicePtr(bufs[g.out].1), &mut out).unwrap();
    out
}

/// A row-major `m x n` result of `alpha * A B + c` against the reference (f16 or f32 bytes).
#[allow(clippy::too_many_arguments)]
fn check_plan_result(
    got: &[u8],
    out: OutType,
    av: &[f32],
    bv: &[f32],
    c: Option<&[f32]>,
    (m, k, n): (usize, usize, usize),
    alpha: f64,
    what: &str,
) {
    let got: Vec<f32> = match out {
        OutType::F16 => got
            .chunks_exact(2)
            .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
            .collect(),
        OutType::F32 => got
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        OutType::I32 => got
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32)
            .collect(),
        OutType::Bf16 => got
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    };
    for r in 0..m {
        for col in 0..n {
            let (mut acc, mut s) = (0.0, 0.0);
            for kk in 0..k {
                let x = f64::from(av[r * k + kk]) * f64::from(bv[kk * n + col]);
                acc += x;
                s += x.abs();
            }
            let add = c.map_or(0.0, |c| f64::from(c[r * n + col]));
            let want = alpha * acc + add;
            let g = f64::from(got[r * n + col]);
            let bound = RTOL * want.abs() + ATOL * (alpha.abs() * s + add.abs()) + 1e-6;
            assert!(
                (g - want).abs() <= bound,
                "{what}: C[{r}][{col}] is {g}, expected {want}"
            );
        }
    }
}

/// An f16 product of row-major A (argument 0) and B (argument 1) into an `out` result
/// (argument 2) with nothing else: the base the forced-plan tests change.
fn rows_gemm(name: &str, (m, k, n): (usize, usize, usize), out: OutType) -> Gemm {
    Gemm {
        in_type: InType::F16,
        factor: None,
        name: name.into(),
        batch: Vec::new(),
        m: m as u64,
        n: n as u64,
        k: k as u64,
        a: Src::Rows {
            arg: 0,
            trans: false,
            ld: k as u64,
        },
        b: Src::Rows {
            arg: 1,
            trans: false,
            ld: n as u64,
        },
        out: 2,
        out_type: out,
        ldc: n as u64,
        alpha: 1.0,
        addend: None,
        residual: None,
        relu: false,
    }
}

fn forced(mb: u64, nb: u64, kb: u64, ksub: u64, first: u64, stages: u64, blocks: u32) -> Plan {
    Plan {
        mb,
        nb,
        kb,
        ksub,
        first,
        stages,
        groups: 4.min(nb),
        block_dim: blocks,
        strip: 1,
    }
}

#[test]
fn forced_plans_cover_every_schedule() {
    // 200 x 300 x 150: tiles of 64 x 48 leave 8-row and 6-column edges; K = 300 is 19
    // fractals, so 3-fractal steps end in a 1-fractal step.
    let (m, k, n) = (200usize, 300usize, 150usize);
    let av = values(m * k, 1000);
    let bv = values(k * n, 1001);
    let plans = [
        forced(4, 3, 3, 1, 1, 1, 5),
        forced(4, 3, 3, 1, 1, 2, 7),
        forced(4, 3, 3, 3, 1, 3, 4),
        forced(4, 3, 3, 2, 2, 4, 16),
        forced(4, 3, 2, 4, 3, 2, 3),
        forced(4, 3, 3, 7, 7, 2, 6),
        forced(13, 10, 4, 2, 1, 4, 2),
        // Tiles walked in strips of 2 and 4 rows (4 x 4 tiles, edges in the last row and
        // column): a block's tiles change row and column between neighbours.
        Plan {
            strip: 2,
            ..forced(4, 3, 3, 2, 2, 4, 3)
        },
        Plan {
            strip: 4,
            ..forced(4, 3, 3, 1, 1, 2, 5)
        },
    ];
    for (transposed, packed) in [(false, false), (true, false), (false, true)] {
        for plan in &plans {
            let (a_src, b_src, a_bytes, b_bytes) = if packed {
                (
                    Src::Packed { arg: 0 },
                    Src::Packed { arg: 1 },
                    gemm::pack_a(&av, 1, m as u64, k as u64, plan),
                    gemm::pack_b(&bv, 1, k as u64, n as u64, plan),
                )
            } else if transposed {
                let at: Vec<f32> = (0..k * m).map(|i| av[(i % m) * k + i / m]).collect();
                let bt: Vec<f32> = (0..n * k).map(|i| bv[(i % k) * n + i / k]).collect();
                (
                    Src::Rows {
                        arg: 0,
                        trans: true,
                        ld: m as u64,
                    },
                    Src::Rows {
                        arg: 1,
                        trans: true,
                        ld: k as u64,
                    },
                    f16_bytes(&at),
                    f16_bytes(&bt),
                )
            } else {
                (
                    Src::Rows {
                        arg: 0,
                        trans: false,
                        ld: k as u64,
                    },
                    Src::Rows {
                        arg: 1,
                        trans: false,
                        ld: n as u64,
                    },
                    f16_bytes(&av),
                    f16_bytes(&bv),
                )
            };
            let g = Gemm {
                in_type: InType::F16,
                factor: None,
                name: "forced".into(),
                batch: Vec::new(),
                m: m as u64,
                n: n as u64,
                k: k as u64,
                a: a_src,
                b: b_src,
                out: 2,
                out_type: OutType::F16,
                ldc: n as u64,
                alpha: 1.0,
                addend: None,
                residual: None,
                relu: false,
            };
            let got = run_plan(&g, plan, &[a_bytes, b_bytes, Vec::new()], m * n * 2);
            let what = format!("{plan:?} transposed {transposed} packed {packed}");
            check_plan_result(&got, OutType::F16, &av, &bv, None, (m, k, n), 1.0, &what);
        }
    }
}

#[test]
fn forced_plans_with_a_full_c_share_ub_sets_between_groups() {
    // 256 x 256 tiles of an f32 result with a full f32 C: two UB sets for four groups, so the
    // drains alternate V and MTE3 group by group.
    let (m, k, n) = (300usize, 100usize, 520usize);
    let av = values(m * k, 1100);
    let bv = values(k * n, 1101);
    let cv = values(m * n, 1102);
    for plan in [forced(16, 16, 4, 2, 1, 4, 3), forced(16, 16, 4, 1, 1, 2, 2)] {
        for (out, beta) in [(OutType::F32, 1.0f32), (OutType::F16, -0.5)] {
            let g = Gemm {
                alpha: 0.5,
                addend: Some(Addend::Full { arg: 3, beta }),
                ..rows_gemm("forced_c", (m, k, n), out)
            };
            let c_bytes: Vec<u8> = cv.iter().flat_map(|x| x.to_le_bytes()).collect();
            let got = run_plan(
                &g,
                &plan,
                &[f16_bytes(&av), f16_bytes(&bv), Vec::new(), c_bytes],
                m * n * out.bytes() as usize,
            );
            let c: Vec<f32> = cv.iter().map(|x| x * beta).collect();
            let what = format!("{plan:?} {out:?}");
            check_plan_result(&got, out, &av, &bv, Some(&c), (m, k, n), 0.5, &what);
        }
    }
}

/// A random int8 tensor.
fn i8_tensor(dims: &[i64], seed: u64) -> Tensor {
    let n: i64 = dims.iter().product();
    let mut rng = StdRng::seed_from_u64(seed);
    let v: Vec<u8> = (0..n)
        .map(|_| rng.random_range(-128i32..128) as i8 as u8)
        .collect();
    Tensor::new(DataType::I8, dims.to_vec(), v).unwrap()
}

/// MatMulInteger on the cube's i8 path gives the exact i32 product on the coupled 910 (drained
/// through UB) and on the 910B (a MIX kernel: the AIC's FIXPIPE writes the accumulators, the
/// AIVs move them), for shapes with partial fractals, several K steps and a batch dim folded
/// into M; the cube does 8192 MACs per fractal product.
#[test]
fn matmul_integer_is_exact_on_the_i8_cube_path() {
    for preset_name in ["ascend910", "ascend910b2"] {
        let cfg = gearsim_sim::ChipConfig::preset(preset_name).unwrap();
        for (dims, k, n, seed) in [
            (vec![20i64, 70], 70i64, 24i64, 1u64),
            (vec![2, 33, 600], 600, 130, 2),
            (vec![64, 2048], 2048, 64, 3),
        ] {
            let a = i8_tensor(&dims, seed);
            let w = i8_tensor(&[k, n], seed + 100);
            let ran = gearsim_host::oprun::run_op(
                &cfg,
                "MatMulInteger",
                &[],
                vec![data(a.clone()), constant(w.clone())],
                1,
                ExecMode::Full,
            )
            .unwrap_or_else(|e| panic!("{preset_name} {dims:?}: {e}"));
            let out = &ran.outputs[0];
            assert_eq!(out.dtype, DataType::I32);
            let (x, y) = (a.to_i64s(), w.to_i64s());
            let m = x.len() as i64 / k;
            let want: Vec<i64> = (0..m * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    (0..k)
                        .map(|kk| x[(i * k + kk) as usize] * y[(kk * n + j) as usize])
                        .sum()
                })
                .collect();
            assert_eq!(out.to_i64s(), want, "{preset_name} {dims:?} x [{k}, {n}]");
            let macs: u64 = ran.launches.iter().map(|l| l.cube_macs()).sum();
            let padded = |x: i64, to: i64| (x + to - 1) / to * to;
            assert!(
                macs >= (padded(m, 16) * padded(k, 32) * padded(n, 16)) as u64,
                "{preset_name}: {macs} MACs"
            );
        }
    }
}

/// What the cube's 8-bit path does not take (an odd K, B at run time, uint8 with zero points,
/// a zero point per row) runs on the AI CPU, exactly; an `a_zero_point` missing before a
/// `b_zero_point` is refused by name.
#[test]
fn matmul_integer_falls_back_to_the_ai_cpu_exactly() {
    let cfg = gearsim_sim::ChipConfig::preset("ascend910b2").unwrap();
    let run = |inputs: Vec<Option<gearsim_host::oprun::In>>| {
        gearsim_host::oprun::run_op_optional(&cfg, "MatMulInteger", &[], inputs, 1, ExecMode::Full)
    };
    let u8_tensor = |dims: &[i64], seed: u64| {
        let t = i8_tensor(dims, seed);
        Tensor::new(DataType::U8, dims.to_vec(), t.data.to_vec()).unwrap()
    };
    let reference = |a: &Tensor, b: &Tensor, za: &[i64], zb: &[i64]| -> Vec<i64> {
        let (x, y) = (a.to_i64s(), b.to_i64s());
        let (k, n) = (b.dims[0], b.dims[1]);
        let m = x.len() as i64 / k;
        let at = |z: &[i64], i: i64| if z.len() == 1 { z[0] } else { z[i as usize] };
        (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                (0..k)
                    .map(|kk| {
                        (x[(i * k + kk) as usize] - at(za, i))
                            * (y[(kk * n + j) as usize] - at(zb, j))
                    })
                    .sum()
            })
            .collect()
    };
    // Odd K with a constant B; B at run time.
    for (a, b, b_const) in [
        (i8_tensor(&[4, 7], 1), i8_tensor(&[7, 4], 2), true),
        (i8_tensor(&[4, 8], 3), i8_tensor(&[8, 4], 4), false),
    ] {
        let bin = if b_const {
            constant(b.clone())
        } else {
            data(b.clone())
        };
        let ran = run(vec![Some(data(a.clone())), Some(bin)]).unwrap();
        assert!(ran.kernels.is_empty(), "no AI core kernel");
        assert_eq!(ran.outputs[0].to_i64s(), reference(&a, &b, &[0], &[0]));
    }
    // uint8 with zero points: one for A's rows, one per column of B.
    let (a, b) = (u8_tensor(&[5, 6], 5), u8_tensor(&[6, 3], 6));
    let za = Tensor::new(DataType::U8, vec![5], vec![1, 2, 3, 4, 5]).unwrap();
    let zb = Tensor::new(DataType::U8, vec![3], vec![128, 0, 7]).unwrap();
    let ran = run(vec![
        Some(data(a.clone())),
        Some(data(b.clone())),
        Some(constant(za)),
        Some(constant(zb)),
    ])
    .unwrap();
    assert_eq!(
        ran.outputs[0].to_i64s(),
        reference(&a, &b, &[1, 2, 3, 4, 5], &[128, 0, 7])
    );
    let e = run(vec![
        Some(data(i8_tensor(&[4, 8], 1))),
        Some(constant(i8_tensor(&[8, 4], 2))),
        None,
        Some(constant(
            Tensor::new(DataType::I8, vec![], vec![3]).unwrap(),
        )),
    ])
    .err()
    .unwrap_or_default();
    assert!(e.contains("b_zero_point without a_zero_point"), "{e}");
}

/// A fused dequantisation by one scale: on the 910B the FIXPIPE dequantises the i32
/// accumulators on the way out (`quant=deq`, an AIC-only kernel); on the 910 the vector unit
/// does; both give `f16(f32(acc) · scale)` exactly.
#[test]
fn a_one_scale_dequantisation_is_the_fixpipes_on_a_910b() {
    use gearsim_isa::{Instruction, Quant};
    let (m, k, n) = (24i64, 64i64, 40i64);
    let (a, w) = (i8_tensor(&[m, k], 31), i8_tensor(&[k, n], 32));
    let scale = half::f16::from_f32(0.003);
    let s = Tensor::new(DataType::F16, vec![], scale.to_le_bytes().to_vec()).unwrap();
    let want = dequantised_ref(&a, &w, &s);
    for preset_name in ["ascend910", "ascend910b2"] {
        let ran = dequantised_product(preset_name, &a, &w, &s);
        assert_eq!(f16_bits(&ran.outputs[0]), want, "{preset_name}");
        if preset_name == "ascend910b2" {
            let k = &ran.kernels[0];
            assert!(k.mix.is_none(), "an AIC-only kernel");
            assert!(
                k.program
                    .instrs
                    .iter()
                    .any(|i| matches!(i, Instruction::CopyL0cToGm(f) if f.quant == Quant::Deq)),
                "the FIXPIPE dequantises"
            );
        }
    }
}

/// `f16(f32(A·W) · scale)` of an i8 product, one scale or one per column, as bits.
fn dequantised_ref(a: &Tensor, w: &Tensor, scale: &Tensor) -> Vec<u16> {
    let (k, n) = (w.dims[0], w.dims[1]);
    let m = a.dims.iter().product::<i64>() / k;
    let (x, y, sv) = (a.to_i64s(), w.to_i64s(), scale.to_f64s());
    (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            let acc: i64 = (0..k)
                .map(|kk| x[(i * k + kk) as usize] * y[(kk * n + j) as usize])
                .sum();
            let s = sv[if sv.len() == 1 { 0 } else { j as usize }] as f32;
            half::f16::from_f32(acc as f32 * s).to_bits()
        })
        .collect()
}

/// A MatMulInteger with a fused dequantisation by `scale`, run on preset `preset_name`.
fn dequantised_product(preset_name: &str, a: &Tensor, w: &Tensor, scale: &Tensor) -> Ran {
    let cfg = gearsim_sim::ChipConfig::preset(preset_name).unwrap();
    gearsim_host::oprun::run_op_optional(
        &cfg,
        "MatMulInteger",
        &[(gearsim_compiler::fusion::FUSED_DEQUANT, Attr::Int(1))],
        vec![
            Some(data(a.clone())),
            Some(constant(w.clone())),
            None,
            None,
            Some(constant(scale.clone())),
        ],
        1,
        ExecMode::Full,
    )
    .unwrap_or_else(|e| panic!("{preset_name}: {e}"))
}

/// An f16 tensor's bits.
fn f16_bits(t: &Tensor) -> Vec<u16> {
    t.data
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

/// A bf16 MatMul on a 910B: bf16 products accumulated in f32 by the cube, rounded once to bf16
/// by the FIXPIPE (an AIC-only kernel), for a constant B (packed as bf16) and a B at run time;
/// a coupled 910 has no bf16 and says so.
#[test]
fn a_bf16_matmul_runs_on_the_910b_cube_and_fixpipe() {
    let (m, k, n) = (40usize, 48usize, 24usize);
    let bf16_tensor = |dims: &[usize], seed: u64| {
        let mut rng = StdRng::seed_from_u64(seed);
        let v: Vec<u8> = (0..dims.iter().product::<usize>())
            .flat_map(|_| half::bf16::from_f32(rng.random_range(-2.0f32..2.0)).to_le_bytes())
            .collect();
        Tensor::new(DataType::BF16, dims.iter().map(|d| *d as i64).collect(), v).unwrap()
    };
    let vals = |t: &Tensor| -> Vec<f32> {
        t.data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    };
    let (a, w) = (bf16_tensor(&[m, k], 41), bf16_tensor(&[k, n], 42));
    let (x, y) = (vals(&a), vals(&w));
    let want: Vec<u16> = (0..m * n)
        .map(|e| {
            let (i, j) = (e / n, e % n);
            let mut acc = 0f32;
            for kk in 0..k {
                acc += x[i * k + kk] * y[kk * n + j];
            }
            half::bf16::from_f32(acc).to_bits()
        })
        .collect();
    let b2 = gearsim_sim::ChipConfig::preset("ascend910b2").unwrap();
    for b_in in [constant(w.clone()), data(w.clone())] {
        let ran = gearsim_host::oprun::run_op(
            &b2,
            "MatMul",
            &[],
            vec![data(a.clone()), b_in],
            1,
            ExecMode::Full,
        )
        .unwrap();
        assert_eq!(ran.outputs[0].dtype, DataType::BF16);
        let got: Vec<u16> = ran.outputs[0]
            .data
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(got, want);
        assert!(ran.kernels.iter().all(|k| k.mix.is_none()), "AIC-only");
    }
    let e = run_op("MatMul", &[], vec![data(a), constant(w)])
        .err()
        .unwrap_or_default();
    assert!(
        e.contains("bf16 product needs a chip with a FIXPIPE"),
        "{e}"
    );
}

/// Kernel spans (first block's start to last block's end) of a run, in picoseconds.
fn kernel_ps(r: &Ran) -> u64 {
    r.launches.iter().map(|l| l.end.0 - l.first_start.0).sum()
}

/// Whether a run split its product over K: the partial products and the reduction.
fn is_split(r: &Ran) -> bool {
    let names: Vec<&str> = r.kernels.iter().map(|k| k.name.as_str()).collect();
    names.iter().any(|n| n.contains("_splitk")) && names.iter().any(|n| n.contains("_reduce"))
}

/// The preset with launches too dear for any split (the whole product's plan, to compare).
fn never_split(cfg: &gearsim_sim::ChipConfig) -> gearsim_sim::ChipConfig {
    let mut c = cfg.clone();
    c.scheduler.kernel_launch_ns = 1_000_000_000;
    c
}

/// Split-K: a product whose `M × N` tiles leave most of the 310P's eight cores idle and whose
/// K is long is cut into K slices (partial sums in the workspace, then a vector reduction that
/// applies the epilogue): for a MatMul with a fused ReLU, a Gemm with transposes,
/// alpha, beta and a per-column C, and a constant A, the result stays within the f16
/// tolerance, and the two kernels, one launch included, take less device time than the one
/// kernel of the whole product.
#[test]
fn a_product_with_few_tiles_and_a_long_k_is_split_over_k() {
    use gearsim_compiler::fusion::FUSED_ACTIVATION;
    let cfg = gearsim_sim::ChipConfig::preset("ascend310p").unwrap();
    let launch_ps = cfg.scheduler.kernel_launch_ns * 1000;
    let run = |cfg: &gearsim_sim::ChipConfig,
               op: &str,
               attrs: &[(&str, Attr)],
               inputs: &[Option<gearsim_host::oprun::In>]| {
        gearsim_host::oprun::run_op_optional(cfg, op, attrs, inputs.to_vec(), 1, ExecMode::Full)
            .unwrap_or_else(|e| panic!("{op}: {e}"))
    };
    let compare = |op: &str,
                   attrs: &[(&str, Attr)],
                   inputs: Vec<Option<gearsim_host::oprun::In>>,
                   want: &(Vec<f64>, Vec<f64>)| {
        let split = run(&cfg, op, attrs, &inputs);
        assert!(
            is_split(&split),
            "{op}: {:?}",
            split.kernels.iter().map(|k| &k.name).collect::<Vec<_>>()
        );
        check(&split, want, op);
        let whole = run(&never_split(&cfg), op, attrs, &inputs);
        assert!(!is_split(&whole));
        check(&whole, want, op);
        let (s, w) = (kernel_ps(&split) + launch_ps, kernel_ps(&whole));
        assert!(
            s < w,
            "{op}: split {s} ps (one launch included), whole {w} ps"
        );
    };
    // MatMul [16, 16384] x [16384, 32], ReLU.
    let (m, k, n) = (16i64, 16384i64, 32i64);
    let a = rand_tensor(DataType::F16, &[m, k], 900);
    let b = rand_tensor(DataType::F16, &[k, n], 901);
    let (mut want, scale) = matmul_ref(&a, &b);
    want.iter_mut().for_each(|w| *w = w.max(0.0));
    compare(
        "MatMul",
        &[(FUSED_ACTIVATION, Attr::Str("Relu".into()))],
        vec![Some(data(a)), Some(constant(b))],
        &(want, scale),
    );
    // Gemm: A' = A^T at run time, B' = B^T constant, alpha 0.5, beta 2, C one per column.
    let (m, k, n) = (16i64, 16384i64, 16i64);
    let a = rand_tensor(DataType::F32, &[k, m], 910);
    let b = rand_tensor(DataType::F32, &[n, k], 911);
    let c = rand_tensor(DataType::F32, &[n], 912);
    let want = gemm_ref(&a, &b, Some(&c), true, true, 0.5, 2.0);
    compare(
        "Gemm",
        &[
            ("transA", Attr::Int(1)),
            ("transB", Attr::Int(1)),
            ("alpha", Attr::Float(0.5)),
            ("beta", Attr::Float(2.0)),
        ],
        vec![Some(data(a)), Some(constant(b)), Some(constant(c))],
        &want,
    );
    // Gemm with a constant A (packed per K slice) and B at run time.
    let (m, k, n) = (16i64, 16384i64, 32i64);
    let a = rand_tensor(DataType::F32, &[m, k], 920);
    let b = rand_tensor(DataType::F32, &[k, n], 921);
    let want = gemm_ref(&a, &b, None, false, false, 1.0, 1.0);
    compare("Gemm", &[], vec![Some(constant(a)), Some(data(b))], &want);
}

/// An i8 product split over K sums exact i32 partials, so its per-channel dequantisation gives
/// the whole product's bits, `f16(f32(acc) · scale[j])`, on the coupled 310P and on the 910B
/// (the partial products on the AICs, the reduction on the AIVs).
#[test]
fn an_i8_product_split_over_k_is_exact() {
    let (m, k, n) = (16i64, 32768i64, 32i64);
    let (a, w) = (i8_tensor(&[m, k], 41), i8_tensor(&[k, n], 42));
    let scales: Vec<f32> = (0..n).map(|j| 0.001 + 0.0001 * j as f32).collect();
    let s = tensor(DataType::F16, &[n], &scales);
    let want = dequantised_ref(&a, &w, &s);
    for preset_name in ["ascend310p", "ascend910b3"] {
        let ran = dequantised_product(preset_name, &a, &w, &s);
        assert!(
            is_split(&ran),
            "{preset_name}: {:?}",
            ran.kernels.iter().map(|k| &k.name).collect::<Vec<_>>()
        );
        assert_eq!(f16_bits(&ran.outputs[0]), want, "{preset_name}");
    }
}

/// A product whose tiles already fill the cores is not split.
#[test]
fn a_product_that_fills_the_cores_is_not_split() {
    let r = matmul_case(
        DataType::F16,
        &[512, 2048],
        &[2048, 512],
        (false, true),
        930,
    );
    assert!(
        !is_split(&r),
        "{:?}",
        r.kernels.iter().map(|k| &k.name).collect::<Vec<_>>()
    );
}

/// Emits `g` split in `parts` slices of K (whatever the estimates say), checks both kernels
/// statically and runs them in full mode on `args` as [`run_plan`] does (the partial sums in a
/// buffer of their own), and returns the output bytes.
fn run_split(g: &Gemm, parts: u64, args: &[Vec<u8>], out_bytes: usize) -> Vec<u8> {
    use gearsim_compiler::lower::cube::splitk;
    let cfg = preset();
    let core = gearsim_host::atc::target(&cfg).core;
    let split = splitk::split_in(g, parts, &core).unwrap();
    let mut partial = Asm::new(&split.partial.name);
    gemm::emit(&split.partial, &split.plan, &core, &mut partial);
    let (reduce, reduce_blocks) = splitk::reduce_kernel(g, &split, &core).unwrap();
    let mut dev = Device::new(cfg.clone(), NullSink);
    let mut put = |bytes: Option<&[u8]>, len: usize| {
        let p = dev.alloc(len as u64).unwrap();
        match bytes {
            Some(b) => dev.write(p, b).unwrap(),
            None => dev.fill(p, len as u64, 0xff).unwrap(),
        }
        (len as u64, p.0)
    };
    let (a, b) = (
        put(Some(&args[0]), args[0].len()),
        put(Some(&args[1]), args[1].len()),
    );
    let out = put(None, out_bytes);
    let ws = put(None, (split.parts * split.slice_bytes()) as usize);
    let mut reduce_bufs = vec![ws, out];
    let vectors = [
        g.factor.map(|f| f.arg),
        match g.addend {
            Some(Addend::Cols { arg }) => Some(arg),
            _ => None,
        },
    ];
    for arg in vectors.into_iter().flatten() {
        reduce_bufs.push(put(Some(&args[arg]), args[arg].len()));
    }
    for (asm, blocks, bufs) in [
        (partial, split.plan.block_dim, vec![a, b, ws]),
        (reduce, reduce_blocks, reduce_bufs),
    ] {
        let f = asm.finish().unwrap();
        let report = verify_launch(&f.program, blocks, &bufs, &cfg);
        assert!(report.is_ok(), "{parts} slices: {report}");
        let handle = dev.load_kernel(f.program).unwrap();
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.1).collect();
        dev.launch(handle, blocks, &ptrs, ExecMode::Full)
            .unwrap_or_else(|e| panic!("{parts} slices: {e}"));
    }
    let mut got = vec![0u8; out_bytes];
    dev.read(DevicePtr(out.1), &mut got).unwrap();
    got
}

/// Forced splits over K of every operand layout and epilogue the reduction finishes, at shapes
/// whose reduction spreads over several blocks with a short last block and a tail tile: A
/// row-major or transposed, B transposed at run time or packed, a per-column or a scalar
/// addend, alpha, an f16 or f32 result; an i8 product with per-column scales gives the whole
/// product's bits.
#[test]
fn forced_splits_over_k_cover_every_layout_and_epilogue() {
    use gearsim_compiler::lower::cube::splitk;
    let core = gearsim_host::atc::target(&preset()).core;
    // A [201][2048] rows, B^T [272][2048] at run time, a bias per column, f16 out.
    let (m, k, n) = (201usize, 2048usize, 272usize);
    let av = values(m * k, 1200);
    let bv = values(k * n, 1201);
    let bias = values(n, 1202);
    let bt: Vec<f32> = (0..n * k).map(|i| bv[(i % k) * n + i / k]).collect();
    let mut g = Gemm {
        b: Src::Rows {
            arg: 1,
            trans: true,
            ld: k as u64,
        },
        addend: Some(Addend::Cols { arg: 3 }),
        ..rows_gemm("split_cols", (m, k, n), OutType::F16)
    };
    let c: Vec<f32> = (0..m * n).map(|i| bias[i % n]).collect();
    for parts in [2, 4, 8] {
        let got = run_split(
            &g,
            parts,
            &[
                f16_bytes(&av),
                f16_bytes(&bt),
                Vec::new(),
                gemm::col_fractals(&bias, 1.0),
            ],
            m * n * 2,
        );
        let what = format!("{parts} slices, B transposed, bias per column");
        check_plan_result(
            &got,
            OutType::F16,
            &av,
            &bv,
            Some(&c),
            (m, k, n),
            1.0,
            &what,
        );
    }
    // A^T [768][40] at run time, B packed, alpha 0.5 and a scalar addend, f32 out.
    let (m, k, n) = (40usize, 768usize, 48usize);
    let av = values(m * k, 1210);
    let bv = values(k * n, 1211);
    let at: Vec<f32> = (0..k * m).map(|i| av[(i % m) * k + i / m]).collect();
    g = Gemm {
        name: "split_scalar".into(),
        m: m as u64,
        n: n as u64,
        k: k as u64,
        a: Src::Rows {
            arg: 0,
            trans: true,
            ld: m as u64,
        },
        b: Src::Packed { arg: 1 },
        out_type: OutType::F32,
        ldc: n as u64,
        alpha: 0.5,
        addend: Some(Addend::Scalar { value: 0.25 }),
        ..g
    };
    for parts in [3, 8] {
        let plan = splitk::split_in(&g, parts, &core).unwrap().plan;
        let kc = k as u64 / parts;
        let packed = gemm::pack_b(&bv, parts, kc, n as u64, &plan);
        let got = run_split(&g, parts, &[f16_bytes(&at), packed, Vec::new()], m * n * 4);
        let c = vec![0.25f32; m * n];
        let what = format!("{parts} slices, A transposed, B packed, scalar addend");
        check_plan_result(
            &got,
            OutType::F32,
            &av,
            &bv,
            Some(&c),
            (m, k, n),
            0.5,
            &what,
        );
    }
    // i8: A [37][4096] rows, B packed per slice, a scale per column, f16 out.
    let (m, k, n) = (37usize, 4096usize, 80usize);
    let a = i8_tensor(&[m as i64, k as i64], 1220);
    let w = i8_tensor(&[k as i64, n as i64], 1221);
    let scales: Vec<f32> = (0..n).map(|j| 0.0005 + 0.00001 * j as f32).collect();
    let s = tensor(DataType::F16, &[n as i64], &scales);
    let want = dequantised_ref(&a, &w, &s);
    let weights: Vec<i8> = w.data.iter().map(|b| *b as i8).collect();
    let units = (k / 2) as u64;
    g = Gemm {
        in_type: InType::I8,
        name: "split_i8".into(),
        m: m as u64,
        n: n as u64,
        k: units,
        a: Src::Rows {
            arg: 0,
            trans: false,
            ld: units,
        },
        b: Src::Packed { arg: 1 },
        out_type: OutType::F16,
        ldc: n as u64,
        alpha: 1.0,
        factor: Some(gemm::ColFactor { arg: 3 }),
        addend: None,
        ..g
    };
    let sv: Vec<f32> = s.to_f64s().iter().map(|x| *x as f32).collect();
    for parts in [2, 4] {
        let plan = splitk::split_in(&g, parts, &core).unwrap().plan;
        let packed = splitk::pack_b_i8_slices(&weights, k as u64, n as u64, parts, &plan);
        let got = run_split(
            &g,
            parts,
            &[
                a.data.to_vec(),
                packed,
                Vec::new(),
                gemm::col_fractals(&sv, 1.0),
            ],
            m * n * 2,
        );
        let bits: Vec<u16> = got
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(bits, want, "{parts} slices of an i8 product");
    }
    // What does not split is refused by name.
    let e = splitk::split_in(&Gemm { n: 70, ..g.clone() }, 2, &core).unwrap_err();
    assert!(e.contains("does not split in 2 slices"), "{e}");
}
