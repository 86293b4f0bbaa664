"""The launch plans of the prefill families: the workspaces and the 6-8 ``Launch`` records of one
call (``tl.dot``; Gluon ``wgmma``, sm_90; W4A4, sm_100 / sm_120), from the grouping to the
ordered top-k combine. ``plan`` is also what the AOT tests compile, on ``meta`` tensors."""

from __future__ import annotations

import torch

from sglang_fp4ext.moe.launch import Launch
from sglang_fp4ext.moe.layout import K_CHUNK
from sglang_fp4ext.moe.prefill.config import (
    PrefillConfig,
    static_ring_fits,
    wgmma_supports_shape,
)
from sglang_fp4ext.moe.prefill.grouping import group_plan, max_m_tiles, num_bins, prefill_launch
from sglang_fp4ext.moe.prepared import PreparedMoEWeights

__all__ = ["plan"]

# Combine kernel tile: a memory-bound pass, 16-byte bf16 vectors along H.
_COMBINE_BT, _COMBINE_BH = 8, 256
# Rows per program of the K-order permutation (wgmma family) and of the activation quantizer (w4a4).
_PERMUTE_BT = 8
_QUANT_BT = 8
# Tests set this: fill the float workspaces with NaN so a read of an unwritten row shows up.
_POISON_WORKSPACES = False


def plan(
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

    launches, sorted_pair, counts, _, sorted_tw = group_plan(
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
        prefill_launch(
            "_prefill_gemm1",
            (w13.n_pad // config.block_n1, max_m_tiles(P, E, bm1)),
            dict(
                x_ptr=x,
                sorted_ptr=sorted_pair,
                counts_ptr=counts,
                inter_ptr=inter,
                H=H,
                I=I,
                KC=w13.k_pad // K_CHUNK,
                TOP_K=top_k,
                stride_x=x.stride(0),
                **_matrix(w13),
            ),
            dict(common, BM=bm1, BN=config.block_n1, BK=config.block_k1),
            config.warps1,
            config.stages1,
        )
    )
    launches.append(
        prefill_launch(
            "_prefill_gemm2",
            (-(-(w2.n_pad // config.block_n2) // config.group_n2), m_tiles),
            dict(
                inter_ptr=inter,
                sorted_ptr=sorted_pair,
                counts_ptr=counts,
                tw_ptr=sorted_tw,
                dst_ptr=partial,
                H=H,
                I=I,
                KC=w2.k_pad // K_CHUNK,
                TOP_K=top_k,
                stride_dst=partial.stride(0),
                **_matrix(w2),
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
    return prefill_launch(
        "_prefill_combine",
        (-(-T // _COMBINE_BT), -(-H // _COMBINE_BH)),
        dict(
            src_ptr=partial,
            ids_ptr=topk_ids,
            out_ptr=out,
            T=T,
            H=H,
            E=E,
            TOP_K=topk_ids.shape[1],
            stride_src=partial.stride(0),
            stride_out=out.stride(0),
        ),
        dict(BT=_COMBINE_BT, BH=_COMBINE_BH, ATOMIC=atomic, COMPUTE_F32=compute_f32),
        4,
        1,
    )


def _check_k_chunks(family: str, H: int, I: int) -> None:
    if not wgmma_supports_shape(H, I):
        raise ValueError(
            f"fused_moe_nvfp4_prefill: the {family!r} prefill family needs H and I multiples "
            f"of {K_CHUNK}, got H={H}, I={I}; use DotPrefillConfig"
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
            f"fused_moe_nvfp4_prefill: WgmmaPrefillConfig(accs2=2) runs GEMM2 one K chunk per row "
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
                f"fused_moe_nvfp4_prefill: WgmmaPrefillConfig({what}, which must divide its "
                f"{K // K_CHUNK} K chunks "
                f"({'hidden' if i == 1 else 'intermediate'}_size {K} / {K_CHUNK})"
            )
    P = T * top_k
    dev = x.device
    nbins = num_bins(E)
    launches, sorted_pair, counts, _, sorted_tw = group_plan(
        topk_ids.reshape(-1), E, config.block_p, topk_weights.reshape(-1)
    )
    xk = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    inter = torch.empty(P, I, dtype=torch.bfloat16, device=dev)
    partial = torch.empty(P, H, dtype=torch.bfloat16, device=dev)
    if _POISON_WORKSPACES:
        inter.fill_(float("nan"))
        partial.fill_(float("nan"))
    launches.append(
        prefill_launch(
            "_permute_k",
            (-(-T // _PERMUTE_BT), H // 128),
            dict(x_ptr=x, y_ptr=xk, T=T, K=H, stride_x=x.stride(0)),
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
                prefill_launch(
                    f"_wgmma_gemm{i}",
                    (-(-(w.n_pad // bn) // ng), max_m_tiles(P, E, tm)),
                    dict(
                        x_ptr=src,
                        sorted_ptr=sorted_pair,
                        counts_ptr=counts,
                        tw_ptr=sorted_tw,
                        dst_ptr=dst,
                        K=K,
                        NOUT=nout,
                        TOP_K=top_k,
                        stride_x=src.stride(0),
                        stride_dst=dst.stride(0),
                        **_matrix(w),
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
            "fused_moe_nvfp4_prefill: W4A4PrefillConfig quantizes the activations with "
            "the checkpoint's static input scales, and these weights carry none "
            "(PreparedMoEWeights.w13_input_scale / w2_input_scale)"
        )
    P = T * top_k
    dev = x.device
    nbins = num_bins(E)
    launches, sorted_pair, counts, _, sorted_tw = group_plan(
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
        prefill_launch(
            "_quant_act",
            (-(-T // _QUANT_BT), H // K_CHUNK),
            dict(x_ptr=x, q_ptr=xq, s_ptr=xs, gs_ptr=gs1, T=T, H=H, stride_x=x.stride(0)),
            dict(BT=_QUANT_BT),
            4,
            1,
            module="w4a4",
        )
    )
    launches.append(
        prefill_launch(
            "_w4a4_gemm1",
            (w13.n_pad // config.block_n1, max_m_tiles(P, E, config.gemm1_block_m)),
            dict(
                xq_ptr=xq,
                xs_ptr=xs,
                sorted_ptr=sorted_pair,
                counts_ptr=counts,
                gs1_ptr=gs1,
                gs2_ptr=gs2,
                iq_ptr=iq,
                is_ptr=is_,
                I=I,
                KC=H // K_CHUNK,
                TOP_K=top_k,
                **_matrix(w13),
            ),
            dict(common, BM=config.gemm1_block_m, BN=config.block_n1),
            config.warps1,
            config.stages1,
            module="w4a4",
        )
    )
    launches.append(
        prefill_launch(
            "_w4a4_gemm2",
            (w2.n_pad // config.block_n2, m_tiles),
            dict(
                iq_ptr=iq,
                is_ptr=is_,
                sorted_ptr=sorted_pair,
                counts_ptr=counts,
                tw_ptr=sorted_tw,
                gs2_ptr=gs2,
                dst_ptr=partial,
                H=H,
                KC=I // K_CHUNK,
                stride_dst=partial.stride(0),
                **_matrix(w2),
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


def _matrix(m) -> dict:
    """One weight matrix's kernel arguments: codes, scale codes, alphas, padded rows, strides."""
    return dict(q_ptr=m.q, s_ptr=m.scale, a_ptr=m.alpha, NP=m.n_pad, q_e_stride=m.q.stride(0),
                q_row_stride=m.q.stride(1), s_e_stride=m.scale.stride(0),
                s_chunk_stride=m.scale.stride(1))  # fmt: skip
