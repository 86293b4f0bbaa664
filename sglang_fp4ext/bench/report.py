"""``fp4ext bench`` logic: measure one MoE layer across token counts, report it against roofs.

On a CUDA GPU (:func:`run_gpu`), for a model preset and layout (``roofline.PRESETS``, default
``glm5-tp8``): random NVFP4 experts in ``copies`` layer copies with inputs rotated so that one
pass touches several times the L2 (``Layer``), uniform routing, each T checked against the fp32
torch twin (output poisoned with NaN first), then timed as CUDA-graph replay
(``timing.time_graph_replay``) for fp4ext on the path the dispatcher serves and for the torch
bf16 grouped-GEMM peer. Copy bandwidth and a bf16 matmul rate are measured once
per run: every fraction is against one of them (or a dense peak from ``hardware``), and says so.
Without a GPU (:func:`run_cpu_check`) nothing is timed: the torch twin is checked against an
independent float64 computation (own E2M1 decode, own loops), and the Triton kernels under the
interpreter against the twin, at a tiny shape. Both write the JSON below and a roofline PNG.

JSON (``SCHEMA``; ``null`` where a figure does not exist on this machine or was not measured)::

    schema     "fp4ext-bench/1"
    mode       "gpu" | "cpu-check"
    date       UTC ISO-8601
    env        gpu, capability, sms, spec_key, torch, triton, cuda, python, sglang_fp4ext, sglang
    preset     the ModelShape fields + E_local, I_local, top_k_local, expert_bytes
    settings   tokens, copies, replays, seed
    dispatch   {"rule": text, "paths": {T: "decode" | "prefill"}} (which path serves each T)
    rates      copy_bandwidth_Bps, bf16_matmul_tflops (measured here, once; null without a GPU)
               with *_basis texts; spec_bandwidth_Bps, spec_label, dense_bf16_tflops,
               dense_bf16_basis (hardware table; null for a GPU not in it)
    rows       GPU only, per T: T, path, served, config, inputs_rotated, distinct_experts,
               bytes_floor, flops, floor_us, us, us_min, us_max, achieved_TBps,
               fraction_of_copy_bw, tflops, fraction_of_bf16_matmul, peer_us,
               speedup_vs_torch_peer, check {max_rel, rms_rel, nonfinite, ok},
               sglang_peers {name: {us, speedup, check} | null} (SGLang peers that ran here;
               the others are named in notes with the reason)
    check      cpu-check only: [{what, shape, T, max_rel, rms_rel, nonfinite, tolerance, ok}]
    projection null | {target, target_key, source_spec, basis, assumptions, n_moe_layers,
               rows: [{T, measured_us, projected_layer_us, projected_step_us,
               projected_us_per_token, target_floor_us, label}], note}; every entry is a
               PROJECTION, never a measurement (no GPU: rows [] and a note)
    plot       file name of the PNG next to the JSON (null without matplotlib)
    notes      plain-language remarks (e.g. "no GPU: nothing was timed")

``bytes_floor`` = the distinct local experts' NVFP4 weights (counted from the routing used) plus
the bf16 activations read and written once (``roofline.bytes_floor(..., tokens=T)``);
``achieved_TBps`` = bytes floor / measured time (the bytes a fused kernel must move, not what it
moved); ``tflops`` = ``roofline.moe_flops`` / time.

The measurements themselves (graph capture/replay, copy bandwidth, bf16 matmul rate) live in
``timing.py``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import importlib.util
import json
import math
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sglang_fp4ext import __version__, hardware, roofline
from sglang_fp4ext.roofline import ModelShape

__all__ = [
    "DEFAULT_TOKENS",
    "DISPATCH_RULE",
    "SCHEMA",
    "SUITE_TOKENS",
    "Layer",
    "Progress",
    "default_name",
    "dispatch_path",
    "environment",
    "format_table",
    "make_routing",
    "moe_f64",
    "project_rows",
    "resolve_spec",
    "row_numbers",
    "run_cpu_check",
    "run_gpu",
    "slowed_config",
    "write_outputs",
    "write_plot",
]

SCHEMA = "fp4ext-bench/1"
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SUITE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

#: What ``sglang_backend.Fp4ExtRunnerCore`` serves: ``moe.experts.run_experts`` ->
#: ``moe.dispatch.fused_moe``, which picks the decode or prefill kernels per token bucket from the
#: config table (``moe/config.py``: user dir, then the shipped ``configs/<GPU>.json``), else the
#: heuristic switch (prefill from ``PREFILL_MIN_TOKENS``). :func:`dispatch_path` asks the same code.
DISPATCH_RULE = (
    "runner core -> moe.dispatch.fused_moe: the table's path per token bucket, else decode below "
    "PREFILL_MIN_TOKENS and prefill from it"
)


def slowed_config():
    """A deliberately poor decode :class:`KernelConfig` for demonstrating the regression gate
    (``pytest benchmarks --fp4ext-slow-config``): the real kernels, correct for every shape, but
    no split-K (few busy programs at small T), 32-row tiles and no software pipelining."""
    from sglang_fp4ext.moe.decode_config import KernelConfig

    return KernelConfig(
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


def dispatch_path(tokens: int, shape=None, target=None) -> str:
    """The fp4ext path SGLang's runner core serves ``tokens`` rows with (see DISPATCH_RULE):
    ``moe.config.select`` for a ``MoEShape`` and target (this GPU by default); without a shape,
    the heuristic switch alone."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    from sglang_fp4ext.moe import config as C

    if shape is None:
        return C.heuristic_path(tokens, None, None)
    return C.select(tokens, shape, target).path


