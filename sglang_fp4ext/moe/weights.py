"""The NVFP4 expert-weight pack, in SGLang's (stacked ModelOpt) layout.

This is the hand-off format between a checkpoint (or SGLang's loaded parameters) and everything
downstream: the torch reference MoE reads it directly; the kernels' layout preparation
(``moe/layout.py``) converts it once at load time. Shapes for ``E`` local experts, hidden size
``H`` and per-rank intermediate size ``I`` (NVFP4 packing and scales: ``nvfp4/format.py``):

==================  ==========================  ====================================================
field               shape, dtype                meaning
==================  ==========================  ====================================================
``w13``             (E, 2I, H/2) uint8          rows ``[gate (0:I); up (I:2I)]``, packed along H
``w13_scale``       (E, 2I, H/16) float8_e4m3fn row-major block scales (one per 16 elements of H)
``w13_scale_2``     (E, 2) float32              per-expert global scale, column 0 gate, 1 up
``w2``              (E, H, I/2) uint8           down projection, packed along I
``w2_scale``        (E, H, I/16) float8_e4m3fn  row-major block scales
``w2_scale_2``      (E,) float32                per-expert global scale
``w13_input_scale`` (E,) float32 or None        static activation scale of GEMM1 (W4A4 emulation)
``w2_input_scale``  (E,) float32 or None        static activation scale of GEMM2
==================  ==========================  ====================================================

Dequantised weight = ``e2m1(code) * float(block_scale) * scale_2`` (ModelOpt's rule).
ModelOpt's exports give gate and up one shared ``scale_2`` (both columns equal); the pack and
``quantize_moe_weights`` allow them to differ, the general case.
A fused shared expert is simply one more expert (the last one) in every tensor.

Helpers: ``MoEWeights.dequantize()`` (fp32 weights back), ``quantize_moe_weights`` (float
weights -> pack, per expert and per projection exactly as separate ModelOpt checkpoint tensors)
and ``random_moe_weights`` (realistic random experts with calibrated input scales, for tests and
benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..nvfp4.format import (
    E2M1_MAX,
    E4M3_MAX,
    dequantize_nvfp4,
    quantize_nvfp4,
    weight_global_scale,
)

__all__ = ["MoEWeights", "quantize_moe_weights", "random_moe_weights"]


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

    def to(self, device) -> MoEWeights:
        return MoEWeights(
            **{
                f.name: (
                    None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                )
                for f in fields(self)
            }
        )

    def dequantize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 weights ``(w13 (E, 2I, H), w2 (E, H, I))``; gate rows use ``w13_scale_2[:, 0]``,
        up rows ``w13_scale_2[:, 1]``."""
        return self.dequantize_experts(None)

    def dequantize_experts(self, experts=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like :meth:`dequantize` for a subset: ``experts`` is an int, a sequence/1-D tensor of
        expert indices, or None (all). Returns ``(w13 (n, 2I, H), w2 (n, H, I))`` fp32."""
        e_all = self.num_experts
        if experts is None:
            idx = torch.arange(e_all, device=self.device)
        else:
            idx = torch.as_tensor(experts, dtype=torch.long, device=self.device).reshape(-1)
            if idx.numel() and (idx.min() < 0 or idx.max() >= e_all):
                raise IndexError(f"expert index out of range [0, {e_all}): {idx.tolist()}")
        i = self.intermediate_size
        s2 = self.w13_scale_2[idx].float()
        # One global scale per row: gate rows (0:I) column 0, up rows (I:2I) column 1.
        row_s2 = torch.cat([s2[:, :1].expand(-1, i), s2[:, 1:2].expand(-1, i)], dim=1)
        w13 = dequantize_nvfp4(self.w13[idx], self.w13_scale[idx], row_s2)
        w2 = dequantize_nvfp4(self.w2[idx], self.w2_scale[idx], self.w2_scale_2[idx].float())
        return w13, w2


def _check_moe_float(w13: torch.Tensor, w2: torch.Tensor) -> tuple[int, int, int]:
    for name, t in (("w13", w13), ("w2", w2)):
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a floating-point tensor")
        if t.ndim != 3:
            raise ValueError(f"{name} must be 3-D, got shape {tuple(t.shape)}")
    e, two_i, h = w13.shape
    if two_i % 2:
        raise ValueError(f"w13 rows {two_i} must be even ([gate; up])")
    i = two_i // 2
    if tuple(w2.shape) != (e, h, i):
        raise ValueError(
            f"w2 shape {tuple(w2.shape)} does not match w13 {tuple(w13.shape)}: "
            f"expected {(e, h, i)}"
        )
    if h % 16 or i % 16:
        raise ValueError(f"hidden {h} and intermediate {i} must be multiples of 16 (NVFP4 blocks)")
    return e, h, i


def quantize_moe_weights(
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    w13_input_scale: torch.Tensor | None = None,
    w2_input_scale: torch.Tensor | None = None,
) -> MoEWeights:
    """Quantize float expert weights ``w13 (E, 2I, H)`` = [gate; up] and ``w2 (E, H, I)``.

    Each expert's gate, up and down projections are quantized as three separate tensors, each with
    its own global scale -- byte-identical to ``quantize_nvfp4`` on each checkpoint tensor (and so
    to ModelOpt). Optional input scales ``(E,)`` fp32 are attached as given.
    """
    e, _, i = _check_moe_float(w13, w2)
    gu = w13.reshape(e, 2, i, w13.shape[2])
    gs13 = weight_global_scale(gu, leading_dims=2)  # (E, 2): per expert, per gate/up
    p13, b13, _ = quantize_nvfp4(gu, gs13)
    gs2 = weight_global_scale(w2, leading_dims=1)  # (E,)
    p2, b2, _ = quantize_nvfp4(w2, gs2)
    for name, s in (("w13_input_scale", w13_input_scale), ("w2_input_scale", w2_input_scale)):
        if s is not None and tuple(s.shape) != (e,):
            raise ValueError(f"{name} must have shape ({e},), got {tuple(s.shape)}")
    return MoEWeights(
        w13=p13.reshape(e, 2 * i, -1),
        w13_scale=b13.reshape(e, 2 * i, -1),
        w13_scale_2=gs13,
        w2=p2,
        w2_scale=b2,
        w2_scale_2=gs2,
        w13_input_scale=None if w13_input_scale is None else w13_input_scale.float(),
        w2_input_scale=None if w2_input_scale is None else w2_input_scale.float(),
    )


def random_moe_weights(
    num_experts: int,
    hidden_size: int,
    intermediate_size: int,
    *,
    generator: torch.Generator | None = None,
    device="cpu",
    scale: float = 1.0,
    calib_tokens: int = 64,
) -> MoEWeights:
    """Random NVFP4 experts with realistic magnitudes and calibrated input scales.

    Weights are N(0, 1/K) times ``scale`` (K = each GEMM's reduction dim), so with N(0, 1)
    hidden states (or bf16 ones of that size) the gate/up outputs are O(1) and the MoE output
    O(0.1-1). Input scales are calibrated the way ModelOpt does it -- ``amax / (6 * 448)`` of each
    expert's inputs -- on ``calib_tokens`` fresh N(0, 1) tokens per expert, the GEMM2 input
    (``silu(gate) * up``) computed with the quantized weights.

    Everything is drawn and quantized on the generator's device (``device`` when no generator is
    given), ``_CHUNK`` experts at a time so GLM-5-sized sets stay within memory, then moved to
    ``device``. The same seeded generator gives the same weights on the same device.
    """
    e, h, i = num_experts, hidden_size, intermediate_size
    if e < 1 or h < 16 or i < 16:
        raise ValueError(f"need E >= 1, H >= 16, I >= 16; got E={e}, H={h}, I={i}")
    g = generator
    dev = g.device if g is not None else torch.device(device)
    parts = []
    for start in range(0, e, _CHUNK):
        n = min(_CHUNK, e - start)
        w13 = torch.randn(n, 2 * i, h, generator=g, device=dev) * (scale / h**0.5)
        w2 = torch.randn(n, h, i, generator=g, device=dev) * (scale / i**0.5)
        x = torch.randn(n, calib_tokens, h, generator=g, device=dev)
        packed = quantize_moe_weights(w13, w2)
        w13_q, _ = packed.dequantize()
        gate_up = torch.bmm(x, w13_q.transpose(1, 2))
        act = torch.nn.functional.silu(gate_up[..., :i]) * gate_up[..., i:]
        packed.w13_input_scale = x.abs().amax(dim=(1, 2)) / (E2M1_MAX * E4M3_MAX)
        packed.w2_input_scale = act.abs().amax(dim=(1, 2)) / (E2M1_MAX * E4M3_MAX)
        parts.append(packed.to(device))
    return MoEWeights(
        **{f.name: torch.cat([getattr(p, f.name) for p in parts]) for f in fields(MoEWeights)}
    )


# Experts drawn and quantized per step in random_moe_weights (bounds temporaries: GLM-5 TP8's
# 257 experts of 2x256x6144 fp32 would otherwise need ~5 GB at once, several times over).
_CHUNK = 16
