"""Every environment variable sglang_fp4ext reads: name, type, default, meaning."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "EnvVar",
    "SGLANG_VERSION_OVERRIDE",
    "LOG_LEVEL",
    "CONFIG_DIR",
    "SELFCHECK",
    "FAULT_INJECT",
    "PREFILL_ACTIVATIONS",
    "ALL",
]


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

SELFCHECK = EnvVar(
    "SGLANG_FP4EXT_SELFCHECK",
    None,
    "First-use kernel self-check (moe/selfcheck.py): on (default on a GPU) checks every kernel "
    "path and config against the torch twin before it serves and falls back from one that fails; "
    "off skips it (default under the Triton interpreter); warn checks and logs but serves.",
)

FAULT_INJECT = EnvVar(
    "SGLANG_FP4EXT_FAULT_INJECT",
    None,
    "Test-only: <path>:<family> (e.g. decode:dot) corrupts one output tile of that kernel family "
    "after it ran, to show the self-check catching a broken kernel. Never set it when serving.",
)

PREFILL_ACTIVATIONS = EnvVar(
    "SGLANG_FP4EXT_PREFILL_ACTIVATIONS",
    "auto",
    "Activation format of the prefill path: auto (default: NVFP4 with the checkpoint's static "
    "input scales, W4A4 on the FP4 tensor cores, on sm_100 / sm_120; bf16 elsewhere) or bf16 "
    "(W4A16 everywhere: FP4 weights decoded, bf16 activations). The decode path is always W4A16.",
)

ALL = (SGLANG_VERSION_OVERRIDE, LOG_LEVEL, CONFIG_DIR, SELFCHECK, FAULT_INJECT, PREFILL_ACTIVATIONS)
