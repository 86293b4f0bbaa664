"""Where the one-launch decode's time goes: each program's ``%globaltimer`` at its start, when its
GEMM1 items are done, when the grid-wide wait ends and at its end (``_coop``'s ``TIMES``), with L2
flushed before every call, next to the same tiles on two launches (CUDA events around eager
calls, same flush: they include the host's launch time, so only the in-kernel times are the
kernel's).

Prints per case the medians over calls of: the launch span (first start to last end), the spread
of program starts, GEMM1 (per program: median and max), the wait (last GEMM1 done to the wait's
end), GEMM2; writes ``coop_phases.json`` to ``--out``.

    PYTHONPATH=. python benchmarks/experiments/coop_phases.py --out /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

from sglang_fp4ext.bench.report import environment
from sglang_fp4ext.moe.decode.config import CoopDecodeConfig
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.decode.plan import plan
from tests import glm5_cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = ap.parse_args(argv)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    # The shapes' small T; GEMM2 alone (stale intermediate) once.
    cases = [(n, T, 0, {}) for n in ("tp8", "ep8") for T in (1, 4, 16)]
    cases.insert(1, ("tp8", 1, 0, {"PROBE_SKIP1": True}))
    for name, T, pf, probe in cases:
        base = "tp8_shared" if name == "tp8" else name
        _, pw = glm5_cases.weights(base)
        x, ids, tw = glm5_cases.inputs(base, T, g)
        if name == "tp8":
            ids, tw = ids[:, :8].contiguous(), tw[:, :8].contiguous()
        cfg = CoopDecodeConfig(
            split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32, prefetch2=pf
        )
        out = fused_moe_nvfp4(x, pw, ids, tw, config=cfg)  # compile, workspaces
        [L] = plan(x, pw, ids, tw, out, cfg, "coop")
        n = L.grid[0]
        times = torch.zeros(n, 8, dtype=torch.int64, device="cuda")
        kw = dict(L.kwargs, times_ptr=times, TIMES=True, **probe)
        spans, starts, g1_med, g1_max, waits, g2, g2med, g2first = [], [], [], [], [], [], [], []
        for _ in range(args.calls):
            flush.add_(1)
            L.fn()[L.grid](**kw, **L.options)
            torch.cuda.synchronize()
            t = (times - times[:, 0].min()).double().cpu() / 1e3  # us from the first start
            spans.append(float(t[:, 3].max()))
            starts.append(float(t[:, 0].max()))
            d1 = t[:, 1] - t[:, 0]
            g1_med.append(float(d1.median()))
            g1_max.append(float(d1.max()))
            waits.append(float(t[:, 2].min() - t[:, 1].max()))
            g2.append(float((t[:, 3] - t[:, 2]).max()))
            g2med.append(float((t[:, 3] - t[:, 2]).median()))
            g2first.append(float((t[:, 4] - t[:, 2]).median()))
        probe_out = out.clone()
        two = fused_moe_nvfp4(x, pw, ids, tw, config=cfg.two_launch())
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]

        def event_us(c):
            us = []
            for _ in range(args.calls):
                flush.add_(1)
                ev[0].record()
                fused_moe_nvfp4(x, pw, ids, tw, out=out, config=c)
                ev[1].record()
                torch.cuda.synchronize()
                us.append(ev[0].elapsed_time(ev[1]) * 1e3)
            return statistics.median(us)

        med = statistics.median
        row = dict(
            case=f"{name} T={T} prefetch2={pf} {probe or ''}",
            programs=n,
            max_abs_vs_two_launches=float((probe_out.float() - two.float()).abs().max()),
            two_launches_max_abs=float(two.float().abs().max()),
            span_us=med(spans),
            starts_spread_us=med(starts),
            gemm1_median_us=med(g1_med),
            gemm1_max_us=med(g1_max),
            wait_after_last_gemm1_us=med(waits),
            gemm2_max_us=med(g2),
            gemm2_median_us=med(g2med),
            gemm2_first_item_median_us=med(g2first),
            events_one_launch_us=event_us(cfg),
            events_two_launches_us=event_us(cfg.two_launch()),
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = dict(gpu=torch.cuda.get_device_name(), env=environment(), rows=rows)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "coop_phases.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
