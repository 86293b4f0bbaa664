"""Triton kernels of the NVFP4 W4A16 fused-MoE decode path (``@triton.jit`` code only).

Two launches per layer, both with a static grid ``(G, row_blocks, SPLIT_K)`` fixed by ``T``:

* ``_moe_gemm1``: ``inter[p, :] = silu(x[t] @ gate_e^T) * (x[t] @ up_e^T)`` for every pair slot
  ``p = t * TOP_K + j`` routed to expert ``e = topk_ids[t, j]`` (bf16 ``(P, I)``).
* ``_moe_gemm2``: ``out[t, :] = sum_j topk_weights[t, j] * inter[p] @ down_e^T`` (bf16 ``(T, H)``).

Work items come straight from ``topk_ids`` (no alignment kernel). With ``SLOT_MODE`` program
``g`` takes pair slot ``g``; only the first slot holding its expert (the leader) works, the others
exit. Otherwise program ``g`` takes expert ``g``. The working program gathers every pair routed
to its expert (in slot order, ``BT`` at a time, compacted in-kernel with a cumsum over a match
mask), so each expert's weights are streamed once per call. Ids ``< 0`` (experts on another EP
rank) or ``>= E`` contribute nothing.

Swap-AB: weight rows are the MMA's M side (``BN`` rows per program), tokens the N side (``BT``),
so one token does not pad a 64-row tile. FP4 is decoded in registers with integer bit operations
(exact; no inline asm, interpreter-safe), see ``_decode_chunk``. Weight layout: ``layout.py``.

Determinism: split-K partials (GEMM1) and the top-k combine (GEMM2) go through an fp32 workspace
and a per-tile arrival counter; the last program to arrive sums in a fixed order, finishes the
tile and resets the counter to 0, so the next launch (or CUDA-graph replay) starts clean. Results
are bit-identical run to run; there is no atomic-accumulation variant.

Under the interpreter ``COMPUTE_F32`` casts both dot operands to fp32 (the interpreter computes bf16
``tl.dot`` on raw bits); the decoded weights are exact in bf16, so both paths multiply the same
numbers.
"""

import triton
import triton.language as tl

# The FP4 bit trick leaves values 2^-126 too small and the e4m3 bit trick 2^-120 too small.
# Weights are decoded as w * 2^-26 (exact, normal range in bf16) and the epilogue multiplies by
# 2^26 together with the per-row global scale.
_TWO_P120 = tl.constexpr(1.329227995784916e36)  # 2^120
_TWO_P100 = tl.constexpr(1.2676506002282294e30)  # 2^100
_TWO_P26 = tl.constexpr(67108864.0)  # 2^26


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
def _e4m3_bits_to_f32(s):
    """e4m3 bytes -> fp32 (times 2^100), by bit placement: exact, no fp8 dtype needed (sm_80)."""
    s = s.to(tl.uint32)
    bits = ((s & 0x80) << 24) | ((s & 0x7F) << 20)
    return bits.to(tl.float32, bitcast=True) * _TWO_P120 * _TWO_P100


