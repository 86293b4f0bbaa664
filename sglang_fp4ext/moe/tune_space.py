"""The search space of ``fp4ext tune`` (the flow: ``sglang_fp4ext/tune.py``): candidate decode and
prefill kernel configs per token bucket and the constants that bound them.

**Search space** (deterministic: a function of bucket, shape and target; every candidate passes
its config's ``__post_init__``; at most :data:`MAX_CANDIDATES` per path, ``--quick`` keeps the
first :data:`QUICK_CANDIDATES`), in priority order:

* decode (:func:`decode_candidates`), around ``decode.heuristic.heuristic_config``: the heuristic;
  the heuristic without its small-T and hot-expert forms (``forms=False``); from 32 tokens the
  Gluon two-launch GEMM1 with 128 rows on 4 warps and the heuristic's, under their register cap
  (:func:`gemm1_reg_cap`: the H200 table's winners at 64-128 tokens, 4.2-8.1% per layer; the
  Gluon K loops have no stages to time instead); the other kernel family
  (Gluon <-> ``tl.dot``) of that; the other GEMM2 form (``tokens`` <-> ``pairs``);
  the pairs GEMM2 with the other top-k combine and (from 2 pairs per expert) with ``split_t=4``;
  programmatic dependent launch flipped (sm_90+); at 1-2 tokens the token GEMM2's slots side by
  side (``slots2``) flipped; at
  1-4 tokens GEMM1's K splits on one program's warps (``kstack1``: 8 / 4 / 2 splits at 1 / 2 / 4
  tokens, fewer where the K chunks do not divide; 32 rows on one warp a split, 64 on two at 4
  tokens) flipped (off: the plain heuristic's splits across programs); GEMM1 with 128 rows on 4
  warps (64 if it had 128); GEMM1 split-K x2 and /2;
  32-row GEMM1 tiles with split-K x2; GEMM2 32/64-row tiles (tokens) or ``tiles2`` x2 and /2 and
  split-K x2 (pairs); GEMM1 4 stages (``tl.dot`` family; the Gluon K loops have no stages); the
  other ``block_t`` (8 <-> 16); GEMM1 split-K x4; GEMM2 4 stages (``tl.dot``) (the first
  :data:`MAX_CANDIDATES`). Split-K and ``tiles2`` are runtime arguments (no recompilation).
* prefill (:func:`prefill_candidates`), around ``prefill.heuristic.prefill_heuristic_config``: the
  heuristic; ``block_m`` x2 (<= 256; at 256 with 128-deep GEMM1 steps) and /2 (>= 16); GEMM1
  with 64 rows / 4 warps / 256-deep steps, with 128 rows / 8 warps / 256-deep steps, and the
  former at ``block_m`` /2; 4 and 16 GEMM2 row blocks per program, and 64-row GEMM2 tiles on 4
  warps with 16; the narrow GEMM1 at ``block_m`` /4 and /8 (under expert parallelism a local
  expert sees ~EP times fewer rows than the per-rank shape suggests); 64-row tiles for both GEMMs.
  Where the heuristic picks the wgmma family (sm_90): the heuristic; the ``tl.dot`` family's
  heuristic; GEMM2's staged epilogue (``smem_epi2``) flipped; the L2 code prefetch
  (``l2_prefetch*``) flipped; at ``I`` = 256 GEMM2's block codes in shared memory with the
  staged epilogue; GEMM1's code ring (``code_ring1`` 4, 2 stages); ``block_m`` /2, x2 and /4; the
  other GEMM1 ring depth (2 <-> 3); 4 <-> 8 GEMM2 row blocks per program; 3 GEMM2 stages; GEMM2 at
  ``I`` = 256 on two warpgroups; code prefetch 2;
  GEMM1's own 128-row tile and its static ring, each flipped from the heuristic's choice; both
  rings static. Where it picks the W4A4 family (sm_100 / sm_120): the
  heuristic; the ``tl.dot`` W4A16 heuristic; ``block_m`` /2, x2, /4; 3 stages; twice the GEMM1
  rows on twice the warps.
  The atomic combine is never a candidate (it is not deterministic run to run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.layout import K_CHUNK
from sglang_fp4ext.moe.shape import MoEShape, Target, token_bucket

__all__ = [
    "DECODE_MAX_BUCKET",
    "PREFILL_MIN_BUCKET",
    "MAX_CANDIDATES",
    "QUICK_CANDIDATES",
    "decode_candidates",
    "gemm1_reg_cap",
    "prefill_candidates",
]

#: Decode candidates up to this bucket: beyond it the decode kernels only lose more (H200,
#: ``benchmarks/results/tune_h200.json``: at 2048 prefill is 1.9x faster for GLM-5 TP8, 1.7x EP8).
DECODE_MAX_BUCKET = 2048
#: Prefill candidates from this bucket: below it experts see ~1 pair and a 16-row MMA tile
#: mostly multiplies padding.
PREFILL_MIN_BUCKET = 32
MAX_CANDIDATES = 12
QUICK_CANDIDATES = 4


# ---- search space ----


def gemm1_reg_cap(cfg) -> int | None:
    """The ``maxnreg1`` the tuner tries on the Gluon two-launch GEMM1 of ``cfg``: the cap at which
    one more program fits an SM than at the registers it takes uncapped, with no spill in its K
    loop (static SASS, GLM-5 on sm_90: 2-warp programs 180 -> 168 registers at 8 pairs a tile,
    6 programs an SM instead of 5; 230 -> 184 at 16, 5 instead of 4; 4-warp programs 168, 3
    instead of 2). None where no such GEMM1 runs."""
    if cfg.kernels != "gluon" or cfg.kstack1 or cfg.warps1 not in (2, 4):
        return None
    return 184 if cfg.warps1 == 2 and cfg.block_t >= 16 else 168


def _unique_valid(make: Sequence[Callable[[], object]], limit: int) -> list:
    """Build each candidate (dropping those a config's ``__post_init__`` rejects and ``None``: not
    for this shape), dedupe, cap."""
    out = []
    for f in make:
        try:
            c = f()
        except ValueError:
            continue
        if c is not None and c not in out:
            out.append(c)
        if len(out) >= limit:
            break
    return out


def decode_candidates(T: int, shape: MoEShape, target: Target, limit: int = MAX_CANDIDATES):
    """Decode-path :class:`DecodeConfig` candidates for ``token_bucket(T)`` (module docstring)."""
    b = token_bucket(T)
    base = heuristic_config(b, shape, target)
    plain = heuristic_config(b, shape, target, forms=False)
    kc1, kc2 = -(-shape.H // K_CHUNK), -(-shape.I // K_CHUNK)
    # A knob of the other family raises ValueError: that candidate is not built.
    r = lambda c, **knobs: c.reform(**knobs)  # noqa: E731
    sk1 = base.split_k1

    def split1(s):
        if s > kc1 or s < 1:
            raise ValueError("split_k1 beyond the K chunks")
        return s

    def split2(s):
        if s > kc2:
            raise ValueError("split_k2 beyond the K chunks")
        return s

    def hot(s):
        if b * shape.top_k < 2 * shape.E:
            raise ValueError("few pairs per expert: no expert loops over many pair chunks")
        return s

    if base.gemm2 == "tokens":
        flip = lambda: r(base, gemm2="pairs", block_n2=64, split_k2=1, tiles2=1)  # noqa: E731
        g2a = lambda: r(base, block_n2=64 if base.block_n2 == 32 else 32)  # noqa: E731
        g2b = lambda: r(base, block_n2=g2a().block_n2, split_k1=split1(2 * sk1))  # noqa: E731
        g2c = lambda: r(base, gemm2="pairs", block_n2=64, split_k2=1, tiles2=2)  # noqa: E731
    else:
        flip = lambda: r(base, gemm2="tokens", block_n2=64, split_k2=1, tiles2=1)  # noqa: E731
        g2a = lambda: r(base, tiles2=2 * base.tiles2)  # noqa: E731
        g2b = lambda: r(base, tiles2=max(1, base.tiles2 // 2))  # noqa: E731
        g2c = lambda: r(base, split_k2=split2(2 * base.split_k2))  # noqa: E731

    def wide1():  # GEMM1 on 4 warps and 128 rows (or back to 64 rows)
        return r(base, block_n1=128 if base.block_n1 < 128 else 64, warps1=4)

    def capped(c):  # c's Gluon GEMM1 under its register cap, from 32 tokens
        cap = gemm1_reg_cap(c)
        return r(c, maxnreg1=cap) if cap and b >= 32 else None

    other = "dot" if base.kernels == "gluon" else "gluon"
    make = [
        lambda: base,
        lambda: plain,  # the heuristic without its small-T / hot-expert forms
        # From 32 tokens both GEMM1s under their register cap, the 4-warp 128-row one first: the
        # shipped tables' most frequent winner (H100 and H200, TP8 and EP8, 32-128 tokens). A
        # start's short budget times a bucket's first few candidates only.
        lambda: capped(wide1()),
        lambda: capped(base),
        lambda: r(plain, kernels=other),  # both families are timed
        flip,
        # the pairs GEMM2's other top-k combine; its pair chunks over 4 programs (hot experts)
        lambda: (
            r(
                base if base.gemm2 == "pairs" else flip(),
                combine="counter" if base.combine == "kernel" else "kernel",
            )
            if base.kernels == "gluon"
            else None
        ),
        lambda: r(base if base.gemm2 == "pairs" else flip(), split_t=hot(4)),
        # programmatic dependent launch flipped, where the GPU has it
        lambda: (
            r(base, pdl=0 if base.pdl else 1)
            if base.kernels == "gluon"
            and target_info.supports_pdl(target_info.arch_capability(target.arch))
            else None
        ),
        # the Gluon token GEMM2 with a token's slots side by side, one warp each (GLM-5 TP8
        # T <= 2), or one after the other where the heuristic has them side by side
        lambda: (
            (
                r(base, slots2=0, warps2=plain.warps2, block_n2=plain.block_n2)
                if base.slots2
                else r(base, slots2=1, warps2=1, block_n2=64 if b == 1 else 32)
            )
            if base.kernels == "gluon" and base.gemm2 == "tokens" and b <= 2
            else None
        ),
        # GEMM1's K splits on one program's warps: the H100 sweeps' winners, 8 splits of 32 rows
        # on one warp at 1 token, 4 at 2, 2 splits of 64 rows on two warps at 4 (fewer where the
        # K chunks do not divide)
        # (or across programs where the heuristic stacks them)
        lambda: (
            (
                r(
                    base,
                    kstack1=0,
                    split_k1=plain.split_k1,
                    warps1=plain.warps1,
                    block_n1=plain.block_n1,
                )
                if base.kstack1
                else r(
                    base,
                    kstack1=1,
                    split_k1=next(s for s in (8, 4, 2) if s <= 8 // b and kc1 % s == 0),
                    warps1=2 if b == 4 else 1,
                    block_n1=64 if b == 4 else 32,
                )
            )
            if base.kernels == "gluon" and b <= 4 and kc1 % 2 == 0
            else None
        ),
        wide1,
        lambda: r(base, split_k1=split1(2 * sk1)),
        lambda: r(base, split_k1=split1(sk1 // 2)),
        lambda: r(base, block_n1=32, split_k1=split1(2 * sk1)),
        g2a,
        g2b,
        g2c,
        lambda: r(base, stages1=4) if base.kernels == "dot" else None,
        lambda: r(base, block_t=16 if base.block_t == 8 else 8),
        lambda: r(base, split_k1=split1(4 * sk1)),
        lambda: r(base, stages2=4) if base.kernels == "dot" else None,
    ]
    return _unique_valid(make, min(limit, MAX_CANDIDATES))


def prefill_candidates(T: int, shape: MoEShape, target: Target, limit: int = MAX_CANDIDATES):
    """Prefill-path ``PrefillConfig`` candidates for ``token_bucket(T)`` (module docstring)."""
    from sglang_fp4ext.moe.prefill.config import static_ring_fits
    from sglang_fp4ext.moe.prefill.heuristic import prefill_heuristic_config, wgmma_gemm1_knobs

    b = token_bucket(T)
    base = prefill_heuristic_config(b, shape, target)
    r = dataclasses.replace
    bm = base.block_m

    def m(v):
        if not 16 <= v <= 256:
            raise ValueError("block_m outside [16, 256]")
        return v

    if base.kernels == "w4a4":
        # sm_100 / sm_120: the W4A4 family around its heuristic (never measured: no such GPU
        # here), then the W4A16 tl.dot family's heuristic for the same bucket.
        make = [
            lambda: base,
            lambda: prefill_heuristic_config(b, shape, target, "dot"),
            lambda: r(base, block_m=m(bm // 2)),
            lambda: r(base, block_m=m(2 * bm)),
            lambda: r(base, block_m=m(bm // 4)),
            lambda: r(base, stages1=3, stages2=3),
            lambda: r(base, block_n1=2 * base.block_n1, warps1=2 * base.warps1),
        ]
        return _unique_valid(make, min(limit, MAX_CANDIDATES))
    if base.kernels == "wgmma":
        # sm_90: the v2 family around its heuristic, the v1 family's heuristic, and the knobs
        # that moved the time in the H200 A/B (prefill.heuristic._wgmma_config's docstring).
        def st1(v):  # GEMM1's ring and tile follow block_m as in the heuristic
            return dict(block_m=m(v), **wgmma_gemm1_knobs(v, shape))

        make = [
            lambda: base,
            lambda: prefill_heuristic_config(b, shape, target, "dot"),
            # GEMM2's epilogue through shared memory (16-byte stores), flipped; the FP4 codes
            # asked of L2 two chunks past the register queue (both GEMMs), flipped.
            lambda: r(base, smem_epi2=1 - base.smem_epi2),
            lambda: r(
                base,
                l2_prefetch1=0 if base.l2_prefetch1 else 2,
                l2_prefetch2=0 if base.l2_prefetch2 else 2,
            ),
            # The routing weight in GEMM1's epilogue with GEMM2's epilogue loads hoisted (the
            # heuristic's), flipped together.
            lambda: r(base, tw1=1 - base.tw1, hoist2=0 if base.tw1 else int(base.accs2 == 2)),
            # GEMM2 at I = 256 on M tiles of 2 sub-tiles that share each decoded row block, 4
            # blocks per program (msub2, the heuristic's from 2 M tiles of rows per expert),
            # flipped (off: 8 blocks per program).
            lambda: (
                (r(base, msub2=1, group_n2=8) if base.msub2 > 1 else r(base, msub2=2, group_n2=4))
                if (base.accs2, base.code_ring2, base.hoist2, base.smem_epi2) == (2, 1, 1, 1)
                else None
            ),
            # GEMM2 at I = 256: every row block's codes copied when the program starts, with
            # the staged epilogue (no spills together; the heuristic's at I = 256), flipped.
            lambda: (
                (
                    r(base, code_ring2=0)
                    if base.code_ring2
                    else r(base, code_ring2=1, smem_epi2=1, prefetch2=1, l2_prefetch2=0)
                )
                if base.accs2 == 2
                else None
            ),
            # GEMM1's codes through the shared-memory code ring (2 activation stages, codes 3
            # chunks ahead), where its static ring can unroll by 4.
            lambda: (
                r(base, stages1=2, static_ring1=1, code_ring1=4, prefetch1=1, l2_prefetch1=0)
                if static_ring_fits(shape.H, 4)
                else None
            ),
            # GEMM1's 16-row tail (on a second accumulator fed by the same decoded weights),
            # flipped; and GEMM1's own tile at I <= 512, 64 <-> 128 rows.
            lambda: (
                r(base, tail1=0 if base.tail1 else 16)
                if base.static_ring1 and not base.code_ring1
                else None
            ),
            lambda: (
                r(base, block_m1=0 if base.block_m1 else 128)
                if base.block_m == 64 and shape.I <= 512
                else None
            ),
            lambda: r(base, **st1(bm // 2)),
            lambda: r(base, **st1(2 * bm)),
            lambda: r(base, **st1(bm // 4)),  # expert parallelism: fewer rows per local expert
            lambda: r(base, stages1=5 - base.stages1),
            lambda: r(base, group_n2=12 - base.group_n2),
            lambda: r(base, stages2=3),
            # GEMM2 at I = 256: two warpgroups with one accumulator (the heuristic runs one
            # warpgroup with two); deeper code prefetch (lost in every H200 sweep,
            # benchmarks/results/prefill_wgmma_gemm2/: kept as the one candidate that can say
            # otherwise on a new GPU).
            # (hoist2 is the two accumulators' epilogue: off with one.)
            lambda: (
                r(base, block_n2=128, warps2=8, accs2=1, code_ring2=0, hoist2=0)
                if shape.I == K_CHUNK
                else None
            ),
            lambda: r(base, prefetch1=2, prefetch2=2),
            # GEMM1 on twice GEMM2's M tile (GEMM1 decodes each expert's weights once per tile;
            # GEMM2 at I = 256 spills at 128 tokens), or on GEMM2's where the heuristic splits.
            lambda: (
                r(base, block_m1=0)
                if base.block_m1
                else r(base, block_m1=2 * bm, stages1=3)
                if bm == 64
                else None
            ),
            # The activation ring without Triton's inserted barriers (static slots), where the
            # stages divide the K chunks, or with them where the heuristic has it static (GEMM2
            # only where it has a ring: the config rejects static_ring2 with accs2 = 2).
            lambda: (
                r(base, static_ring1=0)
                if base.static_ring1
                else r(base, static_ring1=1)
                if static_ring_fits(shape.H, base.stages1)
                else None
            ),
            lambda: (
                r(base, static_ring1=1, static_ring2=1)
                if static_ring_fits(shape.H, base.stages1)
                and static_ring_fits(shape.I, base.stages2)
                else None
            ),
        ]
        return _unique_valid(make, min(limit, MAX_CANDIDATES))

    # GEMM1 variants that won somewhere in the H200 sweep (prefill_heuristic_config's docstring).
    narrow = dict(block_n1=64, block_k1=256, warps1=4, stages1=2)
    wide = dict(block_n1=128, block_k1=256, warps1=8, stages1=2)
    half = dict(block_n1=128, block_k1=128, warps1=8, stages1=2)
    make = [
        lambda: base,
        lambda: r(base, block_m=m(2 * bm), **(half if 2 * bm == 256 else {})),
        lambda: r(base, block_m=m(bm // 2)),
        lambda: r(base, **narrow),
        lambda: r(base, **wide),
        lambda: r(base, block_m=m(bm // 2), **narrow),
        lambda: r(base, group_n2=4),
        lambda: r(base, group_n2=16),
        lambda: r(base, block_n2=64, warps2=4, group_n2=16),
        # Far smaller tiles: under expert parallelism most ids are another rank's, so the rows
        # per local expert are ~EP times fewer than the shape alone suggests.
        lambda: r(base, block_m=m(bm // 4), **narrow),
        lambda: r(base, block_m=m(bm // 8), **narrow),
        lambda: r(base, block_n1=64, block_n2=64),
    ]
    return _unique_valid(make, min(limit, MAX_CANDIDATES))
