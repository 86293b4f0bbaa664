"""What the SGLang-side modules share: the backend's name and how to see a live hook.

``sglang_backend`` (runner core, hooks on the NVFP4 MoE method) and ``capture_hooks`` (the
capture policy's hooks) both ask whether a backend is fp4ext and whether one of their hooks sits
in HookRegistry's wrapper chain; the answers live here so neither imports the other for them.
Imports no SGLang.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BACKEND_NAME", "chain_has_hook", "is_fp4ext"]

BACKEND_NAME = "fp4ext"


def is_fp4ext(backend: Any) -> bool:
    """True for the fp4ext backend, given an enum member, a registered backend or a string."""
    return getattr(backend, "value", backend) == BACKEND_NAME


def chain_has_hook(fn: Any, hook: Callable) -> bool:
    """Walk HookRegistry's wrapper chain (``__wrapped__``) looking for ``hook`` in a closure."""
    seen = 0
    while fn is not None and seen < 64:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False
