"""The JSON format of a config table: parse and validate one, write one.

A table is one JSON file per device (where the files live and how they are layered:
``table_files.py``; how the dispatcher reads an entry: ``tables.py``). Format version 2::

    {"version": 2,
     "device_name": "NVIDIA H200",
     "shapes": {"E=257,H=6144,I=256,top_k=9": {
         "1":    {"path": "decode",  "config": {<DecodeConfig fields>}},
         "4096": {"path": "prefill", "config": {<PrefillConfig fields>}}, ...}},
     "meta": {...}}                       # optional, free-form (the tuner records its run here)

A shape key is ``E=<experts>,H=<hidden>,I=<per-rank intermediate>,top_k=<k>`` (exactly
:meth:`MoEShape.key`); the inner keys are token buckets (powers of two, decimal strings).
Version 1 (no ``"version"`` key; buckets map straight to DecodeConfig fields) is still read:
every v1 bucket is path ``decode``. Parsing is strict: an unknown version, top-level key, path or
config field, a bad shape or bucket key, or a value of the wrong type raises
:class:`ConfigTableError` naming the file, shape, bucket and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from sglang_fp4ext.moe import paths
from sglang_fp4ext.moe.shape import MoEShape

__all__ = [
    "TABLE_VERSION",
    "ConfigTableError",
    "TableEntry",
    "parse_shape_key",
    "parse_table",
    "read_table_file",
    "table_document",
]

TABLE_VERSION = 2
_SHAPE_KEY_FIELDS = ("E", "H", "I", "top_k")


def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


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
