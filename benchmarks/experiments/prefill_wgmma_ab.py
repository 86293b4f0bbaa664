"""The Gluon wgmma prefill GEMMs against v1's tl.dot kernels, same process, H200.

For GLM-5 TP8, TP8 with the fused shared expert and EP8 at T = 512 .. 8192 (``AB_T``), and one
shape without a table (DeepSeek-R1 TP8, E = 256, H = 7168, I = 256): v1 (the shipped H200 table's
prefill config), the decode path at T <= 1024 (table or heuristic: where the paths cross), and
the wgmma heuristic's config with one knob moved at a time (``variants``). Each config is first
checked against the fp32 twin on a NaN-poisoned output (rms 5e-3 / max 1e-2), then timed whole by
CUDA-graph replay
(weights rotated over 4 layer copies) and split per kernel (profiler). Reports us, TFLOP/s, the
fraction of the bf16 matmul rate measured in the same run, and the ratio to v1. Table last;
JSON to ``$OUT/prefill_wgmma_ab.json``.

``AB_SHIPPED=1`` (the closing A/B): per shape and T, v1, v2 as shipped (the GPU's table or the
heuristic, ``prefill_config_for``) and the torch bf16 grouped-GEMM peer (``bench/peers.py``, the
regression suite's ``torch-bf16``), in one process; no knob variants, no decode row.

    PYTHONPATH=. python benchmarks/experiments/prefill_wgmma_ab.py
"""

import json
import os
import time

import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.layer import Layer
from sglang_fp4ext.bench.timing import bf16_matmul_tflops, kernel_times_us, time_graph_replay
from sglang_fp4ext.moe.decode.config import DecodeConfig
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.prefill.heuristic import prefill_heuristic_config
from sglang_fp4ext.moe.prefill.launch import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.shape import current_target
from sglang_fp4ext.moe.tables import config_for, prefill_config_for
from sglang_fp4ext.testing.compare import error_stats

TS = [int(t) for t in os.environ.get("AB_T", "512,1024,2048,4096,8192").split(",")]
SHIPPED = os.environ.get("AB_SHIPPED") == "1"
TORCH_BF16 = "torch bf16"  # the peer's row: not a config
PRESETS = os.environ.get(
    "AB_PRESETS", "glm5-tp8,glm5-tp8-fused-shared,glm5-ep8,deepseek-r1-nvfp4-tp8"
).split(",")


def variants(T, ms, target):
    """The heuristic's wgmma config and one step away from it along each knob."""
    import dataclasses

    h = prefill_heuristic_config(T, ms, target, "wgmma")
    bm = {16: 32, 32: 64, 64: 128 if T >= 4096 else 32, 128: 64}[h.block_m]
    alt = dataclasses.replace(h, block_m=bm, stages1=3 if bm == 64 else 2)
    out = [
        ("wgmma heuristic", h),
        (f"wgmma bm{bm}", alt),
        ("wgmma stages1 flip", dataclasses.replace(h, stages1=5 - h.stages1)),
        ("wgmma group_n2 flip", dataclasses.replace(h, group_n2=12 - h.group_n2)),
    ]
    if h.accs2 == 2:  # GEMM2 on one warpgroup with two accumulators against two warpgroups with one
        out.append(("wgmma step-1 GEMM2", dataclasses.replace(h, block_n2=128, warps2=8, accs2=1)))
    return out


def step_for(layer, T, c):
    xs, routes, outs = layer.inputs(T)
    fn = fused_moe_nvfp4 if isinstance(c, DecodeConfig) else fused_moe_nvfp4_prefill

    def step(i):
        ids, tw, _ = routes[i]
        return fn(xs[i], layer.prepared[i % layer.copies], ids, tw, out=outs[i], config=c)

    return step


def check(layer, T, c):
    xs, rts, outs = layer.inputs(T)
    outs[0].fill_(float("nan"))
    if c == TORCH_BF16:  # bf16 weights and intermediate: recorded, held to no fp32 bound
        out = layer.peer(T)(0)
    else:
        step_for(layer, T, c)(0)
        out = outs[0]
    st = error_stats(out, fused_moe_nvfp4_torch(xs[0], layer.packs[0], rts[0][0], rts[0][1]))
    ok = st.nonfinite == 0 and (c == TORCH_BF16 or (st.rms_rel <= 5e-3 and st.max_rel <= 1e-2))
    return st, ok


