"""Which fp4ext expert path runs on a device, and running it: one place for every caller.

``triton``: a CUDA GPU of SM80 or newer runs our Triton kernels on the kernel layout
(``PreparedMoEWeights``, built once) through ``dispatch.fused_moe``, which picks the decode or
prefill kernels per token-count bucket from the config tables (``moe/tables.py``).
``reference``: anything else (CPU, older GPUs) runs the float32 torch twin
``fused_moe_nvfp4_torch`` on the checkpoint layout (``MoEWeights``): correct and slow, for tests
and bring-up. Used by the SGLang runner core and the transformers swap alike.
"""

from __future__ import annotations

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.fault_inject import corrupt_if_asked
from sglang_fp4ext.moe.shape import current_target
from sglang_fp4ext.moe.weights import MoEWeights

__all__ = ["expert_path", "prepare_experts", "run_experts"]


def expert_path(device: torch.device) -> str:
    """``triton`` where our kernels run (CUDA, SM80+), else ``reference``."""
    if device.type == "cuda" and target_info.supports_triton_w4a16(
        current_target(device).capability
    ):
        return "triton"
    return "reference"


def prepare_experts(weights: MoEWeights, path: str, ep_size: int = 1):
    """The weights in the form ``path`` reads: ``PreparedMoEWeights`` (``ep_size``: the layer's
    expert-parallel ranks, for tile sizing) or the ``MoEWeights`` as is."""
    if path == "triton":
        from sglang_fp4ext.moe.prepared import PreparedMoEWeights

        return PreparedMoEWeights.from_moe_weights(weights, ep_size)
    if path == "reference":
        return weights
    raise ValueError(f"expert path must be 'triton' or 'reference', got {path!r}")


def run_experts(path: str, weights, hidden_states, topk_ids, topk_weights) -> torch.Tensor:
    """``sum_j topk_weights[t, j] * FFN_{topk_ids[t, j]}(x[t])`` in ``hidden_states.dtype``.

    ``weights`` as returned by :func:`prepare_experts` for the same ``path``. The triton path takes
    bf16 activations (as SGLang feeds them); ids ``< 0`` contribute nothing on both paths.
    """
    if path == "triton":
        from sglang_fp4ext.moe.dispatch import fused_moe

        out = fused_moe(
            hidden_states.to(torch.bfloat16).contiguous(),
            weights,
            topk_ids.to(torch.int32).contiguous(),
            topk_weights.contiguous(),
        )
    else:
        from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch

        out = fused_moe_nvfp4_torch(hidden_states, weights, topk_ids, topk_weights)
        # The twin serves prefill and decode alike; the fault switch names it decode:reference
        # (the triton path's launchers call it themselves).
        corrupt_if_asked("decode", "reference", out)
    return out.to(hidden_states.dtype)
