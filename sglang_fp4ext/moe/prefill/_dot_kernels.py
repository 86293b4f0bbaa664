"""Triton kernels of the NVFP4 W4A16 fused-MoE prefill path (``@triton.jit`` code only).

Six launches per layer, every grid fixed by ``T``, ``top_k``, the shape and the config (no host
synchronisation; CUDA-graph capturable). ``P = T * top_k`` pair slots ``p = t * top_k + j``;
``NBINS`` = next power of two above ``E`` (bin ``NBINS - 1`` collects ids outside ``[0, E)``).

Grouping (a deterministic counting sort of the pair slots by expert, stable in slot order):

1. ``_group_count``, grid ``(NB,)``, ``NB = cdiv(P, BLOCK_P)``: ``hist[b, e]`` = pairs of block
   ``b`` routed to ``e``.
2. ``_group_scan``, one program: ``hist`` becomes, in place, the exclusive prefix over blocks
   (``hist[b, e]`` = pairs of ``e`` in blocks ``< b``); ``counts[e]`` = pairs of ``e`` (0 for the
   spare bins), ``start[e]`` = exclusive prefix of ``counts`` over experts.
3. ``_group_scatter``, grid ``(NB,)``: ``sorted_pair[start[e] + hist[b, e] + rank] = p``, where
   ``rank`` counts earlier slots of block ``b`` with the same expert (sort + segmented scan).
   ``sorted_pair[0 : sum(counts)]`` lists the valid pairs grouped by expert in slot order; the
   prefill also gets ``sorted_tw[row] = topk_weights[sorted_pair[row]]`` (fp32).

M tiles: expert ``e`` owns ``cdiv(counts[e], BM)`` tiles of ``BM`` consecutive sorted rows, in
expert order; a GEMM program finds its tile's expert from ``counts`` (``_tile_of``). The launch
grid holds the worst case ``(P + min(E, P) * (BM - 1)) // BM`` tiles; programs past the last
tile exit at once.

GEMMs (weights in the ``layout.py`` kernel layout, shared with the decode path): the weight rows
are the MMA's M side (``BN`` rows, decoded to bf16 in registers with the decode kernels' exact
packed bit trick) and the ``BM`` tokens of a tile its N side, so Hopper's wgmma takes the decoded
weights as its register operand and only the activations go through shared memory. K advances by
``BK`` = 256 (one layout chunk) or 128 (half a chunk: fewer registers and half the activation
bytes per pipeline stage); see ``_w4a16_step``.

4. ``_prefill_gemm1``, grid ``(Np1 / BN, m_tiles)``: ``inter[r] = silu(x[t] @ gate_e^T) *
   (x[t] @ up_e^T)`` for sorted row ``r`` holding pair ``p`` (token ``t = p // top_k``), bf16
   ``(P, I)`` in sorted order.
5. ``_prefill_gemm2``, grid ``(cdiv(Np2 / BN, NG), m_tiles)``: ``y = sorted_tw[r] * inter[r] @
   down_e^T``, ``NG`` row blocks per program.
   Ordered combine (default): ``y`` goes to row ``p`` of a bf16 ``(P, H)`` workspace. Atomic
   combine (opt-in): fp32 ``atomic_add`` into ``acc32[t]`` (order of addition not fixed).
6. ``_prefill_combine``, grid ``(cdiv(T, BT), cdiv(H, BH))``: ordered: ``out[t] = sum_j y[t*k+j]``
   over the valid slots ``j = 0, 1, ...`` in that order (fp32); atomic: ``out = bf16(acc32)``.

Determinism: a row's GEMM result does not depend on the other rows of its tile, and the ordered
combine sums in slot order, so the default path is bit-identical run to run.

Under the interpreter ``COMPUTE_F32`` casts both dot operands to fp32 (the interpreter computes bf16
``tl.dot`` on raw bits); the decoded weights are exact in bf16, so both paths multiply the same
numbers.
"""

