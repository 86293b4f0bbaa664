"""Which SGLang versions the plugin supports, and how the installed one is detected.

SGLang has no version mechanism for plugins (its hook targets are private methods that move
between releases), so the plugin checks the version itself and stays off outside the range it was
verified on. ``SGLANG_FP4EXT_SGLANG_VERSION`` overrides detection for dev builds.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sglang_fp4ext import envs

__all__ = ["SUPPORTED_SGLANG", "VerifiedRange", "installed_sglang_version", "check_sglang"]

#: Versions whose hook targets were verified (``fp4ext patches check`` re-verifies them).
SUPPORTED_SGLANG = SpecifierSet(">=0.5.23,<0.6")


@dataclass(frozen=True)
class VerifiedRange:
    ok: bool
    version: str | None
    reason: str


def installed_sglang_version() -> str | None:
    """The installed SGLang version (or the override), None when SGLang is not installed."""
    override = envs.SGLANG_VERSION_OVERRIDE.get()
    if override:
        return override
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_sglang() -> VerifiedRange:
    """Is the installed SGLang inside ``SUPPORTED_SGLANG``? Never raises."""
    raw = installed_sglang_version()
    if raw is None:
        return VerifiedRange(False, None, "SGLang is not installed")
    try:
        version = Version(raw)
    except InvalidVersion:
        return VerifiedRange(
            False,
            raw,
            f"cannot parse SGLang version {raw!r}; set {envs.SGLANG_VERSION_OVERRIDE.name} "
            "to the release it corresponds to",
        )
    # Compare the public release so local builds (0.5.23+cu130) and post releases count.
    if Version(version.public) in SUPPORTED_SGLANG or version in SUPPORTED_SGLANG:
        return VerifiedRange(
            True, raw, f"SGLang {raw} is in the supported range {SUPPORTED_SGLANG}"
        )
    return VerifiedRange(
        False, raw, f"SGLang {raw} is outside the supported range {SUPPORTED_SGLANG}"
    )
