"""GLM-5 per-GPU cases for the GPU tier, shared by the decode and prefill kernel tests.

``tp8_shared``: TP8 with the fused shared expert (E = 257, I = 256, top_k = 8 + 1, id 256 last).
``ep8``: EP8, 32 local experts of 256 with full I = 2048; other ranks' ids are -1.
Weights are built once per process on the GPU (a few GB): ``weights(name)``.
"""

from __future__ import annotations

import torch

from sglang_fp4ext.bench import random_packed_weights
from sglang_fp4ext.bench.layer import make_routing
from sglang_fp4ext.model_shapes import preset
from sglang_fp4ext.moe.prepared import PreparedMoEWeights

NAMES = ("tp8_shared", "ep8")
H = 6144
_CACHE: dict = {}


def weights(name: str):
    """``(MoEWeights, PreparedMoEWeights)`` on the GPU, cached per process."""
    if name not in _CACHE:
        g = torch.Generator(device="cuda").manual_seed(7)
        E, I = (257, 256) if name == "tp8_shared" else (32, 2048)
        w = random_packed_weights(E, H, I, device="cuda", generator=g)
        ep = 1 if name == "tp8_shared" else preset("glm5-ep8").ep  # as SGLang's layer gives it
        _CACHE[name] = (w, PreparedMoEWeights.from_moe_weights(w, ep))
    return _CACHE[name]


def inputs(name: str, T: int, g: torch.Generator):
    """Fresh ``(x bf16 (T, H), topk_ids int32, topk_weights fp32)`` for ``T`` tokens."""
    if name == "tp8_shared":
        ids, tw, _ = make_routing(preset("glm5-tp8"), T, device="cuda", generator=g)
        ids = torch.cat([ids, torch.full((T, 1), 256, dtype=torch.int32, device="cuda")], 1)
        tw = torch.cat([tw, torch.rand(T, 1, device="cuda", generator=g)], 1)
    else:
        ids, tw, _ = make_routing(preset("glm5-ep8"), T, device="cuda", generator=g)
    x = torch.randn(T, H, device="cuda", generator=g).to(torch.bfloat16)
    return x, ids.contiguous(), tw.contiguous()


#: Routings the uniform draw never makes (``adversarial``).
ADVERSARIAL = ("same_experts", "zipf", "duplicates", "out_of_range", "all_dropped")
#: Shapes without a tuned table (the heuristic runs): DeepSeek-R1 TP8 and Qwen3-30B-A3B on one
#: GPU, ``(E, H, I)``.
OTHER_SHAPES = {"dsr1_tp8": (256, 7168, 256), "qwen3_30b": (128, 2048, 768)}


def other_shape_case(name: str, T: int, seed: int, device="cuda"):
    """``(MoEWeights, PreparedMoEWeights, x, topk_ids, topk_weights)`` of ``OTHER_SHAPES[name]``
    for ``T`` tokens, top-8 of distinct experts, fresh from ``seed``."""
    from sglang_fp4ext.bench import random_packed_weights

    E, H, I = OTHER_SHAPES[name]
    g = torch.Generator(device=device).manual_seed(seed)
    w = random_packed_weights(E, H, I, device=device, generator=g)
    pw = PreparedMoEWeights.from_moe_weights(w)
    ids = torch.rand(T, E, device=device, generator=g).topk(8, dim=1).indices.to(torch.int32)
    tw = torch.rand(T, 8, device=device, generator=g)
    x = torch.randn(T, H, device=device, generator=g).to(torch.bfloat16)
    return w, pw, x, ids.contiguous(), tw


def adversarial(kind: str, T: int, E: int, k: int, g: torch.Generator):
    """Routings the uniform draw never makes (ids int32 (T, k))."""
    if kind == "same_experts":  # every token on the same k experts
        ids = torch.randperm(E, device="cuda", generator=g)[:k].repeat(T, 1)
    elif kind == "zipf":  # Zipf(1.2) expert popularity, k draws per token (repeats allowed)
        p = 1.0 / torch.arange(1, E + 1, device="cuda", dtype=torch.float64) ** 1.2
        ids = torch.multinomial(p.expand(T, E).contiguous(), k, replacement=True, generator=g)
    elif kind == "duplicates":  # the same expert twice within a token
        ids = torch.randint(0, E, (T, k), device="cuda", generator=g)
        ids[:, 1] = ids[:, 0]
    elif kind == "out_of_range":  # ids >= E (and -1) mixed with valid ones: contribute nothing
        ids = torch.randint(-1, 2 * E, (T, k), device="cuda", generator=g)
    elif kind == "all_dropped":
        ids = torch.full((T, k), -1, device="cuda")
    else:
        raise ValueError(kind)
    return ids.to(torch.int32).contiguous()
