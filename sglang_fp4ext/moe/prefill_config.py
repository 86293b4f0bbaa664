"""Launch config of the NVFP4 prefill path (``prefill.fused_moe_nvfp4_prefill``) and its heuristic.

:class:`PrefillConfig` is the frozen description of one prefill call (grouping, GEMM1, GEMM2,
combine); :func:`prefill_heuristic_config` the deterministic default for any shape (its docstring
gives the measurements behind it). Which path serves a token count and the tuned tables live in
``config.py``; this module imports no launcher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN
from sglang_fp4ext.moe.shape import ConfigDict, MoEShape, Target

__all__ = [
    "PREFILL_KERNEL_FAMILIES",
    "PrefillConfig",
    "default_prefill_family",
    "prefill_activations",
    "prefill_heuristic_config",
    "served_prefill_config",
    "w4a16_twin_config",
    "wgmma_gemm1_knobs",
    "wgmma_supports_shape",
]

#: Prefill GEMM families: "dot" (Triton ``tl.dot``, v1), "wgmma" (Gluon, Hopper, v2) and
#: "w4a4" (Triton ``tl.dot_scaled``, NVFP4 activations, Blackwell).
PREFILL_KERNEL_FAMILIES = ("dot", "wgmma", "w4a4")
#: Opt-in shared memory per block on sm_90 (227 KiB): the wgmma family's activation ring.
WGMMA_SMEM_LIMIT = 232_448


#: The wgmma family's knobs at their off values: the other families take only these, and the
#: W4A16 twin of a wgmma config sets them (``block_m1`` is not among them: every family tiles
#: GEMM1 by it, the twin drops it for the dot family's shared memory).
WGMMA_KNOBS_OFF = dict(prefetch1=1, prefetch2=1, accs2=1, static_ring1=0, static_ring2=0,
                       smem_epi2=0, l2_prefetch1=0, l2_prefetch2=0, code_ring1=0, code_ring2=0,
                       tail1=0, tw1=0, hoist2=0, msub2=1)


def w4a16_twin_config(cfg: "PrefillConfig") -> "PrefillConfig":
    """A v2 prefill config's tiles on the ``tl.dot`` W4A16 kernels (128-deep GEMM2 steps): the
    self-check's fallback, and what a W4A4 choice runs on weights without input scales."""
    return replace(cfg, kernels="dot", block_k2=128, block_m1=0, **WGMMA_KNOBS_OFF)


def prefill_activations() -> str:
    """``SGLANG_FP4EXT_PREFILL_ACTIVATIONS``, checked: ``"auto"`` or ``"bf16"``."""
    from sglang_fp4ext import envs

    acts = (envs.PREFILL_ACTIVATIONS.get() or "auto").strip().lower()
    if acts not in ("auto", "bf16"):
        raise ValueError(f"{envs.PREFILL_ACTIVATIONS.name}={acts!r}: expected 'auto' or 'bf16'")
    return acts


def served_prefill_config(cfg: "PrefillConfig", has_input_scales: bool) -> "PrefillConfig":
    """The config a prefill call runs for ``cfg`` (a table entry or heuristic choice): a W4A4
    config runs as W4A16 (``w4a16_twin_config``) on weights without static input scales or
    when the user asked for bf16 activations."""
    if cfg.kernels == "w4a4" and (not has_input_scales or prefill_activations() == "bf16"):
        return w4a16_twin_config(cfg)
    return cfg


