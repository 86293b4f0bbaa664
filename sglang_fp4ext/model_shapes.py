"""The model registry: every model and layout fp4ext knows, defined once.

:class:`MoEModel` holds a model's global MoE facts (from a Hugging Face ``config.json``, or the
sourced :data:`MODELS`: GLM-5, DeepSeek-R1, Qwen3-Coder-480B). :class:`ModelShape` is one of them
as one GPU sees it under a layout (TP, EP, shared-expert fusion); :data:`PRESETS` names the layouts
that ``fp4ext bench``, ``fp4ext tune``, the capture policy and the benchmarks run (GLM-5 TP8 as
NVIDIA's NVFP4 checkpoints serve it, TP8 with the fused shared expert, EP8; DeepSeek-R1 and
Qwen3-Coder-480B NVFP4 TP8). The kernels' own per-rank key is ``moe.shape.MoEShape``.

Bytes, FLOPs and expected distinct experts of a shape come from ``roofline.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_fp4ext.roofline import (
    bytes_floor,
    expected_distinct_experts,
    moe_flops,
    nvfp4_expert_bytes,
)
from sglang_fp4ext.shared_fusion import checkpoint_quant, shared_expert_excluded

__all__ = ["GLM5", "MODELS", "PRESETS", "MoEModel", "ModelShape", "preset"]


@dataclass(frozen=True)
class MoEModel:
    """The MoE facts of a model that the policy and its description need (global, unsharded),
    and those of its checkpoint that decide SGLang's shared-expert fusion (``shared_fusion``):
    the Hugging Face architecture, SGLang's quantization name and whether that quantization
    leaves the shared expert out (BF16 beside NVFP4 routed experts)."""

    name: str
    n_routed_experts: int
    top_k: int
    n_shared_experts: int
    hidden_size: int
    moe_intermediate_size: int
    use_mla: bool
    architecture: str = ""
    quantization: str | None = None
    shared_expert_excluded: bool = False

    def __post_init__(self):
        for f in ("n_routed_experts", "top_k", "hidden_size", "moe_intermediate_size"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"MoEModel.{f} must be a positive int, got {getattr(self, f)!r}")
        if self.top_k > self.n_routed_experts:
            raise ValueError(
                f"MoEModel.top_k={self.top_k} exceeds n_routed_experts={self.n_routed_experts}"
            )

    @classmethod
    def from_hf_config(
        cls,
        cfg: Mapping[str, Any],
        name: str | None = None,
        hf_quant_config: Mapping[str, Any] | None = None,
    ) -> MoEModel:
        """From a Hugging Face ``config.json`` dict (DeepSeek/GLM/Qwen MoE key names) and, for a
        ModelOpt checkpoint that has one, its ``hf_quant_config.json`` dict."""

        def pick(*keys, default=None):
            for k in keys:
                if cfg.get(k) is not None:
                    return cfg[k]
            if default is not None:
                return default
            raise ValueError(f"model config has none of {keys}: not an MoE config?")

        arch = (cfg.get("architectures") or [cfg.get("model_type", "model")])[0]
        quantization, exclude = checkpoint_quant(cfg, hf_quant_config)
        return cls(
            name=name or arch,
            n_routed_experts=int(pick("n_routed_experts", "num_experts", "num_local_experts")),
            top_k=int(pick("num_experts_per_tok", "moe_topk")),
            n_shared_experts=int(pick("n_shared_experts", "num_shared_experts", default=0)),
            hidden_size=int(pick("hidden_size")),
            moe_intermediate_size=int(pick("moe_intermediate_size", "intermediate_size")),
            use_mla=cfg.get("kv_lora_rank") is not None,
            architecture=str((cfg.get("architectures") or [""])[0]),
            quantization=quantization,
            shared_expert_excluded=shared_expert_excluded(quantization, exclude),
        )


#: GLM-5 (zai-org/GLM-5-FP8 config.json): 256 routed experts, top-8, 1 shared, hidden 6144,
#: expert FFN 2048, MLA attention, layers 3-77 MoE; as NVIDIA's GLM-5.x-NVFP4 checkpoints ship
#: it, with only the routed experts NVFP4 (the shared expert BF16, so SGLang does not fuse it).
GLM5 = MoEModel("glm-5", 256, 8, 1, 6144, 2048, True, "GlmMoeDsaForCausalLM", "modelopt_fp4", True)
DEEPSEEK_R1 = MoEModel("deepseek-r1", 256, 8, 1, 7168, 2048, True, "DeepseekV3ForCausalLM")
QWEN3_CODER_480B = MoEModel("qwen3-coder-480b", 160, 8, 0, 6144, 2560, False, "Qwen3MoeForCausalLM")
MODELS: dict[str, MoEModel] = {m.name: m for m in (GLM5, DEEPSEEK_R1, QWEN3_CODER_480B)}


@dataclass(frozen=True)
class ModelShape:
    """An MoE layer as one GPU sees it.

    ``tp``: MoE tensor parallel, every rank holds all experts with ``I/tp``. ``ep``: expert
    parallel, every rank holds ``E/ep`` experts with full ``I`` (SGLang gives non-local slots
    id ``-1``). ``fuse_shared``: SGLang's shared-expert fusion under TP, which appends the shared
    expert(s) as extra local experts chosen by every token (GLM-5 TP8: E=257, top_k=9), for a
    checkpoint that quantizes the shared expert like the routed ones (NVIDIA's GLM-5 NVFP4 builds
    do not: E=256, top_k=8); SGLang turns fusion off under EP>1 on CUDA, where the shared expert
    is a separate MLP, not counted.
    """

    name: str
    n_experts: int  # routed experts in the model (E)
    top_k: int  # routed experts per token (k)
    hidden: int  # H
    moe_intermediate: int  # full per-expert FFN width before TP sharding
    n_moe_layers: int
    n_shared: int = 0
    tp: int = 1
    ep: int = 1
    fuse_shared: bool = False
    source: str = ""
    model: str = ""  # its MODELS name, for the presets

    def __post_init__(self):
        if self.tp < 1 or self.ep < 1 or (self.tp > 1 and self.ep > 1):
            raise ValueError(
                f"{self.name}: need tp >= 1, ep >= 1, not both > 1 (tp={self.tp}, ep={self.ep})"
            )
        if self.n_experts % self.ep:
            raise ValueError(
                f"{self.name}: n_experts={self.n_experts} not divisible by ep={self.ep}"
            )
        if self.moe_intermediate % self.tp:
            raise ValueError(
                f"{self.name}: moe_intermediate={self.moe_intermediate} not divisible by "
                f"tp={self.tp}"
            )
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"{self.name}: need 1 <= top_k <= n_experts")
        if self.fuse_shared and (self.n_shared < 1 or self.ep > 1):
            raise ValueError(f"{self.name}: fuse_shared needs n_shared >= 1 and ep == 1")
        nvfp4_expert_bytes(self.hidden, self.I_local)  # validates NVFP4 divisibility

    @classmethod
    def of(cls, model: MoEModel, name: str, n_moe_layers: int, **layout) -> ModelShape:
        """``model`` under ``layout`` (``tp``, ``ep``, ``fuse_shared``, ``source``)."""
        return cls(name, model.n_routed_experts, model.top_k, model.hidden_size,
                   model.moe_intermediate_size, n_moe_layers, n_shared=model.n_shared_experts,
                   model=model.name, **layout)  # fmt: skip

    @property
    def E_local(self) -> int:
        """Experts in this rank's weight tensors (routed local + fused shared)."""
        return self.n_experts // self.ep + (self.n_shared if self.fuse_shared else 0)

    @property
    def I_local(self) -> int:
        return self.moe_intermediate // self.tp

    @property
    def top_k_local(self) -> int:
        """Ids per token in ``topk_ids`` (routed + fused shared)."""
        return self.top_k + (self.n_shared if self.fuse_shared else 0)

    @property
    def expert_bytes(self) -> int:
        return nvfp4_expert_bytes(self.hidden, self.I_local)

    def expected_distinct(self, tokens: int) -> float:
        """Expected experts one rank streams for ``tokens`` (EP: the per-rank mean)."""
        frac = expected_distinct_experts(tokens, self.n_experts, self.top_k) / self.n_experts
        shared = self.n_shared if (self.fuse_shared and tokens > 0) else 0
        return self.n_experts // self.ep * frac + shared

    def bytes_floor(self, n_distinct: float, *, tokens: int = 0) -> float:
        return bytes_floor(n_distinct, self.hidden, self.I_local, tokens=tokens)

    def flops(self, tokens: int) -> float:
        """FLOPs one rank does for one layer (EP: mean over ranks under uniform routing)."""
        return moe_flops(tokens, self.top_k_local, self.hidden, self.I_local) / self.ep


