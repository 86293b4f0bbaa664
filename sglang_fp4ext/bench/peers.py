"""Peer MoE implementations timed next to ours in the same run.

:class:`TorchGroupedMMMoE`: a bf16 MoE as a strong "no custom kernel" baseline. The NVFP4 pack is
dequantised once to bf16; a call sorts the (token, slot) pairs by expert, gathers the tokens,
runs ``torch._grouped_mm`` (one grouped GEMM per projection, ``offs`` = per-expert row ends) with
SiLU·mul between, and scatters the weighted rows back into the ``(T, H)`` output. Pairs with ids
< 0 sort last, outside every group, and are dropped. Everything is on-device (counts by
``index_add_``, no ``bincount``/``nonzero``), so it can be captured in a CUDA graph.
``torch._grouped_mm`` exists in torch 2.11 and 2.14 (bf16 needs sm_90+).

SGLang's own NVFP4 MoE backends, called through their public entry points with the weight
preparation SGLang 0.5.23 does for them (``srt/layers/quantization/modelopt_quant.py``,
``ModelOptNvFp4FusedMoEMethod.process_weights_after_loading`` / ``apply``):

* ``sglang-marlin`` (:class:`SGLangMarlinMoE`, W4A16, sm_80+): SGLang's
  ``prepare_moe_nvfp4_layer_for_marlin`` repack, then SGLang's ``fused_marlin_moe`` (its
  ``moe_wna16_marlin`` kernels are JIT-built through ``tvm_ffi``; ``sgl_kernel`` supplies the
  scalar types), as ``moe_runner/marlin.py`` calls it.
* ``sglang-flashinfer_cutlass`` (:class:`SGLangFlashInferCutlassMoE`, W4A4, Blackwell sm_100+):
  FlashInfer's ``flashinfer.fused_moe.cutlass_fused_moe`` with SGLang's arguments
  (``moe_runner/flashinfer_cutlass.py``): w13 rows ``[up; gate]`` (SGLang's loader puts up first
  for this backend), 128x4-swizzled block scales viewed as int32, per-expert alphas, a static
  activation scale calibrated here (``calibrate_input_scales``, ModelOpt's ``amax / (448 * 6)``).

Both take one global scale for gate and up (SGLang uses the gate column; ModelOpt exports share
one), so they run on :func:`shared_gate_up_scale` of the pack and expose that pack as
``.weights``: a correctness check compares them with the torch twin of ``.weights`` (W4A4 twin
for FlashInfer). Whether a peer can run here is :func:`sglang_peer_unavailable` (None, or the
reason: a module that does not import, no CUDA GPU, a GPU below the backend's architecture);
the suite collects every peer and skips those with their reason. Neither runs on the CPU CI box
nor on the H200 box (no SGLang there; FlashInfer's NVFP4 MoE needs Blackwell anyway), so their
call paths are only exercised where SGLang is installed on a GPU: this module says so rather
than substituting anything.

The third peer, ``triton_kernels-mxfp4`` (OpenAI's ``triton_kernels`` MXFP4 MoE, the Triton 3.8
API SGLang's ``triton_kernel`` backend calls), lives in ``bench/tk_peer.py`` (own availability
rule ``tk_availability.tk_peer_unavailable``, own oracle on its MXFP4 weights); it imports
triton_kernels only when built, so this module and the suite import where it is missing.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from sglang_fp4ext.moe.synthetic import calibrate_input_scales
from sglang_fp4ext.moe.weights import MoEWeights
from sglang_fp4ext.nvfp4.format import swizzle_blockscale

__all__ = [
    "SGLANG_PEERS",
    "PeerSpec",
    "SGLangFlashInferCutlassMoE",
    "SGLangMarlinMoE",
    "TorchGroupedMMMoE",
    "calibrate_input_scales",
    "has_grouped_mm",
    "make_sglang_peer",
    "peer_unavailable_reason",
    "sglang_peer_unavailable",
    "shared_gate_up_scale",
]


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


# ---- SGLang peers: availability ----------------------------------------------------------------


@dataclass(frozen=True)
class PeerSpec:
    """What one SGLang peer needs: importable ``modules`` and a CUDA GPU of at least
    ``min_capability``; ``entry_point`` is what a call runs (for reports)."""

    name: str
    modules: tuple[str, ...]
    min_capability: tuple[int, int]
    entry_point: str


SGLANG_PEERS: dict[str, PeerSpec] = {
    s.name: s
    for s in (
        PeerSpec(
            "sglang-flashinfer_cutlass",
            ("sglang", "flashinfer"),
            (10, 0),  # SGLang's NVFP4 MoE non-marlin backends require Blackwell
            "flashinfer.fused_moe.cutlass_fused_moe (NVFP4 W4A4), SGLang's weight preparation",
        ),
        PeerSpec(
            "sglang-marlin",
            ("sglang", "sgl_kernel", "tvm_ffi"),
            (8, 0),  # SGLang's marlin NVFP4 fallback covers SM80-SM90 (and runs on newer)
            "sglang fused_marlin_moe (NVFP4 W4A16) after prepare_moe_nvfp4_layer_for_marlin",
        ),
    )
}


def peer_unavailable_reason(
    spec: PeerSpec, missing: list[str] | tuple[str, ...], capability: tuple[int, int] | None
) -> str | None:
    """Why ``spec`` cannot run given the modules ``missing`` here and the GPU ``capability``
    (None: no CUDA GPU); None when it can."""
    if missing:
        return f"{spec.name}: {', '.join(missing)} not importable on this machine"
    if capability is None:
        return f"{spec.name}: no CUDA GPU on this machine"
    if tuple(capability) < spec.min_capability:
        need = "sm_{}{}".format(*spec.min_capability)
        have = "sm_{}{}".format(*capability)
        return f"{spec.name}: needs {need} or newer, this GPU is {have}"
    return None


def _missing_modules(modules) -> list[str]:
    missing = []
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(m)
    return missing


def sglang_peer_unavailable(name: str) -> str | None:
    """None when the SGLang peer ``name`` can run on this machine, else the reason."""
    from sglang_fp4ext import target_info

    try:
        spec = SGLANG_PEERS[name]
    except KeyError:
        raise KeyError(f"no SGLang peer {name!r}; known: {sorted(SGLANG_PEERS)}") from None
    return peer_unavailable_reason(
        spec, _missing_modules(spec.modules), target_info.device_capability()
    )


# ---- SGLang peers: weight preparation ----------------------------------------------------------


def shared_gate_up_scale(weights: MoEWeights) -> MoEWeights:
    """The pack with the up half's global scale set to the gate's (column 0), as ModelOpt exports
    it; SGLang's marlin and FlashInfer paths read only the gate column. Other tensors shared."""
    s2 = weights.w13_scale_2[:, :1].expand(-1, 2).contiguous()
    return dataclasses.replace(weights, w13_scale_2=s2)


