"""fp4ext inside a ``transformers`` model: swap the routed experts of an HF MoE for fp4ext.

For the GPU tier's model-level check (issue 9): a tiny ``GlmMoeDsaForCausalLM`` (GLM-5's own
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

from sglang_fp4ext.moe.weights import MoEWeights, quantize_moe_weights

__all__ = ["Fp4ExtExperts", "moe_expert_modules", "quantize_experts", "swap_experts"]


def moe_expert_modules(model) -> dict[int, torch.nn.Module]:
    """``{layer index: experts module}`` for HF MoE layers with 3D ``gate_up_proj``/``down_proj``."""
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

    ``path="triton"`` runs ``fused_moe_nvfp4`` (bf16 activations in and out, as SGLang feeds it);
    ``path="reference"`` runs the float32 torch twin.
    """

    def __init__(self, weights: MoEWeights, path: str):
        super().__init__()
        if path not in ("triton", "reference"):
            raise ValueError(f"path must be 'triton' or 'reference', got {path!r}")
        self.path = path
        if path == "triton":
            from sglang_fp4ext.moe.fused_moe import PreparedMoEWeights

            self.weights = PreparedMoEWeights.from_moe_weights(weights)
        else:
            self.weights = weights

    def forward(self, hidden_states, top_k_index, top_k_weights):
        ids = top_k_index.to(torch.int32)
        if self.path == "triton":
            from sglang_fp4ext.moe.fused_moe import fused_moe_nvfp4

            out = fused_moe_nvfp4(
                hidden_states.to(torch.bfloat16).contiguous(), self.weights, ids.contiguous(),
                top_k_weights.float().contiguous(),
            )
        else:
            from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch

            out = fused_moe_nvfp4_torch(hidden_states, self.weights, ids, top_k_weights.float())
        return out.to(hidden_states.dtype)


def swap_experts(model, packs: dict[int, MoEWeights], path: str) -> None:
    """Replace each MoE layer's ``mlp.experts`` with :class:`Fp4ExtExperts` (in place)."""
    device = next(model.parameters()).device
    for i, experts in moe_expert_modules(model).items():
        model.model.layers[i].mlp.experts = Fp4ExtExperts(packs[i].to(device), path)
