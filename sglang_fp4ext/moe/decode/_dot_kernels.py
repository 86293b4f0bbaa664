"""Triton ``tl.dot`` kernels of the NVFP4 W4A16 fused-MoE decode path (v1: the fallback of the Gluon
kernels in ``decode._gluon_kernels``, and the only decode family the interpreter runs;
``@triton.jit`` code only).

Two launches per layer, both with a static grid fixed by ``T``, ``top_k``, the shape and the config:

* ``_moe_gemm1``, grid ``(G, NB1, SPLIT_K1)``: ``inter[p, :] = silu(x[t] @ gate_e^T) *
  (x[t] @ up_e^T)`` for every pair slot ``p = t * TOP_K + j`` routed to ``e = topk_ids[t, j]``
  (bf16 ``(P, I)``). It also writes the routing lists GEMM2 reads (below).
* ``_moe_gemm2``, grid ``(G, cdiv(NB2, NT), SPLIT_K2)``: ``out[t, :] = sum_j topk_weights[t, j] *
  inter[p] @ down_e^T`` (bf16 ``(T, H)``); each program walks ``NT`` row tiles of ``BN`` rows of
  one expert (all its pairs) and the top-k sum goes through the arrival-counter combine below.
  Or ``_moe_gemm2_tok``, grid ``(T, NB2)`` (small T): one program per token and row tile walks
  the token's experts and writes its output once (no workspace, no atomics).

**Work items** come straight from ``topk_ids`` (no alignment kernel). With ``SLOT_MODE`` program
``g`` takes pair slot ``g`` and only the first slot of its expert (the leader) works; otherwise
program ``g`` takes expert ``g``. Ids ``< 0`` (other EP ranks) or ``>= E`` contribute nothing.
GEMM1 compacts the pairs of its expert in slot order (a cumsum over a match mask, ``BLOCK_P`` ids
at a time) into ``plist[e, :]`` with the count in ``pcnt[e]`` (every GEMM1 program of ``e`` writes
the same values); GEMM2 reads them instead of scanning ``topk_ids`` again. In slot mode (small P)
GEMM1 itself takes its pairs from registers (``_pairs_in_regs``), saving a global round trip.

**Tiles.** Weight rows are the MMA's M side (``BN`` rows), pairs its N side (``BT`` at a time), K
advances one layout chunk (256) per step. Launched with 2 warps, ``tl.dot`` is ``mma.sync``
(MMAv2) on every target: both operands live in registers, so the decoded weights never go through
shared memory (the pipeliner stages the packed bytes there with ``cp.async``, ``num_stages - 1``
chunks ahead). The decode lives in ``_decode_w`` (see there): on the GPU an inline-PTX packed
bf16x2 decode (``_fp4x4_to_bf16_asm``, ~2.3 instructions per weight), under the interpreter the
exact pure-Triton fp32 bit trick. K is permuted inside a chunk (``_kappa``) identically for the
weights and the activations, so each thread's MMA fragment is 32 contiguous bytes of a weight row
(wide loads, one block scale per 16 weights) - a dot product does not depend on the order of K.
Measured (Triton 3.6, sm_90 SASS, scale codes): ~3.2 instructions per weight in the GEMM1 K loop
(830 per warp and 256-deep step of a 64-row tile), of which 2.25 are the decode; wider ``BT`` (32)
spills at 255 registers. Tried on the H200 and removed: spreading GEMM1's K chunks or the token
GEMM2's experts over a CTA's warps (a batched ``tl.dot``
summed in-CTA) halved each warp's instruction chain in SASS but was within 5% at T <= 2 and up to
3.7x (TP8) / 13x (EP8) slower at T = 256 (``benchmarks/results/warp_split_ab_h200.json``, tune logs
``tune_decode_*_h200.json``): the time follows instructions per scheduler, not chain length.

**Determinism.** Split-K partials (GEMM1) and the top-k combine (GEMM2) go through an fp32
workspace and a per-tile arrival counter; the last program to arrive sums in a fixed order,
finishes the tile and resets the counter to 0, so the next launch (or CUDA-graph replay) starts
clean. Results are bit-identical run to run; there is no atomic-accumulation variant.

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


@triton.jit
def _kappa(w, R: tl.constexpr):
    """(R, 128) in byte order ``j = 32a + 4b + c`` (a < 4, b < 8, c < 4) -> K order
    ``16b + 4a + c``. Applied to weights and activations alike (a dot product is invariant under a
    common permutation of K); it makes each MMAv2 thread fragment a contiguous 32-byte run."""
    return tl.reshape(tl.permute(tl.reshape(w, [R, 4, 8, 4]), (0, 2, 1, 3)), [R, 128])


@triton.jit
def _decode_w(b, s_lo, s_hi, BN: tl.constexpr, COMPUTE_F32: tl.constexpr):
    """Packed codes ``b`` (BN, 8, 16) uint8 and scale codes (BN, 8) of the two halves of a
    chunk -> (low, high) halves (BN, 128) in ``_kappa`` order, ``w * 2^-26``, exact.

    GPU: the inline-PTX packed bf16 decode of both nibbles at once. Interpreter (``COMPUTE_F32``):
    ``_nibbles_to_w``'s fp32 bit trick, no inline asm.
    """
    if COMPUTE_F32:
        lo = _nibbles_to_w(b, s_lo[:, :, None], 0, True)
        hi = _nibbles_to_w(b, s_hi[:, :, None], 1, True)
    else:
        c_lo = _scale_bf16(s_lo, False)
        c_hi = _scale_bf16(s_hi, False)
        lo, hi = _fp4x4_to_bf16_asm(b, c_lo[:, :, None], c_hi[:, :, None])
    lo = _kappa(tl.reshape(lo, [BN, 128]), BN)
    hi = _kappa(tl.reshape(hi, [BN, 128]), BN)
    return lo, hi


@triton.jit
def _w4a16_acc(
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
    """acc (BN, BT) fp32 = W[rows, chunks kc0..kc1) @ X[xrow, same K]^T, weights times 2^-26.

    ``q_ptr``/``s_ptr`` point at one expert; ``xrow`` (BT,) int64 rows of X, ``xmask`` (BT,) valid.
    Padding columns of W are zero codes, so only the activation loads are masked along K.
    """
    DOT_DTYPE: tl.constexpr = tl.float32 if COMPUTE_F32 else tl.bfloat16
    acc = tl.zeros([BN, BT], dtype=tl.float32)
    g = tl.arange(0, 8)
    i = tl.arange(0, 16)
    kk = tl.arange(0, 128)
    qp0 = q_ptr + rows[:, None, None] * q_row_stride + g[None, :, None] * 16 + i[None, None, :]
    sp0 = s_ptr + rows[:, None] * 16 + g[None, :]
    xp0 = x_ptr + xrow[:, None] * stride_x + kk[None, :]
    for kc in range(kc0, kc1):
        b = tl.load(qp0 + kc * 128)
        sp = sp0 + kc * s_chunk_stride
        w_lo, w_hi = _decode_w(b, tl.load(sp), tl.load(sp + 8), BN, COMPUTE_F32)
        k = kc * 256 + kk
        x_lo = tl.load(xp0 + kc * 256, mask=xmask[:, None] & (k[None, :] < K), other=0.0)
        x_hi = tl.load(
            xp0 + kc * 256 + 128, mask=xmask[:, None] & (k[None, :] + 128 < K), other=0.0
        )
        x_lo = _kappa(x_lo.to(DOT_DTYPE), BT)
        x_hi = _kappa(x_hi.to(DOT_DTYPE), BT)
        acc = tl.dot(w_lo.to(DOT_DTYPE), tl.trans(x_lo), acc)
        acc = tl.dot(w_hi.to(DOT_DTYPE), tl.trans(x_hi), acc)
    return acc


@triton.jit
def _route(
    ids_ptr, plist_ptr, pcnt_ptr, pid0, P, E, SLOT_MODE: tl.constexpr, BLOCK_P: tl.constexpr
):
    """GEMM1: (expert, pairs to work on) of this program; writes ``plist[e]``/``pcnt[e]``.

    The pairs of ``e`` are compacted in slot order into ``plist[e, 0:m]``; a program that gets
    count 0 (no valid expert, or a slot that is not its expert's leader) does no GEMM work.
    """
    if SLOT_MODE:
        e = tl.load(ids_ptr + pid0).to(tl.int32)
    else:
        e = pid0
    ok = (e >= 0) & (e < E)
    lbase = plist_ptr + tl.where(ok, e, 0).to(tl.int64) * P
    m = 0
    before = 0
    for p0 in range(0, P, BLOCK_P):
        offs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
        hit = (ids == e) & ok
        h = hit.to(tl.int32)
        rank = m + tl.cumsum(h, 0) - 1
        tl.store(lbase + rank, offs, mask=hit)
        m += tl.sum(h, 0)
        before += tl.sum((hit & (offs < pid0)).to(tl.int32), 0)
    if ok:
        tl.store(pcnt_ptr + e, m)
    if SLOT_MODE:
        m = tl.where(before == 0, m, 0)  # a later slot of an expert already led: no work
    else:
        tl.debug_barrier()  # the list is read back: this CTA's writes visible to all its threads
    return e, m, lbase


@triton.jit
def _pairs_in_regs(ids_ptr, e, c, P, BT: tl.constexpr, BLOCK_P: tl.constexpr):
    """Pair slots of the ``c``-th group of ``BT`` pairs routed to ``e`` (slot order) + mask, from
    a match mask and its cumsum in registers (no global round trip; for small ``P``)."""
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
def _moe_gemm1(
    x_ptr,
    ids_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    inter_ptr,
    ws_ptr,
    cnt_ptr,
    plist_ptr,
    pcnt_ptr,
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
    """GEMM1 + SiLU·mul. ws: (SPLIT_K, P, NP) fp32; cnt: (grid0, grid1) int32, 0 between calls;
    plist: (E, P) int32, pcnt: (E,) int32 (routing lists for GEMM2)."""
    pid0 = tl.program_id(0)
    nb = tl.program_id(1)
    ks = tl.program_id(2)
    e, m, lbase = _route(ids_ptr, plist_ptr, pcnt_ptr, pid0, P, E, SLOT_MODE, BLOCK_P)
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
        if SLOT_MODE:  # small P: pairs from registers, the list stores need not land first
            pairs, pmask = _pairs_in_regs(ids_ptr, e, c, P, BT, BLOCK_P)
        else:
            slot = c * BT + tl.arange(0, BT)
            pmask = slot < m
            pairs = tl.load(lbase + slot, mask=pmask, other=0)
        tok = (pairs // TOP_K).to(tl.int64)
        acc = _w4a16_acc(
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
                if SLOT_MODE:
                    pairs, pmask = _pairs_in_regs(ids_ptr, e, c, P, BT, BLOCK_P)
                else:
                    slot = c * BT + tl.arange(0, BT)
                    pmask = slot < m
                    pairs = tl.load(lbase + slot, mask=pmask, other=0)
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
    plist_ptr,
    pcnt_ptr,
    T,
    P,
    E,
    H,
    I,
    NP,
    NB,
    stride_out,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    KC,
    CPS,
    TOP_K,
    SPLIT_K,
    NT,
    K_POW2: tl.constexpr,
    SLOT_MODE: tl.constexpr,
    BN: tl.constexpr,
    BT: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """GEMM2 x routing weight + top-k combine into ``out`` (T, H) bf16, row tiles
    ``pid1 * NT ... + NT - 1`` (of ``NB``).

    ws: (P, SPLIT_K, NP) fp32, each pair's weighted partial; cnt: (T, NB) int32 arrivals, zero
    between calls; plist/pcnt: the routing lists GEMM1 wrote.
    """
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    ks = tl.program_id(2)
    kj = tl.arange(0, K_POW2)
    if (pid0 < T) & (ks == 0):
        # A token with no local expert gets no arrival at all: write its zeros here.
        idt = tl.load(ids_ptr + pid0 * TOP_K + kj, mask=kj < TOP_K, other=-1).to(tl.int32)
        nval = tl.sum(((idt >= 0) & (idt < E)).to(tl.int32), 0)
        if nval == 0:
            for it in range(0, NT):
                rows = (pid1 * NT + it) * BN + tl.arange(0, BN)
                op = out_ptr + pid0.to(tl.int64) * stride_out + rows
                tl.store(op, tl.zeros([BN], dtype=tl.float32).to(tl.bfloat16), mask=rows < H)
    if SLOT_MODE:
        e = tl.load(ids_ptr + pid0).to(tl.int32)
        ok = (e >= 0) & (e < E)
        es = tl.where(ok, e, 0)
        lead = tl.load(plist_ptr + es.to(tl.int64) * P) == pid0
        m = tl.where(ok & lead, tl.load(pcnt_ptr + es), 0)
    else:
        e = pid0
        m = tl.where(e < E, tl.load(pcnt_ptr + tl.minimum(e, E - 1)), 0)
    if m == 0:
        return
    e64 = e.to(tl.int64)
    lbase = plist_ptr + e64 * P
    qe = q_ptr + e64 * q_e_stride
    se = s_ptr + e64 * s_e_stride
    kc0 = ks * CPS
    kc1 = tl.minimum(kc0 + CPS, KC)
    nchunk = tl.cdiv(m, BT)
    nb_end = tl.minimum(pid1 * NT + NT, NB)
    for nb in range(pid1 * NT, nb_end):
        rows = nb * BN + tl.arange(0, BN)
        alpha = tl.load(a_ptr + e64 * NP + rows) * _TWO_P26
        for c in range(0, nchunk):
            slot = c * BT + tl.arange(0, BT)
            pmask = slot < m
            pairs = tl.load(lbase + slot, mask=pmask, other=0)
            acc = _w4a16_acc(
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
            cp = cnt_ptr + tok * NB + nb
            old = tl.atomic_add(cp, 1, mask=pmask, sem="acq_rel")
            idt = tl.load(
                ids_ptr + tok[:, None] * TOP_K + kj[None, :],
                mask=pmask[:, None] & (kj[None, :] < TOP_K),
                other=-1,
            ).to(tl.int32)
            nval = tl.sum(((idt >= 0) & (idt < E)).to(tl.int32), 1)
            last = pmask & (old == nval * SPLIT_K - 1)
            if tl.sum(last.to(tl.int32), 0) > 0:  # some token of this group is complete: combine
                tl.debug_barrier()
                tok64 = tok.to(tl.int64)
                o = tl.zeros([BT, BN], dtype=tl.float32)
                for j in range(0, TOP_K):  # fixed order: slot j, then split s
                    idj = tl.load(ids_ptr + tok * TOP_K + j, mask=last, other=-1).to(tl.int32)
                    vj = last & (idj >= 0) & (idj < E)
                    for s in range(0, SPLIT_K):
                        rp = (tok64 * TOP_K + j) * SPLIT_K + s
                        rp = ws_ptr + rp[:, None] * NP + rows[None, :]
                        o += tl.load(rp, mask=vj[:, None], other=0.0, cache_modifier=".cg")
                op = out_ptr + tok64[:, None] * stride_out + rows[None, :]
                tl.store(op, _to_bf16(o, COMPUTE_F32), mask=last[:, None] & (rows[None, :] < H))
                tl.store(cp, tl.zeros([BT], dtype=tl.int32), mask=last)


@triton.jit
def _moe_gemm2_tok(
    inter_ptr,
    ids_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    out_ptr,
    T,
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
    TOP_K,
    K_POW2: tl.constexpr,
    BN: tl.constexpr,
    BT: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """Token-centric GEMM2 (small T): program ``(t, nb)`` owns ``out[t, nb * BN ...]`` and walks
    the token's valid slots in slot order, ``KC`` chunks each, in one pipelined loop:
    ``out[t] = sum_j tw[t, j] * alpha_e * (inter[p] @ down_e^T)``. No workspace, no atomics, one
    store per output; deterministic. An expert shared by several tokens is streamed once per
    token (programs of one row tile run together, so repeats mostly hit L2): use while experts
    see ~1 token each. The pair sits in column 0 of a ``BT``-wide MMA tile (the rest masked).
    """
    t = tl.program_id(0)
    nb = tl.program_id(1)
    rows = nb * BN + tl.arange(0, BN)
    kj = tl.arange(0, K_POW2)
    idt = tl.load(ids_ptr + t * TOP_K + kj, mask=kj < TOP_K, other=-1).to(tl.int32)
    valid = (idt >= 0) & (idt < E)
    rank = tl.cumsum(valid.to(tl.int32), 0) - 1
    nv = tl.sum(valid.to(tl.int32), 0)
    col = tl.arange(0, BT)
    g = tl.arange(0, 8)
    i = tl.arange(0, 16)
    kk = tl.arange(0, 128)
    DOT_DTYPE: tl.constexpr = tl.float32 if COMPUTE_F32 else tl.bfloat16
    acc = tl.zeros([BN, BT], dtype=tl.float32)
    part = tl.zeros([BN, BT], dtype=tl.float32)
    for it in range(0, nv * KC):
        n = it // KC
        kc = it - n * KC
        sel = valid & (rank == n)
        j = tl.sum(tl.where(sel, kj, 0), 0)  # slot of the n-th valid expert
        e64 = tl.sum(tl.where(sel, idt, 0), 0).to(tl.int64)
        p = t * TOP_K + j
        qp = (
            q_ptr
            + e64 * q_e_stride
            + rows[:, None, None] * q_row_stride
            + kc * 128
            + g[None, :, None] * 16
            + i[None, None, :]
        )
        sp = s_ptr + e64 * s_e_stride + kc * s_chunk_stride + rows[:, None] * 16 + g[None, :]
        w_lo, w_hi = _decode_w(tl.load(qp), tl.load(sp), tl.load(sp + 8), BN, COMPUTE_F32)
        k = kc * 256 + kk
        xm = (col[:, None] == 0) & (k[None, :] < I)
        xp = inter_ptr + p.to(tl.int64) * I + col[:, None] * 0 + k[None, :]
        x_lo = _kappa(tl.load(xp, mask=xm, other=0.0).to(DOT_DTYPE), BT)
        x_hi = tl.load(xp + 128, mask=(col[:, None] == 0) & (k[None, :] + 128 < I), other=0.0)
        x_hi = _kappa(x_hi.to(DOT_DTYPE), BT)
        part = tl.dot(w_lo.to(DOT_DTYPE), tl.trans(x_lo), part)
        part = tl.dot(w_hi.to(DOT_DTYPE), tl.trans(x_hi), part)
        # After an expert's last chunk: weight its partial, add, restart (branch-free for the
        # software pipeliner).
        done = kc == KC - 1
        alpha = tl.load(a_ptr + e64 * NP + rows) * _TWO_P26
        coef = tl.where(done, alpha * tl.load(tw_ptr + p).to(tl.float32), 0.0)
        acc += part * coef[:, None]
        part = tl.where(done, 0.0, part)
    o = tl.sum(tl.where(col[None, :] == 0, acc, 0.0), 1)
    op = out_ptr + t.to(tl.int64) * stride_out + rows
    tl.store(op, _to_bf16(o, COMPUTE_F32), mask=rows < H)


@triton.jit
def _decode_probe(
    q_ptr,
    s_ptr,
    out_ptr,
    KC,
    q_row_stride,
    s_chunk_stride,
    BN: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    """Test kernel: the decode of ``_w4a16_acc`` alone. Program ``(nb, kc)`` writes rows
    ``nb * BN ...`` of chunk ``kc`` as fp32 ``w * 2^-26`` to ``out`` (Np, KC * 256) in natural K
    order (the ``_kappa`` permutation undone by the store addresses)."""
    nb = tl.program_id(0)
    kc = tl.program_id(1)
    rows = nb * BN + tl.arange(0, BN)
    g = tl.arange(0, 8)
    i = tl.arange(0, 16)
    qp = q_ptr + rows[:, None, None] * q_row_stride + g[None, :, None] * 16 + i[None, None, :]
    b = tl.load(qp + kc * 128)
    sp = s_ptr + kc * s_chunk_stride + rows[:, None] * 16 + g[None, :]
    w_lo, w_hi = _decode_w(b, tl.load(sp), tl.load(sp + 8), BN, COMPUTE_F32)
    kap = tl.arange(0, 128)
    j = 32 * ((kap // 4) % 4) + 4 * (kap // 16) + kap % 4  # byte order of K position kap
    op = out_ptr + rows[:, None].to(tl.int64) * (KC * 256) + kc * 256 + j[None, :]
    tl.store(op, w_lo.to(tl.float32))
    tl.store(op + 128, w_hi.to(tl.float32))


@triton.jit
def _scale_probe(c_ptr, gpu_ptr, interp_ptr, N: tl.constexpr):
    """Test kernel: ``_scale_bf16``'s GPU form (as fp32) and interpreter form for ``N`` codes."""
    i = tl.arange(0, N)
    c = tl.load(c_ptr + i)
    tl.store(gpu_ptr + i, _scale_bf16(c, False).to(tl.float32))
    tl.store(interp_ptr + i, _scale_bf16(c, True))
