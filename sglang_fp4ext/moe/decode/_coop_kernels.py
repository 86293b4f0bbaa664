"""Gluon kernel of the one-launch NVFP4 W4A16 decode (``CoopDecodeConfig``): the whole layer in one
cooperative persistent launch.

``_coop`` runs on a grid that fits on the GPU at once (a cooperative launch: the driver refuses
a grid that is not co-resident, so the grid-wide wait below cannot deadlock, whatever runs on
other streams). Every program walks two lists of work items, ``item = pid, pid + G, ..``:

1. **GEMM1 + SiLU·mul**, item ``(slot, row tile)``: the tile of ``decode._gluon_kernels``'s
   ``_gemm1_kstack`` (the slot's expert, led by its first slot, with its K splits stacked on
   this program's warps and summed in shared memory) writes the bf16 intermediate.
2. **Grid-wide wait** (``_grid_sync``): every intermediate is written and visible.
3. **GEMM2 + routing weight + top-k sum**, item ``(token, row tile)``: the tile of
   ``_gemm2_tok_slots`` (a token's slots side by side, summed in slot order) writes ``out``.

GEMM2's weights depend only on the routing ids, so they are asked of L2
(``prefetch.global.L2``) before the wait (``PF2`` 1: before GEMM1's loop, 2: after it): the
wait then ends on bytes already close. The tiles are the two-launch Gluon family's, in the same
order, so the output is the same to the bit as ``kstack1 = slots2 = 1`` on two launches.
"""

from sglang_fp4ext.moe._gluon_compat import barrier, gl, gluon
from sglang_fp4ext.moe.decode._gluon_kernels import (
    _gemm1_kstack_tile,
    _gemm2_slots_tile,
    _prefetch_weights,
    _route,
)


@gluon.jit
def _grid_sync(bar_ptr, nprog):
    """Every program of the co-resident grid arrives, then all leave: the global writes made
    before it by any program are visible to every program after it. ``bar_ptr``: int32
    [arrivals, generation], arrivals back at zero after each wait (a sense-reversing barrier:
    the last to arrive resets the count, then releases the others by bumping the generation)."""
    barrier()  # this program's threads are done writing
    gen = gl.atomic_add(bar_ptr + 1, 0, sem="relaxed")  # read before arriving
    old = gl.atomic_add(bar_ptr, 1, sem="acq_rel")
    if old == nprog - 1:
        gl.atomic_xchg(bar_ptr, 0, sem="relaxed")
        gl.atomic_add(bar_ptr + 1, 1, sem="release")
    else:
        while gl.atomic_add(bar_ptr + 1, 0, sem="acquire") == gen:
            pass
    barrier()


@gluon.jit
def _prefetch_gemm2(
    ids_ptr,
    q_ptr,
    s_ptr,
    T,
    E,
    NB2,
    KC,
    TOP_K,
    q_e_stride,
    q_row_stride,
    s_e_stride,
    s_chunk_stride,
    K_POW2: gl.constexpr,
    BN: gl.constexpr,
):
    """Ask L2 for the GEMM2 weights of this program's GEMM2 items (their tokens' experts). The
    warps split the slots, not the rows: a row tile of 32 rows is one warp wide, so spreading
    warps along it would repeat each prefetch once per warp (16 times at 16 warps)."""
    PF: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [gl.num_warps(), 1], [1, 0])
    kj = gl.arange(0, K_POW2, layout=gl.SliceLayout(1, PF))
    for item in range(gl.program_id(0), T * NB2, gl.num_programs(0)):
        t = item // NB2
        idt = gl.load(ids_ptr + t * TOP_K + kj, mask=kj < TOP_K, other=-1).to(gl.int32)
        _prefetch_weights(
            q_ptr,
            s_ptr,
            idt,
            (idt >= 0) & (idt < E),
            (item % NB2) * BN,
            0,
            KC,
            q_e_stride,
            q_row_stride,
            s_e_stride,
            s_chunk_stride,
            BN,
            PF,
        )


