"""Reference NVFP4 fused MoE in torch: the fp32 twin every MoE kernel is tested against.

For each token ``t`` and slot ``j`` with expert ``e = topk_ids[t, j]`` in ``[0, E)``::

    gate, up = (x[t] @ W13[e].T).split(I)            # W13[e] = dequantized [gate; up], (2I, H)
    out[t]  += topk_weights[t, j] * ((silu(gate) * up) @ W2[e].T)

``x`` is upcast to fp32, weights are dequantized with ``MoEWeights.dequantize_experts`` (each
expert present once), every product and sum is fp32 (matmuls follow torch's fp32 matmul
precision: keep TF32 off, PyTorch's default, when this is the oracle). An id ``< 0`` or ``>= E``
contributes nothing, as in the kernels: SGLang marks a slot whose expert lives on another rank
with -1. ``topk_weights`` are used as given (SGLang
has already applied renormalisation and the routed scaling factor). A fused shared expert is
just one more column of ``topk_ids`` pointing at the last expert (``k = top_k + 1``).

``quantize_activations=True`` emulates W4A4: the GEMM1 input (per expert, with that expert's
``w13_input_scale``) and the GEMM2 input (``silu(gate) * up``, with ``w2_input_scale``) are
NVFP4 quantize-dequantized with their static scales (``nvfp4/format.py``) before each GEMM.
"""

from __future__ import annotations

import torch

from ..nvfp4.format import fake_quantize_activation
from .weights import MoEWeights

__all__ = ["fused_moe_nvfp4_torch"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INT_DTYPES = (torch.int32, torch.int64)


def _validate(hidden_states, weights, topk_ids, topk_weights, quantize_activations) -> None:
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights must be MoEWeights, got {type(weights).__name__}")
    if hidden_states.ndim != 2 or hidden_states.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"hidden_states must be (T, H) float32/bf16/fp16, got {tuple(hidden_states.shape)} "
            f"{hidden_states.dtype}"
        )
    t, h = hidden_states.shape
    if h != weights.hidden_size:
        raise ValueError(f"hidden_states H={h} but the weights have H={weights.hidden_size}")
    if topk_ids.dtype not in _INT_DTYPES:
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_ids.ndim != 2 or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids must be (T={t}, k), got {tuple(topk_ids.shape)}")
    if topk_weights.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"topk_weights must be float, got {topk_weights.dtype}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(
            f"topk_weights shape {tuple(topk_weights.shape)} != topk_ids {tuple(topk_ids.shape)}"
        )
    for name, x in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if x.device != hidden_states.device:
            raise ValueError(f"{name} on {x.device}, hidden_states on {hidden_states.device}")
    if weights.device != hidden_states.device:
        raise ValueError(f"weights on {weights.device}, hidden_states on {hidden_states.device}")
    if quantize_activations and (weights.w13_input_scale is None or weights.w2_input_scale is None):
        raise ValueError("quantize_activations=True needs w13_input_scale and w2_input_scale")


def fused_moe_nvfp4_torch(
    hidden_states: torch.Tensor,
    weights: MoEWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    quantize_activations: bool = False,
) -> torch.Tensor:
    """NVFP4 MoE forward in fp32.

    Args:
        hidden_states: (T, H) float32 / bfloat16 / float16.
        weights: the NVFP4 expert pack (E experts, incl. a fused shared expert if any).
        topk_ids: (T, k) int32/int64; an id outside ``[0, E)`` (-1: not on this rank)
            contributes nothing.
        topk_weights: (T, k) float, already scaled.
        quantize_activations: emulate NVFP4 activations with the static input scales (W4A4).

    Returns:
        (T, H) float32.
    """
    _validate(hidden_states, weights, topk_ids, topk_weights, quantize_activations)
    t, h = hidden_states.shape
    i = weights.intermediate_size
    out = torch.zeros(t, h, dtype=torch.float32, device=hidden_states.device)
    experts = torch.unique(topk_ids[(topk_ids >= 0) & (topk_ids < weights.num_experts)]).tolist()
    if not experts:
        return out
    x_all = hidden_states.float()
    tw = topk_weights.float()
    for e in experts:
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        w13, w2 = weights.dequantize_experts([e])
        x = x_all[tok]
        if quantize_activations:
            x = fake_quantize_activation(x, weights.w13_input_scale[e])
        gate_up = x @ w13[0].T
        act = torch.nn.functional.silu(gate_up[:, :i]) * gate_up[:, i:]
        if quantize_activations:
            act = fake_quantize_activation(act, weights.w2_input_scale[e])
        y = act @ w2[0].T
        out.index_add_(0, tok, y * tw[tok, slot].unsqueeze(1))
    return out
