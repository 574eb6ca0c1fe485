//! The cube's other operand types on a separated chip: i8 products with i32 accumulators
//! (twice the f16 MAC rate), the FIXPIPE's dequantisation on the way out (one scale, or one per
//! column from the FIXPIPE buffer), bf16 products, and the bias table's and FIXPIPE buffer's
//! capacities.

use gearsim_firmware::{DeviceError, LaunchReport};
use gearsim_isa::task::KernelKind;
use gearsim_isa::{Pipe, Program};
use gearsim_sim::{Buffer, ExecMode, StopReason};
use gearsim_tests::*;
use gearsim_traces::NullSink;
use half::{bf16, f16};

fn asm(src: &str) -> Program {
    gearsim_isa::assemble(src, "cube_types.s").unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// Runs `src` as a one-block cube kernel without arguments.
fn run_cube(preset: &str, src: &str) -> Result<LaunchReport, DeviceError> {
    let mut dev = device(preset, NullSink);
    let k = dev
        .load_kernel_flags(asm(src), KernelKind::Cube.flags())
        .unwrap();
    dev.launch(k, 1, &[], ExecMode::Full)
}

/// `rows` x `cols` i8 values (row-major, cols along k) as L0A-style fractals: fractal
/// `(r, kb)` at `r * KB + kb`, each 16 rows of 32 values, zero-padded.
fn i8_fractals(v: &[i8], rows: usize, cols: usize) -> Vec<u8> {
    let (rb, kb) = (rows.div_ceil(16), cols.div_ceil(32));
    let mut out = vec![0u8; rb * kb * 512];
    for r in 0..rows {
        for c in 0..cols {
            let at = ((r / 16) * kb + c / 32) * 512 + (r % 16) * 32 + c % 32;
            out[at] = v[r * cols + c] as u8;
        }
    }
    out
}

const M: usize = 20;
const K: usize = 70;
const N: usize = 24;

/// An i8 product of M x K by K x N (B given as N x K, as its n-major L0B fractals hold it),
/// written out three ways: i32 as it is, dequantised by one scale, and per column by scales
/// the FIXPIPE buffer holds.
fn i8_kernel(scale: f32) -> String {
    format!(
        "
    sreg x1, args
    ld.gm.u64 x2, x1
    ld.gm.u64 x3, x1, off=8
    ld.gm.u64 x4, x1, off=16
    ld.gm.u64 x5, x1, off=24
    ld.gm.u64 x6, x1, off=32
    ld.gm.u64 x7, x1, off=40
    movi x10, 0
    movi x11, 8192
    movi x14, 16384
    copy_gm_to_l1 x10, x2, 1, 96
    copy_gm_to_l1 x11, x3, 1, 96
    copy_gm_to_l1 x14, x7, 1, 3
    set_flag MTE2, MTE1, 0
    wait_flag MTE2, MTE1, 0
    movi x12, 0
    load_l0a x12, x10, 6
    load_l0b x12, x11, 6
    set_flag MTE1, M, 0
    wait_flag MTE1, M, 0
    mmad x12, x12, x12, {M}, {K}, {N}, init=true, ty=i8
    set_flag M, FIX, 0
    wait_flag M, FIX, 0
    copy_l0c_to_gm.i32 x4, x12, {M}, {N}, {N}
    movi x13, {bits}
    copy_l0c_to_gm.f16 x5, x12, {M}, {N}, {N}, relu=true, quant=deq, scale=x13
    set_flag MTE2, FIX, 1
    wait_flag MTE2, FIX, 1
    movi x15, 64
    copy_l1_to_fb x15, x14, 1, 3
    pipe_barrier FIX
    copy_l0c_to_gm.bf16 x6, x12, {M}, {N}, {N}, quant=vdeq, scale=x15
    end
",
        bits = scale.to_bits()
    )
}

#[test]
fn an_i8_product_accumulates_in_i32_and_the_fixpipe_dequantises_it() {
    let mut rng = Rng::new(11);
    let mut i8s =
        |n: usize| -> Vec<i8> { (0..n).map(|_| (rng.next_u64() % 256) as u8 as i8).collect() };
    let (a, bt) = (i8s(M * K), i8s(N * K));
    let scales: Vec<f32> = (0..N).map(|j| 0.001 * (j as f32 + 1.0)).collect();
    let scale = 0.0123f32;
    let want: Vec<i32> = (0..M * N)
        .map(|e| {
            let (i, j) = (e / N, e % N);
            (0..K)
                .map(|k| i32::from(a[i * K + k]) * i32::from(bt[j * K + k]))
                .sum()
        })
        .collect();
    let mut dev = device("ascend910b2", NullSink);
    let mut pad = |mut v: Vec<u8>, to: usize| {
        v.resize(to, 0);
        upload(&mut dev, &v)
    };
    let pa = pad(i8_fractals(&a, M, K), 3072);
    let pb = pad(i8_fractals(&bt, N, K), 3072);
    let scale_bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
    let ps = pad(scale_bytes, 96);
    let (o32, o16, obf) = (
        upload(&mut dev, &vec![0u8; M * N * 4]),
        upload(&mut dev, &vec![0u8; M * N * 2]),
        upload(&mut dev, &vec![0u8; M * N * 2]),
    );
    let k = dev
        .load_kernel_flags(asm(&i8_kernel(scale)), KernelKind::Cube.flags())
        .unwrap();
    let r = dev
        .launch(
            k,
            1,
            &[pa.0, pb.0, o32.0, o16.0, obf.0, ps.0],
            ExecMode::Full,
        )
        .unwrap();
    // 2 x 3 x 2 fractal products of 16 x 32 x 16.
    assert_eq!(r.cube_macs(), 12 * 8192);
    let got: Vec<i32> = download(&mut dev, o32, M * N * 4)
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want, "i32 accumulators");
    let deq = f16_from_bytes(&download(&mut dev, o16, M * N * 2));
    for (e, (&g, &w)) in deq.iter().zip(&want).enumerate() {
        let expect = f16::from_f32((w as f32 * scale).max(0.0));
        assert_eq!(
            g.to_bits(),
            expect.to_bits(),
            "deq element {e}: {g} vs {expect}"
        );
    }
    let vdeq: Vec<bf16> = download(&mut dev, obf, M * N * 2)
        .chunks_exact(2)
        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
        .collect();
    for (e, (&g, &w)) in vdeq.iter().zip(&want).enumerate() {
        let expect = bf16::from_f32(w as f32 * scales[e % N]);
        assert_eq!(
            g.to_bits(),
            expect.to_bits(),
            "vdeq element {e}: {g} vs {expect}"
        );
    }
}

