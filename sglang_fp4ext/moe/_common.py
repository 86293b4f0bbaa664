"""JIT helpers the kernel families share (``@triton.jit`` and ``@gluon.jit`` code only).

Triton, used by the ``tl.dot`` decode and prefill kernels and the W4A4 prefill: the FP4 -> bf16
decode (inline PTX on the GPU, the exact fp32 bit trick under the interpreter), the scale codes,
the fp32 -> bf16 rounding and GEMM1's SiLU-mul epilogue. Gluon, used by the Gluon decode
(``decode._gluon_kernels``) and the wgmma prefill (``prefill._wgmma_kernels``): the weight
layouts, the chunk decode into MMA operand order, the code ring's copies and reads, and L2
prefetches. The packed formats are ``moe.layout``'s.
"""

import functools

import triton
import triton.language as tl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from sglang_fp4ext.moe._gluon_compat import gl, gluon
from sglang_fp4ext.moe.layout import SCALE_CODE_BF16_BIAS

# ---- Triton ----


# The FP4 bit trick leaves values 2^-126 too small and scale codes decode to the scale times 2^100.
# Weights are decoded as w * 2^-26 (exact, normal range in bf16) and the epilogue multiplies by
# 2^26 together with the per-row global scale.
_TWO_P26 = tl.constexpr(67108864.0)  # 2^26 (a Gluon constexpr too: the same class)
_SCALE_BIAS = tl.constexpr(SCALE_CODE_BF16_BIAS)

#: Inline PTX of ``_fp4x4_to_bf16_asm`` (also used by the Gluon chunk decode, ``_decode_chunk``):
#: operands $4 = four packed bytes, $5/$6 = bf16 scale pairs of the low nibbles, $7/$8 of the high
#: nibbles; results $0/$1 = low-nibble weights of bytes (0, 1)/(2, 3), $2/$3 the high nibbles.
FP4X4_TO_BF16_PTX = tl.constexpr(
    """
    {
    .reg .b32 y, z, m, v, nz;
    mov.b32 nz, 0x80008000;
    prmt.b32 y, $4, 0, 0x4140;
    prmt.b32 z, $4, 0, 0x4342;
    and.b32 m, y, 0x000F000F;
    mul.lo.u32 v, m, 0x1040;
    and.b32 v, v, 0x81C081C0;
    fma.rn.bf16x2 $0, v, $5, nz;
    and.b32 m, z, 0x000F000F;
    mul.lo.u32 v, m, 0x1040;
    and.b32 v, v, 0x81C081C0;
    fma.rn.bf16x2 $1, v, $6, nz;
    and.b32 m, y, 0x00F000F0;
    mul.lo.u32 v, m, 0x104;
    and.b32 v, v, 0x81C081C0;
    fma.rn.bf16x2 $2, v, $7, nz;
    and.b32 m, z, 0x00F000F0;
    mul.lo.u32 v, m, 0x104;
    and.b32 v, v, 0x81C081C0;
    fma.rn.bf16x2 $3, v, $8, nz;
    }
    """
)


@triton.jit
def _to_bf16(x, COMPUTE_F32: tl.constexpr):
    """fp32 -> bf16, round to nearest even. The interpreter's cast truncates (measured, Triton
    3.8), so there the rounding is done on the bits first (finite inputs) and the cast is exact."""
    if COMPUTE_F32:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x.to(tl.bfloat16)


@triton.jit
def _scale_bf16(c, COMPUTE_F32: tl.constexpr):
    """Scale codes (``layout.py``) -> the block scale times 2^100: bf16 bits ``c * 16 + bias``,
    one integer multiply-add, exact (<= 4 significant bits, exponent in range). Under the
    interpreter (``COMPUTE_F32``) the same bits shifted into an fp32."""
    # if/else, not an early return: compiled, Triton visits the code after a static-if return
    # too and rejects the two return types (the GPU probe of test_decode_kernels calls both).
    if COMPUTE_F32:
        s = ((c.to(tl.uint32) << 20) + (_SCALE_BIAS << 16)).to(tl.float32, bitcast=True)
    else:
        s = ((c.to(tl.uint16) << 4) + _SCALE_BIAS).to(tl.bfloat16, bitcast=True)
    return s


