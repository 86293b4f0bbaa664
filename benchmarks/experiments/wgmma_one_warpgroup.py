"""Where one warpgroup's wgmma GEMMs go wrong (#16, H200): 4 warps / 64 weight rows gave rms
~1e35 in GEMM1 at every T (prefill_v2_step1/wgmma_ab_1_h200.json), 8 warps / 128 rows never.

Runs the prefill launches of the wgmma heuristic's config (8 warps, known good) and of the same
config with one GEMM at 64 rows on 4 warps (the config check that forbids it is bypassed here
only), with NaN-poisoned workspaces, and compares GEMM1's ``inter`` (and GEMM2's partials)
element by element: which sorted rows, which intermediate columns, which 16-row MMA slices,
NaN or finite. Prints a short report; JSON to ``$OUT/wgmma_one_warpgroup.json``.

    PYTHONPATH=. python benchmarks/experiments/wgmma_one_warpgroup.py
"""

import dataclasses
import json
import os

import torch

from sglang_fp4ext.bench import GLM5_TP8, random_packed_weights, uniform_routing
from sglang_fp4ext.moe import prefill
from sglang_fp4ext.moe.prefill_config import PrefillConfig, prefill_heuristic_config
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.shape import current_target

prefill._POISON_WORKSPACES = True
PrefillConfig._check_wgmma = lambda self: None  # this experiment only: allow 4 warps
T = int(os.environ.get("WG_T", "1024"))
gen = torch.Generator(device="cuda").manual_seed(3)
pw = PreparedMoEWeights.from_moe_weights(
    random_packed_weights(GLM5_TP8.E_local, GLM5_TP8.H, GLM5_TP8.I, device="cuda", generator=gen))
ids, tw, _ = uniform_routing(T, GLM5_TP8, device="cuda", generator=gen)
x = torch.randn(T, GLM5_TP8.H, device="cuda", generator=gen).to(torch.bfloat16)
good = prefill_heuristic_config(T, pw.shape(8), current_target(), "wgmma")


def run(cfg):
    out = torch.full_like(x, float("nan"))
    launches = prefill._plan(x, pw, ids, tw, out, cfg, False)
    for L in launches:
        L.run()
    torch.cuda.synchronize()
    g1 = next(L for L in launches if L.kernel == "_wgmma_gemm1")
    g2 = next(L for L in launches if L.kernel == "_wgmma_gemm2")
    return out, g1.args[7].clone(), g2.args[7].clone(), g1.args[1].clone(), g1.args[2].clone()


def compare(a, b, what):
    """a (suspect) vs b (8-warp reference), same layout; rows that b never wrote are skipped."""
    rows = ~torch.isnan(b).all(1)
    a, b = a[rows].float(), b[rows].float()
    bad = ~torch.isclose(a, b, rtol=1e-2, atol=1e-2) | torch.isnan(a)
    rep = dict(what=what, rows=int(rows.sum()), bad_frac=float(bad.float().mean()),
               nan_frac=float(torch.isnan(a).float().mean()),
               inf_frac=float(torch.isinf(a).float().mean()))
    if bad.any():
        r, c = bad.nonzero(as_tuple=True)
        rep["first_bad"] = [[int(i), int(j), float(a[i, j]), float(b[i, j])] for i, j in
                            zip(r[:8].tolist(), c[:8].tolist())]
        rep["bad_by_col_mod_64_div_8"] = torch.bincount((c % 64) // 8, minlength=8).tolist()
        rep["bad_by_col_div_64_mod_4"] = torch.bincount((c // 64) % 4, minlength=4).tolist()
        rep["bad_by_row_mod_64_div_8"] = torch.bincount((r % 64) // 8, minlength=8).tolist()
        rep["bad_rows_frac"] = float(bad.any(1).float().mean())
        rep["bad_cols_frac"] = float(bad.any(0).float().mean())
    return rep


out8, inter8, part8, sp8, cnt8 = run(good)
reports = []
for name, knobs in (("gemm1 1 warpgroup", dict(block_n1=64, warps1=4)),
                    ("gemm2 1 warpgroup", dict(block_n2=64, warps2=4))):
    cfg = dataclasses.replace(good, **knobs)
    try:
        out4, inter4, part4, sp4, cnt4 = run(cfg)
        assert torch.equal(sp4, sp8) and torch.equal(cnt4, cnt8), "grouping differs"
        reports.append(dict(name=name, config=repr(cfg), inter=compare(inter4, inter8, "inter"),
                            partials=compare(part4, part8, "partials"),
                            out=compare(out4, out8, "out")))
    except Exception as exc:  # noqa: BLE001 - report, keep going
        reports.append(dict(name=name, config=repr(cfg), error=f"{type(exc).__name__}: {exc}"[:400]))
res = dict(device=torch.cuda.get_device_name(), triton=__import__("triton").__version__, T=T,
           good=repr(good), reports=reports)
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "wgmma_one_warpgroup.json"), "w"),
          indent=1)
for r in reports:
    print(r["name"], json.dumps({k: v for k, v in r.items() if k not in ("name", "config")})[:1500])