import triton
import triton.language as tl

from sglang_fp4ext.moe._common import (
    _TWO_P26,
    _fp4x4_to_bf16_asm,
    _nibbles_to_w,
    _scale_bf16,
    _silu_mul_store,
    _to_bf16,
)

# ---- grouping ----


@triton.jit
def _expert_bin(ids, E, NBINS: tl.constexpr):
    """Histogram bin of an expert id: ids outside [0, E) go to the spare last bin (>= E)."""
    return tl.where((ids >= 0) & (ids < E), ids, NBINS - 1)


@triton.jit
def _group_count(ids_ptr, hist_ptr, P, E, NBINS: tl.constexpr, BLOCK_P: tl.constexpr):
    """hist (NB, NBINS) int32: per-block expert histogram (every bin written)."""
    b = tl.program_id(0)
    offs = b * BLOCK_P + tl.arange(0, BLOCK_P)
    ids = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
    h = tl.histogram(_expert_bin(ids, E, NBINS), NBINS)
    tl.store(hist_ptr + b * NBINS + tl.arange(0, NBINS), h)


@triton.jit
def _group_scan(hist_ptr, counts_ptr, start_ptr, NB, E, NBINS: tl.constexpr, ROWS: tl.constexpr):
    """One program: hist -> exclusive prefix over blocks (in place); counts and start (NBINS)."""
    cols = tl.arange(0, NBINS)
    carry = tl.zeros([NBINS], dtype=tl.int32)
    for r0 in range(0, NB, ROWS):
        r = r0 + tl.arange(0, ROWS)
        ptr = hist_ptr + r[:, None] * NBINS + cols[None, :]
        m = r[:, None] < NB
        h = tl.load(ptr, mask=m, other=0)
        tl.store(ptr, tl.cumsum(h, 0) - h + carry[None, :], mask=m)
        carry += tl.sum(h, 0)
    counts = tl.where(cols < E, carry, 0)
    tl.store(counts_ptr + cols, counts)
    tl.store(start_ptr + cols, tl.cumsum(counts, 0) - counts)


@triton.jit
def _run_length(b1, c1, b2, c2):
    """Segmented count over a sorted sequence: position within the run of equal bins, plus one."""
    return b2, c2 + tl.where(b1 == b2, c1, 0)


@triton.jit
def _group_scatter(
    ids_ptr,
    tw_ptr,
    prefix_ptr,
    start_ptr,
    sorted_ptr,
    sorted_tw_ptr,
    P,
    E,
    NBINS: tl.constexpr,
    BLOCK_P: tl.constexpr,
    WITH_TW: tl.constexpr,
):
    """sorted_pair[start[e] + prefix[b, e] + rank] = p for every valid pair p of block b, and with
    ``WITH_TW`` sorted_tw[same row] = topk_weights[p] as fp32 (the GEMM2 epilogues then read the
    routing weight by sorted row, beside the pair, instead of through it)."""
    b = tl.program_id(0)
    i = tl.arange(0, BLOCK_P)
    offs = b * BLOCK_P + i
    ids = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
    # Keys are unique, so sorting them orders the block by expert and then by slot (stable).
    key = tl.sort(_expert_bin(ids, E, NBINS) * BLOCK_P + i)
    e = key // BLOCK_P
    _, run = tl.associative_scan((e, tl.full([BLOCK_P], 1, tl.int32)), 0, _run_length)
    pos = tl.load(start_ptr + e) + tl.load(prefix_ptr + b * NBINS + e) + run - 1
    pair = b * BLOCK_P + key % BLOCK_P
    tl.store(sorted_ptr + pos, pair, mask=e < E)
    if WITH_TW:
        tw = tl.load(tw_ptr + pair, mask=e < E, other=0.0).to(tl.float32)
        tl.store(sorted_tw_ptr + pos, tw, mask=e < E)


