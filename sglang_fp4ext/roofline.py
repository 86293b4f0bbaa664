"""MoE decode roofline: bytes that must move, the time floor and efficiencies.

Decode MoE is bound by bandwidth and latency, not FLOPs: each weight byte read serves only the
few tokens routed to its expert. Per MoE layer, per decode step, per GPU:

* ``D(B) = E·(1 − (1 − k/E)^B)``: expected distinct experts that ``B`` tokens touch with top-``k``
  of ``E`` under uniform routing (real routing is skewed, so measured ``D`` is usually smaller;
  benchmarks count it from the actual ``topk_ids`` with :func:`distinct_experts`). Under EP the
  per-rank mean is ``E_local·(1 − (1 − k/E)^B)``; the step waits for the busiest rank
  (:func:`expected_busiest_rank_experts`).
* ``bytes = D · expert_bytes`` (+ activations), ``T_min = bytes / BW``.

**NVFP4 W4A16 bytes per expert** (:func:`nvfp4_expert_bytes`, SGLang's layout as in
``moe/weights.py``), for hidden ``H`` and per-rank intermediate ``I``:

==================  ===============  ==================================================
tensors             bytes            what
==================  ===============  ==================================================
``w13``, ``w2``     ``3·H·I / 2``    E2M1 codes, two per byte
``*_scale``         ``3·H·I / 16``   one e4m3 block scale per 16 weights along K
``*_scale_2``       ``3 · 4``        fp32 globals: ``w13_scale_2`` (gate, up), ``w2_scale_2``
==================  ===============  ==================================================

Not counted: ``*_input_scale`` (W4A4 only; W4A16 never reads them), router weights and logits,
``topk_ids``/``topk_weights``, and the GEMM1→GEMM2 intermediate (a fused kernel never writes it;
writing it is an implementation cost, not part of the floor). Activations are counted only when
``tokens`` is given: the bf16 input read once and the bf16 output written once, ``2·T·H·2`` B.
GLM-5 TP8 (H=6144, I=256): 2,654,220 B per expert; EP8 (I=2048): 21,233,676 B (HM §6).

Efficiency is stated against **bandwidth measured on the same GPU in the same run**, against the
spec bandwidth, or against the **dense** tensor peak (``hardware.dense_peak``), and each
:class:`Efficiency` carries a ``basis`` string saying which. A :class:`Projection` to another GPU
is always labelled as such (``projection.py``).

The model presets (``ModelShape``, ``PRESETS``) are in ``model_shapes.py``.

Units: bytes, microseconds, bytes/s (``*_Bps``), TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_fp4ext.gpu_spec import GPUSpec
from sglang_fp4ext.hardware import dense_peak

__all__ = [
    "Efficiency",
    "achieved_Bps",
    "achieved_tbps",
    "activation_bytes",
    "bandwidth_efficiency",
    "bandwidth_fraction",
    "bytes_floor",
    "compute_efficiency",
    "distinct_experts",
    "distinct_experts_tensor",
    "expected_busiest_rank_experts",
    "expected_distinct_experts",
    "moe_flops",
    "nvfp4_expert_bytes",
    "spec_bandwidth_efficiency",
    "time_floor_us",
]

NVFP4_BLOCK = 16
_GLOBAL_SCALE_BYTES = 3 * 4  # w13_scale_2 (gate, up) + w2_scale_2, fp32


# ---- expected and actual distinct experts -----------------------------------------------------


def expected_distinct_experts(tokens: int, n_experts: int, top_k: int) -> float:
    """``D(B) = E·(1 − (1 − k/E)^B)``: expected distinct experts under uniform top-k routing."""
    if n_experts < 1 or not 1 <= top_k <= n_experts:
        raise ValueError(f"need 1 <= top_k <= n_experts, got top_k={top_k}, n_experts={n_experts}")
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def expected_busiest_rank_experts(
    tokens: int, n_experts: int, top_k: int, ep: int, *, samples: int = 2000, generator=None
) -> float:
    """Monte Carlo mean, over uniform routings, of the most local experts any of ``ep`` ranks
    touches (expert ``e`` lives on rank ``e // (E/ep)``). The EP step waits for this rank."""
    import torch

    if n_experts % ep:
        raise ValueError(f"n_experts={n_experts} is not divisible by ep={ep}")
    expected_distinct_experts(tokens, n_experts, top_k)  # validates the rest
    if tokens == 0:
        return 0.0
    total, chunk = 0.0, max(1, (1 << 22) // (tokens * n_experts))
    for start in range(0, samples, chunk):
        s = min(chunk, samples - start)
        # top-k of iid uniforms = a uniform k-subset, i.e. uniform routing without replacement
        ids = torch.rand(s, tokens, n_experts, generator=generator).topk(top_k, dim=-1).indices
        hit = torch.zeros(s, n_experts, dtype=torch.bool)
        hit.scatter_(1, ids.reshape(s, -1), True)
        total += hit.view(s, ep, n_experts // ep).sum(-1).amax(-1).double().sum().item()
    return total / samples


def distinct_experts_tensor(topk_ids):
    """Number of distinct ids ``>= 0`` in ``topk_ids`` (any shape, integer dtype), as a 0-d
    int64 tensor on the same device. Sort-based, so no host sync (``-1`` = not local under EP)."""
    import torch

    if (
        topk_ids.dtype.is_floating_point
        or topk_ids.dtype.is_complex
        or topk_ids.dtype == torch.bool
    ):
        raise TypeError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")
    ids = topk_ids.reshape(-1).to(torch.int64)
    if ids.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=ids.device)
    s = torch.sort(ids).values
    first = torch.ones_like(s, dtype=torch.bool)
    first[1:] = s[1:] != s[:-1]
    return (first & (s >= 0)).sum()


def distinct_experts(topk_ids) -> int:
    """Distinct expert ids ``>= 0`` actually present in ``topk_ids``, as an int for reporting
    (one host sync to read it)."""
    return int(distinct_experts_tensor(topk_ids).item())


# ---- bytes, time, FLOPs -----------------------------------------------------------------------


def nvfp4_expert_bytes(hidden: int, intermediate: int) -> int:
    """Bytes one NVFP4 expert streams in a W4A16 MoE (w13 + w2 codes, e4m3 block scales, fp32
    globals; table in the module docstring). ``intermediate`` is the per-rank size."""
    for name, v in (("hidden", hidden), ("intermediate", intermediate)):
        if v <= 0 or v % NVFP4_BLOCK:
            raise ValueError(
                f"{name}={v} must be a positive multiple of {NVFP4_BLOCK} (NVFP4 block)"
            )
    weights = 3 * hidden * intermediate
    return weights // 2 + weights // NVFP4_BLOCK + _GLOBAL_SCALE_BYTES


def activation_bytes(tokens: int, hidden: int) -> int:
    """bf16 hidden states read once and the bf16 output written once: ``2·T·H·2``."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return 2 * tokens * hidden * 2


def bytes_floor(n_distinct: float, hidden: int, intermediate: int, *, tokens: int = 0) -> float:
    """Minimum bytes one MoE layer moves on one GPU: ``n_distinct`` experts' NVFP4 weights,
    plus activations when ``tokens`` > 0. ``n_distinct`` may be an expectation (float)."""
    if n_distinct < 0:
        raise ValueError(f"n_distinct must be >= 0, got {n_distinct}")
    return n_distinct * nvfp4_expert_bytes(hidden, intermediate) + activation_bytes(tokens, hidden)


def time_floor_us(nbytes: float, bandwidth_Bps: float) -> float:
    """``bytes / bandwidth`` in microseconds."""
    if bandwidth_Bps <= 0:
        raise ValueError(f"bandwidth_Bps must be > 0, got {bandwidth_Bps}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    return nbytes / bandwidth_Bps * 1e6


def achieved_Bps(nbytes: float, time_us: float) -> float:
    if time_us <= 0:
        raise ValueError(f"time_us must be > 0, got {time_us}")
    return nbytes / (time_us * 1e-6)


def achieved_tbps(nbytes: float, time_us: float) -> float:
    return achieved_Bps(nbytes, time_us) / 1e12


def bandwidth_fraction(nbytes: float, time_us: float, bandwidth_Bps: float) -> float:
    """Achieved bytes/s over ``bandwidth_Bps``."""
    if bandwidth_Bps <= 0:
        raise ValueError(f"bandwidth_Bps must be > 0, got {bandwidth_Bps}")
    return achieved_Bps(nbytes, time_us) / bandwidth_Bps


def moe_flops(tokens: int, top_k: int, hidden: int, intermediate: int) -> int:
    """``2·T·k·3·H·I``: GEMM1 (2I x H) plus GEMM2 (H x I) per routed (token, expert) pair."""
    if min(tokens, top_k, hidden, intermediate) < 0:
        raise ValueError("tokens, top_k, hidden and intermediate must be >= 0")
    return 2 * tokens * top_k * 3 * hidden * intermediate


# ---- efficiency -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Efficiency:
    """``fraction = achieved / reference``; ``basis`` names the reference, e.g. "measured copy
    bandwidth 4.27 TB/s (this run)" or "dense BF16 peak 989 TFLOPS (NVIDIA H200 (SXM))"."""

    fraction: float
    achieved: float
    unit: str
    basis: str

    def __str__(self) -> str:
        return f"{self.achieved:.3g} {self.unit} = {self.fraction:.1%} of {self.basis}"


def bandwidth_efficiency(
    nbytes: float, time_us: float, measured_bw_Bps: float, *, what: str = "copy bandwidth"
) -> Efficiency:
    """Against bandwidth measured on this GPU in this run (the preferred basis)."""
    return Efficiency(
        bandwidth_fraction(nbytes, time_us, measured_bw_Bps),
        achieved_tbps(nbytes, time_us),
        "TB/s",
        f"measured {what} {measured_bw_Bps / 1e12:.3g} TB/s (this run)",
    )


def spec_bandwidth_efficiency(nbytes: float, time_us: float, spec: GPUSpec) -> Efficiency:
    src = spec.source("mem_bandwidth_gbs")
    kind = src.kind if src is not None else "?"
    return Efficiency(
        bandwidth_fraction(nbytes, time_us, spec.mem_bandwidth_Bps),
        achieved_tbps(nbytes, time_us),
        "TB/s",
        f"spec DRAM bandwidth {spec.mem_bandwidth_gbs / 1e3:.3g} TB/s ({spec.name}, {kind})",
    )


def compute_efficiency(flops: float, time_us: float, spec: GPUSpec, precision: str) -> Efficiency:
    """Against the **dense** tensor peak; refuses where the table has none (never sparse)."""
    peak = dense_peak(spec, precision)
    src = spec.source(f"dense.{precision}")
    if peak is None:
        why = src.cite if src is not None else "no figure"
        raise ValueError(f"{spec.name} has no dense {precision} peak to compare against: {why}")
    if time_us <= 0:
        raise ValueError(f"time_us must be > 0, got {time_us}")
    tflops = flops / (time_us * 1e-6) / 1e12
    return Efficiency(
        tflops / peak,
        tflops,
        "TFLOP/s",
        f"dense {precision.upper()} peak {peak:g} TFLOPS ({spec.name}, {src.kind})",
    )
