"""Public NVFP4 fused-MoE decode entry point: validate -> config -> plan (workspaces and 1-3
launches, as :class:`~sglang_fp4ext.moe.launch.Launch` records) -> run.

``fused_moe_nvfp4(hidden_states, weights, topk_ids, topk_weights)`` returns the routed (and fused
shared) experts' sum ``out[t] = sum_j topk_weights[t, j] * FFN_{topk_ids[t, j]}(x[t])`` as
``(T, H)`` bf16, the per-rank partial sum SGLang expects. Ids ``< 0`` (experts of another EP rank)
and ids ``>= E`` contribute nothing; a token with no local expert gets zeros. ``topk_weights`` is
used as given (SGLang already folded the routed scaling factor into it).

CUDA graphs: no host synchronisation, no allocation that depends on data, and a launch grid that
depends only on ``T``, ``top_k``, the shape and the config; the workspaces (``decode.plan``) grow
only outside capture: call once per token count before capturing (SGLang's warm-up does). They
are shared by all layers, so calls must be ordered on one stream.

Weights come as ``prepared.PreparedMoEWeights`` (shared with the prefill path); the config is
a ``decode.config.DecodeConfig`` family. The torch twin is
``sglang_fp4ext.moe.reference.fused_moe_nvfp4_torch`` (fp32 on dequantised weights).
"""

from __future__ import annotations

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.decode.config import DecodeConfig
from sglang_fp4ext.moe.decode.plan import plan
from sglang_fp4ext.moe.fault_inject import corrupt_if_asked
from sglang_fp4ext.moe.prepared import PreparedMoEWeights, validate_moe_inputs
from sglang_fp4ext.moe.shape import Target, current_target
from sglang_fp4ext.moe.tables import config_for

__all__ = ["fused_moe_nvfp4", "launch_family"]


def fused_moe_nvfp4(
    hidden_states: torch.Tensor,
    weights: PreparedMoEWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    target: Target | None = None,
) -> torch.Tensor:
    """NVFP4 W4A16 MoE decode. Args:

    hidden_states: (T, H) bf16; weights: :class:`PreparedMoEWeights` (E experts);
    topk_ids: (T, top_k) int32/int64 in [-1, E); topk_weights: (T, top_k) fp32/bf16/fp16;
    out: optional (T, H) bf16 destination; config: force a :class:`DecodeConfig` (else
    :func:`config_for`); target: the GPU description for the config choice (default: this
    device). Always deterministic: the same inputs give bit-identical outputs. Returns ``out``.
    """
    validate_moe_inputs("fused_moe_nvfp4", hidden_states, weights, topk_ids, topk_weights, out)
    T, H = hidden_states.shape
    dev = hidden_states.device
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    if T == 0:
        return out
    if config is None:
        config = config_for(T, weights.shape(topk_ids.shape[1]), target or current_target(dev))
    family = launch_family(config)
    for launch in plan(hidden_states, weights, topk_ids, topk_weights, out, config, family,
                       _pdl(family, config, dev)):  # fmt: skip
        launch.run()
    corrupt_if_asked("decode", family, out)
    return out


def launch_family(config: DecodeConfig) -> str:
    """The kernel family that runs ``config``: the interpreter runs only the ``tl.dot`` family,
    so a Gluon or one-launch config runs its tiles there."""
    return config.kernels if not target_info.is_interpreter() else "dot"


def _pdl(family: str, cfg: DecodeConfig, dev: torch.device) -> int:
    """The programmatic dependent launch this call's Gluon kernels run with: ``cfg.pdl`` on a GPU
    that has it, else 0."""
    if family != "gluon" or not cfg.pdl:
        return 0
    return cfg.pdl if target_info.supports_pdl(current_target(dev).capability) else 0
