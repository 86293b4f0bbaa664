"""Capture policy: MoE layer time per real decode batch, SGLang's buckets vs the policy.

For GLM-5 TP8 per-GPU shapes (256 routed experts + the fused shared expert 256, top-k 8 + 1,
H 6144, I 256) and each real batch size ``T`` (default 1..64), two ways to serve the step:

* **default**: SGLang 0.5.23's default decode buckets (:data:`SGLANG_DEFAULT_DECODE_BS`): the
  graph at the next bucket ``B >= T``, its ``B - T`` padded rows routed like real tokens (SGLang
  carries no real-row count in TP mode, so nothing masks them);
* **policy**: the fp4ext capture policy (``capture_policy.policy_for("glm-5", 8, 1)``): the graph
  at the policy's next bucket, padded rows' routed ids masked to ``-1`` (the shared-expert column
  stays, as SGLang's CUDA masking leaves it), so padding reads no extra expert weights.

The layer is ``experts.run_experts("triton", ...)``, what SGLang's fp4ext runner core runs between
the top-k output and the combine. Times are CUDA-graph replays with weights and inputs rotated over
``--copies`` layer copies (``bench.timing.time_graph_replay``; 4 copies = 2.7 GB, far beyond L2),
default and policy interleaved per ``T``. The predicted saving is bytes arithmetic: expected
distinct experts read, ``1 + 256 (1 - (1 - 8/256)^rows)``, with rows = ``B`` (default) or ``T``
(policy). Capture memory: for one layer, the growth of the graphs' shared memory pool and of the
device memory in use (``cudaMemGetInfo``, which also counts the driver's graph objects) when
every graph of a bucket list is captured, SGLang's way (one pool, largest first).

Writes ``capture_policy_h200.json`` (GPU, versions, date, rows, capture memory) to ``--out`` and
prints a short table last. Needs a CUDA GPU; SGLang is not needed.

    PYTHONPATH=. python benchmarks/run_capture_policy.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

#: SGLang 0.5.23's default decode CUDA-graph batch sizes for a GLM-5-like model, TP8, on an H200
#: (also any 90-160 GiB GPU): ``decode.bs`` after ``ServerArgs.resolve_once()`` without fp4ext
#: (max_bs 512 from memory_hook; list from cuda_graph_hook.generate_decode_cuda_graph_batch_sizes).
#: tests/test_capture_policy_bench.py resolves it through SGLang and fails, printing the current
#: list, when it goes stale: paste that list here.
SGLANG_DEFAULT_DECODE_BS: tuple[int, ...] = (
    (1, 2, 4, 8, 12) + tuple(range(16, 257, 8)) + tuple(range(272, 513, 16))
)

#: GLM-5 routing as one TP8 rank sees it: top-8 of 256 routed experts, plus the shared expert.
ROUTED_EXPERTS, ROUTED_TOP_K, SHARED_ID = 256, 8, 256


# ---- pure parts (CPU-tested) -------------------------------------------------------------------


def next_bucket(buckets, T: int) -> int:
    """The captured size a batch of ``T`` runs in: the smallest bucket ``>= T``."""
    fits = [b for b in buckets if b >= T]
    if T < 1 or not fits:
        raise ValueError(f"no captured bucket holds T={T} (buckets up to {max(buckets)})")
    return min(fits)


def expected_experts_read(rows: int) -> float:
    """Expected distinct experts read by ``rows`` uniformly routed rows, the shared one included."""
    return 1.0 + ROUTED_EXPERTS * (1.0 - (1.0 - ROUTED_TOP_K / ROUTED_EXPERTS) ** rows)


def plan(tokens, default_bs, policy_bs) -> list[dict]:
    """Per real batch size: each side's graph, its padded rows, and the predicted bytes saving."""
    rows = []
    for T in tokens:
        bd, bp = next_bucket(default_bs, T), next_bucket(policy_bs, T)
        # Default: all bd rows routed. Policy: only the T real rows route (padding is masked).
        read_d, read_p = expected_experts_read(bd), expected_experts_read(T)
        rows.append(
            {
                "T": T,
                "default_bs": bd,
                "policy_bs": bp,
                "default_padded_rows": bd - T,
                "policy_padded_rows": bp - T,
                "predicted_experts_default": read_d,
                "predicted_experts_policy": read_p,
                "predicted_bytes_saving": 1.0 - read_p / read_d,
            }
        )
    return rows