class SGLangMarlinMoE:
    """SGLang's NVFP4 marlin MoE (W4A16) on ``shared_gate_up_scale(weights)`` (``.weights``)."""

    name = "sglang-marlin"
    w4a4 = False  # bf16 activations

    def __init__(self, weights: MoEWeights):
        from sglang.srt.layers.moe.fused_moe_triton.fused_marlin_moe import fused_marlin_moe
        from sglang.srt.layers.quantization.marlin_utils import marlin_make_workspace
        from sglang.srt.layers.quantization.marlin_utils_fp4 import (
            prepare_moe_nvfp4_layer_for_marlin,
        )

        self._fused, self._workspace = fused_marlin_moe, marlin_make_workspace
        self.weights = w = shared_gate_up_scale(weights)

        def param(t):
            return torch.nn.Parameter(t.contiguous(), requires_grad=False)

        # The attributes prepare_moe_nvfp4_layer_for_marlin reads from SGLang's FusedMoE layer,
        # after ModelOpt's process_weights_after_loading collapsed w13_weight_scale_2 to 1-D.
        layer = torch.nn.Module()
        layer.w13_weight, layer.w2_weight = param(w.w13), param(w.w2)
        layer.w13_weight_scale, layer.w2_weight_scale = (param(w.w13_scale), param(w.w2_scale))
        layer.w13_weight_scale_2 = param(w.w13_scale_2[:, 0])
        layer.w2_weight_scale_2 = param(w.w2_scale_2)
        layer.moe_runner_config = SimpleNamespace(is_gated=True)
        layer.intermediate_size_per_partition = w.intermediate_size
        layer.params_dtype = torch.bfloat16
        prepare_moe_nvfp4_layer_for_marlin(layer, group_size=16)
        self.layer = layer

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        L = self.layer
        # Per call, as moe_runner/marlin.py does: a graph must not alias the reduction locks.
        workspace = self._workspace(x.device, max_blocks_per_sm=4)
        return self._fused(
            hidden_states=x,
            w1=L.w13_weight,
            w2=L.w2_weight,
            w1_scale=L.w13_weight_scale,
            w2_scale=L.w2_weight_scale,
            gating_output=topk_weights,  # read only for its row count (router logits in SGLang)
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            w1_global_scale=L.w13_weight_scale_2,
            w2_global_scale=L.w2_weight_scale_2,
            workspace=workspace,
            num_bits=4,
            is_k_full=True,
            inplace=False,
        )


