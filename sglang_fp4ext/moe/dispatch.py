"""The kernel-path dispatcher: decode or prefill kernels for a call, from the config tables.

``fused_moe(hidden_states, weights, topk_ids, topk_weights)`` picks the path and config with
``config.select(T, shape, target)`` -- the device table's entry for ``token_bucket(T)``, else
the path heuristic (decode below ``config.PREFILL_MIN_TOKENS`` tokens, ``WGMMA_PREFILL_MIN_TOKENS``
where the wgmma prefill family runs, ``WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS`` there with a fused
shared expert, prefill from there) with
that path's config heuristic -- and runs ``decode.fused_moe_nvfp4`` (decode) or
``prefill.fused_moe_nvfp4_prefill`` (prefill). Both read the same ``PreparedMoEWeights`` and
return the same ``(T, H)`` bf16 sum. The choice depends only on (T, shape, target), never on
data, so a CUDA graph captured for T replays the path it captured. Before an entry serves for the
first time on a GPU it passes the first-use self-check (``selfcheck.py``), which may replace it by
a verified fallback (Gluon -> ``tl.dot``) or, with nothing verified, by the torch twin.

``CALLS`` counts, per path ("decode", "prefill", "reference"), the calls this dispatcher launched (host side: a graph replay is not
a call; tests and ``fp4ext tune`` read it to see which kernels ran).
"""

from __future__ import annotations

from collections import Counter

import torch

from sglang_fp4ext.moe import selfcheck
from sglang_fp4ext.moe.config import TableEntry, select
from sglang_fp4ext.moe.prefill_config import served_prefill_config
from sglang_fp4ext.moe.shape import Target, current_target

__all__ = ["CALLS", "choose", "fused_moe"]

#: Calls launched per kernel path ("decode" / "prefill") since import or ``CALLS.clear()``.
CALLS: Counter = Counter()


def choose(T: int, weights, top_k: int, target: Target | None = None) -> TableEntry:
    """The (path, config) :func:`fused_moe` runs for ``T`` tokens on ``weights``' shape."""
    if target is None:
        dev = weights.device
        target = current_target(dev) if dev.type == "cuda" else current_target()
    return select(T, weights.shape(top_k), target)


def fused_moe(
    hidden_states: torch.Tensor,
    weights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    target: Target | None = None,
) -> torch.Tensor:
    """NVFP4 MoE on the path the tables choose (W4A4 prefill where the table or heuristic says
    so and the weights carry static input scales; W4A16 otherwise). Arguments as ``fused_moe_nvfp4``:
    hidden_states (T, H) bf16; weights ``PreparedMoEWeights``; topk_ids (T, top_k) int32/int64
    in [-1, E); topk_weights (T, top_k); out: optional (T, H) bf16. Returns ``out``."""
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2:
        raise ValueError(
            f"fused_moe: topk_ids must be a 2-D (T, top_k) tensor, got "
            f"{getattr(topk_ids, 'shape', type(topk_ids).__name__)}"
        )
    entry = choose(hidden_states.shape[0], weights, topk_ids.shape[1], target)
    if entry.path == "prefill":  # W4A4 needs input scales and the user's consent (bf16 opt-out)
        cfg = served_prefill_config(entry.config, getattr(weights, "has_input_scales", False))
        entry = TableEntry("prefill", cfg) if cfg is not entry.config else entry
    entry = selfcheck.usable_entry(entry, topk_ids.shape[1], hidden_states.device)
    if entry is None:  # nothing verified on this GPU: the torch twin, loudly (selfcheck.py)
        CALLS["reference"] += 1
        return selfcheck.reference_on_prepared(hidden_states, weights, topk_ids, topk_weights, out)
    CALLS[entry.path] += 1
    if entry.path == "prefill":
        from sglang_fp4ext.moe.prefill import fused_moe_nvfp4_prefill

        return fused_moe_nvfp4_prefill(
            hidden_states, weights, topk_ids, topk_weights, out=out, config=entry.config
        )
    from sglang_fp4ext.moe.decode import fused_moe_nvfp4

    return fused_moe_nvfp4(
        hidden_states, weights, topk_ids, topk_weights, out=out, config=entry.config
    )
