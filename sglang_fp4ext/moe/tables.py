"""Launch configs of the NVFP4 expert kernels, and which kernel path serves a token count.

Two kernel paths read the same ``prepared.PreparedMoEWeights``: **decode**
(``decode.launch.fused_moe_nvfp4``, frozen ``decode.config.DecodeConfig``) for few tokens per expert
and
**prefill** (``prefill.launch.fused_moe_nvfp4_prefill``, frozen ``prefill.config.PrefillConfig``)
for many. Each config module holds its path's heuristic (the decode one's docstring explains it);
``shape.py`` the shape, target and token bucket they are keyed on. :func:`select`
is a deterministic function of (token bucket, :class:`MoEShape`, :class:`Target`): the tuned
table entry (path + config) when one exists, else :func:`heuristic_path` with that path's
heuristic. :func:`config_for` / :func:`prefill_config_for` give one path's config. There is no
autotuning on the serving path (a CUDA graph must capture a known config); ``fp4ext tune``
(``tune.py``) measures the tables offline.

**Tables** are one JSON file per device, named ``<device name>.json`` (spaces and ``/`` replaced
by ``_``, e.g. ``NVIDIA_H200.json``). Format version 2::

    {"version": 2,
     "device_name": "NVIDIA H200",
     "shapes": {"E=257,H=6144,I=256,top_k=9": {
         "1":    {"path": "decode",  "config": {<DecodeConfig fields>}},
         "4096": {"path": "prefill", "config": {<PrefillConfig fields>}}, ...}},
     "meta": {...}}                       # optional, free-form (the tuner records its run here)

A shape key is ``E=<experts>,H=<hidden>,I=<per-rank intermediate>,top_k=<k>`` (exactly
:meth:`MoEShape.key`); the inner keys are token buckets (powers of two, decimal strings). A call
with ``T`` tokens uses bucket ``token_bucket(T)``, or the largest bucket of the shape when ``T``
is beyond it (unless that is a decode entry and the path heuristic says prefill: a decode-only
table says nothing about prefill); a bucket missing below the largest falls back to the
heuristics. Version 1 (no
``"version"`` key; buckets map straight to DecodeConfig fields) is still read: every v1 bucket is
path ``decode``. Loading is strict: an unknown version, top-level key, path or config field, a
bad shape or bucket key, or a value of the wrong type raises :class:`ConfigTableError` naming
the file, shape, bucket and field.

**Where tables are read.** The user directory first -- ``$SGLANG_FP4EXT_CONFIG_DIR`` when set,
else ``~/.cache/sglang_fp4ext/configs`` (where ``fp4ext tune`` writes by default) -- then the table
tuned at a server's first start (:func:`start_table_path`: under the user directory, keyed by
Triton and fp4ext version, so an upgrade tunes again; ``start_tune.py``), then the tables shipped
in ``moe/configs/``. A shape present in a table replaces that shape of the tables after it as a
whole (a tuned shape's buckets and switch point belong together); other shapes still come from
those. :func:`table_source` says which of them serves a bucket (``fp4ext info``); a bucket that
none serves on a GPU logs one line per shape (``untabled.py``). Tables are read once per process
(cached; :func:`clear_table_cache` after writing one).

**Path heuristic** (no table entry): decode below :data:`PREFILL_MIN_TOKENS` tokens, prefill
from there; on the wgmma prefill family from :data:`WGMMA_PREFILL_MIN_TOKENS`, and from
:data:`WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS` with a fused shared expert (see their comments
for the measurements behind them).
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path

from sglang_fp4ext import __version__, envs, target_info
from sglang_fp4ext.moe import paths, untabled
from sglang_fp4ext.moe.prefill.config import wgmma_supports_shape
from sglang_fp4ext.moe.shape import MoEShape, Target, current_target, token_bucket

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

_CONFIG_DIR = Path(__file__).parent / "configs"


def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


# ---- tables ----

TABLE_VERSION = 2
#: Environment variable naming the user table directory (checked before the shipped tables).
CONFIG_DIR_ENV = envs.CONFIG_DIR.name

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

_SHAPE_KEY_FIELDS = ("E", "H", "I", "top_k")


class ConfigTableError(ValueError):
    """A config table that cannot be used; the message names file, shape, bucket and field."""


@dataclass(frozen=True)
class TableEntry:
    """One bucket of a table: the kernel ``path`` (a name in ``paths``: "decode", "prefill", ...)
    and that path's config (its ``config_type``)."""

    path: str
    config: object

    def __post_init__(self):
        if self.path not in paths.names():
            raise ValueError(f"TableEntry.path must be one of {paths.names()}, got {self.path!r}")
        want = paths.get(self.path).config_type
        if not isinstance(self.config, want):
            raise TypeError(
                f"TableEntry: path {self.path!r} needs a {want.__name__}, "
                f"got {type(self.config).__name__}"
            )

    def to_dict(self) -> dict:
        return {"path": self.path, "config": self.config.to_dict()}


