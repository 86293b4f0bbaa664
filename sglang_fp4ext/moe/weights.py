"""The NVFP4 expert-weight pack, in SGLang's (stacked ModelOpt) layout.

This is the hand-off format between a checkpoint (or SGLang's loaded parameters) and everything
downstream: the torch reference MoE reads it directly; the kernels' layout preparation
(``moe/layout.py``) converts it once at load time. Shapes for ``E`` local experts, hidden size
``H`` and per-rank intermediate size ``I`` (NVFP4 packing and scales: ``nvfp4/format.py``):

==================  ==========================  =====================================================
field               shape, dtype                meaning
==================  ==========================  =====================================================
``w13``             (E, 2I, H/2) uint8          rows ``[gate (0:I); up (I:2I)]``, packed along H
``w13_scale``       (E, 2I, H/16) float8_e4m3fn row-major block scales (one per 16 elements of H)
``w13_scale_2``     (E, 2) float32              per-expert global scale, column 0 gate, 1 up
``w2``              (E, H, I/2) uint8           down projection, packed along I
``w2_scale``        (E, H, I/16) float8_e4m3fn  row-major block scales
``w2_scale_2``      (E,) float32                per-expert global scale
``w13_input_scale`` (E,) float32 or None        static activation scale of GEMM1 (W4A4 emulation)
``w2_input_scale``  (E,) float32 or None        static activation scale of GEMM2
==================  ==========================  =====================================================

Dequantised weight = ``e2m1(code) * float(block_scale) * scale_2`` (ModelOpt's rule).
A fused shared expert is simply one more expert (the last one) in every tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["MoEWeights"]


@dataclass
class MoEWeights:
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_scale_2: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_scale_2: torch.Tensor
    w13_input_scale: torch.Tensor | None = None
    w2_input_scale: torch.Tensor | None = None

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.w13.shape[2] * 2

    @property
    def intermediate_size(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def device(self) -> torch.device:
        return self.w13.device

    def to(self, device) -> "MoEWeights":
        return MoEWeights(
            **{
                f.name: (None if getattr(self, f.name) is None else getattr(self, f.name).to(device))
                for f in fields(self)
            }
        )
