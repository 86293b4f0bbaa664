"""``fp4ext bench`` on a CUDA GPU: every token count checked against the twin, then timed as
CUDA-graph replay for fp4ext (on the path the dispatcher serves), the torch bf16 peer and the
SGLang peers that run here; roofs measured once per run. Also the deliberately slowed decode
config of the regression-gate demo.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_fp4ext import hardware
from sglang_fp4ext.bench.figures import project_rows, row_numbers
from sglang_fp4ext.bench.layer import Layer
from sglang_fp4ext.bench.report import base_result, spec_rates
from sglang_fp4ext.gpu_spec import GPUSpec
from sglang_fp4ext.model_shapes import ModelShape
from sglang_fp4ext.progress import Progress

__all__ = ["run_block_gpu", "run_gpu", "slowed_config", "step_text"]


def slowed_config():
    """A deliberately poor decode :class:`DecodeConfig` for demonstrating the regression gate
    (``pytest benchmarks --fp4ext-slow-config``): the real kernels, correct for every shape, but
    no split-K (few busy programs at small T), 32-row tiles and no software pipelining."""
    from sglang_fp4ext.moe.decode.config import DotDecodeConfig

    return DotDecodeConfig(
        grid="experts",
        block_t=8,
        block_p=128,
        block_n1=32,
        split_k1=1,
        stages1=1,
        block_n2=32,
        split_k2=1,
        stages2=1,
        tiles2=1,
        gemm2="pairs",
    )


def run_gpu(
    shape: ModelShape,
    tokens: Sequence[int],
    *,
    copies: int = 4,
    replays: int = 20,
    seed: int = 2026,
    peer: bool = True,
    project: GPUSpec | None = None,
    progress: Progress | None = None,
) -> dict:
    from sglang_fp4ext.bench.peers import SGLANG_PEERS, has_grouped_mm, sglang_peer_unavailable
    from sglang_fp4ext.bench.timing import (
        bf16_matmul_tflops,
        copy_bandwidth_Bps,
        time_graph_replay,
    )

    result = base_result("gpu", shape, tokens, copies, replays, seed)
    here = hardware.spec_for_device_name(result["env"]["gpu"])
    bw = copy_bandwidth_Bps()
    mm = bf16_matmul_tflops()
    result["rates"] = spec_rates(
        here,
        {
            "copy_bandwidth_Bps": bw,
            "copy_bandwidth_basis": "device-to-device copy, bytes read + written, this run",
            "bf16_matmul_tflops": mm,
            "bf16_matmul_basis": "8192^3 bf16 torch.mm on random data, this run",
        },
    )
    if here is None:
        result["notes"].append(
            f"{result['env']['gpu']} is not in the hardware table: no spec roofs"
        )
    sgl = []  # SGLang peers that can run here; the others are named in notes with the reason
    for name in SGLANG_PEERS:
        why = sglang_peer_unavailable(name) if peer else "peers disabled (--no-peer)"
        if why is None:
            sgl.append(name)
        else:
            result["notes"].append(f"{name} not run: {why}")
    peer = peer and has_grouped_mm()
    if not peer:
        result["notes"].append("torch bf16 grouped-GEMM peer not run (no torch._grouped_mm?)")
    layer = Layer(shape, copies, seed=seed)
    result["dispatch"]["paths"] = {str(T): layer.served_path(T) for T in tokens}
    for T in tokens:
        path = layer.served_path(T)
        check = layer.check(T, path)
        n = layer.n_inputs(T)
        t = time_graph_replay(layer.ours(T, path), n, replays=replays)
        t_peer = time_graph_replay(layer.peer(T), n, replays=replays) if peer else None
        row = {"T": T, "path": path, "served": True, "config": repr(layer.config(T, path))}
        row["inputs_rotated"] = n
        row.update(
            row_numbers(
                shape,
                T,
                layer.distinct(T),
                t.us_per_call,
                copy_bw_Bps=bw,
                matmul_tflops=mm,
                peer_us=None if t_peer is None else t_peer.us_per_call,
            )
        )
        row.update(us_min=t.us_min, us_max=t.us_max, check=check)
        row["sglang_peers"] = _time_sglang_peers(layer, T, n, replays, t.us_per_call, sgl, result)
        result["rows"].append(row)
        if progress is not None:
            progress.step(step_text(T, t.us_per_call, result["rows"]))
    del layer
    torch.cuda.empty_cache()
    if not all(r["check"]["ok"] for r in result["rows"]):
        result["notes"].append("some rows FAILED the correctness check against the torch twin")
    if project is not None:
        result["projection"] = project_rows(result["rows"], shape, bw, project, here, mm)
    return result


def run_block_gpu(
    shape: ModelShape,
    tokens: Sequence[int],
    *,
    copies: int = 4,
    replays: int = 20,
    seed: int = 2026,
    peer: bool = True,
    progress: Progress | None = None,
) -> dict:
    """``fp4ext bench --block``: the MoE block as SGLang runs it (``bench/block.py``) with
    fp4ext's routed experts and, where it runs here, SGLang's Marlin; each checked against the
    twin before it is timed (one that fails is named in ``notes`` and not timed)."""
    from sglang_fp4ext.bench.block import MoEBlock, block_rows
    from sglang_fp4ext.bench.peers import sglang_peer_unavailable
    from sglang_fp4ext.bench.timing import copy_bandwidth_Bps

    result = base_result("gpu-block", shape, tokens, copies, replays, seed)
    bw = copy_bandwidth_Bps()
    result["rates"] = {
        "copy_bandwidth_Bps": bw,
        "copy_bandwidth_basis": "device-to-device copy, bytes read + written, this run",
    }
    marlin = "sglang-marlin"
    why = sglang_peer_unavailable(marlin) if peer else "peers disabled (--no-peer)"
    if why is not None:
        result["notes"].append(f"{marlin} not run: {why}")
    layer = Layer(shape, copies, seed=seed)
    block = MoEBlock(layer)
    for T in tokens:
        impls = {"fp4ext": block.fp4ext(T)}
        checks = {"fp4ext": block.check(T, impls["fp4ext"])}
        if why is None:
            ad = layer.sglang_adapters(marlin)
            impls[marlin] = lambda x, c, ids, tw, i, ad=ad: ad[c](x, ids, tw)
            # SGLang's Marlin epilogue is bf16 (rms 7e-3 - 1.2e-2 vs the twin, bench/peers.py).
            checks[marlin] = block.check(
                T, impls[marlin], pack=ad[0].weights, rms=2e-2, max_rel=float("inf")
            )
        for k, c in checks.items():
            if not c["ok"]:
                result["notes"].append(f"{k} T={T} does not match the twin {c}: not timed")
        ok = {k: f for k, f in impls.items() if checks[k]["ok"]}
        row = block_rows(block, T, ok, copy_bw_Bps=bw, replays=replays)
        row.update(checks=checks, check={"ok": checks["fp4ext"]["ok"]})
        result["rows"].append(row)
        if progress is not None:
            f = row["impls"].get("fp4ext")
            progress.step(f"T={T} block {f['block_us']:.1f} us" if f else f"T={T} FAILED")
    del block, layer
    torch.cuda.empty_cache()
    return result


def step_text(T: int, us: float, rows) -> str:
    """The progress bar's postfix after timing ``T``: its time, and the best speed-up over the
    torch peer among ``rows`` so far (left out while the peer has not run)."""
    best = max((r.get("speedup_vs_torch_peer") or 0 for r in rows), default=0)
    return f"T={T} {us:.1f} us" + (f", best {best:.2f}x torch" if best else "")


def _time_sglang_peers(layer, T, n, replays, our_us, names, result) -> dict:
    """``{name: {us, speedup, check}}`` for the SGLang peers in ``names`` at ``T``. A peer whose
    output does not match the twin is not timed (``None``); one that raises is reported in
    ``notes`` and dropped from ``names`` (the measurement of fp4ext goes on)."""
    from sglang_fp4ext.bench.timing import time_graph_replay

    out = {}
    for name in list(names):
        try:
            chk = layer.check_sglang_peer(T, name)
            if not chk["ok"]:
                result["notes"].append(f"{name} T={T} does not match the twin {chk}: not timed")
                out[name] = None
                continue
            us = time_graph_replay(layer.sglang_peer(T, name), n, replays=replays).us_per_call
            out[name] = {"us": us, "speedup": us / our_us, "check": chk}
        except Exception as exc:  # noqa: BLE001 - a peer's JIT build or kernel: report, go on
            result["notes"].append(f"{name} failed at T={T}: {type(exc).__name__}: {exc}")
            names.remove(name)
    return out
