"""The prefill config heuristic: the family (``default_prefill_family``) and the
:class:`PrefillConfig` a token bucket, shape and GPU get when no table entry exists."""

from __future__ import annotations

import math

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.layout import K_CHUNK
from sglang_fp4ext.moe.prefill.config import (
    DotPrefillConfig,
    PrefillConfig,
    W4A4PrefillConfig,
    WgmmaPrefillConfig,
    _next_pow2,
    prefill_activations,
    static_ring_fits,
    wgmma_supports_shape,
)
from sglang_fp4ext.moe.shape import MoEShape, Target


def _datacenter_mma(arch: str) -> bool:
    """sm_90 / sm_10x: warpgroup (wgmma) or tcgen05 MMA with an operand in shared memory and
    228 KB of shared memory per SM; sm_8x / sm_12x: warp-level ``mma.sync`` with every operand in
    registers and at most 163 KB (99 KB on sm_120). A :class:`Target` carries only the arch
    string, so this reads it rather than asking ``target_info`` about a live device."""
    cc = arch.removeprefix("sm_").rstrip("af")
    return cc.isdigit() and int(cc) // 10 in (9, 10)


def _nearest_pow2(rows: float) -> int:
    """``rows`` rounded to the nearest power of two in log scale."""
    return 1 << max(0, round(math.log2(max(rows, 1.0))))


def _wgmma_block_m(rows: float, shape: MoEShape) -> int:
    """``rows`` (``MoEShape.rows_per_expert``) rounded to the nearest power of two (in log scale),
    within [32, 64] at ``I`` <= 512 and [32, 128] above."""
    return min(64 if shape.I <= 512 else 128, max(32, _nearest_pow2(rows)))


def wgmma_gemm1_knobs(block_m: int, shape: MoEShape, rows: float | None = None) -> dict:
    """GEMM1's ring depth, static ring, own M tile and tail for the wgmma family at ``block_m``
    (the heuristic's rule, ``_wgmma_config``; the tuner applies it when it moves ``block_m``): 3
    stages, the static ring where they divide H / 256, 2 stages and neither below ``block_m``
    64. With the static ring, tiles of 16 more rows on a second accumulator (``tail1``), and
    at I <= 512 (``block_m`` capped at 64 for GEMM2) a tile of its own for GEMM1: with the tail
    ``rows`` rounded as ``block_m`` is but capped at 128 (64 + 16 beat 128 + 16 and 128 at TP8
    T = 2048), else (or without ``rows``) 128 from ``block_m`` 64."""
    big = block_m >= 64
    sr = int(big and static_ring_fits(shape.H, 3))
    tile1 = block_m
    if block_m == 64 and shape.I <= 512:
        tile1 = 128 if rows is None or not sr else min(128, max(64, _nearest_pow2(rows)))
    return dict(
        stages1=3 if big else 2,
        static_ring1=sr,
        block_m1=tile1 if tile1 != block_m else 0,
        tail1=16 if sr else 0,
    )


