"""Launch configs of the NVFP4 expert kernels, and which kernel path serves a token count.

Two kernel paths read the same ``PreparedMoEWeights``: **decode** (``fused_moe.fused_moe_nvfp4``,
frozen :class:`KernelConfig`) for few tokens per expert and **prefill**
(``prefill.fused_moe_nvfp4_prefill``, frozen ``prefill.PrefillConfig``) for many. :func:`select`
is a deterministic function of (token bucket, :class:`MoEShape`, :class:`Target`): the tuned
table entry (path + config) when one exists, else :func:`heuristic_path` with that path's
heuristic. :func:`config_for` / :func:`prefill_config_for` give one path's config. There is no
autotuning on the serving path (a CUDA graph must capture a known config); ``fp4ext tune``
(``moe/tune.py``) measures the tables offline.

**Tables** are one JSON file per device, named ``<device name>.json`` (spaces and ``/`` replaced
by ``_``, e.g. ``NVIDIA_H200.json``). Format version 2::

    {"version": 2,
     "device_name": "NVIDIA H200",
     "shapes": {"E=257,H=6144,I=256,top_k=9": {
         "1":    {"path": "decode",  "config": {<KernelConfig fields>}},
         "4096": {"path": "prefill", "config": {<PrefillConfig fields>}}, ...}},
     "meta": {...}}                       # optional, free-form (the tuner records its run here)

A shape key is ``E=<experts>,H=<hidden>,I=<per-rank intermediate>,top_k=<k>`` (exactly
:meth:`MoEShape.key`); the inner keys are token buckets (powers of two, decimal strings). A call
with ``T`` tokens uses bucket ``token_bucket(T)``, or the largest bucket of the shape when ``T``
is beyond it (unless that is a decode entry and the path heuristic says prefill: a decode-only
table says nothing about prefill); a bucket missing below the largest falls back to the
heuristics. Version 1 (no
``"version"`` key; buckets map straight to KernelConfig fields) is still read: every v1 bucket is
path ``decode``. Loading is strict: an unknown version, top-level key, path or config field, a
bad shape or bucket key, or a value of the wrong type raises :class:`ConfigTableError` naming
the file, shape, bucket and field.

**Where tables are read.** The user directory first -- ``$SGLANG_FP4EXT_CONFIG_DIR`` when set,
else ``~/.cache/sglang_fp4ext/configs`` (where ``fp4ext tune`` writes by default) -- then the
tables shipped in ``moe/configs/``. A shape present in the user table replaces that shape of the
shipped table as a whole (a tuned shape's buckets and switch point belong together); other
shapes still come from the shipped table. Tables are read once per process (``load_entries`` is
cached; :func:`clear_table_cache` after writing one).

**Decode heuristic.** Grid by pair slots while ``T * top_k <= E`` (every program has an expert), else by
experts. Every GEMM runs 2 warps per program (``mma.sync`` with the decoded weights in registers,
see ``_decode_kernels``), 64-row tiles and 3 pipeline stages (two 256-deep K chunks in flight).
``block_t`` covers the expected pairs per expert (8 or 16; wider tiles spill). GEMM1 splits K
until the expected busy programs (distinct experts ``D(T) = E (1 - (1 - k/E)^T)`` x row tiles x splits) reach about
four per SM, keeping at least 2 K chunks per split (kernel-techniques §5, Little's law: ~25-30 KB
in flight per SM). GEMM2 (K = I, one chunk per expert under TP) does the same with its K, then
packs ``tiles2`` row tiles into a program while there are more than ~8 programs per SM, so the
per-program setup and the combine bookkeeping are amortised. While experts see few pairs
(``T * top_k / D <= 2.5``; H200 tuning picked it for GLM-5 TP8 up to T = 64) GEMM2 is
token-centric instead (``gemm2="tokens"``).

**Path heuristic** (no table entry): decode below :data:`PREFILL_MIN_TOKENS` tokens, prefill
from there (see its comment for the measurement behind it).
"""

from __future__ import annotations

import contextlib
import functools
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from sglang_fp4ext import envs
from sglang_fp4ext.roofline import expected_distinct_experts
from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN

__all__ = [
    "ConfigDict",
    "ConfigTableError",
    "KernelConfig",
    "TableEntry",
    "PREFILL_MIN_TOKENS",
    "select",
    "heuristic_path",
    "prefill_config_for",
    "load_entries",
    "parse_table",
    "read_table_file",
    "table_document",
    "user_config_dir",
    "clear_table_cache",
    "MoEShape",
    "Target",
    "config_for",
    "heuristic_config",
    "token_bucket",
    "table_path",
    "load_table",
    "override_config",
    "set_config_override",
    "reset_config_override",
    "current_target",
]

