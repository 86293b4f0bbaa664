"""Prefill kernel variants after the packed decode and the flat GEMM2 row-block loop (#6), H200.

For GLM-5 TP8 (E = 256, top-8), TP8 with the fused shared expert (E = 257, top-9) and EP8 at
T = 512 .. 8192: each GEMM1 variant (rows, K step, warps, stages) and GEMM2 variant (rows, warps,
stages, row blocks per program) at two ``block_m``, timed per kernel (``kernel_times_us``: eager
calls under the profiler, weights rotated over 4 layer copies). The best GEMM1 and the best GEMM2
at the best ``block_m`` make the composed config, which is checked against the fp32 twin
(rms 5e-3 / max 1e-2, output NaN-poisoned first) and timed whole by CUDA-graph replay. Variants
that do not fit the GPU (shared memory) are recorded as such. Prints a table last; JSON to $OUT.

    PYTHONPATH=. python benchmarks/experiments/prefill_sweep.py
"""

import json
import os
import time

import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.layer import Layer
from sglang_fp4ext.bench.timing import bf16_matmul_tflops, kernel_times_us, time_graph_replay
from sglang_fp4ext.moe.prefill import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.prefill_config import PrefillConfig
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.testing.compare import error_stats

G1 = [  # block_n1, block_k1, warps1, stages1
    (128, 256, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2), (64, 256, 4, 3), (64, 128, 4, 2),
    (64, 256, 4, 2),
]
G2 = [  # block_n2, warps2, stages2, group_n2
    (128, 8, 2, 8), (128, 8, 3, 8), (128, 8, 2, 16), (64, 4, 3, 8), (128, 8, 2, 4), (64, 4, 2, 16),
]
BM = {512: (32, 64), 1024: (32, 64), 2048: (64, 128), 4096: (128, 256), 8192: (128, 256)}
TS = [int(t) for t in os.environ.get("SWEEP_T", "512,1024,2048,4096,8192").split(",")]
PRESETS = os.environ.get("SWEEP_PRESETS", "glm5-tp8-fused-shared,glm5-tp8,glm5-ep8").split(",")


def cfg(bm, g1, g2):
    return PrefillConfig(block_m=bm, block_n1=g1[0], block_k1=g1[1], warps1=g1[2], stages1=g1[3],
                         block_n2=g2[0], block_k2=128, warps2=g2[1], stages2=g2[2], group_n2=g2[3],
                         block_p=1024)


def step_for(layer, T, c):
    xs, routes, outs = layer.inputs(T)

    def step(i):
        ids, tw, _ = routes[i]
        return fused_moe_nvfp4_prefill(xs[i], layer.prepared[i % layer.copies], ids, tw,
                                       out=outs[i], config=c)
    return step


mm = bf16_matmul_tflops()
rows, t_start = [], time.time()
for preset in PRESETS:
    shape = model_shapes.preset(preset)
    layer = Layer(shape, 4, seed=11)
    ms = layer.prepared[0].shape(shape.top_k_local)
    for T in TS:
        n = layer.n_inputs(T)
        routes = layer.inputs(T)[1]
        pairs = sum(int((r[0] >= 0).sum()) for r in routes) / len(routes)
        flops = pairs * 2 * 3 * ms.I * ms.H
        res = {}
        for bm in BM[T]:
            for i in range(max(len(G1), len(G2))):
                g1, g2 = G1[min(i, len(G1) - 1)], G2[min(i, len(G2) - 1)]
                c = cfg(bm, g1, g2)
                try:
                    kt = kernel_times_us(step_for(layer, T, c), n, calls=8)
                except Exception as exc:  # noqa: BLE001 - record what does not fit
                    kt = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
                res[(bm, i)] = kt
                print(preset, T, bm, g1, g2, {k: (round(v, 1) if isinstance(v, float) else v)
                                              for k, v in kt.items() if k.startswith(("_", "err"))},
                      f"{time.time() - t_start:.0f}s", flush=True)
        best = None
        for bm in BM[T]:
            g1t = {i: res[(bm, i)].get("_prefill_gemm1") for i in range(len(G1))}
            g2t = {i: res[(bm, i)].get("_prefill_gemm2") for i in range(len(G2))}
            g1t = {i: v for i, v in g1t.items() if v}
            g2t = {i: v for i, v in g2t.items() if v}
            if not g1t or not g2t:
                continue
            i1, i2 = min(g1t, key=g1t.get), min(g2t, key=g2t.get)
            tot = g1t[i1] + g2t[i2]
            if best is None or tot < best[0]:
                best = (tot, bm, i1, i2)
        _, bm, i1, i2 = best
        c = cfg(bm, G1[i1], G2[i2])
        xs, rts, outs = layer.inputs(T)
        outs[0].fill_(float("nan"))
        step_for(layer, T, c)(0)
        st = error_stats(outs[0], fused_moe_nvfp4_torch(xs[0], layer.packs[0], rts[0][0], rts[0][1]))
        ok = st.nonfinite == 0 and st.rms_rel <= 5e-3 and st.max_rel <= 1e-2
        us = time_graph_replay(step_for(layer, T, c), n).us_per_call
        kt = kernel_times_us(step_for(layer, T, c), n, calls=8)
        rows.append(dict(preset=preset, T=T, pairs=pairs, config=repr(c), us=us,
                         tflops=flops / us / 1e6, frac_mm=flops / us / 1e6 / mm,
                         kernel_us={k: v for k, v in kt.items() if k.startswith("_")},
                         max_rel=st.max_rel, rms_rel=st.rms_rel, ok=ok,
                         sweep={f"bm{k[0]}_v{k[1]}": v for k, v in res.items()}))
        print("BEST", rows[-1]["preset"], T, c, f"{us:.1f} us ok={ok}", flush=True)
    del layer
    torch.cuda.empty_cache()

out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
       "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d"),
       "bf16_mm_tflops": mm, "G1": G1, "G2": G2, "rows": rows}
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "prefill_sweep.json"), "w"), indent=1)
print(f"\nbf16 matmul {mm:.0f} TFLOP/s (same run)")
print(f"{'preset':22} {'T':>5} {'us':>8} {'TF/s':>5} {'%mm':>4} {'gemm1':>7} {'gemm2':>7} {'comb':>6} ok  config")
for r in rows:
    k = r["kernel_us"]
    print(f"{r['preset']:22} {r['T']:5d} {r['us']:8.1f} {r['tflops']:5.0f} {100 * r['frac_mm']:4.0f} "
          f"{k.get('_prefill_gemm1', 0):7.1f} {k.get('_prefill_gemm2', 0):7.1f} "
          f"{k.get('_prefill_combine', 0):6.1f} {'y' if r['ok'] else 'N'}  {r['config']}")