# ---- environment -------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """GPU and versions (SGLang's version from its metadata: never imported here)."""
    import triton

    from sglang_fp4ext import target_info

    gpu = cap = sms = spec_key = None
    if target_info.has_cuda_gpu():
        gpu = torch.cuda.get_device_name()
        c = torch.cuda.get_device_capability()
        cap = f"sm_{c[0]}{c[1]}"
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        spec = hardware.spec_for_device_name(gpu)
        spec_key = None if spec is None else spec.key
    return {
        "gpu": gpu,
        "capability": cap,
        "sms": sms,
        "spec_key": spec_key,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "sglang_fp4ext": __version__,
        "sglang": _version("sglang"),
    }


def _preset_dict(shape: ModelShape) -> dict:
    d = dataclasses.asdict(shape)
    d.update(
        E_local=shape.E_local,
        I_local=shape.I_local,
        top_k_local=shape.top_k_local,
        expert_bytes=shape.expert_bytes,
    )
    return d


def resolve_spec(name: str) -> hardware.GPUSpec:
    """A hardware-table entry by key (``rtx-pro-6000-ws``) or device name; clear error if none."""
    try:
        return hardware.spec_by_key(name)
    except KeyError:
        spec = hardware.spec_for_device_name(name)
        if spec is None:
            keys = sorted(s.key for s in hardware.all_specs())
            raise ValueError(f"no GPU {name!r} in the hardware table; known keys: {keys}") from None
        return spec


# ---- inputs ------------------------------------------------------------------------------------


def make_routing(shape: ModelShape, tokens: int, *, device, generator=None):
    """Uniform top-k over the model's routed experts as rank 0 of the layout sees it.

    EP: ids of other ranks become -1. Fused shared expert(s) (TP): extra columns with the local
    ids after the routed ones, weight 1. Returns ``(topk_ids int32 (T, top_k_local), topk_weights
    fp32, distinct local experts)``.
    """
    scores = torch.rand(tokens, shape.n_experts, device=device, generator=generator)
    w, ids = scores.topk(shape.top_k, dim=1)
    w = w / w.sum(dim=1, keepdim=True)
    local = shape.n_experts // shape.ep
    ids = torch.where(ids < local, ids, -1)
    if shape.fuse_shared:
        shared = torch.arange(local, local + shape.n_shared, device=device).expand(tokens, -1)
        ids = torch.cat([ids, shared], dim=1)
        w = torch.cat([w, torch.ones(tokens, shape.n_shared, device=device)], dim=1)
    ids = ids.to(torch.int32).contiguous()
    return ids, w.float().contiguous(), roofline.distinct_experts(ids)


# ---- GPU measurement ---------------------------------------------------------------------------


