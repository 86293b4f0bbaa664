"""GPU timing: CUDA-graph replay with rotated weights, and the copy bandwidth of the same run.

``time_graph_replay(step, n_copies)`` captures ONE CUDA graph that calls ``step(0)``,
``step(1)``, ... ``step(n_copies - 1)`` back to back (each index uses its own layer copy: weights
and inputs), replays it, and reports microseconds per call. With ``n_copies`` layer copies whose
weights together exceed the L2 (>= 4 copies of a GLM-5 layer: 4 x ~680 MB vs 50-60 MB of L2) every
call streams its weights from DRAM, as in a real decode step, and no host launch gap is timed
(kernel-techniques §8). Each call is run eagerly once first (compiles, grows workspaces).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "ReplayTiming",
    "time_graph_replay",
    "kernel_times_us",
    "copy_bandwidth_Bps",
    "gpu_clocks",
]


@dataclass(frozen=True)
class ReplayTiming:
    us_per_call: float  # median over replays
    us_min: float
    us_max: float
    replays: int
    n_copies: int


def time_graph_replay(
    step: Callable[[int], object], n_copies: int, *, replays: int = 20, warmup_ms: float = 100.0
) -> ReplayTiming:
    """Median microseconds per ``step`` call, timed as CUDA-graph replay over ``n_copies``."""
    if n_copies < 1:
        raise ValueError("n_copies must be >= 1")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(n_copies):  # eager warm-up: compile, allocate workspaces
            step(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n_copies):
            step(i)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # Warm-up replays for about warmup_ms of GPU time (clocks settle).
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / one))):
        graph.replay()
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / n_copies)
    del graph
    return ReplayTiming(statistics.median(times), min(times), max(times), replays, n_copies)


def kernel_times_us(step: Callable[[int], object], n_copies: int, *, calls: int = 16) -> dict:
    """Mean device time (us) per launch of each kernel ``step`` runs, by kernel name.

    Eager calls cycling over the ``n_copies`` layer copies under ``torch.profiler`` (device-side
    kernel durations, so host launch gaps are not counted): splits a call into its kernels.
    """
    from torch.profiler import ProfilerActivity, profile

    for i in range(n_copies):
        step(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for c in range(calls):
            step(c % n_copies)
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time", None)
        if t is None:
            t = getattr(ev, "cuda_time", 0.0)
        if ev.count and t:
            out[ev.key] = float(t)  # mean per call, us
    return out


def copy_bandwidth_Bps(nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth, counting bytes read + written (median of ``repeats``)."""
    n = nbytes // 2 // 4
    src = torch.randn(n, device="cuda")  # random, not zeros
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    moved = 2 * n * 4
    del src, dst
    return moved / statistics.median(times)


def gpu_clocks() -> dict:
    """SM and memory clocks (MHz) from nvidia-smi, or {} when unavailable."""
    import subprocess

    try:
        q = "clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu"
        r = subprocess.run(
            ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
        return dict(zip(q.split(","), vals))
    except Exception:
        return {}
