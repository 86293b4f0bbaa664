"""NVFP4 fused-MoE prefill path: validate -> config -> workspaces -> 6 to 8 launches.

Three GEMM families, chosen by ``PrefillConfig.kernels``: ``dot`` (W4A16, ``tl.dot``, the launches
below), ``wgmma`` (W4A16, Gluon, sm_90: ``_plan_wgmma``) and ``w4a4`` (NVFP4 activations,
``tl.dot_scaled``, sm_100 / sm_120: ``_plan_w4a4``). They share the grouping and the ordered
combine.

``fused_moe_nvfp4_prefill(hidden_states, weights, topk_ids, topk_weights)`` computes the same
``(T, H)`` bf16 partial sum as the decode entry point ``decode.launch.fused_moe_nvfp4`` and reads
the same :class:`~sglang_fp4ext.moe.prepared.PreparedMoEWeights` (one load-time preparation serves
both paths), but is built for hundreds of tokens per expert: the pair slots are grouped by expert
on the device and each expert runs as a tiled GEMM with ``block_m`` tokens per MMA tile
(``prefill/_dot_kernels.py`` describes the kernels). Ids ``< 0`` (experts of another EP rank) and
ids ``>= E`` contribute nothing; a token with no local expert gets zeros. ``topk_weights`` is used
as
given. The torch twin is ``sglang_fp4ext.moe.reference.fused_moe_nvfp4_torch``; the grouping's
twin is :func:`group_by_expert_torch`. The config (``prefill.config.PrefillConfig``) and its
heuristic live in ``prefill.config.py``.

CUDA graphs: no host synchronisation, no data-dependent allocation or grid. Workspaces are
allocated per call from PyTorch's caching allocator, sized from ``(T, top_k, E, H, I)`` and the
config only (inside a capture they come from the graph's private pool):

================  ==============================  =============================================
workspace         shape, dtype                    meaning
================  ==============================  =============================================
``hist``          (NB, NBINS) int32               per-block expert histogram, then its prefix
``counts``        (NBINS,) int32                  valid pairs per expert (0 on spare bins)
``start``         (NBINS,) int32                  first sorted row of each expert
``sorted_pair``   (P,) int32                      pair slots grouped by expert (first
                                                  ``sum(counts)`` entries are meaningful)
``sorted_tw``     (P,) fp32                       ``topk_weights`` of ``sorted_pair``'s slots
                                                  (GEMM2 reads them beside the pairs)
``inter``         (P, I) bf16                     SiLU·mul output, sorted-row order
``partial``       (P, H) bf16 | (T, H) fp32       ordered: weighted GEMM2 row per pair slot;
                                                  atomic: fp32 accumulator (zeroed per call)
================  ==============================  =============================================

with ``P = T * top_k``, ``NB = cdiv(P, block_p)``, ``NBINS = next_pow2(E + 1)``. The ordered
partials cost ``2 P H`` bytes (906 MB at T = 8192, top_k = 9, H = 6144), as SGLang's Triton MoE.

Determinism: the default ``combine="ordered"`` is bit-identical run to run. ``combine="atomic"``
(opt-in, never chosen by the heuristic) adds the top-k rows with fp32 ``atomic_add`` in arrival
order.
"""

from __future__ import annotations

import functools

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.fault_inject import corrupt_if_asked
from sglang_fp4ext.moe.launch import Launch
from sglang_fp4ext.moe.layout import K_CHUNK
from sglang_fp4ext.moe.prefill.config import (
    PrefillConfig,
    served_prefill_config,
    static_ring_fits,
    wgmma_supports_shape,
)
from sglang_fp4ext.moe.prepared import PreparedMoEWeights, validate_moe_inputs
from sglang_fp4ext.moe.shape import current_target
from sglang_fp4ext.moe.tables import prefill_config_for

__all__ = [
    "fused_moe_nvfp4_prefill",
    "group_by_expert",
    "group_by_expert_torch",
    "max_m_tiles",
    "num_bins",
]

# Combine kernel tile: a memory-bound pass, 16-byte bf16 vectors along H.
_COMBINE_BT, _COMBINE_BH = 8, 256
# Rows per program of the K-order permutation (wgmma family) and of the activation quantizer (w4a4).
_PERMUTE_BT = 8
_QUANT_BT = 8
# Rows of the block histogram the single scan program handles per step.
_SCAN_ROWS = 16
# Tests set this: fill the float workspaces with NaN so a read of an unwritten row shows up.
_POISON_WORKSPACES = False


