# C = A x B for 256x256 fp16 matrices in row-major GM, fp32 result, one 128x128 output tile
# per block (block_dim 4). Shows the whole cube path of the coupled architecture:
#   GM --MTE2 nd2nz--> L1 (NZ) --MTE1 load2d--> L0A (zZ) / L0B --M mmad--> L0C
#   --V copy_l0c_to_ub--> UB (NZ) --MTE3 strided DMA--> GM (row-major)
# args[0] = A, args[1] = B, args[2] = C (256x256 f32).
.kernel matmul_256
.equ N, 256
.equ T, 128                         # output tile edge

    sreg      x1, args
    ld.gm.u64 x2, x1                # A
    ld.gm.u64 x3, x1, off=8         # B
    ld.gm.u64 x4, x1, off=16        # C
    sreg      x5, block_idx
    shri      x6, x5, 1             # tile row bm
    andi      x7, x5, 1             # tile column bn
    muli      x8, x6, T * N * 2
    add       x2, x2, x8            # A rows [bm*T, +T)
    muli      x9, x7, T * 2
    add       x3, x3, x9            # B columns [bn*T, +T)
    muli      x10, x6, T * N * 4
    muli      x11, x7, T * 4
    add       x4, x4, x10
    add       x4, x4, x11           # C tile origin
    movi      x12, 0                # L1 A: 16 column blocks x 128 rows (NZ)
    movi      x13, 65536            # L1 B: 8 column blocks x 256 rows (NZ)
    copy_gm_to_l1_nd2nz x12, x2, T, N, N, T
    copy_gm_to_l1_nd2nz x13, x3, N, T, N, N
    set_flag  MTE2, MTE1, 0
    wait_flag MTE2, MTE1, 0
    movi      x14, 0                # L0A destination, row block by row block (zZ)
    movi      x15, 0                # L1 source: fractal (mb, kb) sits at (kb * 8 + mb) * 512
    movi      x16, T / 16
a_rows:
    load_l0a  x14, x15, N / 16, src_stride=T / 16
    addi      x14, x14, N / 16 * 512
    addi      x15, x15, 512
    loop      x16, a_rows
    movi      x17, 0
    load_l0b  x17, x13, N * T / 256   # NZ in L1 is already L0B order
    set_flag  MTE1, M, 0
    wait_flag MTE1, M, 0
    mmad      x17, x17, x17, T, N, T, init=true
    set_flag  M, V, 0
    wait_flag M, V, 0
    copy_l0c_to_ub.f32 x17, x17, T * T / 256
    set_flag  V, MTE3, 0
    wait_flag V, MTE3, 0
    movi      x18, 0                # UB column block nb: 128 rows x 64 bytes, contiguous
    mov       x19, x4
    movi      x20, T / 16
c_cols:
    copy_ub_to_gm x19, x18, T, 2, dst_gap=N * 4 / 32 - 2
    addi      x18, x18, T * 64
    addi      x19, x19, 64
    loop      x20, c_cols
    end