def _wgmma_config(rows: float, shape: MoEShape, block_p: int) -> PrefillConfig:
    """The wgmma family's default (sm_90), from the same-run A/B on the H200
    (``benchmarks/results/prefill_wgmma/wgmma_ab_final_h200.json``: GLM-5 TP8, TP8 with the
    fused shared expert, EP8 and DeepSeek-R1 TP8, T = 512..8192):

    * ``block_m`` (``_wgmma_block_m``): the expected rows per local expert ``rows`` (EP-aware),
      rounded to the nearest power of two, at least 32, at most 64 when ``I`` <= 512 and 128
      above. At ~16 rows 32 beat 64 (TP8 T = 512: 452 vs 677 us; EP8: 363 vs 595); at ~32, 32
      beat 64 (TP8 T = 1024: 646 vs 685; EP8 535 vs 560; DeepSeek-R1 749 vs 792); at ~64, 64 and
      32 tie or 64 wins (TP8 T = 2048: 1,008 vs 1,037). At ~128 rows the GEMM2 of I = 256 is the
      difference: 64 beat 128 at TP8 T = 4096 (1,667 vs 1,771; half the experts overflow a
      128-row tile, and GEMM2 at 128 spills) but 128 beat 64 at EP8 (I = 2048: 1,315 vs 1,364;
      T = 8192, ~256 rows: 2,027 vs 2,354). With this rule every point of that A/B gets its
      measured best ``block_m`` except T = 8192 at I = 256, where 64 is 1-2% slower than 128
      (TP8 2,925 vs 2,900 us; with the fused shared expert 3,232 vs 3,155).
    * GEMM1: 3 ring stages at ``block_m`` >= 64 (TP8 T = 4096: 759 vs 794 us; EP8 at 128,
      ``prefill_wgmma_gemm2/wgmma_ab_h200.json``: T = 4096 1,259 vs 1,307 us, 8192 1,987 vs 2,031),
      2 otherwise.
    * GEMM2: 2 stages; 8 row blocks per program at ``I`` <= 512 (one chunk per block: the
      blocks share the program's pipeline; TP8 T = 512: 213 vs 246 us at 4), 4 above (EP8,
      I = 2048: T = 1024 180 vs 218 us at 8).
    * GEMM2 at ``I`` = 256 (one chunk per row block): one warpgroup of 64 rows and two
      accumulators (``accs2``), 8 blocks per program (``prefill_wgmma_gemm2/prefill_gemm2_tp8_h200
      .json``, same run, GLM-5 TP8): GEMM2 178 vs 216 us at T = 512, 251 vs 306 at 1024, 392 vs
      431 at 2048, 635 vs 727 at 4096, 1,142 vs 1,305 at 8192 (4 blocks per program: 1,100). At
      EP8 (I = 2048) one warpgroup lost (T = 4096: 724 vs 453 us): 8 warps stay above.
    * From ``block_m`` 64 (``prefill_static_ring/prefill_ring_{tp8,ep8}_h200.json``, same run):
      GEMM1's activation ring in static slots (``static_ring1``, where the 3 stages divide
      ``H / 256``; Nsight Compute: barrier stalls 16.6% -> 5.5% of GEMM1's samples): TP8
      T = 2048 / 4096 / 8192 912 / 1,505 / 2,673 vs 950 / 1,567 / 2,765 us, EP8 818 / 1,207 /
      1,881 vs 854 / 1,265 / 1,987. Below 64 it lost (TP8 T = 512: 512 vs 409; EP8 475 vs 356).
      Where ``I`` <= 512 capped ``block_m`` at 64 (GEMM2's spills), GEMM1 tiles 128 rows of its
      own (``block_m1``: each tile decodes its expert's weights once): TP8 with the static ring
      897 / 1,424 / 2,461 us.
    * GEMM2's staged epilogue (``smem_epi2``) at ``I`` = 256 and at ``block_m`` 128, and at
      ``I`` = 256 every row block's codes copied when a program starts (``code_ring2=1``)
      (``prefill_sorted_tw/prefill_sorted_tw_{tp8,ep8}_h200.json``, same run): TP8
      GEMM2 at T = 1024 / 2048 / 4096 / 8192 248 / 421 / 688 / 1,233 us -> 228 / 329 / 536 / 935
      staged, 224 / 289 / 460 / 817 with both; EP8 (I = 2048) staged at T = 4096 / 8192 489 /
      742 -> 447 / 669, but 268 -> 280 at T = 2048 (``block_m`` 64) and a tie at 1024. The L2
      code prefetch (``l2_prefetch1/2`` = 2) lost in both (TP8 T = 4096 1,501 vs 1,465 us).
    * The routing weight in GEMM1's epilogue (``tw1``) everywhere, and at ``I`` = 256 GEMM2's
      epilogue loads hoisted (``hoist2``) (``prefill_gemm2_epilogue/prefill_{tp8,ep8,fused}
      _h200.json``, same run): TP8 T = 1024 / 2048 / 4096 / 8192 542 / 711 / 1,114
      / 2,016 us -> 506 / 648 / 1,030 / 1,875 (GEMM2 463 -> 370 at 4096); the fused shared expert
      781 / 1,230 / 2,224 -> 715 / 1,137 / 2,098 at 2048 / 4096 / 8192; EP8 (``tw1`` alone: no
      spills in GEMM2) 1,062 / 1,814 -> 1,010 / 1,748 at 4096 / 8192, 532 -> 529 at 1024, and
      693 -> 703 at 2048 (+1.4%, kept: one rule).
    * At ``I`` = 256 where an expert expects at least two M tiles of rows (``rows`` >= 2
      ``block_m``): GEMM2's M tiles of 2 sub-tiles that share each decoded row block
      (``msub2``) on 4 blocks per program (``prefill_msub2/prefill{,_rerun}_tp8_h200.json``,
      and ``prefill_off_*``: three sweep processes): TP8 T = 4096 1,037.5 /
      1,035.6 / 1,036.8 -> 1,022.1 / 1,024.1 / 1,020.6 us, 8192 1,900.0 / 1,911.0 / 1,913.7 ->
      1,861.9 / 1,859.1 / 1,864.1 (GEMM2 ~672 -> ~628); the fused shared expert 1,147.1 /
      2,136.8 -> 1,127.1 / 2,070.6, DeepSeek-R1 TP8 1,373.8 / 2,385.9 -> 1,363.0 / 2,318.9 at
      4096 / 8192; and TP8 2048 (``rows`` = ``block_m``) 647.6 / 645.5 -> 657.6 / 654.2, so
      not there. 3 sub-tiles
      lost (GEMM2 368 -> 608 us at 4096): their 172 KB of shared memory leave one 4-warp CTA per
      SM where the 106 KB of one sub-tile run two.
    """
    bm = _wgmma_block_m(rows, shape)
    one_chunk = shape.I == K_CHUNK
    msub = one_chunk and rows >= 2 * bm
    return WgmmaPrefillConfig(
        block_m=bm,
        **wgmma_gemm1_knobs(bm, shape, rows),
        block_n1=128,
        block_k1=K_CHUNK,
        warps1=8,
        block_n2=64 if one_chunk else 128,
        block_k2=K_CHUNK,
        warps2=4 if one_chunk else 8,
        stages2=2,
        group_n2=8 if shape.I <= 512 and not msub else 4,
        block_p=block_p,
        accs2=2 if one_chunk else 1,
        smem_epi2=int(one_chunk or bm >= 128),
        code_ring2=int(one_chunk),
        tw1=1,
        hoist2=int(one_chunk),
        msub2=2 if msub else 1,
    )