class SGLangFlashInferCutlassMoE:
    """FlashInfer's CUTLASS NVFP4 MoE (W4A4) as SGLang's ``flashinfer_cutlass`` backend calls it,
    on ``shared_gate_up_scale(weights)`` with calibrated input scales (``.weights``).

    EP: ``ep_size`` ranks, this is rank 0; a -1 id (another rank's expert) becomes the global id
    ``E_local`` (rank 1's first expert), which FlashInfer skips as SGLang's global ids are.
    """

    name = "sglang-flashinfer_cutlass"
    w4a4 = True  # activations quantised to NVFP4 with the calibrated static scales

    def __init__(self, weights: MoEWeights, x_calib: torch.Tensor, *, ep_size: int = 1):
        from flashinfer.fused_moe import cutlass_fused_moe

        self._moe = cutlass_fused_moe
        s1, s2 = calibrate_input_scales(weights, x_calib)
        w = dataclasses.replace(
            shared_gate_up_scale(weights), w13_input_scale=s1, w2_input_scale=s2
        )
        self.weights = w
        self.E, self.ep_size = w.num_experts, ep_size
        I = w.intermediate_size

        def up_first(t):  # [gate; up] rows -> [up; gate] (load_up_proj_weight_first)
            return torch.cat([t[:, I:], t[:, :I]], dim=1).contiguous()

        self.w13 = up_first(w.w13).view(torch.long)
        self.w2 = w.w2.contiguous().view(torch.long)
        a1 = s1.max()  # SGLang: w13_input_scale.max() for this backend
        self.quant_scales = [
            (1.0 / a1).float(),
            swizzle_blockscale(up_first(w.w13_scale)).view(torch.int32),
            (a1 * w.w13_scale_2[:, 0]).float(),
            (1.0 / s2).float(),
            swizzle_blockscale(w.w2_scale).view(torch.int32),
            (s2 * w.w2_scale_2).float(),
        ]

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        ids = topk_ids.to(torch.int32)
        if self.ep_size > 1:
            ids = torch.where(ids < 0, self.E, ids)
        out = torch.empty_like(x)
        return self._moe(
            input=x,
            token_selected_experts=ids,
            token_final_scales=topk_weights.float(),
            fc1_expert_weights=self.w13,
            fc2_expert_weights=self.w2,
            output_dtype=torch.bfloat16,
            quant_scales=self.quant_scales,
            # The weights are this rank's shard already: TP needs no slicing here.
            ep_size=self.ep_size,
            ep_rank=0,
            output=out,
        )[0]


def make_sglang_peer(name: str, weights: MoEWeights, *, x_calib: torch.Tensor, ep_size: int = 1):
    """Build the SGLang peer ``name``; raises RuntimeError with the reason where it cannot run."""
    reason = sglang_peer_unavailable(name)
    if reason is not None:
        raise RuntimeError(reason)
    if name == "sglang-marlin":
        return SGLangMarlinMoE(weights)
    return SGLangFlashInferCutlassMoE(weights, x_calib, ep_size=ep_size)
