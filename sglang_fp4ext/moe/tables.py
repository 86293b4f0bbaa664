"""Launch configs of the NVFP4 expert kernels, and which kernel path serves a token count.

Two kernel paths read the same ``prepared.PreparedMoEWeights``: **decode**
(``decode.launch.fused_moe_nvfp4``, frozen ``decode.config.DecodeConfig``) for few tokens per
expert and **prefill** (``prefill.launch.fused_moe_nvfp4_prefill``, frozen
``prefill.config.PrefillConfig``) for many. Each config module holds its path's heuristic (the
decode one's docstring explains it); ``shape.py`` the shape, target and token bucket they are
keyed on. :func:`select` is a deterministic function of (token bucket, :class:`MoEShape`,
:class:`Target`): the tuned table entry (path + config) when one exists, else
:func:`heuristic_path` with that path's heuristic. :func:`config_for` /
:func:`prefill_config_for` give one path's config. There is no autotuning on the serving path (a
CUDA graph must capture a known config); ``fp4ext tune`` (``tune.py``) measures the tables
offline.

The tables' format is ``table_format.py``; where they are read, layered and cached is
``table_files.py`` (:func:`table_source` says which one serves a bucket, for ``fp4ext info``; a
bucket that none serves on a GPU logs one line per shape: ``untabled.py``). Their names are
re-exported here, where the dispatcher, the tuner, ``fp4ext info`` and the benchmarks ask. A call
with ``T`` tokens uses the entry of bucket ``token_bucket(T)``, or the largest bucket of the shape
when ``T`` is beyond it (unless that is a decode entry and the path heuristic says prefill: a
decode-only table says nothing about prefill); a bucket missing below the largest falls back to
the heuristics.

**Path heuristic** (no table entry): decode below :data:`PREFILL_MIN_TOKENS` tokens, prefill
from there; on the wgmma prefill family from :data:`WGMMA_PREFILL_MIN_TOKENS`, and from
:data:`WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS` with a fused shared expert (see their comments
for the measurements behind them).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from sglang_fp4ext import target_info
from sglang_fp4ext.moe import paths, untabled
from sglang_fp4ext.moe.prefill.config import wgmma_supports_shape
from sglang_fp4ext.moe.shape import MoEShape, Target, current_target, token_bucket
from sglang_fp4ext.moe.table_files import (  # noqa: F401  (re-exported, see the docstring)
    CONFIG_DIR_ENV,
    SHIPPED_CONFIG_DIR,
    clear_table_cache,
    load_entries,
    load_table,
    shape_table,
    start_table_path,
    table_file_name,
    table_path,
    user_config_dir,
    user_table_path,
)
from sglang_fp4ext.moe.table_format import (  # noqa: F401  (re-exported, see the docstring)
    TABLE_VERSION,
    ConfigTableError,
    TableEntry,
    parse_shape_key,
    parse_table,
    read_table_file,
    table_document,
)

__all__ = [
    "ConfigTableError",
    "TableEntry",
    "PREFILL_MIN_TOKENS",
    "select",
    "heuristic_path",
    "prefill_config_for",
    "load_entries",
    "parse_table",
    "read_table_file",
    "table_document",
    "table_source",
    "shape_table",
    "start_table_path",
    "user_config_dir",
    "clear_table_cache",
    "config_for",
    "table_path",
    "load_table",
    "override_config",
    "path_config",
    "set_config_override",
    "reset_config_override",
]

#: Path heuristic: prefill from this token bucket up when no table entry exists. Measured on the
#: H200 (``benchmarks/results/tune_h200.json``, ``fp4ext tune``, graph replay): prefill wins from
#: bucket 512 for GLM-5 TP8 (1,145 vs 1,171 us at 512) and from 1024 for EP8 (decode 867 vs
#: prefill 1,189 us at 512). 1024 costs TP8 2% at 512, where 512 would cost EP8 37%.
PREFILL_MIN_TOKENS = 1024
#: Where the wgmma prefill family runs (sm_90, H and I multiples of 256): it wins from bucket 512
#: for GLM-5 TP8 (452 vs decode 524 us), EP8 (363 vs 912) and the untabled DeepSeek-R1 TP8 (514
#: with the heuristic's config vs 601), same run, H200
#: (``benchmarks/results/prefill_wgmma/wgmma_ab_final_h200.json``).
WGMMA_PREFILL_MIN_TOKENS = 512
#: ... and from this bucket where one expert is a fused shared expert (``MoEShape.fused_shared``:
#: it sees every token, so the decode path's pairs GEMMs run it on a few programs): GLM-5 TP8 +
#: shared T = 128 / 256 prefill 352.9 / 368.0 us vs the best decode config 473.7 / 591.5 (H100,
#: ``benchmarks/results/decode_forms_h100/``; without a hot expert the two paths tie there).
WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS = 128


_OVERRIDE = None


def set_config_override(cfg) -> None:
    """Test/benchmark only: force ``cfg`` for every call until :func:`reset_config_override`.

    A config forces the path whose config type it is (``DecodeConfig``: decode)."""
    global _OVERRIDE
    if cfg is not None:
        paths.path_of(cfg)  # raises on a type no path owns
    _OVERRIDE = cfg


def reset_config_override() -> None:
    set_config_override(None)


@contextlib.contextmanager
def override_config(cfg):
    prev = _OVERRIDE
    set_config_override(cfg)
    try:
        yield cfg
    finally:
        set_config_override(prev)


# ---- selection ----


def heuristic_path(T: int, shape: MoEShape, target: Target) -> str:
    """``"prefill"`` from bucket :data:`PREFILL_MIN_TOKENS` up (:data:`WGMMA_PREFILL_MIN_TOKENS`
    where the heuristic picks the wgmma prefill family,
    :data:`WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS` there with a fused shared expert), else
    ``"decode"``."""
    wgmma = (
        shape is not None
        and target is not None
        and target_info.supports_wgmma_prefill(target_info.arch_capability(target.arch))
        and wgmma_supports_shape(shape.H, shape.I)
    )
    if not wgmma:
        start = PREFILL_MIN_TOKENS
    elif shape.fused_shared:
        start = WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS
    else:
        start = WGMMA_PREFILL_MIN_TOKENS
    return "prefill" if token_bucket(T) >= start else "decode"


def table_entry(T: int, shape: MoEShape, target: Target) -> TableEntry | None:
    """The tuned entry for ``T`` (bucket, or the largest bucket beyond it), else None."""
    if not target.device_name:
        return None
    buckets = load_entries(target.device_name).get(shape.key())
    if not buckets:
        return None
    b = token_bucket(T)
    if b in buckets:
        return buckets[b]
    if b > max(buckets):
        last = buckets[max(buckets)]
        # A decode-only (e.g. migrated v1) table says nothing about where prefill starts.
        if last.path == "decode" and heuristic_path(T, shape, target) == "prefill":
            return None
        return last
    return None


def table_source(T: int, shape: MoEShape, target: Target) -> tuple[str, Path | None]:
    """Which table serves ``T`` tokens of ``shape``: ``("shipped", file)``, ``("tuned here",
    file)`` (``fp4ext tune`` or a server's first start) or ``("heuristic", None)``."""
    if table_entry(T, shape, target) is None:
        return "heuristic", None
    path = shape_table(target.device_name, shape.key())
    return ("shipped" if path == table_path(target.device_name) else "tuned here"), path


def select(
    T: int, shape: MoEShape, target: Target | None = None, *, quiet: bool = False
) -> TableEntry:
    """Kernel path and config for ``T`` tokens: override, else table entry, else heuristics
    (on a GPU, logged once per shape: ``untabled.note_heuristic``; ``quiet``: not logged, for
    ``fp4ext info``, which reports it instead).

    Depends only on (``token_bucket(T)``, shape, target), so a captured graph keeps its path."""
    if _OVERRIDE is not None:
        return TableEntry(paths.path_of(_OVERRIDE).name, _OVERRIDE)
    target = target or current_target()
    entry = table_entry(T, shape, target)
    if entry is not None:
        return entry
    if target.device_name and not quiet:
        untabled.note_heuristic(T, shape, target, shape_table(target.device_name, shape.key()))
    name = heuristic_path(T, shape, target)
    return TableEntry(name, paths.get(name).heuristic(T, shape, target))


def path_config(path: str, T: int, shape: MoEShape, target: Target | None = None):
    """``path``'s config for ``T`` tokens: override of that path's type, else the tuned entry if
    the table puts ``T`` on ``path``, else ``path``'s heuristic."""
    kernel_path = paths.get(path)
    if isinstance(_OVERRIDE, kernel_path.config_type):
        return _OVERRIDE
    target = target or current_target()
    entry = table_entry(T, shape, target)
    if entry is not None and entry.path == path:
        return entry.config
    return kernel_path.heuristic(T, shape, target)


def config_for(T: int, shape: MoEShape, target: Target | None = None):
    """The decode config for ``T`` tokens: override, else tuned decode entry, else heuristic."""
    return path_config("decode", T, shape, target)


def prefill_config_for(T: int, shape: MoEShape, target: Target | None = None):
    """The prefill config for ``T`` tokens: override, else tuned prefill entry, else heuristic."""
    return path_config("prefill", T, shape, target)