class Layer:
    """``copies`` random NVFP4 copies of ``shape``'s per-GPU MoE layer on ``device`` (the GPU;
    the CPU tier uses the interpreter at a tiny shape), prepared for the kernels, plus (lazily)
    the torch bf16 peer of each copy; inputs per token count.

    L2: at small T a call touches only a few experts (GLM-5 TP8, T = 1: 8 x 2.65 MB), so a few
    copies with one routing each would stay in a 60-128 MB L2 across replays. Each token count
    therefore gets ``n_inputs(T)`` = ``copies x rotations`` inputs (x, routing, output), input
    ``i`` on copy ``i % copies``, with rotations chosen so the bytes one pass touches exceed
    ``L2_FACTOR`` x the L2 size. It depends on the GPU and T only (expected, not measured,
    distinct experts), so a graph of one pass is the same from run to run.
    """

    L2_FACTOR = 3
    MAX_ROTATIONS = 16

    def __init__(
        self, shape: ModelShape, copies: int, *, seed: int = 2026, device="cuda", l2_bytes=None
    ):
        from sglang_fp4ext.bench import random_packed_weights
        from sglang_fp4ext.moe.prepared import PreparedMoEWeights

        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        self.shape, self.copies, self.device = shape, copies, torch.device(device)
        if l2_bytes is None:
            l2_bytes = 0
            if self.device.type == "cuda":
                l2_bytes = torch.cuda.get_device_properties(self.device).L2_cache_size
        self.l2_bytes = l2_bytes
        self.seed = seed
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        self.packs = [
            random_packed_weights(
                shape.E_local, shape.hidden, shape.I_local, device=self.device, generator=self.gen
            )
            for _ in range(copies)
        ]
        self.prepared = [PreparedMoEWeights.from_moe_weights(p) for p in self.packs]
        self._peers = None
        self._sglang: dict[str, list] = {}
        self._inputs: dict[int, tuple] = {}

    def n_inputs(self, T: int) -> int:
        """Inputs rotated for ``T`` tokens (see the class docstring)."""
        per_call = self.shape.bytes_floor(self.shape.expected_distinct(T), tokens=T)
        want = self.L2_FACTOR * self.l2_bytes / (self.copies * max(per_call, 1.0))
        return self.copies * min(self.MAX_ROTATIONS, max(1, math.ceil(want)))

    def inputs(self, T: int):
        """``n_inputs(T)`` of: x (T, H) bf16 N(0, 1), routing, output; cached for the last T.

        Drawn from a generator seeded by (seed, T) alone, so a run times the same routings
        whichever token counts, presets or cases ran before it: a regression gate compares equal
        work. (Drawn from the shared stream, the H200 gate demo's EP8 T = 8 inputs hit 7.25
        distinct local experts per call against the baseline's 6.00 and read 12.8% slower with
        unchanged kernels; ``benchmarks/results/gate_demo_h200.log``.)
        """
        if T not in self._inputs:
            self._inputs.clear()
            g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + T)
            xs, routes, outs = [], [], []
            for _ in range(self.n_inputs(T)):
                x = torch.randn(T, self.shape.hidden, device=self.device, generator=g)
                xs.append(x.to(torch.bfloat16))
                routes.append(make_routing(self.shape, T, device=self.device, generator=g))
                outs.append(torch.empty_like(xs[-1]))
            self._inputs[T] = (xs, routes, outs)
        return self._inputs[T]

    def config(self, T: int, path: str = "decode"):
        """The config the kernels pick for ``T`` on ``path`` (table/heuristic; prefill: its
        heuristic), for the record."""
        from sglang_fp4ext.moe.config import config_for

        mshape, target = self._moe_shape_target()
        if path == "prefill":
            from sglang_fp4ext.moe.config import prefill_config_for

            return prefill_config_for(T, mshape, target)
        return config_for(T, mshape, target)

    def _moe_shape_target(self):
        from sglang_fp4ext.moe.shape import current_target

        mshape = self.prepared[0].shape(self.shape.top_k_local)
        target = current_target(self.device) if self.device.type == "cuda" else current_target()
        return mshape, target

    def served_path(self, T: int) -> str:
        """The path the runner core (``moe.dispatch``) takes for ``T`` tokens on this layer."""
        return dispatch_path(T, *self._moe_shape_target())

    def ours(self, T: int, path: str | None = None) -> Callable[[int], object]:
        from sglang_fp4ext.moe.decode import fused_moe_nvfp4

        path = path or self.served_path(T)
        xs, routes, outs = self.inputs(T)
        if path == "decode":
            cfg = self.config(T)

            def step(i):
                ids, tw, _ = routes[i]
                w = self.prepared[i % self.copies]
                return fused_moe_nvfp4(xs[i], w, ids, tw, out=outs[i], config=cfg)

            return step
        if path == "prefill":
            from sglang_fp4ext.moe.prefill import fused_moe_nvfp4_prefill

            pcfg = self.config(T, "prefill")

            def step(i):
                ids, tw, _ = routes[i]
                w = self.prepared[i % self.copies]
                return fused_moe_nvfp4_prefill(xs[i], w, ids, tw, out=outs[i], config=pcfg)

            return step
        raise ValueError(f"unknown path {path!r}; expected 'decode' or 'prefill'")

    def peer(self, T: int) -> Callable[[int], object]:
        from sglang_fp4ext.bench.peers import TorchGroupedMMMoE

        if self._peers is None:
            self._peers = [TorchGroupedMMMoE(p) for p in self.packs]
        xs, routes, _ = self.inputs(T)
        return lambda i: self._peers[i % self.copies](xs[i], routes[i][0], routes[i][1])

    def sglang_peer(self, T: int, name: str) -> Callable[[int], object]:
        """Step over the inputs for SGLang's peer ``name`` (``bench/peers.py``), one adapter per
        layer copy (built on first use; raises with the reason where it cannot run)."""
        from sglang_fp4ext.bench.peers import make_sglang_peer

        adapters = self._sglang.get(name)
        if adapters is None:
            # Own seed: the calibration (hence FlashInfer's scales) must not depend on run order.
            g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 - 1)
            calib = torch.randn(64, self.shape.hidden, device=self.device, generator=g)
            calib = calib.to(torch.bfloat16)
            adapters = [
                make_sglang_peer(name, p, x_calib=calib, ep_size=self.shape.ep) for p in self.packs
            ]
            self._sglang[name] = adapters
        xs, routes, _ = self.inputs(T)
        return lambda i: adapters[i % self.copies](xs[i], routes[i][0], routes[i][1])

    def check_sglang_peer(self, T: int, name: str) -> dict:
        """SGLang peer ``name`` on input 0 vs the fp32 twin of the pack it computes (W4A4 twin
        for FlashInfer, whose activations are NVFP4)."""
        from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
        from sglang_fp4ext.testing.compare import error_stats

        out = self.sglang_peer(T, name)(0)
        adapter = self._sglang[name][0]
        w4a4 = adapter.w4a4
        xs, routes, _ = self.inputs(T)
        ref = fused_moe_nvfp4_torch(
            xs[0], adapter.weights, routes[0][0], routes[0][1], quantize_activations=w4a4
        )
        st = error_stats(out, ref)
        # W4A16 (marlin): bf16 output of fp32-accumulated GEMMs, as for fp4ext. W4A4: the
        # intermediate is requantised from bf16 vs the twin's fp32, moving a few E2M1 roundings.
        rms, mx = (5e-2, 5e-1) if w4a4 else (5e-3, 1e-2)
        ok = st.nonfinite == 0 and st.rms_rel <= rms and st.max_rel <= mx
        return {"max_rel": st.max_rel, "rms_rel": st.rms_rel, "nonfinite": st.nonfinite, "ok": ok}

    def check(self, T: int, path: str | None = None) -> dict:
        """fp4ext output (NaN-poisoned first) vs the fp32 twin on copy 0."""
        from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
        from sglang_fp4ext.testing.compare import error_stats

        xs, routes, outs = self.inputs(T)
        outs[0].fill_(float("nan"))
        self.ours(T, path)(0)
        ref = fused_moe_nvfp4_torch(xs[0], self.packs[0], routes[0][0], routes[0][1])
        st = error_stats(outs[0], ref)
        # bf16 output of fp32-accumulated NVFP4 GEMMs: tests/test_decode_gpu.py holds kernels to
        # rms 5e-3 / max 1e-2 of the twin; a wrong expert, slot or scale is O(1).
        ok = st.nonfinite == 0 and st.rms_rel <= 5e-3 and st.max_rel <= 1e-2
        return {"max_rel": st.max_rel, "rms_rel": st.rms_rel, "nonfinite": st.nonfinite, "ok": ok}

    def distinct(self, T: int) -> float:
        """Mean distinct local experts per call over the inputs actually used."""
        routes = self.inputs(T)[1]
        return sum(r[2] for r in routes) / len(routes)


