"""Triton kernels of ``l2_discard.py`` (``@triton.jit`` only): write and read back a buffer the
way GEMM2 writes its partial rows and the combine reads them, with and without dropping each
128-byte line from L2 after its read (``discard.global.L2``: invalidated without a write-back)."""

import triton
import triton.language as tl


@triton.jit
def _write_words(p_ptr, base, seed, BLOCK: tl.constexpr):
    """Words ``[base + pid * BLOCK, +BLOCK)`` get a non-zero pattern of ``seed`` (no mask: the
    driver's chunks are whole programs, so the stores stay 16 bytes wide)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = (offs * 40503 + seed) | 0x01000100
    tl.store(p_ptr + base + offs, v)


@triton.jit
def _read_words(p_ptr, base, out_ptr, DISCARD: tl.constexpr, BLOCK: tl.constexpr):
    """Sum (wrapping) of the same words into ``out[pid]``; with ``DISCARD`` each 128-byte line is
    then discarded from L2. The discard takes the sum as an operand, so it cannot issue before
    every load of the program has returned (the sum is a CTA-wide reduction)."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    s = tl.sum(tl.load(p_ptr + base + offs), 0)
    if DISCARD:
        lines = pid * BLOCK + tl.arange(0, BLOCK // 32) * 32  # 32 words = one 128-byte line
        tl.inline_asm_elementwise(
            "discard.global.L2 [$1], 128;\n\tmov.u32 $0, $2;",
            "=r,l,r",
            args=[p_ptr + base + lines, tl.full([BLOCK // 32], 0, tl.int32) + s],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    tl.store(out_ptr + pid, s)
