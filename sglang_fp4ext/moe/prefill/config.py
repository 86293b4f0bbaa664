"""Launch config of the NVFP4 prefill path (``prefill.launch.fused_moe_nvfp4_prefill``): one
frozen type per kernel family.

:class:`PrefillConfig` holds the grouping, GEMM and combine tiles every family takes;
:class:`DotPrefillConfig` (``tl.dot``), :class:`WgmmaPrefillConfig` (Gluon wgmma, Hopper) and
:class:`W4A4PrefillConfig` (``tl.dot_scaled``, NVFP4 activations) are the families. The
heuristic is ``prefill.heuristic``; which path serves a token count and the tuned tables live in
``moe.tables``. This module imports no launcher.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN
from sglang_fp4ext.moe.shape import ConfigDict

__all__ = [
    "DotPrefillConfig",
    "PrefillConfig",
    "W4A4PrefillConfig",
    "WgmmaPrefillConfig",
    "fallbacks",
    "prefill_activations",
    "served_prefill_config",
    "w4a16_twin_config",
    "wgmma_supports_shape",
]

#: Opt-in shared memory per block on sm_90 (227 KiB): the wgmma family's activation ring.
WGMMA_SMEM_LIMIT = 232_448


def w4a16_twin_config(cfg: PrefillConfig) -> PrefillConfig:
    """A v2 prefill config's tiles on the ``tl.dot`` W4A16 kernels (128-deep GEMM2 steps, GEMM1 on
    ``block_m`` for the dot family's shared memory): the self-check's fallback, and what a W4A4
    choice runs on weights without input scales."""
    return cfg.reform(kernels="dot", block_k2=128, block_m1=0)


def fallbacks(config: PrefillConfig) -> tuple[PrefillConfig, ...]:
    """The configs the self-check tries, in order, where ``config`` fails its check: wgmma and
    W4A4 tiles on the W4A16 ``tl.dot`` family."""
    return (w4a16_twin_config(config),) if config.kernels in ("wgmma", "w4a4") else ()


def prefill_activations() -> str:
    """``SGLANG_FP4EXT_PREFILL_ACTIVATIONS``, checked: ``"auto"`` or ``"bf16"``."""
    from sglang_fp4ext import envs

    return envs.PREFILL_ACTIVATIONS.value()


def served_prefill_config(cfg: PrefillConfig, has_input_scales: bool) -> PrefillConfig:
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
    """What every prefill family takes: the grouping, GEMM1, GEMM2 and combine tiles of one call.
    Build a family: :class:`DotPrefillConfig`, :class:`WgmmaPrefillConfig` or
    :class:`W4A4PrefillConfig`. ``eval(repr(cfg)) == cfg``.

    ``block_m``: tokens per MMA tile (the grouping granularity; the MMA's N side). ``block_n*``:
    weight rows per program (M side; GEMM1 rows are interleaved gate/up, so ``block_n1 / 2``
    intermediate columns). ``block_k*``: K per main-loop step, 256 (one layout chunk) or 128 (half
    a chunk). ``warps*``/``stages*``: Triton ``num_warps``/``num_stages``. Suffix 1 = GEMM1, 2 =
    GEMM2. ``group_n2``: GEMM2 row blocks per program. ``block_p``: pair slots per grouping
    program (sorted in registers). ``combine``: ``"ordered"`` (deterministic) or ``"atomic"``
    (fp32 atomics, opt-in, the dot family only). ``block_m1``: GEMM1's tokens per M tile when it
    differs from GEMM2's (0: ``block_m``).
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
    block_m1: int = 0

    @property
    def gemm1_block_m(self) -> int:
        """GEMM1's tokens per M tile: ``block_m1``, or ``block_m`` when it is 0 (the two GEMMs
        tile the same sorted rows independently)."""
        return self.block_m1 or self.block_m

    def __post_init__(self):
        super().__post_init__()
        name = type(self).__name__
        for f in fields(self):
            if f.name != "combine" and not isinstance(getattr(self, f.name), int):
                raise ValueError(f"{name}.{f.name} must be an int, got {getattr(self, f.name)!r}")
        for f in ("block_m", "block_n1", "block_n2", "warps1", "warps2", "group_n2", "block_p"):
            if not _pow2(getattr(self, f)):
                raise ValueError(f"{name}.{f} must be a power of two, got {getattr(self, f)!r}")
        if self.block_m1 and not (_pow2(self.block_m1) and 16 <= self.block_m1 <= 256):
            raise ValueError(
                f"{name}.block_m1 must be 0 (GEMM1 tiles as block_m) or a power of two in "
                f"[16, 256], got {self.block_m1!r}"
            )
        if not 16 <= self.block_m <= 256:
            raise ValueError(
                f"{name}.block_m must be in [16, 256] (tl.dot needs >= 16), got {self.block_m}"
            )
        if not 32 <= self.block_n1 <= ROW_ALIGN:
            raise ValueError(
                f"{name}.block_n1 must be in [32, {ROW_ALIGN}] (gate and up halves of >= 16 "
                f"rows; the layout pads rows to {ROW_ALIGN}), got {self.block_n1}"
            )
        if not 16 <= self.block_n2 <= ROW_ALIGN:
            raise ValueError(f"{name}.block_n2 must be in [16, {ROW_ALIGN}], got {self.block_n2}")
        for f in ("block_k1", "block_k2"):
            if getattr(self, f) not in (128, K_CHUNK):
                raise ValueError(f"{name}.{f} must be 128 or {K_CHUNK}, got {getattr(self, f)}")
        for f in ("warps1", "warps2"):
            if not 1 <= getattr(self, f) <= 16:
                raise ValueError(f"{name}.{f} must be in [1, 16], got {getattr(self, f)}")
        for f in ("stages1", "stages2"):
            if not 1 <= getattr(self, f) <= 8:
                raise ValueError(f"{name}.{f} must be in [1, 8], got {getattr(self, f)}")
        if not 16 <= self.block_p <= 4096:
            raise ValueError(f"{name}.block_p must be in [16, 4096], got {self.block_p}")
        if self.combine not in ("ordered", "atomic"):
            raise ValueError(f"{name}.combine must be 'ordered' or 'atomic', got {self.combine!r}")
        if self.combine == "atomic" and self.kernels != "dot":
            raise ValueError(f"{name} has the ordered combine, not the atomic one")


@dataclass(frozen=True)
class DotPrefillConfig(PrefillConfig, family="dot"):
    """W4A16 on ``tl.dot`` (``prefill._dot_kernels``, v1): every GPU and the interpreter (which
    also runs a wgmma config's tiles on it)."""


@dataclass(frozen=True)
class W4A4PrefillConfig(PrefillConfig, family="w4a4"):
    """NVFP4 activations with the static input scales on ``tl.dot_scaled``
    (``prefill._w4a4_kernels``; sm_100 / sm_120 and the interpreter): ``block_k*`` 256, the
    ordered combine, ``group_n2`` unused; H and I multiples of 256."""

    def __post_init__(self):
        super().__post_init__()
        if self.block_k1 != K_CHUNK or self.block_k2 != K_CHUNK:
            raise ValueError(
                f"W4A4PrefillConfig: block_k1 and block_k2 must be {K_CHUNK} (a layout chunk "
                f"per step), got {self.block_k1}, {self.block_k2}"
            )


@dataclass(frozen=True)
class WgmmaPrefillConfig(PrefillConfig, family="wgmma"):
    """W4A16 on Hopper's warpgroup MMA (Gluon, ``prefill._wgmma_kernels``, sm_90 only):
    ``block_n*`` 128 weight rows on 8 warps, ``block_k*`` 256, ``stages*`` the activation ring's
    depth 2-4, ``block_m`` <= 128, the ordered combine; H and I multiples of 256.

    ``prefetch*``, the K chunks of FP4 codes each GEMM keeps in flight ahead of its
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

    prefetch1: int = 1
    prefetch2: int = 1
    accs2: int = 1
    static_ring1: int = 0
    static_ring2: int = 0
    smem_epi2: int = 0
    l2_prefetch1: int = 0
    l2_prefetch2: int = 0
    code_ring1: int = 0
    code_ring2: int = 0
    tail1: int = 0
    tw1: int = 0
    hoist2: int = 0
    msub2: int = 1

    def __post_init__(self):
        super().__post_init__()
        self._check_wgmma()

    def _check_wgmma(self):
        if max(self.block_m, self.gemm1_block_m) > 128:
            raise ValueError(
                f"WgmmaPrefillConfig: block_m and block_m1 must be <= 128 (the "
                f"accumulator lives in registers), got {self.block_m}, {self.block_m1}"
            )
        for i in (1, 2):
            bn, w, bk = (
                getattr(self, f"block_n{i}"),
                getattr(self, f"warps{i}"),
                getattr(self, f"block_k{i}"),
            )
            ns = getattr(self, f"stages{i}")
            bm = self.gemm1_block_m if i == 1 else self.block_m
            one_wg = i == 2 and (bn, w, ns) == (64, 4, 2)
            if (bn, w) != (128, 8) and not one_wg:
                # One warpgroup (64 rows, 4 warps) was wrong in one H200 A/B
                # (benchmarks/results/prefill_wgmma/wgmma_ab_1_h200.json, a run that also read
                # unwritten sorted slots past a tile's end) and right in every later one. Allowed
                # where the GPU tier checks it (GEMM2 at 2 stages) and where it won (GEMM2 at
                # I = 256).
                gemm2 = " or, for GEMM2, 64 on 4 warps at 2 stages" if i == 2 else ""
                raise ValueError(
                    f"WgmmaPrefillConfig: block_n{i} must be 128 on 8 warps (two "
                    f"warpgroups of 64 weight rows){gemm2}, got block_n{i}={bn}, warps{i}={w}, "
                    f"stages{i}={ns}"
                )
            if bk != K_CHUNK:
                raise ValueError(
                    f"WgmmaPrefillConfig: block_k{i} must be {K_CHUNK} (a layout chunk "
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
                plus = (
                    f", plus {extra} B for the staged epilogue, code ring and tail" if extra else ""
                )
                raise ValueError(
                    f"WgmmaPrefillConfig: stages{i} must be in [2, 4] with the ring "
                    f"(2 x stages x block_m x 256 B, or msub2 x block_m x 512 B = {ring} B"
                    f"{plus}"
                    f") within "
                    f"{WGMMA_SMEM_LIMIT} B, got stages{i}={ns}, GEMM{i} block_m={bm}"
                )
        for name in ("prefetch1", "prefetch2"):
            if getattr(self, name) not in (1, 2, 3):
                raise ValueError(
                    f"WgmmaPrefillConfig: {name} must be 1, 2 or 3 (code chunks in "
                    f"flight), got {getattr(self, name)!r}"
                )
        if self.accs2 not in (1, 2) or (self.accs2 == 2 and self.group_n2 > 8):
            raise ValueError(
                f"WgmmaPrefillConfig: accs2 must be 1 or 2, and 2 needs group_n2 <= 8 "
                f"(its row blocks are unrolled), got accs2={self.accs2!r}, "
                f"group_n2={self.group_n2}"
            )
        for i in (1, 2):
            sr, ns = getattr(self, f"static_ring{i}"), getattr(self, f"stages{i}")
            if sr not in (0, 1) or (sr and ns > 3):
                raise ValueError(
                    f"WgmmaPrefillConfig: static_ring{i} must be 0 or 1, and 1 needs "
                    f"stages{i} <= 3, got static_ring{i}={sr!r}, stages{i}={ns}"
                )
        for name in ("l2_prefetch1", "l2_prefetch2"):
            if getattr(self, name) not in range(5):
                raise ValueError(
                    f"WgmmaPrefillConfig: {name} must be in 0..4 (chunks past the "
                    f"register queue asked of L2; 0: off), got {getattr(self, name)!r}"
                )
        if (
            self.accs2 == 2
            and self.code_ring2 not in (0, 1)
            or self.accs2 == 2
            and (self.code_ring2 and (self.prefetch2, self.l2_prefetch2) != (1, 0))
        ):
            raise ValueError(
                f"WgmmaPrefillConfig: with accs2=2 code_ring2 must be 0 or 1 (every "
                f"row block's codes copied into shared memory when the program starts), with "
                f"prefetch2=1 and l2_prefetch2=0, got code_ring2={self.code_ring2!r}, "
                f"prefetch2={self.prefetch2}, l2_prefetch2={self.l2_prefetch2}"
            )
        for i in (1, 2):
            crg, ns = getattr(self, f"code_ring{i}"), getattr(self, f"stages{i}")
            if i == 2 and self.accs2 == 2:
                continue
            if crg not in (0, 2, 3, 4) or (
                crg
                and (
                    crg % ns
                    or (
                        getattr(self, f"static_ring{i}"),
                        getattr(self, f"prefetch{i}"),
                        getattr(self, f"l2_prefetch{i}"),
                    )
                    != (1, 1, 0)
                )
            ):
                raise ValueError(
                    f"WgmmaPrefillConfig: code_ring{i} must be 0 (off) or the code "
                    f"ring's depth 2-4, a multiple of stages{i}, with static_ring{i}=1, "
                    f"prefetch{i}=1 and l2_prefetch{i}=0 (the ring replaces the register queue), "
                    f"got code_ring{i}={crg!r}, stages{i}={ns}, "
                    f"static_ring{i}={getattr(self, f'static_ring{i}')}, "
                    f"prefetch{i}={getattr(self, f'prefetch{i}')}, "
                    f"l2_prefetch{i}={getattr(self, f'l2_prefetch{i}')}"
                )
        if (
            self.tail1 not in (0, 16, 32, 64)
            or self.tail1
            and (self.static_ring1 != 1 or self.code_ring1 or self.tail1 > self.gemm1_block_m)
        ):
            raise ValueError(
                f"WgmmaPrefillConfig: tail1 must be 0 (off), 16, 32 or 64, at most "
                f"GEMM1's block_m, with static_ring1=1 and code_ring1=0, got tail1={self.tail1!r}, "
                f"GEMM1 block_m={self.gemm1_block_m}, static_ring1={self.static_ring1}, "
                f"code_ring1={self.code_ring1}"
            )
        if self.tw1 not in (0, 1) or self.hoist2 not in (0, 1) or self.hoist2 and self.accs2 != 2:
            raise ValueError(
                f"WgmmaPrefillConfig: tw1 and hoist2 must be 0 or 1, hoist2 only with "
                f"accs2=2; got tw1={self.tw1!r}, hoist2={self.hoist2!r}, accs2={self.accs2}"
            )
        if self.smem_epi2 not in (0, 1):
            raise ValueError(
                f"WgmmaPrefillConfig: smem_epi2 must be 0 or 1, got {self.smem_epi2!r}"
            )
        if self.static_ring2 and self.accs2 == 2:
            raise ValueError(
                "WgmmaPrefillConfig: static_ring2 is for GEMM2's ring; with accs2=2 "
                "GEMM2 has none (its activations are copied once per program)"
            )
        if (
            self.msub2 not in (1, 2, 3, 4)
            or self.msub2 > 1
            and (self.accs2, self.code_ring2, self.hoist2, self.smem_epi2) != (2, 1, 1, 1)
        ):
            raise ValueError(
                f"WgmmaPrefillConfig: msub2 must be 1 (off) or 2-4 GEMM2 sub-tiles "
                f"per M tile, the latter with accs2=2, code_ring2=1, hoist2=1 and smem_epi2=1; got "
                f"msub2={self.msub2!r}, accs2={self.accs2}, code_ring2={self.code_ring2}, "
                f"hoist2={self.hoist2}, smem_epi2={self.smem_epi2}"
            )
