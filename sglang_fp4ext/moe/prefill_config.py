"""Launch config of the NVFP4 prefill path (``prefill.fused_moe_nvfp4_prefill``) and its heuristic.

:class:`PrefillConfig` is the frozen description of one prefill call (grouping, GEMM1, GEMM2,
combine); :func:`prefill_heuristic_config` the deterministic default for any shape (its docstring
gives the measurements behind it). Which path serves a token count and the tuned tables live in
``config.py``; this module imports no launcher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN
from sglang_fp4ext.moe.shape import ConfigDict, MoEShape, Target
from sglang_fp4ext.roofline import expected_distinct_experts

__all__ = ["PrefillConfig", "prefill_heuristic_config"]


def _pow2(x) -> bool:
    return isinstance(x, int) and x >= 1 and (x & (x - 1)) == 0


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()

@dataclass(frozen=True)
class PrefillConfig(ConfigDict):
    """Tiles and launch parameters of one prefill call. ``eval(repr(cfg)) == cfg``.

    ``block_m``: tokens per MMA tile (the grouping granularity; the MMA's N side). ``block_n*``:
    weight rows per program (M side; GEMM1 rows are interleaved gate/up, so ``block_n1 / 2``
    intermediate columns). ``block_k*``: K per main-loop step, 256 (one layout chunk) or 128 (half
    a chunk). ``warps*``/``stages*``: Triton ``num_warps``/``num_stages``. Suffix 1 = GEMM1, 2 =
    GEMM2. ``block_p``: pair slots per grouping program (sorted in registers). ``combine``:
    ``"ordered"`` (deterministic) or ``"atomic"`` (fp32 atomics, opt-in).
    """

    block_m: int = 128
    block_n1: int = 128
    block_k1: int = 128
    warps1: int = 8
    stages1: int = 2
    block_n2: int = 128
    block_k2: int = 128
    warps2: int = 8
    stages2: int = 2
    group_n2: int = 1
    block_p: int = 1024
    combine: str = "ordered"

    def __post_init__(self):
        for f in fields(self):
            if f.name != "combine" and not isinstance(getattr(self, f.name), int):
                raise ValueError(
                    f"PrefillConfig.{f.name} must be an int, got {getattr(self, f.name)!r}"
                )
        for name in ("block_m", "block_n1", "block_n2", "warps1", "warps2", "group_n2", "block_p"):
            if not _pow2(getattr(self, name)):
                raise ValueError(
                    f"PrefillConfig.{name} must be a power of two, got {getattr(self, name)!r}"
                )
        if not 16 <= self.block_m <= 256:
            raise ValueError(
                f"PrefillConfig.block_m must be in [16, 256] (tl.dot needs >= 16), "
                f"got {self.block_m}"
            )
        if not 32 <= self.block_n1 <= ROW_ALIGN:
            raise ValueError(
                f"PrefillConfig.block_n1 must be in [32, {ROW_ALIGN}] (gate and up halves of "
                f">= 16 rows; the layout pads rows to {ROW_ALIGN}), got {self.block_n1}"
            )
        if not 16 <= self.block_n2 <= ROW_ALIGN:
            raise ValueError(
                f"PrefillConfig.block_n2 must be in [16, {ROW_ALIGN}], got {self.block_n2}"
            )
        for name in ("block_k1", "block_k2"):
            if getattr(self, name) not in (128, K_CHUNK):
                raise ValueError(
                    f"PrefillConfig.{name} must be 128 or {K_CHUNK}, got {getattr(self, name)}"
                )
        for name in ("warps1", "warps2"):
            if not 1 <= getattr(self, name) <= 16:
                raise ValueError(
                    f"PrefillConfig.{name} must be in [1, 16], got {getattr(self, name)}"
                )
        for name in ("stages1", "stages2"):
            if not 1 <= getattr(self, name) <= 8:
                raise ValueError(
                    f"PrefillConfig.{name} must be in [1, 8], got {getattr(self, name)}"
                )
        if not 16 <= self.block_p <= 4096:
            raise ValueError(f"PrefillConfig.block_p must be in [16, 4096], got {self.block_p}")
        if self.combine not in ("ordered", "atomic"):
            raise ValueError(
                f"PrefillConfig.combine must be 'ordered' or 'atomic', got {self.combine!r}"
            )

def _datacenter_mma(arch: str) -> bool:
    """sm_90 / sm_10x: warpgroup (wgmma) or tcgen05 MMA with an operand in shared memory and
    228 KB of shared memory per SM; sm_8x / sm_12x: warp-level ``mma.sync`` with every operand in
    registers and at most 163 KB (99 KB on sm_120). A :class:`Target` carries only the arch
    string, so this reads it rather than asking ``target_info`` about a live device."""
    cc = arch.removeprefix("sm_").rstrip("af")
    return cc.isdigit() and int(cc) // 10 in (9, 10)


def prefill_heuristic_config(T: int, shape: MoEShape, target: Target) -> PrefillConfig:
    """Deterministic default for ``T`` tokens (any shape); never the atomic combine.

    Measured on the H200 (``benchmarks/results/prefill_sweep_h200.json``: GLM-5 TP8, TP8 with the
    fused shared expert and EP8, T = 512..8192, each GEMM's variants timed per kernel):

    * ``block_m``: the expected rows per expert ``T k / D(T)`` (uniform routing) rounded up to a
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
    D = max(1.0, min(float(P), expected_distinct_experts(max(T, 1), shape.E, min(shape.top_k, shape.E))))
    big = _datacenter_mma(target.arch)
    block_m = min(256 if big else 128, max(16, _next_pow2(math.ceil(P / D))))
    block_p = min(1024, max(64, _next_pow2(P)))
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
    return PrefillConfig(
        block_m=block_m, **g1, **g2, block_k2=128, warps2=8, group_n2=8, block_p=block_p
    )
