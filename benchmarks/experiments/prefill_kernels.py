"""Where the prefill path's time goes (ran on the H200 on 2026-11-30 at commit adfc0cf, before the
packed decode: ``benchmarks/results/prefill_kernels_before_h200.json``).

For GLM-5 TP8 (fused shared expert), TP8 and EP8 at T = 1024, 4096, 8192: the tabled prefill config,
its six launches' device times (``torch.profiler`` via ``bench.timing.kernel_times_us``, weights
rotated over 4 layer copies), each GEMM's TFLOP/s (routed pairs x 2 x N x K) against the bf16
matmul rate measured in the same run, and the combine's bytes (P x H bf16 partials read + T x H
written) against the copy bandwidth measured in the same run. Prints a table last; JSON to $OUT.

    PYTHONPATH=. python benchmarks/experiments/prefill_kernels.py
"""

import json
import os

import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.layer import Layer
from sglang_fp4ext.bench.timing import bf16_matmul_tflops, copy_bandwidth_Bps, kernel_times_us

bw = copy_bandwidth_Bps()
mm = bf16_matmul_tflops()
rows = []
for preset in ("glm5-tp8-fused-shared", "glm5-tp8", "glm5-ep8"):
    shape = model_shapes.preset(preset)
    layer = Layer(shape, 4, seed=5)
    mshape = layer.prepared[0].shape(shape.top_k_local)
    for T in (1024, 4096, 8192):
        step = layer.ours(T, "prefill")
        kt = kernel_times_us(step, layer.n_inputs(T))
        routes = layer.inputs(T)[1]
        pairs = sum(int((r[0] >= 0).sum()) for r in routes) / len(routes)
        flops1 = pairs * 2 * (2 * mshape.I) * mshape.H
        flops2 = pairs * 2 * mshape.H * mshape.I
        us = {k: round(v, 1) for k, v in kt.items() if k.startswith("_")}
        g1, g2 = us.get("_prefill_gemm1"), us.get("_prefill_gemm2")
        comb = us.get("_prefill_combine")
        comb_bytes = pairs * mshape.H * 2 + T * mshape.H * 2
        rows.append(dict(
            preset=preset, T=T, config=repr(layer.config(T, "prefill")), kernel_us=us,
            gemm1_tflops=flops1 / g1 / 1e6 if g1 else None, gemm2_tflops=flops2 / g2 / 1e6 if g2 else None,
            combine_TBps=comb_bytes / comb / 1e6 if comb else None, total_us=sum(us.values())))
        print(rows[-1], flush=True)
    del layer
    torch.cuda.empty_cache()
out = {"device": torch.cuda.get_device_name(), "copy_bw_TBps": bw / 1e12, "bf16_mm_tflops": mm, "rows": rows}
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "prefill_kernels.json"), "w"), indent=1)
print(f"\ncopy {bw / 1e12:.2f} TB/s, bf16 matmul {mm:.0f} TFLOP/s")
print(f"{'preset':22} {'T':>5} {'total':>8} {'group':>6} {'gemm1':>7} {'TF/s':>5} {'gemm2':>7} {'TF/s':>5} {'comb':>6} {'TB/s':>5}")
for r in rows:
    k = r["kernel_us"]
    grp = sum(v for n, v in k.items() if n.startswith("_group"))
    print(f"{r['preset']:22} {r['T']:5d} {r['total_us']:8.1f} {grp:6.1f} {k.get('_prefill_gemm1', 0):7.1f} "
          f"{r['gemm1_tflops'] or 0:5.0f} {k.get('_prefill_gemm2', 0):7.1f} {r['gemm2_tflops'] or 0:5.0f} "
          f"{k.get('_prefill_combine', 0):6.1f} {r['combine_TBps'] or 0:5.2f}")
