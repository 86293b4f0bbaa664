"""Gluon kernels of the NVFP4 W4A16 prefill path on Hopper, v2 (``@gluon.jit`` code and layouts).

Same grouping, M tiles, workspaces and ordered combine as the ``tl.dot`` kernels in
``prefill._dot_kernels`` (read their docstring first): ``_wgmma_gemm1`` replaces
``_prefill_gemm1`` (GEMM1 + SiLU·mul) and ``_wgmma_gemm2`` ``_prefill_gemm2`` (routing weight,
one bf16 partial row per pair slot); both run ``_grouped_wgmma``. What changes is how the decode and
the tensor cores share the warps: v1's ``tl.dot`` waits for each ``wgmma`` before it decodes the
next weights, so the FP4
decode and the MMA serialise on the same warps (docs/performance.md, Open misses: 0.19-0.22 issued
per scheduler-cycle, tensor pipe 38%). Here the loop is software-pipelined by hand:

* **Register A, asynchronous MMA.** The decoded weights are ``wgmma``'s register operand (the
  weight rows are its M side, the tile's tokens its N side, so 16-token tiles waste nothing), and
  ``wgmma`` runs asynchronously: chunk ``c + 1`` is loaded and decoded while chunk ``c``'s MMAs
  run. The decode is the v2 decode kernels' (``decode._gluon_kernels``): each thread loads
  32 contiguous code bytes per row and the change from the load layout to the MMA operand
  layout is a register renaming (``convert_layout(..., assert_trivial=True)``).
* **Activations through swizzled shared memory.** ``cp.async`` copies each tile row's 16-byte
  pieces into a ``NS``-stage ring in the 128-byte swizzled layout ``wgmma`` reads without bank
  conflicts. The MMA's K order is the decode's (``layout.mma_k_order``), so the activations must
  be stored in that order: GEMM1 reads ``x`` through a permuted copy (``prefill._dot_kernels.
  _permute_k``, one pass over ``T x H``) and writes ``inter`` already permuted for GEMM2.
* One CTA barrier per 256-deep chunk orders the ring: every thread's copies of chunk ``c`` have
  landed and every warpgroup's MMAs of chunk ``c - 1`` are done before chunk ``c``'s MMAs start
  and before chunk ``c - 1``'s buffer is refilled. In one allocation indexed at run time Triton
  adds two more per chunk (``_ring``); ``SR`` (``PrefillConfig.static_ring*``) avoids them.

K (``H`` for GEMM1, ``I`` for GEMM2) must be a multiple of 256 (``prefill.config`` checks); the
grid is ``(Np / BN, m_tiles)`` as in v1. Gluon kernels do not run under the Triton interpreter; the
CPU tier compiles them ahead of time and the GPU tier checks them against the torch twin.
"""

import functools

from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from sglang_fp4ext.moe._common import (
    _ONE_BLOCK,
    _TWO_P26,
    _add,
    _chunk_base,
    _code_slot,
    _copy_codes,
    _decode_chunk,
    _phys_row,
    _prefetch_rows,
    _read_codes,
    _scale_slot,
    ring_layouts,
    weight_layout,
)
from sglang_fp4ext.moe._gluon_compat import barrier, gl, gluon


