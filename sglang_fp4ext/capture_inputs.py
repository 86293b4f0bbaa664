"""What the capture policy is computed from: the model's MoE facts and the server's layout.

:class:`MoEModel` (from a Hugging Face ``config.json``, or the :data:`PRESETS`) and the frozen
:class:`PolicyInputs` that ``capture_policy.compute_policy`` reads (``eval(repr(x)) == x``),
including the per-rank MoE shape the kernels see. Imports no SGLang.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_fp4ext.moe.shape import FUSED_SHARED_ROUTED_EXPERTS, MoEShape

__all__ = ["GLM5", "PRESETS", "MoEModel", "PolicyInputs"]


@dataclass(frozen=True)
class MoEModel:
    """The MoE facts of a model that the policy and its description need (global, unsharded)."""

    name: str
    n_routed_experts: int
    top_k: int
    n_shared_experts: int
    hidden_size: int
    moe_intermediate_size: int
    use_mla: bool

    def __post_init__(self):
        for f in ("n_routed_experts", "top_k", "hidden_size", "moe_intermediate_size"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"MoEModel.{f} must be a positive int, got {getattr(self, f)!r}")
        if self.top_k > self.n_routed_experts:
            raise ValueError(
                f"MoEModel.top_k={self.top_k} exceeds n_routed_experts={self.n_routed_experts}"
            )

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], name: str | None = None) -> MoEModel:
        """From a Hugging Face ``config.json`` dict (DeepSeek/GLM/Qwen MoE key names)."""

        def pick(*keys, default=None):
            for k in keys:
                if cfg.get(k) is not None:
                    return cfg[k]
            if default is not None:
                return default
            raise ValueError(f"model config has none of {keys}: not an MoE config?")

        arch = (cfg.get("architectures") or [cfg.get("model_type", "model")])[0]
        return cls(
            name=name or arch,
            n_routed_experts=int(pick("n_routed_experts", "num_experts", "num_local_experts")),
            top_k=int(pick("num_experts_per_tok", "moe_topk")),
            n_shared_experts=int(pick("n_shared_experts", "num_shared_experts", default=0)),
            hidden_size=int(pick("hidden_size")),
            moe_intermediate_size=int(pick("moe_intermediate_size", "intermediate_size")),
            use_mla=cfg.get("kv_lora_rank") is not None,
        )


#: GLM-5 (hardware-and-model.md section 5): 256 routed experts, top-8, 1 shared, hidden 6144,
#: expert FFN 2048, MLA attention.
GLM5 = MoEModel("glm-5", 256, 8, 1, 6144, 2048, True)
PRESETS: dict[str, MoEModel] = {"glm-5": GLM5}


@dataclass(frozen=True)
class PolicyInputs:
    """Everything :func:`compute_policy` reads. ``eval(repr(x)) == x``.

    ``decode_max_bs``: the largest decode graph (SGLang's resolved ``decode.max_bs``; its memory
    default is already clamped to ``max_running_requests``). ``prefill_max_tokens``: the largest
    prefill bucket (resolved ``prefill.max_bs``: ``chunked_prefill_size``, at most 8192 for MLA).
    ``tokens_per_req``: MoE rows per decode request (1, or the draft tokens verified per request
    under speculative decoding). ``prefill_budget_mb``: graph memory allowed for prefill buckets
    (None: unbounded). ``dp_attention``: DP attention gathers every rank's padded slot into the
    MoE, where SGLang has no real-row prefix to mask (``moe_num_token_non_padded()`` is None).
    """

    model: MoEModel
    tp: int
    ep: int
    decode_max_bs: int
    prefill_max_tokens: int
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    tokens_per_req: int = 1
    prefill_budget_mb: float | None = None
    dp_attention: bool = False

    def __post_init__(self):
        for f in ("tp", "ep", "decode_max_bs", "prefill_max_tokens", "tokens_per_req"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"PolicyInputs.{f} must be a positive int, got {v!r}")
        if self.tp % self.ep:
            raise ValueError(f"PolicyInputs: ep={self.ep} must divide tp={self.tp}")
        if self.model.n_routed_experts % self.ep:
            raise ValueError(
                f"PolicyInputs: ep={self.ep} must divide the {self.model.n_routed_experts} "
                "routed experts"
            )
        if self.prefill_budget_mb is not None and not self.prefill_budget_mb > 0:
            raise ValueError(
                f"PolicyInputs.prefill_budget_mb must be > 0 or None, got {self.prefill_budget_mb!r}"
            )

    @property
    def fused_shared_expert(self) -> bool:
        """Whether SGLang is expected to fuse the shared expert into the MoE (one shared expert,
        ``FUSED_SHARED_ROUTED_EXPERTS`` routed, EP 1)."""
        return (
            self.model.n_shared_experts == 1
            and self.model.n_routed_experts in FUSED_SHARED_ROUTED_EXPERTS
            and self.ep == 1
        )

    def per_rank_shape(self) -> MoEShape:
        """The MoE shape one rank's kernels see (local experts incl. a fused shared one)."""
        fused = int(self.fused_shared_expert)
        moe_tp = self.tp // self.ep
        return MoEShape(
            E=self.model.n_routed_experts // self.ep + fused,
            H=self.model.hidden_size,
            I=self.model.moe_intermediate_size // moe_tp,
            top_k=self.model.top_k + fused,
            ep=self.ep,
        )
