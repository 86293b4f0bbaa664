"""What both kernel paths' launch configs are keyed on and built from.

:class:`MoEShape` (per-rank expert shape), :class:`Target` (what a heuristic may know about the
GPU), :func:`token_bucket` (the power-of-two bucket a token count is served from) and
:class:`ConfigDict` (the JSON round trip shared by the decode ``DecodeConfig`` and the prefill
``PrefillConfig``). Imports no launcher and no config, so both config modules and the table
module (``config.py``) can import it.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields

from sglang_fp4ext.roofline import expected_distinct_experts

__all__ = [
    "ConfigDict",
    "FUSED_SHARED_ROUTED_EXPERTS",
    "DEFAULT_TARGET",
    "MoEShape",
    "Target",
    "current_target",
    "token_bucket",
]


#: Routed-expert counts whose one shared expert SGLang 0.5.23 fuses into the MoE at EP 1, as the
#: last local expert with one more id per token that every token carries
#: (``DeepseekV2ForCausalLM.shared_experts_fusion_disable_reason``).
FUSED_SHARED_ROUTED_EXPERTS = (256, 384)


class ConfigDict:
    """JSON round trip of a frozen kernel-config dataclass (table entries): unknown keys are an
    error naming the class, values are checked by the class's ``__post_init__``."""

    @classmethod
    def from_dict(cls, d: dict):
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MoEShape:
    """Per-rank MoE shape: local experts ``E`` (incl. a fused shared expert), hidden ``H``,
    per-rank intermediate ``I`` and ``top_k`` (9 with a fused shared expert). ``ep``: the
    expert-parallel ranks the layer's ``E * ep`` experts are split over (SGLang gives another
    rank's ids -1), so a token hits this rank's experts ``ep`` times less often than ``E`` and
    ``top_k`` alone say; the prefill heuristic sizes its tiles by it (``rows_per_expert``; the
    decode heuristic, tuned on tabled shapes, does not yet). Tables are keyed without it."""

    E: int
    H: int
    I: int
    top_k: int
    ep: int = 1

    def __post_init__(self):
        if not isinstance(self.ep, int) or self.ep < 1:
            raise ValueError(f"MoEShape.ep must be an int >= 1, got {self.ep!r}")

    def key(self) -> str:
        return f"E={self.E},H={self.H},I={self.I},top_k={self.top_k}"

    @property
    def fused_shared(self) -> bool:
        """Whether one local expert is a fused shared expert that every token hits (SGLang's
        rule, :data:`FUSED_SHARED_ROUTED_EXPERTS`: E = 257 or 385 at EP 1, one more id per
        token): uniform routing then says nothing about that expert, which sees all T tokens."""
        return self.ep == 1 and self.E - 1 in FUSED_SHARED_ROUTED_EXPERTS and self.top_k >= 2

    def rows_per_expert(self, T: int) -> float:
        """Expected sorted rows per local expert that any token hits, for ``T`` tokens under
        uniform routing: ``T k / ep`` local pairs over ``E (1 - (1 - k / (E ep))^T)`` local experts
        hit (at least 1, at most the pairs)."""
        T = max(T, 1)
        k = min(self.top_k, self.E * self.ep)
        pairs = T * k / self.ep
        hit = expected_distinct_experts(T, self.E * self.ep, k) / self.ep
        return pairs / max(1.0, min(pairs, hit))


@dataclass(frozen=True)
class Target:
    """What the heuristic may know about the GPU: ``arch`` like ``"sm_90"``, device name, SMs.
    Every device fact a launcher or a policy needs is asked through it (:func:`current_target`)
    and the named predicates of ``target_info`` on :attr:`capability`."""

    arch: str
    device_name: str | None
    num_sms: int

    @property
    def capability(self) -> tuple[int, int]:
        from sglang_fp4ext import target_info

        return target_info.arch_capability(self.arch)


#: Used without a GPU (CPU interpreter, AOT tests): an H200-sized machine.
DEFAULT_TARGET = Target("sm_90", None, 132)


def current_target(device=None) -> Target:
    """The Target of a CUDA device (a ``torch.device``, an index or None for the current one;
    cached per device), or DEFAULT_TARGET without a GPU."""
    if device is not None and getattr(device, "type", "cuda") != "cuda":
        return DEFAULT_TARGET
    index = getattr(device, "index", device)
    if index is None:
        from sglang_fp4ext import target_info

        if not target_info.has_cuda_gpu():
            return DEFAULT_TARGET
        import torch

        index = torch.cuda.current_device()
    return _device_target(index)


@functools.cache
def _device_target(index: int) -> Target:
    from sglang_fp4ext import target_info

    device = index
    cap = target_info.device_capability(device)
    if cap is None:
        return DEFAULT_TARGET
    return Target(
        f"sm_{cap[0]}{cap[1]}", target_info.device_name(device), target_info.num_sms(device)
    )


def token_bucket(T: int) -> int:
    """Smallest power of two >= T (1 for T <= 1)."""
    return 1 if T <= 1 else 1 << (T - 1).bit_length()