def row_numbers(
    shape: ModelShape,
    T: int,
    distinct: float,
    us: float,
    *,
    copy_bw_Bps: float | None,
    matmul_tflops: float | None,
    peer_us: float | None = None,
) -> dict:
    """Derived figures of one measured time: floor, achieved TB/s, fractions, peer ratio."""
    nbytes = shape.bytes_floor(distinct, tokens=T)
    # EP: rank 0 computes only its local (token, expert) pairs, T*k/ep on average under uniform
    # routing (counting all T*k pairs reported 1,095 TFLOP/s for EP8 prefill on the H200 -- above
    # its 989 TFLOP/s dense bf16 peak).
    flops = shape.flops(T)
    tflops = flops / (us * 1e-6) / 1e12
    return {
        "distinct_experts": distinct,
        "bytes_floor": nbytes,
        "flops": flops,
        "floor_us": None if not copy_bw_Bps else roofline.time_floor_us(nbytes, copy_bw_Bps),
        "us": us,
        "achieved_TBps": roofline.achieved_tbps(nbytes, us),
        "fraction_of_copy_bw": None
        if not copy_bw_Bps
        else roofline.bandwidth_fraction(nbytes, us, copy_bw_Bps),
        "tflops": tflops,
        "fraction_of_bf16_matmul": None if not matmul_tflops else tflops / matmul_tflops,
        "peer_us": peer_us,
        "speedup_vs_torch_peer": None if peer_us is None else peer_us / us,
    }


