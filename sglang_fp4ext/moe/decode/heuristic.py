"""The decode config heuristic: the :class:`DecodeConfig` a token bucket, shape and GPU get
when no table entry exists (the measurements behind it: the comments here).

**Heuristic.** Grid by pair slots while ``T * top_k <= E`` (every program has an expert), else by
experts. Every GEMM runs 2 warps per program (``mma.sync`` with the decoded weights in registers,
see ``decode._dot_kernels``), 64-row tiles and 3 pipeline stages (two 256-deep K chunks in flight).
``block_t`` covers the expected pairs per expert (8 or 16; wider tiles spill). GEMM1 splits K until
the expected busy programs (distinct experts ``D(T) = E (1 - (1 - k/E)^T)`` x row tiles x splits)
reach about four per SM, keeping at least 2 K chunks per split (Little's law: ~25-30 KB in flight
per SM covers DRAM latency). GEMM2 (K = I, one chunk per expert under TP) does the same with its K,
then packs ``tiles2`` row tiles into a program while there are more than ~8 programs per SM, so the
per-program setup and the combine bookkeeping are amortised. While experts see few pairs (``T *
top_k / D <= 2``; H200 tuning picked it for GLM-5 TP8 up to T = 32) GEMM2 is token-centric instead
(``gemm2="tokens"``), unless that gives fewer 32-row programs than SMs. On the Gluon family the
pairs GEMM2 leaves its top-k sum to a third launch (``combine="kernel"``). At one token the Gluon
launches use programmatic dependent launch where the GPU has it (``pdl``). On the Gluon family it
then takes the forms ``fp4ext tune`` found faster on Hopper (``_measured_forms``): a fused shared
expert's pair chunks spread over programs, 32-row token GEMM2 tiles where its chains are short,
GEMM1's K splits on one program's warps at 1-4 tokens and a token's slots side by side at 1-2.
"""

from __future__ import annotations

import dataclasses

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.decode.config import DecodeConfig, DotDecodeConfig, GluonDecodeConfig
from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN
from sglang_fp4ext.moe.shape import MoEShape, Target, token_bucket
from sglang_fp4ext.roofline import expected_distinct_experts