def _file_name(device_name: str) -> str:
    return device_name.replace(" ", "_").replace("/", "_") + ".json"


def table_path(device_name: str) -> Path:
    """The shipped table of ``device_name`` (``moe/configs/<name>.json``)."""
    return _CONFIG_DIR / _file_name(device_name)


def user_config_dir() -> Path:
    """``$SGLANG_FP4EXT_CONFIG_DIR`` when set, else ``~/.cache/sglang_fp4ext/configs``."""
    return Path(envs.CONFIG_DIR.value()).expanduser()


def user_table_path(device_name: str) -> Path:
    return user_config_dir() / _file_name(device_name)


def start_table_path(device_name: str) -> Path:
    """The table tuned at a server's first start on ``device_name`` with this Triton and fp4ext:
    ``<user dir>/tuned-at-start/triton-<version>_fp4ext-<version>/<device name>.json``."""
    import triton

    versions = f"triton-{triton.__version__}_fp4ext-{__version__}"
    return user_config_dir() / "tuned-at-start" / versions / _file_name(device_name)


def parse_shape_key(key) -> MoEShape:
    """``"E=..,H=..,I=..,top_k=.."`` -> :class:`MoEShape` (exactly that spelling)."""
    parts = key.split(",") if isinstance(key, str) else []
    vals = {}
    for part, name in zip(parts, _SHAPE_KEY_FIELDS):
        k, _, v = part.partition("=")
        if k != name or not v.isdigit() or int(v) < 1:
            break
        vals[name] = int(v)
    if len(parts) != 4 or len(vals) != 4 or MoEShape(**vals).key() != key:
        raise ValueError(f"shape key must look like 'E=257,H=6144,I=256,top_k=9', got {key!r}")
    return MoEShape(**vals)


def _parse_config(cls, d, where: str):
    if not isinstance(d, dict):
        raise ConfigTableError(f"{where}: config must be an object, got {type(d).__name__}")
    if cls.families():  # the path's base class: the family named by "kernels" (none: the first)
        try:
            cls = cls.family(d.get("kernels"))
        except ValueError as exc:
            raise ConfigTableError(f"{where}, field 'kernels': {exc}") from None
        d = {k: v for k, v in d.items() if k != "kernels"}
    defaults = {f.name: f.default for f in fields(cls)}
    for name, v in d.items():
        if name not in defaults:
            raise ConfigTableError(
                f"{where}, field {name!r}: unknown {cls.__name__} field (known: {sorted(defaults)})"
            )
        # bool is an int subclass and 3.0 passes the range checks: insist on the default's type.
        if type(v) is not type(defaults[name]):
            raise ConfigTableError(
                f"{where}, field {name!r}: must be {type(defaults[name]).__name__}, got {v!r}"
            )
    try:
        return cls(**d)
    except ValueError as exc:
        raise ConfigTableError(f"{where}: {exc}") from None


