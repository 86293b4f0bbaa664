"""One-off experiment (2026-11-30, H200): GEMM1/GEMM2 warps x stages x BN sweep around the table configs.

CUDA-graph replay over 4 rotated layer copies; results summarised in
benchmarks/results/decode_diagnosis_h200.json. Run: PYTHONPATH=. python benchmarks/experiments/decode_knobs_1.py 300
"""
import dataclasses, json, os, sys, time, itertools
import torch
from sglang_fp4ext.bench import GLM5_TP8, GLM5_EP8, random_packed_weights, uniform_routing, nvfp4_bytes_per_expert
from sglang_fp4ext.bench.timing import time_graph_replay, copy_bandwidth_Bps, kernel_times_us
from sglang_fp4ext.moe.config import config_for
from sglang_fp4ext.moe.decode import fused_moe_nvfp4
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.shape import current_target
OUT = os.environ.get("OUT", "/tmp")
res = {"bw": copy_bandwidth_Bps() / 1e12}
print("copy bw", res["bw"], flush=True)
target = current_target()
rows = []
deadline = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 200)
for bs, Ts in ((GLM5_TP8, (1, 16, 64)), (GLM5_EP8, (1, 16))):
    gen = torch.Generator(device="cuda").manual_seed(1)
    packs = [random_packed_weights(bs.E_local, bs.H, bs.I, device="cuda", generator=gen) for _ in range(4)]
    prep = [PreparedMoEWeights.from_moe_weights(p) for p in packs]
    del packs
    shape = prep[0].shape(bs.top_k)
    for T in Ts:
        routes = [uniform_routing(T, bs, device="cuda", generator=gen) for _ in range(4)]
        xs = [torch.randn(T, bs.H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4)]
        outs = [torch.empty(T, bs.H, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
        base = config_for(T, shape, target)
        def run(cfg):
            f = lambda i: fused_moe_nvfp4(xs[i], prep[i], routes[i][0], routes[i][1], out=outs[i], config=cfg)
            try:
                return time_graph_replay(f, 4, replays=5, warmup_ms=10).us_per_call
            except Exception as e:
                return str(e)[:100]
        b_us = run(base)
        kt = kernel_times_us(lambda i: fused_moe_nvfp4(xs[i], prep[i], routes[i][0], routes[i][1], out=outs[i], config=base), 4)
        print(f"== {bs.name} T={T} base {b_us:.1f} us {base} kernels { {k:round(v,1) for k,v in kt.items() if 'moe' in k} }", flush=True)
        rows.append(dict(shape=bs.name, T=T, which="base", cfg=repr(base), us=b_us))
        for bn, w, st in itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4, 5)):
            if time.time() > deadline: break
            if bn == 128 and w == 2: continue
            try: c = dataclasses.replace(base, block_n1=bn, warps1=w, stages1=st)
            except ValueError: continue
            if c == base: continue
            us = run(c)
            rows.append(dict(shape=bs.name, T=T, which="g1", bn=bn, w=w, st=st, us=us))
            print(f"  g1 bn={bn} w={w} st={st}: {us}", flush=True)
        for bn, w, st in itertools.product((32, 64, 128), (2, 4, 8), (2, 3, 4)):
            if time.time() > deadline: break
            if bn == 128 and w == 2: continue
            try: c = dataclasses.replace(base, block_n2=bn, warps2=w, stages2=st)
            except ValueError: continue
            if c == base: continue
            us = run(c)
            rows.append(dict(shape=bs.name, T=T, which="g2", bn=bn, w=w, st=st, us=us))
            print(f"  g2 bn={bn} w={w} st={st}: {us}", flush=True)
        json.dump(dict(res, rows=rows), open(f"{OUT}/exp1.json", "w"), indent=1)
    del prep
    torch.cuda.empty_cache()
# summary
print("\nbest per case:")
for key in sorted({(r['shape'], r['T']) for r in rows}):
    rs = [r for r in rows if (r['shape'], r['T']) == key and isinstance(r['us'], float)]
    base = [r for r in rs if r['which'] == 'base'][0]
    for wh in ("g1", "g2"):
        c = [r for r in rs if r['which'] == wh]
        if c:
            b = min(c, key=lambda r: r['us'])
            print(key, wh, f"base {base['us']:.1f} best {b['us']:.1f}", {k: b[k] for k in ('bn', 'w', 'st')})
