"""The MoE layer a timer replays: ``copies`` random NVFP4 copies of a model shape's per-rank layer
(``model_shapes.ModelShape``), prepared for the kernels, with uniform routing as rank 0 of the
layout sees it and inputs rotated beyond the L2. ``fp4ext tune`` times its candidates on one;
``bench.layer.Layer`` adds the steps and peers ``fp4ext bench`` times.
"""

from __future__ import annotations

import math

import torch

from sglang_fp4ext import roofline
from sglang_fp4ext.model_shapes import ModelShape

__all__ = ["TimedLayer", "make_routing"]


def make_routing(shape: ModelShape, tokens: int, *, device, generator=None):
    """Uniform top-k over the model's routed experts as rank 0 of the layout sees it.

    EP: ids of other ranks become -1. Fused shared expert(s) (TP): extra columns with the local
    ids after the routed ones, weight 1. Returns ``(topk_ids int32 (T, top_k_local), topk_weights
    fp32, distinct local experts)``.
    """
    scores = torch.rand(tokens, shape.n_experts, device=device, generator=generator)
    w, ids = scores.topk(shape.top_k, dim=1)
    w = w / w.sum(dim=1, keepdim=True)
    local = shape.n_experts // shape.ep
    ids = torch.where(ids < local, ids, -1)
    if shape.fuse_shared:
        shared = torch.arange(local, local + shape.n_shared, device=device).expand(tokens, -1)
        ids = torch.cat([ids, shared], dim=1)
        w = torch.cat([w, torch.ones(tokens, shape.n_shared, device=device)], dim=1)
    ids = ids.to(torch.int32).contiguous()
    return ids, w.float().contiguous(), roofline.distinct_experts(ids)


class TimedLayer:
    """``copies`` random NVFP4 copies of ``shape``'s per-GPU MoE layer on ``device`` (the GPU;
    the CPU tier uses the interpreter at a tiny shape), prepared for the kernels (``prepared``;
    the checkpoint-layout packs in ``packs``); inputs per token count.

    L2: at small T a call touches only a few experts (GLM-5 TP8, T = 1: 8 x 2.65 MB), so a few
    copies with one routing each would stay in a 60-128 MB L2 across replays. Each token count
    therefore gets ``n_inputs(T)`` = ``copies x rotations`` inputs (x, routing, output), input
    ``i`` on copy ``i % copies``, with rotations chosen so the bytes one pass touches exceed
    ``L2_FACTOR`` x the L2 size. It depends on the GPU and T only (expected, not measured,
    distinct experts), so a graph of one pass is the same from run to run.
    """

    L2_FACTOR = 3
    MAX_ROTATIONS = 16

    def __init__(
        self, shape: ModelShape, copies: int, *, seed: int = 2026, device="cuda", l2_bytes=None
    ):
        from sglang_fp4ext.moe.prepared import PreparedMoEWeights
        from sglang_fp4ext.moe.synthetic import random_packed_weights

        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        self.shape, self.copies, self.device = shape, copies, torch.device(device)
        if l2_bytes is None:
            l2_bytes = 0
            if self.device.type == "cuda":
                l2_bytes = torch.cuda.get_device_properties(self.device).L2_cache_size
        self.l2_bytes = l2_bytes
        self.seed = seed
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.packs = [
            random_packed_weights(
                shape.E_local, shape.hidden, shape.I_local, device=self.device, generator=self.gen
            )
            for _ in range(copies)
        ]
        self.prepared = [PreparedMoEWeights.from_moe_weights(p, shape.ep) for p in self.packs]
        self._inputs: dict[int, tuple] = {}

    def n_inputs(self, T: int) -> int:
        """Inputs rotated for ``T`` tokens (see the class docstring)."""
        per_call = self.shape.bytes_floor(self.shape.expected_distinct(T), tokens=T)
        want = self.L2_FACTOR * self.l2_bytes / (self.copies * max(per_call, 1.0))
        return self.copies * min(self.MAX_ROTATIONS, max(1, math.ceil(want)))

    def inputs(self, T: int):
        """``n_inputs(T)`` of: x (T, H) bf16 N(0, 1), routing, output; cached for the last T.

        Drawn from a generator seeded by (seed, T) alone, so a run times the same routings
        whichever token counts, presets or cases ran before it: a regression gate compares equal
        work. (Drawn from the shared stream, the H200 gate demo's EP8 T = 8 inputs hit 7.25
        distinct local experts per call against the baseline's 6.00 and read 12.8% slower with
        unchanged kernels; ``benchmarks/results/gate_demo_h200.log``.)
        """
        if T not in self._inputs:
            self._inputs.clear()
            g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + T)
            xs, routes, outs = [], [], []
            for _ in range(self.n_inputs(T)):
                x = torch.randn(T, self.shape.hidden, device=self.device, generator=g)
                xs.append(x.to(torch.bfloat16))
                routes.append(make_routing(self.shape, T, device=self.device, generator=g))
                outs.append(torch.empty_like(xs[-1]))
            self._inputs[T] = (xs, routes, outs)
        return self._inputs[T]
