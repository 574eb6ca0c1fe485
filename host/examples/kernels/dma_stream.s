# Streams a GM buffer into UB with back-to-back 64 KiB DMAs (MTE2 only, no consumer).
# args[0] = source address, args[1] = total bytes (a multiple of block_dim * 64 KiB).
# Block i reads bytes [i * n / blocks, (i + 1) * n / blocks) into alternating UB halves.
.kernel dma_stream
.equ CHUNK, 65536

    sreg      x1, args
    ld.gm.u64 x2, x1                # source
    ld.gm.u64 x3, x1, off=8         # total bytes
    sreg      x4, block_idx
    sreg      x5, block_num
    divu      x6, x3, x5            # bytes per block
    mul       x7, x6, x4
    add       x2, x2, x7            # this block's first byte
    movi      x8, CHUNK
    divu      x9, x6, x8            # chunks for this block
    movi      x10, 0
    beq       x9, x10, done
    movi      x11, 0                # UB destination: 0 or CHUNK
next_chunk:
    copy_gm_to_ub x11, x2, 1, CHUNK / 32
    addi      x2, x2, CHUNK
    xori      x11, x11, CHUNK
    loop      x9, next_chunk
done:
    end
