"""The kernel paths: one registry that the tables, the dispatcher, the first-use self-check, the
tuner and the benchmarks all read.

A path is a family of launches with its own frozen config type: ``decode`` (few tokens per
expert, ``decode.launch.fused_moe_nvfp4``, ``DecodeConfig``) and ``prefill`` (grouped GEMMs,
``prefill.launch.fused_moe_nvfp4_prefill``, ``PrefillConfig``). A table entry names its path and
holds that path's config. Everything that parses, chooses, runs, checks or times a config asks its
:class:`KernelPath` here, so a new family is one :func:`register` call and nothing else.

Every launcher has the signature ``run(x, weights, topk_ids, topk_weights, *, out, config) ->
out`` on ``PreparedMoEWeights`` and returns the ``(T, H)`` bf16 partial sum; its torch twin is
``reference.fused_moe_nvfp4_torch``. Launchers are named as ``"module:function"`` and imported
on first use, so the registry sits below what it names: a launcher called without a config looks
it up in the tables (``config.py``), which read this registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_fp4ext.moe.decode.config import DecodeConfig
from sglang_fp4ext.moe.decode.config import check_hidden as decode_check_hidden
from sglang_fp4ext.moe.decode.config import fallbacks as decode_fallbacks
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.prefill.config import PrefillConfig, served_prefill_config
from sglang_fp4ext.moe.prefill.config import fallbacks as prefill_fallbacks
from sglang_fp4ext.moe.prefill.heuristic import prefill_heuristic_config
from sglang_fp4ext.moe.tune_space import (
    DECODE_MAX_BUCKET,
    PREFILL_MIN_BUCKET,
    decode_candidates,
    prefill_candidates,
)

__all__ = ["KernelPath", "get", "names", "register", "unregister", "path_of"]


def _same(config, weights):
    return config


def _none(config):
    return ()


def _no(config):
    return False


def _keep_hidden(config, H: int) -> int:
    return H


@dataclass(frozen=True)
class KernelPath:
    """One kernel family, as everything outside it sees it.

    ``heuristic(T, shape, target)`` is its config when no table entry exists, and
    ``candidates(T, shape, target, limit)`` the tuner's search space (the heuristic first).
    ``tune_buckets`` is the bucket range ``fp4ext tune`` times it in by default. The self-check
    runs it on ``check_tokens`` tokens at the hidden size ``check_hidden(config, H)`` asks for;
    ``fallbacks(config)`` are the configs of the same path tried, in order, when ``config``
    fails there. ``serves(config, weights)`` is the config a call really runs on ``weights``
    (a W4A4 config needs static input scales), and ``nvfp4_activations(config)`` says whether
    its twin quantises the activations (and the check's weights need input scales)."""

    name: str
    config_type: type
    runner: str
    heuristic: Callable
    candidates: Callable
    check_tokens: int
    tune_buckets: tuple[int, int] = (1, 1 << 30)
    check_hidden: Callable = field(default=_keep_hidden)
    fallbacks: Callable = field(default=_none)
    serves: Callable = field(default=_same)
    nvfp4_activations: Callable = field(default=_no)

    def launcher(self) -> Callable:
        module, _, fn = self.runner.partition(":")
        return getattr(importlib.import_module(module), fn)

    def run(self, x, weights, topk_ids, topk_weights, *, out=None, config):
        """Launch this path with ``config`` (no table look-up, no self-check)."""
        return self.launcher()(x, weights, topk_ids, topk_weights, out=out, config=config)


_REGISTRY: dict[str, KernelPath] = {}


def register(path: KernelPath) -> KernelPath:
    """Add ``path`` (its name and config type must be new). Returns it."""
    if path.name in _REGISTRY:
        raise ValueError(f"kernel path {path.name!r} is registered already")
    for p in _REGISTRY.values():
        if p.config_type is path.config_type:
            raise ValueError(
                f"kernel path {path.name!r}: config type {path.config_type.__name__} belongs to "
                f"path {p.name!r} already"
            )
    _REGISTRY[path.name] = path
    return path


def unregister(name: str) -> None:
    """Remove a registered path (tests that add a family of their own)."""
    _REGISTRY.pop(name)


def get(name: str) -> KernelPath:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown kernel path {name!r} (known: {names()})") from None


def names() -> tuple[str, ...]:
    """The registered paths, in registration order (decode, prefill, then any added)."""
    return tuple(_REGISTRY)


def path_of(config) -> KernelPath:
    """The path whose config type ``config`` is."""
    for p in _REGISTRY.values():
        if isinstance(config, p.config_type):
            return p
    raise TypeError(
        f"{type(config).__name__} is the config of no kernel path "
        f"(known: {', '.join(p.config_type.__name__ for p in _REGISTRY.values())})"
    )


# ---- the shipped paths ----


def _prefill_serves(config: PrefillConfig, weights) -> PrefillConfig:
    return served_prefill_config(config, getattr(weights, "has_input_scales", False))


DECODE = register(
    KernelPath(
        name="decode",
        config_type=DecodeConfig,
        runner="sglang_fp4ext.moe.decode.launch:fused_moe_nvfp4",
        heuristic=heuristic_config,
        candidates=decode_candidates,
        check_tokens=5,
        tune_buckets=(1, DECODE_MAX_BUCKET),
        check_hidden=decode_check_hidden,
        fallbacks=decode_fallbacks,
    )
)
PREFILL = register(
    KernelPath(
        name="prefill",
        config_type=PrefillConfig,
        runner="sglang_fp4ext.moe.prefill.launch:fused_moe_nvfp4_prefill",
        heuristic=prefill_heuristic_config,
        candidates=prefill_candidates,
        check_tokens=64,
        tune_buckets=(PREFILL_MIN_BUCKET, 1 << 30),
        fallbacks=prefill_fallbacks,
        serves=_prefill_serves,
        nvfp4_activations=lambda config: config.kernels == "w4a4",
    )
)