/// One `mmad` of `m` x `k` x `n` of type `ty` (operands left as L0 holds them: zeros).
fn mmad_cycles(ty: &str, k: u32) -> u64 {
    let src = format!("movi x1, 0\n mmad x1, x1, x1, 64, {k}, 64, init=true, ty={ty}\n end");
    let r = run_cube("ascend910b2", &src);
    let r = r.unwrap();
    r.core_stats[0].pipe(Pipe::M).busy_cycles
}

#[test]
fn an_i8_fractal_product_does_twice_the_macs_in_the_same_cycle() {
    // 4 x 8 x 4 = 128 fractal products either way: 8192 i8 MACs or 4096 f16 MACs a cycle.
    let (f16_cycles, i8_cycles) = (mmad_cycles("f16", 128), mmad_cycles("i8", 256));
    assert_eq!(f16_cycles, 128);
    assert_eq!(i8_cycles, f16_cycles);
    assert_eq!(
        mmad_cycles("i8", 128),
        64,
        "the same K in i8 takes half the cycles"
    );
    assert_eq!(mmad_cycles("bf16", 128), 128, "bf16 runs at the f16 rate");
}

#[test]
fn a_bf16_product_accumulates_in_f32() {
    let mut rng = Rng::new(5);
    let a: Vec<bf16> = (0..256)
        .map(|_| bf16::from_f32(rng.uniform(-4.0, 4.0)))
        .collect();
    let b: Vec<bf16> = (0..256)
        .map(|_| bf16::from_f32(rng.uniform(-4.0, 4.0)))
        .collect();
    let bytes =
        |v: &[bf16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect() };
    let mut dev = device("ascend910b2", NullSink);
    let (pa, pb) = (upload(&mut dev, &bytes(&a)), upload(&mut dev, &bytes(&b)));
    let out = upload(&mut dev, &[0u8; 1024]);
    let src = "
    sreg x1, args
    ld.gm.u64 x2, x1
    ld.gm.u64 x3, x1, off=8
    ld.gm.u64 x4, x1, off=16
    movi x10, 0
    movi x11, 512
    copy_gm_to_l1 x10, x2, 1, 16
    copy_gm_to_l1 x11, x3, 1, 16
    set_flag MTE2, MTE1, 0
    wait_flag MTE2, MTE1, 0
    movi x12, 0
    load_l0a x12, x10, 1
    load_l0b x12, x11, 1
    set_flag MTE1, M, 0
    wait_flag MTE1, M, 0
    mmad x12, x12, x12, 16, 16, 16, init=true, ty=bf16
    set_flag M, FIX, 0
    wait_flag M, FIX, 0
    copy_l0c_to_gm.f32 x4, x12, 16, 16, 16
    end
";
    let k = dev
        .load_kernel_flags(asm(src), KernelKind::Cube.flags())
        .unwrap();
    dev.launch(k, 1, &[pa.0, pb.0, out.0], ExecMode::Full)
        .unwrap();
    let got = f32_from_bytes(&download(&mut dev, out, 1024));
    for i in 0..16 {
        for j in 0..16 {
            let mut acc = 0f32;
            for k in 0..16 {
                acc += a[i * 16 + k].to_f32() * b[k * 16 + j].to_f32();
            }
            assert_eq!(got[i * 16 + j].to_bits(), acc.to_bits(), "({i}, {j})");
        }
    }
}

