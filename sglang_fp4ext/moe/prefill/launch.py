"""NVFP4 fused-MoE prefill path: validate -> config -> workspaces -> 6 to 8 launches.

Three GEMM families, a ``PrefillConfig`` type each: ``dot`` (W4A16, ``tl.dot``, the launches
below), ``wgmma`` (W4A16, Gluon, sm_90) and ``w4a4`` (NVFP4 activations, ``tl.dot_scaled``,
sm_100 / sm_120); ``plan.py`` builds each one's launches. They share the grouping
(``grouping.py``) and the ordered combine.

``fused_moe_nvfp4_prefill(hidden_states, weights, topk_ids, topk_weights)`` computes the same
``(T, H)`` bf16 partial sum as the decode entry point ``decode.launch.fused_moe_nvfp4`` and reads
the same :class:`~sglang_fp4ext.moe.prepared.PreparedMoEWeights` (one load-time preparation serves
both paths), but is built for hundreds of tokens per expert: the pair slots are grouped by expert
on the device and each expert runs as a tiled GEMM with ``block_m`` tokens per MMA tile
(``prefill/_dot_kernels.py`` describes the kernels). Ids ``< 0`` (experts of another EP rank) and
ids ``>= E`` contribute nothing; a token with no local expert gets zeros. ``topk_weights`` is used
as
given. The torch twin is ``sglang_fp4ext.moe.reference.fused_moe_nvfp4_torch``; the grouping's
twin is :func:`group_by_expert_torch`. The config (``prefill.config.PrefillConfig``) and its
heuristic live in ``prefill.config.py``.

CUDA graphs: no host synchronisation, no data-dependent allocation or grid. Workspaces are
allocated per call from PyTorch's caching allocator, sized from ``(T, top_k, E, H, I)`` and the
config only (inside a capture they come from the graph's private pool):

================  ==============================  =============================================
workspace         shape, dtype                    meaning
================  ==============================  =============================================
``hist``          (NB, NBINS) int32               per-block expert histogram, then its prefix
``counts``        (NBINS,) int32                  valid pairs per expert (0 on spare bins)
``start``         (NBINS,) int32                  first sorted row of each expert
``sorted_pair``   (P,) int32                      pair slots grouped by expert (first
                                                  ``sum(counts)`` entries are meaningful)
``sorted_tw``     (P,) fp32                       ``topk_weights`` of ``sorted_pair``'s slots
                                                  (GEMM2 reads them beside the pairs)
``inter``         (P, I) bf16                     SiLU·mul output, sorted-row order
``partial``       (P, H) bf16 | (T, H) fp32       ordered: weighted GEMM2 row per pair slot;
                                                  atomic: fp32 accumulator (zeroed per call)
================  ==============================  =============================================

with ``P = T * top_k``, ``NB = cdiv(P, block_p)``, ``NBINS = next_pow2(E + 1)``. The ordered
partials cost ``2 P H`` bytes (906 MB at T = 8192, top_k = 9, H = 6144), as SGLang's Triton MoE.

Determinism: the default ``combine="ordered"`` is bit-identical run to run. ``combine="atomic"``
(opt-in, never chosen by the heuristic) adds the top-k rows with fp32 ``atomic_add`` in arrival
order.
"""

from __future__ import annotations

import functools

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.fault_inject import corrupt_if_asked
from sglang_fp4ext.moe.prefill.config import (
    PrefillConfig,
    served_prefill_config,
)
from sglang_fp4ext.moe.prefill.plan import plan
from sglang_fp4ext.moe.prepared import PreparedMoEWeights, validate_moe_inputs
from sglang_fp4ext.moe.shape import current_target
from sglang_fp4ext.moe.tables import prefill_config_for

__all__ = ["fused_moe_nvfp4_prefill"]


# ---- validation ----


def _validate(x, weights, topk_ids, topk_weights, out, config):
    if config is not None and not isinstance(config, PrefillConfig):
        raise TypeError(
            f"fused_moe_nvfp4_prefill: config must be a PrefillConfig, got {type(config).__name__}"
        )
    validate_moe_inputs("fused_moe_nvfp4_prefill", x, weights, topk_ids, topk_weights, out)


_FAMILY_GPUS = {
    "wgmma": (target_info.supports_wgmma_prefill, "sm_90 (warpgroup_mma)"),
    "w4a4": (target_info.supports_w4a4_prefill, "the block-scaled FP4 MMA (sm_100 / sm_120)"),
}


@functools.cache
def _check_family_gpu(family: str, device_index: int) -> None:
    """Raise if ``family`` cannot run on this GPU (asked once per family and device)."""
    supports, needs = _FAMILY_GPUS[family]
    cap = target_info.device_capability(None if device_index < 0 else device_index)
    if not supports(cap):
        raise ValueError(
            f"fused_moe_nvfp4_prefill: the {family!r} prefill family needs {needs}, this GPU "
            f"is sm_{cap[0]}{cap[1]}; use DotPrefillConfig"
        )


# ---- public entry point ----


def fused_moe_nvfp4_prefill(
    hidden_states: torch.Tensor,
    weights: PreparedMoEWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """NVFP4 W4A16 MoE for large token counts. Args:

    hidden_states: (T, H) bf16; weights: :class:`PreparedMoEWeights` (E experts);
    topk_ids: (T, top_k) int32/int64 in [-1, E) (a fused shared expert is one more column
    pointing at expert E-1); topk_weights: (T, top_k) fp32/bf16/fp16; out: optional (T, H) bf16
    destination; config: force a :class:`PrefillConfig` (else ``config.prefill_config_for``:
    the device table's prefill entry or ``prefill.heuristic.prefill_heuristic_config``). Returns
    ``out``.
    """
    _validate(hidden_states, weights, topk_ids, topk_weights, out, config)
    T, H = hidden_states.shape
    dev = hidden_states.device
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    if T == 0:
        return out
    if config is None:
        config = prefill_config_for(T, weights.shape(topk_ids.shape[1]), current_target(dev))
        config = served_prefill_config(config, weights.has_input_scales)
    interp = target_info.is_interpreter()
    if config.kernels in _FAMILY_GPUS and not interp and dev.type == "cuda":
        _check_family_gpu(config.kernels, dev.index if dev.index is not None else -1)
    for launch in plan(hidden_states, weights, topk_ids, topk_weights, out, config, interp):
        launch.run()
    family = config.kernels if config.kernels == "w4a4" or not interp else "dot"
    corrupt_if_asked("prefill", family, out)
    return out
