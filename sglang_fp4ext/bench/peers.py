"""Peer MoE implementations timed next to ours in the same run.

:class:`TorchGroupedMMMoE`: a bf16 MoE as a strong "no custom kernel" baseline. The NVFP4 pack is
dequantised once to bf16; a call sorts the (token, slot) pairs by expert, gathers the tokens,
runs ``torch._grouped_mm`` (one grouped GEMM per projection, ``offs`` = per-expert row ends) with
SiLU·mul between, and scatters the weighted rows back into the ``(T, H)`` output. Pairs with ids
< 0 sort last, outside every group, and are dropped. Everything is on-device (counts by
``index_add_``, no ``bincount``/``nonzero``), so it can be captured in a CUDA graph.
``torch._grouped_mm`` exists in torch 2.11 and 2.14 (bf16 needs sm_90+).
"""

from __future__ import annotations

import torch

from sglang_fp4ext.moe.weights import MoEWeights

__all__ = ["TorchGroupedMMMoE", "has_grouped_mm"]


def has_grouped_mm() -> bool:
    return hasattr(torch, "_grouped_mm")


class TorchGroupedMMMoE:
    """bf16 grouped-GEMM MoE built from an NVFP4 pack (weights dequantised once)."""

    def __init__(self, weights: MoEWeights):
        if not has_grouped_mm():
            raise RuntimeError(f"torch {torch.__version__} has no torch._grouped_mm")
        w13, w2 = weights.dequantize()
        self.E = weights.num_experts
        self.I = weights.intermediate_size
        # (E, N, K) row-major -> (E, K, N) column-major views, the layout _grouped_mm wants for B.
        self.w13 = w13.to(torch.bfloat16).contiguous()
        self.w2 = w2.to(torch.bfloat16).contiguous()
        del w13, w2

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        T, k = topk_ids.shape
        flat = topk_ids.reshape(-1).to(torch.int64)
        key = torch.where(flat < 0, self.E, flat)  # dropped pairs sort after every expert
        order = torch.sort(key, stable=True).indices
        counts = torch.zeros(self.E + 1, dtype=torch.int32, device=x.device)
        counts.index_add_(0, key, torch.ones_like(key, dtype=torch.int32))
        offs = torch.cumsum(counts[: self.E], 0, dtype=torch.int32)
        xs = x[order // k]
        h = torch._grouped_mm(xs, self.w13.transpose(1, 2), offs=offs)
        a = torch.nn.functional.silu(h[:, : self.I]) * h[:, self.I :]
        y = torch._grouped_mm(a, self.w2.transpose(1, 2), offs=offs)
        valid = (key[order] < self.E).unsqueeze(1)
        wsorted = topk_weights.reshape(-1)[order].unsqueeze(1).to(torch.float32)
        y = torch.where(valid, y.float() * wsorted, 0.0)
        out = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
        out.index_add_(0, order // k, y)
        return out.to(torch.bfloat16)