@triton.jit
def _tile_of(counts_ptr, m, NBINS: tl.constexpr, BM: tl.constexpr):
    """(expert, first sorted row, rows) of M tile ``m``; rows <= 0 when ``m`` is past the last."""
    bins = tl.arange(0, NBINS)
    c = tl.load(counts_ptr + bins)
    nt = (c + BM - 1) // BM
    tend = tl.cumsum(nt, 0)
    e = tl.sum((tend <= m).to(tl.int32), 0)  # tile ends are non-decreasing
    sel = bins == e
    c_e = tl.sum(tl.where(sel, c, 0), 0)
    t0 = tl.sum(tl.where(sel, tend - nt, 0), 0)
    r0 = tl.sum(tl.where(sel, tl.cumsum(c, 0) - c, 0), 0)
    local = (m - t0) * BM
    return e, r0 + local, tl.minimum(c_e - local, BM)


# ---- activations in MMA K order (the wgmma family's GEMM1 input) ----


@triton.jit
def _permute_k(x_ptr, y_ptr, T, K, stride_x, BT: tl.constexpr):
    """y (T, K) bf16 contiguous = x with each 128-wide K block in ``layout.mma_k_order``: position
    ``s = 16b + 8c1 + 2q + c0`` takes element ``32q + 4b + 2c1 + c0``. Grid (cdiv(T, BT), K / 128).
    """
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)
    s = tl.arange(0, 128)
    src = tl.program_id(1) * 128 + 32 * ((s // 2) % 4) + 4 * (s // 16) + 2 * ((s // 8) % 2) + s % 2
    m = t[:, None] < T
    v = tl.load(x_ptr + t[:, None] * stride_x + src[None, :], mask=m)
    tl.store(y_ptr + t[:, None] * K + tl.program_id(1) * 128 + s[None, :], v, mask=m)


# ---- grouped W4A16 GEMM ----


@triton.jit
def _k_steps(K, KC, BK: tl.constexpr):
    """Main-loop steps over K: ``KC`` layout chunks (``BK`` = 256) or half chunks up to ``K``."""
    if BK == 256:
        return KC
    else:
        return tl.cdiv(K, 128)


@triton.jit
def _w4a16_step(
    acc,
    q_ptr,
    s_ptr,
    x_ptr,
    rows,
    xrow,
    xmask,
    ks,
    K,
    q_row_stride,
    s_chunk_stride,
    stride_x,
    BN: tl.constexpr,
    BK: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """``acc`` (BN, BM) fp32 += W[rows, K step ks] @ X[xrow, same K]^T, the weights times 2^-26.

    ``q_ptr``/``s_ptr`` point at one expert; ``xrow`` (BM,) int64 rows of X, ``xmask`` (BM,) valid.
    Byte ``16g + i`` of a row's chunk ``kc`` holds K ``256kc + 16g + i`` (low nibble) and
    ``256kc + 128 + 16g + i`` (high nibble); group ``g`` shares scale byte ``g`` (low) or ``8 + g``
    (high). ``BK`` = 256: step ``ks`` is chunk ``ks``, both nibbles decoded at once
    (``_fp4x4_to_bf16_asm``, 2.25 instructions per weight), two dots. ``BK`` = 128: step ``ks``
    is half ``ks % 2`` of chunk ``ks // 2`` (``_nibbles_to_w``, 2.75 per weight): half the decoded
    registers and half the activation bytes per pipeline stage. Padding columns of W are zero
    codes, so only the activation loads are masked along K.
    """
    DOT_DTYPE: tl.constexpr = tl.float32 if COMPUTE_F32 else tl.bfloat16
    g = tl.arange(0, 8)
    i = tl.arange(0, 16)
    kk = tl.arange(0, 128)
    xp = x_ptr + xrow[:, None] * stride_x + kk[None, :]
    if BK == 256 and not COMPUTE_F32:
        qp = q_ptr + rows[:, None, None] * q_row_stride + ks * 128 + g[None, :, None] * 16
        b = tl.load(qp + i[None, None, :])  # (BN, 8, 16)
        sp = s_ptr + ks * s_chunk_stride + rows[:, None] * 16 + g[None, :]
        c_lo = _scale_bf16(tl.load(sp), False)
        c_hi = _scale_bf16(tl.load(sp + 8), False)
        w_lo, w_hi = _fp4x4_to_bf16_asm(b, c_lo[:, :, None], c_hi[:, :, None])
        k = ks * 256 + kk
        x_lo = tl.load(xp + ks * 256, mask=xmask[:, None] & (k[None, :] < K), other=0.0)
        x_hi = tl.load(xp + ks * 256 + 128, mask=xmask[:, None] & (k[None, :] + 128 < K), other=0.0)
        acc = tl.dot(tl.reshape(w_lo, [BN, 128]), tl.trans(x_lo), acc)
        acc = tl.dot(tl.reshape(w_hi, [BN, 128]), tl.trans(x_hi), acc)
    else:
        # BK = 256 under the interpreter runs as two half steps (the same products).
        for hh in tl.static_range(1 + (BK == 256)):
            kh = ks * (1 + (BK == 256)) + hh  # half-chunk index
            kc = kh // 2
            h = kh % 2
            qp = q_ptr + rows[:, None, None] * q_row_stride + kc * 128 + g[None, :, None] * 16
            b = tl.load(qp + i[None, None, :])
            s = tl.load(s_ptr + kc * s_chunk_stride + rows[:, None] * 16 + 8 * h + g[None, :])
            w = tl.reshape(_nibbles_to_w(b, s[:, :, None], h, COMPUTE_F32), [BN, 128])
            k = kh * 128 + kk
            x = tl.load(xp + kh * 128, mask=xmask[:, None] & (k[None, :] < K), other=0.0)
            acc = tl.dot(w.to(DOT_DTYPE), tl.trans(x.to(DOT_DTYPE)), acc)
    return acc


@triton.jit
def _prefill_gemm1(
    x_ptr,
    sorted_ptr,
    counts_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    inter_ptr,
    H,
    I,
    NP,
    KC,
    TOP_K,
    stride_x,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    NBINS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """GEMM1 + SiLU·mul for M tile ``program_id(1)`` and weight rows ``program_id(0)``.

    inter: (P, I) bf16 in sorted-row order; ``BN`` interleaved gate/up rows give ``BN / 2``
    columns of it.
    """
    nb = tl.program_id(0)
    e, row0, nrows = _tile_of(counts_ptr, tl.program_id(1), NBINS, BM)
    if nrows <= 0:
        return
    r = row0 + tl.arange(0, BM)
    rmask = tl.arange(0, BM) < nrows
    pair = tl.load(sorted_ptr + r, mask=rmask, other=0)
    tok = (pair // TOP_K).to(tl.int64)
    e64 = e.to(tl.int64)
    rows = nb * BN + tl.arange(0, BN)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for ks in range(0, _k_steps(H, KC, BK)):
        acc = _w4a16_step(
            acc,
            q_ptr + e64 * q_e_stride,
            s_ptr + e64 * s_e_stride,
            x_ptr,
            rows,
            tok,
            rmask,
            ks,
            H,
            q_row_stride,
            s_chunk_stride,
            stride_x,
            BN,
            BK,
            COMPUTE_F32,
        )
    _silu_mul_store(acc, a_ptr + e64 * NP, rows, r, rmask, inter_ptr, nb, I, BN, BM, COMPUTE_F32)


@triton.jit
def _prefill_gemm2(
    inter_ptr,
    sorted_ptr,
    counts_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    dst_ptr,
    H,
    I,
    NP,
    KC,
    TOP_K,
    stride_dst,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    NBINS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    NG: tl.constexpr,
    ATOMIC: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """GEMM2 x routing weight for M tile ``program_id(1)`` and the ``NG`` row blocks of ``BN``
    weight rows from ``program_id(0) * NG`` (the tile's rows, routing weights and expert are read
    once for all of them). ``dst``: (P, H) bf16 rows by pair
    slot, or with ``ATOMIC`` (T, H) fp32 accumulated with ``atomic_add`` (zero before the launch).
    """
    e, row0, nrows = _tile_of(counts_ptr, tl.program_id(1), NBINS, BM)
    if nrows <= 0:
        return
    r = row0 + tl.arange(0, BM)
    rmask = tl.arange(0, BM) < nrows
    pair = tl.load(sorted_ptr + r, mask=rmask, other=0)
    tw = tl.load(tw_ptr + r, mask=rmask, other=0.0).to(tl.float32)  # sorted_tw, by sorted row
    if ATOMIC:
        drow = (pair // TOP_K).to(tl.int64) * stride_dst
    else:
        drow = pair.to(tl.int64) * stride_dst
    e64 = e.to(tl.int64)
    nb0 = tl.program_id(0) * NG
    ksteps = _k_steps(I, KC, BK)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    # One flat loop over (row block, K step): the pipeliner then prefetches the next row block's
    # weights during this block's last steps and epilogue (a nested loop restarts cold per block).
    for it in range(0, tl.minimum(NG, NP // BN - nb0) * ksteps):
        rows = (nb0 + it // ksteps) * BN + tl.arange(0, BN)
        ks = it % ksteps
        acc = _w4a16_step(
            acc,
            q_ptr + e64 * q_e_stride,
            s_ptr + e64 * s_e_stride,
            inter_ptr,
            rows,
            r.to(tl.int64),
            rmask,
            ks,
            I,
            q_row_stride,
            s_chunk_stride,
            I,
            BN,
            BK,
            COMPUTE_F32,
        )
        if ks == ksteps - 1:
            alpha = tl.load(a_ptr + e64 * NP + rows) * _TWO_P26
            y = acc * alpha[:, None] * tw[None, :]
            omask = (rows[:, None] < H) & rmask[None, :]
            dp = dst_ptr + drow[None, :] + rows[:, None]
            if ATOMIC:
                tl.atomic_add(dp, y, mask=omask, sem="relaxed")
            else:
                tl.store(dp, _to_bf16(y, COMPUTE_F32), mask=omask)
            acc = tl.zeros([BN, BM], dtype=tl.float32)


@triton.jit
def _prefill_combine(
    src_ptr,
    ids_ptr,
    out_ptr,
    T,
    H,
    E,
    TOP_K,
    stride_src,
    stride_out,
    BT: tl.constexpr,
    BH: tl.constexpr,
    ATOMIC: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """out (T, H) bf16. Ordered: fp32 sum of the valid slots' rows of ``src`` (P, H) in slot order
    (a token with no valid slot gets zeros). ``ATOMIC``: ``src`` is the (T, H) fp32 accumulator."""
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    tmask = t < T
    m = tmask[:, None] & (h[None, :] < H)
    if ATOMIC:
        acc = tl.load(src_ptr + t[:, None] * stride_src + h[None, :], mask=m, other=0.0)
    else:
        acc = tl.zeros([BT, BH], dtype=tl.float32)
        for j in range(0, TOP_K):  # fixed order
            p = t * TOP_K + j
            idj = tl.load(ids_ptr + p, mask=tmask, other=-1).to(tl.int32)
            v = (idj >= 0) & (idj < E)
            y = tl.load(
                src_ptr + p[:, None] * stride_src + h[None, :], mask=m & v[:, None], other=0.0
            )
            acc += y.to(tl.float32)
    tl.store(out_ptr + t[:, None] * stride_out + h[None, :], _to_bf16(acc, COMPUTE_F32), mask=m)