@triton.jit
def _decode_chunk(
    q_ptr, s_ptr, rows, kc, q_row_stride, s_chunk_stride, BN: tl.constexpr, DOT_DTYPE: tl.constexpr
):
    """Decode one 256-wide K chunk of ``BN`` weight rows -> (low half, high half), (BN, 128) each.

    Byte ``i`` of a row chunk holds element ``i`` (low nibble) and ``128 + i`` (high nibble); a
    nibble's sign goes to fp32 bit 31 and its 3 magnitude bits to bits 24..22, which is the E2M1
    value times 2^-126 (the E2M1 subnormal 0.5 lands on the fp32 subnormal). Scales arrive
    pre-multiplied by 2^100, so the result is ``w * 2^-26``, exact in bf16.
    """
    g = tl.arange(0, 8)
    i = tl.arange(0, 16)
    qp = (
        q_ptr
        + rows[:, None, None] * q_row_stride
        + kc * 128
        + g[None, :, None] * 16
        + i[None, None, :]
    )
    b = tl.load(qp).to(tl.uint32)  # (BN, 8, 16): group g of 16 elements shares scale g
    sp = s_ptr + kc * s_chunk_stride + rows[:, None] * 16 + g[None, :]
    s_lo = _e4m3_bits_to_f32(tl.load(sp))
    s_hi = _e4m3_bits_to_f32(tl.load(sp + 8))
    lo = (((b & 0x8) << 28) | ((b & 0x7) << 22)).to(tl.float32, bitcast=True) * s_lo[:, :, None]
    hi = (((b & 0x80) << 24) | ((b & 0x70) << 18)).to(tl.float32, bitcast=True) * s_hi[:, :, None]
    return tl.reshape(lo, [BN, 128]).to(DOT_DTYPE), tl.reshape(hi, [BN, 128]).to(DOT_DTYPE)


@triton.jit
def _expert_of_program(ids_ptr, pid0, P, E, SLOT_MODE: tl.constexpr, BLOCK_P: tl.constexpr):
    """(expert, number of pairs routed to it) for this program; count 0 means no work."""
    if SLOT_MODE:
        e = tl.load(ids_ptr + pid0).to(tl.int32)
    else:
        e = pid0
    before = 0
    m = 0
    for p0 in range(0, P, BLOCK_P):
        offs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
        hit = ids == e
        m += tl.sum(hit.to(tl.int32), 0)
        before += tl.sum((hit & (offs < pid0)).to(tl.int32), 0)
    ok = (e >= 0) & (e < E)
    if SLOT_MODE:
        ok = ok & (before == 0)  # a later slot of an expert already led: exit
    return e, tl.where(ok, m, 0)


@triton.jit
def _pairs_of_expert(ids_ptr, e, c, P, BT: tl.constexpr, BLOCK_P: tl.constexpr):
    """Pair slots of the ``c``-th group of ``BT`` pairs routed to ``e`` (in slot order) + mask."""
    want = c * BT + tl.arange(0, BT)
    pair = tl.zeros([BT], dtype=tl.int32)
    found = tl.zeros([BT], dtype=tl.int32)
    base = 0
    for p0 in range(0, P, BLOCK_P):
        offs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
        hit = (ids == e).to(tl.int32)
        rank = base + tl.cumsum(hit, 0) - 1  # rank among e's pairs
        sel = (rank[None, :] == want[:, None]) & (hit[None, :] != 0)  # (BT, BLOCK_P)
        pair += tl.sum(tl.where(sel, offs[None, :], 0), 1)
        found += tl.sum(sel.to(tl.int32), 1)
        base += tl.sum(hit, 0)
    return pair, found != 0


