"""What the capture policy is computed from: the model's MoE facts and the server's layout.

:class:`MoEModel` (``model_shapes``: from a Hugging Face ``config.json``, or ``MODELS``) and the
frozen :class:`PolicyInputs` that ``capture_policy.compute_policy`` reads (``eval(repr(x)) == x``),
including the per-rank MoE shape the kernels see (the shared expert fused or not, as SGLang
decides for the checkpoint: ``shared_fusion``). Imports no SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_fp4ext.model_shapes import GLM5, MODELS, MoEModel
from sglang_fp4ext.moe.shape import MoEShape
from sglang_fp4ext.shared_fusion import fusion_disable_reason

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
    ``fuse_shared``: a layout's own choice (a preset's); None: SGLang's rule for the checkpoint.
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
    fuse_shared: bool | None = None

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
        if self.fuse_shared and (self.model.n_shared_experts < 1 or self.ep > 1):
            raise ValueError("PolicyInputs: a fused shared expert needs a shared expert and ep=1")
        if self.prefill_budget_mb is not None and not self.prefill_budget_mb > 0:
            raise ValueError(
                "PolicyInputs.prefill_budget_mb must be > 0 or None, got "
                f"{self.prefill_budget_mb!r}"
            )

    @property
    def shared_fusion_reason(self) -> str | None:
        """Why SGLang will not fuse the shared expert into the MoE (None: it will): the layout's
        ``fuse_shared`` when given, else SGLang's rule for the checkpoint
        (``shared_fusion.fusion_disable_reason``)."""
        if self.fuse_shared:
            return None
        reason = fusion_disable_reason(self.model, self.ep)
        if self.fuse_shared is None or reason:
            return reason
        return "this layout preset keeps it unfused"

    @property
    def fused_shared_expert(self) -> bool:
        """Whether the shared expert runs inside the MoE, as local expert ``E`` (one more id a
        token)."""
        return self.shared_fusion_reason is None

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
