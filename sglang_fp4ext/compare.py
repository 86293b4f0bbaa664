"""Numerical comparison of a kernel's output against its torch twin.

Errors are normalised by ``max|ref|`` (as triton_kernels' ``testing.assert_close``): a relative
error per element would explode where the reference crosses zero, while the kernel's error scales
with the magnitude of the whole output. Two numbers are checked:

* ``max_rel`` = max|actual - ref| / max|ref|  (the worst element),
* ``rms_rel`` = rms(actual - ref) / rms(ref)   (the typical element).

Both are computed in float64 on the CPU. A non-finite value in ``actual`` where ``ref`` is finite
is counted (``nonfinite``), and the statistic names the worst coordinates. Used by the first-use
self-check, ``fp4ext tune`` and the benchmarks; ``testing.compare`` asserts on it in tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ErrorStats", "error_stats"]


@dataclass(frozen=True)
class ErrorStats:
    max_rel: float
    rms_rel: float
    worst_index: tuple[int, ...]
    worst_actual: float
    worst_ref: float
    nonfinite: int

    def __str__(self) -> str:
        return (
            f"max_rel={self.max_rel:.3e} rms_rel={self.rms_rel:.3e} "
            f"worst at {self.worst_index}: actual={self.worst_actual:.6g} ref={self.worst_ref:.6g}"
            + (f" non-finite={self.nonfinite}" if self.nonfinite else "")
        )


def error_stats(actual: torch.Tensor, ref: torch.Tensor) -> ErrorStats:
    if actual.shape != ref.shape:
        raise AssertionError(
            f"shape mismatch: actual {tuple(actual.shape)} vs ref {tuple(ref.shape)}"
        )
    a = actual.detach().to("cpu", torch.float64)
    r = ref.detach().to("cpu", torch.float64)
    if r.numel() == 0:
        return ErrorStats(0.0, 0.0, (), 0.0, 0.0, 0)
    if not torch.isfinite(r).all():
        raise AssertionError("reference has non-finite values; the test data is wrong")
    nonfinite = int((~torch.isfinite(a)).sum())
    diff = (a - r).abs()
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, float("inf")))
    scale = r.abs().max().item()
    rms_ref = r.pow(2).mean().sqrt().item()
    flat = int(diff.argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), r.shape))
    max_abs = diff.reshape(-1)[flat].item()
    rms_diff = diff.pow(2).mean().sqrt().item()
    return ErrorStats(
        max_rel=max_abs / scale if scale > 0 else max_abs,
        rms_rel=rms_diff / rms_ref if rms_ref > 0 else rms_diff,
        worst_index=idx,
        worst_actual=a.reshape(-1)[flat].item(),
        worst_ref=r.reshape(-1)[flat].item(),
        nonfinite=nonfinite,
    )
