"""Synthetic NVFP4 MoE layers: random weight packs and the static activation scales ModelOpt would
calibrate for them. The first-use self-check runs every kernel on one, and the tuner and the
benchmarks time them (``bench``); nothing here reads a checkpoint.
"""

from __future__ import annotations

import torch

from sglang_fp4ext.moe.weights import MoEWeights
from sglang_fp4ext.nvfp4.format import E2M1_MAX, E4M3_MAX

__all__ = ["random_packed_weights", "calibrate_input_scales"]


def random_packed_weights(E: int, H: int, I: int, *, device, generator=None) -> MoEWeights:
    """Random NVFP4 pack made directly on ``device`` (GLM-5 sizes in milliseconds, not minutes).

    Codes are uniform over all 16 E2M1 values (rms 2.9); block scales are e4m3 of U(0.5, 1.5) and
    the globals ``1 / (2.9 sqrt(K))``, so dequantised weights have rms ~ 1/sqrt(K) like a trained
    layer and outputs stay O(1) for N(0, 1) inputs.
    """

    def codes(*shape):
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=generator)

    def scales(*shape):
        u = torch.rand(*shape, device=device, generator=generator) + 0.5
        return u.to(torch.float8_e4m3fn)

    def glob(K, *shape):
        jitter = torch.rand(*shape, device=device, generator=generator) * 0.2 + 0.9
        return jitter / (2.9 * K**0.5)

    return MoEWeights(
        w13=codes(E, 2 * I, H // 2),
        w13_scale=scales(E, 2 * I, H // 16),
        w13_scale_2=glob(H, E, 2),
        w2=codes(E, H, I // 2),
        w2_scale=scales(E, H, I // 16),
        w2_scale_2=glob(I, E),
    )


def calibrate_input_scales(
    weights: MoEWeights, x_calib: torch.Tensor, *, chunk: int = 8
) -> tuple[torch.Tensor, torch.Tensor]:
    """Static NVFP4 activation scales as ModelOpt calibrates them: ``amax / (448 * 6)`` of the
    GEMM1 input (one value for all experts: SGLang takes the max anyway) and, per expert, of the
    GEMM2 input ``silu(gate) * up`` with every calibration token sent to every expert.
    Returns ``(w13_input_scale (E,), w2_input_scale (E,))`` fp32."""
    E = weights.num_experts
    I = weights.intermediate_size
    x = x_calib.float()
    amax2 = torch.empty(E, dtype=torch.float32, device=x.device)
    for lo in range(0, E, chunk):
        w13, _ = weights.dequantize_experts(range(lo, min(E, lo + chunk)))
        h = torch.einsum("th,enh->etn", x, w13)
        a = torch.nn.functional.silu(h[..., :I]) * h[..., I:]
        amax2[lo : lo + w13.shape[0]] = a.abs().amax(dim=(1, 2))
    denom = E4M3_MAX * E2M1_MAX
    s1 = (x.abs().amax() / denom).expand(E).contiguous()
    return s1, (amax2 / denom).clamp_min(torch.finfo(torch.float32).tiny)
