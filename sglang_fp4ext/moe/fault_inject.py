"""Test-only fault injection (``SGLANG_FP4EXT_FAULT_INJECT=<path>:<family>``): a launcher calls
:func:`corrupt_if_asked` after its kernels, so tests can show the first-use self-check
(``selfcheck.py``) catching a broken kernel and falling back; ``experts.run_experts`` calls it
after the torch twin (``decode:reference``), so a CPU test can show ``fp4ext check`` failing.
Unset, it costs one lookup."""

from __future__ import annotations

import torch

from sglang_fp4ext import envs

__all__ = ["corrupt_if_asked"]


def corrupt_if_asked(path: str, family: str, out: torch.Tensor) -> None:
    """Corrupt one 1 x 64 output tile when the variable names this path and family."""
    if envs.FAULT_INJECT.get() == f"{path}:{family}" and out.numel():
        out[:1, :64] += 1000.0
