"""The kernel-path dispatcher: the path and config for a call, from the config tables.

``fused_moe(hidden_states, weights, topk_ids, topk_weights)`` picks the entry with
``config.select(T, shape, target)`` -- the device table's entry for ``token_bucket(T)``, else the
path heuristic with that path's config heuristic -- and runs it through the kernel-path registry
(``paths.py``). Every path reads the same ``PreparedMoEWeights`` and returns the same ``(T, H)``
bf16 sum. The choice depends only on (T, shape, target), never on data, so a CUDA graph captured
for T replays the path it captured. Before an entry serves for the first time on a GPU it passes
the first-use self-check (``selfcheck.py``), which may replace it by a verified fallback of its
path or, with nothing verified, by the torch twin.

``CALLS`` counts, per path (and "reference" for the twin), the calls this dispatcher launched
(host side: a graph replay is not a call; tests and ``fp4ext tune`` read it to see what ran).
"""

from __future__ import annotations

from collections import Counter

import torch

from sglang_fp4ext.moe import paths, selfcheck
from sglang_fp4ext.moe.prepared import validate_moe_inputs
from sglang_fp4ext.moe.shape import Target, current_target
from sglang_fp4ext.moe.tables import TableEntry, select

__all__ = ["CALLS", "choose", "fused_moe"]

#: Calls launched per kernel path since import or ``CALLS.clear()``.
CALLS: Counter = Counter()


def choose(T: int, weights, top_k: int, target: Target | None = None) -> TableEntry:
    """The (path, config) :func:`fused_moe` runs for ``T`` tokens on ``weights``' shape."""
    return select(T, weights.shape(top_k), target or current_target(weights.device))


def fused_moe(
    hidden_states: torch.Tensor,
    weights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    target: Target | None = None,
) -> torch.Tensor:
    """NVFP4 MoE on the path the tables choose. Arguments as the launchers': hidden_states (T, H)
    bf16; weights ``PreparedMoEWeights``; topk_ids (T, top_k) int32/int64 (ids < 0 and >= E
    contribute nothing, here, in the kernels and in the torch twin); topk_weights (T, top_k);
    out: optional (T, H) bf16. Checked before anything runs (``validate_moe_inputs``): the
    weights' type first, then every shape. Returns ``out``."""
    validate_moe_inputs("fused_moe", hidden_states, weights, topk_ids, topk_weights, out)
    entry = choose(hidden_states.shape[0], weights, topk_ids.shape[1], target)
    path = paths.get(entry.path)
    served = path.serves(entry.config, weights)  # e.g. W4A4 needs static input scales
    if served is not entry.config:
        entry = TableEntry(entry.path, served)
    entry = selfcheck.usable_entry(entry, topk_ids.shape[1], hidden_states.device)
    if entry is None:  # nothing verified on this GPU: the torch twin, loudly (selfcheck.py)
        CALLS["reference"] += 1
        return selfcheck.reference_on_prepared(hidden_states, weights, topk_ids, topk_weights, out)
    CALLS[entry.path] += 1
    return paths.get(entry.path).run(
        hidden_states, weights, topk_ids, topk_weights, out=out, config=entry.config
    )