def static_ring_fits(K: int, stages: int) -> bool:
    """``static_ring*`` unrolls a GEMM's K loop by its ring depth: ``stages`` must divide its
    ``K / 256`` chunks (``K`` = H for GEMM1, I for GEMM2)."""
    return (K // K_CHUNK) % stages == 0


def wgmma_supports_shape(H: int, I: int) -> bool:
    """The wgmma kernels step K one 256-wide layout chunk at a time and read K unpadded."""
    return H % K_CHUNK == 0 and I % K_CHUNK == 0


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
    ``"ordered"`` (deterministic) or ``"atomic"`` (fp32 atomics, opt-in, dot). ``kernels``: the
    GEMMs' family, ``"dot"`` (``_prefill_kernels``, v1, every GPU and the interpreter) or ``"wgmma"``
    (``_prefill_gluon_kernels``, sm_90 only: ``block_n*`` 128 weight rows on 8 warps,
    ``block_k*`` 256, ``stages*`` the activation ring's depth 2-4,
    ``block_m`` <= 128, the ordered combine; H and I multiples of 256) or ``"w4a4"``
    (``_prefill_w4a4_kernels``, sm_100/sm_120 and the interpreter: NVFP4 activations with the
    static input scales, ``block_k*`` 256, the ordered combine, ``group_n2`` unused; H and I
    multiples of 256). Under the interpreter a ``"wgmma"`` config runs the ``"dot"`` kernels.
    wgmma only: ``prefetch*``, the K chunks of FP4 codes each GEMM keeps in flight ahead of its
    decode (1-3, in registers); ``accs2``, GEMM2's accumulators: 2 overlaps a row block's
    epilogue with the next block's MMAs (``I`` = 256 only: one K chunk per block;
    ``group_n2`` <= 8, the blocks are unrolled); ``static_ring*`` 1: the activation ring's stages
    are separate shared allocations and the K loop is unrolled by ``stages*`` (2 or 3, a divisor
    of the GEMM's K / 256), so Triton inserts no CTA barriers around the ring's refills (GEMM2:
    with ``accs2`` = 1, the one that has a ring). ``block_m1``: GEMM1's tokens per M tile when it
    differs from GEMM2's (0: ``block_m``, every family). ``smem_epi2`` (wgmma) 1: GEMM2's
    epilogue moves each finished row block through shared memory and stores 16 contiguous bytes
    of a pair row per thread (full sectors) instead of 4-byte pieces from the accumulator
    registers; the same values. ``l2_prefetch*`` (wgmma) n > 0: each chunk also asks L2 for the
    FP4 codes and scales ``n`` chunks past the register queue's (``prefetch*``), so that queue
    loads from L2 instead of DRAM without holding more registers; 0: off. ``code_ring*``
    (wgmma, with ``static_ring*``) n > 0: the FP4 codes and scales are copied into a
    shared-memory ring of n slots (a multiple of ``stages*``, dividing the K chunks) n chunks
    ahead of their decode, with the activations' copies, and read from there instead of the
    register queue (``prefetch*`` 1, ``l2_prefetch*`` 0); 0: off. With ``accs2`` = 2 (one K
    chunk per GEMM2 row block) ``code_ring2`` 1 copies every row block's codes of a program when
    it starts, a slot each (``group_n2`` slots).
    ``tail1`` (wgmma, with ``static_ring1`` and no code ring) 16, 32 or 64: GEMM1's M tiles hold
    ``block_m1`` + ``tail1`` rows, the last ``tail1`` on a second accumulator fed by the same
    decoded weights, so an expert a little over a full tile takes ``tail1`` more MMA columns
    instead of a second tile that decodes its weights again (GLM-5 TP8 T = 4096 with 128-row
    tiles: ~1.5 tiles per expert, a third of GEMM1's MMA columns padding); tiles without such
    rows run a second GEMM1 launch compiled without the tail; 0: off.
    ``tw1`` (wgmma) 1: the routing weight multiplies GEMM1's SiLU·mul (``inter`` holds it) and
    GEMM2 stores its sums unweighted (no per-column load and multiply in GEMM2's epilogue); 0:
    GEMM2 applies it. ``hoist2`` (wgmma, ``accs2`` = 2) 1: GEMM2's epilogue loads leave its
    critical path: a row block's global scales are loaded before the next block's decode (not
    just before their use: Nsight Compute put 15% of GEMM2's samples on that wait, TP8
    T = 4096), the staged epilogue's pair rows once per program; 0: off. ``msub2`` (wgmma,
    ``accs2`` = 2 with ``code_ring2``, ``hoist2`` and ``smem_epi2`` on) 2-4: GEMM2's M tiles hold
    up to ``msub2`` sub-tiles of ``block_m`` rows, and each decoded row block multiplies every
    sub-tile the tile's rows reach (one decode of an expert's row block where ``msub2`` tiles
    decode it ``msub2`` times; the last sub-tile's padding is the only padding); 1: off.
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
    kernels: str = "dot"
    prefetch1: int = 1
    prefetch2: int = 1
    accs2: int = 1
    static_ring1: int = 0
    static_ring2: int = 0
    block_m1: int = 0
    smem_epi2: int = 0
    l2_prefetch1: int = 0
    l2_prefetch2: int = 0
    code_ring1: int = 0
    code_ring2: int = 0
    tail1: int = 0
    tw1: int = 0
    hoist2: int = 0
    msub2: int = 1

    @property
    def gemm1_block_m(self) -> int:
        """GEMM1's tokens per M tile: ``block_m1``, or ``block_m`` when it is 0 (the two GEMMs
        tile the same sorted rows independently)."""
        return self.block_m1 or self.block_m

    def __post_init__(self):
        for f in fields(self):
            if f.name not in ("combine", "kernels") and not isinstance(getattr(self, f.name), int):
                raise ValueError(
                    f"PrefillConfig.{f.name} must be an int, got {getattr(self, f.name)!r}"
                )
        for name in ("block_m", "block_n1", "block_n2", "warps1", "warps2", "group_n2", "block_p"):
            if not _pow2(getattr(self, name)):
                raise ValueError(
                    f"PrefillConfig.{name} must be a power of two, got {getattr(self, name)!r}"
                )
        if self.block_m1 and not (_pow2(self.block_m1) and 16 <= self.block_m1 <= 256):
            raise ValueError(
                f"PrefillConfig.block_m1 must be 0 (GEMM1 tiles as block_m) or a power of two in "
                f"[16, 256], got {self.block_m1!r}"
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
        if self.kernels not in PREFILL_KERNEL_FAMILIES:
            raise ValueError(
                f"PrefillConfig.kernels must be one of {PREFILL_KERNEL_FAMILIES}, got {self.kernels!r}"
            )
        if self.kernels == "wgmma":
            self._check_wgmma()
        else:
            wrong = {k: getattr(self, k) for k, off in WGMMA_KNOBS_OFF.items()
                     if getattr(self, k) != off}
            if wrong:
                raise ValueError(
                    f"PrefillConfig: {', '.join(WGMMA_KNOBS_OFF)} are knobs of the wgmma kernels; "
                    f"kernels={self.kernels!r} needs them at {WGMMA_KNOBS_OFF}, got {wrong}"
                )
        if self.kernels == "w4a4":
            if self.block_k1 != K_CHUNK or self.block_k2 != K_CHUNK:
                raise ValueError(
                    f"PrefillConfig(kernels='w4a4'): block_k1 and block_k2 must be {K_CHUNK} (a "
                    f"layout chunk per step), got {self.block_k1}, {self.block_k2}"
                )
            if self.combine != "ordered":
                raise ValueError("PrefillConfig(kernels='w4a4') has only the ordered combine")

    def _check_wgmma(self):
        if max(self.block_m, self.gemm1_block_m) > 128:
            raise ValueError(
                f"PrefillConfig(kernels='wgmma'): block_m and block_m1 must be <= 128 (the "
                f"accumulator lives in registers), got {self.block_m}, {self.block_m1}"
            )
        for i in (1, 2):
            bn, w, bk = getattr(self, f"block_n{i}"), getattr(self, f"warps{i}"), getattr(self, f"block_k{i}")
            ns = getattr(self, f"stages{i}")
            bm = self.gemm1_block_m if i == 1 else self.block_m
            one_wg = i == 2 and (bn, w, ns) == (64, 4, 2)
            if (bn, w) != (128, 8) and not one_wg:
                # One warpgroup (64 rows, 4 warps) was wrong in one H200 A/B
                # (benchmarks/results/prefill_v2_step1/wgmma_ab_1_h200.json, a run that also read
                # unwritten sorted slots past a tile's end) and right in every later one. Allowed
                # where the GPU tier checks it (GEMM2 at 2 stages) and where it won (GEMM2 at
                # I = 256).
                gemm2 = " or, for GEMM2, 64 on 4 warps at 2 stages" if i == 2 else ""
                raise ValueError(
                    f"PrefillConfig(kernels='wgmma'): block_n{i} must be 128 on 8 warps (two "
                    f"warpgroups of 64 weight rows){gemm2}, got block_n{i}={bn}, warps{i}={w}, "
                    f"stages{i}={ns}"
                )
            if bk != K_CHUNK:
                raise ValueError(
                    f"PrefillConfig(kernels='wgmma'): block_k{i} must be {K_CHUNK} (a layout chunk "
                    f"per step), got {bk}"
                )
            # GEMM2's staged epilogue adds its [block_m, block_n2] bf16 tile to the ring, the
            # code ring a slot of codes and scale codes per stage.
            extra = bm * bn * 2 if i == 2 and self.smem_epi2 else 0
            depth = getattr(self, f"code_ring{i}")
            if i == 2 and self.accs2 == 2 and depth:  # a slot per row block of the program
                depth = self.group_n2
            extra += depth * bn * (128 + 16)
            if i == 1:  # the tail's ring beside the tile's
                extra += 2 * ns * self.tail1 * 128 * 2
            ring = 2 * ns * bm * 128 * 2
            if i == 2 and self.msub2 > 1:  # the tile's sub-tiles, copied once per program
                ring = self.msub2 * bm * 256 * 2
            if not 2 <= ns <= 4 or ring + extra > WGMMA_SMEM_LIMIT:
                raise ValueError(
                    f"PrefillConfig(kernels='wgmma'): stages{i} must be in [2, 4] with the ring "
                    f"(2 x stages x block_m x 256 B, or msub2 x block_m x 512 B = {ring} B"
                    f"{f', plus {extra} B for the staged epilogue, code ring and tail' if extra else ''}"
                    f") within "
                    f"{WGMMA_SMEM_LIMIT} B, got stages{i}={ns}, GEMM{i} block_m={bm}"
                )
        for name in ("prefetch1", "prefetch2"):
            if getattr(self, name) not in (1, 2, 3):
                raise ValueError(
                    f"PrefillConfig(kernels='wgmma'): {name} must be 1, 2 or 3 (code chunks in "
                    f"flight), got {getattr(self, name)!r}"
                )
        if self.accs2 not in (1, 2) or (self.accs2 == 2 and self.group_n2 > 8):
            raise ValueError(
                f"PrefillConfig(kernels='wgmma'): accs2 must be 1 or 2, and 2 needs group_n2 <= 8 "
                f"(its row blocks are unrolled), got accs2={self.accs2!r}, "
                f"group_n2={self.group_n2}"
            )
        for i in (1, 2):
            sr, ns = getattr(self, f"static_ring{i}"), getattr(self, f"stages{i}")
            if sr not in (0, 1) or (sr and ns > 3):
                raise ValueError(
                    f"PrefillConfig(kernels='wgmma'): static_ring{i} must be 0 or 1, and 1 needs "
                    f"stages{i} <= 3, got static_ring{i}={sr!r}, stages{i}={ns}"
                )
        for name in ("l2_prefetch1", "l2_prefetch2"):
            if getattr(self, name) not in range(5):
                raise ValueError(
                    f"PrefillConfig(kernels='wgmma'): {name} must be in 0..4 (chunks past the "
                    f"register queue asked of L2; 0: off), got {getattr(self, name)!r}"
                )
        if self.accs2 == 2 and self.code_ring2 not in (0, 1) or self.accs2 == 2 and (
                self.code_ring2 and (self.prefetch2, self.l2_prefetch2) != (1, 0)):
            raise ValueError(
                f"PrefillConfig(kernels='wgmma'): with accs2=2 code_ring2 must be 0 or 1 (every "
                f"row block's codes copied into shared memory when the program starts), with "
                f"prefetch2=1 and l2_prefetch2=0, got code_ring2={self.code_ring2!r}, "
                f"prefetch2={self.prefetch2}, l2_prefetch2={self.l2_prefetch2}"
            )
        for i in (1, 2):
            crg, ns = getattr(self, f"code_ring{i}"), getattr(self, f"stages{i}")
            if i == 2 and self.accs2 == 2:
                continue
            if crg not in (0, 2, 3, 4) or (crg and (crg % ns or (
                    getattr(self, f"static_ring{i}"), getattr(self, f"prefetch{i}"),
                    getattr(self, f"l2_prefetch{i}")) != (1, 1, 0))):
                raise ValueError(
                    f"PrefillConfig(kernels='wgmma'): code_ring{i} must be 0 (off) or the code "
                    f"ring's depth 2-4, a multiple of stages{i}, with static_ring{i}=1, "
                    f"prefetch{i}=1 and l2_prefetch{i}=0 (the ring replaces the register queue), "
                    f"got code_ring{i}={crg!r}, stages{i}={ns}, static_ring{i}="
                    f"{getattr(self, f'static_ring{i}')}, prefetch{i}={getattr(self, f'prefetch{i}')}"
                    f", l2_prefetch{i}={getattr(self, f'l2_prefetch{i}')}"
                )
        if self.tail1 not in (0, 16, 32, 64) or self.tail1 and (
                self.static_ring1 != 1 or self.code_ring1 or self.tail1 > self.gemm1_block_m):
            raise ValueError(
                f"PrefillConfig(kernels='wgmma'): tail1 must be 0 (off), 16, 32 or 64, at most "
                f"GEMM1's block_m, with static_ring1=1 and code_ring1=0, got tail1={self.tail1!r}, "
                f"GEMM1 block_m={self.gemm1_block_m}, static_ring1={self.static_ring1}, "
                f"code_ring1={self.code_ring1}"
            )
        if self.tw1 not in (0, 1) or self.hoist2 not in (0, 1) or self.hoist2 and self.accs2 != 2:
            raise ValueError(
                f"PrefillConfig(kernels='wgmma'): tw1 and hoist2 must be 0 or 1, hoist2 only with "
                f"accs2=2; got tw1={self.tw1!r}, hoist2={self.hoist2!r}, accs2={self.accs2}"
            )
        if self.smem_epi2 not in (0, 1):
            raise ValueError(
                f"PrefillConfig(kernels='wgmma'): smem_epi2 must be 0 or 1, "
                f"got {self.smem_epi2!r}"
            )
        if self.static_ring2 and self.accs2 == 2:
            raise ValueError(
                "PrefillConfig(kernels='wgmma'): static_ring2 is for GEMM2's ring; with accs2=2 "
                "GEMM2 has none (its activations are copied once per program)"
            )
        if self.msub2 not in (1, 2, 3, 4) or self.msub2 > 1 and (
                self.accs2, self.code_ring2, self.hoist2, self.smem_epi2) != (2, 1, 1, 1):
            raise ValueError(
                f"PrefillConfig(kernels='wgmma'): msub2 must be 1 (off) or 2-4 GEMM2 sub-tiles "
                f"per M tile, the latter with accs2=2, code_ring2=1, hoist2=1 and smem_epi2=1; got "
                f"msub2={self.msub2!r}, accs2={self.accs2}, code_ring2={self.code_ring2}, "
                f"hoist2={self.hoist2}, smem_epi2={self.smem_epi2}"
            )
        if self.combine == "atomic":
            raise ValueError("PrefillConfig(kernels='wgmma') has the ordered combine, not the "
                             "atomic one")

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
    return dict(stages1=3 if big else 2, static_ring1=sr,
                block_m1=tile1 if tile1 != block_m else 0, tail1=16 if sr else 0)


def _wgmma_config(rows: float, shape: MoEShape, block_p: int) -> PrefillConfig:
    """The wgmma family's default (sm_90), from the same-run A/B on the H200
    (``benchmarks/results/prefill_v2_step1/wgmma_ab_final_h200.json``: GLM-5 TP8, TP8 with the
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
      ``prefill_v2_step2/wgmma_ab_h200.json``: T = 4096 1,259 vs 1,307 us, 8192 1,987 vs 2,031),
      2 otherwise.
    * GEMM2: 2 stages; 8 row blocks per program at ``I`` <= 512 (one chunk per block: the
      blocks share the program's pipeline; TP8 T = 512: 213 vs 246 us at 4), 4 above (EP8,
      I = 2048: T = 1024 180 vs 218 us at 8).
    * GEMM2 at ``I`` = 256 (one chunk per row block): one warpgroup of 64 rows and two
      accumulators (``accs2``), 8 blocks per program (``prefill_v2_step2/prefill_gemm2_tp8_h200
      .json``, same run, GLM-5 TP8): GEMM2 178 vs 216 us at T = 512, 251 vs 306 at 1024, 392 vs
      431 at 2048, 635 vs 727 at 4096, 1,142 vs 1,305 at 8192 (4 blocks per program: 1,100). At
      EP8 (I = 2048) one warpgroup lost (T = 4096: 724 vs 453 us): 8 warps stay above.
    * From ``block_m`` 64 (``prefill_v2_step3/prefill_ring_{tp8,ep8}_h200.json``, same run):
      GEMM1's activation ring in static slots (``static_ring1``, where the 3 stages divide
      ``H / 256``; Nsight Compute: barrier stalls 16.6% -> 5.5% of GEMM1's samples): TP8
      T = 2048 / 4096 / 8192 912 / 1,505 / 2,673 vs 950 / 1,567 / 2,765 us, EP8 818 / 1,207 /
      1,881 vs 854 / 1,265 / 1,987. Below 64 it lost (TP8 T = 512: 512 vs 409; EP8 475 vs 356).
      Where ``I`` <= 512 capped ``block_m`` at 64 (GEMM2's spills), GEMM1 tiles 128 rows of its
      own (``block_m1``: each tile decodes its expert's weights once): TP8 with the static ring
      897 / 1,424 / 2,461 us.
    * GEMM2's staged epilogue (``smem_epi2``) at ``I`` = 256 and at ``block_m`` 128, and at
      ``I`` = 256 every row block's codes copied when a program starts (``code_ring2=1``)
      (``prefill_v2_step4/prefill_sorted_tw_{tp8,ep8}_h200.json``, same run): TP8
      GEMM2 at T = 1024 / 2048 / 4096 / 8192 248 / 421 / 688 / 1,233 us -> 228 / 329 / 536 / 935
      staged, 224 / 289 / 460 / 817 with both; EP8 (I = 2048) staged at T = 4096 / 8192 489 /
      742 -> 447 / 669, but 268 -> 280 at T = 2048 (``block_m`` 64) and a tie at 1024. The L2
      code prefetch (``l2_prefetch1/2`` = 2) lost in both (TP8 T = 4096 1,501 vs 1,465 us).
    * The routing weight in GEMM1's epilogue (``tw1``) everywhere, and at ``I`` = 256 GEMM2's
      epilogue loads hoisted (``hoist2``) (``prefill_v2_step7/prefill_step7_{tp8,ep8,fused}
      _h200.json``, same run): TP8 T = 1024 / 2048 / 4096 / 8192 542 / 711 / 1,114
      / 2,016 us -> 506 / 648 / 1,030 / 1,875 (GEMM2 463 -> 370 at 4096); the fused shared expert
      781 / 1,230 / 2,224 -> 715 / 1,137 / 2,098 at 2048 / 4096 / 8192; EP8 (``tw1`` alone: no
      spills in GEMM2) 1,062 / 1,814 -> 1,010 / 1,748 at 4096 / 8192, 532 -> 529 at 1024, and
      693 -> 703 at 2048 (+1.4%, kept: one rule).
    * At ``I`` = 256 where an expert expects at least two M tiles of rows (``rows`` >= 2
      ``block_m``): GEMM2's M tiles of 2 sub-tiles that share each decoded row block
      (``msub2``) on 4 blocks per program (``prefill_v2_step8/prefill_step8{,b}_tp8_h200.json``,
      and ``prefill_step8_off_*``: three sweep processes): TP8 T = 4096 1,037.5 /
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
    return PrefillConfig(
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
        kernels="wgmma",
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
    return PrefillConfig(
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
        kernels="w4a4",
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
    if kernels not in PREFILL_KERNEL_FAMILIES:
        raise ValueError(f"prefill_heuristic_config: kernels must be one of "
                         f"{PREFILL_KERNEL_FAMILIES} or None, got {kernels!r}")
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
    return PrefillConfig(
        block_m=block_m, **g1, **g2, block_k2=128, warps2=8, group_n2=8, block_p=block_p
    )
