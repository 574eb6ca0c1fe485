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
    ld.gm.u64 x3