def _pow2(x) -> bool:
    return isinstance(x, int) and x >= 1 and (x & (x - 1)) == 0


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def num_bins(E: int) -> int:
    """Histogram bins: a power of two above ``E`` (the last bin collects ids outside [0, E))."""
    return _next_pow2(E + 1)


def max_m_tiles(P: int, E: int, block_m: int) -> int:
    """Worst-case M tiles: sum over experts of cdiv(count, block_m) with sum(count) <= P and at
    most min(E, P) experts non-empty."""
    return (P + min(E, P) * (block_m - 1)) // block_m


# ---- validation ----


def _validate(x, weights, topk_ids, topk_weights, out, config):
    if config is not None and not isinstance(config, PrefillConfig):
        raise TypeError(
            f"fused_moe_nvfp4_prefill: config must be a PrefillConfig, got {type(config).__name__}"
        )
    validate_moe_inputs("fused_moe_nvfp4_prefill", x, weights, topk_ids, topk_weights, out)


# ---- launch plan ----


_DOT, _WGMMA, _W4A4 = "prefill._dot_kernels", "prefill._wgmma_kernels", "prefill._w4a4_kernels"


def _launch(
    kernel: str,
    grid: tuple,
    args: tuple,
    constexprs: dict,
    num_warps: int,
    num_stages: int,
    gluon: bool = False,
    module: str = "dot",
) -> Launch:
    """One launch of ``prefill._dot_kernels`` (``module="w4a4"``: ``prefill._w4a4_kernels``; with
    ``gluon``: ``prefill._wgmma_kernels``, which take no stages): runtime arguments in order,
    constexprs (the Gluon layouts among them) by name."""
    if gluon:
        return Launch(_WGMMA, kernel, grid, args, constexprs, dict(num_warps=num_warps))
    return Launch(
        _W4A4 if module == "w4a4" else _DOT,
        kernel,
        grid,
        args,
        constexprs,
        dict(num_warps=num_warps, num_stages=num_stages),
    )


