"""Every environment variable sglang_fp4ext reads: name, default, allowed values, meaning.

``EnvVar.get()`` is the raw value (or the default); ``EnvVar.value()`` the checked, normalised
one, raising ``ValueError`` with one line that names the variable, its value and what is
allowed. :func:`problems` lists those lines for every bad variable: ``plugin.register()`` stops
the server on them at startup, ``fp4ext info`` flags them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "EnvVar",
    "SGLANG_VERSION_OVERRIDE",
    "LOG_LEVEL",
    "CONFIG_DIR",
    "SELFCHECK",
    "FAULT_INJECT",
    "PREFILL_ACTIVATIONS",
    "DEBUG",
    "TUNE_AT_START",
    "ALL",
    "problems",
    "tune_budget_s",
]


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str | None
    doc: str
    #: Allowed values, lower case (compared case-insensitively); None: any value ``check`` takes.
    choices: tuple[str, ...] | None = None
    #: Other spellings accepted for a choice, e.g. ``{"1": "on"}``.
    aliases: dict[str, str] = field(default_factory=dict)
    #: For free-form variables: the allowed values in words, and a test of a raw value.
    allowed: str = ""
    check: Callable[[str], bool] | None = None
    #: Normalise a valid value (e.g. upper-case a log level).
    normalise: Callable[[str], str] = str

    def get(self) -> str | None:
        value = os.environ.get(self.name)
        return value if value not in (None, "") else self.default

    def is_set(self) -> bool:
        return os.environ.get(self.name, "") != ""

    def allowed_text(self) -> str:
        """The allowed values in words: ``on, off or warn``."""
        if self.choices is None:
            return self.allowed
        return ", ".join(self.choices[:-1]) + f" or {self.choices[-1]}"

    def value(self) -> str | None:
        """The checked value (the default when unset); ``ValueError`` on a bad one."""
        raw = os.environ.get(self.name, "")
        if raw == "":
            return self.default
        v = raw.strip()
        if self.choices is not None:
            v = self.aliases.get(v.lower(), v.lower())
            ok = v in self.choices
        else:
            ok = self.check is None or self.check(v)
        if not ok:
            raise ValueError(f"{self.name} must be {self.allowed_text()}, got {raw!r}")
        return self.normalise(v)


def _is_version(v: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        Version(v)
    except InvalidVersion:
        return False
    return True


def _not_a_file(v: str) -> bool:
    return not os.path.exists(os.path.expanduser(v)) or os.path.isdir(os.path.expanduser(v))


#: Seconds ``SGLANG_FP4EXT_TUNE_AT_START=on`` gives a start: GLM-5 TP8's 14 buckets took 103 s on
#: the H200 at a 7.7 s share each (``benchmarks/results/tune_h200.json``); 300 s gives each ~21.
TUNE_AT_START_DEFAULT_S = 300.0
#: Shorter budgets than this would time little beyond each bucket's heuristic.
TUNE_AT_START_MIN_S = 10.0


def _is_tune_budget(v: str) -> bool:
    if v.lower() in ("on", "off", "1", "0", "true", "false"):
        return True
    try:
        return float(v) >= TUNE_AT_START_MIN_S
    except ValueError:
        return False


def _tune_value(v: str) -> str:
    """``on`` / ``off`` / the budget in seconds, spelled as a number (``900``)."""
    low = v.lower()
    if low in ("on", "1", "true"):
        return "on"
    if low in ("off", "0", "false"):
        return "off"
    return f"{float(v):g}"


def _is_fault(v: str) -> bool:
    path, _, family = v.partition(":")
    return path in ("decode", "prefill") and family != ""


SGLANG_VERSION_OVERRIDE = EnvVar(
    "SGLANG_FP4EXT_SGLANG_VERSION",
    None,
    "Treat the installed SGLang as this version (for dev builds whose version string does not "
    "parse, e.g. a source checkout). The compatibility check then uses this value.",
    allowed="a version such as 0.5.23",
    check=_is_version,
)

LOG_LEVEL = EnvVar(
    "SGLANG_FP4EXT_LOG_LEVEL",
    None,
    "Log level for the sglang_fp4ext logger; default: inherit SGLang's.",
    choices=("debug", "info", "warning", "error", "critical"),
    aliases={"warn": "warning"},
    normalise=str.upper,
)

CONFIG_DIR = EnvVar(
    "SGLANG_FP4EXT_CONFIG_DIR",
    "~/.cache/sglang_fp4ext/configs",
    "Directory of user kernel-config tables (<GPU name>.json, written by `fp4ext tune`), read "
    "before the tables shipped in sglang_fp4ext/moe/configs/.",
    allowed="a directory (created when missing), not a file",
    check=_not_a_file,
)

SELFCHECK = EnvVar(
    "SGLANG_FP4EXT_SELFCHECK",
    None,
    "First-use kernel self-check (moe/selfcheck.py): on (default on a GPU) checks every kernel "
    "path and config against the torch twin before it serves and falls back from one that fails; "
    "off skips it (default under the Triton interpreter); warn checks and logs but serves.",
    choices=("on", "off", "warn"),
    aliases={"1": "on", "true": "on", "0": "off", "false": "off"},
)

FAULT_INJECT = EnvVar(
    "SGLANG_FP4EXT_FAULT_INJECT",
    None,
    "Test-only: <path>:<family> (e.g. decode:dot) corrupts one output tile of that kernel family "
    "after it ran, to show the self-check catching a broken kernel. Never set it when serving.",
    allowed="<path>:<family> with path decode or prefill, e.g. decode:dot",
    check=_is_fault,
)

PREFILL_ACTIVATIONS = EnvVar(
    "SGLANG_FP4EXT_PREFILL_ACTIVATIONS",
    "auto",
    "Activation format of the prefill path: auto (default: NVFP4 with the checkpoint's static "
    "input scales, W4A4 on the FP4 tensor cores, on sm_100 / sm_120; bf16 elsewhere) or bf16 "
    "(W4A16 everywhere: FP4 weights decoded, bf16 activations). The decode path is always W4A16.",
    choices=("auto", "bf16"),
)

DEBUG = EnvVar(
    "SGLANG_FP4EXT_DEBUG",
    "0",
    "1: the fp4ext command shows the full stack of an error (as --debug does) instead of one line.",
    choices=("0", "1"),
    aliases={"true": "1", "false": "0", "on": "1", "off": "0"},
)

TUNE_AT_START = EnvVar(
    "SGLANG_FP4EXT_TUNE_AT_START",
    "off",
    "Tune at server start (start_tune.py): off (default); on: before CUDA-graph capture, each "
    "served MoE shape with no config table for this GPU has the token buckets the capture policy "
    f"captures tuned within a {TUNE_AT_START_DEFAULT_S:g} s budget, checked against the torch "
    "twin and written to the config directory (keyed by GPU, Triton and fp4ext version), which "
    "later starts reuse; or the budget in seconds, e.g. 900.",
    allowed=f"on, off or a time budget in seconds (at least {TUNE_AT_START_MIN_S:g}), e.g. 900",
    check=_is_tune_budget,
    normalise=_tune_value,
)

ALL = (
    SGLANG_VERSION_OVERRIDE,
    LOG_LEVEL,
    CONFIG_DIR,
    SELFCHECK,
    FAULT_INJECT,
    PREFILL_ACTIVATIONS,
    DEBUG,
    TUNE_AT_START,
)


def problems() -> list[str]:
    """One line per variable whose value is not allowed (empty when all are fine)."""
    out = []
    for var in ALL:
        try:
            var.value()
        except ValueError as exc:
            out.append(str(exc))
    return out


def tune_budget_s() -> float | None:
    """The start-tuning budget in seconds that ``SGLANG_FP4EXT_TUNE_AT_START`` sets; None: off."""
    v = TUNE_AT_START.value()
    if v == "off":
        return None
    return TUNE_AT_START_DEFAULT_S if v == "on" else float(v)