# ---- projection --------------------------------------------------------------------------------


def project_rows(
    rows: Sequence[dict],
    shape: ModelShape,
    measured_bw_Bps: float,
    target: hardware.GPUSpec,
    source: hardware.GPUSpec | None,
) -> dict:
    """Per-token MoE time on ``target`` from times measured here (``roofline.projection``).

    Per row: the layer time is projected; a decode step runs ``shape.n_moe_layers`` such layers,
    so ``projected_step_us = layer x n_moe_layers`` and ``projected_us_per_token = step / T``.
    """
    out = []
    assumptions: tuple[str, ...] = ()
    for r in rows:
        p = roofline.projection(
            r["us"], r["bytes_floor"], measured_bw_Bps, target, source_spec=source
        )
        assumptions = p.assumptions
        step = p.projected_us * shape.n_moe_layers
        out.append(
            {
                "T": r["T"],
                "measured_us": r["us"],
                "projected_layer_us": p.projected_us,
                "projected_step_us": step,
                "projected_us_per_token": step / r["T"],
                "target_floor_us": p.target_floor_us,
                "label": p.label(),
            }
        )
    return {
        "target": target.name,
        "target_key": target.key,
        "source_spec": None if source is None else source.key,
        "basis": "PROJECTION (not measured): bandwidth-bound part scaled by bandwidth ratio",
        "assumptions": list(assumptions),
        "n_moe_layers": shape.n_moe_layers,
        "rows": out,
        "note": None,
    }


# ---- progress, table ---------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (carriage-return updates; newline at the end)."""

    def __init__(self, total: int, label: str, stream=None, width: int = 24):
        self.total, self.label, self.n, self.width = max(total, 1), label, 0, width
        self.stream = stream if stream is not None else sys.stderr

    def step(self, what: str) -> None:
        self.n += 1
        done = int(self.width * self.n / self.total)
        bar = "#" * done + "." * (self.width - done)
        self.stream.write(f"\r[{bar}] {self.n}/{self.total} {self.label} {what:<24}")
        if self.n >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_table(result: dict) -> str:
    """The measured rows as a text table (nothing printed that was not measured)."""
    lines = []
    rates = result.get("rates") or {}
    if result["mode"] == "gpu":
        lines.append(
            f"{result['env']['gpu']} | {result['preset']['name']} | copy bandwidth "
            f"{rates['copy_bandwidth_Bps'] / 1e12:.2f} TB/s, bf16 matmul "
            f"{rates['bf16_matmul_tflops']:.0f} TFLOP/s (both measured in this run)"
        )
        sgl = sorted({k for r in result["rows"] for k in r.get("sglang_peers") or {}})
        lines.append(
            f"{'T':>5} {'path':7} {'us':>9} {'floor us':>9} {'TB/s':>6} {'% BW':>6} "
            f"{'TFLOP/s':>8} {'torch us':>9} {'x torch':>7} {'check':>5}"
            + "".join(f" {'x ' + k.removeprefix('sglang-'):>20}" for k in sgl)
        )
        for r in result["rows"]:
            frac = r["fraction_of_copy_bw"]
            peers = r.get("sglang_peers") or {}
            lines.append(
                f"{r['T']:5d} {r['path']:7} {r['us']:9.1f} {_f(r['floor_us'], '9.1f')} "
                f"{r['achieved_TBps']:6.2f} {_f(None if frac is None else 100 * frac, '5.1f')}% "
                f"{r['tflops']:8.1f} {_f(r['peer_us'], '9.1f')} "
                f"{_f(r['speedup_vs_torch_peer'], '7.2f')} "
                f"{'ok' if r['check']['ok'] else 'FAIL':>5}"
                + "".join(f" {_f((peers.get(k) or {}).get('speedup'), '.2f'):>20}" for k in sgl)
            )
    else:
        lines.append("no CUDA GPU: nothing was timed; correctness check on the reference path")
        for c in result["check"]:
            lines.append(
                f"  {c['what']:<40} max_rel {c['max_rel']:.2e} rms_rel {c['rms_rel']:.2e} "
                f"(tolerance {c['tolerance']}) {'ok' if c['ok'] else 'FAIL'}"
            )
    proj = result.get("projection")
    if proj:
        if proj["rows"]:
            lines.append(f"PROJECTION (not measured) for {proj['target']}:")
            for p in proj["rows"]:
                lines.append(
                    f"  T={p['T']:5d} layer {p['projected_layer_us']:8.1f} us, "
                    f"{proj['n_moe_layers']} MoE layers "
                    f"{p['projected_step_us'] / 1e3:7.2f} ms/step, "
                    f"{p['projected_us_per_token']:8.1f} us/token"
                )
            lines.append("  assumptions: " + "; ".join(proj["assumptions"]))
        if proj.get("note"):
            lines.append(f"projection for {proj['target']}: {proj['note']}")
    return "\n".join(lines)


