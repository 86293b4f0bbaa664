"""A/B of the decode warp splits against the table's configs (GPU): one run, one JSON.

    PYTHONPATH=. python benchmarks/experiments/warp_split_ab.py OUT.json [seconds]

For GLM-5 TP8 and EP8 and T = 1..64: the table's config (``table``), GEMM1's K over 8 warps
(``wsplit1``), the token-centric GEMM2's experts over 8 warps (``wsplit2``) and ``both``; each
checked against the fp32 twin on the first copy (poisoned output; rms 5e-3 / max 1e-2 as the GPU
tier) and timed as CUDA-graph replay over 4 rotated layer copies, copy bandwidth measured in the
same run. Prints a table last; ``benchmarks/results/warp_split_sass_sm90.json`` has the static
SASS side of the same variants.
"""

import dataclasses
import json
import sys
import time

import torch

from sglang_fp4ext.bench import GLM5_EP8, GLM5_TP8, random_packed_weights, uniform_routing
from sglang_fp4ext.bench.timing import copy_bandwidth_Bps, time_graph_replay
from sglang_fp4ext.moe.config import config_for, current_target
from sglang_fp4ext.moe.fused_moe import PreparedMoEWeights, fused_moe_nvfp4
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.testing.compare import error_stats

W1 = dict(wsplit1=8, warps1=8, block_n1=32, split_k1=1, stages1=2)
W2 = dict(gemm2="tokens", wsplit2=8, warps2=8, block_n2=32, split_k2=1, tiles2=1, stages2=2)
VARIANTS = {"table": {}, "wsplit1": W1, "wsplit2": W2, "both": {**W1, **W2}}


def main(out_path: str, budget_s: float = 240.0) -> int:
    deadline = time.time() + budget_s
    bw = copy_bandwidth_Bps()
    target = current_target()
    rows = []
    for bs in (GLM5_TP8, GLM5_EP8):
        gen = torch.Generator(device="cuda").manual_seed(1)
        packs = [
            random_packed_weights(bs.E_local, bs.H, bs.I, device="cuda", generator=gen)
            for _ in range(4)
        ]
        prep = [PreparedMoEWeights.from_moe_weights(p) for p in packs]
        shape = prep[0].shape(bs.top_k)
        for T in (1, 2, 4, 8, 16, 32, 64):
            routes = [uniform_routing(T, bs, device="cuda", generator=gen) for _ in range(4)]
            xs = [
                torch.randn(T, bs.H, device="cuda", generator=gen).to(torch.bfloat16)
                for _ in range(4)
            ]
            outs = [torch.empty(T, bs.H, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
            ref = fused_moe_nvfp4_torch(xs[0], packs[0], routes[0][0], routes[0][1])
            base = config_for(T, shape, target)
            for name, kw in VARIANTS.items():
                if time.time() > deadline:
                    break
                cfg = dataclasses.replace(base, **kw)
                row = dict(shape=bs.name, T=T, variant=name, config=repr(cfg))
                try:
                    outs[0].fill_(float("nan"))
                    ids, tw = routes[0][0], routes[0][1]
                    fused_moe_nvfp4(xs[0], prep[0], ids, tw, out=outs[0], config=cfg)
                    st = error_stats(outs[0], ref)
                    row.update(rms_rel=st.rms_rel, max_rel=st.max_rel, nonfinite=st.nonfinite)
                    row["ok"] = st.nonfinite == 0 and st.rms_rel <= 5e-3 and st.max_rel <= 1e-2

                    def step(i, cfg=cfg, xs=xs, prep=prep, routes=routes, outs=outs):
                        r = routes[i]
                        return fused_moe_nvfp4(xs[i], prep[i], r[0], r[1], out=outs[i], config=cfg)

                    row["us"] = time_graph_replay(step, 4, replays=10, warmup_ms=20).us_per_call
                except Exception as exc:  # a variant that fails to compile or launch is recorded
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
    meta = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=__import__("triton").__version__,
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        copy_bandwidth_TBps=bw / 1e12,
    )
    with open(out_path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"\n{'shape':10} {'T':>3} " + " ".join(f"{v:>10}" for v in VARIANTS))
    for bs in (GLM5_TP8, GLM5_EP8):
        for T in (1, 2, 4, 8, 16, 32, 64):
            cells = []
            for v in VARIANTS:
                key = (bs.name, T, v)
                r = next((r for r in rows if (r["shape"], r["T"], r["variant"]) == key), None)
                cells.append("-" if r is None else "err" if "error" in r else
                             f"{r['us']:.1f}{'' if r['ok'] else '!'}")  # fmt: skip
            print(f"{bs.name:10} {T:>3} " + " ".join(f"{c:>10}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(float(a) for a in sys.argv[2:3])))