@gluon.jit
def _coop(
    x_ptr,
    ids_ptr,
    tw_ptr,
    out_ptr,
    inter_ptr,
    plist_ptr,
    pcnt_ptr,
    bar_ptr,
    q1_ptr,
    s1_ptr,
    a1_ptr,
    q2_ptr,
    s2_ptr,
    a2_ptr,
    T,
    P,
    E,
    H,
    I,
    NP1,
    NP2,
    NB1,
    NB2,
    stride_x,
    stride_out,
    q1_e_stride,
    q1_row_stride,
    s1_e_stride,
    s1_chunk_stride,
    q2_e_stride,
    q2_row_stride,
    s2_e_stride,
    s2_chunk_stride,
    KC2,
    CPS1,
    TOP_K,
    K_POW2: gl.constexpr,
    BN1: gl.constexpr,
    BN2: gl.constexpr,
    BLOCK_P: gl.constexpr,
    KS: gl.constexpr,
    PF2: gl.constexpr,
    WL1: gl.constexpr,
    XL1: gl.constexpr,
    ML1: gl.constexpr,
    WL2: gl.constexpr,
    XL2: gl.constexpr,
    ML2: gl.constexpr,
    times_ptr=None,
    TIMES: gl.constexpr = False,
    PROBE_SKIP1: gl.constexpr = False,
):
    """The layer in one launch (module docstring). GEMM1 items ``(slot p, row tile nb)`` =
    ``p * NB1 + nb``, GEMM2 items ``(token t, row tile nb)`` = ``t * NB2 + nb``; ``bar_ptr``:
    ``_grid_sync``'s two counters (zero before the first call, left so by every call). The timing
    probe (``TIMES``; ``benchmarks/experiments/coop_phases.py``) can also skip GEMM1
    (``PROBE_SKIP1``: GEMM2 alone, on a stale intermediate)."""
    if TIMES:
        _stamp(times_ptr, 0)
    PL: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    TPC: gl.constexpr = 8 // KS
    HB: gl.constexpr = KS * BN1 // 2
    SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    pg = gl.allocate_shared_memory(gl.float32, [TPC * HB], SH)
    pu = gl.allocate_shared_memory(gl.float32, [TPC * HB], SH)
    parts = gl.allocate_shared_memory(gl.float32, [K_POW2 * BN2], SH)
    coefs = gl.allocate_shared_memory(gl.float32, [K_POW2 * BN2], SH)
    if PF2 == 1:
        _prefetch_gemm2(
            ids_ptr, q2_ptr, s2_ptr, T, E, NB2, KC2, TOP_K, q2_e_stride, q2_row_stride,
            s2_e_stride, s2_chunk_stride, K_POW2, BN2,
        )  # fmt: skip
    if not PROBE_SKIP1:
        for item in range(gl.program_id(0), P * NB1, gl.num_programs(0)):
            e, m, lbase = _route(ids_ptr, plist_ptr, pcnt_ptr, item // NB1, P, E, True, BLOCK_P, PL)
            if m > 0:
                _gemm1_kstack_tile(
                    x_ptr, q1_ptr, s1_ptr, a1_ptr, inter_ptr, e, m, lbase, item % NB1, pg, pu,
                    I, NP1, stride_x, q1_e_stride, q1_row_stride, s1_e_stride, H,
                    s1_chunk_stride, CPS1, TOP_K, BN1, 8, WL1, XL1, ML1, KS, False,
                )  # fmt: skip
    if TIMES:
        _stamp(times_ptr, 1)
    if PF2 == 2:
        _prefetch_gemm2(
            ids_ptr, q2_ptr, s2_ptr, T, E, NB2, KC2, TOP_K, q2_e_stride, q2_row_stride,
            s2_e_stride, s2_chunk_stride, K_POW2, BN2,
        )  # fmt: skip
    _grid_sync(bar_ptr, gl.num_programs(0))
    if TIMES:
        _stamp(times_ptr, 2)
    # The intermediate is read through L1 (no cache modifier): the wait's acquire invalidates
    # L1, so no stale line survives it, and a program's warps share one token's intermediate
    # there. Read from L2 alone (".cg"), each warp fetched it again: GEMM2 took 1.9-3.9x as
    # long at TP8 T = 1-16 (`coop_phases.py`).
    for item in range(gl.program_id(0), T * NB2, gl.num_programs(0)):
        _gemm2_slots_tile(
            inter_ptr, ids_ptr, tw_ptr, q2_ptr, s2_ptr, a2_ptr, out_ptr, item // NB2, item % NB2,
            parts, coefs, E, H, I, NP2, stride_out, q2_e_stride, q2_row_stride, s2_e_stride,
            s2_chunk_stride, KC2, TOP_K, K_POW2, BN2, 8, WL2, XL2, ML2, "",
        )  # fmt: skip
        if TIMES:
            if item == gl.program_id(0):
                _stamp(times_ptr, 4)
    if TIMES:
        _stamp(times_ptr, 3)


@gluon.jit
def _stamp(times_ptr, i: gl.constexpr):
    """Program ``pid``'s ``%globaltimer`` (ns) at point ``i`` into ``times_ptr[pid, i]`` (int64
    [programs, 8]: start, GEMM1 done, wait done, end, first GEMM2 item done;
    ``benchmarks/experiments/coop_phases.py``)."""
    t = gl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1
    )
    gl.store(times_ptr + gl.program_id(0) * 8 + i, t)
