"""Expert weights in the kernel layout, and the input checks both launchers share.

:class:`PreparedMoEWeights` is built once at load time (``layout.py`` describes the layout) and
read by both kernel paths: ``decode.launch.fused_moe_nvfp4`` and
``prefill.launch.fused_moe_nvfp4_prefill``. :func:`validate_moe_inputs` is their common argument
check. Imports no launcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.layout import KernelMatrix, prepare_w2, prepare_w13
from sglang_fp4ext.moe.shape import MoEShape
from sglang_fp4ext.moe.weights import MoEWeights

__all__ = ["PreparedMoEWeights", "validate_moe_inputs", "w4a4_twin_weights"]


@dataclass(frozen=True, eq=False)
class PreparedMoEWeights:
    """Expert weights in the kernel layout (``layout.py``), built once at load time."""

    w13: KernelMatrix  # (E, 2I) gate/up rows interleaved, K = H
    w2: KernelMatrix  # (E, H), K = I
    # Static activation scales of the W4A4 path, (1,) fp32 on the device (None: W4A16 only):
    # the max over the layer's experts, one quantization of each GEMM input per token, as
    # SGLang's NVFP4 MoE backends do (its twin: ``w4a4_twin_weights``).
    w13_input_scale: torch.Tensor | None = None
    w2_input_scale: torch.Tensor | None = None
    # Expert-parallel ranks of the layer (``MoEShape.ep``): sizes tiles, never the math.
    ep_size: int = 1

    @classmethod
    def from_moe_weights(cls, w: MoEWeights, ep_size: int = 1) -> PreparedMoEWeights:
        def one(s):
            return None if s is None else s.float().amax().reshape(1).contiguous()

        return cls(
            prepare_w13(w.w13, w.w13_scale, w.w13_scale_2),
            prepare_w2(w.w2, w.w2_scale, w.w2_scale_2),
            one(w.w13_input_scale),
            one(w.w2_input_scale),
            ep_size,
        )

    @property
    def has_input_scales(self) -> bool:
        return self.w13_input_scale is not None and self.w2_input_scale is not None

    @property
    def num_experts(self) -> int:
        return self.w13.num_experts

    @property
    def hidden_size(self) -> int:
        return self.w13.k

    @property
    def intermediate_size(self) -> int:
        return self.w13.n // 2

    @property
    def device(self) -> torch.device:
        return self.w13.q.device

    def shape(self, top_k: int) -> MoEShape:
        return MoEShape(
            self.num_experts, self.hidden_size, self.intermediate_size, top_k, self.ep_size
        )

    def nbytes_per_expert(self) -> int:
        """Bytes streamed per active expert (both projections, padding included)."""
        return self.w13.nbytes_per_expert() + self.w2.nbytes_per_expert()

    def to(self, device) -> PreparedMoEWeights:
        def mv(s):
            return None if s is None else s.to(device)

        return PreparedMoEWeights(
            self.w13.to(device),
            self.w2.to(device),
            mv(self.w13_input_scale),
            mv(self.w2_input_scale),
            self.ep_size,
        )


def w4a4_twin_weights(w: MoEWeights) -> MoEWeights:
    """``w`` with every expert's input scales set to the layer max: what the W4A4 kernels
    quantize with (``PreparedMoEWeights.from_moe_weights``), for ``fused_moe_nvfp4_torch(...,
    quantize_activations=True)``."""
    import dataclasses

    E = w.w13.shape[0]
    return dataclasses.replace(
        w,
        w13_input_scale=w.w13_input_scale.float().amax().expand(E).contiguous(),
        w2_input_scale=w.w2_input_scale.float().amax().expand(E).contiguous(),
    )


def validate_moe_inputs(op: str, x, weights, topk_ids, topk_weights, out) -> None:
    """Input checks shared by the dispatcher and both launchers (``op`` prefixes the errors): the
    weights' type, then every shape, then dtypes, layout and devices, so the first error names
    the first thing wrong. Ids are not checked: one ``< 0`` or ``>= E`` contributes nothing."""

    def fail(msg: str):
        raise ValueError(f"{op}: {msg}")

    if not isinstance(weights, PreparedMoEWeights):
        raise TypeError(
            f"{op}: weights must be PreparedMoEWeights (build it once with "
            f"PreparedMoEWeights.from_moe_weights(moe_weights)), got {type(weights).__name__}"
        )
    for name, t in (("hidden_states", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            fail(f"{name} must be 2-D, got shape {tuple(t.shape)}")
    if x.dtype != torch.bfloat16:
        fail(f"hidden_states must be bfloat16, got {x.dtype}")
    if x.shape[1] != weights.hidden_size:
        fail(
            f"hidden_states has H={x.shape[1]} but the weights have hidden size "
            f"{weights.hidden_size}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64):
        fail(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        fail(f"topk_weights must be float32, bfloat16 or float16, got {topk_weights.dtype}")
    if topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        fail(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must "
            f"both be (T, top_k) with T={x.shape[0]} tokens"
        )
    if topk_ids.shape[1] < 1:
        fail("top_k must be >= 1")
    for name, t in (("hidden_states", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if not t.is_contiguous():
            fail(f"{name} must be contiguous")
    dev = weights.device
    for name, t in (("hidden_states", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != dev:
            fail(f"{name} is on {t.device} but the weights are on {dev}")
    if dev.type != "cuda" and not target_info.is_interpreter():
        fail(
            f"tensors must be on a CUDA device (got {dev}); CPU runs only under TRITON_INTERPRET=1"
        )
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16:
            fail("out must be a bfloat16 tensor")
        if tuple(out.shape) != tuple(x.shape) or not out.is_contiguous() or out.device != dev:
            fail(
                f"out must be contiguous {tuple(x.shape)} on {dev}, "
                f"got {tuple(out.shape)} on {out.device}"
            )
