"""CUDA-graph replay timing: the timer ``fp4ext tune`` (at the command line and at a server's
first start) and ``fp4ext bench`` share.

``time_graph_replay(step, n_copies)`` captures ONE CUDA graph that calls ``step(0)``,
``step(1)``, ... ``step(n_copies - 1)`` back to back (each index uses its own layer copy: weights
and inputs), replays it, and reports microseconds per call. With ``n_copies`` layer copies whose
weights together exceed the L2 (>= 4 copies of a GLM-5 layer: 4 x ~680 MB vs 50-60 MB of L2) every
call streams its weights from DRAM, as in a real decode step, and no host launch gap is timed.
``capture_replay`` is the capture both timers share (the pytest-benchmark suite keeps its graph
for its rounds). Each call runs eagerly once first (compiles, grows workspaces).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["ReplayTiming", "capture_replay", "time_graph_replay"]


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