@triton.jit
def _fp4x4_to_bf16_asm(b, s_lo, s_hi):
    """GPU only (inline PTX, sm_80+): packed bytes -> (low-nibble, high-nibble) bf16 values.

    Elementwise: output ``lo[i] = e2m1(b[i] & 0xF) * s_lo[i]``, ``hi[i] = e2m1(b[i] >> 4) *
    s_hi[i]``, where the scales are bf16 (``_scale_bf16``) and the results ``w * 2^-26``. Four
    bytes per instance: ``prmt`` spreads bytes 0,1 (2,3) to the two 16-bit halves, a mask isolates
    one nibble per half, one integer multiply makes two shifted copies (sign lands on bf16 bit 15,
    magnitude on bits 8..6, the same bit trick as the fp32 path with bf16's 8-bit exponent), a mask
    keeps those 4 bits, and one ``fma.rn.bf16x2`` by the scale pair (``+ -0``) gives two exact
    products (<= 6 significant bits). 18 instructions per 8 weights.
    """
    return tl.inline_asm_elementwise(
        FP4X4_TO_BF16_PTX,
        "=r,=r,=r,=r,r,r,r,r,r",
        args=[b, s_lo, s_hi],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _fp4x4_nibble_to_bf16_asm(b, s, half):
    """GPU only (inline PTX, sm_80+): one nibble of each packed byte -> ``e2m1(nibble) * s``.

    ``_fp4x4_to_bf16_asm``'s sequence for one nibble, chosen at run time by ``half`` (0: low,
    1: high) through the mask and multiplier operands (no extra instruction): for K loops that
    step half a layout chunk at a time. 11 instructions per 4 weights. ``s`` bf16
    (``_scale_bf16``), results ``w * 2^-26``, exact.
    """
    mask = (0x000F000F << (4 * half)).to(tl.uint32)
    mult = (0x1040 >> (4 * half)).to(tl.uint32)
    # pack=4: b is one register, s two (bf16 pairs), mask and mult four each (only $5, $9 read).
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 y, z, m, v, nz;
        mov.b32 nz, 0x80008000;
        prmt.b32 y, $2, 0, 0x4140;
        prmt.b32 z, $2, 0, 0x4342;
        and.b32 m, y, $5;
        mul.lo.u32 v, m, $9;
        and.b32 v, v, 0x81C081C0;
        fma.rn.bf16x2 $0, v, $3, nz;
        and.b32 m, z, $5;
        mul.lo.u32 v, m, $9;
        and.b32 v, v, 0x81C081C0;
        fma.rn.bf16x2 $1, v, $4, nz;
        }
        """,
        "=r,=r,r,r,r,r,r,r,r,r,r,r,r",
        args=[b, s, mask, mult],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def _nibbles_to_w(b, s_codes, half, COMPUTE_F32: tl.constexpr):
    """Packed codes ``b`` uint8 and scale codes ``s_codes`` (broadcast against ``b``) -> the
    weights of one nibble of each byte (``half`` 0: low, 1: high), ``w * 2^-26``, exact. GPU: bf16
    from ``_fp4x4_nibble_to_bf16_asm``. Interpreter (``COMPUTE_F32``): fp32 by the pure-Triton bit
    trick (sign to fp32 bit 31, magnitude to bits 24..22: the E2M1 value times 2^-126, the E2M1
    subnormal 0.5 landing on the fp32 subnormal), no inline asm."""
    if COMPUTE_F32:
        n = b.to(tl.uint32) >> (4 * half)
        w = (((n & 0x8) << 28) | ((n & 0x7) << 22)).to(tl.float32, bitcast=True)
        return w * _scale_bf16(s_codes, True)
    else:
        return _fp4x4_nibble_to_bf16_asm(b, _scale_bf16(s_codes, False), half)


@triton.jit
def _silu_mul_store(
    acc,
    a_ptr,
    rows,
    pairs,
    pmask,
    inter_ptr,
    nb,
    I,
    BN: tl.constexpr,
    BT: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """Rows are interleaved gate/up: scale, split, silu(gate) * up, store bf16 to inter[pair, j]."""
    alpha = tl.load(a_ptr + rows) * _TWO_P26
    y = acc * alpha[:, None]
    g, u = tl.split(tl.permute(tl.reshape(y, [BN // 2, 2, BT]), (0, 2, 1)))
    h = g / (1.0 + tl.exp(-g)) * u
    j = nb * (BN // 2) + tl.arange(0, BN // 2)
    ptr = inter_ptr + pairs[None, :].to(tl.int64) * I + j[:, None]
    tl.store(ptr, _to_bf16(h, COMPUTE_F32), mask=(j[:, None] < I) & pmask[None, :])


# ---- Gluon ----


# The flat-chunk divisor of a program with one row block (GEMM1): its chunks are its K chunks,
# and a power of two above any chunk count makes the (block, chunk) split a shift and a mask
# where a division by the run-time chunk count costs ~10 instructions per use.
_ONE_BLOCK = gl.constexpr(1 << 24)


# Code slots (the prefill code ring ``CR``): [BN, 32] int32 code
# words in 128-byte swizzled rows (a warp's reads of 8 rows x 32 bytes hit distinct banks),
# [BN, 16] scale codes.
_CS = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))
_SS = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))


def _log2(n: int) -> int:
    assert n >= 1 and n & (n - 1) == 0, n
    return n.bit_length() - 1


_LANES = [[0, 2, 0], [0, 4, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]  # lane = 4g + q: q -> groups 2q


def weight_layout(BN: int, W: int):
    """[BN rows, 8 groups, 4 words] int32 codes of one half chunk (a group = 16 bytes, one block
    scale; MMA row order): thread ``(g, q)`` of warp ``w`` holds rows ``16w + g`` and ``+8`` (plus
    ``16W`` repeats) and groups ``2q, 2q+1``: 32 contiguous bytes per row."""
    R = BN // (16 * W)
    reg = [[0, 0, 1], [0, 0, 2], [0, 1, 0], [8, 0, 0]]
    reg += [[16 * W << i, 0, 0] for i in range(_log2(R))]
    warp = [[16 << i, 0, 0] for i in range(_log2(W))]
    return gl.DistributedLinearLayout(reg, _LANES, warp, [], [BN, 8, 4])


def code_read_layout(BN: int, W: int):
    """``weight_layout`` over [BN rows, 32 words] (group ``g``, word ``w`` -> column ``4g + w``):
    the code ring's slots are [BN, 32] int32 in shared memory, read back in this layout and
    reshaped to the decode's [BN, 8, 4] by a register renaming."""
    wl = weight_layout(BN, W)

    def col(b):
        return [b[0], 4 * b[1] + b[2]]

    return gl.DistributedLinearLayout(
        [col(b) for b in wl.reg_bases],
        [col(b) for b in wl.lane_bases],
        [col(b) for b in wl.warp_bases],
        [],
        [BN, 32],
    )


