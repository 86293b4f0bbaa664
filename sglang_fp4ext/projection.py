"""A time measured on one GPU projected onto another: its bandwidth-bound part scaled by the two
GPUs' streaming bandwidths (:func:`projection`), or its FLOPs at the other's dense peak
(:func:`compute_projection`). Every result is labelled a PROJECTION (``projection=True``, which
cannot be switched off) and carries its assumptions. Bytes and floors: ``roofline.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_fp4ext.gpu_spec import GPUSpec
from sglang_fp4ext.hardware import dense_peak
from sglang_fp4ext.roofline import time_floor_us

__all__ = ["ComputeProjection", "Projection", "compute_projection", "projection"]


@dataclass(frozen=True)
class Projection:
    """A time **projected** for ``target``, not measured there. ``projection`` is always True so
    that no report can mistake it for a measurement."""

    target: str
    projected_us: float
    measured_us: float
    nbytes: float
    fixed_us: float  # carried over unscaled (e.g. launch latency measured with no work)
    scaled_us: float  # the bandwidth-bound part after scaling
    target_bw_Bps: float  # streaming bandwidth assumed on the target
    target_floor_us: float  # nbytes / target_bw_Bps
    assumptions: tuple[str, ...]
    projection: bool = True

    def __post_init__(self):
        if self.projection is not True:
            raise ValueError("a Projection is always labelled projection=True")

    def label(self) -> str:
        return (
            f"PROJECTION (not measured) for {self.target}: {self.projected_us:.1f} us "
            f"(floor {self.target_floor_us:.1f} us at {self.target_bw_Bps / 1e12:.3g} TB/s; "
            + "; ".join(self.assumptions)
            + ")"
        )


def projection(
    measured_us: float,
    nbytes: float,
    measured_bw_Bps: float,
    target_spec: GPUSpec,
    *,
    source_spec: GPUSpec | None = None,
    fixed_us: float = 0.0,
    measured_on: str | None = None,
) -> Projection:
    """Project a time measured here onto ``target_spec`` by scaling its bandwidth-bound part.

    ``measured_us - fixed_us`` is treated as bandwidth-bound and scaled by
    ``measured_bw / target_bw``, i.e. the kernel is assumed to reach the same fraction of the
    streaming bandwidth on the target. ``target_bw`` = the target's spec bandwidth times this
    GPU's measured/spec ratio when ``source_spec`` is given (the ratio cancels: the scale is
    ``source spec / target spec``); without it, the target's spec bandwidth (optimistic, said
    so). ``fixed_us`` (e.g. launch latency measured with no work) is carried over unscaled.
    Compute, clocks, L2 size and SM count are not modelled: decode MoE is bandwidth/latency bound.
    ``measured_on``: the GPU the time was measured on, where that is not this one (a results file).
    """
    if measured_us <= 0 or measured_bw_Bps <= 0 or nbytes < 0:
        raise ValueError("need measured_us > 0, measured_bw_Bps > 0, nbytes >= 0")
    if not 0 <= fixed_us < measured_us:
        raise ValueError(f"need 0 <= fixed_us < measured_us, got {fixed_us} and {measured_us}")
    where = "here" if measured_on is None else f"on {measured_on}"
    assumptions = [f"same fraction of streaming bandwidth as measured {where}"]
    if source_spec is not None:
        eff = measured_bw_Bps / source_spec.mem_bandwidth_Bps
        target_bw = target_spec.mem_bandwidth_Bps * eff
        assumptions.append(
            f"target streams at {eff:.0%} of its spec bandwidth, as {source_spec.name} did {where}"
        )
    else:
        target_bw = target_spec.mem_bandwidth_Bps
        assumptions.append("target streams at its full spec bandwidth (optimistic)")
    if fixed_us:
        assumptions.append(f"{fixed_us:g} us fixed cost carried over unscaled")
    bw_part = measured_us - fixed_us
    if nbytes / measured_bw_Bps * 1e6 > bw_part:
        assumptions.append(
            "measured time beats the bytes floor at the measured bandwidth (L2 hits?)"
        )
    scaled = bw_part * measured_bw_Bps / target_bw
    return Projection(
        target=target_spec.name,
        projected_us=fixed_us + scaled,
        measured_us=measured_us,
        nbytes=nbytes,
        fixed_us=fixed_us,
        scaled_us=scaled,
        target_bw_Bps=target_bw,
        target_floor_us=time_floor_us(nbytes, target_bw),
        assumptions=tuple(assumptions),
    )


@dataclass(frozen=True)
class ComputeProjection:
    """A compute-bound time **projected** for ``target`` (prefill), not measured there."""

    target: str
    precision: str
    projected_us: float
    efficiency: float  # fraction of the bf16 matmul rate measured here that the kernels reached
    target_rate_tflops: float  # the MMA rate assumed on the target
    assumptions: tuple[str, ...]
    projection: bool = True

    def __post_init__(self):
        if self.projection is not True:
            raise ValueError("a ComputeProjection is always labelled projection=True")

    def label(self) -> str:
        return (
            f"PROJECTION (not measured) for {self.target}, {self.precision.upper()} MMA: "
            f"{self.projected_us:.1f} us at {self.target_rate_tflops:.0f} TFLOP/s ("
            + "; ".join(self.assumptions)
            + ")"
        )


def compute_projection(
    flops: float,
    measured_us: float,
    measured_matmul_tflops: float,
    target_spec: GPUSpec,
    precision: str,
    *,
    source_spec: GPUSpec | None = None,
) -> ComputeProjection:
    """Project a compute-bound time (prefill) onto ``target_spec``'s dense ``precision`` peak.

    The kernels are assumed to reach the same fraction of the target's achievable MMA rate as
    they reached here of the bf16 matmul measured in the same run; "achievable" is the dense
    peak times this GPU's measured/spec bf16 ratio when ``source_spec`` is given (else the full
    dense peak, said to be optimistic). Bandwidth, L2 and SM count are not modelled: take the
    larger of this and :func:`projection`.
    """
    if measured_us <= 0 or measured_matmul_tflops <= 0 or flops <= 0:
        raise ValueError("need flops > 0, measured_us > 0, measured_matmul_tflops > 0")
    peak = dense_peak(target_spec, precision)
    if peak is None:
        raise ValueError(f"{target_spec.name} has no dense {precision} peak")
    eff = flops / (measured_us * 1e-6) / 1e12 / measured_matmul_tflops
    assumptions = [
        f"{eff:.0%} of the MMA rate, the fraction of the bf16 matmul the kernels reached here"
    ]
    src_peak = None if source_spec is None else dense_peak(source_spec, "bf16")
    if src_peak:
        achievable = measured_matmul_tflops / src_peak
        assumptions.append(
            f"the target's MMA reaches {achievable:.0%} of its dense peak, as bf16 did on "
            f"{source_spec.name} here"
        )
    else:
        achievable = 1.0
        assumptions.append("the target's MMA at its full dense peak (optimistic)")
    rate = eff * peak * achievable
    return ComputeProjection(
        target_spec.name, precision, flops / (rate * 1e12) * 1e6, eff, rate, tuple(assumptions)
    )