def heuristic_config(T: int, shape: MoEShape, target: Target, forms: bool = True) -> DecodeConfig:
    """Deterministic default for any shape (see module docstring). ``forms=False``: without the
    small-T and hot-expert forms of :func:`_measured_forms` (the tuner times both)."""
    b = token_bucket(max(T, 1))
    P = b * shape.top_k
    grid = "slots" if P <= shape.E else "experts"
    D = max(1.0, min(float(P), expected_distinct_experts(b, shape.E, min(shape.top_k, shape.E))))
    rows_per_expert = P / D
    # 32-wide pair tiles spill on sm_90 (255 registers): 16 at most, more pairs loop.
    block_t = 8 if rows_per_expert <= 8 else 16
    want = 4 * target.num_sms
    block_p = 256 if P > 128 else 128
    bn = 64

    # Gluon where it runs; its GEMM1 streams an expert's many rows best as 128-row tiles of 4
    # warps (H200, GLM-5 EP8 at every T and TP8 T = 256: gluon_decode_ab_h200.json).
    gluon = target_info.supports_gluon_decode(target_info.arch_capability(target.arch))
    wide = gluon and 2 * shape.I >= 1024
    bn1 = 128 if wide else bn

    def split_for(n_rows: int, k: int, rows_per_tile: int) -> int:
        n_pad = -(-n_rows // ROW_ALIGN) * ROW_ALIGN
        kc = -(-k // K_CHUNK)
        tiles = D * (n_pad // rows_per_tile)
        split = 1
        while tiles * split < want and kc // (split * 2) >= 2:
            split *= 2
        return split

    # The tiles GEMM1 launches (128 rows when wide: counting 64-row tiles halved its split;
    # the H200 EP8 table's tuned split_k1 at T = 1 and 2 is the doubled one, 4 and 2).
    sk1 = split_for(2 * shape.I, shape.H, bn1)
    sk2 = split_for(shape.H, shape.I, bn)
    tiles2 = 1
    nb2 = -(-shape.H // ROW_ALIGN) * ROW_ALIGN // bn
    progs2 = D * nb2 * sk2
    while tiles2 < 8 and progs2 / (2 * tiles2) >= 2 * want:
        tiles2 *= 2
    # Few pairs per expert: token-centric GEMM2 (no combine round trips; repeats of an expert
    # mostly hit L2); 32-row tiles while there would be fewer than 2 programs per SM.
    # A token program walks top_k experts x K chunks in a chain: with fewer 32-row programs
    # than SMs that chain is the time (Qwen3-30B-A3B T = 1: 1.75x the pairs GEMM2).
    nb2_32 = -(-shape.H // ROW_ALIGN) * ROW_ALIGN // 32
    few = b * nb2_32 < target.num_sms
    # 2 pairs per expert: with the third-launch combine the pairs GEMM2 was 1.15x faster from
    # GLM-5 TP8 T = 64 (2.3 pairs per expert; decode_combine_split_t/split_t_ab_h200.json).
    gemm2 = "tokens" if rows_per_expert <= 2.0 and not few else "pairs"
    bn2 = 32 if gemm2 == "tokens" and b * nb2 < 2 * target.num_sms else bn
    tiles = dict(
        grid=grid,
        block_t=block_t,
        block_p=block_p,
        block_n1=bn1,
        split_k1=sk1,
        warps1=4 if wide else 2,
        block_n2=bn2,
        split_k2=1 if gemm2 == "tokens" else sk2,
        warps2=2,
        tiles2=1 if gemm2 == "tokens" else tiles2,
        gemm2=gemm2,
    )
    if not gluon:
        return DotDecodeConfig(**tiles, stages1=3, stages2=3)
    cfg = GluonDecodeConfig(
        **tiles,
        # The in-kernel combine serialises each program on its arrival counters; a third launch
        # summing the partials was 1.05-1.48x faster wherever the pairs GEMM2 ran (H200, GLM-5
        # TP8 T = 64-256, EP8 T = 16-256: decode_combine_split_t/combine_ab_h200.json).
        combine="kernel" if gemm2 == "pairs" else "counter",
        # One token: starting GEMM2 while GEMM1 runs (its weights asked of L2). With the pairs
        # GEMM2 at once (pdl 1): won at T = 1 in every H200 run, layers back to back or not
        # (GLM-5 EP8 3-5%, Qwen3-30B-A3B 5-6%; decode_pdl/), and beat pdl 2 (EP8 6.3 vs
        # 7.0 us, Qwen3 20.5 vs 21.8). The token GEMM2 lost with pdl 1 back to back (TP8 29.1
        # vs 25.2 us) but won with pdl 2, GEMM1 releasing it after its K loops: TP8 24.9 -> 23.3
        # us back to back, 26.9 -> 25.2 with a kernel between layers (decode_pdl_trigger/). From
        # T = 2 both lost or tied (T = 4: 40.8 -> 46.6 us with pdl 2).
        pdl=(1 if gemm2 == "pairs" else 2)
        if b == 1 and target_info.supports_pdl(target_info.arch_capability(target.arch))
        else 0,
    )
    return _measured_forms(cfg, b, shape, target, wide) if forms else cfg


def _measured_forms(
    cfg: DecodeConfig, b: int, shape: MoEShape, target: Target, wide: bool
) -> DecodeConfig:
    """The Gluon forms where ``fp4ext tune`` found them faster (on both Hopper cards unless a
    rule says otherwise: the H200 table, and the H100 runs in
    ``benchmarks/results/decode_forms_h100/``), for shapes and GPUs without a table of their own.

    * **Hot expert** (``MoEShape.fused_shared``: every token hits one expert): from 64 tokens
      the pairs GEMM2 and GEMM1 spread its pair chunks over ``split_t = b / (2 block_t)``
      programs (at most 8), two chunks each (GLM-5 TP8 + shared T = 64: 465 -> 349 µs); beside
      the token GEMM2 on the expert grid GEMM1 gives each of its ``b / block_t`` chunks a
      program (at most 8; TP8 + shared T = 32: 302.1 -> 265.7 µs, H100 only).
    * **32-row token GEMM2 tiles** at every T where a token program's chain is short -- at
      most one K chunk per slot on average (``I / 256 <= ep``: GLM-5 TP8 and EP8, DeepSeek-R1
      TP8) -- not only below the base rule's 2 programs per SM: more, smaller programs won there
      (H100: GLM-5 TP8 T = 16 / 32 133.8 / 216.7 -> 127.5 / 197.9 µs, DeepSeek-R1 T = 8 / 16 /
      32 96.3 / 157.7 / 264.3 -> 93.2 / 143.5 / 241.2; EP8 T = 4 32 rows in both cards'
      tables); with Qwen3-30B-A3B's 3 chunks a slot the base rule's 64 rows won at T = 16
      (121.6 vs 113.2).
    * **GEMM1's K splits on one program's warps** (``kstack1``) at 1-4 tokens: 8 / 4 / 2 splits
      at 1 / 2 / 4 tokens (4 at one token with a 9th id per token: 8 lost there, 29.2 vs
      25.0 µs), fewer where the K chunks do not divide; 32 rows on one warp a split, 64 on two
      at 4 tokens (GLM-5 TP8 T = 1 / 2 / 4: 23.9 / 36.2 / 54.9 -> 18.8 / 27.0 / 43.0 µs with
      the next form). For experts of >= 1024 GEMM1 rows only at 2 tokens (EP8 T = 2: 24.8 ->
      21.3 µs; T = 1: 30.2 vs 27.2, T = 4: 63.0 vs 59.9, H100), nor at 2 tokens with a 9th id
      (a tie).
    * **A token's slots side by side** in the token GEMM2 (``slots2``, one warp a slot) at 1-2
      tokens where every slot is a local expert (top-k <= 8, no expert parallelism: under EP
      most slots are another rank's and lost 1.5x).
    """
    if cfg.kernels != "gluon":
        return cfg
    r = dataclasses.replace
    if shape.fused_shared and cfg.gemm2 == "pairs" and b >= 64:
        cfg = r(cfg, split_t=min(8, b // (2 * cfg.block_t)))
    elif shape.fused_shared and cfg.grid == "experts" and b >= 2 * cfg.block_t:
        cfg = r(cfg, split_t=min(8, b // cfg.block_t))
    if cfg.gemm2 != "tokens":
        return cfg
    if -(-shape.I // K_CHUNK) <= shape.ep:
        cfg = r(cfg, block_n2=32)
    kc1 = -(-shape.H // K_CHUNK)
    splits = [
        s for s in (8, 4, 2) if s <= min(8 // b, 4 if shape.top_k > 8 else 8) and kc1 % s == 0
    ]
    if b <= 4 and splits and not (wide and b != 2) and not (b == 2 and shape.top_k > 8):
        cfg = r(
            cfg,
            kstack1=1,
            split_k1=splits[0],
            warps1=2 if b == 4 else 1,
            block_n1=64 if b == 4 else 32,
        )
    if b <= 2 and shape.top_k <= 8 and shape.ep == 1:
        cfg = r(cfg, slots2=1, warps2=1, block_n2=64 if b == 1 else 32)
    return cfg
