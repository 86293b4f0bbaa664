"""GPU timing for the benchmarks: the CUDA-graph replay timer (``graph_timing``, shared with the
tuner), per-kernel times, and the ceilings measured in the same run (device copy bandwidth, bf16
matmul rate, clocks).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from sglang_fp4ext.graph_timing import ReplayTiming, capture_replay, time_graph_replay

__all__ = [
    "ReplayTiming",
    "capture_replay",
    "time_graph_replay",
    "kernel_times_us",
    "copy_bandwidth_Bps",
    "bf16_matmul_tflops",
    "gpu_clocks",
]


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
