"""Gluon kernels of the NVFP4 W4A16 decode path, v2 (``@gluon.jit`` code and the layouts it uses).

Same work split, routing, workspaces and determinism as the ``tl.dot`` kernels in
``decode._dot_kernels`` (read their docstring first): ``_gemm1`` = ``_moe_gemm1`` (GEMM1 + SiLU·mul,
split-K through the fp32 workspace and arrival counters, the routing lists for GEMM2),
``_gemm2_tok`` = ``_moe_gemm2_tok`` (token-centric GEMM2 with the routing weight and top-k sum) and
``_gemm2`` = ``_moe_gemm2`` (pairs GEMM2; with ``COMBINE`` off it only writes partials and
``_combine`` sums them in a third launch). Beyond v1: ``SPLIT_T`` spreads an expert's pair chunks
over programs, ``_gemm1_kstack`` stacks GEMM1's K splits on one program's warps (``kstack1``)
and ``_gemm2_tok_slots`` is the token GEMM2 with a token's slots side by side (``slots2``).
What Gluon changes is where the bytes go:

* **No shared memory.** Each thread loads its MMA A-fragment bytes straight from global memory
  into registers (``weight_layout``: 32 contiguous code bytes per row, two 16-byte loads), decodes
  them there with the same inline PTX as v1 and hands them to ``mma.sync`` (``mma_v2``). v1's
  pipeliner staged the codes through shared memory with ``cp.async`` in an unswizzled layout
  (61-68% of the shared wavefronts bank-conflicted, MIO-throttled; docs/performance.md); here the
  shared-memory pipe is unused in the K loop.
* **Register double buffering.** The next K chunk's codes, scales and activations are loaded
  before the current chunk is decoded, so their latency hides behind the decode and MMAs.
* **K order.** The MMA does not care in which order K is summed as long as both operands agree.
  Byte ``j = 32q + 4b + 2c1 + c0`` of a 128-byte half chunk goes to k-step ``b``, k-slot ``8c1 +
  2q + c0``: exactly the slots thread ``q`` of an m16n8k16 fragment holds, so the layout change
  from the load layout to the dot-operand layout is a register renaming
  (``convert_layout(..., assert_trivial=True)`` proves it at compile time). Activations use the
  same order.
* **Row order.** Within each 16-row MMA tile, MMA row ``8h + g`` reads weight row ``2g + h``: the
  gate row ``2j`` and up row ``2j + 1`` of the interleaved w13 land in the same thread's
  accumulators, so SiLU·mul is register-local.
* **Programmatic dependent launch** (``PDL`` 1 or 2, sm_90+, launched with Triton's
  ``launch_pdl``): a kernel may start before the one ahead of it in the stream has finished; with
  1 a kernel lets the next start at once, with 2 GEMM1 does so after its K loops and the others
  at their exit (the next kernel's programs are then placed as these finish). Each waits
  (``griddepcontrol.wait``) before it writes anything or reads what an earlier kernel of the call
  wrote; before that wait a GEMM2 only reads the routing ids and asks L2 for its weights
  (``prefetch.global.L2``), so results are the same to the bit with or without it.

Layouts are built on the host (``weight_layout``, ``act_layout``, ``mma_layout``) and passed as
constexpr arguments. Gluon kernels do not run under the Triton interpreter; the CPU tier
compiles them ahead of time (``tests/test_gluon_aot.py``) and the GPU tier checks them against the
torch twin.
"""

import functools

from sglang_fp4ext.moe._common import (
    _LANES,
    _TWO_P26,
    _add,
    _bf16x2,
    _decode_chunk,
    _log2,
    _mma_k_order,
    _phys_row,
    _prefetch_rows,
    weight_layout,
)
from sglang_fp4ext.moe._gluon_compat import barrier, gl, gluon, mma_v2


def act_layout(BT: int, W: int):
    """[BT columns, 8 groups, 8 words] int32 (bf16 pairs) activations of one half chunk: the
    B-fragment twin of ``weight_layout`` (columns ``g`` and ``g + 8``), the same in every warp."""
    reg = [[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 1, 0]]
    reg += [[8 << i, 0, 0] for i in range(_log2(BT // 8))]
    return gl.DistributedLinearLayout(reg, _LANES, [[0, 0, 0]] * _log2(W), [], [BT, 8, 8])


def mma_layout(W: int):
    """``mma.sync`` m16n8 accumulators, warps stacked along the weight rows."""
    return gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])


@functools.cache
def layouts(BN: int, BT: int, W: int) -> dict:
    """The constexpr layout arguments of ``_gemm1`` / ``_gemm2_tok`` for one config."""
    return dict(WL=weight_layout(BN, W), XL=act_layout(BT, W), ML=mma_layout(W))


# ---- building blocks ----


@gluon.jit
def _half_chunk_mma(
    acc, b, slo, shi, xlo, xhi, BN: gl.constexpr, BT: gl.constexpr, ML: gl.constexpr
):
    """acc += decode(b) @ x^T for one 256-deep chunk: code words ``b`` [BN, 8, 4] int32, scale
    codes [BN, 8] per half, activations [BT, 8, 8] int32 (bf16 pairs) per half."""
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=ML, k_width=2)
    a_lo, a_hi = _decode_chunk(b, slo, shi, BN, ML)
    x = gl.reshape(_bf16x2(xlo), [BT, 8, 16])
    x = gl.convert_layout(gl.permute(_mma_k_order(x, BT), [1, 0]), B_OP, assert_trivial=True)
    acc = mma_v2(a_lo, x, acc)
    x = gl.reshape(_bf16x2(xhi), [BT, 8, 16])
    x = gl.convert_layout(gl.permute(_mma_k_order(x, BT), [1, 0]), B_OP, assert_trivial=True)
    return mma_v2(a_hi, x, acc)


@gluon.jit
def _load_w(qe, se, qoff, soff, kc, s_chunk_stride, WQ=None, WS=None):
    # WQ / WS: optional row masks of the codes / scales (rows of absent experts read nothing).
    sp = se + kc * s_chunk_stride + soff
    return gl.load(qe + qoff + kc * 32, mask=WQ), gl.load(sp, mask=WS), gl.load(sp + 8, mask=WS)