@functools.cache
def ring_layouts(BN: int, W: int) -> dict:
    """The code-slot copy and read layouts (``_copy_codes``, ``_read_codes``) of ``BN`` weight
    rows on ``W`` warps: copies of 16 code bytes / 8 scale codes per thread, and ``weight_layout``
    read as [BN, 32] words (``code_read_layout``)."""
    return dict(
        CP=gl.BlockedLayout([1, 4], [4, 8], [W, 1], [1, 0]),
        SP=gl.BlockedLayout([1, 8], [16, 2], [W, 1], [1, 0]),
        CW=code_read_layout(BN, W),
    )


@gluon.jit
def _mma_k_order(v, R: gl.constexpr):
    """[R, 8, 16] in byte order -> [R, 128] in MMA k-slot order (module docstring)."""
    v = gl.reshape(v, [R, 4, 8, 2, 2])
    v = gl.permute(v, [0, 2, 3, 1, 4])
    return gl.reshape(v, [R, 128])


@gluon.jit
def _phys_row(r):
    """MMA row -> weight row within its 16-row tile: ``8h + g`` reads ``2g + h``."""
    return (r // 16) * 16 + (r % 8) * 2 + (r // 8) % 2


@gluon.jit
def _bf16x2(w):
    """int32 words holding bf16 pairs -> bf16 [..., 2] (a register renaming after LLVM)."""
    lo = (w & 0xFFFF).to(gl.uint16).to(gl.bfloat16, bitcast=True)
    hi = (w >> 16).to(gl.uint16).to(gl.bfloat16, bitcast=True)
    return gl.join(lo, hi)


@gluon.jit
def _byte_order(p01, p23, R: gl.constexpr):
    """bf16 pairs of bytes (0, 1) and (2, 3) of each code word [R, 8, 4] -> [R, 8, 16] bf16 in
    byte order."""
    v = gl.permute(gl.join(_bf16x2(p01), _bf16x2(p23)), [0, 1, 2, 4, 3])
    return gl.reshape(v, [R, 8, 16])


@gluon.jit
def _scale_pair(c):
    """Scale codes -> int32 holding the bf16 pair (s, s), s = the block scale times 2^100
    (``layout.py``), exact."""
    b = (c.to(gl.int32) << 4) + _SCALE_BIAS
    return b | (b << 16)


@gluon.jit
def _decode_chunk(b, slo, shi, BN: gl.constexpr, ML: gl.constexpr):
    """Code words ``b`` [BN, 8, 4] int32 and scale codes [BN, 8] per half of one 256-deep chunk
    -> the low and high halves' weights times 2^-26, [BN, 128] bf16 each, in MMA k-slot order as
    the A operand of ``ML`` (``mma_v2`` here, ``warpgroup_mma`` in the prefill kernels)."""
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ML, k_width=2)
    sl = gl.expand_dims(_scale_pair(slo), 2)
    sh = gl.expand_dims(_scale_pair(shi), 2)
    lo01, lo23, hi01, hi23 = gl.inline_asm_elementwise(
        FP4X4_TO_BF16_PTX,
        "=r,=r,=r,=r,r,r,r,r,r",
        args=[b, sl, sl, sh, sh],
        dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )
    a_lo = gl.convert_layout(
        _mma_k_order(_byte_order(lo01, lo23, BN), BN), A_OP, assert_trivial=True
    )
    a_hi = gl.convert_layout(
        _mma_k_order(_byte_order(hi01, hi23, BN), BN), A_OP, assert_trivial=True
    )
    return a_lo, a_hi


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _chunk_base(qe, se, QB, nb0, it, KC, NIT, s_chunk_stride, BN: gl.constexpr):
    """Where the program's flat chunk ``it`` (row block ``nb0 + it // KC``, K chunk ``it % KC``;
    clamped to the last chunk, so reads past the end repeat it) starts: its row block's first
    code word and scale code of that K chunk (``layout.py``: a row's chunk is 32 words, its
    scale codes 16 bytes per row at ``s_chunk_stride`` per chunk)."""
    it = gl.minimum(it, NIT - 1)
    nb = nb0 + it // KC
    kc = it % KC
    return qe + nb * QB + kc * 32, se + nb * BN * 16 + kc * s_chunk_stride