mm = bf16_matmul_tflops()
target = current_target()
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
        v1 = prefill_config_for(T, ms, target)  # the shipped table's tuned v1 config, if any
        if v1.kernels != "dot":
            v1 = prefill_heuristic_config(T, ms, target, "dot")
        cands = [("v1", v1)]
        if SHIPPED:
            cands += [("v2 shipped", prefill_config_for(T, ms, target)), (TORCH_BF16, TORCH_BF16)]
        elif T <= 1024:  # where the decode path may still win: the switch point
            dc = config_for(T, ms, target)
            cands.append(
                ("decode", dc if isinstance(dc, DecodeConfig) else heuristic_config(T, ms, target))
            )
        if not SHIPPED:
            cands += variants(T, ms, target)
        for name, c in cands:
            rec = dict(
                preset=preset,
                T=T,
                pairs=pairs,
                name=name,
                config=repr(c),
                served_path=layer.served_path(T),
            )  # what SGLang's runner takes at T
            try:
                st, ok = check(layer, T, c)
                rec.update(ok=ok, rms_rel=st.rms_rel, max_rel=st.max_rel, nonfinite=st.nonfinite)
                if ok:
                    step = layer.peer(T) if c == TORCH_BF16 else step_for(layer, T, c)
                    rt = time_graph_replay(step, n)
                    rec.update(
                        us=rt.us_per_call,
                        us_min=rt.us_min,
                        us_max=rt.us_max,
                        tflops=flops / rt.us_per_call / 1e6,
                        frac_mm=flops / rt.us_per_call / 1e6 / mm,
                    )
                    kt = kernel_times_us(step, n, calls=8)
                    rec["kernel_us"] = {k: v for k, v in kt.items() if k.startswith("_")}
            except Exception as exc:  # noqa: BLE001 - record what fails, keep measuring
                rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            rows.append(rec)
            print(
                preset,
                T,
                name,
                {
                    k: (round(v, 4) if isinstance(v, float) else v)
                    for k, v in rec.items()
                    if k in ("ok", "us", "rms_rel", "error")
                },
                f"{time.time() - t_start:.0f}s",
                flush=True,
            )
    del layer
    torch.cuda.empty_cache()

for r in rows:
    base = next(
        b for b in rows if b["preset"] == r["preset"] and b["T"] == r["T"] and b["name"] == "v1"
    )
    if r.get("us") and base.get("us"):
        r["v1_over_this"] = base["us"] / r["us"]
out = {
    "device": torch.cuda.get_device_name(),
    "torch": torch.__version__,
    "triton": __import__("triton").__version__,
    "date": time.strftime("%Y-%m-%d"),
    "bf16_mm_tflops": mm,
    "rows": rows,
}
json.dump(
    out,
    open(
        os.path.join(
            os.environ.get("OUT", "/tmp"), os.environ.get("AB_NAME", "prefill_wgmma_ab") + ".json"
        ),
        "w",
    ),
    indent=1,
)
print(f"\nbf16 matmul {mm:.0f} TFLOP/s (same run)")
print(
    f"{'preset':22} {'T':>5} {'config':24} {'us':>8} {'%mm':>4} {'v1/x':>5} "
    f"{'gemm1':>7} {'gemm2':>7} rms"
)
for r in rows:
    k = r.get("kernel_us", {})
    g1 = k.get("_prefill_gemm1", k.get("_wgmma_gemm1", 0))
    g2 = k.get("_prefill_gemm2", k.get("_wgmma_gemm2", 0))
    print(
        f"{r['preset']:22} {r['T']:5d} {r['name']:24} {r.get('us', float('nan')):8.1f} "
        f"{100 * r.get('frac_mm', 0):4.0f} {r.get('v1_over_this', 0):5.2f} {g1:7.1f} "
        f"{g2:7.1f} {r.get('rms_rel', float('nan')):.1e}"
        f"{'' if r.get('ok') else ' FAIL ' + r.get('error', '')[:80]}"
    )