@triton.jit
def _gemm_tile(
    q_ptr,
    s_ptr,
    x_ptr,
    rows,
    xrow,
    xmask,
    kc0,
    kc1,
    K,
    q_row_stride,
    s_chunk_stride,
    stride_x,
    BN: tl.constexpr,
    BT: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """acc (BN, BT) fp32 = W[rows, chunks kc0..kc1) @ X[xrow, same K]^T, weights times 2^-26."""
    DOT_DTYPE: tl.constexpr = tl.float32 if COMPUTE_F32 else tl.bfloat16
    acc = tl.zeros([BN, BT], dtype=tl.float32)
    kk = tl.arange(0, 128)
    for kc in range(kc0, kc1):
        w_lo, w_hi = _decode_chunk(
            q_ptr, s_ptr, rows, kc, q_row_stride, s_chunk_stride, BN, DOT_DTYPE
        )
        k_lo = kc * 256 + kk
        xp = x_ptr + xrow[:, None] * stride_x + k_lo[None, :]
        x_lo = tl.load(xp, mask=xmask[:, None] & (k_lo[None, :] < K), other=0.0).to(DOT_DTYPE)
        x_hi = tl.load(xp + 128, mask=xmask[:, None] & (k_lo[None, :] + 128 < K), other=0.0).to(
            DOT_DTYPE
        )
        acc = tl.dot(w_lo, tl.trans(x_lo), acc)
        acc = tl.dot(w_hi, tl.trans(x_hi), acc)
    return acc


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


@triton.jit
def _moe_gemm1(
    x_ptr,
    ids_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    inter_ptr,
    ws_ptr,
    cnt_ptr,
    P,
    E,
    H,
    I,
    NP,
    stride_x,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    KC,
    CPS,
    TOP_K,
    SPLIT_K,
    SLOT_MODE: tl.constexpr,
    BN: tl.constexpr,
    BT: tl.constexpr,
    BLOCK_P: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """GEMM1 + SiLU·mul. ws: (SPLIT_K, P, NP) fp32; cnt: (grid0, grid1) int32, 0 between calls."""
    pid0 = tl.program_id(0)
    nb = tl.program_id(1)
    ks = tl.program_id(2)
    e, m = _expert_of_program(ids_ptr, pid0, P, E, SLOT_MODE, BLOCK_P)
    if m == 0:
        return
    e64 = e.to(tl.int64)
    qe = q_ptr + e64 * q_e_stride
    se = s_ptr + e64 * s_e_stride
    ae = a_ptr + e64 * NP
    rows = nb * BN + tl.arange(0, BN)
    kc0 = ks * CPS
    kc1 = tl.minimum(kc0 + CPS, KC)
    nchunk = tl.cdiv(m, BT)
    for c in range(0, nchunk):
        pairs, pmask = _pairs_of_expert(ids_ptr, e, c, P, BT, BLOCK_P)
        tok = (pairs // TOP_K).to(tl.int64)
        acc = _gemm_tile(
            qe,
            se,
            x_ptr,
            rows,
            tok,
            pmask,
            kc0,
            kc1,
            H,
            q_row_stride,
            s_chunk_stride,
            stride_x,
            BN,
            BT,
            COMPUTE_F32,
        )
        if SPLIT_K == 1:
            _silu_mul_store(acc, ae, rows, pairs, pmask, inter_ptr, nb, I, BN, BT, COMPUTE_F32)
        else:
            wp = ws_ptr + (ks * P + pairs[None, :]).to(tl.int64) * NP + rows[:, None]
            tl.store(wp, acc, mask=pmask[None, :])
    if SPLIT_K > 1:
        tl.debug_barrier()  # every thread's partials are written before the release below
        cp = cnt_ptr + pid0 * tl.num_programs(1) + nb
        old = tl.atomic_add(cp, 1, sem="acq_rel")
        if old == SPLIT_K - 1:  # last to arrive: reduce in fixed split order, finish the tile
            tl.debug_barrier()
            for c in range(0, nchunk):
                pairs, pmask = _pairs_of_expert(ids_ptr, e, c, P, BT, BLOCK_P)
                acc = tl.zeros([BN, BT], dtype=tl.float32)
                for s in range(0, SPLIT_K):  # fixed order
                    wp = ws_ptr + (s * P + pairs[None, :]).to(tl.int64) * NP + rows[:, None]
                    acc += tl.load(wp, mask=pmask[None, :], other=0.0, cache_modifier=".cg")
                _silu_mul_store(acc, ae, rows, pairs, pmask, inter_ptr, nb, I, BN, BT, COMPUTE_F32)
            tl.atomic_xchg(cp, 0)


@triton.jit
def _moe_gemm2(
    inter_ptr,
    ids_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    T,
    P,
    E,
    H,
    I,
    NP,
    stride_out,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    KC,
    CPS,
    TOP_K,
    SPLIT_K,
    K_POW2: tl.constexpr,
    SLOT_MODE: tl.constexpr,
    BN: tl.constexpr,
    BT: tl.constexpr,
    BLOCK_P: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """GEMM2 x routing weight + top-k combine into ``out`` (T, H) bf16.

    ws: (P, SPLIT_K, NP) fp32, each pair's weighted partial; cnt: (T, grid1) int32 arrivals, zero
    between calls.
    """
    pid0 = tl.program_id(0)
    nb = tl.program_id(1)
    ks = tl.program_id(2)
    rows = nb * BN + tl.arange(0, BN)
    kj = tl.arange(0, K_POW2)
    if (pid0 < T) & (ks == 0):
        # A token with no local expert gets no arrival at all: write its zeros here.
        idt = tl.load(ids_ptr + pid0 * TOP_K + kj, mask=kj < TOP_K, other=-1).to(tl.int32)
        nval = tl.sum(((idt >= 0) & (idt < E)).to(tl.int32), 0)
        if nval == 0:
            op = out_ptr + pid0.to(tl.int64) * stride_out + rows
            tl.store(op, tl.zeros([BN], dtype=tl.float32).to(tl.bfloat16), mask=rows < H)
    e, m = _expert_of_program(ids_ptr, pid0, P, E, SLOT_MODE, BLOCK_P)
    if m == 0:
        return
    e64 = e.to(tl.int64)
    qe = q_ptr + e64 * q_e_stride
    se = s_ptr + e64 * s_e_stride
    alpha = tl.load(a_ptr + e64 * NP + rows) * _TWO_P26
    kc0 = ks * CPS
    kc1 = tl.minimum(kc0 + CPS, KC)
    nchunk = tl.cdiv(m, BT)
    for c in range(0, nchunk):
        pairs, pmask = _pairs_of_expert(ids_ptr, e, c, P, BT, BLOCK_P)
        acc = _gemm_tile(
            qe,
            se,
            inter_ptr,
            rows,
            pairs.to(tl.int64),
            pmask,
            kc0,
            kc1,
            I,
            q_row_stride,
            s_chunk_stride,
            I,
            BN,
            BT,
            COMPUTE_F32,
        )
        tw = tl.load(tw_ptr + pairs, mask=pmask, other=0.0).to(tl.float32)
        y = acc * alpha[:, None] * tw[None, :]
        tok = pairs // TOP_K
        wp = ws_ptr + (pairs[None, :].to(tl.int64) * SPLIT_K + ks) * NP + rows[:, None]
        tl.store(wp, y, mask=pmask[None, :])
        tl.debug_barrier()  # every thread's partials are written before the release below
        cp = cnt_ptr + tok * tl.num_programs(1) + nb
        old = tl.atomic_add(cp, 1, mask=pmask, sem="acq_rel")
        idt = tl.load(
            ids_ptr + tok[:, None] * TOP_K + kj[None, :],
            mask=pmask[:, None] & (kj[None, :] < TOP_K),
            other=-1,
        ).to(tl.int32)
        nval = tl.sum(((idt >= 0) & (idt < E)).to(tl.int32), 1)
        last = pmask & (old == nval * SPLIT_K - 1)
        if tl.sum(last.to(tl.int32), 0) > 0:  # some token of this group is complete: combine it
            tl.debug_barrier()
            tok64 = tok.to(tl.int64)
            o = tl.zeros([BT, BN], dtype=tl.float32)
            for j in range(0, TOP_K):  # fixed order: slot j, then split s
                idj = tl.load(ids_ptr + tok * TOP_K + j, mask=last, other=-1).to(tl.int32)
                vj = last & (idj >= 0) & (idj < E)
                for s in range(0, SPLIT_K):
                    rp = ws_ptr + ((tok64 * TOP_K + j) * SPLIT_K + s)[:, None] * NP + rows[None, :]
                    o += tl.load(rp, mask=vj[:, None], other=0.0, cache_modifier=".cg")
            op = out_ptr + tok64[:, None] * stride_out + rows[None, :]
            tl.store(op, _to_bf16(o, COMPUTE_F32), mask=last[:, None] & (rows[None, :] < H))
            tl.store(cp, tl.zeros([BT], dtype=tl.int32), mask=last)
