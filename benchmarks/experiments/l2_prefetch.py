"""One-off experiment (2026-11-30, H200): GEMM1 prefetching GEMM2's weights into L2 at small T.

For GLM-5 TP8/EP8 and T in argv (default 1,2,4,8): CUDA-graph replay over 4 rotated layer copies
with ``l2_prefetch`` off and on (same config), per-kernel device times, and a bit-identity check
(the prefetch must not change a single output bit). Prints a table last; JSON to $OUT.
"""
import json, os, sys
import torch
from sglang_fp4ext.bench import GLM5_EP8, GLM5_TP8, nvfp4_bytes_per_expert, random_packed_weights, uniform_routing
from sglang_fp4ext.bench.timing import copy_bandwidth_Bps, kernel_times_us, time_graph_replay
from sglang_fp4ext.moe.config import config_for
from sglang_fp4ext.moe.decode import fused_moe_nvfp4, prefetch_gemm2_weights
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.shape import current_target

Ts = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1,2,4,8").split(",")]
bw = copy_bandwidth_Bps()
target = current_target()
rows = []
for bs in (GLM5_TP8, GLM5_EP8):
    gen = torch.Generator(device="cuda").manual_seed(3)
    prep = [PreparedMoEWeights.from_moe_weights(random_packed_weights(bs.E_local, bs.H, bs.I, device="cuda", generator=gen)) for _ in range(4)]
    shape = prep[0].shape(bs.top_k)
    for T in Ts:
        routes = [uniform_routing(T, bs, device="cuda", generator=gen) for _ in range(4)]
        xs = [torch.randn(T, bs.H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4)]
        outs = [torch.empty(T, bs.H, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
        cfg = config_for(T, shape, target)
        res = {}
        for pf in (False, True):
            f = lambda i: fused_moe_nvfp4(xs[i], prep[i], routes[i][0], routes[i][1], out=outs[i], config=cfg, l2_prefetch=pf)
            outs[0].fill_(float("nan")); f(0); torch.cuda.synchronize()
            res[pf] = (time_graph_replay(f, 4, replays=20).us_per_call, outs[0].clone(),
                       {k: round(v, 1) for k, v in kernel_times_us(f, 4).items() if "_moe" in k})
        same = torch.equal(res[False][1], res[True][1])
        distinct = sum(r[2] for r in routes) / 4
        floor = distinct * nvfp4_bytes_per_expert(bs.H, bs.I) / bw * 1e6
        rows.append(dict(shape=bs.name, T=T, off_us=res[False][0], on_us=res[True][0], floor_us=floor,
                         bit_identical=same, kernels_off=res[False][2], kernels_on=res[True][2],
                         heuristic_on=prefetch_gemm2_weights(T, shape, prep[0]), config=repr(cfg)))
        print(rows[-1], flush=True)
    del prep; torch.cuda.empty_cache()
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bw_TBps": bw / 1e12,
       "l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size, "rows": rows}
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "l2_prefetch.json"), "w"), indent=1)
print(f"\n{'shape':9} {'T':>3} {'off us':>8} {'on us':>8} {'gain':>6} {'floor':>6} {'same':>5} heur")
for r in rows:
    print(f"{r['shape']:9} {r['T']:3d} {r['off_us']:8.1f} {r['on_us']:8.1f} {r['off_us']/r['on_us']-1:+6.1%} {r['floor_us']:6.1f} {str(r['bit_identical']):>5} {r['heuristic_on']}")
