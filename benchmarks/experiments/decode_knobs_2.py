"""One-off experiment (2026-11-30, H200): register cap (Triton maxnreg, i.e. occupancy) x BN x stages x split-K.

The cap is passed by wrapping the kernels' launchers. Summarised in
benchmarks/results/decode_diagnosis_h200.json. Run: PYTHONPATH=. python benchmarks/experiments/decode_knobs_2.py 260
"""
import dataclasses, json, os, sys, time, itertools
import torch
from sglang_fp4ext.bench import GLM5_TP8, GLM5_EP8, random_packed_weights, uniform_routing
from sglang_fp4ext.bench.timing import time_graph_replay
from sglang_fp4ext.moe import _decode_dot_kernels as K
from sglang_fp4ext.moe.config import config_for
from sglang_fp4ext.moe.decode import fused_moe_nvfp4
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.shape import current_target
OUT = os.environ.get("OUT", "/tmp")
REG = {"g1": None, "g2": None}
class Capped:
    def __init__(self, fn, key): self.fn, self.key = fn, key
    def __getitem__(self, grid):
        launch = self.fn[grid]
        def go(*a, **kw):
            if REG[self.key]: kw["maxnreg"] = REG[self.key]
            return launch(*a, **kw)
        return go
K._moe_gemm1 = Capped(K._moe_gemm1, "g1")
K._moe_gemm2 = Capped(K._moe_gemm2, "g2")
K._moe_gemm2_tok = Capped(K._moe_gemm2_tok, "g2")
target = current_target()
rows = []
deadline = time.time() + float(sys.argv[1])
for bs, Ts in ((GLM5_TP8, (1, 4, 16, 64)), (GLM5_EP8, (1, 16))):
    gen = torch.Generator(device="cuda").manual_seed(1)
    prep = [PreparedMoEWeights.from_moe_weights(random_packed_weights(bs.E_local, bs.H, bs.I, device="cuda", generator=gen)) for _ in range(4)]
    shape = prep[0].shape(bs.top_k)
    kc1 = prep[0].w13.k_pad // 256
    for T in Ts:
        routes = [uniform_routing(T, bs, device="cuda", generator=gen) for _ in range(4)]
        xs = [torch.randn(T, bs.H, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(4)]
        outs = [torch.empty(T, bs.H, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
        base = config_for(T, shape, target)
        def run(cfg, r1, r2):
            REG["g1"], REG["g2"] = r1, r2
            f = lambda i: fused_moe_nvfp4(xs[i], prep[i], routes[i][0], routes[i][1], out=outs[i], config=cfg)
            try:
                return time_graph_replay(f, 4, replays=5, warmup_ms=10).us_per_call
            except Exception as e:
                return str(e)[:100]
        b_us = run(base, None, None)
        print(f"== {bs.name} T={T} base {b_us:.1f} {base}", flush=True)
        rows.append(dict(shape=bs.name, T=T, which="base", us=b_us, cfg=repr(base)))
        for r1, bn, st, skm in itertools.product((128, 96, None), (32, 64), (2, 3), (1, 2)):
            if time.time() > deadline: break
            sk = base.split_k1 * skm
            if sk > kc1: continue
            try: c = dataclasses.replace(base, block_n1=bn, stages1=st, split_k1=sk)
            except ValueError: continue
            if c == base and r1 is None: continue
            us = run(c, r1, None)
            rows.append(dict(shape=bs.name, T=T, which="g1", reg=r1, bn=bn, st=st, sk=sk, us=us))
            print(f"  g1 reg={r1} bn={bn} st={st} sk={sk}: {us}", flush=True)
        for r2 in (128, 96, 64):
            if time.time() > deadline: break
            us = run(base, None, r2)
            rows.append(dict(shape=bs.name, T=T, which="g2", reg=r2, us=us))
            print(f"  g2 reg={r2}: {us}", flush=True)
        json.dump(rows, open(f"{OUT}/exp2.json", "w"), indent=1)
    del prep
    torch.cuda.empty_cache()
print("\nbest per case:")
for key in sorted({(r['shape'], r['T']) for r in rows}):
    rs = [r for r in rows if (r['shape'], r['T']) == key and isinstance(r['us'], float)]
    base = [r for r in rs if r['which'] == 'base'][0]
    for wh in ("g1", "g2"):
        c = [r for r in rs if r['which'] == wh]
        if c:
            b = min(c, key=lambda r: r['us'])
            print(key, wh, f"base {base['us']:.1f} best {b['us']:.1f}", {k: v for k, v in b.items() if k in ('reg', 'bn', 'st', 'sk')})
