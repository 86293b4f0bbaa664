"""Launch config of the NVFP4 decode path (``decode.launch.fused_moe_nvfp4``): one frozen type per
kernel family.

:class:`DecodeConfig` holds the tiles and grids both families take; :class:`DotDecodeConfig`
(``tl.dot``) and :class:`GluonDecodeConfig` (Gluon) add their own knobs. The heuristic is
``decode.heuristic``; which path serves a token count and the tuned tables live in
``moe.tables``. This module imports no launcher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN
from sglang_fp4ext.moe.shape import ConfigDict

__all__ = [
    "CoopDecodeConfig",
    "DecodeConfig",
    "DotDecodeConfig",
    "GluonDecodeConfig",
    "check_hidden",
    "fallbacks",
]


def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class DecodeConfig(ConfigDict):
    """What both decode families take: the (GEMM1, GEMM2) tiles and grids of one call. Build a
    family: :class:`DotDecodeConfig` or :class:`GluonDecodeConfig`. ``eval(repr(cfg)) == cfg``.

    ``grid``: ``"slots"`` (one program per pair slot; non-leaders exit) or ``"experts"``.
    ``block_t``: pairs per MMA tile (N side); ``block_p``: ids scanned per routing step.
    ``block_n*``: weight rows per tile (M side); ``split_k*``: K splits; ``warps*``: Triton
    ``num_warps`` (2 warps keep ``tl.dot`` on ``mma.sync``; 4 or more with ``block_n >= 64`` let
    Hopper pick wgmma, whose register operand layout costs byte shuffles).
    ``tiles2``: GEMM2 row tiles per program. ``gemm2``: ``"pairs"`` (a program per expert and
    row tiles, all its pairs, top-k combine) or ``"tokens"`` (a program per token and row tile
    walking the token's experts: no combine; for experts seeing ~1 token).
    Suffix 1 = GEMM1 (gate/up rows, interleaved), 2 = GEMM2.
    """

    grid: str = "slots"
    block_t: int = 8
    block_p: int = 128
    block_n1: int = 64
    split_k1: int = 1
    warps1: int = 2
    block_n2: int = 64
    split_k2: int = 1
    warps2: int = 2
    tiles2: int = 1
    gemm2: str = "pairs"

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        if self.grid not in ("slots", "experts"):
            raise ValueError(f"{name}.grid must be 'slots' or 'experts', got {self.grid!r}")
        if self.gemm2 not in ("pairs", "tokens"):
            raise ValueError(f"{name}.gemm2 must be 'pairs' or 'tokens', got {self.gemm2!r}")
        if self.gemm2 == "tokens" and (self.split_k2, self.tiles2) != (1, 1):
            raise ValueError(
                f"{name}.gemm2='tokens' walks whole experts per program: split_k2 and "
                f"tiles2 must be 1, got {self.split_k2} and {self.tiles2}"
            )
        for f in ("block_t", "block_p", "block_n1", "block_n2", "split_k1", "split_k2", "warps1",
                  "warps2", "tiles2"):  # fmt: skip
            v = getattr(self, f)
            if not isinstance(v, int) or not _pow2(v):
                raise ValueError(f"{name}.{f} must be a power of two, got {v!r}")
        if not 8 <= self.block_t <= 64:
            raise ValueError(f"{name}.block_t must be in [8, 64], got {self.block_t}")
        for f in ("block_n1", "block_n2"):
            if not 32 <= getattr(self, f) <= ROW_ALIGN:
                raise ValueError(
                    f"{name}.{f} must be in [32, {ROW_ALIGN}] (16 MMA rows per warp, "
                    f"gate and up halves of >= 16 rows), got {getattr(self, f)}"
                )
        for i, bn, w in (("1", self.block_n1, self.warps1), ("2", self.block_n2, self.warps2)):
            if bn < 16 * w:
                raise ValueError(
                    f"{name}.block_n{i}={bn} gives warps{i}={w} fewer than 16 rows each"
                )
        if self.block_p < 16:
            raise ValueError(f"{name}.block_p must be >= 16, got {self.block_p}")


@dataclass(frozen=True)
class DotDecodeConfig(DecodeConfig, family="dot"):
    """The ``tl.dot`` kernels of ``decode._dot_kernels``: the fallback of every GPU and the only
    family the interpreter runs. The pairs GEMM2 combines a token's top-k through arrival
    counters (the last partial to arrive sums them). ``stages*``: Triton ``num_stages``."""

    stages1: int = 3
    stages2: int = 3

    def __post_init__(self):
        super().__post_init__()
        for f in ("stages1", "stages2"):
            if not isinstance(getattr(self, f), int) or not 1 <= getattr(self, f) <= 8:
                raise ValueError(f"DotDecodeConfig.{f} must be in [1, 8], got {getattr(self, f)}")


@dataclass(frozen=True)
class GluonDecodeConfig(DecodeConfig, family="gluon"):
    """The Gluon kernels of ``decode._gluon_kernels`` (sm_80+; the interpreter runs their tiles
    on the ``tl.dot`` family). Their K loop prefetches one chunk in registers (no stages).

    ``combine``: how the pairs GEMM2 sums a token's top-k: ``"counter"`` (the last partial to
    arrive sums them in the GEMM2 kernel) or ``"kernel"`` (GEMM2 only writes partials; a third
    launch sums them, same order and bits); the token-centric GEMM2 needs no combine.
    ``split_t``: each expert's pair chunks (``block_t`` pairs) are spread over this many programs
    per row tile and K split, in GEMM1 and the pairs GEMM2, so an expert with many pairs (a fused
    shared expert sees every token) does not run alone while the rest idle.
    ``pdl``: 1 or 2 launches the kernels with programmatic dependent launch where the GPU has it
    (sm_90+; older GPUs ignore it): GEMM2 starts while GEMM1 runs, asks L2 for its weights (slot
    grid or token GEMM2) and waits for GEMM1 in-kernel; the combine and the next GEMM1 start
    early the same way and wait before touching memory. With 1 each kernel lets the next start at
    once; with 2 GEMM1 does so after its K loops and the others at their exit.
    ``slots2``: 1 has the token GEMM2 decode up to 8 of a token's top-k slots side by side (1-2
    rounds), each on ``warps2`` warps of its own, and sum them in slot order through shared
    memory (the same bits as 0, which walks them one after the other);
    ``min(next_pow2(top_k), 8) * warps2`` warps per program (at most 32); ``gemm2="tokens"``.
    ``kstack1``: 1 has GEMM1 run its ``split_k1`` K splits (2, 4 or 8) on the warps of one
    program instead of one program each (``_gemm1_kstack``): the row tile stacked once per split
    along the MMA rows, each split's activations in MMA columns of their own, the partials summed
    in split order through shared memory (the same bits as 0, without the fp32 workspace's round
    trip); ``split_k1 * warps1`` warps per program (at most 32), ``block_t`` pairs a pass as 8 MMA
    columns (``8 / split_k1`` pairs). ``split_t`` 1; the K chunks must divide evenly (the
    launcher checks).
    ``maxnreg1``: a register cap for the GEMM1 launch (Triton's ``maxnreg``; 0 leaves it to the
    compiler): at 128-256 tokens GEMM1 holds 176-235 registers a thread, 4-5 two-warp CTAs an SM,
    and waits on its loads (Nsight Compute on the H100); a cap buys resident warps at the risk of
    spills. Out of the heuristic until measured; ``fp4ext tune`` times one cap per bucket from 32
    tokens (``tune_space.gemm1_reg_cap``).
    """

    combine: str = "counter"
    split_t: int = 1
    pdl: int = 0
    slots2: int = 0
    kstack1: int = 0
    maxnreg1: int = 0

    def __post_init__(self):
        super().__post_init__()
        name = "GluonDecodeConfig"
        if self.combine not in ("counter", "kernel"):
            raise ValueError(f"{name}.combine must be 'counter' or 'kernel', got {self.combine!r}")
        if not isinstance(self.split_t, int) or not _pow2(self.split_t):
            raise ValueError(f"{name}.split_t must be a power of two, got {self.split_t!r}")
        if self.pdl not in (0, 1, 2):
            raise ValueError(f"{name}.pdl must be 0, 1 or 2, got {self.pdl!r}")
        if self.slots2 not in (0, 1):
            raise ValueError(f"{name}.slots2 must be 0 or 1, got {self.slots2!r}")
        if self.slots2 and self.gemm2 != "tokens":
            raise ValueError(
                f"{name}.slots2=1 is a form of the token GEMM2: gemm2 must be 'tokens', "
                f"got {self.gemm2!r}"
            )
        if self.kstack1 not in (0, 1):
            raise ValueError(f"{name}.kstack1 must be 0 or 1, got {self.kstack1!r}")
        if self.kstack1:
            if self.split_k1 not in (2, 4, 8):
                raise ValueError(
                    f"{name}.kstack1=1 stacks GEMM1's K splits in one program's 8 MMA "
                    f"columns: split_k1 must be 2, 4 or 8, got {self.split_k1}"
                )
            if self.split_t != 1:
                raise ValueError(
                    f"{name}.kstack1=1 stacks one pair chunk's K splits in a program: "
                    f"split_t must be 1, got {self.split_t}"
                )
            if self.split_k1 * self.warps1 > 32:
                raise ValueError(
                    f"{name}.kstack1=1 runs split_k1 * warps1 = "
                    f"{self.split_k1 * self.warps1} warps per program: more than 32"
                )
        if self.maxnreg1 != 0 and not 64 <= self.maxnreg1 <= 255:
            raise ValueError(
                f"{name}.maxnreg1 must be 0 (the compiler's choice) or 64..255 registers, "
                f"got {self.maxnreg1!r}"
            )
        if self.maxnreg1 and self.kstack1:
            raise ValueError(
                f"{name}.maxnreg1 caps the GEMM1 of split programs (_gemm1), not the stacked "
                f"splits (kstack1={self.kstack1})"
            )

    def reform(self, kernels: str | None = None, **changes) -> DecodeConfig:
        """As :meth:`ConfigDict.reform`; GEMM1's register cap stays behind where the new form does
        not take it (stacked splits), unless ``changes`` names it."""
        if self.maxnreg1 and "maxnreg1" not in changes and changes.get("kstack1"):
            changes["maxnreg1"] = 0
        return super().reform(kernels, **changes)


@dataclass(frozen=True)
class CoopDecodeConfig(DecodeConfig, family="coop"):
    """The one-launch family of ``decode._coop_kernels`` (sm_80+; the interpreter runs its tiles
    on the ``tl.dot`` family): GEMM1 and GEMM2 in one cooperative persistent launch with a
    grid-wide wait between them. Its tiles are the Gluon family's ``kstack1`` GEMM1 (``split_k1``
    of 2, 4 or 8 K splits on ``warps1`` warps each) and ``slots2`` token GEMM2 (``block_n2`` rows
    a slot, up to 8 slots side by side), on the same ``split_k1 * warps1`` warps a program:
    ``warps2`` is what a slot gets of them at top_k >= 8, so ``split_k1 * warps1 == 8 * warps2``.

    One program an SM (fewer where there are fewer work items), its registers capped at what a
    program of ``split_k1 * warps1`` warps may hold with the SM to itself (128 at 16 warps), so the
    grid is resident. At 16 warps only 16-row warp tiles stay within it (ptxas, sm_90: 0-148
    bytes spilled; 32-row tiles spill 300-1,200): ``block_n1 = 16 * warps1``, ``block_n2 = 32``.
    ``prefetch2``: when GEMM2's weights are asked of L2: 0 never, 1 before GEMM1, 2 after it
    (both before the grid-wide wait).
    """

    split_k1: int = 8
    warps1: int = 2
    warps2: int = 2
    block_n2: int = 32
    gemm2: str = "tokens"
    prefetch2: int = 1

    def __post_init__(self):
        super().__post_init__()
        name = "CoopDecodeConfig"
        fixed = dict(grid="slots", gemm2="tokens", block_t=8, split_k2=1, tiles2=1)
        for f, v in fixed.items():
            if getattr(self, f) != v:
                raise ValueError(
                    f"{name}.{f} must be {v!r} (the one-launch tiles), got {getattr(self, f)!r}"
                )
        if self.split_k1 not in (2, 4, 8):
            raise ValueError(
                f"{name}.split_k1 must be 2, 4 or 8 (GEMM1's K splits stacked in a program's 8 "
                f"MMA columns), got {self.split_k1}"
            )
        warps = self.split_k1 * self.warps1
        if warps != 8 * self.warps2 or warps > 16:
            raise ValueError(
                f"{name}: a program runs split_k1 * warps1 = {warps} warps, which must be 8 * "
                f"warps2 = {8 * self.warps2} (8 slots side by side in GEMM2) and at most 16"
            )
        if self.prefetch2 not in (0, 1, 2):
            raise ValueError(f"{name}.prefetch2 must be 0, 1 or 2, got {self.prefetch2!r}")

    @property
    def warps(self) -> int:
        """Warps per program."""
        return self.split_k1 * self.warps1

    def two_launch(self) -> GluonDecodeConfig:
        """The same tiles on the two-launch Gluon family (the same bits)."""
        return self.reform(kernels="gluon", kstack1=1, slots2=1)


def fallbacks(config: DecodeConfig) -> tuple[DecodeConfig, ...]:
    """The configs the self-check tries, in order, where ``config`` fails its check: a one-launch
    config's tiles on two Gluon launches, then a Gluon config's tiles on the ``tl.dot`` family."""
    if config.kernels == "coop":
        return (config.two_launch(), config.reform(kernels="dot"))
    return (config.reform(kernels="dot"),) if config.kernels != "dot" else ()


def check_hidden(config: DecodeConfig, H: int) -> int:
    """The hidden size the self-check runs ``config`` at for a layer of hidden size ``H``: GEMM1's
    K splits stacked on one program (``kstack1``, the one-launch family) must be equal, so the
    smallest multiple of ``H`` whose K chunks (of 256) ``split_k1`` divides (8 splits: 24
    chunks, H = 6144)."""
    if not (config.kernels == "coop" or (config.kernels == "gluon" and config.kstack1)):
        return H
    kc = H // K_CHUNK
    return K_CHUNK * kc * config.split_k1 // math.gcd(kc, config.split_k1)
