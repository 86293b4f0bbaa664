"""Where the decode time goes (GPU): our kernels against floors measured in the same run.

    PYTHONPATH=. python benchmarks/experiments/decode_floor.py OUT.json [seconds]

For GLM-5 TP8 and EP8 and T = 1..64 (uniform routing, a fresh seed per run), CUDA-graph replay
over 4 rotated layer copies, one number per row:

* ``ours``: ``fused_moe_nvfp4`` with the table's config, checked against the fp32 twin first;
  ``gemm1_us`` / ``gemm2_us`` split it by kernel (torch.profiler, eager, device durations);
* ``stream2``: the same bytes read by plain streaming kernels, launched like ours (w13 codes +
  scale codes of the routed experts, then their w2 codes + scale codes: 4 launches of one
  16-byte-load kernel), the best of 16-128 KB per program: this access pattern without FP4
  decode or MMA (the per-row fp32 globals, < 0.1% of the bytes, are not read);
* ``stream1``: the same number of bytes as one contiguous buffer read by one launch of the same
  kernel (best of 8-64 KB per program): the read floor of this size, launch and ramp included;
* ``launch2``: two empty launches (256 programs each);
* ``floor``: the issue's bytes floor (the same bytes at the 2 GiB copy bandwidth measured here).
"""

import json
import sys
import time

import torch
from _stream_kernels import _empty, _stream_experts  # this folder (run as a script)

from sglang_fp4ext.bench import random_packed_weights
from sglang_fp4ext.bench.layer import make_routing
from sglang_fp4ext.bench.timing import copy_bandwidth_Bps, kernel_times_us, time_graph_replay
from sglang_fp4ext.model_shapes import preset
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.shape import current_target
from sglang_fp4ext.moe.tables import config_for
from sglang_fp4ext.testing.compare import error_stats

TOKENS = (1, 2, 4, 8, 16, 64)
BLOCK = 4096  # int32 words per iteration: 4 warps x 32 threads x 8 loads of 16 B in flight


def _words(m):
    """(codes, scale codes) of a KernelMatrix as int32 word views, per expert."""
    q = m.q.view(m.q.shape[0], -1).view(torch.int32)
    s = m.scale.reshape(m.scale.shape[0], -1).view(torch.int32)
    return q, s


def _stream(views, ids, per, out):
    """Stream each view's rows ``ids``, ``per`` words per program."""
    for v in views:
        E, W = v.shape
        ppe = -(-W // per)
        _stream_experts[(ids.numel() * ppe,)](
            v, ids, W, per, out, PPE=ppe, BLOCK=BLOCK, num_warps=4
        )


def main(out_path: str, budget_s: float = 200.0) -> int:
    deadline = time.time() + budget_s
    seed = int(time.time()) % 100000
    bw = copy_bandwidth_Bps()
    target = current_target()
    rows = []
    for bs in (preset("glm5-tp8"), preset("glm5-ep8")):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        E, H, I = bs.E_local, bs.hidden, bs.I_local
        packs = [random_packed_weights(E, H, I, device="cuda", generator=gen) for _ in range(4)]
        prep = [PreparedMoEWeights.from_moe_weights(p) for p in packs]
        views = [_words(p.w13) + _words(p.w2) for p in prep]
        shape = prep[0].shape(bs.top_k)
        per_expert = prep[0].nbytes_per_expert()
        sink = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
        for T in TOKENS:
            if time.time() > deadline:
                break
            routes = [make_routing(bs, T, device="cuda", generator=gen) for _ in range(4)]
            xs = [torch.randn(T, bs.hidden, device="cuda", generator=gen).to(torch.bfloat16)
                  for _ in range(4)]  # fmt: skip
            outs = [
                torch.empty(T, bs.hidden, dtype=torch.bfloat16, device="cuda") for _ in range(4)
            ]
            dids = [torch.unique(r[0][r[0] >= 0]).to(torch.int32) for r in routes]
            D = sum(d.numel() for d in dids) / 4
            cfg = config_for(T, shape, target)
            outs[0].fill_(float("nan"))
            fused_moe_nvfp4(xs[0], prep[0], routes[0][0], routes[0][1], out=outs[0], config=cfg)
            st = error_stats(outs[0], fused_moe_nvfp4_torch(xs[0], packs[0], *routes[0][:2]))
            ok = st.nonfinite == 0 and st.rms_rel <= 5e-3 and st.max_rel <= 1e-2

            def ours(i):
                r = routes[i]
                return fused_moe_nvfp4(xs[i], prep[i], r[0], r[1], out=outs[i], config=cfg)

            row = dict(shape=bs.name, T=T, distinct=D, bytes=D * per_expert, ok=ok,
                       rms_rel=st.rms_rel, max_rel=st.max_rel, config=repr(cfg))  # fmt: skip
            row["ours"] = time_graph_replay(ours, 4, replays=10, warmup_ms=20).us_per_call
            kt = kernel_times_us(ours, 4)
            row["gemm1_us"] = sum(v for k, v in kt.items() if "gemm1" in k)
            row["gemm2_us"] = sum(v for k, v in kt.items() if "gemm2" in k)
            row["kernels"] = kt
            best = None
            for per in (4096, 8192, 16384, 32768):  # 16-128 KB per program

                def stream(i, per=per):
                    if dids[i].numel():
                        _stream(views[i][:2], dids[i], per, sink)
                        _stream(views[i][2:], dids[i], per, sink)

                t = time_graph_replay(stream, 4, replays=10, warmup_ms=20).us_per_call
                row[f"stream2_words{per}"] = t
                best = t if best is None else min(best, t)
            row["stream2"] = best
            nw = int(row["bytes"]) // 4
            flat = [
                torch.randint(-9, 9, (max(nw, 1),), dtype=torch.int32, device="cuda")
                for _ in range(8)
            ]  # fmt: skip  (8 x the bytes: beyond L2 even at T = 1)
            one = torch.zeros(1, dtype=torch.int32, device="cuda")
            best = None
            for per in (2048, 4096, 8192, 16384):  # 8-64 KB per program

                def stream1(i, per=per, flat=flat):
                    v = flat[i].view(1, -1)
                    _stream_experts[(-(-nw // per),)](
                        v, one, nw, per, sink, -(-nw // per), BLOCK=min(BLOCK, per), num_warps=4
                    )

                t = time_graph_replay(stream1, 8, replays=10, warmup_ms=20).us_per_call
                best = t if best is None else min(best, t)
            row["stream1"] = best
            del flat

            def launch2(i):
                _empty[(256,)](sink)
                _empty[(256,)](sink)

            row["launch2"] = time_graph_replay(launch2, 4, replays=10, warmup_ms=20).us_per_call
            row["floor"] = row["bytes"] / bw * 1e6
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__, seed=seed,
                date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                copy_bandwidth_TBps=bw / 1e12)  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s; us per layer call")
    print(f"{'shape':9} {'T':>3} {'D':>6} {'floor':>6} {'launch2':>7} {'stream1':>7} "
          f"{'stream2':>7} {'ours':>6} {'gemm1':>6} {'gemm2':>6} ok")  # fmt: skip
    for r in rows:
        print(f"{r['shape']:9} {r['T']:>3} {r['distinct']:>6.1f} {r['floor']:>6.1f} "
              f"{r['launch2']:>7.1f} {r['stream1']:>7.1f} {r['stream2']:>7.1f} {r['ours']:>6.1f} "
              f"{r['gemm1_us']:>6.1f} {r['gemm2_us']:>6.1f} {r['ok']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], *(float(a) for a in sys.argv[2:3])))