# ---- plot --------------------------------------------------------------------------------------


def write_plot(result: dict, path: Path) -> Path:
    """Roofline PNG: TFLOP/s vs arithmetic intensity (FLOP per floor byte).

    Roofs: the measured copy bandwidth and the measured bf16 matmul rate when there is a GPU, and
    the dense BF16 peak of the hardware table (never a sparse figure); each legend entry names its
    basis. Points: measured fp4ext and torch-peer rows. Without measurements the roofs come from
    the table (labelled "spec, not measured") and the cases are marked only by their intensity.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    shape = roofline.preset(result["preset"]["name"])
    rates = result.get("rates") or {}
    tokens = result["settings"]["tokens"]
    ai = {
        T: shape.flops(T)
        / shape.bytes_floor(shape.expected_distinct(T), tokens=T)
        for T in tokens
    }
    xs = [min(ai.values()) / 4, max(ai.values()) * 4]
    top = rates.get("bf16_matmul_tflops") or rates.get("dense_bf16_tflops")
    bw_top = rates.get("copy_bandwidth_Bps") or rates.get("spec_bandwidth_Bps")
    if top and bw_top:  # reach the ridge point so the roofline's knee shows
        xs[1] = max(xs[1], 2 * top * 1e12 / bw_top)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    roofs = []
    if rates.get("copy_bandwidth_Bps"):
        roofs.append((rates["copy_bandwidth_Bps"], "measured copy bandwidth", "tab:blue", "-"))
    if rates.get("spec_bandwidth_Bps"):
        roofs.append((rates["spec_bandwidth_Bps"], rates["spec_label"], "tab:blue", ":"))
    for bw, label, color, ls in roofs:
        ax.plot(
            xs,
            [x * bw / 1e12 for x in xs],
            color=color,
            ls=ls,
            label=f"{label}: {bw / 1e12:.2f} TB/s",
        )
    if rates.get("bf16_matmul_tflops"):
        v = rates["bf16_matmul_tflops"]
        ax.axhline(v, color="tab:red", label=f"measured bf16 matmul: {v:.0f} TFLOP/s")
    if rates.get("dense_bf16_tflops"):
        v = rates["dense_bf16_tflops"]
        ax.axhline(v, color="tab:red", ls=":", label=f"{rates['dense_bf16_basis']}: {v:g} TFLOP/s")
    rows = result.get("rows") or []
    if rows:
        x = [r["flops"] / r["bytes_floor"] for r in rows]
        ax.plot(x, [r["tflops"] for r in rows], "o-", color="k", label="fp4ext (measured)")
        for xi, r in zip(x, rows):
            ax.annotate(
                f"T={r['T']}",
                (xi, r["tflops"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
        peer = [
            (xi, r["flops"] / (r["peer_us"] * 1e-6) / 1e12)
            for xi, r in zip(x, rows)
            if r["peer_us"]
        ]
        if peer:
            ax.plot(
                *zip(*peer), "s--", color="tab:gray", label="torch bf16 grouped-GEMM (measured)"
            )
    else:
        for a in ai.values():
            ax.axvline(a, color="tab:gray", lw=0.5)
        ax.plot([], [], color="tab:gray", lw=0.5, label="case intensity (no time measured)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ys = [line_y for line in ax.get_lines() for line_y in line.get_ydata() if line_y > 0]
    if not ys:  # no roof and no point: keep a valid log axis
        ax.set_ylim(1e-2, 1e4)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the NVFP4 bytes floor)")
    ax.set_ylabel("TFLOP/s")
    where = result["env"]["gpu"] or "no GPU (nothing measured)"
    ax.set_title(f"fp4ext MoE roofline: {result['preset']['name']} on {where}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- runs --------------------------------------------------------------------------------------


def _base(mode: str, shape: ModelShape, tokens, copies, replays, seed: int) -> dict:
    return {
        "schema": SCHEMA,
        "mode": mode,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "env": environment(),
        "preset": _preset_dict(shape),
        "settings": {"tokens": list(tokens), "copies": copies, "replays": replays, "seed": seed},
        "dispatch": {"rule": DISPATCH_RULE, "paths": {str(T): dispatch_path(T) for T in tokens}},
        "rates": None,
        "rows": [],
        "check": [],
        "projection": None,
        "plot": None,
        "notes": [],
    }


def _spec_rates(spec: hardware.GPUSpec | None, rates: dict) -> dict:
    if spec is None:
        rates.update(
            spec_bandwidth_Bps=None, spec_label=None, dense_bf16_tflops=None, dense_bf16_basis=None
        )
        return rates
    src = spec.source("dense.bf16")
    rates.update(
        spec_bandwidth_Bps=spec.mem_bandwidth_Bps,
        spec_label=f"spec DRAM bandwidth ({spec.name})",
        dense_bf16_tflops=hardware.dense_peak(spec, "bf16"),
        dense_bf16_basis=f"dense BF16 peak ({spec.name}, {src.kind if src else '?'})",
    )
    return rates


def run_gpu(
    shape: ModelShape,
    tokens: Sequence[int],
    *,
    copies: int = 4,
    replays: int = 20,
    seed: int = 2026,
    peer: bool = True,
    project: hardware.GPUSpec | None = None,
    progress: Progress | None = None,
) -> dict:
    from sglang_fp4ext.bench.peers import SGLANG_PEERS, has_grouped_mm, sglang_peer_unavailable
    from sglang_fp4ext.bench.timing import (
        bf16_matmul_tflops,
        copy_bandwidth_Bps,
        time_graph_replay,
    )

    result = _base("gpu", shape, tokens, copies, replays, seed)
    here = hardware.spec_for_device_name(result["env"]["gpu"])
    bw = copy_bandwidth_Bps()
    mm = bf16_matmul_tflops()
    result["rates"] = _spec_rates(
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
            progress.step(f"T={T} {t.us_per_call:.1f} us")
    del layer
    torch.cuda.empty_cache()
    if not all(r["check"]["ok"] for r in result["rows"]):
        result["notes"].append("some rows FAILED the correctness check against the torch twin")
    if project is not None:
        result["projection"] = project_rows(result["rows"], shape, bw, project, here)
    return result


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


# ---- CPU correctness check ---------------------------------------------------------------------


def _e2m1_f64(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 decoded from its bit fields (sign bit 3, exponent bits 2..1, mantissa bit 0), in
    float64, written out independently of ``nvfp4.format``'s lookup table."""
    c = codes.long()
    s, e, m = (c >> 3) & 1, (c >> 1) & 3, c & 1
    mag = torch.where(
        e > 0, torch.pow(2.0, (e - 1).double()) * (1 + m.double() / 2), m.double() / 2
    )
    return torch.where(s == 1, -mag, mag)


