"""What the capture policy is computed from: the model's MoE facts and the server's layout.

:class:`MoEModel` (``model_shapes``: from a Hugging Face ``config.json``, or ``MODELS``) and the
frozen :class:`PolicyInputs` that ``capture_policy.compute_policy`` reads (``eval(repr(x)) == x``),
including the per-rank MoE shape the kernels see. Imports no SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_fp4ext.model_shapes import GLM5, MODELS, MoEModel
from sglang_fp4ext.moe.shape import FUSED_SHARED_ROUTED_EXPERTS, MoEShape

__all__ = ["GLM5", "MODELS", "MoEModel", "PolicyInputs"]


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
                "PolicyInputs.prefill_budget_mb must be > 0 or None, got "
                f"{self.prefill_budget_mb!r}"
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