def default_prefill_family(shape: MoEShape, target: Target) -> str:
    """The prefill family a call uses by default: ``"w4a4"`` where the GPU has the block-scaled
    FP4 MMA (and ``SGLANG_FP4EXT_PREFILL_ACTIVATIONS`` is not ``bf16``), ``"wgmma"`` on sm_90,
    else ``"dot"``; the two v2 families need H and I multiples of 256."""
    cap = target_info.arch_capability(target.arch)
    if not wgmma_supports_shape(shape.H, shape.I) or target_info.is_interpreter():
        return "dot"
    if prefill_activations() == "auto" and target_info.has_native_fp4_mma(cap):
        return "w4a4"
    if target_info.supports_wgmma_prefill(cap):
        return "wgmma"
    return "dot"


def _w4a4_config(block_m: int, target: Target, block_p: int) -> PrefillConfig:
    """The W4A4 family's default (sm_100 / sm_120; on paper: no such GPU here). ``block_m``: the
    v1 rule's tile capped at 128. 128 weight rows on 8 warps on sm_100 (``tcgen05``'s block-scaled
    FP4 MMA needs an M of 128: with 64 rows Triton 3.8 falls back to bf16 MMAs and 3.6 fails to
    compile, measured by AOT). On sm_120 (``mma.sync`` m16n8k64, 99 KB of shared memory) by the
    SASS of the K loop (Triton 3.8, GLM-5 TP8 and EP8; not timed: no such GPU here), where the
    dense FP4 rate (4096 FLOP per clock per SM) leaves a scheduler 16 issue slots per
    ``OMMA``: at ``block_m`` = 128, 128 rows on 8 warps issue 10.6 instructions per ``OMMA``
    (214 registers, 64 KB shared) where 64 rows on 4 warps issue 33.7 (Triton splits its warps
    along the tokens there, so every warp repacks every weight row); at ``block_m`` <= 64, 64 rows
    on 4 warps (19.1 at 64; 128 rows: 18.0 on 4 warps, 25.0 on 8)."""
    bm = min(block_m, 128)
    big = _datacenter_mma(target.arch)
    bn, w = (128, 8) if big or bm == 128 else (64, 4)
    return W4A4PrefillConfig(
        block_m=bm,
        block_n1=bn,
        block_k1=K_CHUNK,
        warps1=w,
        stages1=2,
        block_n2=bn,
        block_k2=K_CHUNK,
        warps2=w,
        stages2=2,
        group_n2=1,
        block_p=block_p,
    )


