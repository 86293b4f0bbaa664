"""Benchmark helpers shared by ``benchmarks/run_decode.py`` and the pytest-benchmark suite.

* ``timing.py``: CUDA-graph replay timer with weights rotated over layer copies (L2-cold) and the
  device-to-device copy bandwidth, measured in the same run.
* ``peers.py``: the torch bf16 grouped-GEMM MoE peer (``torch._grouped_mm`` on sorted tokens).
* here: the GLM-5 per-GPU shapes and routings (random NVFP4 packs: ``moe.synthetic``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_fp4ext.moe.synthetic import random_packed_weights

__all__ = [
    "BenchShape",
    "GLM5_TP8",
    "GLM5_EP8",
    "SHAPES",
    "random_packed_weights",
    "uniform_routing",
    "nvfp4_bytes_per_expert",
]


@dataclass(frozen=True)
class BenchShape:
    """One GPU's MoE layer: ``E_local`` experts of ``E_global`` (EP keeps ids < E_local, others
    become -1), hidden ``H``, per-rank intermediate ``I``, routed ``top_k``."""

    name: str
    E_global: int
    E_local: int
    H: int
    I: int
    top_k: int

    @property
    def ep(self) -> int:
        """Expert-parallel ranks (``PreparedMoEWeights.ep_size``)."""
        return self.E_global // self.E_local


GLM5_TP8 = BenchShape("glm5_tp8", E_global=256, E_local=256, H=6144, I=256, top_k=8)
GLM5_EP8 = BenchShape("glm5_ep8", E_global=256, E_local=32, H=6144, I=2048, top_k=8)
SHAPES = {s.name: s for s in (GLM5_TP8, GLM5_EP8)}


def nvfp4_bytes_per_expert(H: int, I: int) -> int:
    """Checkpoint bytes one expert streams: E2M1 codes (3HI/2), e4m3 scales (3HI/16), 3 fp32."""
    return 3 * H * I // 2 + 3 * H * I // 16 + 3 * 4


def uniform_routing(T: int, shape: BenchShape, *, device, generator=None):
    """Uniform top-k over the global experts; ids of other EP ranks become -1 (this is rank 0).

    Returns (topk_ids int32 (T, k), topk_weights fp32 (T, k), distinct local experts).
    """
    scores = torch.rand(T, shape.E_global, device=device, generator=generator)
    w, ids = scores.topk(shape.top_k, dim=1)
    ids = torch.where(ids < shape.E_local, ids, -1).to(torch.int32)
    w = (w / w.sum(dim=1, keepdim=True)).float()
    local = ids[ids >= 0]
    distinct = int(torch.unique(local).numel()) if local.numel() else 0
    return ids.contiguous(), w.contiguous(), distinct
