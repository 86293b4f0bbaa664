"""Triton kernels of the NVFP4 W4A4 prefill path for Blackwell (``@triton.jit`` code only).

Activations are quantized to NVFP4 with the layer's static input scales (the numerics the
checkpoint was calibrated for: ``nvfp4.format.quantize_activation_nvfp4``, bit for bit) and both
GEMMs run ``tl.dot_scaled(e2m1, e4m3 scales per 16)``, which Triton 3.6 and 3.8 compile to the
block-scaled FP4 MMA on sm_120 (``mma.sync ... kind::mxf4nvf4.block_scale``) and sm_100
(``tcgen05.mma ... kind::mxf4nvf4``). Grouping, M tiles, the grid and the ordered combine are
``prefill._dot_kernels``' (read its docstring); the launches per layer:

1-3. the grouping (``prefill._dot_kernels._group_*``);
4. ``_quant_act``, grid ``(cdiv(T, BT), H / 256)``: ``x`` (T, H) bf16 -> ``xq`` (T, H/2) uint8 (two
   E2M1 codes per byte, even element low: the checkpoint's packing) and ``xs`` (T, H/16) uint8
   e4m3 block scales, with global scale ``gs1``;
5. ``_w4a4_gemm1``, grid ``(Np1 / BN, m_tiles)``: GEMM1 + SiLU·mul, quantized again with ``gs2``
   into ``iq`` (P, I/2) / ``is_`` (P, I/16), rows in sorted order;
6. ``_w4a4_gemm2``, grid ``(Np2 / BN, m_tiles)``: GEMM2 x routing weight -> bf16 partials
   (P, H) by pair slot;
7. ``prefill._dot_kernels._prefill_combine`` (ordered).

**The weights stay in the decode layout** (``layout.py``; no second copy): byte ``i`` of a
chunk holds elements ``i`` (low nibble) and ``128 + i`` (high), and scale byte ``g`` covers the
low nibbles of bytes ``16g .. 16g + 15``. ``tl.dot_scaled`` wants two consecutive elements per
byte and 16 consecutive elements per scale, so each chunk becomes two K-halves in natural order:
``lo[m] = lo(b[2m]) | lo(b[2m+1]) << 4`` (elements ``0..127``, scale bytes 0-7) and the same for
the high nibbles (elements ``128..255``, scale bytes 8-15), and the scale codes become e4m3 bytes
again (``_code_to_e4m3``; the inverse of ``layout.e4m3_to_scale_code``). The activations need no
reordering. Results: ``acc * alpha[row] * gs`` (the products are exact in the MMA).

Under the interpreter (``COMPUTE_F32``) both operands are decoded to fp32 and multiplied with
``tl.dot``: Triton 3.8's interpreter reads e4m3 scales of ``tl.dot_scaled`` as e8m0
(``docs/measured-facts.md``). Everything else -- quantization, repacking, scale conversion,
epilogues -- is the code the GPU runs.
"""

import triton
import triton.language as tl

from sglang_fp4ext.moe._common import _to_bf16
from sglang_fp4ext.moe.prefill._dot_kernels import _tile_of

# ---- NVFP4 numerics (nvfp4/format.py, bit for bit) ----


@triton.jit
def _e4m3_byte(s):
    """fp32 ``s`` in [2^-9, 448] -> its e4m3fn byte (int32), round to nearest even."""
    b = s.to(tl.uint32, bitcast=True)
    normal = ((b >> 23) & 0xFF) >= 121  # s >= 2^-6
    qn = ((b + 0x7FFFF + ((b >> 20) & 1)) >> 20).to(tl.int32) - 960  # 3 mantissa bits kept
    v = s * 512.0  # subnormal: m * 2^-9, m = RTNE(s * 2^9) (m = 8 is the normal 2^-6, byte 8)
    f = tl.floor(v)
    fi = f.to(tl.int32)
    up = ((v - f) > 0.5) | (((v - f) == 0.5) & ((fi & 1) == 1))
    return tl.where(normal, qn, fi + up.to(tl.int32))


