"""Where the config tables are read from, layered, and cached per process.

The user directory first -- ``$SGLANG_FP4EXT_CONFIG_DIR`` when set, else
``~/.cache/sglang_fp4ext/configs`` (where ``fp4ext tune`` writes by default) -- then the table
tuned at a server's first start (:func:`start_table_path`: under the user directory, keyed by
Triton and fp4ext version, so an upgrade tunes again; ``start_tune.py``), then the tables shipped
in ``moe/configs/``. Each file is named ``<device name>.json`` (spaces and ``/`` replaced by
``_``, e.g. ``NVIDIA_H200.json``; its format: ``table_format.py``). A shape present in a table
replaces that shape of the tables after it as a whole (a tuned shape's buckets and switch point
belong together); other shapes still come from those. :func:`shape_table` says which file holds
a shape. Tables are read once per process (cached; :func:`clear_table_cache` after writing one).
"""

from __future__ import annotations

import functools
from pathlib import Path

from sglang_fp4ext import __version__, envs
from sglang_fp4ext.moe.table_format import ConfigTableError, read_table_file

__all__ = [
    "CONFIG_DIR_ENV",
    "SHIPPED_CONFIG_DIR",
    "table_file_name",
    "clear_table_cache",
    "load_entries",
    "load_table",
    "shape_table",
    "start_table_path",
    "table_path",
    "user_config_dir",
    "user_table_path",
]

#: The tables that ship with the package, one ``table_file_name(device)`` each.
SHIPPED_CONFIG_DIR = Path(__file__).parent / "configs"
#: Environment variable naming the user table directory (checked before the shipped tables).
CONFIG_DIR_ENV = envs.CONFIG_DIR.name


def table_file_name(device_name: str) -> str:
    """A device's table file name (spaces and slashes become underscores)."""
    return device_name.replace(" ", "_").replace("/", "_") + ".json"


def table_path(device_name: str) -> Path:
    """The shipped table of ``device_name`` (``moe/configs/<name>.json``)."""
    return SHIPPED_CONFIG_DIR / table_file_name(device_name)


def user_config_dir() -> Path:
    """``$SGLANG_FP4EXT_CONFIG_DIR`` when set, else ``~/.cache/sglang_fp4ext/configs``."""
    return Path(envs.CONFIG_DIR.value()).expanduser()


def user_table_path(device_name: str) -> Path:
    return user_config_dir() / table_file_name(device_name)


def start_table_path(device_name: str) -> Path:
    """The table tuned at a server's first start on ``device_name`` with this Triton and fp4ext:
    ``<user dir>/tuned-at-start/triton-<version>_fp4ext-<version>/<device name>.json``."""
    import triton

    versions = f"triton-{triton.__version__}_fp4ext-{__version__}"
    return user_config_dir() / "tuned-at-start" / versions / table_file_name(device_name)


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


def shape_table(device_name: str, key: str) -> Path | None:
    """The table file that holds shape ``key`` on ``device_name`` (None: no table has it)."""
    return _read_tables(device_name)[1].get(key)