def _group_plan(ids: torch.Tensor, E: int, block_p: int, tw: torch.Tensor | None = None):
    """Workspaces and the 3 grouping launches for flat ``ids`` (P,); with the flat routing
    weights ``tw`` (P,) also ``sorted_tw`` (else None)."""
    P = ids.numel()
    nbins = num_bins(E)
    nb = max(1, -(-P // block_p))
    ws = torch.empty(nb * nbins + 2 * nbins + 2 * max(P, 1), dtype=torch.int32, device=ids.device)
    hist = ws[: nb * nbins]
    counts = ws[nb * nbins : nb * nbins + nbins]
    start = ws[nb * nbins + nbins : nb * nbins + 2 * nbins]
    sorted_pair = ws[nb * nbins + 2 * nbins :][:P]
    sorted_tw = ws[nb * nbins + 2 * nbins + max(P, 1) :][:P].view(torch.float32)
    launches = [
        _launch("_group_count", (nb,), (ids, hist, P, E), dict(NBINS=nbins, BLOCK_P=block_p), 4, 1),
        _launch(
            "_group_scan",
            (1,),
            (hist, counts, start, nb, E),
            dict(NBINS=nbins, ROWS=_SCAN_ROWS),
            4,
            1,
        ),
        _launch(
            "_group_scatter",
            (nb,),
            (ids, ids if tw is None else tw, hist, start, sorted_pair, sorted_tw, P, E),
            dict(NBINS=nbins, BLOCK_P=block_p, WITH_TW=tw is not None),
            4,
            1,
        ),
    ]
    return launches, sorted_pair, counts, start, (None if tw is None else sorted_tw)


def _plan(
    x,
    weights: PreparedMoEWeights,
    topk_ids,
    topk_weights,
    out,
    config: PrefillConfig,
    compute_f32: bool,
) -> list[Launch]:
    """Workspaces (allocated here, on ``x.device``) and the 6 launches of one call, ``T >= 1``
    (7 for the wgmma family, ``_plan_wgmma``).

    Also used by the AOT test with ``meta`` tensors, so it compiles exactly what a call launches.
    """
    if config.kernels == "wgmma" and not compute_f32:
        return _plan_wgmma(x, weights, topk_ids, topk_weights, out, config)
    if config.kernels == "w4a4":
        return _plan_w4a4(x, weights, topk_ids, topk_weights, out, config, compute_f32)
    T, H = x.shape
    top_k = topk_ids.shape[1]
    w13, w2 = weights.w13, weights.w2
    E, I = weights.num_experts, weights.intermediate_size
    P = T * top_k
    dev = x.device
    nbins = num_bins(E)
    atomic = config.combine == "atomic"

    launches, sorted_pair, counts, _, sorted_tw = _group_plan(
        topk_ids.reshape(-1), E, config.block_p, topk_weights.reshape(-1)
    )
    inter = torch.empty(P, I, dtype=torch.bfloat16, device=dev)
    if atomic:
        partial = torch.zeros(T, H, dtype=torch.float32, device=dev)
    else:
        partial = torch.empty(P, H, dtype=torch.bfloat16, device=dev)
    if _POISON_WORKSPACES:
        inter.fill_(float("nan"))
        if not atomic:
            partial.fill_(float("nan"))
    m_tiles, bm1 = max_m_tiles(P, E, config.block_m), config.gemm1_block_m
    common = dict(NBINS=nbins, BM=config.block_m, COMPUTE_F32=compute_f32)
    launches.append(
        _launch(
            "_prefill_gemm1",
            (w13.n_pad // config.block_n1, max_m_tiles(P, E, bm1)),
            (
                x,
                sorted_pair,
                counts,
                w13.q,
                w13.scale,
                w13.alpha,
                inter,
                H,
                I,
                w13.n_pad,
                w13.k_pad // K_CHUNK,
                top_k,
                x.stride(0),
                w13.q.stride(0),
                w13.q.stride(1),
                w13.scale.stride(0),
                w13.scale.stride(1),
            ),
            dict(common, BM=bm1, BN=config.block_n1, BK=config.block_k1),
            config.warps1,
            config.stages1,
        )
    )
    launches.append(
        _launch(
            "_prefill_gemm2",
            (-(-(w2.n_pad // config.block_n2) // config.group_n2), m_tiles),
            (
                inter,
                sorted_pair,
                counts,
                sorted_tw,
                w2.q,
                w2.scale,
                w2.alpha,
                partial,
                H,
                I,
                w2.n_pad,
                w2.k_pad // K_CHUNK,
                top_k,
                partial.stride(0),
                w2.q.stride(0),
                w2.q.stride(1),
                w2.scale.stride(0),
                w2.scale.stride(1),
            ),
            dict(common, BN=config.block_n2, BK=config.block_k2, NG=config.group_n2, ATOMIC=atomic),
            config.warps2,
            config.stages2,
        )
    )
    launches.append(_combine_launch(partial, topk_ids, out, E, atomic, compute_f32))
    return launches


def _combine_launch(partial, topk_ids, out, E: int, atomic: bool, compute_f32: bool) -> Launch:
    """The last launch of every family: the top-k combine of the partials into ``out``."""
    T, H = out.shape
    return _launch(
        "_prefill_combine",
        (-(-T // _COMBINE_BT), -(-H // _COMBINE_BH)),
        (partial, topk_ids, out, T, H, E, topk_ids.shape[1], partial.stride(0), out.stride(0)),
        dict(BT=_COMBINE_BT, BH=_COMBINE_BH, ATOMIC=atomic, COMPUTE_F32=compute_f32),
        4,
        1,
    )


def _check_k_chunks(family: str, H: int, I: int) -> None:
    if not wgmma_supports_shape(H, I):
        raise ValueError(
            f"fused_moe_nvfp4_prefill: PrefillConfig(kernels={family!r}) needs H and I multiples "
            f"of {K_CHUNK}, got H={H}, I={I}; use kernels='dot'"
        )


def _plan_wgmma(x, weights: PreparedMoEWeights, topk_ids, topk_weights, out, config: PrefillConfig):
    """The wgmma family's 7 launches: grouping (3), ``x`` into MMA K order, the two Gluon GEMMs
    (``inter`` stays in MMA K order between them), the ordered combine (8 with GEMM1's tail:
    two GEMM1 launches)."""
    from sglang_fp4ext.moe.prefill import _wgmma_kernels as G

    T, H = x.shape
    top_k = topk_ids.shape[1]
    w13, w2 = weights.w13, weights.w2
    E, I = weights.num_experts, weights.intermediate_size
    _check_k_chunks("wgmma", H, I)
    if config.accs2 == 2 and I != K_CHUNK:
        raise ValueError(
            f"fused_moe_nvfp4_prefill: PrefillConfig(accs2=2) runs GEMM2 one K chunk per row "
            f"block and needs intermediate_size == {K_CHUNK}, got {I}"
        )
    for i, K in ((1, H), (2, I)):
        # The static ring unrolls a GEMM's K loop by its stages, the code ring by its depth (a
        # multiple of them): that must divide the K chunks.
        ns, nc = getattr(config, f"stages{i}"), getattr(config, f"code_ring{i}")
        if nc:
            unroll, what = nc, f"code_ring{i}={nc}) unrolls GEMM{i}'s K loop by its depth"
        elif getattr(config, f"static_ring{i}"):
            unroll, what = ns, f"static_ring{i}=1) unrolls GEMM{i}'s K loop by stages{i}={ns}"
        else:
            continue
        if not static_ring_fits(K, unroll):
            raise ValueError(
                f"fused_moe_nvfp4_prefill: PrefillConfig({what}, which must divide its "
                f"{K // K_CHUNK} K chunks "
                f"({'hidden' if i == 1 else 'intermediate'}_size {K} / {K_CHUNK})"
            )
    P = T * top_k
    dev = x.device
    nbins = num_bins(E)
    launches, sorted_pair, counts, _, sorted_tw = _group_plan(
        topk_ids.reshape(-1), E, config.block_p, topk_weights.reshape(-1)
    )
    xk = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    inter = torch.empty(P, I, dtype=torch.bfloat16, device=dev)
    partial = torch.empty(P, H, dtype=torch.bfloat16, device=dev)
    if _POISON_WORKSPACES:
        inter.fill_(float("nan"))
        partial.fill_(float("nan"))
    launches.append(
        _launch(
            "_permute_k",
            (-(-T // _PERMUTE_BT), H // 128),
            (x, xk, T, H, x.stride(0)),
            dict(BT=_PERMUTE_BT),
            4,
            1,
        )
    )
    for i, (w, src, dst, K, nout, ng) in enumerate(
        ((w13, xk, inter, H, I, 1), (w2, inter, partial, I, H, config.group_n2)), start=1
    ):
        bn, warps = getattr(config, f"block_n{i}"), getattr(config, f"warps{i}")
        bm = config.gemm1_block_m if i == 1 else config.block_m
        bt = config.tail1 if i == 1 else 0  # GEMM1's tail rows: M tiles of bm + bt
        tm = bm + bt if i == 1 else bm * config.msub2  # GEMM2: msub2 sub-tiles of bm rows
        # GEMM1 with the tail: two launches over the same tiles of bm + bt rows, one compiled
        # with the tail for the tiles with rows past bm, one without it for the others.
        for tail in (bt, 0) if bt else (0,):
            launches.append(
                _launch(
                    f"_wgmma_gemm{i}",
                    (-(-(w.n_pad // bn) // ng), max_m_tiles(P, E, tm)),
                    (
                        src,
                        sorted_pair,
                        counts,
                        sorted_tw,
                        w.q,
                        w.scale,
                        w.alpha,
                        dst,
                        K,
                        nout,
                        w.n_pad,
                        top_k,
                        src.stride(0),
                        dst.stride(0),
                        w.q.stride(0),
                        w.q.stride(1),
                        w.scale.stride(0),
                        w.scale.stride(1),
                    ),
                    dict(
                        NBINS=nbins,
                        BM=bm,
                        BN=bn,
                        NS=getattr(config, f"stages{i}"),
                        PF=getattr(config, f"prefetch{i}"),
                        LP=getattr(config, f"l2_prefetch{i}"),
                        CR=getattr(config, f"code_ring{i}"),
                        SR=getattr(config, f"static_ring{i}"),
                        **(
                            dict(
                                NG=ng,
                                ACCS=config.accs2,
                                EPI=config.smem_epi2,
                                HO=config.hoist2,
                                MS=config.msub2,
                            )
                            if i == 2
                            else dict(BT=tail, MT=G.layouts(bn, tail or bm, warps)["ML"], TM=tm)
                        ),
                        TW=config.tw1,
                        **G.layouts(bn, bm, warps),
                    ),
                    warps,
                    1,
                    gluon=True,
                )
            )
    launches.append(_combine_launch(partial, topk_ids, out, E, False, False))
    return launches


def _plan_w4a4(
    x,
    weights: PreparedMoEWeights,
    topk_ids,
    topk_weights,
    out,
    config: PrefillConfig,
    compute_f32: bool,
):
    """The W4A4 family's 7 launches (``prefill._w4a4_kernels``): grouping (3), ``x`` to NVFP4,
    GEMM1 (+ SiLU·mul, to NVFP4), GEMM2, the ordered combine."""
    T, H = x.shape
    top_k = topk_ids.shape[1]
    w13, w2 = weights.w13, weights.w2
    E, I = weights.num_experts, weights.intermediate_size
    _check_k_chunks("w4a4", H, I)
    if not weights.has_input_scales:
        raise ValueError(
            "fused_moe_nvfp4_prefill: PrefillConfig(kernels='w4a4') quantizes the activations with "
            "the checkpoint's static input scales, and these weights carry none "
            "(PreparedMoEWeights.w13_input_scale / w2_input_scale)"
        )
    P = T * top_k
    dev = x.device
    nbins = num_bins(E)
    launches, sorted_pair, counts, _, sorted_tw = _group_plan(
        topk_ids.reshape(-1), E, config.block_p, topk_weights.reshape(-1)
    )
    xq = torch.empty(T, H // 2, dtype=torch.uint8, device=dev)
    xs = torch.empty(T, H // 16, dtype=torch.uint8, device=dev)
    iq = torch.empty(P, I // 2, dtype=torch.uint8, device=dev)
    is_ = torch.empty(P, I // 16, dtype=torch.uint8, device=dev)
    partial = torch.empty(P, H, dtype=torch.bfloat16, device=dev)
    if _POISON_WORKSPACES:
        partial.fill_(float("nan"))
        iq.fill_(0x77)  # +6 codes
        is_.fill_(0x7F)  # e4m3 NaN
    gs1, gs2 = weights.w13_input_scale, weights.w2_input_scale
    m_tiles = max_m_tiles(P, E, config.block_m)
    common = dict(NBINS=nbins, BM=config.block_m, COMPUTE_F32=compute_f32)
    launches.append(
        _launch(
            "_quant_act",
            (-(-T // _QUANT_BT), H // K_CHUNK),
            (x, xq, xs, gs1, T, H, x.stride(0)),
            dict(BT=_QUANT_BT),
            4,
            1,
            module="w4a4",
        )
    )
    launches.append(
        _launch(
            "_w4a4_gemm1",
            (w13.n_pad // config.block_n1, max_m_tiles(P, E, config.gemm1_block_m)),
            (
                xq,
                xs,
                sorted_pair,
                counts,
                w13.q,
                w13.scale,
                w13.alpha,
                gs1,
                gs2,
                iq,
                is_,
                I,
                w13.n_pad,
                H // K_CHUNK,
                top_k,
                w13.q.stride(0),
                w13.q.stride(1),
                w13.scale.stride(0),
                w13.scale.stride(1),
            ),
            dict(common, BM=config.gemm1_block_m, BN=config.block_n1),
            config.warps1,
            config.stages1,
            module="w4a4",
        )
    )
    launches.append(
        _launch(
            "_w4a4_gemm2",
            (w2.n_pad // config.block_n2, m_tiles),
            (
                iq,
                is_,
                sorted_pair,
                counts,
                sorted_tw,
                w2.q,
                w2.scale,
                w2.alpha,
                gs2,
                partial,
                H,
                w2.n_pad,
                I // K_CHUNK,
                w2.q.stride(0),
                w2.q.stride(1),
                w2.scale.stride(0),
                w2.scale.stride(1),
                partial.stride(0),
            ),
            dict(common, BN=config.block_n2),
            config.warps2,
            config.stages2,
            module="w4a4",
        )
    )
    launches.append(_combine_launch(partial, topk_ids, out, E, False, compute_f32))
    return launches


#: The GPUs each v2 family compiles for (``tl.dot`` runs everywhere): predicate, in words.
_FAMILY_GPUS = {
    "wgmma": (target_info.supports_wgmma_prefill, "sm_90 (warpgroup_mma)"),
    "w4a4": (target_info.supports_w4a4_prefill, "the block-scaled FP4 MMA (sm_100 / sm_120)"),
}


@functools.cache
def _check_family_gpu(family: str, device_index: int) -> None:
    """Raise if ``family`` cannot run on this GPU (asked once per family and device)."""
    supports, needs = _FAMILY_GPUS[family]
    cap = target_info.device_capability(None if device_index < 0 else device_index)
    if not supports(cap):
        raise ValueError(
            f"fused_moe_nvfp4_prefill: PrefillConfig(kernels={family!r}) needs {needs}, this GPU "
            f"is sm_{cap[0]}{cap[1]}; use kernels='dot'"
        )


# ---- public entry points ----


def group_by_expert(topk_ids: torch.Tensor, num_experts: int, block_p: int = 1024):
    """Device grouping of pair slots by expert (3 launches; ``prefill/_dot_kernels.py`` 1-3).

    Args:
        topk_ids: (T, top_k) int32/int64, contiguous; ids outside [0, E) are dropped.
        num_experts: E.
        block_p: pair slots per grouping program (power of two >= 16).

    Returns:
        ``(sorted_pair (P,) int32, counts (NBINS,) int32, start (NBINS,) int32)``; see the module
        docstring. Only ``sorted_pair[:counts.sum()]`` is written.
    """
    if not _pow2(block_p) or block_p < 16:
        raise ValueError(f"group_by_expert: block_p must be a power of two >= 16, got {block_p}")
    if not topk_ids.is_contiguous() or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError("group_by_expert: topk_ids must be a contiguous int32/int64 tensor")
    launches, sorted_pair, counts, start, _ = _group_plan(
        topk_ids.reshape(-1), num_experts, block_p
    )
    for launch in launches:
        launch.run()
    return sorted_pair, counts, start


def group_by_expert_torch(topk_ids: torch.Tensor, num_experts: int):
    """Torch twin of :func:`group_by_expert`: (sorted valid pairs (n,) int64, counts (E,) int64,
    start (E,) int64). Stable: pairs of one expert in slot order."""
    ids = topk_ids.reshape(-1).long()
    valid = (ids >= 0) & (ids < num_experts)
    key = torch.where(valid, ids, num_experts)
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(ids[valid], minlength=num_experts)
    start = torch.cumsum(counts, 0) - counts
    return order[: int(valid.sum())], counts, start


def fused_moe_nvfp4_prefill(
    hidden_states: torch.Tensor,
    weights: PreparedMoEWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """NVFP4 W4A16 MoE for large token counts. Args:

    hidden_states: (T, H) bf16; weights: :class:`PreparedMoEWeights` (E experts);
    topk_ids: (T, top_k) int32/int64 in [-1, E) (a fused shared expert is one more column
    pointing at expert E-1); topk_weights: (T, top_k) fp32/bf16/fp16; out: optional (T, H) bf16
    destination; config: force a :class:`PrefillConfig` (else ``config.prefill_config_for``:
    the device table's prefill entry or ``prefill.heuristic.prefill_heuristic_config``). Returns
    ``out``.
    """
    _validate(hidden_states, weights, topk_ids, topk_weights, out, config)
    T, H = hidden_states.shape
    dev = hidden_states.device
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    if T == 0:
        return out
    if config is None:
        config = prefill_config_for(T, weights.shape(topk_ids.shape[1]), current_target(dev))
        config = served_prefill_config(config, weights.has_input_scales)
    interp = target_info.is_interpreter()
    if config.kernels in _FAMILY_GPUS and not interp and dev.type == "cuda":
        _check_family_gpu(config.kernels, dev.index if dev.index is not None else -1)
    for launch in _plan(hidden_states, weights, topk_ids, topk_weights, out, config, interp):
        launch.run()
    family = config.kernels if config.kernels == "w4a4" or not interp else "dot"
    corrupt_if_asked("prefill", family, out)
    return out
