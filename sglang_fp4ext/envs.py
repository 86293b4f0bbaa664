"""Every environment variable sglang_fp4ext reads: name, type, default, meaning."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["EnvVar", "SGLANG_VERSION_OVERRIDE", "LOG_LEVEL", "CONFIG_DIR", "ALL"]


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None
    doc: str

    def get(self) -> str | None:
        value = os.environ.get(self.name)
        return value if value not in (None, "") else self.default


SGLANG_VERSION_OVERRIDE = EnvVar(
    "SGLANG_FP4EXT_SGLANG_VERSION",
    None,
    "Treat the installed SGLang as this version (for dev builds whose version string does not "
    "parse, e.g. a source checkout). The compatibility check then uses this value.",
)

LOG_LEVEL = EnvVar(
    "SGLANG_FP4EXT_LOG_LEVEL",
    None,
    "Log level for the sglang_fp4ext logger (DEBUG, INFO, ...); default: inherit SGLang's.",
)

CONFIG_DIR = EnvVar(
    "SGLANG_FP4EXT_CONFIG_DIR",
    "~/.cache/sglang_fp4ext/configs",
    "Directory of user kernel-config tables (<GPU name>.json, written by `fp4ext tune`), read "
    "before the tables shipped in sglang_fp4ext/moe/configs/.",
)

ALL = (SGLANG_VERSION_OVERRIDE, LOG_LEVEL, CONFIG_DIR)
