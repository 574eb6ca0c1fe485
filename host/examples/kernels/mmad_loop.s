# A cube loop: loads one 128x256 A tile and one 256x128 B tile (already in L0A / L0B fractal
# order in GM), multiplies them `iterations` times into the same L0C tile, then writes the
# 128x128 result (fp16, fractal order) to GM. Measures how close the cube gets to its peak.
# args[0] = A (64 KiB), args[1] = B (64 KiB), args[2] = C (32 KiB per block), args[3] = iterations >= 1.
.kernel mmad_loop
.equ M, 128
.equ K, 256
.equ N, 128

    sreg      x1, args
    ld.gm.u64 x2, x1                # A
    ld.gm.u64 x3, x1, off=8         # B
    ld.gm.u64 x4, x1, off=16        # C
    ld.gm.u64 x5, x1, off=24        # iterations
    sreg      x6, block_idx
    muli      x7, x6, M * N * 2
    add       x4, x4, x7            # this block's C tile
    movi      x10, 0                # L1: A at 0, B at 64 KiB
    movi      x11, 65536
    copy_gm_to_l1 x10, x2, 1, M * K * 2 / 32
    copy_gm_to_l1 x11, x3, 1, K * N * 2 / 32
    set_flag  MTE2, MTE1, 0
    wait_flag MTE2, MTE1, 0
    movi      x12, 0
    load_l0a  x12, x10, M * K / 256
    load_l0b  x12, x11, K * N / 256
    set_flag  MTE1, M, 0
    wait_flag MTE1, M, 0
    mmad      x12, x12, x12, M, K, N, init=true
    addi      x5, x5, -1
    movi      x13, 0
    beq       x5, x13, drain
accumulate:
    mmad      x12, x12, x12, M, K, N
    loop      x5, accumulate
drain:
    set_flag  M, V, 0
    wait_flag M, V, 0
    copy_l0c_to_ub.f16 x12, x12, M * N / 256
    set_flag  V, MTE3, 0
    wait_flag V, MTE3, 0
    copy_ub_to_gm x4, x12, 1, M * N * 2 / 32
    end
