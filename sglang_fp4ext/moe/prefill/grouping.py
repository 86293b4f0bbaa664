"""Device grouping of a call's pair slots by expert (3 launches: a per-block histogram, one
scan, a stable scatter) and its torch twin, shared by every prefill family."""

from __future__ import annotations

import torch

from sglang_fp4ext.moe.launch import Launch

__all__ = [
    "group_by_expert",
    "group_by_expert_torch",
    "group_plan",
    "max_m_tiles",
    "num_bins",
    "prefill_launch",
]

# Rows of the block histogram the single scan program handles per step.
_SCAN_ROWS = 16


def _pow2(x) -> bool:
    return isinstance(x, int) and x >= 1 and (x & (x - 1)) == 0


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def num_bins(E: int) -> int:
    """Histogram bins: a power of two above ``E`` (the last bin collects ids outside [0, E))."""
    return _next_pow2(E + 1)


def max_m_tiles(P: int, E: int, block_m: int) -> int:
    """Worst-case M tiles: sum over experts of cdiv(count, block_m) with sum(count) <= P and at
    most min(E, P) experts non-empty."""
    return (P + min(E, P) * (block_m - 1)) // block_m


_DOT, _WGMMA, _W4A4 = "prefill._dot_kernels", "prefill._wgmma_kernels", "prefill._w4a4_kernels"


def prefill_launch(
    kernel: str,
    grid: tuple,
    args: dict,
    constexprs: dict,
    num_warps: int,
    num_stages: int,
    gluon: bool = False,
    module: str = "dot",
) -> Launch:
    """One launch of ``prefill._dot_kernels`` (``module="w4a4"``: ``prefill._w4a4_kernels``; with
    ``gluon``: ``prefill._wgmma_kernels``, which take no stages): runtime arguments and constexprs
    (the Gluon layouts among them), each by its parameter name."""
    if gluon:
        return Launch(_WGMMA, kernel, grid, args | constexprs, dict(num_warps=num_warps))
    options = dict(num_warps=num_warps, num_stages=num_stages)
    return Launch(_W4A4 if module == "w4a4" else _DOT, kernel, grid, args | constexprs, options)


def group_plan(ids: torch.Tensor, E: int, block_p: int, tw: torch.Tensor | None = None):
    """Workspaces and the 3 grouping launches for flat ``ids`` (P,); with the flat routing
    weights ``tw`` (P,) also ``sorted_tw`` (else None)."""
    P = ids.numel()
    nbins = num_bins(E)
    nb = max(1, -(-P // block_p))
    ws = torch.empty(nb * nbins + 2 * nbins + 2 * max(P, 1), dtype=torch.int32, device=ids.device)
    hist = ws[: nb * nbins]
    counts = ws[nb * nbins : nb * nbins + nbins]
    start = ws[nb * nbins + nbins : nb * nbins + 2 * nbins]
    sorted_pair = ws[nb * nbins + 2 * nbins :][:P]
    sorted_tw = ws[nb * nbins + 2 * nbins + max(P, 1) :][:P].view(torch.float32)
    launches = [
        prefill_launch(
            "_group_count",
            (nb,),
            dict(ids_ptr=ids, hist_ptr=hist, P=P, E=E),
            dict(NBINS=nbins, BLOCK_P=block_p),
            4,
            1,
        ),
        prefill_launch(
            "_group_scan",
            (1,),
            dict(hist_ptr=hist, counts_ptr=counts, start_ptr=start, NB=nb, E=E),
            dict(NBINS=nbins, ROWS=_SCAN_ROWS),
            4,
            1,
        ),
        prefill_launch(
            "_group_scatter",
            (nb,),
            dict(
                ids_ptr=ids,
                tw_ptr=ids if tw is None else tw,
                prefix_ptr=hist,
                start_ptr=start,
                sorted_ptr=sorted_pair,
                sorted_tw_ptr=sorted_tw,
                P=P,
                E=E,
            ),
            dict(NBINS=nbins, BLOCK_P=block_p, WITH_TW=tw is not None),
            4,
            1,
        ),
    ]
    return launches, sorted_pair, counts, start, (None if tw is None else sorted_tw)


def group_by_expert(topk_ids: torch.Tensor, num_experts: int, block_p: int = 1024):
    """Device grouping of pair slots by expert (3 launches; ``prefill/_dot_kernels.py`` 1-3).

    Args:
        topk_ids: (T, top_k) int32/int64, contiguous; ids outside [0, E) are dropped.
        num_experts: E.
        block_p: pair slots per grouping program (power of two >= 16).

    Returns:
        ``(sorted_pair (P,) int32, counts (NBINS,) int32, start (NBINS,) int32)``; see the module
        docstring. Only ``sorted_pair[:counts.sum()]`` is written.
    """
    if not _pow2(block_p) or block_p < 16:
        raise ValueError(f"group_by_expert: block_p must be a power of two >= 16, got {block_p}")
    if not topk_ids.is_contiguous() or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError("group_by_expert: topk_ids must be a contiguous int32/int64 tensor")
    launches, sorted_pair, counts, start, _ = group_plan(topk_ids.reshape(-1), num_experts, block_p)
    for launch in launches:
        launch.run()
    return sorted_pair, counts, start


def group_by_expert_torch(topk_ids: torch.Tensor, num_experts: int):
    """Torch twin of :func:`group_by_expert`: (sorted valid pairs (n,) int64, counts (E,) int64,
    start (E,) int64). Stable: pairs of one expert in slot order."""
    ids = topk_ids.reshape(-1).long()
    valid = (ids >= 0) & (ids < num_experts)
    key = torch.where(valid, ids, num_experts)
    order = torch.sort(key, stable=True).indices
    counts = torch.bincount(ids[valid], minlength=num_experts)
    start = torch.cumsum(counts, 0) - counts
    return order[: int(valid.sum())], counts, start
