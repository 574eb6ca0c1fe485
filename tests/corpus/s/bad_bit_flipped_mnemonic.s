# z = x + y over fp16 vectors, double-buffered: MTE2 loads tile i+1 while V adds tile i and
# MTE3 stores tile i-1. The flags follow the Ascend C TQue pattern: MTE2->V "data ready",
# V->MTE2 "input buffer free", V->MTE3 "result ready", MTE3->V "output buffer free".
# args[0..3] = x, y, z addresses, args[3] = n elements; n / block_dim must be a multiple of
# 2 * TILE. Each block handles a contiguous n / block_dim slice.
.kernel vadd_f16_db
.equ TILE, 16384                    # fp16 elements per tile (32 KiB)
.equ TILE_BYTES, TILE * 2
.equ BLOCKS, TILE_BYTES / 32        # DMA burst length in 32-byte blocks
.equ REPEATS, TILE / 128            # 128 fp16 per vector repeat

    sreg      x1, args
    ld.gm.u64 x2, x1                # x
    ld.gm.u64 x3, x1, off=8         # y
    ld.gm.u64 x4, x1, off=16        # z
    ld.gm.u64 x5, x1, off=24        # n
    sreg      x6, block_idx
    sreg      x7, block_num
    divu      x8, x5, x7            # elements per block
    mul       x9, x8, x6
    shli      x9, x9, 1             # byte offset of this block's slice
    add       x2, x2, x9
    add       x3, x3, x9
    add       x4, x4, x9
    shri      x10, x8, 15           # tile pairs = elements / (2 * TILE)
    movi      x20, 0                # UB: X0 Y0 Z0 X1 Y1 Z1, 32 KiB each
    movi      x21, TILE_BYTES
    movi      x22, TILE_BYTES * 2
    movi      x23, TILE_BYTES * 3
    movi      x24, TILE_BYTES * 4
    movi      x25, TILE_BYTES * 5
    set_flag  V, MTE2, 0            # both input buffers start free
    set_flag  V, MTE2, 1
    set_flag  MTE3, V, 0            # both output buffers start free
    set_flag  MTE3, V, 1
pair:
    wait_flag V, MTE2, 0            # ---- tile in buffer 0
    copy_gm_to_ub x20, x2, 1, BLOCKS
    copy_gm_to_ub x21, x3, 1, BLOCKS
    set_flag  MTE2, V, 0
    wait_flag MTE2, V, 0
    wait_flag MTE3, V, 0
    vadf.f16  x22, x20, x21, repeat=REPEATS
    set_flag  V, MTE2, 0
    set_flag  V, MTE3, 0
    wait_flag V, MTE3, 0
    copy_ub_to_gm x4, x22, 1, BLOCKS
    set_flag  MTE3, V, 0
    addi      x2, x2, TILE_BYTES
    addi      x3, x3, TILE_BYTES
    addi      x4, x4, TILE_BYTES
    wait_flag V, MTE2, 1            # ---- tile in buffer 1
    copy_gm_to_ub x23, x2, 1, BLOCKS
    copy_gm_to_ub x24, x3, 1, BLOCKS
    set_flag  MTE2, V, 1
    wait_flag MTE2, V, 1
    wait_flag MTE3, V, 1
    vadd.f16  x25, x23, x24, repeat=REPEATS
    set_flag  V, MTE2, 1
    set_flag  V, MTE3, 1
    wait_flag V, MTE3, 1
    copy_ub_to_gm x4, x25, 1, BLOCKS
    set_flag  MTE3, V, 1
    addi      x2, x2, TILE_BYTES
    addi      x3, x3, TILE_BYTES
    addi      x4, x4, TILE_BYTES
    loop      x10, pair
    wait_flag V, MTE2, 0            # consume the flags set by the last iteration
    wait_flag V, MTE2, 1
    wait_flag MTE3, V, 0
    wait_flag MTE3, V, 1
    end