def parse_table(raw, source: str = "<table>") -> tuple[str, dict]:
    """Validate a decoded table (v1 or v2). Returns ``(device_name, {shape key: {bucket:
    TableEntry}})``; raises :class:`ConfigTableError` naming ``source``, shape, bucket, field."""

    def fail(msg):
        raise ConfigTableError(f"{source}: {msg}")

    if not isinstance(raw, dict):
        fail(f"a table must be a JSON object, got {type(raw).__name__}")
    version = raw.get("version", 1)
    if type(version) is not int or version not in (1, TABLE_VERSION):
        fail(f"unknown table version {version!r} (this sglang_fp4ext reads 1 and {TABLE_VERSION})")
    allowed = {"device_name", "shapes"} | ({"version", "meta"} if version == 2 else set())
    unknown = set(raw) - allowed
    if unknown:
        fail(f"unknown top-level keys {sorted(unknown)} (a v{version} table has {sorted(allowed)})")
    device = raw.get("device_name")
    if not isinstance(device, str) or not device:
        fail(f"'device_name' must be a non-empty string, got {device!r}")
    shapes = raw.get("shapes")
    if not isinstance(shapes, dict):
        fail(f"'shapes' must be an object, got {type(shapes).__name__}")
    out = {}
    for key, buckets in shapes.items():
        try:
            parse_shape_key(key)
        except ValueError as exc:
            fail(str(exc))
        if not isinstance(buckets, dict) or not buckets:
            fail(f"shape {key}: buckets must be a non-empty object")
        entries = {}
        for b, entry in buckets.items():
            where = f"{source}: shape {key}, bucket {b!r}"
            if not (isinstance(b, str) and b.isdigit() and _pow2(int(b)) and str(int(b)) == b):
                raise ConfigTableError(f"{where}: bucket keys are powers of two like '1', '64'")
            if version == 1:
                path, cfg = "decode", entry
            else:
                if not isinstance(entry, dict) or set(entry) != {"path", "config"}:
                    raise ConfigTableError(
                        f'{where}: a v2 bucket is {{"path": ..., "config": {{...}}}}, got '
                        f"{entry!r:.120}"
                    )
                path, cfg = entry["path"], entry["config"]
                if path not in paths.names():
                    raise ConfigTableError(
                        f"{where}, field 'path': must be one of {paths.names()}, got {path!r}"
                    )
            cls = paths.get(path).config_type
            entries[int(b)] = TableEntry(path, _parse_config(cls, cfg, where))
        out[key] = dict(sorted(entries.items()))
    return device, out


def read_table_file(path: Path) -> tuple[str, dict]:
    """:func:`parse_table` of a file (JSON errors also name the file)."""
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ConfigTableError(f"{path}: not valid JSON: {exc}") from None
    return parse_table(raw, str(path))


def table_document(device_name: str, entries: dict, meta: dict | None = None) -> dict:
    """The v2 JSON document of ``{shape key: {bucket: TableEntry}}`` (validated on the way)."""
    doc = {
        "version": TABLE_VERSION,
        "device_name": device_name,
        "shapes": {
            key: {str(b): e.to_dict() for b, e in sorted(buckets.items())}
            for key, buckets in sorted(entries.items())
        },
    }
    if meta:
        doc["meta"] = meta
    parse_table(doc, f"<table for {device_name}>")
    return doc


@functools.cache
def _read_tables(device_name: str) -> tuple[dict, dict]:
    """(entries, {shape key: the file its buckets come from}) of ``device_name``'s tables."""
    out, files = {}, {}
    order = (table_path(device_name), start_table_path(device_name), user_table_path(device_name))
    for path in order:
        if path.exists():
            dev, entries = read_table_file(path)
            if dev != device_name:
                raise ConfigTableError(
                    f"{path}: device_name {dev!r} does not match the file's device {device_name!r}"
                )
            out.update(entries)
            files.update(dict.fromkeys(entries, path))
    return out, files


def load_entries(device_name: str) -> dict:
    """{shape key: {bucket: TableEntry}}: the shipped table, with the start-tuned and then the
    user table's shapes on top (see the module docstring); {} when none exists."""
    return _read_tables(device_name)[0]


def load_table(device_name: str) -> dict:
    """The decode view: {shape key: {bucket: DecodeConfig}} of the decode entries."""
    return {
        key: {b: e.config for b, e in buckets.items() if e.path == "decode"}
        for key, buckets in load_entries(device_name).items()
    }


def clear_table_cache() -> None:
    """Re-read the tables on the next call (after writing one, or changing the env var)."""
    _read_tables.cache_clear()


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


def shape_table(device_name: str, key: str) -> Path | None:
    """The table file that holds shape ``key`` on ``device_name`` (None: no table has it)."""
    return _read_tables(device_name)[1].get(key)


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
