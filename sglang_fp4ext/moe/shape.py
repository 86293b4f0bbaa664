"""What both kernel paths' launch configs are keyed on and built from.

:class:`MoEShape` (per-rank expert shape), :class:`Target` (what a heuristic may know about the
GPU), :func:`token_bucket` (the power-of-two bucket a token count is served from) and
:class:`ConfigDict` (a path's config family and its JSON round trip, shared by the decode
``DecodeConfig`` and the prefill ``PrefillConfig``). Imports no launcher and no config, so both
config modules and the table module (``tables.py``) can import it.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

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
    """A kernel path's config: one frozen dataclass, or a base class holding the tiles every kernel
    family of the path takes (``DecodeConfig``) and one frozen dataclass per family, declared
    ``class GluonDecodeConfig(DecodeConfig, family="gluon")``, adding that family's own knobs. The
    JSON form (table entries) names the family in ``"kernels"``; the base reads any family's.
    Unknown keys are an error naming the class, values are checked by ``__post_init__``."""

    #: The family's name ("" on a path's base class, which cannot be built).
    kernels: ClassVar[str] = ""
    _families: ClassVar[dict[str, type]] = {}

    def __init_subclass__(cls, family: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if family is None or ConfigDict in cls.__bases__:  # a path's own: families register here
            cls._families = {}
        if family is not None:
            cls.kernels = family
            cls._families[family] = cls

    def __post_init__(self):
        if not self.kernels and self._families:
            raise TypeError(
                f"{type(self).__name__} holds what its kernel families share: build one of "
                f"{', '.join(c.__name__ for c in self._families.values())}"
            )

    @classmethod
    def families(cls) -> dict[str, type]:
        """{family name: config class} of this path, in declaration order."""
        return dict(cls._families)

    @classmethod
    def family(cls, kernels: str | None = None) -> type:
        """The class of family ``kernels`` (None: this class if it is a family, else the path's
        first family)."""
        if not cls._families:  # a path with one config type
            return cls
        if kernels is None:
            return cls if cls.kernels else next(iter(cls._families.values()))
        if kernels not in cls._families or cls.kernels not in ("", kernels):
            raise ValueError(
                f"{cls.__name__}: kernels must be one of {tuple(cls._families)}"
                + (f" (this class is {cls.kernels!r})" if cls.kernels else "")
                + f", got {kernels!r}"
            )
        return cls._families[kernels]

    @classmethod
    def from_dict(cls, d: dict):
        d = dict(d)
        sub = cls.family(d.pop("kernels", None) if cls._families else None)
        unknown = set(d) - {f.name for f in fields(sub)}
        if unknown:
            raise ValueError(f"unknown {sub.__name__} fields {sorted(unknown)}")
        return sub(**d)

    def to_dict(self) -> dict:
        return {"kernels": self.kernels, **asdict(self)} if self.kernels else asdict(self)

    def reform(self, kernels: str | None = None, **changes):
        """``self`` with ``changes``, in family ``kernels`` if given: the fields that family
        shares with this one carry over, this family's own knobs stay behind."""
        if kernels and kernels not in self._families:
            raise ValueError(f"kernels must be one of {tuple(self._families)}, got {kernels!r}")
        sub = self._families[kernels] if kernels else type(self)
        names = {f.name for f in fields(sub)}
        if set(changes) - names:
            raise ValueError(
                f"{', '.join(sorted(set(changes) - names))}: not a knob of {sub.__name__}"
            )
        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}
        return sub(**{**kept, **changes})


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
