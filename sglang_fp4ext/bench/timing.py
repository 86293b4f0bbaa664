"""GPU timing: CUDA-graph replay with rotated weights, and the ceilings measured in the same run
(device copy bandwidth, bf16 matmul rate).

``time_graph_replay(step, n_copies)`` captures ONE CUDA graph that calls ``step(0)``,
``step(1)``, ... ``step(n_copies - 1)`` back to back (each index uses its own layer copy: weights
and inputs), replays it, and reports microseconds per call. With ``n_copies`` layer copies whose
weights together exceed the L2 (>= 4 copies of a GLM-5 layer: 4 x ~680 MB vs 50-60 MB of L2) every
call streams its weights from DRAM, as in a real decode step, and no host launch gap is timed.
``capture_replay`` is the capture both timers share (the pytest-benchmark
suite keeps its graph for its rounds). Each call runs eagerly once first (compiles, grows
workspaces).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "ReplayTiming",
    "capture_replay",
    "time_graph_replay",
    "kernel_times_us",
    "copy_bandwidth_Bps",
    "bf16_matmul_tflops",
    "gpu_clocks",
]


@dataclass(frozen=True)
class ReplayTiming:
    us_per_call: float  # median over replays
    us_min: float
    us_max: float
    replays: int
    n_copies: int


def capture_replay(step: Callable[[int], object], n_inputs: int, passes: int):
    """Capture one CUDA graph of ``passes`` x ``step(0 .. n_inputs - 1)`` and return
    ``(replay, calls)``: ``replay()`` runs it once, waits, and returns its device time in us
    (CUDA events). ``calls = passes * n_inputs`` must not depend on measured speed, or a
    regression gate comparing per-replay times would be blind (fixed by the caller). Each
    ``step(i)`` runs once eagerly first on a side stream (compiles, grows workspaces)."""
    if n_inputs < 1 or passes < 1:
        raise ValueError("n_inputs and passes must be >= 1")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(n_inputs):  # eager warm-up: compile, grow workspaces outside capture
            step(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(passes):
            for i in range(n_inputs):
                step(i)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def replay() -> float:
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    replay.graph = graph  # keep it alive as long as the callable
    return replay, passes * n_inputs


def time_graph_replay(
    step: Callable[[int], object], n_copies: int, *, replays: int = 20, warmup_ms: float = 100.0
) -> ReplayTiming:
    """Median microseconds per ``step`` call, timed as CUDA-graph replay over ``n_copies``."""
    if n_copies < 1:
        raise ValueError("n_copies must be >= 1")
    replay, calls = capture_replay(step, n_copies, 1)
    one_us = max(replay(), 1.0)
    for _ in range(max(1, int(warmup_ms * 1e3 / one_us))):  # clocks settle
        replay()
    times = [replay() / calls for _ in range(replays)]
    return ReplayTiming(statistics.median(times), min(times), max(times), replays, n_copies)


def kernel_times_us(step: Callable[[int], object], n_copies: int, *, calls: int = 16) -> dict:
    """Device time (us) per call of ``step`` in each kernel it runs, by kernel name (a kernel
    launched twice per call, as GEMM1 with its tail, counts both).

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
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0.0)
        if ev.count and t:
            out[ev.key] = float(t) / calls
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


def bf16_matmul_tflops(n: int = 8192, repeats: int = 10) -> float:
    """Measured dense bf16 matmul rate (``n``-cube ``torch.mm`` on random data), TFLOP/s."""
    g = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(n, n, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda", generator=g).to(torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b, out=c)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        torch.mm(a, b, out=c)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b, c
    return 2 * n**3 / statistics.median(times) / 1e12


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