_CONFIG_DIR = Path(__file__).parent / "configs"


def _pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


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
class KernelConfig(ConfigDict):
    """Tile and launch parameters of one (GEMM1, GEMM2) decode call. ``eval(repr(cfg)) == cfg``.

    ``grid``: ``"slots"`` (one program per pair slot; non-leaders exit) or ``"experts"``.
    ``block_t``: pairs per MMA tile (N side); ``block_p``: ids scanned per routing step.
    ``block_n*``: weight rows per tile (M side); ``split_k*``: K splits; ``warps*``/``stages*``:
    Triton ``num_warps``/``num_stages`` (2 warps keep ``tl.dot`` on ``mma.sync``; 4 or more with
    ``block_n >= 64`` let Hopper pick wgmma, whose register operand layout costs byte shuffles).
    ``tiles2``: GEMM2 row tiles per program. ``gemm2``: ``"pairs"`` (a program per expert and
    row tiles, all its pairs, arrival-counter top-k combine) or ``"tokens"`` (a program per token
    and row tile walking the token's experts: no combine; for experts seeing ~1 token).
    Suffix 1 = GEMM1 (gate/up rows, interleaved), 2 = GEMM2.
    """

    grid: str = "slots"
    block_t: int = 8
    block_p: int = 128
    block_n1: int = 64
    split_k1: int = 1
    warps1: int = 2
    stages1: int = 3
    block_n2: int = 64
    split_k2: int = 1
    warps2: int = 2
    stages2: int = 3
    tiles2: int = 1
    gemm2: str = "pairs"

    def __post_init__(self):
        if self.grid not in ("slots", "experts"):
            raise ValueError(f"KernelConfig.grid must be 'slots' or 'experts', got {self.grid!r}")
        if self.gemm2 not in ("pairs", "tokens"):
            raise ValueError(f"KernelConfig.gemm2 must be 'pairs' or 'tokens', got {self.gemm2!r}")
        if self.gemm2 == "tokens" and (self.split_k2, self.tiles2) != (1, 1):
            raise ValueError(
                "KernelConfig.gemm2='tokens' walks whole experts per program: split_k2 and "
                f"tiles2 must be 1, got {self.split_k2} and {self.tiles2}"
            )
        for name in (
            "block_t",
            "block_p",
            "block_n1",
            "block_n2",
            "split_k1",
            "split_k2",
            "warps1",
            "warps2",
            "tiles2",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or not _pow2(v):
                raise ValueError(f"KernelConfig.{name} must be a power of two, got {v!r}")
        if not 8 <= self.block_t <= 64:
            raise ValueError(f"KernelConfig.block_t must be in [8, 64], got {self.block_t}")
        for name in ("block_n1", "block_n2"):
            if not 32 <= getattr(self, name) <= ROW_ALIGN:
                raise ValueError(
                    f"KernelConfig.{name} must be in [32, {ROW_ALIGN}] (16 MMA rows per warp, "
                    f"gate and up halves of >= 16 rows), got {getattr(self, name)}"
                )
        for name, bn, w in (("1", self.block_n1, self.warps1), ("2", self.block_n2, self.warps2)):
            if bn < 16 * w:
                raise ValueError(
                    f"KernelConfig.block_n{name}={bn} gives warps{name}={w} fewer than 16 rows each"
                )
        if self.block_p < 16:
            raise ValueError(f"KernelConfig.block_p must be >= 16, got {self.block_p}")
        for name in ("stages1", "stages2"):
            if not 1 <= getattr(self, name) <= 8:
                raise ValueError(
                    f"KernelConfig.{name} must be in [1, 8], got {getattr(self, name)}"
                )



@dataclass(frozen=True)
class MoEShape:
    """Per-rank MoE shape: local experts ``E`` (incl. a fused shared expert), hidden ``H``,
    per-rank intermediate ``I`` and ``top_k`` (9 with a fused shared expert)."""

    E: int
    H: int
    I: int
    top_k: int

    def key(self) -> str:
        return f"E={self.E},H={self.H},I={self.I},top_k={self.top_k}"


@dataclass(frozen=True)
class Target:
    """What the heuristic may know about the GPU: ``arch`` like ``"sm_90"``, device name, SMs."""

    arch: str
    device_name: str | None
    num_sms: int


#: Used without a GPU (CPU interpreter, AOT tests): an H200-sized machine.
DEFAULT_TARGET = Target("sm_90", None, 132)


@functools.cache
def current_target(device=None) -> Target:
    """The Target of a CUDA device (cached per device), or DEFAULT_TARGET without a GPU."""
    from sglang_fp4ext import target_info

    cap = target_info.device_capability(device)
    if cap is None:
        return DEFAULT_TARGET
    return Target(
        f"sm_{cap[0]}{cap[1]}", target_info.device_name(device), target_info.num_sms(device)
    )


def token_bucket(T: int) -> int:
    """Smallest power of two >= T (1 for T <= 1)."""
    return 1 if T <= 1 else 1 << (T - 1).bit_length()


def heuristic_config(T: int, shape: MoEShape, target: Target) -> KernelConfig:
    """Deterministic default for any shape (see module docstring)."""
    b = token_bucket(max(T, 1))
    P = b * shape.top_k
    grid = "slots" if P <= shape.E else "experts"
    D = max(1.0, min(float(P), expected_distinct_experts(b, shape.E, min(shape.top_k, shape.E))))
    rows_per_expert = P / D
    # 32-wide pair tiles spill on sm_90 (255 registers): 16 at most, more pairs loop.
    block_t = 8 if rows_per_expert <= 8 else 16
    want = 4 * target.num_sms
    block_p = 256 if P > 128 else 128
    bn = 64

    def split_for(n_rows: int, k: int) -> int:
        n_pad = -(-n_rows // ROW_ALIGN) * ROW_ALIGN
        kc = -(-k // K_CHUNK)
        tiles = D * (n_pad // bn)
        split = 1
        while tiles * split < want and kc // (split * 2) >= 2:
            split *= 2
        return split

    sk1 = split_for(2 * shape.I, shape.H)
    sk2 = split_for(shape.H, shape.I)
    tiles2 = 1
    nb2 = -(-shape.H // ROW_ALIGN) * ROW_ALIGN // bn
    progs2 = D * nb2 * sk2
    while tiles2 < 8 and progs2 / (2 * tiles2) >= 2 * want:
        tiles2 *= 2
    # Few pairs per expert: token-centric GEMM2 (no combine round trips; repeats of an expert
    # mostly hit L2); 32-row tiles while there would be fewer than 2 programs per SM.
    gemm2 = "tokens" if rows_per_expert <= 2.5 else "pairs"
    bn2 = 32 if gemm2 == "tokens" and b * nb2 < 2 * target.num_sms else bn
    return KernelConfig(
        grid=grid,
        block_t=block_t,
        block_p=block_p,
        block_n1=bn,
        split_k1=sk1,
        warps1=2,
        stages1=3,
        block_n2=bn2,
        split_k2=1 if gemm2 == "tokens" else sk2,
        warps2=2,
        stages2=3,
        tiles2=1 if gemm2 == "tokens" else tiles2,
        gemm2=gemm2,
    )


# ---- tables ----

TABLE_VERSION = 2
PATHS = ("decode", "prefill")
#: Environment variable naming the user table directory (checked before the shipped tables).
CONFIG_DIR_ENV = envs.CONFIG_DIR.name

#: Path heuristic: prefill from this token bucket up when no table entry exists. Measured on the
#: H200 (``benchmarks/results/tune_h200.json``, ``fp4ext tune``, graph replay): prefill wins from
#: bucket 512 for GLM-5 TP8 (1,145 vs 1,171 us at 512) and from 1024 for EP8 (decode 867 vs
#: prefill 1,189 us at 512). 1024 costs TP8 2% at 512, where 512 would cost EP8 37%.
PREFILL_MIN_TOKENS = 1024

_SHAPE_KEY_FIELDS = ("E", "H", "I", "top_k")


class ConfigTableError(ValueError):
    """A config table that cannot be used; the message names file, shape, bucket and field."""


@dataclass(frozen=True)
class TableEntry:
    """One bucket of a table: the kernel ``path`` ("decode" | "prefill") and that path's config
    (:class:`KernelConfig` | ``prefill.PrefillConfig``)."""

    path: str
    config: object

    def __post_init__(self):
        if self.path not in PATHS:
            raise ValueError(f"TableEntry.path must be one of {PATHS}, got {self.path!r}")
        want = _config_class(self.path)
        if not isinstance(self.config, want):
            raise TypeError(
                f"TableEntry: path {self.path!r} needs a {want.__name__}, "
                f"got {type(self.config).__name__}"
            )

    def to_dict(self) -> dict:
        return {"path": self.path, "config": self.config.to_dict()}


def _config_class(path: str):
    if path == "decode":
        return KernelConfig
    from sglang_fp4ext.moe.prefill import PrefillConfig  # prefill imports this module

    return PrefillConfig


def _file_name(device_name: str) -> str:
    return device_name.replace(" ", "_").replace("/", "_") + ".json"


def table_path(device_name: str) -> Path:
    """The shipped table of ``device_name`` (``moe/configs/<name>.json``)."""
    return _CONFIG_DIR / _file_name(device_name)


def user_config_dir() -> Path:
    """``$SGLANG_FP4EXT_CONFIG_DIR`` when set, else ``~/.cache/sglang_fp4ext/configs``."""
    return Path(envs.CONFIG_DIR.get()).expanduser()


def user_table_path(device_name: str) -> Path:
    return user_config_dir() / _file_name(device_name)


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
                        f"{where}: a v2 bucket is {{\"path\": ..., \"config\": {{...}}}}, got "
                        f"{entry!r:.120}"
                    )
                path, cfg = entry["path"], entry["config"]
                if path not in PATHS:
                    raise ConfigTableError(f"{where}, field 'path': must be one of {PATHS}, "
                                           f"got {path!r}")
            entries[int(b)] = TableEntry(path, _parse_config(_config_class(path), cfg, where))
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
def load_entries(device_name: str) -> dict:
    """{shape key: {bucket: TableEntry}}: the shipped table, with the user table's shapes on
    top (see the module docstring); {} when neither exists."""
    out = {}
    for path in (table_path(device_name), user_table_path(device_name)):
        if path.exists():
            dev, entries = read_table_file(path)
            if dev != device_name:
                raise ConfigTableError(
                    f"{path}: device_name {dev!r} does not match the file's device {device_name!r}"
                )
            out.update(entries)
    return out


def load_table(device_name: str) -> dict:
    """The decode view: {shape key: {bucket: KernelConfig}} of the decode entries."""
    return {
        key: {b: e.config for b, e in buckets.items() if e.path == "decode"}
        for key, buckets in load_entries(device_name).items()
    }


def clear_table_cache() -> None:
    """Re-read the tables on the next call (after writing one, or changing the env var)."""
    load_entries.cache_clear()


_OVERRIDE = None


def set_config_override(cfg) -> None:
    """Test/benchmark only: force ``cfg`` for every call until :func:`reset_config_override`.

    A :class:`KernelConfig` forces the decode path, a ``PrefillConfig`` the prefill path."""
    global _OVERRIDE
    if cfg is not None and not isinstance(cfg, (KernelConfig, _config_class("prefill"))):
        raise TypeError(f"expected a KernelConfig or PrefillConfig, got {type(cfg).__name__}")
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
    """``"prefill"`` from bucket :data:`PREFILL_MIN_TOKENS` up, else ``"decode"``."""
    return "prefill" if token_bucket(T) >= PREFILL_MIN_TOKENS else "decode"


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


def select(T: int, shape: MoEShape, target: Target | None = None) -> TableEntry:
    """Kernel path and config for ``T`` tokens: override, else table entry, else heuristics.

    Depends only on (``token_bucket(T)``, shape, target), so a captured graph keeps its path."""
    if _OVERRIDE is not None:
        return TableEntry("decode" if isinstance(_OVERRIDE, KernelConfig) else "prefill", _OVERRIDE)
    target = target or current_target()
    entry = table_entry(T, shape, target)
    if entry is not None:
        return entry
    if heuristic_path(T, shape, target) == "prefill":
        from sglang_fp4ext.moe.prefill import prefill_heuristic_config

        return TableEntry("prefill", prefill_heuristic_config(T, shape, target))
    return TableEntry("decode", heuristic_config(T, shape, target))


def _path_config(path: str, T: int, shape: MoEShape, target: Target | None):
    """``path``'s config for ``T`` tokens: override of that path's type, else the tuned entry if
    the table puts ``T`` on ``path``, else ``path``'s heuristic."""
    if isinstance(_OVERRIDE, _config_class(path)):
        return _OVERRIDE
    target = target or current_target()
    entry = table_entry(T, shape, target)
    if entry is not None and entry.path == path:
        return entry.config
    if path == "decode":
        return heuristic_config(T, shape, target)
    from sglang_fp4ext.moe.prefill import prefill_heuristic_config

    return prefill_heuristic_config(T, shape, target)


def config_for(T: int, shape: MoEShape, target: Target | None = None) -> KernelConfig:
    """The decode config for ``T`` tokens: override, else tuned decode entry, else heuristic."""
    return _path_config("decode", T, shape, target)


def prefill_config_for(T: int, shape: MoEShape, target: Target | None = None):
    """The prefill config for ``T`` tokens: override, else tuned prefill entry, else heuristic."""
    return _path_config("prefill", T, shape, target)