@gluon.jit
def _load_x(xp, xmask, goff, kc, K, CACHE: gl.constexpr):
    # K is a multiple of 16: the mask is constant per 16-element group, so the loads stay 16 B wide.
    k = kc * 256 + goff
    lo = gl.load(xp + kc * 128, mask=xmask & (k < K), other=0, cache_modifier=CACHE)
    hi = gl.load(xp + kc * 128 + 64, mask=xmask & (k + 128 < K), other=0, cache_modifier=CACHE)
    return lo, hi


@gluon.jit
def _w4a16_acc(
    qe,
    se,
    qoff,
    soff,
    xp,
    xmask,
    goff,
    kc0,
    kc1,
    K,
    s_chunk_stride,
    BN: gl.constexpr,
    BT: gl.constexpr,
    ML: gl.constexpr,
    WQ=None,
    WS=None,
    XCACHE: gl.constexpr = "",
):
    """acc [BN, BT] fp32 (MMA layout) over chunks kc0..kc1 (kc1 > kc0). While a chunk is decoded,
    the next chunk's codes, scales and activations are in flight (activations come from L2).
    Prefetches past kc1 re-read its last chunk (L1 hits). ``WQ`` / ``WS``: ``_load_w``'s row
    masks; ``XCACHE``: the activations' cache modifier (".cg": written by this grid)."""
    k0 = gl.minimum(kc0, kc1 - 1)  # an empty split (kc1 <= kc0) must not read past the weights
    b, slo, shi = _load_w(qe, se, qoff, soff, k0, s_chunk_stride, WQ, WS)
    xlo, xhi = _load_x(xp, xmask, goff, k0, K, XCACHE)
    acc = gl.zeros([BN, BT], gl.float32, ML)
    for kc in range(kc0, kc1):
        kn = gl.minimum(kc + 1, kc1 - 1)
        b_n, slo_n, shi_n = _load_w(qe, se, qoff, soff, kn, s_chunk_stride, WQ, WS)
        xlo_n, xhi_n = _load_x(xp, xmask, goff, kn, K, XCACHE)
        acc = _half_chunk_mma(acc, b, slo, shi, xlo, xhi, BN, BT, ML)
        b, slo, shi = b_n, slo_n, shi_n
        xlo, xhi = xlo_n, xhi_n
    return acc


# ---- code slots in shared memory (the prefill code ring) ----


# ---- programmatic dependent launch (module docstring) ----


@gluon.jit
def _gdc_wait():
    """Block until the grid this one depends on has finished and its writes are visible."""
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _gdc_launch_dependents():
    """Let the next kernel of the stream start once every program of this grid has said so."""
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; mov.b32 $0, 0;",
        "=r",
        [],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _prefetch_weights(
    q_ptr,
    s_ptr,
    es,
    eok,
    row0,
    kc0,
    kc1,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    BN: gl.constexpr,
    PF: gl.constexpr,
):
    """L2 prefetch of rows ``row0 .. row0 + BN`` of experts ``es`` (where ``eok``; a vector in
    ``SliceLayout(1, PF)``), K chunks ``kc0 .. kc1``: one 128-byte code line per row and chunk,
    one scale line per 8 rows (the layouts of ``layout.py``)."""
    r = row0 + gl.arange(0, BN, layout=gl.SliceLayout(0, PF))
    e64 = gl.expand_dims(es.to(gl.int64), 1)
    r2 = gl.expand_dims(r, 0)
    qrow = q_ptr + e64 * q_e_stride + r2 * q_row_stride
    srow = s_ptr + e64 * s_e_stride + r2 * 16
    ok = gl.expand_dims(eok, 1) & (r2 >= 0)
    for kc in range(kc0, kc1):
        _prefetch_rows(qrow + kc * 128, srow + kc * s_chunk_stride, r2, ok)


@gluon.jit
def _route(
    ids_ptr,
    plist_ptr,
    pcnt_ptr,
    pid0,
    P,
    E,
    SLOT_MODE: gl.constexpr,
    BLOCK_P: gl.constexpr,
    PL: gl.constexpr,
):
    """v1's ``_route``: (expert, pair count to work on, its list base); writes plist/pcnt."""
    if SLOT_MODE:
        e = gl.load(ids_ptr + pid0).to(gl.int32)
    else:
        e = pid0
    ok = (e >= 0) & (e < E)
    lbase = plist_ptr + gl.where(ok, e, 0).to(gl.int64) * P
    m = 0
    before = 0
    for p0 in range(0, P, BLOCK_P):
        offs = p0 + gl.arange(0, BLOCK_P, layout=PL)
        ids = gl.load(ids_ptr + offs, mask=offs < P, other=-1).to(gl.int32)
        hit = (ids == e) & ok
        h = hit.to(gl.int32)
        rank = m + gl.associative_scan(h, 0, _add) - 1
        gl.store(lbase + rank, offs, mask=hit)
        m += gl.sum(h, 0)
        before += gl.sum((hit & (offs < pid0)).to(gl.int32), 0)
    if ok:
        gl.store(pcnt_ptr + e, m)
    if SLOT_MODE:
        m = gl.where(before == 0, m, 0)  # a later slot of an expert already led: no work
    barrier()  # the list is read back below: this CTA's stores visible to all its threads
    return e, m, lbase