@triton.jit
def _e4m3_value(c):
    """e4m3fn byte (int32, positive, not NaN) -> fp32, exact."""
    e = c >> 3
    normal = (((e + 120) << 23) | ((c & 7) << 20)).to(tl.float32, bitcast=True)
    return tl.where(e > 0, normal, (c & 7).to(tl.float32) * 0.001953125)


@triton.jit
def _e2m1_code(v):
    """fp32 -> E2M1 code (int32 0..15), round to nearest even, saturating at +-6."""
    a = tl.abs(v)
    mag = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
    mag += (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
    mag += (a > 5.0).to(tl.int32)
    return mag | ((v < 0).to(tl.int32) << 3)


@triton.jit
def _nvfp4_quantize(v, gs, R: tl.constexpr, K: tl.constexpr):
    """fp32 [R, K] with global scale ``gs`` -> (packed [R, K/2] uint8, scales [R, K/16] uint8):
    block scale ``e4m3(clamp(amax / (6 gs) or 1, 2^-9, 448))``, codes ``e2m1(x / (scale * gs))``
    (the product first, one IEEE division), even element in the low nibble."""
    vb = tl.reshape(v, [R, K // 16, 16])
    s = tl.math.div_rn(tl.max(tl.abs(vb), axis=2), 6.0 * gs)
    s = tl.minimum(tl.maximum(tl.where(s == 0.0, 1.0, s), 0.001953125), 448.0)
    sc = _e4m3_byte(s)
    codes = _e2m1_code(tl.math.div_rn(vb, (_e4m3_value(sc) * gs)[:, :, None]))
    lo, hi = tl.split(tl.reshape(codes, [R, K // 2, 2]))
    return (lo | (hi << 4)).to(tl.uint8), sc.to(tl.uint8)


# ---- operands ----


@triton.jit
def _code_to_e4m3(c):
    """Scale code (``layout.py``: ``(E + 10) << 3 | m``, 0 = zero) -> e4m3fn byte (int32)."""
    c = c.to(tl.int32)
    sub = (8 + (c & 7)) >> tl.maximum(4 - (c >> 3), 0)  # E in -9..-7: (1 + m/8) 2^E = k 2^-9
    return tl.where(c == 0, 0, tl.where(c >= 32, c - 24, sub))


@triton.jit
def _weight_halves(q_ptr, s_ptr, rows, kc, q_row_stride, s_chunk_stride, BN: tl.constexpr):
    """Chunk ``kc`` of ``rows``: (lo, lo scales, hi, hi scales), packed [BN, 64] uint8 in natural
    K order and e4m3 [BN, 8] int32 (module docstring)."""
    b = tl.load(q_ptr + rows[:, None] * q_row_stride + kc * 128 + tl.arange(0, 128)[None, :])
    b0, b1 = tl.split(tl.reshape(b, [BN, 64, 2]))
    lo = (b0 & 0xF) | ((b1 & 0xF) << 4)
    hi = (b0 >> 4) | (b1 & 0xF0)
    c = tl.load(s_ptr + kc * s_chunk_stride + rows[:, None] * 16 + tl.arange(0, 16)[None, :])
    s_lo, s_hi = tl.split(tl.permute(tl.reshape(_code_to_e4m3(c), [BN, 2, 8]), (0, 2, 1)))
    return lo.to(tl.uint8), s_lo, hi.to(tl.uint8), s_hi


@triton.jit
def _fp4_f32(p, s, R: tl.constexpr):
    """Packed [R, 64] uint8 with e4m3 scales [R, 8] (int32) -> fp32 [R, 128] (interpreter)."""
    n = tl.reshape(tl.join(p & 0xF, p >> 4), [R, 128]).to(tl.int32)
    m = n & 7
    mag = tl.where(
        m < 2,
        m.to(tl.float32) * 0.5,
        tl.exp2(((m >> 1) - 1).to(tl.float32)) * (1.0 + 0.5 * (m & 1).to(tl.float32)),
    )
    val = tl.where((n & 8) != 0, -mag, mag)
    return tl.reshape(tl.reshape(val, [R, 8, 16]) * _e4m3_value(s)[:, :, None], [R, 128])


@triton.jit
def _mma(acc, w, ws, x, xs, BN: tl.constexpr, BM: tl.constexpr, COMPUTE_F32: tl.constexpr):
    """acc [BN, BM] += W (packed [BN, 64], scales [BN, 8]) @ X (packed [BM, 64], [BM, 8])^T."""
    if COMPUTE_F32:
        acc = tl.dot(_fp4_f32(w, ws, BN), tl.trans(_fp4_f32(x, xs, BM)), acc)
    else:
        acc = tl.dot_scaled(
            w,
            ws.to(tl.uint8).to(tl.float8e4nv, bitcast=True),
            "e2m1",
            tl.trans(x),
            xs.to(tl.uint8).to(tl.float8e4nv, bitcast=True),
            "e2m1",
            acc=acc,
        )
    return acc


@triton.jit
def _w4a4_k_loop(
    q_ptr,
    s_ptr,
    xq_ptr,
    xs_ptr,
    xrow,
    rows,
    KC,
    q_row_stride,
    s_chunk_stride,
    BN: tl.constexpr,
    BM: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """acc [BN, BM] fp32 over ``KC`` chunks; ``xrow`` (BM,) int64 activation rows (packed row
    length ``KC * 128`` bytes, ``KC * 16`` scale bytes)."""
    kk = tl.arange(0, 64)
    ks = tl.arange(0, 8)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for kc in range(0, KC):
        w_lo, s_lo, w_hi, s_hi = _weight_halves(
            q_ptr, s_ptr, rows, kc, q_row_stride, s_chunk_stride, BN
        )
        xp = xq_ptr + xrow[:, None] * (KC * 128) + kc * 128 + kk[None, :]
        sp = xs_ptr + xrow[:, None] * (KC * 16) + kc * 16 + ks[None, :]
        x_lo, x_hi = tl.load(xp), tl.load(xp + 64)
        xs_lo, xs_hi = tl.load(sp).to(tl.int32), tl.load(sp + 8).to(tl.int32)
        acc = _mma(acc, w_lo, s_lo, x_lo, xs_lo, BN, BM, COMPUTE_F32)
        acc = _mma(acc, w_hi, s_hi, x_hi, xs_hi, BN, BM, COMPUTE_F32)
    return acc


# ---- kernels ----


@triton.jit
def _quant_act(x_ptr, q_ptr, s_ptr, gs_ptr, T, H, stride_x, BT: tl.constexpr):
    """Rows ``BT`` x 256 columns of ``x`` -> NVFP4 ``q`` (T, H/2) and ``s`` (T, H/16) uint8."""
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)
    c = tl.program_id(1)
    tmask = t[:, None] < T
    x = tl.load(
        x_ptr + t[:, None] * stride_x + c * 256 + tl.arange(0, 256)[None, :], mask=tmask, other=0.0
    ).to(tl.float32)
    packed, sc = _nvfp4_quantize(x, tl.load(gs_ptr), BT, 256)
    tl.store(
        q_ptr + t[:, None] * (H // 2) + c * 128 + tl.arange(0, 128)[None, :], packed, mask=tmask
    )
    tl.store(s_ptr + t[:, None] * (H // 16) + c * 16 + tl.arange(0, 16)[None, :], sc, mask=tmask)


@triton.jit
def _w4a4_gemm1(
    xq_ptr,
    xs_ptr,
    sorted_ptr,
    counts_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    gs1_ptr,
    gs2_ptr,
    iq_ptr,
    is_ptr,
    I,
    NP,
    KC,
    TOP_K,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    NBINS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """GEMM1 + SiLU·mul for M tile ``program_id(1)``, weight rows ``program_id(0) * BN ..``
    (interleaved gate/up: ``BN / 2`` intermediate columns), quantized to NVFP4 with ``gs2``."""
    nb = tl.program_id(0)
    e, row0, nrows = _tile_of(counts_ptr, tl.program_id(1), NBINS, BM)
    if nrows <= 0:
        return
    i = tl.arange(0, BM)
    r = row0 + tl.minimum(i, nrows - 1)  # rows past the tile re-read its last (results dropped)
    tok = (tl.load(sorted_ptr + r) // TOP_K).to(tl.int64)
    e64 = e.to(tl.int64)
    rows = nb * BN + tl.arange(0, BN)
    acc = _w4a4_k_loop(
        q_ptr + e64 * q_e_stride,
        s_ptr + e64 * s_e_stride,
        xq_ptr,
        xs_ptr,
        tok,
        rows,
        KC,
        q_row_stride,
        s_chunk_stride,
        BN,
        BM,
        COMPUTE_F32,
    )
    y = acc * (tl.load(a_ptr + e64 * NP + rows) * tl.load(gs1_ptr))[:, None]
    g, u = tl.split(tl.permute(tl.reshape(y, [BN // 2, 2, BM]), (0, 2, 1)))
    h = tl.trans(g / (1.0 + tl.exp(-g)) * u)  # [BM, BN / 2]
    packed, sc = _nvfp4_quantize(h, tl.load(gs2_ptr), BM, BN // 2)
    ok = (i < nrows)[:, None]
    r64 = r.to(tl.int64)[:, None]
    jq = nb * (BN // 4) + tl.arange(0, BN // 4)
    js = nb * (BN // 32) + tl.arange(0, BN // 32)
    tl.store(iq_ptr + r64 * (I // 2) + jq[None, :], packed, mask=ok & (jq[None, :] < I // 2))
    tl.store(is_ptr + r64 * (I // 16) + js[None, :], sc, mask=ok & (js[None, :] < I // 16))


@triton.jit
def _w4a4_gemm2(
    iq_ptr,
    is_ptr,
    sorted_ptr,
    counts_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    gs2_ptr,
    dst_ptr,
    H,
    NP,
    KC,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    stride_dst,
    NBINS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """GEMM2 x routing weight for M tile ``program_id(1)``, output columns ``program_id(0) * BN
    ..``: bf16 partial rows by pair slot (ordered combine)."""
    nb = tl.program_id(0)
    e, row0, nrows = _tile_of(counts_ptr, tl.program_id(1), NBINS, BM)
    if nrows <= 0:
        return
    i = tl.arange(0, BM)
    r = row0 + tl.minimum(i, nrows - 1)
    e64 = e.to(tl.int64)
    rows = nb * BN + tl.arange(0, BN)
    acc = _w4a4_k_loop(
        q_ptr + e64 * q_e_stride,
        s_ptr + e64 * s_e_stride,
        iq_ptr,
        is_ptr,
        r.to(tl.int64),
        rows,
        KC,
        q_row_stride,
        s_chunk_stride,
        BN,
        BM,
        COMPUTE_F32,
    )
    pair = tl.load(sorted_ptr + r)
    tw = tl.load(tw_ptr + r).to(tl.float32)  # sorted_tw, by sorted row
    y = acc * (tl.load(a_ptr + e64 * NP + rows) * tl.load(gs2_ptr))[:, None] * tw[None, :]
    ptr = dst_ptr + pair.to(tl.int64)[None, :] * stride_dst + rows[:, None]
    tl.store(ptr, _to_bf16(y, COMPUTE_F32), mask=(rows[:, None] < H) & (i < nrows)[None, :])
