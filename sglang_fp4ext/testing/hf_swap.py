"""fp4ext inside a ``transformers`` model: swap the routed experts of an HF MoE for fp4ext.

For the GPU tier's model-level check: a tiny ``GlmMoeDsaForCausalLM`` (GLM-5's own
architecture, DSA attention included) built by ``transformers`` itself. :func:`quantize_experts`
quantises every MoE layer's routed experts to NVFP4 with our codec (bit-exact with ModelOpt,
tests/test_nvfp4_modelopt.py) and writes the *dequantised* values back into the model, so the
unmodified model is the oracle; :func:`swap_experts` then routes the experts through fp4ext.

HF's experts take ``(hidden (N, H), top_k_index (N, k), top_k_weights (N, k))`` with the routed
scaling factor already folded into the weights, exactly SGLang's NVFP4 contract, so the fp4ext
module is a drop-in ``forward``. Works without SGLang.
"""

from __future__ import annotations

import torch

from sglang_fp4ext.moe.experts import prepare_experts, run_experts
from sglang_fp4ext.moe.weights import MoEWeights, quantize_moe_weights

__all__ = ["Fp4ExtExperts", "moe_expert_modules", "quantize_experts", "swap_experts"]


def moe_expert_modules(model) -> dict[int, torch.nn.Module]:
    """``{layer index: experts module}`` for HF MoE layers with 3D ``gate_up_proj`` /
    ``down_proj``."""
    found = {}
    for i, layer in enumerate(model.model.layers):
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if experts is not None and hasattr(experts, "gate_up_proj"):
            found[i] = experts
    if not found:
        raise ValueError(f"{type(model).__name__} has no fused-3D MoE experts to swap")
    return found


@torch.no_grad()
def quantize_experts(model) -> dict[int, MoEWeights]:
    """NVFP4-quantise every MoE layer's routed experts; write the dequantised values back."""
    packs = {}
    for i, experts in moe_expert_modules(model).items():
        w13 = experts.gate_up_proj.detach().float().cpu()  # (E, 2I, H): gate rows, then up
        w2 = experts.down_proj.detach().float().cpu()  # (E, H, I)
        pack = quantize_moe_weights(w13, w2)
        dq13, dq2 = pack.dequantize()
        experts.gate_up_proj.copy_(dq13.to(experts.gate_up_proj))
        experts.down_proj.copy_(dq2.to(experts.down_proj))
        packs[i] = pack
    return packs


class Fp4ExtExperts(torch.nn.Module):
    """Drop-in for HF's experts module, computing with fp4ext on NVFP4 weights.

    ``path`` as in ``moe.experts``: ``triton`` (the kernels; bf16 activations in and out, as SGLang
    feeds them) or ``reference`` (the float32 torch twin).
    """

    def __init__(self, weights: MoEWeights, path: str):
        super().__init__()
        self.path = path
        self.weights = prepare_experts(weights, path)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return run_experts(
            self.path, self.weights, hidden_states, top_k_index, top_k_weights.float()
        )


def swap_experts(model, packs: dict[int, MoEWeights], path: str) -> None:
    """Replace each MoE layer's ``mlp.experts`` with :class:`Fp4ExtExperts` (in place)."""
    device = next(model.parameters()).device
    for i, experts in moe_expert_modules(model).items():
        model.model.layers[i].mlp.experts = Fp4ExtExperts(packs[i].to(device), path)