@gluon.jit
def _silu_mul_store(
    acc,
    a_ptr,
    rows,
    pairs,
    pmask,
    inter_ptr,
    nb,
    I,
    BN: gl.constexpr,
    BT: gl.constexpr,
    ML: gl.constexpr,
):
    """acc [BN, BT] (MMA rows, gate/up pairs in rows ``r``, ``r + 8``) -> bf16 inter[pair, j]."""
    alpha = gl.load(a_ptr + nb * BN + _phys_row(rows)) * _TWO_P26  # per weight row (layout.py)
    y = acc * gl.expand_dims(alpha, 1)
    j = nb * (BN // 2) + (rows // 16) * 8 + rows % 8  # intermediate column of each MMA row
    ptr = inter_ptr + gl.expand_dims(pairs.to(gl.int64) * I, 0) + gl.expand_dims(j, 1)
    ok = gl.expand_dims(j < I, 1) & gl.expand_dims(pmask, 0)
    ok = ok & gl.expand_dims(rows % 16 < 8, 1)  # the gate half of each tile stores
    # rows 8h + g: split h (a register bit of the MMA layout) off, gate = h 0, up = h 1.
    g, u = gl.split(gl.permute(gl.reshape(y, [BN // 16, 2, 8, BT]), [0, 2, 3, 1]))
    pg, pu = gl.split(gl.permute(gl.reshape(ptr, [BN // 16, 2, 8, BT]), [0, 2, 3, 1]))
    og, ou = gl.split(gl.permute(gl.reshape(ok, [BN // 16, 2, 8, BT]), [0, 2, 3, 1]))
    h = g / (1.0 + gl.exp(-g)) * u
    gl.store(pg, h.to(gl.bfloat16), mask=og)


@gluon.jit
def _offsets(
    nb,
    q_row_stride,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
):
    """Per-tile index tensors: code-word and scale offsets of row tile ``nb`` (load layout, MMA
    rows -> weight rows), activation word offsets and group starts (their layout), the MMA
    columns ``n1`` of the activation rows, and the epilogue's rows / columns / weight rows."""
    SL: gl.constexpr = gl.SliceLayout(2, WL)
    r1 = gl.arange(0, BN, layout=gl.SliceLayout(1, SL))
    g1 = gl.arange(0, 8, layout=gl.SliceLayout(0, SL))
    i1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, WL)))
    prow = nb * BN + _phys_row(r1)
    soff = gl.expand_dims(prow * 16, 1) + gl.expand_dims(g1, 0)
    qoff = gl.expand_dims(prow, 1) * (q_row_stride // 4) + gl.expand_dims(g1 * 4, 0)
    qoff = gl.expand_dims(qoff, 2) + gl.expand_dims(gl.expand_dims(i1, 0), 0)  # int32 words
    XS: gl.constexpr = gl.SliceLayout(2, XL)
    n1 = gl.arange(0, BT, layout=gl.SliceLayout(1, XS))
    xg = gl.arange(0, 8, layout=gl.SliceLayout(0, XS))
    xi = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, XL)))
    koff = gl.expand_dims(gl.expand_dims(xg * 8, 0), 2) + gl.expand_dims(gl.expand_dims(xi, 0), 0)
    goff = gl.expand_dims(gl.expand_dims(xg * 16, 0), 2)  # first element of each group
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, ML))
    cols = gl.arange(0, BT, layout=gl.SliceLayout(0, ML))
    return qoff, soff, koff, goff, n1, rows, cols, nb * BN + _phys_row(rows)


# ---- kernels ----


@gluon.jit
def _gemm1(
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
    SLOT_MODE: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    BLOCK_P: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    SPLIT_T: gl.constexpr,
    PDL: gl.constexpr = 0,
):
    """``decode._dot_kernels._moe_gemm1`` in Gluon: same arguments and workspaces (ws (SPLIT_K, P,
    NP) fp32 indexed by weight row, cnt (grid0, grid1) int32 zero between calls, plist/pcnt).
    Grid axis 2 is ``SPLIT_K * SPLIT_T``: program ``ks + SPLIT_K * cs`` takes K split ``ks`` of
    the expert's pair chunks ``cs, cs + SPLIT_T, ..`` (an expert with many pairs, e.g. a fused
    shared expert, is spread over ``SPLIT_T`` programs instead of looping alone). With ``PDL``
    it touches memory only after the previous kernel has finished, then lets GEMM2 start: at
    once (1) or after its K loops (2: GEMM2's programs are placed as GEMM1's finish)."""
    PL: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    if PDL != 0:
        _gdc_wait()
    if PDL == 1:
        _gdc_launch_dependents()
    pid0 = gl.program_id(0)
    e, m, lbase = _route(ids_ptr, plist_ptr, pcnt_ptr, pid0, P, E, SLOT_MODE, BLOCK_P, PL)
    if m == 0:
        return
    pid2 = gl.program_id(2)
    _gemm1_tile(
        x_ptr,
        q_ptr,
        s_ptr,
        a_ptr,
        inter_ptr,
        ws_ptr,
        cnt_ptr,
        pid0 * gl.num_programs(1) + gl.program_id(1),
        e,
        m,
        lbase,
        gl.program_id(1),
        pid2 % SPLIT_K,
        pid2 // SPLIT_K,
        P,
        I,
        NP,
        stride_x,
        q_e_stride,
        q_row_stride,
        s_e_stride,
        s_chunk_stride,
        H,
        KC,
        CPS,
        TOP_K,
        SPLIT_K,
        SPLIT_T,
        BN,
        BT,
        WL,
        XL,
        ML,
        PDL == 2,
    )


@gluon.jit
def _gemm1_tile(
    x_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    inter_ptr,
    ws_ptr,
    cnt_ptr,
    tile,
    e,
    m,
    lbase,
    nb,
    ks,
    cs,
    P,
    I,
    NP,
    stride_x,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    H,
    KC,
    CPS,
    TOP_K,
    SPLIT_K,
    SPLIT_T: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    LATE_TRIGGER: gl.constexpr = False,
):
    """Row tile ``nb``, K split ``ks``, pair chunks ``cs, cs + SPLIT_T, ..`` of expert ``e``
    (``m > 0`` pairs listed at ``lbase``): partials through ws and the arrival counter
    ``cnt_ptr[tile]`` (``SPLIT_K * SPLIT_T`` arrivals) when K is split; whoever finishes the
    tile writes SiLU·mul to inter. With ``LATE_TRIGGER`` the next kernel may start once every
    program has left its K loops."""
    e64 = e.to(gl.int64)
    qe = q_ptr.to(gl.pointer_type(gl.int32)) + e64 * (q_e_stride // 4)
    se = s_ptr + e64 * s_e_stride
    ae = a_ptr + e64 * NP
    kc0 = ks * CPS
    kc1 = gl.minimum(kc0 + CPS, KC)

    qoff, soff, koff, goff, n1, rows, cols, wrow = _offsets(nb, q_row_stride, BN, BT, WL, XL, ML)

    nchunk = gl.cdiv(m, BT)
    for c in range(cs, nchunk, SPLIT_T):
        slot = c * BT + n1
        pm = slot < m
        pairs = gl.load(lbase + slot, mask=pm, other=0)
        tok = (pairs // TOP_K).to(gl.int64)
        xw = x_ptr.to(gl.pointer_type(gl.int32))  # bf16 pairs
        xp = xw + gl.expand_dims(gl.expand_dims(tok * (stride_x // 2), 1), 2) + koff
        xmask = gl.expand_dims(gl.expand_dims(pm, 1), 2)
        acc = _w4a16_acc(
            qe, se, qoff, soff, xp, xmask, goff, kc0, kc1, H, s_chunk_stride, BN, BT, ML, XCACHE=""
        )
        cslot = c * BT + cols
        cm = cslot < m
        cpairs = gl.load(lbase + cslot, mask=cm, other=0)
        if SPLIT_K == 1:
            _silu_mul_store(acc, ae, rows, cpairs, cm, inter_ptr, nb, I, BN, BT, ML)
        else:
            wp = ws_ptr + gl.expand_dims((ks * P + cpairs).to(gl.int64) * NP, 0)
            gl.store(wp + gl.expand_dims(wrow, 1), acc, mask=gl.expand_dims(cm, 0))
    if LATE_TRIGGER:
        _gdc_launch_dependents()
    if SPLIT_K > 1:
        barrier()  # every thread's partials are written before the release below
        cp = cnt_ptr + tile
        old = gl.atomic_add(cp, 1, sem="acq_rel")
        if old == SPLIT_K * SPLIT_T - 1:  # last to arrive: reduce in fixed split order, finish
            barrier()
            for c in range(0, nchunk):
                cslot = c * BT + cols
                cm = cslot < m
                cpairs = gl.load(lbase + cslot, mask=cm, other=0)
                acc = gl.zeros([BN, BT], gl.float32, ML)
                for s in range(0, SPLIT_K):  # fixed order
                    wp = ws_ptr + gl.expand_dims((s * P + cpairs).to(gl.int64) * NP, 0)
                    acc += gl.load(
                        wp + gl.expand_dims(wrow, 1),
                        mask=gl.expand_dims(cm, 0),
                        other=0.0,
                        cache_modifier=".cg",
                    )
                _silu_mul_store(acc, ae, rows, cpairs, cm, inter_ptr, nb, I, BN, BT, ML)
            gl.atomic_xchg(cp, 0)


@gluon.jit
def _gemm1_kstack(
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
    SLOT_MODE: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    BLOCK_P: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    KS: gl.constexpr,
    PDL: gl.constexpr = 0,
):
    """``_gemm1`` with its ``KS`` K splits on the warps of one program instead of ``KS`` programs
    (``DecodeConfig.kstack1``): program ``(slot or expert, nb)`` stacks ``KS`` copies of row tile
    ``nb`` along the MMA rows, copy ``s`` on warps of its own over K chunks ``s*CPS ..
    (s+1)*CPS`` (``KC % KS == 0``), and puts split ``s``'s activations of the pass's ``BT / KS``
    pairs in MMA columns ``s*BT/KS ..``: one MMA tile serves every split, each row keeps its own
    columns. The splits' partials go through shared memory and are summed in split order from
    zero, as ``_gemm1_tile`` sums its workspace, then SiLU·mul: the same bits as ``split_k1 = KS``
    across programs, without the workspace round trip and its arrival counter.
    ``ws_ptr`` / ``cnt_ptr`` / ``SPLIT_K`` are unused (one argument list for every GEMM1)."""
    PL: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    if PDL != 0:
        _gdc_wait()
    if PDL == 1:
        _gdc_launch_dependents()
    e, m, lbase = _route(
        ids_ptr, plist_ptr, pcnt_ptr, gl.program_id(0), P, E, SLOT_MODE, BLOCK_P, PL
    )
    if m == 0:
        return
    TPC: gl.constexpr = BT // KS
    HB: gl.constexpr = KS * BN // 2
    pg = gl.allocate_shared_memory(gl.float32, [TPC * HB], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    pu = gl.allocate_shared_memory(gl.float32, [TPC * HB], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    _gemm1_kstack_tile(
        x_ptr,
        q_ptr,
        s_ptr,
        a_ptr,
        inter_ptr,
        e,
        m,
        lbase,
        gl.program_id(1),
        pg,
        pu,
        I,
        NP,
        stride_x,
        q_e_stride,
        q_row_stride,
        s_e_stride,
        H,
        s_chunk_stride,
        CPS,
        TOP_K,
        BN,
        BT,
        WL,
        XL,
        ML,
        KS,
        PDL == 2,
    )


@gluon.jit
def _gemm1_kstack_tile(
    x_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    inter_ptr,
    e,
    m,
    lbase,
    nb,
    pg,
    pu,
    I,
    NP,
    stride_x,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    H,
    s_chunk_stride,
    CPS,
    TOP_K,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    KS: gl.constexpr,
    LATE_TRIGGER: gl.constexpr = False,
):
    """Row tile ``nb`` of expert ``e`` (``m > 0`` pairs listed at ``lbase``) with its ``KS`` K
    splits stacked on this program's warps (``_gemm1_kstack``); ``pg`` / ``pu``: shared fp32
    buffers of a pass's gate / up partials, ``[BT / KS pairs][KS splits][BN / 2 columns]``. With
    ``LATE_TRIGGER`` the next kernel may start once every program has left its K loops."""
    SB: gl.constexpr = KS * BN
    TPC: gl.constexpr = BT // KS  # pairs per pass
    e64 = e.to(gl.int64)
    qe = q_ptr.to(gl.pointer_type(gl.int32)) + e64 * (q_e_stride // 4)
    se = s_ptr + e64 * s_e_stride
    ae = a_ptr + e64 * NP
    # Weight rows: MMA row r reads row tile row r % BN from split r // BN's first chunk on.
    SL: gl.constexpr = gl.SliceLayout(2, WL)
    r1 = gl.arange(0, SB, layout=gl.SliceLayout(1, SL))
    g1 = gl.arange(0, 8, layout=gl.SliceLayout(0, SL))
    i1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, WL)))
    prow = nb * BN + _phys_row(r1 % BN)
    kb = (r1 // BN) * CPS
    qoff = gl.expand_dims(prow * (q_row_stride // 4) + kb * 32, 1) + gl.expand_dims(g1 * 4, 0)
    qoff = gl.expand_dims(qoff, 2) + gl.expand_dims(gl.expand_dims(i1, 0), 0)  # int32 words
    soff = gl.expand_dims(prow * 16 + kb * s_chunk_stride, 1) + gl.expand_dims(g1, 0)
    _q, _s, koff, goff, n1, rows, cols, _w = _offsets(nb, q_row_stride, SB, BT, WL, XL, ML)
    # Activations: column n is split n // TPC's chunks of the pass's pair n % TPC.
    xb = gl.expand_dims(gl.expand_dims((n1 // TPC) * CPS, 1), 2)
    goff = goff + xb * 256
    xw = x_ptr.to(gl.pointer_type(gl.int32)) + koff + xb * 128  # bf16 pairs
    HB: gl.constexpr = SB // 2
    OL: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    jl = gl.arange(0, BN // 2, layout=OL)  # the tile's intermediate columns
    ag = gl.load(ae + nb * BN + 2 * jl) * _TWO_P26
    au = gl.load(ae + nb * BN + 2 * jl + 1) * _TWO_P26
    j = nb * (BN // 2) + jl
    for c in range(0, gl.cdiv(m, TPC)):
        slot = c * TPC + n1 % TPC
        pm = slot < m
        pairs = gl.load(lbase + slot, mask=pm, other=0)
        tok = (pairs // TOP_K).to(gl.int64)
        xp = xw + gl.expand_dims(gl.expand_dims(tok * (stride_x // 2), 1), 2)
        xmask = gl.expand_dims(gl.expand_dims(pm, 1), 2)
        acc = _w4a16_acc(
            qe, se, qoff, soff, xp, xmask, goff, 0, CPS, H, s_chunk_stride, SB, BT, ML, XCACHE=""
        )
        if LATE_TRIGGER:
            _gdc_launch_dependents()
        for p in gl.static_range(TPC):
            own = gl.expand_dims(cols, 0) == gl.expand_dims((rows // BN) * TPC + p, 1)
            v = gl.sum(gl.where(own, acc, 0.0), 1)
            # MMA rows 16a + 8h + g (gate h = 0, up h = 1; _phys_row) -> [a, g] per half.
            vg, vu = gl.split(gl.permute(gl.reshape(v, [SB // 16, 2, 8]), [0, 2, 1]))
            pg.slice(p * HB, HB).store(gl.reshape(vg, [HB]))
            pu.slice(p * HB, HB).store(gl.reshape(vu, [HB]))
        barrier()
        for p in gl.static_range(TPC):
            g = gl.zeros([BN // 2], gl.float32, OL)
            u = gl.zeros([BN // 2], gl.float32, OL)
            for s in gl.static_range(KS):  # fixed order, from zero (as _gemm1_tile)
                g += pg.slice(p * HB + s * (BN // 2), BN // 2).load(OL)
                u += pu.slice(p * HB + s * (BN // 2), BN // 2).load(OL)
            pslot = c * TPC + p
            pair = gl.load(lbase + pslot, mask=pslot < m, other=0)
            g = g * ag
            h = g / (1.0 + gl.exp(-g)) * (u * au)
            gl.store(
                inter_ptr + pair.to(gl.int64) * I + j, h.to(gl.bfloat16), mask=(j < I) & (pslot < m)
            )
        barrier()  # the partials are read before the next pass writes them


@gluon.jit
def _tok_prologue(
    ids_ptr,
    q_ptr,
    s_ptr,
    E,
    KC,
    TOP_K,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    K_POW2: gl.constexpr,
    BN: gl.constexpr,
    PDL: gl.constexpr,
):
    """A token GEMM2 program ``(t, nb)``'s start: with ``PDL`` 1 let the next kernel start; with
    ``PDL`` ask L2 for row tile ``nb`` of each of token ``t``'s experts, then wait for GEMM1."""
    if PDL == 1:
        _gdc_launch_dependents()
    if PDL != 0:
        PF: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, gl.num_warps()], [1, 0])
        kj = gl.arange(0, K_POW2, layout=gl.SliceLayout(1, PF))
        idt = gl.load(ids_ptr + gl.program_id(0) * TOP_K + kj, mask=kj < TOP_K, other=-1)
        idt = idt.to(gl.int32)
        _prefetch_weights(
            q_ptr,
            s_ptr,
            idt,
            (idt >= 0) & (idt < E),
            gl.program_id(1) * BN,
            0,
            KC,
            q_e_stride,
            q_row_stride,
            s_e_stride,
            s_chunk_stride,
            BN,
            PF,
        )
    if PDL != 0:
        _gdc_wait()


@gluon.jit
def _gemm2_tok(
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
    K_POW2: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    PDL: gl.constexpr = 0,
):
    """``decode._dot_kernels._moe_gemm2_tok`` in Gluon: program ``(t, nb)`` owns ``out[t, nb*BN..]``
    and walks the token's valid experts in slot order (the pair in MMA column 0), one after the
    other. With ``PDL`` it first asks L2 for the weights of its row tile of every expert of the
    token while GEMM1 runs (so that walk waits on L2 rather than DRAM after its first expert),
    then waits for GEMM1; with 1 it lets the next kernel start at once, with 2 when it exits."""
    _tok_prologue(
        ids_ptr,
        q_ptr,
        s_ptr,
        E,
        KC,
        TOP_K,
        q_e_stride,
        q_row_stride,
        s_e_stride,
        s_chunk_stride,
        K_POW2,
        BN,
        PDL,
    )
    _gemm2_tok_tile(
        inter_ptr,
        ids_ptr,
        tw_ptr,
        q_ptr,
        s_ptr,
        a_ptr,
        out_ptr,
        gl.program_id(0),
        gl.program_id(1),
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
        K_POW2,
        BN,
        BT,
        WL,
        XL,
        ML,
    )


@gluon.jit
def _gemm2_tok_tile(
    inter_ptr,
    ids_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    out_ptr,
    t,
    nb,
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
    K_POW2: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
):
    """``out[t, nb*BN..]`` = sum over token ``t``'s valid experts (slot order) of the routing
    weight x GEMM2."""
    KL: gl.constexpr = gl.BlockedLayout([K_POW2], [32], [gl.num_warps()], [0])
    kj = gl.arange(0, K_POW2, layout=KL)
    idt = gl.load(ids_ptr + t * TOP_K + kj, mask=kj < TOP_K, other=-1).to(gl.int32)
    valid = (idt >= 0) & (idt < E)
    rank = gl.associative_scan(valid.to(gl.int32), 0, _add) - 1
    nv = gl.sum(valid.to(gl.int32), 0)

    qoff, soff, koff, goff, n1, rows, cols, wrow = _offsets(nb, q_row_stride, BN, BT, WL, XL, ML)
    xmask = gl.expand_dims(gl.expand_dims(n1 == 0, 1), 2)

    o = gl.zeros([BN, BT], gl.float32, ML)
    for n in range(0, nv):
        sel = valid & (rank == n)
        j = gl.sum(gl.where(sel, kj, 0), 0)  # slot of the n-th valid expert
        e = gl.sum(gl.where(sel, idt, 0), 0)
        e64 = e.to(gl.int64)
        p = t * TOP_K + j
        xp = inter_ptr.to(gl.pointer_type(gl.int32)) + p.to(gl.int64) * (I // 2) + koff
        qe = q_ptr.to(gl.pointer_type(gl.int32)) + e64 * (q_e_stride // 4)
        se = s_ptr + e64 * s_e_stride
        part = _w4a16_acc(
            qe, se, qoff, soff, xp, xmask, goff, 0, KC, I, s_chunk_stride, BN, BT, ML, XCACHE=""
        )
        coef = gl.load(a_ptr + e64 * NP + wrow) * (_TWO_P26 * gl.load(tw_ptr + p).to(gl.float32))
        o = gl.fma(part, gl.expand_dims(coef, 1), o)  # spelled out: _gemm2_tok_slots matches it
    res = gl.sum(gl.where(gl.expand_dims(cols == 0, 0), o, 0.0), 1)
    gl.store(out_ptr + t.to(gl.int64) * stride_out + wrow, res.to(gl.bfloat16), mask=wrow < H)


@gluon.jit
def _gemm2_tok_slots(
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
    K_POW2: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    PDL: gl.constexpr = 0,
):
    """``_gemm2_tok`` with the token's top-k slots side by side instead of one after the other
    (``DecodeConfig.slots2``): program ``(t, nb)`` stacks ``SP = min(K_POW2, 8)`` copies of row
    tile ``nb``, copy ``g`` in MMA rows ``g*BN ..`` on warps of its own, reading expert
    ``ids[t, s]``'s weights for slot ``s = r*SP + g`` in round ``r`` (``K_POW2 / SP`` rounds: 2
    at top_k 9; nothing is read for an invalid slot), with slot ``s``'s activations in MMA column
    ``g``: one MMA tile serves ``SP`` slots, each row keeps its own column. Each slot's product
    and coefficient go through shared memory and are summed in slot order with the same fused
    multiply-adds as ``_gemm2_tok_tile``: the same bits. A token's experts are then decoded in 1-2
    rounds of ``SP`` times the warps instead of a chain of ``top_k`` weight round trips."""
    _tok_prologue(
        ids_ptr,
        q_ptr,
        s_ptr,
        E,
        KC,
        TOP_K,
        q_e_stride,
        q_row_stride,
        s_e_stride,
        s_chunk_stride,
        K_POW2,
        BN,
        PDL,
    )
    parts = gl.allocate_shared_memory(
        gl.float32, [K_POW2 * BN], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )
    coefs = gl.allocate_shared_memory(
        gl.float32, [K_POW2 * BN], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )
    _gemm2_slots_tile(
        inter_ptr,
        ids_ptr,
        tw_ptr,
        q_ptr,
        s_ptr,
        a_ptr,
        out_ptr,
        gl.program_id(0),
        gl.program_id(1),
        parts,
        coefs,
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
        K_POW2,
        BN,
        BT,
        WL,
        XL,
        ML,
        "",
    )


@gluon.jit
def _gemm2_slots_tile(
    inter_ptr,
    ids_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    out_ptr,
    t,
    nb,
    parts,
    coefs,
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
    K_POW2: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    XCACHE: gl.constexpr,
):
    """``out[t, nb*BN..]`` with token ``t``'s slots side by side (``_gemm2_tok_slots``); ``parts``
    / ``coefs``: shared fp32 buffers of ``K_POW2 * BN`` (each slot's product and coefficient).
    ``XCACHE``: the intermediate's cache modifier (``_w4a16_acc``)."""
    SP: gl.constexpr = K_POW2 if K_POW2 < BT else BT
    SB: gl.constexpr = SP * BN
    SL: gl.constexpr = gl.SliceLayout(2, WL)
    r1 = gl.arange(0, SB, layout=gl.SliceLayout(1, SL))
    g1 = gl.arange(0, 8, layout=gl.SliceLayout(0, SL))
    i1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, WL)))
    prow = nb * BN + _phys_row(r1 % BN)
    _q, _s, koff, goff, n1, rows, cols, _w = _offsets(nb, q_row_stride, SB, BT, WL, XL, ML)
    wrow = nb * BN + _phys_row(rows % BN)
    own = gl.expand_dims(cols, 0) == gl.expand_dims(rows // BN, 1)
    for rnd in gl.static_range(K_POW2 // SP):
        # Weight rows: MMA row r reads slot rnd*SP + r // BN, row tile row r % BN.
        s1 = rnd * SP + r1 // BN
        e1 = gl.load(ids_ptr + t * TOP_K + s1, mask=s1 < TOP_K, other=-1).to(gl.int32)
        ok1 = (e1 >= 0) & (e1 < E)
        e64 = gl.where(ok1, e1, 0).to(gl.int64)
        qrow = e64 * (q_e_stride // 4) + prow * (q_row_stride // 4)
        qoff = gl.expand_dims(gl.expand_dims(qrow, 1) + gl.expand_dims(g1 * 4, 0), 2)
        qoff = qoff + gl.expand_dims(gl.expand_dims(i1, 0), 0)  # int32 words
        soff = gl.expand_dims(e64 * s_e_stride + prow * 16, 1) + gl.expand_dims(g1, 0)
        ws = gl.expand_dims(ok1, 1)
        # Activations: column n is slot rnd*SP + n's pair.
        sn = rnd * SP + n1
        en = gl.load(ids_ptr + t * TOP_K + sn, mask=(n1 < SP) & (sn < TOP_K), other=-1)
        okn = (en >= 0) & (en < E)
        pn = (t * TOP_K + gl.where(okn, sn, 0)).to(gl.int64)
        xp = inter_ptr.to(gl.pointer_type(gl.int32)) + koff
        xp = xp + gl.expand_dims(gl.expand_dims(pn * (I // 2), 1), 2)
        xmask = gl.expand_dims(gl.expand_dims(okn, 1), 2)
        acc = _w4a16_acc(
            q_ptr.to(gl.pointer_type(gl.int32)),
            s_ptr,
            qoff,
            soff,
            xp,
            xmask,
            goff,
            0,
            KC,
            I,
            s_chunk_stride,
            SB,
            BT,
            ML,
            gl.expand_dims(ws, 2),
            ws,
            XCACHE,
        )
        # Each row's own column and coefficient (routing weight x alpha, as _gemm2_tok_tile).
        sr = rnd * SP + rows // BN
        er = gl.load(ids_ptr + t * TOP_K + sr, mask=sr < TOP_K, other=-1).to(gl.int32)
        okr = (er >= 0) & (er < E)
        a = gl.load(a_ptr + gl.where(okr, er, 0).to(gl.int64) * NP + wrow, mask=okr, other=0.0)
        tw = gl.load(tw_ptr + t * TOP_K + sr, mask=okr, other=0).to(gl.float32)
        parts.slice(rnd * SB, SB).store(gl.sum(gl.where(own, acc, 0.0), 1))
        coefs.slice(rnd * SB, SB).store(a * (_TWO_P26 * tw))
    barrier()
    OL: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    lr = nb * BN + _phys_row(gl.arange(0, BN, layout=OL))
    o = gl.zeros([BN], gl.float32, OL)
    for s in gl.static_range(K_POW2):
        es = gl.load(ids_ptr + t * TOP_K + s, mask=s < TOP_K, other=-1).to(gl.int32)
        term = gl.fma(parts.slice(s * BN, BN).load(OL), coefs.slice(s * BN, BN).load(OL), o)
        o = gl.where((es >= 0) & (es < E), term, o)
    gl.store(out_ptr + t.to(gl.int64) * stride_out + lr, o.to(gl.bfloat16), mask=lr < H)
    barrier()  # the sums are read before the next tile writes them


@gluon.jit
def _gemm2(
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
    K_POW2: gl.constexpr,
    SLOT_MODE: gl.constexpr,
    BN: gl.constexpr,
    BT: gl.constexpr,
    WL: gl.constexpr,
    XL: gl.constexpr,
    ML: gl.constexpr,
    COMBINE: gl.constexpr,
    SPLIT_T: gl.constexpr,
    PDL: gl.constexpr = 0,
):
    """``decode._dot_kernels._moe_gemm2`` in Gluon (same arguments and workspaces): GEMM2 x routing
    weight for all pairs of one expert, row tiles ``pid1 * NT ..``, and with ``COMBINE`` the
    arrival-counter top-k combine (ws (P, SPLIT_K, NP) fp32 by weight row; cnt (T, NB) int32,
    zero between calls). Without it the partials are all it writes: ``_combine`` follows. Grid
    axis 2 is ``SPLIT_K * SPLIT_T`` as in ``_gemm1`` (pair chunks spread over programs). With
    ``PDL`` it starts while GEMM1 runs; on the slot grid (the expert is its slot's id, known
    before GEMM1 ends) it asks L2 for its row tiles' weights first, then waits for GEMM1 (next
    kernel: as ``_gemm2_tok``)."""
    KL: gl.constexpr = gl.BlockedLayout([K_POW2], [32], [gl.num_warps()], [0])
    TL: gl.constexpr = gl.BlockedLayout([K_POW2, 1], [1, 32], [1, gl.num_warps()], [0, 1])
    pid0 = gl.program_id(0)
    pid1 = gl.program_id(1)
    pid2 = gl.program_id(2)
    ks = pid2 % SPLIT_K
    cs = pid2 // SPLIT_K
    if PDL != 0:
        if PDL == 1:
            _gdc_launch_dependents()
        if SLOT_MODE:
            PF: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, gl.num_warps()], [1, 0])
            es = gl.load(ids_ptr + pid0 + gl.zeros([1], gl.int32, gl.SliceLayout(1, PF)))
            es = es.to(gl.int32)
            for nb in range(pid1 * NT, gl.minimum(pid1 * NT + NT, NB)):
                _prefetch_weights(
                    q_ptr,
                    s_ptr,
                    es,
                    (es >= 0) & (es < E),
                    nb * BN,
                    ks * CPS,
                    gl.minimum(ks * CPS + CPS, KC),
                    q_e_stride,
                    q_row_stride,
                    s_e_stride,
                    s_chunk_stride,
                    BN,
                    PF,
                )
        _gdc_wait()
    if COMBINE:
        if (pid0 < T) & (pid2 == 0):
            # A token with no local expert gets no arrival at all: write its zeros here.
            kj = gl.arange(0, K_POW2, layout=KL)
            idt = gl.load(ids_ptr + pid0 * TOP_K + kj, mask=kj < TOP_K, other=-1).to(gl.int32)
            nval = gl.sum(((idt >= 0) & (idt < E)).to(gl.int32), 0)
            if nval == 0:
                zr = gl.arange(0, BN, layout=KL)
                for it in range(0, NT):
                    r = (pid1 * NT + it) * BN + zr
                    gl.store(
                        out_ptr + pid0.to(gl.int64) * stride_out + r,
                        gl.zeros([BN], gl.bfloat16, KL),
                        mask=r < H,
                    )
    if SLOT_MODE:
        e = gl.load(ids_ptr + pid0).to(gl.int32)
        ok = (e >= 0) & (e < E)
        es = gl.where(ok, e, 0)
        lead = gl.load(plist_ptr + es.to(gl.int64) * P) == pid0
        m = gl.where(ok & lead, gl.load(pcnt_ptr + es), 0)
    else:
        e = pid0
        m = gl.where(e < E, gl.load(pcnt_ptr + gl.minimum(e, E - 1)), 0)
    if m == 0:
        return
    e64 = e.to(gl.int64)
    lbase = plist_ptr + e64 * P
    qe = q_ptr.to(gl.pointer_type(gl.int32)) + e64 * (q_e_stride // 4)
    se = s_ptr + e64 * s_e_stride
    xw = inter_ptr.to(gl.pointer_type(gl.int32))  # bf16 pairs
    kc0 = ks * CPS
    kc1 = gl.minimum(kc0 + CPS, KC)
    nchunk = gl.cdiv(m, BT)
    for nb in range(pid1 * NT, gl.minimum(pid1 * NT + NT, NB)):
        qoff, soff, koff, goff, n1, rows, cols, wrow = _offsets(
            nb, q_row_stride, BN, BT, WL, XL, ML
        )
        alpha = gl.load(a_ptr + e64 * NP + wrow) * _TWO_P26
        for c in range(cs, nchunk, SPLIT_T):
            slot = c * BT + n1
            pm = slot < m
            pairs = gl.load(lbase + slot, mask=pm, other=0)
            xp = xw + gl.expand_dims(gl.expand_dims(pairs.to(gl.int64) * (I // 2), 1), 2) + koff
            xmask = gl.expand_dims(gl.expand_dims(pm, 1), 2)
            acc = _w4a16_acc(
                qe,
                se,
                qoff,
                soff,
                xp,
                xmask,
                goff,
                kc0,
                kc1,
                I,
                s_chunk_stride,
                BN,
                BT,
                ML,
                XCACHE="",
            )
            cslot = c * BT + cols
            cm = cslot < m
            cpairs = gl.load(lbase + cslot, mask=cm, other=0)
            tw = gl.load(tw_ptr + cpairs, mask=cm, other=0.0).to(gl.float32)
            y = acc * gl.expand_dims(alpha, 1) * gl.expand_dims(tw, 0)
            tok = cpairs // TOP_K
            wp = ws_ptr + gl.expand_dims((cpairs.to(gl.int64) * SPLIT_K + ks) * NP, 0)
            gl.store(wp + gl.expand_dims(wrow, 1), y, mask=gl.expand_dims(cm, 0))
            if COMBINE:
                barrier()  # every thread's partials are written before the release below
                kt = gl.expand_dims(gl.arange(0, K_POW2, layout=gl.SliceLayout(1, TL)), 1)
                cp = cnt_ptr + tok * NB + nb
                one = gl.full([BT], 1, gl.int32, gl.SliceLayout(0, ML))  # a scalar fails in 3.6
                old = gl.atomic_add(cp, one, mask=cm, sem="acq_rel")
                # Valid slots of each token of the group (its arrivals to wait for).
                ttok = gl.expand_dims(gl.convert_layout(tok, gl.SliceLayout(0, TL)), 0)
                tcm = gl.expand_dims(gl.convert_layout(cm, gl.SliceLayout(0, TL)), 0)
                idt = gl.load(ids_ptr + ttok * TOP_K + kt, mask=tcm & (kt < TOP_K), other=-1)
                nval = gl.sum(((idt >= 0) & (idt < E)).to(gl.int32), 0)
                nval = gl.convert_layout(nval, gl.SliceLayout(0, ML))
                last = cm & (old == nval * SPLIT_K - 1)
                if gl.sum(last.to(gl.int32), 0) > 0:  # a token of this group is complete: combine
                    barrier()
                    tok64 = tok.to(gl.int64)
                    o = gl.zeros([BN, BT], gl.float32, ML)
                    for j in range(0, TOP_K):  # fixed order: slot j, then split s
                        idj = gl.load(ids_ptr + tok * TOP_K + j, mask=last, other=-1).to(gl.int32)
                        vj = gl.expand_dims(last & (idj >= 0) & (idj < E), 0)
                        for s in range(0, SPLIT_K):
                            rp = (tok64 * TOP_K + j) * SPLIT_K + s
                            rp = ws_ptr + gl.expand_dims(rp * NP, 0)
                            o += gl.load(
                                rp + gl.expand_dims(wrow, 1),
                                mask=vj,
                                other=0.0,
                                cache_modifier=".cg",
                            )
                    op = out_ptr + gl.expand_dims(tok64 * stride_out, 0) + gl.expand_dims(wrow, 1)
                    om = gl.expand_dims(last, 0) & gl.expand_dims(wrow < H, 1)
                    gl.store(op, o.to(gl.bfloat16), mask=om)
                    gl.store(cp, gl.zeros([BT], gl.int32, gl.SliceLayout(0, ML)), mask=last)


@gluon.jit
def _combine(
    ws_ptr,
    ids_ptr,
    out_ptr,
    E,
    H,
    NP,
    stride_out,
    TOP_K,
    SPLIT_K,
    BLOCK: gl.constexpr,
    PDL: gl.constexpr = 0,
):
    """``out[t, rows]`` = the sum of token ``t``'s GEMM2 partials (ws (P, SPLIT_K, NP) fp32) in the
    fixed order slot ``j``, then split ``s`` (the order of ``_gemm2``'s in-kernel combine, so the
    result is the same to the bit); a token with no local expert gets zeros. With ``PDL`` it
    is launched while GEMM2 runs and waits for it (next kernel: as ``_gemm2_tok``)."""
    L: gl.constexpr = gl.BlockedLayout([4], [32], [gl.num_warps()], [0])
    if PDL != 0:
        _gdc_wait()
    if PDL == 1:
        _gdc_launch_dependents()
    t = gl.program_id(0)
    rows = gl.program_id(1) * BLOCK + gl.arange(0, BLOCK, layout=L)
    rm = rows < H
    o = gl.zeros([BLOCK], gl.float32, L)
    for j in range(0, TOP_K):
        e = gl.load(ids_ptr + t * TOP_K + j)
        ok = rm & (e >= 0) & (e < E)  # masked, not skipped: 0.0 is added as in _gemm2
        for s in range(0, SPLIT_K):
            rp = ws_ptr + ((t.to(gl.int64) * TOP_K + j) * SPLIT_K + s) * NP
            o += gl.load(rp + rows, mask=ok, other=0.0)
    gl.store(out_ptr + t.to(gl.int64) * stride_out + rows, o.to(gl.bfloat16), mask=rm)