fn fault(r: Result<LaunchReport, DeviceError>) -> StopReason {
    match r {
        Err(DeviceError::Fault(s)) => s,
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[test]
fn a_bias_wider_than_the_bias_table_faults_naming_bt() {
    // 16 channel blocks of 16 f32 fill the 1 KiB table; 17 do not.
    let fill = |nblk| format!("movi x1, 0\n broadcast_l1_to_l0c x1, x1, {nblk}, 1\n end");
    let r = run_cube("ascend910b2", &fill(16));
    r.unwrap();
    let r = run_cube("ascend910b2", &fill(17));
    let s = fault(r);
    assert!(
        matches!(
            s,
            StopReason::MemoryFault {
                buffer: Buffer::Bt,
                ..
            }
        ),
        "{s}"
    );
    assert!(s.to_string().contains("BT"), "{s}");
}

#[test]
fn the_fixpipe_buffer_holds_seven_kib_and_vdeq_reads_inside_it() {
    let load = |blocks| format!("movi x1, 0\n copy_l1_to_fb x1, x1, 1, {blocks}\n end");
    let r = run_cube("ascend910b2", &load(224));
    r.unwrap();
    let s = fault(run_cube("ascend910b2", &load(225)));
    assert!(
        matches!(
            s,
            StopReason::MemoryFault {
                buffer: Buffer::Fb,
                ..
            }
        ),
        "{s}"
    );
    // 24 columns of scales from FB byte 7104 run past its end.
    let src = "movi x1, 0\n movi x2, 7104\n copy_l0c_to_gm.f16 x1, x1, 16, 24, 24, quant=vdeq, scale=x2\n end";
    let s = fault(run_cube("ascend910b2", src));
    assert!(
        matches!(
            s,
            StopReason::MemoryFault {
                buffer: Buffer::Fb,
                ..
            }
        ),
        "{s}"
    );
}

#[test]
fn dequantising_to_i32_is_an_assembler_error() {
    let e = gearsim_isa::assemble(
        "movi x1, 0\n copy_l0c_to_gm.i32 x1, x1, 16, 16, 16, quant=deq\n end",
        "q.s",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("quant=deq dequantises to a float type, not i32"),
        "{e}"
    );
    let e = gearsim_isa::assemble(
        "movi x1, 0\n mmad x1, x1, x1, 16, 16, 16, ty=f32\n end",
        "q.s",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("element type f32 is not supported"), "{e}");
}
