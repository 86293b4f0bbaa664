"""fp4ext's weights for an SGLang NVFP4 MoE layer: :func:`process_weights` builds them from
SGLang's loaded ModelOpt parameters (and checks the layer's MoE config is one fp4ext serves),
:class:`Fp4ExtQuantInfo` is what the runner core reads per layer (:func:`quant_info_of`).

Called by ``sglang_backend.py``'s ``process_weights_after_loading`` hook and by its runner core
where SGLang delegates weight processing (patches/0001); imports SGLang at import time. With
``SGLANG_FP4EXT_TUNE_AT_START`` on, a layer's shape is tuned here, once its weights are ready and
before any capture (``capture_tune.py``).

Expert paths: ``triton`` on a CUDA GPU of SM80 or newer (the kernel layout; the checkpoint-layout
copies are freed), ``reference`` elsewhere (the checkpoint layout, fp32 torch reference);
announced once per process in the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.layers.moe.moe_runner.base import MoeQuantInfo

from sglang_fp4ext import target_info
from sglang_fp4ext.capture_tune import tune_served_shape
from sglang_fp4ext.moe.experts import expert_path, prepare_experts
from sglang_fp4ext.moe.weights import MoEWeights

__all__ = ["Fp4ExtQuantInfo", "process_weights", "quant_info_of"]

logger = logging.getLogger("sglang_fp4ext")

_ANNOUNCED: set[str] = set()


def _layer_name(layer) -> str:
    prefix = getattr(layer, "prefix", None) or getattr(layer, "_prefix", None)
    layer_id = getattr(layer, "layer_id", None)
    return prefix or f"layer_id={layer_id}"


def _announce(path: str, device: torch.device) -> None:
    if path in _ANNOUNCED:
        return
    _ANNOUNCED.add(path)
    if path == "triton":
        cap = target_info.device_capability(device)
        logger.info("fp4ext MoE layers run %s", target_info.kernel_path(cap))
    else:
        logger.warning(
            "fp4ext MoE layers on %s run the fp32 torch reference (no SM80+ CUDA GPU): correct "
            "but slow, meant for tests and bring-up",
            device,
        )


@dataclass
class Fp4ExtQuantInfo(MoeQuantInfo):
    """What the runner core needs for one layer: its weights and which path runs them."""

    path: str  # "triton" | "reference"
    weights: Any  # PreparedMoEWeights for triton, MoEWeights for reference
    ep_size: int = 1  # SGLang's moe_ep_size: sizes the kernels' tiles (MoEShape.ep)


def quant_info_of(layer) -> Fp4ExtQuantInfo:
    """The quant info ``process_weights`` stored on ``layer``; a clear error when it never ran."""
    info = getattr(layer, "_fp4ext_quant_info", None)
    if info is None:
        raise RuntimeError(
            f"fp4ext: MoE layer {_layer_name(layer)} runs before its weights were processed "
            "(process_weights_after_loading did not run through sglang_fp4ext)"
        )
    return info


def _check_supported(method, layer) -> None:
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    cfg = layer.moe_runner_config
    name = _layer_name(layer)
    a2a = get_moe_a2a_backend()
    if not a2a.is_none():
        raise NotImplementedError(
            f"fp4ext: MoE layer {name}: --moe-a2a-backend {a2a.value} is not supported; "
            "fp4ext serves the standard dispatcher (--moe-a2a-backend none) with --ep-size 1 or N"
        )
    if not cfg.is_gated or cfg.activation != "silu":
        raise NotImplementedError(
            f"fp4ext: MoE layer {name}: activation {cfg.activation!r} (gated={cfg.is_gated}) is "
            "not supported; fp4ext implements the gated SiLU MLP (SwiGLU) of GLM/DeepSeek/Qwen MoE"
        )
    if cfg.apply_router_weight_on_input:
        raise NotImplementedError(
            f"fp4ext: MoE layer {name}: apply_router_weight_on_input is not supported"
        )
    for knob in ("gemm1_alpha", "gemm1_clamp_limit", "swiglu_limit"):
        if getattr(cfg, knob, None) is not None:
            raise NotImplementedError(
                f"fp4ext: MoE layer {name}: {knob}={getattr(cfg, knob)} (clamped/scaled SwiGLU) is "
                "not supported"
            )


def _input_scales(layer, E: int) -> dict:
    """``w13_input_scale`` / ``w2_input_scale`` for ``MoEWeights``: the max over every expert
    SGLang loaded (it loads all ``Eg`` experts' scales on every rank, ``[Eg, 2]`` / ``[Eg]``), as
    its CUTLASS NVFP4 path takes one scalar per GEMM; none when the layer has no such params."""
    a, b = getattr(layer, "w13_input_scale", None), getattr(layer, "w2_input_scale", None)
    if a is None or b is None:
        return {}
    return dict(
        w13_input_scale=a.data.float().amax().expand(E).contiguous(),
        w2_input_scale=b.data.float().amax().expand(E).contiguous(),
    )


def process_weights(method, layer) -> None:
    """Build fp4ext's weights for ``layer`` from SGLang's loaded NVFP4 parameters.

    SGLang loads ModelOpt tensors into ``w13_weight (E, 2I, H/2)`` (rows gate then up: fp4ext's
    ``load_up_proj_weight_first`` is False), ``w13_weight_scale (E, 2I, H/16)`` row-major e4m3,
    ``w13_weight_scale_2 (E, 2)`` (gate, up), ``w2_*`` likewise; E = local experts (plus a fused
    shared expert), so EP needs no slicing. The static input scales (``_input_scales``) serve
    the W4A4 prefill path only.
    """
    _check_supported(method, layer)
    if getattr(layer, "inference_moe_w13_interleaved", False) and not getattr(
        layer, "_w13_deinterleaved", False
    ):
        from sglang.srt.layers.quantization.modelopt_quant import deinterleave_w13

        layer.w13_weight.data = deinterleave_w13(layer.w13_weight.data, up_first=False)
        layer.w13_weight_scale.data = deinterleave_w13(layer.w13_weight_scale.data, up_first=False)
        layer._w13_deinterleaved = True

    weights = MoEWeights(
        w13=layer.w13_weight.data,
        w13_scale=layer.w13_weight_scale.data,
        w13_scale_2=layer.w13_weight_scale_2.data.float().reshape(-1, 2),
        w2=layer.w2_weight.data,
        w2_scale=layer.w2_weight_scale.data,
        w2_scale_2=layer.w2_weight_scale_2.data.float().reshape(-1),
        **_input_scales(layer, layer.w13_weight.data.shape[0]),
    )
    device = weights.device
    path = expert_path(device)
    ep = int(layer.moe_ep_size)
    info = Fp4ExtQuantInfo(path=path, weights=prepare_experts(weights, path, ep), ep_size=ep)
    if path == "triton":
        # The kernel layout holds everything now: drop the checkpoint-layout copies.
        for name in ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale"):
            param = getattr(layer, name)
            param.data = torch.empty(0, dtype=param.dtype, device=device)
    # SGLang's CUTLASS path would swizzle into these; fp4ext never reads them (1/9 of the expert
    # bytes on GLM-5 until freed).
    for name in ("w13_blockscale_swizzled", "w2_blockscale_swizzled"):
        if getattr(layer, name, None) is not None:
            setattr(layer, name, None)
    layer.dispatcher.set_quant_config({"input_global_scale": None})
    layer._fp4ext_quant_info = info
    _announce(path, device)
    if path == "triton":
        # The ids per token the kernels see: SGLang's top-k appends a fused shared expert's column.
        cfg = layer.moe_runner_config
        top_k = cfg.top_k + (cfg.num_fused_shared_experts or 0)
        tune_served_shape(info.weights.shape(top_k), device)