def _dequant_f64(packed, block_scale, row_scale) -> torch.Tensor:
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)
    vals = _e2m1_f64(codes)
    per = block_scale.to(torch.float64).repeat_interleave(16, dim=-1)
    return vals * per * row_scale.to(torch.float64).unsqueeze(-1)


def moe_f64(x, w, ids, tw) -> torch.Tensor:
    """Per (token, slot) loop in float64: the oracle the torch twin is checked against."""
    I = w.intermediate_size
    s13 = torch.cat(
        [w.w13_scale_2[:, :1].expand(-1, I), w.w13_scale_2[:, 1:2].expand(-1, I)], dim=1
    )
    w13 = _dequant_f64(w.w13, w.w13_scale, s13)
    w2 = _dequant_f64(w.w2, w.w2_scale, w.w2_scale_2.unsqueeze(1).expand(-1, w.hidden_size))
    xd = x.double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            h = w13[e] @ xd[t]
            a = torch.nn.functional.silu(h[:I]) * h[I:]
            out[t] += float(tw[t, j]) * (w2[e] @ a)
    return out


def _check_entry(what: str, dims: dict, T: int, st, tol: tuple[float, float]) -> dict:
    ok = st.nonfinite == 0 and st.max_rel <= tol[0] and st.rms_rel <= tol[1]
    return {
        "what": what,
        "shape": dims,
        "T": T,
        "max_rel": st.max_rel,
        "rms_rel": st.rms_rel,
        "nonfinite": st.nonfinite,
        "tolerance": f"max_rel {tol[0]:g}, rms_rel {tol[1]:g}",
        "ok": ok,
    }