@functools.cache
def layouts(BN: int, BM: int, W: int) -> dict:
    """The constexpr layout arguments of ``_wgmma_gemm1`` / ``_wgmma_gemm2``: ``BN`` weight rows
    (``16 W``), ``BM`` tokens, ``W`` warps (one or two warpgroups stacked along the weight rows)."""
    return dict(
        WL=weight_layout(BN, W),
        ML=gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BM, 16]
        ),
        AL=gl.BlockedLayout([1, 8], [2, 16], [W, 1], [1, 0]),
        XS=gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2),
        CL=gl.BlockedLayout([1], [32], [W], [0]),
        # GEMM2's staged store (``EPI`` bit 0): [BM tokens, BN rows] bf16, 16 bytes of a pair row.
        SL=gl.BlockedLayout([1, 8], [32 * 8 // BN, BN // 8], [W, 1], [1, 0]),
        # The code ring (``CR``): CP, SP, CW (``ring_layouts``).
        **ring_layouts(BN, W),
    )


@gluon.jit
def _tile_of(counts_ptr, m, NBINS: gl.constexpr, BM: gl.constexpr, CL: gl.constexpr):
    """``prefill._dot_kernels._tile_of``: (expert, first sorted row, rows) of M tile ``m``."""
    bins = gl.arange(0, NBINS, layout=CL)
    c = gl.load(counts_ptr + bins)
    nt = (c + BM - 1) // BM
    tend = gl.associative_scan(nt, 0, _add)
    e = gl.sum((tend <= m).to(gl.int32), 0)  # tile ends are non-decreasing
    sel = bins == e
    c_e = gl.sum(gl.where(sel, c, 0), 0)
    t0 = gl.sum(gl.where(sel, tend - nt, 0), 0)
    r0 = gl.sum(gl.where(sel, gl.associative_scan(c, 0, _add) - c, 0), 0)
    local = (m - t0) * BM
    return e, r0 + local, gl.minimum(c_e - local, BM)


@gluon.jit
def _k_slot(u):
    """Position in ``layout.mma_k_order`` of element ``u`` of a 128-wide K block."""
    return (u // 128) * 128 + ((u // 4) % 8) * 16 + ((u // 2) % 2) * 8 + ((u // 32) % 4) * 2 + u % 2


@gluon.jit
def _copy_rows(lo, hi, xp, kc):
    """Issue the ``cp.async`` copies of chunk ``kc``'s two 128-wide halves into ``lo``, ``hi``;
    they join the next commit group (GEMM1's tail rows, ``BT``, join their chunk's)."""
    cp.async_copy_global_to_shared(lo, xp + kc * 256)
    cp.async_copy_global_to_shared(hi, xp + kc * 256 + 128)


@gluon.jit
def _copy_chunk(lo, hi, xp, kc):
    """``_copy_rows``, then the commit: one group per chunk."""
    _copy_rows(lo, hi, xp, kc)
    cp.commit_group()


@gluon.jit
def _ring(BM: gl.constexpr, NS: gl.constexpr, XS: gl.constexpr):
    """The activation ring with static slots (``SR``): ``NS`` (2 or 3) stages of two [BM, 128]
    halves, each its own allocation, ``(lo0, hi0, lo1, hi1, ..)``. Triton's shared-memory barrier
    insertion tracks hazards per allocation: in one ``[2 NS, BM, 128]`` allocation indexed at run
    time it cannot tell the slot being refilled from the slots the MMAs read, and puts a CTA
    barrier before each half's copies (two per chunk; Nsight Compute, prefill_wgmma_gemm2: 13% of
    GEMM1's stall samples on the first)."""
    if NS == 2:
        r = (
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
        )
    else:
        r = (
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
            gl.allocate_shared_memory(gl.bfloat16, [BM, 128], XS),
        )
    return r


@gluon.jit
def _wgmma_gemm1(
    x_ptr,
    sorted_ptr,
    counts_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    dst_ptr,
    K,
    NOUT,
    NP,
    TOP_K,
    stride_x,
    stride_dst,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    NBINS: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    NS: gl.constexpr,
    PF: gl.constexpr,
    LP: gl.constexpr,
    SR: gl.constexpr,
    CR: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    AL: gl.constexpr,
    XS: gl.constexpr,
    CL: gl.constexpr,
    SL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    BT: gl.constexpr,
    MT: gl.constexpr,
    TM: gl.constexpr,
    TW: gl.constexpr,
):
    """GEMM1 + SiLU·mul (``_grouped_wgmma`` with ``GATED``; ``TW``: times the routing weight,
    ``PrefillConfig.tw1``); grid ``(Np1 / BN, m_tiles)`` over
    M tiles of ``TM`` rows. With GEMM1's tail (``PrefillConfig.tail1``) ``TM`` = ``BM`` + the
    tail and two launches share the tiles: the one with ``BT`` > 0 runs those with rows past
    ``BM``, their last ``BT`` on a second accumulator (layout ``MT``) fed by the same decoded
    weights; the one compiled without the tail (``BT`` = 0, ``TM`` > ``BM``) the others. One
    kernel branching between the two pipelines spilled in both (208 B of stack, local loads in
    the K loop; TP8 T = 2048, where no tile has tail rows, took 500 us against 393,
    prefill_gemm1_tail)."""
    e, row0, nrows = _tile_of(counts_ptr, gl.program_id(1), NBINS, TM, CL)
    if nrows <= 0:
        return
    if BT:  # the tail's launch: tiles with rows past BM only
        if nrows <= BM:
            return
    elif TM > BM:  # the other launch of a tailed config: the rest
        if nrows > BM:
            return
    _grouped_wgmma(
        x_ptr,
        sorted_ptr,
        tw_ptr,
        q_ptr,
        s_ptr,
        a_ptr,
        dst_ptr,
        e,
        row0,
        nrows,
        gl.program_id(0),
        K,
        NOUT,
        NP,
        TOP_K,
        stride_x,
        stride_dst,
        q_e_stride,
        q_row_stride,
        s_e_stride,
        s_chunk_stride,
        True,
        BM,
        BN,
        NS,
        1,
        PF,
        LP,
        SR,
        CR,
        0,
        WL,
        ML,
        AL,
        XS,
        CL,
        SL,
        CP,
        SP,
        CW,
        BT,
        MT,
        TW,
    )


@gluon.jit
def _wgmma_gemm2(
    x_ptr,
    sorted_ptr,
    counts_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    dst_ptr,
    K,
    NOUT,
    NP,
    TOP_K,
    stride_x,
    stride_dst,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    NBINS: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    NS: gl.constexpr,
    NG: gl.constexpr,
    PF: gl.constexpr,
    LP: gl.constexpr,
    ACCS: gl.constexpr,
    SR: gl.constexpr,
    CR: gl.constexpr,
    EPI: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    AL: gl.constexpr,
    XS: gl.constexpr,
    CL: gl.constexpr,
    SL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    HO: gl.constexpr,
    TW: gl.constexpr,
    MS: gl.constexpr,
):
    """GEMM2 x routing weight into the ordered partials, ``NG`` row blocks per program; grid
    ``(cdiv(Np2 / BN, NG), m_tiles)`` over M tiles of ``MS * BM`` rows. ``ACCS == 2``:
    ``_one_chunk_2acc`` (``K`` = 256), or ``_one_chunk_msub`` with ``MS`` > 1 (``msub2``).
    ``EPI``: the epilogue's form, ``smem_epi2`` (``_epilogue``). ``TW`` (``tw1``): GEMM1 applied
    the routing weight. ``HO`` (``hoist2``, ``ACCS == 2``): the epilogue's loads hoisted."""
    pid_m = gl.program_id(1)
    pid_n = gl.program_id(0)
    nb0 = pid_n * NG
    e, row0, nrows = _tile_of(counts_ptr, pid_m, NBINS, BM * MS, CL)
    if nrows <= 0:
        return
    if MS > 1:
        _one_chunk_msub(
            x_ptr,
            sorted_ptr,
            tw_ptr,
            q_ptr,
            s_ptr,
            a_ptr,
            dst_ptr,
            e,
            row0,
            nrows,
            nb0,
            NOUT,
            NP,
            stride_x,
            stride_dst,
            q_e_stride,
            q_row_stride,
            s_e_stride,
            BM,
            BN,
            NG,
            WL,
            ML,
            AL,
            XS,
            SL,
            CP,
            SP,
            CW,
            TW,
            MS,
        )
    elif ACCS == 2:
        _one_chunk_2acc(
            x_ptr,
            sorted_ptr,
            tw_ptr,
            q_ptr,
            s_ptr,
            a_ptr,
            dst_ptr,
            e,
            row0,
            nrows,
            nb0,
            NOUT,
            NP,
            stride_x,
            stride_dst,
            q_e_stride,
            q_row_stride,
            s_e_stride,
            BM,
            BN,
            NG,
            PF,
            LP,
            CR,
            EPI,
            WL,
            ML,
            AL,
            XS,
            CL,
            SL,
            CP,
            SP,
            CW,
            HO,
            TW,
        )
    else:
        _grouped_wgmma(
            x_ptr,
            sorted_ptr,
            tw_ptr,
            q_ptr,
            s_ptr,
            a_ptr,
            dst_ptr,
            e,
            row0,
            nrows,
            nb0,
            K,
            NOUT,
            NP,
            TOP_K,
            stride_x,
            stride_dst,
            q_e_stride,
            q_row_stride,
            s_e_stride,
            s_chunk_stride,
            False,
            BM,
            BN,
            NS,
            NG,
            PF,
            LP,
            SR,
            CR,
            EPI,
            WL,
            ML,
            AL,
            XS,
            CL,
            SL,
            CP,
            SP,
            CW,
            0,
            ML,
            TW,
        )


@gluon.jit
def _grouped_wgmma(
    x_ptr,
    sorted_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    dst_ptr,
    e,
    row0,
    nrows,
    nb0,
    K,
    NOUT,
    NP,
    TOP_K,
    stride_x,
    stride_dst,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    GATED: gl.constexpr,
    BM: gl.constexpr,
    BN: gl.constexpr,
    NS: gl.constexpr,
    NG: gl.constexpr,
    PF: gl.constexpr,
    LP: gl.constexpr,
    SR: gl.constexpr,
    CR: gl.constexpr,
    EPI: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    AL: gl.constexpr,
    XS: gl.constexpr,
    CL: gl.constexpr,
    SL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    BT: gl.constexpr,
    MT: gl.constexpr,
    TW: gl.constexpr,
):
    """Row blocks ``nb0 ..`` (``NG``, ``BN`` weight rows each) of the M tile of expert
    ``e`` (``nrows > 0`` sorted rows from ``row0``; module docstring). ``BT`` > 0 (GEMM1, one
    row block, static ring): rows ``BM ..`` of the tile (up to ``BT``) are a tail with a ring
    and an accumulator of their own, multiplied by the same decoded weights (an expert's
    tokens past a full tile cost ``BT`` more MMA columns, not a tile that decodes the weights
    again).

    Chunk ``it + PF``'s codes load and chunk ``it`` decodes while chunk ``it - 1``'s MMAs run
    (``it`` counts chunks over the program's row blocks, so the next block's first codes are
    in flight during a block's epilogue). ``PF`` (1-3) code chunks in flight per program: at
    one, a chunk's codes have one MMA's time to arrive, less than a loaded DRAM's latency (step
    1's GEMM1 streamed its weights at ~2.2 TB/s at T = 512, one chunk per ~1.1 us). The epilogue
    does not overlap the MMAs (one accumulator): at one chunk per block (GEMM2 at I = 256)
    ``_one_chunk_2acc`` does that. The activation ring re-reads a tile's chunks from L2 for
    every row block.

    ``x``: activations in MMA K order, (T, K) bf16 for GEMM1 (rows by token) or (P, K) for GEMM2
    (rows by sorted row). ``GATED`` (GEMM1): ``dst`` = inter (P, I) bf16 in MMA K order,
    ``NOUT`` = I (times the routing weight with ``TW``). Else (GEMM2): ``dst`` = partials (P, H)
    bf16 by pair slot times the routing weight (``TW``: already in ``inter``), ``NOUT`` = H.
    """
    e64 = e.to(gl.int64)
    KC = K // 256
    NIT = gl.minimum(NG, NP // BN - nb0) * KC

    nmain = gl.minimum(nrows, BM)
    xp = _act_ptrs(x_ptr, sorted_ptr, row0, nmain, TOP_K, stride_x, GATED, BM, AL)
    qe, se, qoff, soff, QB = _code_ptrs(
        q_ptr, s_ptr, e64, q_e_stride, q_row_stride, s_e_stride, BN, WL
    )
    KD = KC
    if NG == 1:
        KD = _ONE_BLOCK
    if SR:
        xs = _ring(BM, NS, XS)
        xt = xs  # unused without the tail
        xpt = xp
        if BT:  # the tail's rows (GEMM1's tail launch: nrows > BM); past its end: the last
            xt = _ring(BT, NS, XS)
            xpt = _act_ptrs(
                x_ptr, sorted_ptr, row0 + BM, nrows - BM, TOP_K, stride_x, GATED, BT, AL
            )
        cr = xs  # unused without the code ring
        if CR:  # chunks 0 .. CR - 1's codes in a group of their own, ahead of the activations
            cr = _code_slots(BN, CR)
            for i in gl.static_range(CR):
                _copy_codes(
                    cr[2 * i],
                    cr[2 * i + 1],
                    qe,
                    se,
                    QB,
                    nb0,
                    i,
                    KD,
                    NIT,
                    s_chunk_stride,
                    BN,
                    CP,
                    SP,
                )
            cp.commit_group()
        for i in gl.static_range(NS - 1):
            if BT:
                _copy_rows(xt[2 * i], xt[2 * i + 1], xpt, gl.minimum(i, NIT - 1) % KC)
            _copy_chunk(xs[2 * i], xs[2 * i + 1], xp, gl.minimum(i, NIT - 1) % KC)
        if CR:
            cp.wait_group(NS - 1)
            barrier()  # chunk 0's codes, copied by every thread, read by every thread
    else:
        xs = gl.allocate_shared_memory(gl.bfloat16, [2 * NS, BM, 128], XS)
        cr = xs  # no code ring (nor tail) without the static ring
        xt = xs
        xpt = xp
        for i in gl.static_range(NS - 1):  # past the end: re-read the last
            _copy_chunk(xs.index(2 * i), xs.index(2 * i + 1), xp, gl.minimum(i, NIT - 1) % KC)

    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ML, k_width=2)
    p_lo = gl.zeros([BN, 128], gl.bfloat16, A_OP)
    p_hi = gl.zeros([BN, 128], gl.bfloat16, A_OP)
    if CR:  # the register queue holds one chunk, read from the code ring
        q0 = _read_codes(cr[0], cr[1], BN, CW, WL)
        q1 = q0
        q2 = q0
    else:
        q0, q1, q2 = _code_queue(qe, se, qoff, soff, QB, nb0, KC, NIT, s_chunk_stride, BN, PF)
    acc = warpgroup_mma_init(gl.zeros([BN, BM], gl.float32, ML))
    acc_t = acc  # unused without the tail
    if BT:
        acc_t = warpgroup_mma_init(gl.zeros([BN, BT], gl.float32, MT))
    if NG == 1:  # no block loop: the K loop alone (fewer live registers: 214 vs 255 + spills)
        acc, p_lo, p_hi, q0, q1, q2, acc_t = _row_block(
            acc,
            p_lo,
            p_hi,
            q0,
            q1,
            q2,
            xs,
            cr,
            xp,
            qe,
            se,
            qoff,
            soff,
            QB,
            nb0,
            0,
            KC,
            KD,
            NIT,
            s_chunk_stride,
            BN,
            NS,
            PF,
            LP,
            SR,
            CR,
            WL,
            ML,
            CL,
            CP,
            SP,
            CW,
            xt,
            xpt,
            acc_t,
            BT,
        )
        y, yt, p_lo, p_hi = _mma_done(acc, acc_t, p_lo, p_hi, BT)
        if BT:  # only tiles with rows past BM run with the tail (_wgmma_gemm1)
            _epilogue(
                yt,
                sorted_ptr,
                tw_ptr,
                a_ptr,
                dst_ptr,
                e64,
                row0 + BM,
                nrows - BM,
                nb0,
                NOUT,
                NP,
                stride_dst,
                GATED,
                EPI,
                BN,
                BT,
                MT,
                SL,
                nrows - BM,
                TW,
                0,
                0,
                0,
            )
        _epilogue(
            y,
            sorted_ptr,
            tw_ptr,
            a_ptr,
            dst_ptr,
            e64,
            row0,
            nmain,
            nb0,
            NOUT,
            NP,
            stride_dst,
            GATED,
            EPI,
            BN,
            BM,
            ML,
            SL,
            nmain,
            TW,
            0,
            0,
            0,
        )
    else:
        for g in range(NIT // KC):
            acc, p_lo, p_hi, q0, q1, q2, acc_t = _row_block(
                acc,
                p_lo,
                p_hi,
                q0,
                q1,
                q2,
                xs,
                cr,
                xp,
                qe,
                se,
                qoff,
                soff,
                QB,
                nb0,
                g,
                KC,
                KD,
                NIT,
                s_chunk_stride,
                BN,
                NS,
                PF,
                LP,
                SR,
                CR,
                WL,
                ML,
                CL,
                CP,
                SP,
                CW,
                xt,
                xpt,
                acc_t,
                0,
            )
            y, p_lo, p_hi = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_lo, p_hi))
            _epilogue(
                y,
                sorted_ptr,
                tw_ptr,
                a_ptr,
                dst_ptr,
                e64,
                row0,
                nrows,
                nb0 + g,
                NOUT,
                NP,
                stride_dst,
                GATED,
                EPI,
                BN,
                BM,
                ML,
                SL,
                nrows,
                TW,
                0,
                0,
                0,
            )
            p_lo = gl.zeros([BN, 128], gl.bfloat16, A_OP)  # done: not live into the next block
            p_hi = gl.zeros([BN, 128], gl.bfloat16, A_OP)
    cp.wait_group(0)


@gluon.jit
def _act_ptrs(
    x_ptr,
    sorted_ptr,
    row0,
    nrows,
    TOP_K,
    stride_x,
    GATED: gl.constexpr,
    BM: gl.constexpr,
    AL: gl.constexpr,
):
    """Pointers [BM, 128] to the first 128 columns of the tile's activation rows: by token
    (``GATED``: GEMM1 reads ``x``) or by sorted row (GEMM2 reads ``inter``). Rows past the tile's
    end re-read its last row (results dropped): sorted slots past the valid pairs are not
    written by the grouping."""
    ia = gl.arange(0, BM, layout=gl.SliceLayout(1, AL))
    ra = row0 + gl.minimum(ia, nrows - 1)
    if GATED:
        xrow = (gl.load(sorted_ptr + ra) // TOP_K).to(gl.int64) * stride_x
    else:
        xrow = ra.to(gl.int64) * stride_x
    ka = gl.arange(0, 128, layout=gl.SliceLayout(0, AL))
    return x_ptr + gl.expand_dims(xrow, 1) + gl.expand_dims(ka, 0)


@gluon.jit
def _code_ptrs(
    q_ptr, s_ptr, e64, q_e_stride, q_row_stride, s_e_stride, BN: gl.constexpr, WL: gl.constexpr
):
    """Expert ``e64``'s code words and scale codes, and their offsets in row block 0 (MMA rows
    -> weight rows, as in decode): ``(qe, se, qoff, soff, QB)``, ``QB`` code words per block."""
    SL: gl.constexpr = gl.SliceLayout(2, WL)
    r1 = gl.arange(0, BN, layout=gl.SliceLayout(1, SL))
    g1 = gl.arange(0, 8, layout=gl.SliceLayout(0, SL))
    i1 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(0, WL)))
    prow = _phys_row(r1)
    soff = gl.expand_dims(prow * 16, 1) + gl.expand_dims(g1, 0)
    qoff = gl.expand_dims(prow, 1) * (q_row_stride // 4) + gl.expand_dims(g1 * 4, 0)
    qoff = gl.expand_dims(qoff, 2) + gl.expand_dims(gl.expand_dims(i1, 0), 0)
    qe = q_ptr.to(gl.pointer_type(gl.int32)) + e64 * (q_e_stride // 4)
    se = s_ptr + e64 * s_e_stride
    return qe, se, qoff, soff, BN * (q_row_stride // 4)


@gluon.jit
def _code_queue(
    qe, se, qoff, soff, QB, nb0, KC, NIT, s_chunk_stride, BN: gl.constexpr, PF: gl.constexpr
):
    """The code queue at the program's start: chunk 0 (``q0``), 1 (``q1``, ``PF`` >= 2) and 2
    (``q2``, ``PF`` == 3); unused slots repeat ``q0`` (never loop-carried, no registers)."""
    q0 = _load_chunk(qe, se, qoff, soff, QB, nb0, 0, KC, NIT, s_chunk_stride, BN)
    q1 = q0
    q2 = q0
    if PF >= 2:
        q1 = _load_chunk(qe, se, qoff, soff, QB, nb0, 1, KC, NIT, s_chunk_stride, BN)
    if PF == 3:
        q2 = _load_chunk(qe, se, qoff, soff, QB, nb0, 2, KC, NIT, s_chunk_stride, BN)
    return q0, q1, q2


@gluon.jit
def _load_chunk(qe, se, qoff, soff, QB, nb0, it, KC, NIT, s_chunk_stride, BN: gl.constexpr):
    """Codes and scale codes of the program's flat chunk ``it`` (``_chunk_base``)."""
    qb, sb = _chunk_base(qe, se, QB, nb0, it, KC, NIT, s_chunk_stride, BN)
    return gl.load(qb + qoff), gl.load(sb + soff), gl.load(sb + soff + 8)


@gluon.jit
def _prefetch_chunk(
    qe, se, QB, nb0, it, KC, NIT, s_chunk_stride, BN: gl.constexpr, CL: gl.constexpr
):
    """Ask L2 for flat chunk ``it``'s code lines (one 128-byte line per weight row) and scale
    lines (one per 8 rows), clamped to the last chunk as ``_load_chunk`` is
    (``PrefillConfig.l2_prefetch*``): the register queue then loads from L2, not DRAM, and
    holds no more registers."""
    qb, sb = _chunk_base(qe, se, QB, nb0, it, KC, NIT, s_chunk_stride, BN)
    r = gl.arange(0, BN, layout=CL)
    _prefetch_rows(qb + r * (QB // BN), sb + r * 16, r, r >= 0)


@gluon.jit
def _code_slots(BN: gl.constexpr, N: gl.constexpr):
    """``N`` (1-4 or 8) code slots, [BN, 32] int32 code words and [BN, 16] scale codes each, every
    one its own allocation (Triton then inserts no barrier between one slot's refill and
    another's read): ``(c0, s0, c1, s1, ..)``. The code ring (``PrefillConfig.code_ring*``) has
    one per ring stage, ``_one_chunk_2acc`` one per row block."""
    r = (_code_slot(BN), _scale_slot(BN))
    if N >= 2:
        r = (r[0], r[1], _code_slot(BN), _scale_slot(BN))
    if N >= 3:
        r = (r[0], r[1], r[2], r[3], _code_slot(BN), _scale_slot(BN))
    if N >= 4:
        r = (r[0], r[1], r[2], r[3], r[4], r[5], _code_slot(BN), _scale_slot(BN))
    if N == 8:
        r = (
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
            _code_slot(BN),
            _scale_slot(BN),
            _code_slot(BN),
            _scale_slot(BN),
            _code_slot(BN),
            _scale_slot(BN),
            _code_slot(BN),
            _scale_slot(BN),
        )
    return r


@gluon.jit
def _row_block(
    acc,
    p_lo,
    p_hi,
    q0,
    q1,
    q2,
    xs,
    cr,
    xp,
    qe,
    se,
    qoff,
    soff,
    QB,
    nb0,
    g,
    KC,
    KD,
    NIT,
    s_chunk_stride,
    BN: gl.constexpr,
    NS: gl.constexpr,
    PF: gl.constexpr,
    LP: gl.constexpr,
    SR: gl.constexpr,
    CR: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    CL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    xt,
    xpt,
    acc_t,
    BT: gl.constexpr,
):
    """The K loop of row block ``nb0 + g``: issues its MMAs (the last ones still in flight on
    return) with the code queue ``q0 .. q{PF-1}`` (chunks ``it ..``, flat ``it = g KC + kc``)
    refilled ``PF`` chunks ahead. ``SR``: ``xs`` is ``_ring``'s static slots (``KC`` a multiple
    of ``NS``, so chunk ``kc``'s slot is ``kc % NS``: the loop is unrolled by ``NS``); else one
    allocation indexed at run time. ``KD`` splits flat chunks into (block, chunk): ``KC``, or
    ``_ONE_BLOCK`` where the program has one row block (a shift, not a division by ``KC``).
    ``CR`` (static ring only): the codes come from the code ring ``cr`` (``_code_slots``, ``CR``
    slots, a multiple of ``NS`` dividing ``KC``: the loop is unrolled by ``CR``), chunk ``it``'s
    in slot ``it % CR``, not from the register queue. ``BT`` (static ring only): the tail's ring
    ``xt``, rows ``xpt`` and accumulator ``acc_t`` (returned last) ride along."""
    if SR:
        U: gl.constexpr = CR if CR else NS  # CR: a multiple of NS, a slot per unrolled chunk
        for kq in range(KC // U):
            for u in gl.static_range(U):  # ring slot u % NS; refill the previous chunk's
                acc, p_lo, p_hi, q0, q1, q2, acc_t = _chunk(
                    acc,
                    p_lo,
                    p_hi,
                    q0,
                    q1,
                    q2,
                    xs[2 * (u % NS)],
                    xs[2 * (u % NS) + 1],
                    xs[2 * ((u + NS - 1) % NS)],
                    xs[2 * ((u + NS - 1) % NS) + 1],
                    cr[2 * u],
                    cr[2 * u + 1],
                    cr[2 * ((u + 1) % U)],
                    cr[2 * ((u + 1) % U) + 1],
                    xp,
                    qe,
                    se,
                    qoff,
                    soff,
                    QB,
                    nb0,
                    g * KC + kq * U + u,
                    kq * U + u,
                    KD,
                    NIT,
                    s_chunk_stride,
                    BN,
                    NS,
                    PF,
                    LP,
                    CR,
                    WL,
                    ML,
                    CL,
                    CP,
                    SP,
                    CW,
                    xt[2 * (u % NS)],
                    xt[2 * (u % NS) + 1],
                    xt[2 * ((u + NS - 1) % NS)],
                    xt[2 * ((u + NS - 1) % NS) + 1],
                    xpt,
                    acc_t,
                    BT,
                )
    else:
        for kc in range(KC):
            it = g * KC + kc
            buf = it % NS
            nxt = (it + NS - 1) % NS
            acc, p_lo, p_hi, q0, q1, q2, acc_t = _chunk(
                acc,
                p_lo,
                p_hi,
                q0,
                q1,
                q2,
                xs.index(2 * buf),
                xs.index(2 * buf + 1),
                xs.index(2 * nxt),
                xs.index(2 * nxt + 1),
                xs,
                xs,
                xs,
                xs,
                xp,
                qe,
                se,
                qoff,
                soff,
                QB,
                nb0,
                it,
                kc,
                KD,
                NIT,
                s_chunk_stride,
                BN,
                NS,
                PF,
                LP,
                0,
                WL,
                ML,
                CL,
                CP,
                SP,
                CW,
                xs,
                xs,
                xs,
                xs,
                xpt,
                acc_t,
                0,
            )
    return acc, p_lo, p_hi, q0, q1, q2, acc_t


@gluon.jit
def _chunk(
    acc,
    p_lo,
    p_hi,
    q0,
    q1,
    q2,
    x_lo,
    x_hi,
    n_lo,
    n_hi,
    c_s,
    s_s,
    c_n,
    s_n,
    xp,
    qe,
    se,
    qoff,
    soff,
    QB,
    nb0,
    it,
    kc,
    KC,
    NIT,
    s_chunk_stride,
    BN: gl.constexpr,
    NS: gl.constexpr,
    PF: gl.constexpr,
    LP: gl.constexpr,
    CR: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    CL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    t_lo,
    t_hi,
    tn_lo,
    tn_hi,
    xpt,
    acc_t,
    BT: gl.constexpr,
):
    """Flat chunk ``it`` (``kc`` of its block): decode it while the previous chunk's MMAs run,
    start its MMAs on the ring slot ``x_lo``/``x_hi``, refill ``n_lo``/``n_hi`` (the previous
    chunk's slot) with chunk ``it + NS - 1``. Returns the accumulator, this chunk's operands
    (live until its MMAs are done) and the code queue. ``CR``: the queue is one chunk, read from
    the code ring: chunk ``it``'s slot ``c_s``/``s_s`` is refilled with chunk ``it + CR``'s
    after this chunk's barrier (in the commit group of chunk ``it + NS - 1``'s activations),
    and the next chunk's codes, landed by that barrier (copied ``CR`` chunks ahead, waited
    ``NS - 1`` ahead), are read from ``c_n``/``s_n`` into the queue. ``BT``: the same decoded
    weights also multiply the tail's slot ``t_lo``/``t_hi`` into ``acc_t`` (returned last), and
    ``tn_lo``/``tn_hi`` are refilled in the same commit group."""
    if LP:
        _prefetch_chunk(qe, se, QB, nb0, it + PF + LP, KC, NIT, s_chunk_stride, BN, CL)
    if not CR:
        qn = _load_chunk(qe, se, qoff, soff, QB, nb0, it + PF, KC, NIT, s_chunk_stride, BN)
    a_lo, a_hi = _decode_chunk(q0[0], q0[1], q0[2], BN, ML)  # overlaps the previous MMAs
    # p_lo/p_hi (the previous chunk's operands) stay live until its MMAs are done.
    acc, acc_t, p_lo, p_hi = _mma_done(acc, acc_t, p_lo, p_hi, BT)
    cp.wait_group(NS - 2)
    barrier()  # all copies of this chunk landed; every warpgroup's previous MMAs done
    fence_async_shared()
    # A block's first MMA ignores the accumulator (no register writes between MMAs).
    acc = warpgroup_mma(a_lo, x_lo.permute((1, 0)), acc, use_acc=kc > 0, is_async=True)
    acc = warpgroup_mma(a_hi, x_hi.permute((1, 0)), acc, is_async=True)
    if BT:
        acc_t = warpgroup_mma(a_lo, t_lo.permute((1, 0)), acc_t, use_acc=kc > 0, is_async=True)
        acc_t = warpgroup_mma(a_hi, t_hi.permute((1, 0)), acc_t, is_async=True)
        _copy_rows(tn_lo, tn_hi, xpt, gl.minimum(it + NS - 1, NIT - 1) % KC)
    if CR:  # every thread has read this slot (the barrier above): refill it, same commit group
        _copy_codes(c_s, s_s, qe, se, QB, nb0, it + CR, KC, NIT, s_chunk_stride, BN, CP, SP)
    _copy_chunk(n_lo, n_hi, xp, gl.minimum(it + NS - 1, NIT - 1) % KC)
    if CR:
        qn = _read_codes(c_n, s_n, BN, CW, WL)
    q0, q1, q2 = _shift(q0, q1, q2, qn, PF)
    return acc, a_lo, a_hi, q0, q1, q2, acc_t


@gluon.jit
def _mma_done(acc, acc_t, p_lo, p_hi, BT: gl.constexpr):
    """Wait for every MMA in flight, keeping their A operands ``p_lo``/``p_hi`` live until then;
    with a tail (``BT``) its accumulator ``acc_t`` is waited for too (else it is returned as
    given, unused)."""
    if BT:
        acc, acc_t, p_lo, p_hi = warpgroup_mma_wait(
            num_outstanding=0, deps=(acc, acc_t, p_lo, p_hi)
        )
    else:
        acc, p_lo, p_hi = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_lo, p_hi))
    return acc, acc_t, p_lo, p_hi


@gluon.jit
def _one_chunk_2acc(
    x_ptr,
    sorted_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    dst_ptr,
    e,
    row0,
    nrows,
    nb0,
    NOUT,
    NP,
    stride_x,
    stride_dst,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    BM: gl.constexpr,
    BN: gl.constexpr,
    NG: gl.constexpr,
    PF: gl.constexpr,
    LP: gl.constexpr,
    CR: gl.constexpr,
    EPI: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    AL: gl.constexpr,
    XS: gl.constexpr,
    CL: gl.constexpr,
    SL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    HO: gl.constexpr,
    TW: gl.constexpr,
):
    """GEMM2 when K is one chunk (``I`` = 256: GLM-5 TP8): row blocks ``nb0 ..`` (``NG``)
    of the M tile, each one chunk of MMAs, with two accumulators so that a block's epilogue
    runs while the next block's MMAs do (``_grouped_wgmma`` with one accumulator waits for
    them). The tile's activations are copied into shared memory once and read by every
    block: no ring, one barrier per program. Codes ``PF`` blocks ahead, as there.

    The blocks are unrolled (``NG`` <= 8): in a ``for`` loop, ptxas (Triton 3.6 and 3.8)
    serialises the ``wgmma``s (C7514) as soon as an epilogue reads one accumulator while the
    other's MMAs, started in an earlier iteration, run. A ragged last program (``NB`` < ``NG``)
    repeats block ``NB - 1`` and stores nothing for it.

    ``CR`` (``PrefillConfig.code_ring2`` with ``accs2`` = 2): every block's codes and scales are
    copied into shared memory when the program starts, a commit group per block, so block
    ``g``'s arrive while blocks ``< g`` run; each is read into the one-block register queue
    after the previous block's MMAs are issued.

    ``HO`` (``PrefillConfig.hoist2``): block ``g``'s global scales are loaded before its decode,
    a block ahead of their use in its epilogue, and the staged epilogue's pair rows once here
    (each was a load right before its use: the epilogue waited for DRAM once per block)."""
    e64 = e.to(gl.int64)
    NB = gl.minimum(NG, NP // BN - nb0)
    a_g = 0  # unused without HO: the epilogue loads them
    pair = 0
    if HO:
        a_g = _alpha_raw(a_ptr, e64, NP, nb0, BN, ML)
        if EPI:
            pair = _pair_rows(sorted_ptr, row0, nrows, BM, SL)

    xp = _act_ptrs(x_ptr, sorted_ptr, row0, nrows, 1, stride_x, False, BM, AL)
    xs = gl.allocate_shared_memory(gl.bfloat16, [2, BM, 128], XS)
    _copy_chunk(xs.index(0), xs.index(1), xp, 0)

    qe, se, qoff, soff, QB = _code_ptrs(
        q_ptr, s_ptr, e64, q_e_stride, q_row_stride, s_e_stride, BN, WL
    )
    if CR:
        cr = _code_slots(BN, NG)
        for i in gl.static_range(NG):
            _copy_codes(cr[2 * i], cr[2 * i + 1], qe, se, QB, nb0, i, 1, NB, 0, BN, CP, SP)
            cp.commit_group()
        cp.wait_group(NG - 1)  # the activations and block 0's codes
    else:
        cr = (xs, xs)  # unused
        q0, q1, q2 = _code_queue(qe, se, qoff, soff, QB, nb0, 1, NB, 0, BN, PF)
        cp.wait_group(0)
    barrier()
    fence_async_shared()
    x_lo = xs.index(0).permute((1, 0))
    x_hi = xs.index(1).permute((1, 0))
    # Blocks alternate between the accumulators acc_a (even) and acc_b (odd).
    if CR:
        q0 = _read_codes(cr[0], cr[1], BN, CW, WL)
    else:
        qn = _load_chunk(qe, se, qoff, soff, QB, nb0, PF, 1, NB, 0, BN)
    p_lo, p_hi = _decode_chunk(q0[0], q0[1], q0[2], BN, ML)
    acc_a = warpgroup_mma_init(gl.zeros([BN, BM], gl.float32, ML))
    acc_b = gl.zeros([BN, BM], gl.float32, ML)
    acc_a = warpgroup_mma(p_lo, x_lo, acc_a, use_acc=False, is_async=True)
    acc_a = warpgroup_mma(p_hi, x_hi, acc_a, is_async=True)
    if CR:
        if NG > 1:
            q0 = _next_block_codes(cr, 0, NG, BN, CW, WL)
        q1 = q0
        q2 = q0
    else:
        q0, q1, q2 = _shift(q0, q1, q2, qn, PF)
    for h in gl.static_range((NG - 1) // 2):
        acc_b, acc_a, p_lo, p_hi, q0, q1, q2, a_g = _block_2acc(
            acc_b,
            acc_a,
            p_lo,
            p_hi,
            q0,
            q1,
            q2,
            2 * h + 1,
            x_lo,
            x_hi,
            qe,
            se,
            qoff,
            soff,
            QB,
            nb0,
            NB,
            sorted_ptr,
            tw_ptr,
            a_ptr,
            dst_ptr,
            e64,
            row0,
            nrows,
            NOUT,
            NP,
            stride_dst,
            BN,
            BM,
            PF,
            LP,
            CR,
            EPI,
            WL,
            ML,
            CL,
            SL,
            CW,
            cr,
            NG,
            a_g,
            pair,
            HO,
            TW,
        )
        acc_a, acc_b, p_lo, p_hi, q0, q1, q2, a_g = _block_2acc(
            acc_a,
            acc_b,
            p_lo,
            p_hi,
            q0,
            q1,
            q2,
            2 * h + 2,
            x_lo,
            x_hi,
            qe,
            se,
            qoff,
            soff,
            QB,
            nb0,
            NB,
            sorted_ptr,
            tw_ptr,
            a_ptr,
            dst_ptr,
            e64,
            row0,
            nrows,
            NOUT,
            NP,
            stride_dst,
            BN,
            BM,
            PF,
            LP,
            CR,
            EPI,
            WL,
            ML,
            CL,
            SL,
            CW,
            cr,
            NG,
            a_g,
            pair,
            HO,
            TW,
        )
    if NG % 2 == 0:
        acc_b, acc_a, p_lo, p_hi, q0, q1, q2, a_g = _block_2acc(
            acc_b,
            acc_a,
            p_lo,
            p_hi,
            q0,
            q1,
            q2,
            NG - 1,
            x_lo,
            x_hi,
            qe,
            se,
            qoff,
            soff,
            QB,
            nb0,
            NB,
            sorted_ptr,
            tw_ptr,
            a_ptr,
            dst_ptr,
            e64,
            row0,
            nrows,
            NOUT,
            NP,
            stride_dst,
            BN,
            BM,
            PF,
            LP,
            CR,
            EPI,
            WL,
            ML,
            CL,
            SL,
            CW,
            cr,
            NG,
            a_g,
            pair,
            HO,
            TW,
        )
        y, p_lo, p_hi = warpgroup_mma_wait(num_outstanding=0, deps=(acc_b, p_lo, p_hi))
    else:
        y, p_lo, p_hi = warpgroup_mma_wait(num_outstanding=0, deps=(acc_a, p_lo, p_hi))
    _epilogue(
        y,
        sorted_ptr,
        tw_ptr,
        a_ptr,
        dst_ptr,
        e64,
        row0,
        nrows,
        nb0 + NB - 1,
        NOUT,
        NP,
        stride_dst,
        False,
        EPI,
        BN,
        BM,
        ML,
        SL,
        gl.where(NG - 1 < NB, nrows, 0),
        TW,
        a_g,
        pair,
        HO,
    )


@gluon.jit
def _one_chunk_msub(
    x_ptr,
    sorted_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    dst_ptr,
    e,
    row0,
    nrows,
    nb0,
    NOUT,
    NP,
    stride_x,
    stride_dst,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    BM: gl.constexpr,
    BN: gl.constexpr,
    NG: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    AL: gl.constexpr,
    XS: gl.constexpr,
    SL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    TW: gl.constexpr,
    MS: gl.constexpr,
):
    """``_one_chunk_2acc`` over an M tile of up to ``MS`` sub-tiles of ``BM`` rows
    (``PrefillConfig.msub2``; code ring, hoisted loads and staged epilogue on): each row block is
    decoded once and multiplied by every sub-tile the tile's rows reach, where ``MS`` tiles of
    ``BM`` rows decode it ``MS`` times (at I = 256 a row block is one K chunk, so its decode
    costs about its 64-column MMAs: at GLM-5 TP8 T = 4096 an expert's ~128 rows took 2-3 tiles
    of 64, each decoding all of its expert's GEMM2 weights). An expert's rows past a multiple
    of ``BM`` cost one sub-tile's MMAs, not a tile's decode. The sub-tile count is dispatched
    to a body compiled for it: the steps are unrolled, and a run-time branch among them would
    put non-``wgmma`` writes to the accumulators inside ptxas's ``wgmma`` pipeline. Shared
    memory grows by a sub-tile's activations each (``MS * BM * 512`` B): at 3 x 64 rows one CTA
    fits per SM and it lost (prefill_msub2); 2 x 64 on 4 blocks ships."""
    S = (nrows + BM - 1) // BM
    for n in gl.static_range(1, MS + 1):
        if S == n:
            _msub_body(
                x_ptr,
                sorted_ptr,
                tw_ptr,
                q_ptr,
                s_ptr,
                a_ptr,
                dst_ptr,
                e,
                row0,
                nrows,
                nb0,
                NOUT,
                NP,
                stride_x,
                stride_dst,
                q_e_stride,
                q_row_stride,
                s_e_stride,
                BM,
                BN,
                NG,
                WL,
                ML,
                AL,
                XS,
                SL,
                CP,
                SP,
                CW,
                TW,
                n,
            )


@gluon.jit
def _msub_body(
    x_ptr,
    sorted_ptr,
    tw_ptr,
    q_ptr,
    s_ptr,
    a_ptr,
    dst_ptr,
    e,
    row0,
    nrows,
    nb0,
    NOUT,
    NP,
    stride_x,
    stride_dst,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    BM: gl.constexpr,
    BN: gl.constexpr,
    NG: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    AL: gl.constexpr,
    XS: gl.constexpr,
    SL: gl.constexpr,
    CP: gl.constexpr,
    SP: gl.constexpr,
    CW: gl.constexpr,
    TW: gl.constexpr,
    S: gl.constexpr,
):
    """``_one_chunk_msub`` for a tile of ``S`` sub-tiles: steps ``k = S g + s`` (block ``g``,
    sub-tile ``s``) alternate between two accumulators as ``_one_chunk_2acc``'s blocks do; step
    ``k`` starts its MMAs, then stores step ``k - 1`` while they run. Block ``g`` is decoded at
    its first step, while the previous block's last MMAs run, and its global scales are loaded
    before that decode (used from its second step's epilogue on)."""
    e64 = e.to(gl.int64)
    NB = gl.minimum(NG, NP // BN - nb0)
    xs = gl.allocate_shared_memory(gl.bfloat16, [2 * S, BM, 128], XS)
    for j in gl.static_range(S):
        xp = _act_ptrs(x_ptr, sorted_ptr, row0 + j * BM, nrows - j * BM, 1, stride_x, False, BM, AL)
        _copy_rows(xs.index(2 * j), xs.index(2 * j + 1), xp, 0)
    cp.commit_group()
    qe, se, qoff, soff, QB = _code_ptrs(
        q_ptr, s_ptr, e64, q_e_stride, q_row_stride, s_e_stride, BN, WL
    )
    cr = _code_slots(BN, NG)
    for i in gl.static_range(NG):
        _copy_codes(cr[2 * i], cr[2 * i + 1], qe, se, QB, nb0, i, 1, NB, 0, BN, CP, SP)
        cp.commit_group()
    a_old = _alpha_raw(a_ptr, e64, NP, nb0, BN, ML)
    p0 = _pair_rows(sorted_ptr, row0, nrows, BM, SL)
    p1 = p0  # unused past S
    p2 = p0
    p3 = p0
    if S >= 2:
        p1 = _pair_rows(sorted_ptr, row0 + BM, nrows - BM, BM, SL)
    if S >= 3:
        p2 = _pair_rows(sorted_ptr, row0 + 2 * BM, nrows - 2 * BM, BM, SL)
    if S == 4:
        p3 = _pair_rows(sorted_ptr, row0 + 3 * BM, nrows - 3 * BM, BM, SL)
    cp.wait_group(NG - 1)  # the activations and block 0's codes
    barrier()
    fence_async_shared()
    q = _read_codes(cr[0], cr[1], BN, CW, WL)
    c_lo, c_hi = _decode_chunk(q[0], q[1], q[2], BN, ML)
    busy = warpgroup_mma_init(gl.zeros([BN, BM], gl.float32, ML))
    free = gl.zeros([BN, BM], gl.float32, ML)
    busy = warpgroup_mma(c_lo, xs.index(0).permute((1, 0)), busy, use_acc=False, is_async=True)
    busy = warpgroup_mma(c_hi, xs.index(1).permute((1, 0)), busy, is_async=True)
    p_lo = c_lo
    p_hi = c_hi
    if S == 1:
        if NG > 1:
            q = _next_block_codes(cr, 0, NG, BN, CW, WL)
    for k in gl.static_range(1, NG * S):  # (no constexpr assignments here: they become tensors)
        busy, free, c_lo, c_hi, p_lo, p_hi, q, a_old = _msub_step(
            busy,
            free,
            c_lo,
            c_hi,
            p_lo,
            p_hi,
            q,
            a_old,
            xs,
            cr,
            sorted_ptr,
            tw_ptr,
            a_ptr,
            dst_ptr,
            e64,
            row0,
            nrows,
            nb0,
            NB,
            NOUT,
            NP,
            stride_dst,
            BN,
            BM,
            NG,
            WL,
            ML,
            SL,
            CW,
            TW,
            p0,
            p1,
            p2,
            p3,
            k // S,
            k % S,
            S,
        )
    y, p_lo, p_hi = warpgroup_mma_wait(num_outstanding=0, deps=(busy, p_lo, p_hi))
    _msub_store(
        y,
        sorted_ptr,
        tw_ptr,
        a_ptr,
        dst_ptr,
        e64,
        row0,
        nrows,
        nb0,
        NB,
        NOUT,
        NP,
        stride_dst,
        BN,
        BM,
        ML,
        SL,
        TW,
        a_old,
        p0,
        p1,
        p2,
        p3,
        NG - 1,
        S - 1,
    )


@gluon.jit
def _msub_step(
    busy,
    free,
    c_lo,
    c_hi,
    p_lo,
    p_hi,
    q,
    a_old,
    xs,
    cr,
    sorted_ptr,
    tw_ptr,
    a_ptr,
    dst_ptr,
    e64,
    row0,
    nrows,
    nb0,
    NB,
    NOUT,
    NP,
    stride_dst,
    BN: gl.constexpr,
    BM: gl.constexpr,
    NG: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    SL: gl.constexpr,
    CW: gl.constexpr,
    TW: gl.constexpr,
    p0,
    p1,
    p2,
    p3,
    g: gl.constexpr,
    s: gl.constexpr,
    S: gl.constexpr,
):
    """Step (block ``g``, sub-tile ``s``) > 0 of ``_msub_body``: at a block's first step its
    global scales are loaded and its codes ``q`` decoded into ``c_lo``/``c_hi`` while the
    previous block's last MMAs (into ``busy``, operands ``p_lo``/``p_hi``) run; this step's MMAs
    start into ``free``; the previous step is stored once they are done. Returns the state with
    the accumulators swapped, the next block's codes read at a block's last step."""
    a_new = a_old
    if s == 0:
        a_new = _alpha_raw(a_ptr, e64, NP, nb0 + gl.minimum(g, NB - 1), BN, ML)
        c_lo, c_hi = _decode_chunk(q[0], q[1], q[2], BN, ML)
    free = warpgroup_mma(c_lo, xs.index(2 * s).permute((1, 0)), free, use_acc=False, is_async=True)
    free = warpgroup_mma(c_hi, xs.index(2 * s + 1).permute((1, 0)), free, is_async=True)
    # Two commit groups per step: the previous step's are done once at most 2 are in flight.
    y, p_lo, p_hi = warpgroup_mma_wait(num_outstanding=2, deps=(busy, p_lo, p_hi))
    if s == 0:
        _msub_store(
            y,
            sorted_ptr,
            tw_ptr,
            a_ptr,
            dst_ptr,
            e64,
            row0,
            nrows,
            nb0,
            NB,
            NOUT,
            NP,
            stride_dst,
            BN,
            BM,
            ML,
            SL,
            TW,
            a_old,
            p0,
            p1,
            p2,
            p3,
            g - 1,
            S - 1,
        )
    else:
        _msub_store(
            y,
            sorted_ptr,
            tw_ptr,
            a_ptr,
            dst_ptr,
            e64,
            row0,
            nrows,
            nb0,
            NB,
            NOUT,
            NP,
            stride_dst,
            BN,
            BM,
            ML,
            SL,
            TW,
            a_old,
            p0,
            p1,
            p2,
            p3,
            g,
            s - 1,
        )
    if s == S - 1:
        if g + 1 < NG:
            q = _next_block_codes(cr, g, NG, BN, CW, WL)
    return free, y, c_lo, c_hi, c_lo, c_hi, q, a_new


@gluon.jit
def _msub_store(
    y,
    sorted_ptr,
    tw_ptr,
    a_ptr,
    dst_ptr,
    e64,
    row0,
    nrows,
    nb0,
    NB,
    NOUT,
    NP,
    stride_dst,
    BN: gl.constexpr,
    BM: gl.constexpr,
    ML: gl.constexpr,
    SL: gl.constexpr,
    TW: gl.constexpr,
    a_raw,
    p0,
    p1,
    p2,
    p3,
    g: gl.constexpr,
    s: gl.constexpr,
):
    """The staged epilogue of step (block ``g``, sub-tile ``s``) of ``_msub_body``: rows
    ``s BM ..`` of the tile, pair rows ``p{s}``; blocks past ``NB`` (a ragged last program)
    repeat block ``NB - 1`` and store nothing."""
    pair = p0
    if s == 1:
        pair = p1
    if s == 2:
        pair = p2
    if s == 3:
        pair = p3
    n = nrows - s * BM
    _epilogue(
        y,
        sorted_ptr,
        tw_ptr,
        a_ptr,
        dst_ptr,
        e64,
        row0 + s * BM,
        n,
        nb0 + gl.minimum(g, NB - 1),
        NOUT,
        NP,
        stride_dst,
        False,
        1,
        BN,
        BM,
        ML,
        SL,
        gl.where(g < NB, n, 0),
        TW,
        a_raw,
        pair,
        True,
    )


@gluon.jit
def _block_2acc(
    free,
    busy,
    p_lo,
    p_hi,
    q0,
    q1,
    q2,
    g: gl.constexpr,
    x_lo,
    x_hi,
    qe,
    se,
    qoff,
    soff,
    QB,
    nb0,
    NB,
    sorted_ptr,
    tw_ptr,
    a_ptr,
    dst_ptr,
    e64,
    row0,
    nrows,
    NOUT,
    NP,
    stride_dst,
    BN: gl.constexpr,
    BM: gl.constexpr,
    PF: gl.constexpr,
    LP: gl.constexpr,
    CR: gl.constexpr,
    EPI: gl.constexpr,
    WL: gl.constexpr,
    ML: gl.constexpr,
    CL: gl.constexpr,
    SL: gl.constexpr,
    CW: gl.constexpr,
    cr,
    NG: gl.constexpr,
    a_prev,
    pair,
    HO: gl.constexpr,
    TW: gl.constexpr,
):
    """Block ``g`` of ``_one_chunk_2acc``: decode it while block ``g - 1``'s MMAs (into ``busy``)
    run, start its MMAs into ``free``, then store block ``g - 1`` while they run. Returns the
    accumulators swapped (``g``'s in flight, ``g - 1``'s free), the operands, the queue and
    (``HO``) block ``g``'s global scales, loaded first (``a_prev``: block ``g - 1``'s)."""
    a_g = a_prev
    if HO:  # before the decode: its ~500 cycles cover the load (no use until the next block)
        a_g = _alpha_raw(a_ptr, e64, NP, nb0 + gl.minimum(g, NB - 1), BN, ML)
    if LP:
        _prefetch_chunk(qe, se, QB, nb0, g + PF + LP, 1, NB, 0, BN, CL)
    if not CR:
        qn = _load_chunk(qe, se, qoff, soff, QB, nb0, g + PF, 1, NB, 0, BN)
    a_lo, a_hi = _decode_chunk(q0[0], q0[1], q0[2], BN, ML)
    free = warpgroup_mma(a_lo, x_lo, free, use_acc=False, is_async=True)
    free = warpgroup_mma(a_hi, x_hi, free, is_async=True)
    # Two commit groups per block: block g - 1's are done once at most 2 are in flight.
    y, p_lo, p_hi = warpgroup_mma_wait(num_outstanding=2, deps=(busy, p_lo, p_hi))
    # Blocks past NB (a ragged last program) repeat block NB - 1 and store nothing.
    _epilogue(
        y,
        sorted_ptr,
        tw_ptr,
        a_ptr,
        dst_ptr,
        e64,
        row0,
        nrows,
        nb0 + gl.minimum(g - 1, NB - 1),
        NOUT,
        NP,
        stride_dst,
        False,
        EPI,
        BN,
        BM,
        ML,
        SL,
        gl.where(g - 1 < NB, nrows, 0),
        TW,
        a_prev,
        pair,
        HO,
    )
    if CR:
        if g + 1 < NG:
            q0 = _next_block_codes(cr, g, NG, BN, CW, WL)
    else:
        q0, q1, q2 = _shift(q0, q1, q2, qn, PF)
    return free, y, a_lo, a_hi, q0, q1, q2, a_g


@gluon.jit
def _next_block_codes(
    cr, g: gl.constexpr, NG: gl.constexpr, BN: gl.constexpr, CW: gl.constexpr, WL: gl.constexpr
):
    """Block ``g + 1``'s codes from ``_code_slots``' slots, once its commit group has landed
    (``NG - 2 - g`` newer groups may still be in flight) and every thread's copies are visible."""
    cp.wait_group(NG - 2 - g)
    barrier()
    return _read_codes(cr[2 * g + 2], cr[2 * g + 3], BN, CW, WL)


@gluon.jit
def _shift(q0, q1, q2, qn, PF: gl.constexpr):
    """The code queue after its head is consumed: ``qn`` (chunk ``it + PF``) joins at the back."""
    if PF == 1:
        q0 = qn
    elif PF == 2:
        q0 = q1
        q1 = qn
    else:
        q0 = q1
        q1 = q2
        q2 = qn
    return q0, q1, q2


@gluon.jit
def _epilogue(
    y,
    sorted_ptr,
    tw_ptr,
    a_ptr,
    dst_ptr,
    e64,
    row0,
    nrows,
    nb,
    NOUT,
    NP,
    stride_dst,
    GATED: gl.constexpr,
    EPI: gl.constexpr,
    BN: gl.constexpr,
    BM: gl.constexpr,
    ML: gl.constexpr,
    SL: gl.constexpr,
    nstore,
    TW: gl.constexpr,
    a_raw,
    pair,
    HO: gl.constexpr,
):
    """Stores row block ``nb``'s finished accumulator (GEMM1: SiLU·mul; GEMM2: weighted), its
    first ``nstore`` (``nrows``, or 0: nothing) of the tile's ``nrows`` columns. GEMM2's ``EPI``
    (``smem_epi2``): 1 stores through shared memory (``_store_staged``), 0 from the accumulator
    registers; the routing weight is read by sorted row (``tw_ptr``: ``sorted_tw``; through the
    pair index it was slower, prefill_gemm1_tail/prefill_tw_ab_tp8_h200.json). ``TW``
    (``tw1``): GEMM1 multiplies the up rows by it (``tw * SiLU(g) * u``), GEMM2 stores unweighted.
    ``HO`` (``hoist2``): ``a_raw`` holds the block's global scales and, with ``EPI``, ``pair``
    the staged store's pair rows (``_one_chunk_2acc``); else both are loaded here."""
    # Per-column index tensors are built here: kept live across the K loop they would hold
    # BM / 4 registers each per thread.
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, ML))
    cols = gl.arange(0, BM, layout=gl.SliceLayout(0, ML))
    cmask = cols < nstore
    rc = row0 + gl.minimum(cols, nrows - 1)
    if not HO:
        a_raw = _alpha_raw(a_ptr, e64, NP, nb, BN, ML)
    y = y * gl.expand_dims(a_raw * _TWO_P26, 1)
    if GATED:
        if TW:  # up rows (MMA rows 8..15 of each 16, _store_gated) times the routing weight
            tw = gl.load(tw_ptr + rc).to(gl.float32)
            y = y * gl.where(gl.expand_dims(rows % 16 >= 8, 1), gl.expand_dims(tw, 0), 1.0)
        _store_gated(y, dst_ptr, rows, rc, cmask, nb, NOUT, stride_dst, BN, BM)
    else:
        if not TW:
            tw = gl.load(tw_ptr + rc).to(gl.float32)  # sorted_tw: no load chain through pair
            y = y * gl.expand_dims(tw, 0)
        if EPI:
            _store_staged(
                y,
                sorted_ptr,
                dst_ptr,
                row0,
                nrows,
                nstore,
                nb,
                NOUT,
                stride_dst,
                BN,
                BM,
                SL,
                pair,
                HO,
            )
        else:
            _store_weighted(
                y, dst_ptr, rows, gl.load(sorted_ptr + rc), cmask, nb, NOUT, stride_dst, BN, BM
            )


@gluon.jit
def _alpha_raw(a_ptr, e64, NP, nb, BN: gl.constexpr, ML: gl.constexpr):
    """Row block ``nb``'s global scales by MMA row, as stored (``_epilogue`` multiplies them by
    2^26: that multiply waits for the load, so a hoisted load must not carry it)."""
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, ML))
    return gl.load(a_ptr + e64 * NP + nb * BN + _phys_row(rows))


@gluon.jit
def _pair_rows(sorted_ptr, row0, nrows, BM: gl.constexpr, SL: gl.constexpr):
    """The staged store's pair slot per tile row (``_store_staged``; past the tile's end the
    last row's, never stored)."""
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, SL))
    return gl.load(sorted_ptr + row0 + gl.minimum(r, nrows - 1))


@gluon.jit
def _store_gated(
    y, dst_ptr, rows, rc, cmask, nb, NOUT, stride_dst, BN: gl.constexpr, BM: gl.constexpr
):
    """SiLU·mul of row block ``nb`` -> inter[rc, k_slot(j)] bf16. MMA rows ``8h + g`` hold weight
    rows ``2g + h``: gate (h = 0) and up (h = 1) of intermediate column ``j`` in one thread."""
    j = nb * (BN // 2) + (rows // 16) * 8 + rows % 8
    ptr = dst_ptr + gl.expand_dims(rc.to(gl.int64) * stride_dst, 0) + gl.expand_dims(_k_slot(j), 1)
    ok = gl.expand_dims((j < NOUT) & (rows % 16 < 8), 1) & gl.expand_dims(cmask, 0)
    g, u = gl.split(gl.permute(gl.reshape(y, [BN // 16, 2, 8, BM]), [0, 2, 3, 1]))
    pg, pu = gl.split(gl.permute(gl.reshape(ptr, [BN // 16, 2, 8, BM]), [0, 2, 3, 1]))
    og, ou = gl.split(gl.permute(gl.reshape(ok, [BN // 16, 2, 8, BM]), [0, 2, 3, 1]))
    gl.store(pg, (g / (1.0 + gl.exp(-g)) * u).to(gl.bfloat16), mask=og)


@gluon.jit
def _store_weighted(
    y, dst_ptr, rows, pair, cmask, nb, NOUT, stride_dst, BN: gl.constexpr, BM: gl.constexpr
):
    """Row block ``nb`` -> partials[pair, h] bf16. MMA rows ``g`` and ``g + 8`` of each 16 are
    weight rows ``2g`` and ``2g + 1`` (one thread): stored as one 4-byte bf16 pair."""
    h = nb * BN + _phys_row(rows)
    lo, hi = gl.split(gl.permute(gl.reshape(y, [BN // 16, 2, 8, BM]), [0, 2, 3, 1]))
    hh, _ = gl.split(
        gl.permute(
            gl.reshape(gl.expand_dims(h, 1) + gl.expand_dims(pair * 0, 0), [BN // 16, 2, 8, BM]),
            [0, 2, 3, 1],
        )
    )
    pp, _ = gl.split(
        gl.permute(
            gl.reshape(gl.expand_dims(rows * 0, 1) + gl.expand_dims(pair, 0), [BN // 16, 2, 8, BM]),
            [0, 2, 3, 1],
        )
    )
    mm, _ = gl.split(
        gl.permute(
            gl.reshape(
                gl.expand_dims(h < NOUT, 1) & gl.expand_dims(cmask, 0), [BN // 16, 2, 8, BM]
            ),
            [0, 2, 3, 1],
        )
    )
    word = lo.to(gl.bfloat16).to(gl.uint16, bitcast=True).to(gl.uint32) | (
        hi.to(gl.bfloat16).to(gl.uint16, bitcast=True).to(gl.uint32) << 16
    )
    wp = dst_ptr.to(gl.pointer_type(gl.uint32)) + (pp.to(gl.int64) * stride_dst + hh) // 2
    gl.store(wp, word, mask=mm)


@gluon.jit
def _store_staged(
    y,
    sorted_ptr,
    dst_ptr,
    row0,
    nrows,
    nstore,
    nb,
    NOUT,
    stride_dst,
    BN: gl.constexpr,
    BM: gl.constexpr,
    SL: gl.constexpr,
    pair,
    HO: gl.constexpr,
):
    """``_store_weighted`` through shared memory (``PrefillConfig.smem_epi2``): row block ``nb``
    [BN MMA rows, BM columns] -> bf16 in weight-row order, transposed to [BM, BN] and moved by
    ``convert_layout`` (Triton's shared-memory round trip) to ``SL``, where each thread holds 16
    contiguous bytes of one pair row: 16-byte stores filling whole sectors, and one pair index
    per row and thread instead of one per accumulator column (``_store_weighted``: 4-byte stores,
    8 of every 32 bytes a sector moves; Nsight Compute put 18% of GEMM2's stall samples on that
    address chain). Same values as ``_store_weighted``: one rounding of the same fp32."""
    yb = y.to(gl.bfloat16)
    # MMA row 16a + 8h + g is weight row 16a + 2g + h (_phys_row): a register renaming.
    yb = gl.reshape(gl.permute(gl.reshape(yb, [BN // 16, 2, 8, BM]), [0, 2, 1, 3]), [BN, BM])
    v = gl.convert_layout(gl.permute(yb, [1, 0]), SL)
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, SL))
    h = nb * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, SL))
    if not HO:  # else the caller's (_pair_rows, loaded once per program)
        pair = _pair_rows(sorted_ptr, row0, nrows, BM, SL)
    ptr = dst_ptr + gl.expand_dims(pair.to(gl.int64) * stride_dst, 1) + gl.expand_dims(h, 0)
    gl.store(ptr, v, mask=gl.expand_dims(r < nstore, 1) & gl.expand_dims(h < NOUT, 0))