_GLM5_SRC = (
    "hardware-and-model.md §5 (https://huggingface.co/zai-org/GLM-5-FP8/blob/main/config.json: "
    "hidden 6144, 256 routed top-8, 1 shared, moe_intermediate_size 2048, layers 3-77 MoE) and §6"
)
_DSR1_SRC = (
    "https://huggingface.co/deepseek-ai/DeepSeek-R1/blob/main/config.json (hidden 7168, 256 routed "
    "top-8, 1 shared, moe_intermediate_size 2048, 61 layers, first_k_dense_replace 3; mirrored in "
    "github.com/zyzshishui/slime scripts/models/deepseek-v3.sh); NVFP4 checkpoint "
    "https://huggingface.co/nvidia/DeepSeek-R1-0528-NVFP4 (hardware-and-model.md §8.2)"
)
_QCODER_SRC = (
    "https://huggingface.co/Qwen/Qwen3-Coder-480B-A35B-Instruct (hidden 6144, 160 experts top-8, "
    "moe_intermediate_size 2560, 62 layers all MoE, no shared expert; mirrored in "
    "github.com/zyzshishui/miles scripts/models/qwen3-coder-480B-A35B.sh); NVFP4 checkpoint "
    "https://huggingface.co/nvidia/Qwen3-Coder-480B-A35B-Instruct-NVFP4"
)

PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        ModelShape.of(GLM5, "glm5-tp8", 75, tp=8, source=_GLM5_SRC),
        ModelShape.of(GLM5, "glm5-tp8-fused-shared", 75, tp=8, fuse_shared=True, source=_GLM5_SRC),
        ModelShape.of(GLM5, "glm5-ep8", 75, ep=8, source=_GLM5_SRC),
        ModelShape.of(DEEPSEEK_R1, "deepseek-r1-nvfp4-tp8", 58, tp=8, source=_DSR1_SRC),
        ModelShape.of(QWEN3_CODER_480B, "qwen3-coder-480b-nvfp4-tp8", 62, tp=8, source=_QCODER_SRC),
    )
}


def preset(name: str) -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"no model preset {name!r}; known: {sorted(PRESETS)}") from None