def run_cpu_check(
    shape: ModelShape,
    tokens: Sequence[int],
    *,
    seed: int,
    interpreter: bool = True,
    project: hardware.GPUSpec | None = None,
    progress: Progress | None = None,
) -> dict:
    """No GPU: check the reference path at a tiny shape with ``shape``'s routing structure
    (EP -1 slots, fused shared column). Nothing is timed."""
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
    from sglang_fp4ext.moe.weights import random_moe_weights
    from sglang_fp4ext.testing.compare import error_stats

    # Tiny stand-in of the layout: 16 routed experts (ep divides 16 for every preset), top-4.
    tiny = dataclasses.replace(
        shape, n_experts=16, top_k=min(4, shape.top_k), hidden=256, moe_intermediate=128 * shape.tp
    )
    small_T = [T for T in tokens if T <= 8][:2] or [1, 3]
    result = _base("cpu-check", shape, tokens, None, None, seed)
    result["notes"].append(
        "no CUDA GPU on this machine: nothing was timed. Ran a correctness check of the reference "
        f"path instead, at a tiny stand-in of {shape.name} (E={tiny.n_experts} routed, "
        f"top_k={tiny.top_k}, H={tiny.hidden}, I={tiny.I_local}, tp={tiny.tp}, ep={tiny.ep})."
    )
    dims = {"E": tiny.E_local, "H": tiny.hidden, "I": tiny.I_local, "top_k": tiny.top_k_local}
    g = torch.Generator().manual_seed(seed)
    w = random_moe_weights(tiny.E_local, tiny.hidden, tiny.I_local, generator=g)
    for T in small_T:
        x = torch.randn(T, tiny.hidden, generator=g).to(torch.bfloat16)
        for _ in range(100):  # EP: redraw until a slot is local, so the output is not zeros
            ids, tw, _ = make_routing(tiny, T, device="cpu", generator=g)
            if (ids >= 0).any():
                break
        twin = fused_moe_nvfp4_torch(x, w, ids, tw)
        oracle = moe_f64(x, w, ids, tw)
        # fp32 twin vs float64 on exactly representable weights: only fp32 rounding of K <= 256
        # sums separates them (~1e-7 relative); a wrong scale, nibble or slot is O(1).
        result["check"].append(
            _check_entry(
                "torch twin (fp32) vs float64 oracle",
                dims,
                T,
                error_stats(twin, oracle),
                (1e-5, 1e-6),
            )
        )
        if progress is not None:
            progress.step(f"twin T={T}")
        if interpreter:
            result["check"].append(_interpreter_check(w, x, ids, tw, twin, dims, T))
            if progress is not None:
                progress.step(f"interpreter T={T}")
    # Roofs for the plot from the table (the projection target, else the project's target GPU),
    # labelled as spec figures; nothing measured.
    roof_spec = project or hardware.spec_by_key("rtx-pro-6000-ws")
    result["rates"] = _spec_rates(
        roof_spec, {"copy_bandwidth_Bps": None, "bf16_matmul_tflops": None}
    )
    result["rates"]["spec_label"] = f"spec DRAM bandwidth ({roof_spec.name}; not measured)"
    if project is not None:
        result["projection"] = {
            "target": project.name,
            "target_key": project.key,
            "source_spec": None,
            "basis": "PROJECTION (not measured)",
            "assumptions": [],
            "n_moe_layers": shape.n_moe_layers,
            "rows": [],
            "note": "needs times measured on a GPU; none were measured here, so none projected",
        }
    return result


def _interpreter_check(w, x, ids, tw, twin, dims, T) -> dict:
    from sglang_fp4ext import target_info
    from sglang_fp4ext.moe.decode import fused_moe_nvfp4
    from sglang_fp4ext.moe.prepared import PreparedMoEWeights
    from sglang_fp4ext.testing.compare import error_stats

    if not target_info.is_interpreter():
        raise RuntimeError("the kernel check needs TRITON_INTERPRET=1 set before kernels import")
    out = torch.full_like(x, float("nan"))
    fused_moe_nvfp4(x, PreparedMoEWeights.from_moe_weights(w), ids, tw, out=out)
    # Same bound as tests/test_decode_gpu.py: bf16 output of fp32-accumulated GEMMs.
    return _check_entry(
        "Triton decode kernels (interpreter) vs twin", dims, T, error_stats(out, twin), (1e-2, 5e-3)
    )


def write_outputs(result: dict, out_dir: Path, name: str) -> tuple[Path, Path | None]:
    """``<name>.json`` and ``<name>.png`` in ``out_dir`` (created); no PNG (``None``, said in
    ``notes``) where matplotlib is missing."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = None
    if importlib.util.find_spec("matplotlib") is None:
        result["notes"].append("matplotlib is not installed: no plot written (pip install it)")
    else:
        png = write_plot(result, out_dir / f"{name}.png")
        result["plot"] = png.name
    js = out_dir / f"{name}.json"
    js.write_text(json.dumps(result, indent=1, default=str))
    return js, png


def default_name(result: dict) -> str:
    gpu = result["env"]["gpu"] or "cpu"
    return f"bench_{result['preset']['name']}_{gpu.replace(' ', '_')}"