def saving(default_us: float, policy_us: float) -> dict:
    """Time saved by the policy: absolute (us) and as a fraction of the default time."""
    if not default_us > 0:
        raise ValueError(f"default time must be > 0 us, got {default_us!r}")
    return {
        "saved_us": default_us - policy_us,
        "saved_fraction": (default_us - policy_us) / default_us,
    }


def table(rows: list[dict]) -> str:
    """The short table printed last."""
    head = (
        f"{'T':>3} {'B_def':>5} {'B_pol':>5} {'def_us':>8} {'pol_us':>8} {'saved':>7} "
        f"{'pred_bytes':>10}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['T']:3d} {r['default_bs']:5d} {r['policy_bs']:5d} {r['default_us']:8.1f} "
            f"{r['policy_us']:8.1f} {100 * r['saved_fraction']:6.1f}% "
            f"{100 * r['predicted_bytes_saving']:9.1f}%"
        )
    return "\n".join(lines)


# ---- GPU measurement ---------------------------------------------------------------------------


def _routing(B: int, real: int, masked: bool, gen):
    """``(x, topk_ids, topk_weights)`` for a graph of ``B`` rows with ``real`` real ones.

    Padded rows hold stale data, as SGLang's static buffers do: random activations and routing.
    ``masked``: their routed ids become -1 (SGLang's CUDA masking; the shared column stays).
    """
    import torch

    from sglang_fp4ext.bench.layer import make_routing
    from sglang_fp4ext.model_shapes import preset

    tp8 = preset("glm5-tp8")
    ids, tw, _ = make_routing(tp8, B, device="cuda", generator=gen)
    if masked:
        ids[real:] = -1
    ids = torch.cat([ids, torch.full((B, 1), SHARED_ID, dtype=torch.int32, device="cuda")], 1)
    tw = torch.cat([tw, torch.rand(B, 1, device="cuda", generator=gen)], 1)
    x = torch.randn(B, tp8.hidden, device="cuda", generator=gen).to(torch.bfloat16)
    return x, ids.contiguous(), tw.contiguous()


def _experts_read(ids) -> int:
    return int(ids[ids >= 0].unique().numel())


def capture_memory(layer, buckets, gen) -> dict:
    """Pool and device-memory growth from capturing one graph per bucket for one layer.

    As SGLang's decode runner: static inputs for the largest bucket, sliced per graph, one shared
    memory pool, largest bucket first. Eager warm-up of every bucket first (compile, workspaces),
    so only the graphs are counted. The MoE output is an intermediate of a model's graph, so it
    is released after each capture (the pool reuses it), as SGLang's graphs do.
    """
    import torch

    from sglang_fp4ext.moe.experts import run_experts

    top = max(buckets)
    sx, sids, stw = _routing(top, top, False, gen)
    for B in buckets:
        run_experts("triton", layer, sx[:B], sids[:B], stw[:B])
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, res0 = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
    pool, graphs = torch.cuda.graph_pool_handle(), []
    t0 = time.perf_counter()
    for B in sorted(buckets, reverse=True):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            run_experts("triton", layer, sx[:B], sids[:B], stw[:B])
        graphs.append(g)
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - t0
    free1, res1 = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
    del graphs
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {
        "graphs": len(buckets),
        "pool_growth_MiB": (res1 - res0) / 2**20,
        "device_used_growth_MiB": (free0 - free1) / 2**20,
        "capture_s": capture_s,
    }


