"""Which sizes the fp4ext capture policy captures: decode batch sizes and prefill token buckets.

Pure functions of the limits SGLang resolved (``capture_policy.compute_policy`` calls them; the
rules are in that module's docstring): decode sizes dense up to :data:`DECODE_DENSE_MAX`, then
SGLang's own steps, plus every fp4ext kernel token-bucket boundary (read from
:func:`sglang_fp4ext.moe.shape.token_bucket`, never copied); prefill buckets tile-aligned, at most
2x apart, within a graph-memory budget. :func:`compact_sizes` writes a size list for people.
"""

from __future__ import annotations

import math

from sglang_fp4ext.moe.shape import token_bucket

__all__ = [
    "DECODE_DENSE_MAX",
    "DECODE_STEPS",
    "PREFILL_GRAPH_MB_PER_BUCKET",
    "PREFILL_MAX_WASTE",
    "PREFILL_MIN_TOKENS",
    "PREFILL_TILE_TOKENS",
    "captured_token_buckets",
    "compact_sizes",
    "decode_batch_sizes",
    "kernel_bucket_boundaries",
    "prefill_token_buckets",
]

#: Every decode batch size up to this is captured. GLM-5 deployments on 8x RTX PRO 6000 report
#: decode at concurrency 1-64 (hardware-and-model.md section 9), and in this range each real row
#: still adds several new experts to the step (D(B) = E(1 - (1 - k/E)^B) grows from 8 to ~163
#: of 256 experts between B = 1 and 32), so sizes here are worth an exact graph each.
DECODE_DENSE_MAX = 32
#: Above the dense range: (last size, step), SGLang's own decode grid (cuda_graph_hook.py:500-532).
#: ``None`` = up to the maximum. Every step divides the powers of two it passes.
DECODE_STEPS: tuple[tuple[int | None, int], ...] = ((256, 8), (512, 16), (None, 32))

#: Token tile of the prefill MoE path. The prefill kernel does not exist yet; 128 is the M tile of
#: Triton/CUTLASS grouped GEMMs on SM90/SM120. Change it here when the prefill kernel lands.
PREFILL_TILE_TOKENS = 128
#: Smallest prefill bucket: SGLang's own smallest (4); BCG capture below it is not exercised.
PREFILL_MIN_TOKENS = 4
#: Above one tile, a bucket's step is the largest tile * 2^k within this fraction of its size.
PREFILL_MAX_WASTE = 1 / 8
#: Graph memory per prefill bucket: SGLang's estimate in memory_hook.reserve_for_graph_mb
#: ("len(bs) * 8" MB of non-torch memory; the torch pool is shared by all BCG buckets).
PREFILL_GRAPH_MB_PER_BUCKET = 8.0


def kernel_bucket_boundaries(max_tokens: int) -> tuple[int, ...]:
    """Token counts up to ``max_tokens`` where the fp4ext decode kernel config changes.

    ``config_for(T)`` depends on ``T`` only through ``token_bucket(T)``, so the configs change
    just after each value of that function; read through it, never copied.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    bounds = set()
    t = 1
    while t <= max_tokens:
        b = token_bucket(t)
        if b <= max_tokens:
            bounds.add(b)
        t = max(b, t) + 1
    return tuple(sorted(bounds))


def captured_token_buckets(
    decode_bs, prefill_tokens, *, tokens_per_req: int = 1
) -> tuple[int, ...]:
    """The kernel token buckets graphs of these sizes run: a decode graph of ``B`` requests runs
    ``B * tokens_per_req`` MoE rows, a prefill graph its token count (what ``fp4ext info`` shows
    per bucket and a first start tunes)."""
    rows = [b * tokens_per_req for b in decode_bs] + list(prefill_tokens)
    return tuple(sorted({token_bucket(r) for r in rows if r >= 1}))


def decode_batch_sizes(max_bs: int, *, tokens_per_req: int = 1) -> tuple[int, ...]:
    """Dense ``1..DECODE_DENSE_MAX``, then ``DECODE_STEPS``, plus kernel-bucket boundaries."""
    if max_bs < 1:
        raise ValueError(f"decode max batch size must be >= 1, got {max_bs}")
    sizes = set(range(1, min(DECODE_DENSE_MAX, max_bs) + 1))
    s = DECODE_DENSE_MAX
    for last, step in DECODE_STEPS:
        end = max_bs if last is None else min(last, max_bs)
        while s + step <= end:
            s += step
            sizes.add(s)
        if last is None or s < last:
            break
    # A batch of B requests runs B * tokens_per_req MoE rows: capture the largest B whose rows stay
    # inside each kernel bucket, so padding never moves a batch into the next bucket's config.
    for b in kernel_bucket_boundaries(max_bs * tokens_per_req):
        if b // tokens_per_req >= 1:
            sizes.add(b // tokens_per_req)
    sizes.add(max_bs)
    return tuple(sorted(sizes))


def _prefill_grid(max_tokens: int, waste: float) -> list[int]:
    tile = PREFILL_TILE_TOKENS
    small = [b for b in kernel_bucket_boundaries(max_tokens) if PREFILL_MIN_TOKENS <= b < tile]
    grid = []
    s = tile
    while s <= max_tokens:
        grid.append(s)
        step = tile
        while step * 2 <= s * waste:
            step *= 2
        s += step
    buckets = sorted(set(small + grid + [max_tokens]))
    return [b for b in buckets if PREFILL_MIN_TOKENS <= b <= max_tokens] or [max_tokens]


def prefill_token_buckets(
    max_tokens: int, *, budget_mb: float | None = None
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Prefill buckets and notes. Over budget: coarser steps (waste 1/8 -> 1/4 -> 1/2 -> 1, still
    <= 2x apart), then only the smallest buckets that fit (large prefills are compute-bound and
    gain least from a graph)."""
    if max_tokens < 1:
        raise ValueError(f"prefill max tokens must be >= 1, got {max_tokens}")
    notes = []
    waste = PREFILL_MAX_WASTE
    buckets = _prefill_grid(max_tokens, waste)
    if budget_mb is None:
        return tuple(buckets), ()
    fits = max(1, math.floor(budget_mb / PREFILL_GRAPH_MB_PER_BUCKET))
    while len(buckets) > fits and waste < 1.0:
        waste = min(1.0, waste * 2)
        buckets = _prefill_grid(max_tokens, waste)
    if waste != PREFILL_MAX_WASTE:
        notes.append(f"prefill steps widened to waste <= {waste:g} to fit {budget_mb:g} MB")
    if len(buckets) > fits:
        buckets = buckets[:fits]
        notes.append(
            f"prefill buckets above {buckets[-1]} tokens dropped (eager) to fit {budget_mb:g} MB"
        )
    return tuple(buckets), tuple(notes)


def compact_sizes(sizes) -> str:
    """``1-32, 40-256/8, 272-512/16``: runs of a constant step written once."""
    sizes = list(sizes)
    if not sizes:
        return "none"
    parts, i = [], 0
    while i < len(sizes):
        j = i
        if i + 1 < len(sizes):
            step = sizes[i + 1] - sizes[i]
            while j + 1 < len(sizes) and sizes[j + 1] - sizes[j] == step:
                j += 1
        if j - i >= 2:
            step = sizes[i + 1] - sizes[i]
            parts.append(f"{sizes[i]}-{sizes[j]}" + ("" if step == 1 else f"/{step}"))
            i = j + 1
        else:
            parts.append(str(sizes[i]))
            i += 1
    return ", ".join(parts)
