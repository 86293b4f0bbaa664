"""Per-kernel times of the wgmma prefill GEMMs over their knobs, one shape and T (#16 step 2).

Every config is checked against the fp32 twin on a NaN-poisoned output first (rms 5e-3 /
max 1e-2); then per-kernel device times (profiler, eager, 4 layer copies) and the whole call by
CUDA-graph replay. Environment: ``SWEEP_PRESET`` (glm5-tp8), ``SWEEP_T`` (4096, or a comma list),
``SWEEP_KNOBS`` (a Python literal: a list of ``{...}`` dicts replacing fields of the heuristic's
wgmma config, keys starting with ``_`` setting ``prefill``'s experiment modes; each row says
whether its output equals the heuristic config's bit for bit; default: the code prefetch depths,
and GEMM2's two accumulators over ``block_m`` x ``group_n2`` x ``prefetch2``), ``SWEEP_ONE_WARPGROUP=1`` (lift the config check's one-warpgroup
rule for this run), ``SWEEP_NAME``. JSON to ``$OUT/$SWEEP_NAME.json``.

    PYTHONPATH=. python benchmarks/experiments/prefill_knob_sweep.py
"""

import ast
import dataclasses
import json
import os
import time

import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.layer import Layer
from sglang_fp4ext.bench.timing import bf16_matmul_tflops, kernel_times_us, time_graph_replay
from sglang_fp4ext.moe import prefill as PF
from sglang_fp4ext.moe.prefill import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.prefill_config import PrefillConfig, prefill_heuristic_config
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.shape import current_target
from sglang_fp4ext.testing.compare import error_stats

PRESET = os.environ.get("SWEEP_PRESET", "glm5-tp8")
TS = [int(t) for t in os.environ.get("SWEEP_T", "4096").split(",")]
DEFAULT = [dict(prefetch1=2), dict(prefetch1=3), dict(prefetch2=2)]
DEFAULT += [dict(block_m=32, stages1=2, accs2=2, group_n2=g, prefetch2=p) for g in (4, 8) for p in (1, 2)]
DEFAULT += [dict(block_m=16, stages1=2, accs2=2, group_n2=8),
            dict(block_m=64, stages1=3, accs2=2, group_n2=4),  # spills (ptxas): how much it costs
            dict(block_m=32, stages1=2, accs2=2, group_n2=8, prefetch1=2),
            dict(block_m=128, stages1=2, prefetch1=2)]
KNOBS = ast.literal_eval(os.environ["SWEEP_KNOBS"]) if os.environ.get("SWEEP_KNOBS") else DEFAULT
if os.environ.get("SWEEP_ONE_WARPGROUP") == "1":
    # This experiment only: allow one warpgroup (64 weight rows on 4 warps; two CTAs per SM), which
    # the config check forbids since step 1's wrong results (wgmma_ab_1_h200.json: all at 3 stages).
    PrefillConfig._check_wgmma = lambda self: None



def dump():
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d"),
           "bf16_mm_tflops": mm, "rows": rows}
    name = os.environ.get("SWEEP_NAME", "prefill_knob_sweep")
    with open(os.path.join(os.environ.get("OUT", "/tmp"), name + ".json"), "w") as f:
        json.dump(out, f, indent=1)


mm = bf16_matmul_tflops()
target = current_target()
shape = model_shapes.preset(PRESET)
layer = Layer(shape, 4, seed=11)
ms = layer.prepared[0].shape(shape.top_k_local)
rows, t0 = [], time.time()
for T in TS:
    xs, routes, outs = layer.inputs(T)
    n = layer.n_inputs(T)
    pairs = sum(int((r[0] >= 0).sum()) for r in routes) / len(routes)
    f1, f2 = pairs * 2 * 2 * ms.I * ms.H, pairs * 2 * ms.I * ms.H
    h = prefill_heuristic_config(T, ms, target, "wgmma")
    base = None  # the heuristic config's output on input 0: each knob's is compared bit for bit
    for knob in [{}] + KNOBS:
        try:  # a knob that does not apply at this T's config (e.g. tail1 without the static ring)
            # "_fused_mode": how combine="fused" runs (prefill._FUSED_MODE, step 9's diagnosis)
            PF._FUSED_MODE = knob.get("_fused_mode", "full")
            # "_group_mode": whether combine="group" drops the read partials from L2 (step 10)
            PF._GROUP_MODE = knob.get("_group_mode", "discard")
            c = dataclasses.replace(h, **{k: v for k, v in knob.items() if not k.startswith("_")})
        except ValueError as exc:
            rows.append(dict(preset=PRESET, T=T, knob=knob, ok=False, error=f"config: {exc}"[:300]))
            continue
        rec = dict(preset=PRESET, T=T, knob=knob, config=repr(c))

        def step(i, c=c):
            ids, tw, _ = routes[i]
            return fused_moe_nvfp4_prefill(xs[i], layer.prepared[i % layer.copies], ids, tw,
                                           out=outs[i], config=c)
        try:
            outs[0].fill_(float("nan"))
            step(0)
            st = error_stats(outs[0], fused_moe_nvfp4_torch(xs[0], layer.packs[0], routes[0][0], routes[0][1]))
            ok = st.nonfinite == 0 and st.rms_rel <= 5e-3 and st.max_rel <= 1e-2
            rec.update(ok=ok, rms_rel=st.rms_rel)
            if base is None:
                base = outs[0].clone()
            rec["same_bits_as_base"] = torch.equal(outs[0].view(torch.int16), base.view(torch.int16))
            if ok:
                rec["us"] = time_graph_replay(step, n).us_per_call
                kt = kernel_times_us(step, n, calls=8)
                rec["kernel_us"] = {k: v for k, v in kt.items() if k.startswith("_")}
                g1, g2 = rec["kernel_us"].get("_wgmma_gemm1", 0), rec["kernel_us"].get("_wgmma_gemm2", 0)
                rec["gemm1_frac_mm"] = f1 / g1 / 1e6 / mm if g1 else None
                rec["gemm2_frac_mm"] = f2 / g2 / 1e6 / mm if g2 else None
        except Exception as exc:  # noqa: BLE001 - record what fails, keep measuring
            rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:300]}")
        rows.append(rec)
        dump()  # after every config: a run cut short by its time limit keeps what it measured
        print(T, knob, rec.get("ok"), rec.get("us"), rec.get("error", ""), f"{time.time() - t0:.0f}s", flush=True)

print(f"\nbf16 matmul {mm:.0f} TFLOP/s (same run); {PRESET}")
print(f"{'T':>5} {'knob':34} {'us':>8} {'gemm1':>7} {'%mm':>4} {'gemm2':>7} {'%mm':>4} {'comb':>6} rms")
for r in rows:
    k = r.get("kernel_us", {})
    print(f"{r['T']:5d} {str(r['knob']):34} {r.get('us', float('nan')):8.1f} "
          f"{k.get('_wgmma_gemm1', 0):7.1f} {100 * (r.get('gemm1_frac_mm') or 0):4.0f} "
          f"{k.get('_wgmma_gemm2', 0):7.1f} {100 * (r.get('gemm2_frac_mm') or 0):4.0f} "
          f"{k.get('_combine', k.get('_prefill_combine', 0)):6.1f} {r.get('rms_rel', float('nan')):.1e}"
          f"{' =base' if r.get('same_bits_as_base') else ''}"
          f"{'' if r.get('ok') else ' FAIL ' + r.get('error', '')[:60]}")
