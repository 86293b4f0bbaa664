"""Launch config of the NVFP4 decode path (``decode.launch.fused_moe_nvfp4``) and its heuristic.

:class:`DecodeConfig` is the frozen (GEMM1, GEMM2) tile and launch description;
:func:`heuristic_config` the deterministic default for any shape. Which path serves a token count
and the tuned tables live in ``config.py``; this module imports no launcher.

**Heuristic.** Grid by pair slots while ``T * top_k <= E`` (every program has an expert), else by
experts. Every GEMM runs 2 warps per program (``mma.sync`` with the decoded weights in registers,
see ``decode._dot_kernels``), 64-row tiles and 3 pipeline stages (two 256-deep K chunks in flight).
``block_t`` covers the expected pairs per expert (8 or 16; wider tiles spill). GEMM1 splits K
until the expected busy programs (distinct experts ``D(T) = E (1 - (1 - k/E)^T)`` x row tiles x
splits) reach about four per SM, keeping at least 2 K chunks per split (Little's law: ~25-30 KB in
flight per SM
covers DRAM latency). GEMM2 (K = I, one chunk per expert under TP) does the same with its K, then
packs ``tiles2`` row tiles into a program while there are more than ~8 programs per SM, so the
per-program setup and the combine bookkeeping are amortised. While experts see few pairs
(``T * top_k / D <= 2``; H200 tuning picked it for GLM-5 TP8 up to T = 32) GEMM2 is
token-centric instead (``gemm2="tokens"``), unless that gives fewer 32-row programs than SMs. On the
Gluon family the pairs GEMM2 leaves its top-k sum to a third launch (``combine="kernel"``). At one
token with the pairs GEMM2 the Gluon launches
use programmatic dependent launch where the GPU has it (``pdl``). On the Gluon family
it then takes the forms ``fp4ext tune`` found faster on Hopper (``_measured_forms``): a fused
shared expert's pair chunks spread over programs, 32-row token GEMM2 tiles where its chains are
short, GEMM1's K splits on one program's warps at 1-4 tokens and a token's slots side by side
at 1-2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sglang_fp4ext.moe.layout import ROW_ALIGN
from sglang_fp4ext.moe.shape import ConfigDict

__all__ = ["KERNEL_FAMILIES", "DecodeConfig"]

#: Decode kernel families: "dot" (Triton ``tl.dot``, v1) and "gluon" (v2).
KERNEL_FAMILIES = ("dot", "gluon")


def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


@dataclass(frozen=True)
class DecodeConfig(ConfigDict):
    """Tile and launch parameters of one (GEMM1, GEMM2) decode call. ``eval(repr(cfg)) == cfg``.

    ``grid``: ``"slots"`` (one program per pair slot; non-leaders exit) or ``"experts"``.
    ``block_t``: pairs per MMA tile (N side); ``block_p``: ids scanned per routing step.
    ``block_n*``: weight rows per tile (M side); ``split_k*``: K splits; ``warps*``/``stages*``:
    Triton ``num_warps``/``num_stages`` (2 warps keep ``tl.dot`` on ``mma.sync``; 4 or more with
    ``block_n >= 64`` let Hopper pick wgmma, whose register operand layout costs byte shuffles).
    ``tiles2``: GEMM2 row tiles per program. ``gemm2``: ``"pairs"`` (a program per expert and
    row tiles, all its pairs, arrival-counter top-k combine) or ``"tokens"`` (a program per token
    and row tile walking the token's experts: no combine; for experts seeing ~1 token).
    Suffix 1 = GEMM1 (gate/up rows, interleaved), 2 = GEMM2.
    ``kernels``: ``"dot"`` (the ``tl.dot`` kernels of ``decode._dot_kernels``, the fallback and the
    only family the interpreter runs) or ``"gluon"`` (``decode._gluon_kernels``: GEMM1 and the
    token-centric GEMM2 in Gluon, a ``"pairs"`` GEMM2 still from the dot family; ``stages*`` unused:
    the Gluon K loop prefetches one chunk in registers).
    ``combine``: how the pairs GEMM2 sums a token's top-k: ``"counter"`` (the last partial to
    arrive sums them in the GEMM2 kernel) or ``"kernel"`` (GEMM2 only writes partials; a third
    launch sums them, same order and bits). The dot family always runs ``"counter"``; the
    token-centric GEMM2 needs no combine and ignores it.
    ``split_t``: Gluon only: each expert's pair chunks (``block_t`` pairs) are spread over this
    many programs per row tile and K split, in GEMM1 and the pairs GEMM2, so an expert with many
    pairs (a fused shared expert sees every token) does not run alone while the rest idle.
    ``pdl``: 1 or 2 launches the Gluon kernels with programmatic dependent launch where the GPU
    has it (sm_90+; the dot family and older GPUs ignore it, as the self-check's dot fallback
    does): GEMM2 starts while GEMM1 runs, asks L2 for its weights (slot
    grid or token GEMM2) and waits for GEMM1 in-kernel; the combine and the next GEMM1 start
    early the same way and wait before touching memory. With 1 each kernel lets the next start
    at once; with 2 GEMM1 does so after its K loops and the others at their exit.
    ``slots2``: 1 has the Gluon token GEMM2 decode up to 8 of a token's top-k slots side by
    side (1-2 rounds), each on ``warps2`` warps of its own, and sum them in slot order through
    shared memory (the same bits as 0, which walks them one after the other);
    ``min(next_pow2(top_k), 8) * warps2`` warps per program (at most 32). Gluon,
    ``gemm2="tokens"``.
    ``kstack1``: 1 has the Gluon GEMM1 run its ``split_k1`` K splits (2, 4 or 8) on the warps of
    one program instead of one program each (``_gemm1_kstack``): the row tile stacked once per
    split along the MMA rows, each split's activations in MMA columns of their own, the partials
    summed in split order through shared memory (the same bits as 0, without the fp32
    workspace's round trip); ``split_k1 * warps1`` warps per program (at most 32), ``block_t``
    pairs a pass as 8 MMA columns (``8 / split_k1`` pairs). ``split_t`` 1; the K chunks must
    divide evenly (the launcher checks).
    ``maxnreg1``: a register cap for the Gluon GEMM1 launch (Triton's ``maxnreg``; 0 leaves it to
    the compiler): at 128-256 tokens GEMM1 holds 176-235 registers a thread, 4-5 two-warp CTAs
    an SM, and waits on its loads (Nsight Compute on the H100); a cap buys resident warps at the
    risk of spills. Out of the heuristic until measured; ``fp4ext tune`` times one cap per
    bucket from 32 tokens (``tune_space.gemm1_reg_cap``).
    """

    grid: str = "slots"
    block_t: int = 8
    block_p: int = 128
    block_n1: int = 64
    split_k1: int = 1
    warps1: int = 2
    stages1: int = 3
    block_n2: int = 64
    split_k2: int = 1
    warps2: int = 2
    stages2: int = 3
    tiles2: int = 1
    gemm2: str = "pairs"
    kernels: str = "dot"
    combine: str = "counter"
    split_t: int = 1
    pdl: int = 0
    slots2: int = 0
    kstack1: int = 0
    maxnreg1: int = 0

    def __post_init__(self):
        if self.kernels not in KERNEL_FAMILIES:
            raise ValueError(
                f"DecodeConfig.kernels must be one of {KERNEL_FAMILIES}, got {self.kernels!r}"
            )
        if self.grid not in ("slots", "experts"):
            raise ValueError(f"DecodeConfig.grid must be 'slots' or 'experts', got {self.grid!r}")
        if self.gemm2 not in ("pairs", "tokens"):
            raise ValueError(f"DecodeConfig.gemm2 must be 'pairs' or 'tokens', got {self.gemm2!r}")
        if self.gemm2 == "tokens" and (self.split_k2, self.tiles2) != (1, 1):
            raise ValueError(
                "DecodeConfig.gemm2='tokens' walks whole experts per program: split_k2 and "
                f"tiles2 must be 1, got {self.split_k2} and {self.tiles2}"
            )
        if self.combine not in ("counter", "kernel"):
            raise ValueError(
                f"DecodeConfig.combine must be 'counter' or 'kernel', got {self.combine!r}"
            )
        if self.pdl not in (0, 1, 2):
            raise ValueError(f"DecodeConfig.pdl must be 0, 1 or 2, got {self.pdl!r}")
        if self.slots2 not in (0, 1):
            raise ValueError(f"DecodeConfig.slots2 must be 0 or 1, got {self.slots2!r}")
        if self.slots2 and self.gemm2 != "tokens":
            raise ValueError(
                "DecodeConfig.slots2=1 is a form of the token GEMM2: gemm2 must be 'tokens', "
                f"got {self.gemm2!r}"
            )
        if self.kstack1 not in (0, 1):
            raise ValueError(f"DecodeConfig.kstack1 must be 0 or 1, got {self.kstack1!r}")
        if self.kstack1:
            if self.split_k1 not in (2, 4, 8):
                raise ValueError(
                    "DecodeConfig.kstack1=1 stacks GEMM1's K splits in one program's 8 MMA "
                    f"columns: split_k1 must be 2, 4 or 8, got {self.split_k1}"
                )
            if self.split_t != 1:
                raise ValueError(
                    "DecodeConfig.kstack1=1 stacks one pair chunk's K splits in a program: "
                    f"split_t must be 1, got {self.split_t}"
                )
            if self.split_k1 * self.warps1 > 32:
                raise ValueError(
                    f"DecodeConfig.kstack1=1 runs split_k1 * warps1 = "
                    f"{self.split_k1 * self.warps1} warps per program: more than 32"
                )
        if self.maxnreg1 != 0 and not 64 <= self.maxnreg1 <= 255:
            raise ValueError(
                f"DecodeConfig.maxnreg1 must be 0 (the compiler's choice) or 64..255 registers, "
                f"got {self.maxnreg1!r}"
            )
        if self.maxnreg1 and not takes_gemm1_cap(self.kernels, self.kstack1):
            raise ValueError(
                "DecodeConfig.maxnreg1 caps the Gluon GEMM1 (_gemm1): not the tl.dot family "
                f"(kernels={self.kernels!r}) or the stacked splits (kstack1={self.kstack1})"
            )
        for name in (
            "split_t",
            "block_t",
            "block_p",
            "block_n1",
            "block_n2",
            "split_k1",
            "split_k2",
            "warps1",
            "warps2",
            "tiles2",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or not _pow2(v):
                raise ValueError(f"DecodeConfig.{name} must be a power of two, got {v!r}")
        if not 8 <= self.block_t <= 64:
            raise ValueError(f"DecodeConfig.block_t must be in [8, 64], got {self.block_t}")
        for name in ("block_n1", "block_n2"):
            if not 32 <= getattr(self, name) <= ROW_ALIGN:
                raise ValueError(
                    f"DecodeConfig.{name} must be in [32, {ROW_ALIGN}] (16 MMA rows per warp, "
                    f"gate and up halves of >= 16 rows), got {getattr(self, name)}"
                )
        for name, bn, w in (("1", self.block_n1, self.warps1), ("2", self.block_n2, self.warps2)):
            if bn < 16 * w:
                raise ValueError(
                    f"DecodeConfig.block_n{name}={bn} gives warps{name}={w} fewer than 16 rows each"
                )
        if self.block_p < 16:
            raise ValueError(f"DecodeConfig.block_p must be >= 16, got {self.block_p}")
        for name in ("stages1", "stages2"):
            if not 1 <= getattr(self, name) <= 8:
                raise ValueError(
                    f"DecodeConfig.{name} must be in [1, 8], got {getattr(self, name)}"
                )

    def reform(self, **changes) -> DecodeConfig:
        """``self`` with ``changes``, for a config derived in another form (the tl.dot family,
        stacked splits): GEMM1's register cap stays behind where the new form does not take it
        (unless ``changes`` names it), so no deriving caller has to know the rule."""
        if (
            self.maxnreg1
            and "maxnreg1" not in changes
            and not takes_gemm1_cap(
                *(changes.get(k, getattr(self, k)) for k in ("kernels", "kstack1"))
            )
        ):
            changes["maxnreg1"] = 0
        return dataclasses.replace(self, **changes)


def takes_gemm1_cap(kernels: str, kstack1: int) -> bool:
    """GEMM1's register cap (``maxnreg1``) is a launch option of the Gluon GEMM1 (``_gemm1``)
    alone."""
    return kernels == "gluon" and not kstack1