def prefill_heuristic_config(
    T: int, shape: MoEShape, target: Target, kernels: str | None = None
) -> PrefillConfig:
    """Deterministic default for ``T`` tokens (any shape); never the atomic combine. The family
    is :func:`default_prefill_family`'s (wgmma on sm_90: ``_wgmma_config``; w4a4 on sm_100 /
    sm_120: ``_w4a4_config``); the rules below are the ``tl.dot`` family's. ``kernels`` forces a
    family's rules (A/B runs, tests, the tuner).

    Measured on the H200 (``benchmarks/results/prefill_sweep_h200.json``: GLM-5 TP8, TP8 with the
    fused shared expert and EP8, T = 512..8192, each GEMM's variants timed per kernel):

    * ``block_m``: the expected rows per local expert (``MoEShape.rows_per_expert``: ``T k / D(T)``
      under uniform routing, EP-aware) rounded up to a
      power of two, within [16, 256] on sm_90/sm_100 and [16, 128] elsewhere. Every M tile decodes
      its expert's weights again, so tiles as large as the rows per expert win (T = 4096 TP8:
      ~128 +- 11 rows, half the experts overflow a 128-row tile: 256 rows 2,014 us vs 2,050).
    * GEMM1 on sm_90/sm_100: ``block_m <= 128``: 256-deep K steps (the packed decode of both
      nibbles, 2.25 instructions per weight), 2 stages; 64 weight rows and 4 warps (one
      warpgroup) up to 64 tokens (T = 512 TP8: 410 vs 441 us for 128 rows), 128 rows and 8 warps
      above; ``block_m = 256``: 128 rows, 128-deep steps, 8 warps, 2 stages (256-deep steps
      exceed the 227 KB of shared memory there).
    * GEMM2 on sm_90/sm_100: 128 rows, 128-deep steps, 8 warps, 2 stages, 8 row blocks per program.
    * Elsewhere (sm_120 and sm_8x: ``mma.sync`` with every operand in registers, 99 KB of shared
      memory on sm_120): 64 weight rows, 128-deep steps, 8 warps, 3 stages (64 x 128 tiles fit:
      no spills, <= 101,376 B shared on sm_120; 128 x 128 spills), 8 row blocks per program.
    * ``block_p``: ``P`` rounded up to a power of two within [64, 1024] (the grouping sorts
      ``block_p`` slots per program in registers).
    """
    P = max(T, 1) * shape.top_k
    rows = shape.rows_per_expert(T)
    big = _datacenter_mma(target.arch)
    block_m = min(256 if big else 128, max(16, _next_pow2(math.ceil(rows))))
    block_p = min(1024, max(64, _next_pow2(P)))
    if kernels is None:
        kernels = default_prefill_family(shape, target)
    if kernels not in PrefillConfig.families():
        raise ValueError(
            f"prefill_heuristic_config: kernels must be one of "
            f"{tuple(PrefillConfig.families())} or None, got {kernels!r}"
        )
    if kernels == "wgmma":
        return _wgmma_config(rows, shape, block_p)
    if kernels == "w4a4":
        return _w4a4_config(block_m, target, block_p)
    if not big:
        g1 = dict(block_n1=64, block_k1=128, warps1=8, stages1=3)
        g2 = dict(block_n2=64, stages2=3)
    elif block_m == 256:
        g1 = dict(block_n1=128, block_k1=128, warps1=8, stages1=2)
        g2 = dict(block_n2=128, stages2=2)
    elif block_m == 128:
        g1 = dict(block_n1=128, block_k1=256, warps1=8, stages1=2)
        g2 = dict(block_n2=128, stages2=2)
    else:
        g1 = dict(block_n1=64, block_k1=256, warps1=4, stages1=2)
        g2 = dict(block_n2=128, stages2=2)
    return DotPrefillConfig(
        block_m=block_m, **g1, **g2, block_k2=128, warps2=8, group_n2=8, block_p=block_p
    )