def measure(args) -> dict:
    import torch

    from sglang_fp4ext import capture_policy as cp
    from sglang_fp4ext.bench import random_packed_weights
    from sglang_fp4ext.bench.report import environment
    from sglang_fp4ext.bench.timing import gpu_clocks, time_graph_replay
    from sglang_fp4ext.moe.experts import run_experts
    from sglang_fp4ext.moe.prepared import PreparedMoEWeights
    from sglang_fp4ext.moe.shape import current_target
    from sglang_fp4ext.moe.tables import config_for

    policy = cp.policy_for("glm5-tp8-fused-shared", 8, 1)
    shape = policy.inputs.per_rank_shape()  # E=257 (256 + fused shared), I=256, top_k=9
    default_bs, policy_bs = SGLANG_DEFAULT_DECODE_BS, policy.decode_bs
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else range(1, 65)
    rows = plan(tokens, default_bs, policy_bs)
    meta = {
        **environment(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "copies": args.copies,
        "replays": args.replays,
        "seed": args.seed,
        "shape": {"E": shape.E, "H": shape.H, "I": shape.I, "top_k": shape.top_k},
        "clocks_start": gpu_clocks(),
    }
    print(
        f"[capture-policy] {meta['gpu']} torch {meta['torch']} triton {meta['triton']}", flush=True
    )
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    layers = [
        PreparedMoEWeights.from_moe_weights(
            random_packed_weights(shape.E, shape.H, shape.I, device="cuda", generator=gen)
        )
        for _ in range(args.copies)
    ]
    meta["bytes_per_expert"] = layers[0].nbytes_per_expert()
    target = current_target()
    out = {
        "meta": meta,
        "sglang_default_decode_bs": list(default_bs),
        "policy_decode_bs": list(policy_bs),
        "rows": rows,
    }

    def timed(B: int, real: int, masked: bool):
        inputs = [_routing(B, real, masked, gen) for _ in range(args.copies)]
        t = time_graph_replay(
            lambda i: run_experts("triton", layers[i], *inputs[i]),
            args.copies,
            replays=args.replays,
        )
        read = sum(_experts_read(ids) for _, ids, _ in inputs) / len(inputs)
        return t, read

    for r in rows:
        T = r["T"]
        td, read_d = timed(r["default_bs"], T, masked=False)
        tp, read_p = timed(r["policy_bs"], T, masked=True)
        r.update(
            default_us=td.us_per_call,
            default_us_min=td.us_min,
            default_us_max=td.us_max,
            policy_us=tp.us_per_call,
            policy_us_min=tp.us_min,
            policy_us_max=tp.us_max,
            experts_read_default=read_d,
            experts_read_policy=read_p,
            measured_bytes_saving=1.0 - read_p / read_d,
            default_config=repr(config_for(r["default_bs"], shape, target)),
            policy_config=repr(config_for(r["policy_bs"], shape, target)),
            **saving(td.us_per_call, tp.us_per_call),
        )
        print(
            f"[time] T={T} default B={r['default_bs']} {td.us_per_call:.1f} us, policy "
            f"B={r['policy_bs']} {tp.us_per_call:.1f} us, saved {100 * r['saved_fraction']:.1f}%",
            flush=True,
        )
        _write(args, out)  # partial results survive a time limit
    out["capture_memory"] = {
        "what": "one layer, every graph of the list, one shared pool, largest first",
        "default": capture_memory(layers[0], default_bs, gen),
        "policy": capture_memory(layers[0], policy_bs, gen),
    }
    meta["clocks_end"] = gpu_clocks()
    small = [r for r in rows if r["default_padded_rows"] > 0]
    out["summary"] = {
        "tokens": [rows[0]["T"], rows[-1]["T"]],
        "padded_by_default": len(small),
        "mean_saved_fraction_where_padded": (
            sum(r["saved_fraction"] for r in small) / len(small) if small else 0.0
        ),
        "T_of_max_saving": max(rows, key=lambda r: r["saved_fraction"])["T"],
        # Where both sides run the same graph size with no padding the two times differ only by
        # noise: the scale against which the savings above are read.
        "mean_abs_saved_fraction_where_not_padded": (
            sum(abs(r["saved_fraction"]) for r in rows if r["default_padded_rows"] == 0)
            / max(1, sum(r["default_padded_rows"] == 0 for r in rows))
        ),
        "mean_saved_fraction_all": sum(r["saved_fraction"] for r in rows) / len(rows),
    }
    _write(args, out)
    return out


def _write(args, out: dict) -> None:
    d = Path(args.out)
    d.mkdir(parents=True, exist_ok=True)
    (d / args.name).write_text(json.dumps(out, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results")
    ap.add_argument("--name", default="capture_policy_h200.json")
    ap.add_argument("--tokens", default="", help="comma-separated real batch sizes (1..64)")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("run_capture_policy.py needs a CUDA GPU", file=sys.stderr)
        return 2
    out = measure(args)
    m = out["capture_memory"]
    print()
    print(table(out["rows"]))
    for k in ("default", "policy"):
        c = m[k]
        print(
            f"capture memory {k}: {c['graphs']} graphs, pool +{c['pool_growth_MiB']:.1f} MiB, "
            f"device +{c['device_used_growth_MiB']:.1f} MiB"
        )
    s = out["summary"]
    print(
        f"where SGLang pads ({s['padded_by_default']} of {len(out['rows'])} sizes): "
        f"mean saving {100 * s['mean_saved_fraction_where_padded']:.1f}%; unpadded sizes differ by "
        f"{100 * s['mean_abs_saved_fraction_where_not_padded']:.1f}% (noise)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
