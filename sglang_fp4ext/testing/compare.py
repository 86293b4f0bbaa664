"""Test assertions on a kernel's output against its torch twin (the statistic:
``sglang_fp4ext.compare``)."""

from __future__ import annotations

import torch

from sglang_fp4ext.compare import ErrorStats, error_stats

__all__ = ["ErrorStats", "error_stats", "assert_close"]


def assert_close(
    actual: torch.Tensor, ref: torch.Tensor, *, max_rel: float, rms_rel: float, what: str = ""
) -> ErrorStats:
    """Assert ``actual`` matches ``ref`` within the stated tolerances; returns the stats."""
    st = error_stats(actual, ref)
    label = f"{what}: " if what else ""
    if st.nonfinite or st.max_rel > max_rel or st.rms_rel > rms_rel:
        raise AssertionError(f"{label}{st} (tolerance max_rel={max_rel:g}, rms_rel={rms_rel:g})")
    return st