@gluon.jit
def _code_slot(BN: gl.constexpr):
    return gl.allocate_shared_memory(gl.int32, [BN, 32], _CS)


@gluon.jit
def _scale_slot(BN: gl.constexpr):
    return gl.allocate_shared_memory(gl.uint8, [BN, 16], _SS)


@gluon.jit
def _copy_codes(
    c_s,
    s_s,
    qe,
    se,
    QB,
    nb0,
    it,
    KC,
    NIT,
    s_chunk_stride,
    BN: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
):
    """``cp.async`` flat chunk ``it``'s code words (MMA row order: slot row ``r`` holds weight
    row ``_phys_row(r)``) into ``c_s`` and scale codes into ``s_s``, 16 and 8 bytes per copy,
    clamped to the last chunk (``_chunk_base``); they join the caller's next commit group."""
    qb, sb = _chunk_base(qe, se, QB, nb0, it, KC, NIT, s_chunk_stride, BN)
    r = _phys_row(gl.arange(0, BN, layout=gl.SliceLayout(1, CP)))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, CP))
    async_copy.async_copy_global_to_shared(
        c_s, qb + gl.expand_dims(r * (QB // BN), 1) + gl.expand_dims(c, 0)
    )
    r = _phys_row(gl.arange(0, BN, layout=gl.SliceLayout(1, SP)))
    c = gl.arange(0, 16, layout=gl.SliceLayout(0, SP))
    async_copy.async_copy_global_to_shared(
        s_s, sb + gl.expand_dims(r * 16, 1) + gl.expand_dims(c, 0)
    )


@gluon.jit
def _read_codes(c_s, s_s, BN: gl.constexpr, CW: gl.constexpr, WL: gl.constexpr):
    """A code slot -> ``_load_chunk``'s registers: code words [BN, 8, 4] in the decode's
    layout ``WL`` and the two halves' scale codes [BN, 8]."""
    b = gl.convert_layout(gl.reshape(c_s.load(CW), [BN, 8, 4]), WL, assert_trivial=True)
    SWL: gl.constexpr = gl.SliceLayout(2, WL)
    return b, s_s.slice(0, 8, 1).load(SWL), s_s.slice(8, 8, 1).load(SWL)


@gluon.jit
def _prefetch_l2(ptr, pred):
    """Ask L2 for the line holding each ``ptr`` where ``pred``: no registers held, no wait."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
        "=r,l,r",
        args=[ptr, pred.to(gl.int32)],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _prefetch_rows(qrow, srow, r, ok):
    """L2 prefetch of one K chunk of weight rows ``r``: ``qrow`` points at each row's 128-byte
    code line, ``srow`` at its 16 scale codes, 8 rows to a scale line (``layout.py``), so one
    row in 8 asks for it; where ``ok``."""
    _prefetch_l2(qrow, ok)
    _prefetch_l2(srow, ok & (r % 8 == 0))
