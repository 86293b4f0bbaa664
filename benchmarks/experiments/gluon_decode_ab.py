"""Same-run A/B of the decode kernel families on one GPU: v1 (``tl.dot``) vs v2 (Gluon).

For each shape and token count T: the table's (or heuristic's) v1 config and a small set of Gluon
configs around it (the same tiles with ``kernels="gluon"``, GEMM1 split-K and row tile, GEMM2
form and tile). Every config is checked first against the fp32 torch twin on fresh random data
with the output poisoned (NaN), then timed as CUDA-graph replay over ``--copies`` layer copies
(far beyond L2), next to the copy bandwidth measured in the same run. The bytes floor counts the
distinct local experts actually routed x NVFP4 bytes per expert, plus activations.

``--v1-table`` names the baseline table (``shipped`` = the package's own). ``--sweep split_t``
spreads each expert's pair chunks over more programs.
``--sweep combine`` tries the pairs GEMM2 with its top-k sum in a third launch.
``--sweep slots`` runs the token GEMM2 with the token's top-k slots side by side (``slots2``).
``--sweep kstack`` runs GEMM1 with its K splits on one program's warps (``kstack1``).
``--sweep maxnreg`` caps GEMM1's registers (``maxnreg1``) for more resident warps.
``--sweep coop`` runs the one-launch family (``CoopDecodeConfig``) and, as a control, its tiles on
two Gluon launches.
``--sweep table`` times the shipped config against ``--v2-table``'s (a table file) where they
differ.
``--sweep pdl`` times the
shipped and the heuristic's config at each ``--pdl`` level of programmatic dependent launch;
``--repeat N`` times every candidate N times, interleaved (median); with ``--separate`` every layer
copy is followed by a one-element torch kernel, as other kernels follow an MoE layer in a
model, so a layer's GEMM1 cannot start early on the previous layer's last kernel. ``--split`` adds
each baseline's per-kernel device
times (``torch.profiler``), to see which GEMM dominates.

Prints a short table last; writes the full JSON (every candidate, its error and time) to
``--out`` (default ``$OUT`` or ``benchmarks/results``).

    PYTHONPATH=. python benchmarks/experiments/gluon_decode_ab.py --shapes glm5_tp8,glm5_ep8
    PYTHONPATH=. python benchmarks/experiments/gluon_decode_ab.py --sweep maxnreg \
        --v1-table shipped --tokens 64,128,256 --repeat 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from sglang_fp4ext.bench import nvfp4_bytes_per_expert, random_packed_weights
from sglang_fp4ext.bench.layer import make_routing
from sglang_fp4ext.bench.timing import (
    copy_bandwidth_Bps,
    gpu_clocks,
    kernel_times_us,
    time_graph_replay,
)
from sglang_fp4ext.model_shapes import ModelShape, preset
from sglang_fp4ext.moe.decode.config import CoopDecodeConfig, DecodeConfig
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.prefill.launch import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.shape import current_target, token_bucket
from sglang_fp4ext.moe.tables import config_for, prefill_config_for, read_table_file, select
from sglang_fp4ext.testing.compare import error_stats

SHAPES = {
    s.name: s
    for s in (
        dataclasses.replace(preset("glm5-tp8"), name="glm5_tp8"),
        dataclasses.replace(preset("glm5-ep8"), name="glm5_ep8"),
        # TP8 as SGLang runs GLM-5: the shared expert fused as local expert 256, top_k 8 + 1.
        dataclasses.replace(preset("glm5-tp8"), name="glm5_tp8_shared"),
        ModelShape("dsr1_tp8", 256, 8, 7168, 2048, 58, tp=8),  # DeepSeek-R1 TP8: no tuned table
        ModelShape("qwen3_30b", 128, 8, 2048, 768, 48),  # Qwen3-30B-A3B, one GPU: no table
    )
}


def _unique(cfgs: list[DecodeConfig], drop: DecodeConfig | None = None) -> list[DecodeConfig]:
    """``cfgs`` in order without repeats (and without ``drop``)."""
    out = []
    for c in cfgs:
        if c not in out and c != drop:
            out.append(c)
    return out


def _reform(c: DecodeConfig, **changes) -> DecodeConfig:
    return c.reform(**changes)


def candidates(v1: DecodeConfig, kc1: int) -> list[DecodeConfig]:
    """Gluon configs around ``v1`` (v1's tuned tiles): the same tiles, GEMM1 split-K / row tile /
    warps, GEMM2 form, tile, warps and row tiles per program."""
    base = v1.reform(kernels="gluon")
    out = [base]
    for sk in (1, 2, 4, 8):
        if sk <= kc1 and sk != base.split_k1:
            out.append(dataclasses.replace(base, split_k1=sk))
    for bn, w in ((32, 2), (64, 4), (128, 4), (128, 8)):
        out.append(dataclasses.replace(base, block_n1=bn, warps1=w))
    for sk in (1, 2, 4, 8):
        if sk <= kc1:
            out.append(dataclasses.replace(base, block_n1=128, warps1=4, split_k1=sk))
    if base.gemm2 == "tokens":
        for bn, w in ((32, 2), (64, 4), (128, 4)):
            out.append(dataclasses.replace(base, block_n2=bn, warps2=w))
        out.append(dataclasses.replace(base, gemm2="pairs", block_n2=64, tiles2=1))
    else:
        out.append(dataclasses.replace(base, gemm2="tokens", split_k2=1, tiles2=1))
        for nt in (1, 2, 4):
            for bn, w in ((64, 2), (64, 4), (128, 4)):
                out.append(dataclasses.replace(base, tiles2=nt, block_n2=bn, warps2=w))
    return _unique(out)


def slots_candidates(base: DecodeConfig, top_k: int) -> list[DecodeConfig]:
    """The token GEMM2 with a token's top-k slots side by side (``slots2=1``), 1, 2 or 4 warps and
    32-128 rows per slot, at the base's PDL; for a pairs-GEMM2 base also its plain token form."""
    r = _reform
    sp = min(1 << (top_k - 1).bit_length(), 8)  # slots side by side per round
    tok = r(base, kernels="gluon", gemm2="tokens", split_k2=1, tiles2=1, combine="counter")
    out = [] if base.gemm2 == "tokens" else [r(tok, slots2=0)]
    for w, bn in ((1, 32), (1, 64), (1, 128), (2, 32), (2, 64), (4, 64)):
        if sp * w <= 32:
            out.append(r(tok, slots2=1, warps2=w, block_n2=bn))
    return _unique(out, drop=base)


def kstack_candidates(base: DecodeConfig, kc1: int) -> list[DecodeConfig]:
    """GEMM1 with its K splits stacked in one program (``kstack1=1``): 8 and 4 splits (2 at
    wider tiles) that divide the K chunks, 1-4 warps and 32-128 rows a split, at the base's
    GEMM2 and PDL (Gluon, two launches)."""
    b = base.reform(kernels="gluon", split_t=1)
    out = []
    for sk, shapes in (
        (8, ((1, 32), (1, 64), (2, 32), (2, 64))),
        (4, ((1, 32), (1, 64), (2, 32), (2, 64))),
        (2, ((2, 64), (4, 128))),
    ):
        if kc1 % sk == 0:
            out += [b.reform(kstack1=1, split_k1=sk, warps1=w, block_n1=bn) for w, bn in shapes]
    return _unique(out, drop=base)


def coop_candidates(kc1: int) -> list[DecodeConfig]:
    """The one-launch family: 16 warps a program (8 K splits of 2 warps, 32-row tiles) at each
    GEMM2 prefetch, 8 warps (4 K splits), then the first one's tiles on two Gluon launches (what
    one launch saves)."""
    out = []
    if kc1 % 8 == 0:
        a = CoopDecodeConfig(split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32)
        out += [a.reform(prefetch2=p) for p in (1, 0, 2)]
    if kc1 % 4 == 0:
        out += [CoopDecodeConfig(split_k1=4, warps1=2, block_n1=32, warps2=1, block_n2=32)]
    return out + [out[0].two_launch()] if out else out


#: GEMM1 register caps per warps a CTA: each buys one more resident CTA an SM (64K registers)
#: than the cap above it: 2 warps 184 / 168 / 144 / 128 -> 5 / 6 / 7 / 8 CTAs, 4 warps 168 / 128
#: -> 3 / 4. 184, not 200 (also 5 CTAs): at 16 pairs a tile ptxas spills at 200 and not at 184
#: (static SASS, decode_gemm1_regcap/).
MAXNREG_CAPS = {2: (184, 168, 144, 128), 4: (168, 128)}


def maxnreg_candidates(base: DecodeConfig) -> list[DecodeConfig]:
    """GEMM1 under a register cap (``maxnreg1``: more resident warps, maybe spills) at
    ``MAXNREG_CAPS`` with its tiles as they are, and at 168 / 128 with 4 warps on 128 rows (Gluon,
    two launches, the K splits across programs). 96 is left out: it spills 53-141 words a K step
    (static SASS on sm_90, decode_gemm1_regcap/)."""
    r = _reform
    b = r(base, kernels="gluon", kstack1=0)
    if base.kstack1:
        b = r(b, split_k1=1)
    out = [r(b, maxnreg1=n) for n in MAXNREG_CAPS.get(b.warps1, ())]
    out += [r(b, block_n1=128, warps1=4, maxnreg1=n) for n in MAXNREG_CAPS[4]]
    return _unique(out, drop=base)


def combine_candidates(base: DecodeConfig, kc2: int) -> list[DecodeConfig]:
    """The pairs GEMM2 with its top-k sum in a third launch (``combine="kernel"``): row tile,
    warps, row tiles per program and GEMM2 split-K around ``base``."""
    r = _reform
    b = r(
        base,
        kernels="gluon",
        gemm2="pairs",
        combine="kernel",
        split_k2=base.split_k2 if base.gemm2 == "pairs" else 1,
        tiles2=base.tiles2 if base.gemm2 == "pairs" else 1,
    )
    out = [b, r(b, combine="counter")]
    for bn, w in ((64, 2), (128, 4), (64, 4), (128, 8)):
        for nt in (1, 2, 4):
            out.append(r(b, block_n2=bn, warps2=w, tiles2=nt))
    for sk in (2, 4):
        if sk <= kc2:
            out.append(r(b, split_k2=sk))
    return _unique(out, drop=base)


def pdl_candidates(base: DecodeConfig, heur: DecodeConfig, levels=(0, 1)) -> list[DecodeConfig]:
    """``base`` and the heuristic's config, each without and with programmatic dependent launch
    at ``levels`` (Gluon, two or three launches)."""
    r = _reform
    out = []
    for c in (base, heur):
        c = r(c, kernels="gluon")
        out += [r(c, pdl=p) for p in levels]
    return _unique(out, drop=base)


def split_t_candidates(base: DecodeConfig) -> list[DecodeConfig]:
    """``base`` and its pairs-GEMM2 / third-launch form with each expert's pair chunks spread over
    2-16 programs (``split_t``)."""
    r = _reform
    forms = [r(base, kernels="gluon")]
    if base.gemm2 != "pairs" or base.combine != "kernel":
        forms.append(
            r(
                base,
                kernels="gluon",
                gemm2="pairs",
                combine="kernel",
                block_n2=64,
                warps2=2,
                tiles2=4,
                split_k2=1,
            )
        )
    out = [f for f in forms if f != base]
    for f in forms:
        out += [r(f, split_t=st) for st in (2, 4, 8, 16)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="glm5_tp8,glm5_ep8")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="only the v1 tiles as Gluon (no sweep)")
    ap.add_argument("--deadline-s", type=float, default=480.0, help="no new (shape, T) after this")
    ap.add_argument(
        "--v1-table",
        default="benchmarks/results/NVIDIA_H200_v1_table.json",
        help="the tl.dot family's tuned table (v1 baseline; heuristic where absent)",
    )
    ap.add_argument(
        "--sweep",
        choices=(
            "families",
            "combine",
            "split_t",
            "pdl",
            "slots",
            "kstack",
            "maxnreg",
            "coop",
            "table",
            "none",
        ),
        default="families",
    )
    ap.add_argument("--v2-table", default="", help="--sweep table: the table file to time")
    ap.add_argument("--pdl", default="0,1", help="--sweep pdl: the pdl levels to time")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="time every candidate this many times, interleaved; report the median",
    )
    ap.add_argument(
        "--separate",
        action="store_true",
        help="a one-element torch kernel after every layer copy (see above)",
    )
    ap.add_argument("--split", action="store_true", help="per-kernel times of each baseline")
    ap.add_argument("--split-all", action="store_true", help="per-kernel times of every candidate")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    args = ap.parse_args(argv)
    t_start = time.time()
    dev = torch.device("cuda")
    target = current_target(dev)
    bw = copy_bandwidth_Bps()
    res = dict(
        what="decode kernel families, same run: v1 tl.dot vs v2 Gluon (benchmarks/experiments/"
        "gluon_decode_ab.py)",
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        gpu=torch.cuda.get_device_name(),
        versions=dict(
            torch=torch.__version__,
            triton=__import__("triton").__version__,
            cuda=torch.version.cuda,
            python=platform.python_version(),
        ),
        clocks=gpu_clocks(),
        copy_bw_TBps=bw / 1e12,
        copies=args.copies,
        rows=[],
        errors=[],
    )
    g = torch.Generator(device="cuda").manual_seed(1234)
    sep = torch.zeros(1, device=dev)
    res["separate"] = args.separate
    shipped = args.v1_table == "shipped"
    v1_table = {}
    if args.v1_table and not shipped:
        _, v1_table = read_table_file(Path(args.v1_table))
    res["v1_table"] = args.v1_table
    v2_table = read_table_file(Path(args.v2_table))[1] if args.v2_table else {}
    res["v2_table"] = args.v2_table
    for sname in args.shapes.split(","):
        s = SHAPES[sname]
        shared = sname.endswith("_shared")
        packs = [
            random_packed_weights(s.E_local + shared, s.hidden, s.I_local, device=dev, generator=g)
            for _ in range(args.copies)
        ]
        prepared = [PreparedMoEWeights.from_moe_weights(w) for w in packs]
        shape = prepared[0].shape(s.top_k + shared)
        kc1 = prepared[0].w13.k_pad // 256
        per_expert = nvfp4_bytes_per_expert(s.hidden, s.I_local)
        for T in [int(t) for t in args.tokens.split(",")]:
            if time.time() - t_start > args.deadline_s:
                res["errors"].append(f"deadline: skipped {sname} T={T} and later")
                break
            routs = [make_routing(s, T, device=dev, generator=g) for _ in range(args.copies)]
            if shared:  # every token also goes to the shared expert (id E_local, last slot)
                sid = torch.full((T, 1), s.E_local, dtype=torch.int32, device=dev)
                routs = [
                    (
                        torch.cat([i, sid], 1).contiguous(),
                        torch.cat([w, torch.rand(T, 1, device=dev, generator=g)], 1).contiguous(),
                        d + 1,
                    )
                    for i, w, d in routs
                ]
            xs = [
                torch.randn(T, s.hidden, device=dev, generator=g).to(torch.bfloat16) for _ in routs
            ]
            distinct = sum(r[2] for r in routs) / len(routs)
            floor_us = (distinct * per_expert + 4 * T * s.hidden) / bw * 1e6
            ref = fused_moe_nvfp4_torch(xs[0], packs[0], routs[0][0], routs[0][1])
            heur = heuristic_config(T, shape, target)
            if shipped:
                v1 = config_for(T, shape, target)
                v1 = v1 if isinstance(v1, DecodeConfig) else heur
            else:
                e1 = v1_table.get(shape.key(), {}).get(token_bucket(T))
                v1 = e1.config if e1 is not None and e1.path == "decode" else heur
                v1 = v1.reform(kernels="dot")
            if args.sweep == "none":
                cands = [v1]
            elif args.sweep == "slots":
                cands = [v1] + slots_candidates(v1, shape.top_k)
            elif args.sweep == "kstack":
                cands = [v1] + kstack_candidates(v1, kc1)
            elif args.sweep == "maxnreg":
                cands = [v1] + maxnreg_candidates(v1)
            elif args.sweep == "coop":
                cands = [v1] + coop_candidates(kc1)
            elif args.sweep == "table":
                e2 = v2_table.get(shape.key(), {}).get(token_bucket(T))
                if e2 is None or e2.path != "decode" or e2.config == v1:
                    continue  # nothing to compare in this bucket
                cands = [v1, e2.config]
            elif args.sweep == "split_t":
                cands = [v1] + split_t_candidates(v1)
            elif args.sweep == "combine":
                cands = [v1] + combine_candidates(v1, prepared[0].w2.k_pad // 256)
            elif args.sweep == "pdl":
                cands = [v1] + pdl_candidates(v1, heur, [int(p) for p in args.pdl.split(",")])
            else:
                cands = [v1] + (candidates(v1, kc1)[:1] if args.quick else candidates(v1, kc1))
            cands += (
                [heur] if heur not in cands and args.sweep not in ("none", "table", "coop") else []
            )
            row = dict(shape=sname, T=T, distinct=distinct, floor_us=floor_us, configs=[])
            for rep in range(args.repeat):  # interleaved: drifts hit every candidate alike
                for ci, cfg in enumerate(cands):
                    if rep == 0:
                        row["configs"].append(dict(config=dataclasses.asdict(cfg)))
                    rec = row["configs"][ci]
                    if "error" in rec:
                        continue
                    try:
                        if rep == 0:
                            out = torch.full(
                                (T, s.hidden), float("nan"), dtype=torch.bfloat16, device=dev
                            )
                            fused_moe_nvfp4(
                                xs[0], prepared[0], routs[0][0], routs[0][1], out=out, config=cfg
                            )
                            st = error_stats(out, ref)
                            rec.update(
                                rms_rel=st.rms_rel, max_rel=st.max_rel, nonfinite=st.nonfinite
                            )

                        def step(i, cfg=cfg):
                            fused_moe_nvfp4(
                                xs[i], prepared[i], routs[i][0], routs[i][1], config=cfg
                            )
                            if args.separate:
                                sep.add_(1)

                        tm = time_graph_replay(step, args.copies)
                        rec.setdefault("us_reps", []).append(tm.us_per_call)
                        us = sorted(rec["us_reps"])[len(rec["us_reps"]) // 2]
                        rec.update(
                            us=us,
                            us_min=min(rec.get("us_min", tm.us_min), tm.us_min),
                            pct_bw=floor_us / us,
                        )
                        if (args.split_all or args.split and ci == 0) and rep == 0:
                            rec["kernels_us"] = kernel_times_us(step, args.copies)
                    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                        rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            ok = [
                c
                for c in row["configs"][1:]
                if "us" in c and c["rms_rel"] < 3e-3 and not c["nonfinite"]
            ]
            if shipped and select(T, shape, target).path == "prefill":
                # The table serves this bucket with the prefill path: time it too.
                pcfg = prefill_config_for(T, shape, target)

                def pstep(i, pcfg=pcfg):
                    fused_moe_nvfp4_prefill(
                        xs[i], prepared[i], routs[i][0], routs[i][1], config=pcfg
                    )

                row["prefill_us"] = time_graph_replay(pstep, args.copies).us_per_call
                row["prefill_config"] = dataclasses.asdict(pcfg)
            row["v1"] = row["configs"][0]
            row["v2_best"] = min(ok, key=lambda c: c["us"]) if ok else None
            row["v2_same_tiles"] = row["configs"][min(1, len(row["configs"]) - 1)]
            row["heuristic"] = next(
                (c for c in row["configs"] if c["config"] == dataclasses.asdict(heur)), {}
            )
            res["rows"].append(row)
            b, v = row["v2_best"], row["v1"]
            print(
                f"{sname} T={T}: v1 {v.get('us', float('nan')):.1f} us, v2 same tiles "
                f"{row['v2_same_tiles'].get('us', float('nan')):.1f} (rms "
                f"{row['v2_same_tiles'].get('rms_rel', float('nan')):.2e}), v2 best "
                f"{b['us'] if b else float('nan'):.1f}",
                flush=True,
            )
            del ref
        packs = prepared = None  # free the layer copies before the next shape
        torch.cuda.empty_cache()
    res["wall_s"] = time.time() - t_start
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = {
        "families": "gluon_decode_ab.json",
        "combine": "combine_ab.json",
        "split_t": "split_t_ab.json",
        "slots": "slots_ab.json",
        "kstack": "kstack_ab.json",
        "maxnreg": "maxnreg_ab.json",
        "coop": "coop_ab.json",
        "table": "table_ab.json",
        "pdl": "pdl_ab_separate.json" if args.separate else "pdl_ab.json",
        "none": "decode_split.json",
    }[args.sweep]
    (out_dir / name).write_text(json.dumps(res, indent=1))
    print(f"\n{res['gpu']}, Triton {res['versions']['triton']}, copy BW {bw / 1e12:.2f} TB/s")
    print(
        "| shape | T | floor us | v1 us (%BW) | v2 same tiles us (rms) | v2 best us (%BW) | "
        "v1/v2 | heuristic/best |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        v, s2, b = r["v1"], r["v2_same_tiles"], r["v2_best"]
        if "us" not in v:
            print(f"| {r['shape']} | {r['T']} | v1 error {v.get('error')} |")
            continue
        bs = f"{b['us']:.1f} ({100 * b['pct_bw']:.0f}%)" if b else "-"
        ss = f"{s2['us']:.1f} ({s2['rms_rel']:.1e})" if "us" in s2 else s2.get("error", "")[:60]
        ratio = f"{v['us'] / b['us']:.2f}" if b else "-"
        h = r["heuristic"]
        hr = f"{h['us'] / b['us']:.2f}" if b and "us" in h else h.get("error", "-")[:40]
        print(
            f"| {r['shape']} | {r['T']} | {r['floor_us']:.1f} | {v['us']:.1f} "
            f"({100 * v['pct_bw']:.0f}%) | {ss} | {bs} | {ratio} | {hr} |"
        )
        if "prefill_us" in r:
            print(f"|   | the table's prefill path: {r['prefill_us']:.1f} us |")
        if "kernels_us" in v:
            print(
                "|   | split: "
                + ", ".join(f"{k[:28]} {t:.1f}" for k, t in sorted(v["kernels_us"].items()))
                + " |"
            )
    for e in res["errors"]:
        print("error:", e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
