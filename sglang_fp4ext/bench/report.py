"""The ``fp4ext bench`` result document: its JSON schema, environment, and how it is written.

``fp4ext bench`` measures one MoE layer across token counts and reports it against roofs. On a
CUDA GPU (``gpu_run.run_gpu``), for a model preset and layout (``model_shapes.PRESETS``, default
``glm5-tp8``): random NVFP4 experts in ``copies`` layer copies with inputs rotated so that one
pass touches several times the L2 (``Layer``), uniform routing, each T checked against the fp32
torch twin (output poisoned with NaN first), then timed as CUDA-graph replay
(``timing.time_graph_replay``) for fp4ext on the path the dispatcher serves and for the torch
bf16 grouped-GEMM peer. Copy bandwidth and a bf16 matmul rate are measured once
per run: every fraction is against one of them (or a dense peak from ``hardware``), and says so.
Without a GPU (``cpu_check.run_cpu_check``) nothing is timed: the torch twin is checked against an
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
               PROJECTION, never a measurement (no GPU: rows [] and a note); with --project
               also target_decode {resources, decode, b12x, notes} (bench/bench_cli.py
               _target_section: static resources compiled for the target, the projected
               small-T decode and b12x's figures; bench/decode_projection.py)
    plot       file name of the PNG next to the JSON (null without matplotlib)
    notes      plain-language remarks (e.g. "no GPU: nothing was timed")

``bytes_floor`` = the distinct local experts' NVFP4 weights (counted from the routing used) plus
the bf16 activations read and written once (``roofline.bytes_floor(..., tokens=T)``);
``achieved_TBps`` = bytes floor / measured time (the bytes a fused kernel must move, not what it
moved); ``tflops`` = ``roofline.moe_flops`` / time.

The measurements themselves (graph capture/replay, copy bandwidth, bf16 matmul rate) live in
``timing.py``; the measured layer in ``layer.py``; the derived figures and the projection in
``figures.py``; the printed table in ``table.py``; the PNG in ``plot.py``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata
import importlib.util
import json
import platform
from pathlib import Path

import torch

from sglang_fp4ext import __version__, hardware
from sglang_fp4ext.bench.plot import write_plot
from sglang_fp4ext.gpu_spec import GPUSpec
from sglang_fp4ext.model_shapes import ModelShape

__all__ = [
    "DEFAULT_TOKENS",
    "DISPATCH_RULE",
    "SCHEMA",
    "SUITE_TOKENS",
    "base_result",
    "default_name",
    "dispatch_path",
    "environment",
    "resolve_spec",
    "spec_rates",
    "write_outputs",
]

SCHEMA = "fp4ext-bench/1"
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SUITE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

#: What ``sglang_backend.Fp4ExtRunnerCore`` serves: ``moe.experts.run_experts`` ->
#: ``moe.dispatch.fused_moe``, which picks the decode or prefill kernels per token bucket from the
#: config table (``moe/tables.py``: user dir, then the shipped ``configs/<GPU>.json``), else the
#: heuristic switch (prefill from ``PREFILL_MIN_TOKENS``, ``WGMMA_PREFILL_MIN_TOKENS`` on the wgmma
#: family, ``WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS`` there with a fused shared expert).
#: :func:`dispatch_path` asks the same code.
DISPATCH_RULE = (
    "runner core -> moe.dispatch.fused_moe: the table's path per token bucket, else decode below "
    "PREFILL_MIN_TOKENS (WGMMA_PREFILL_MIN_TOKENS where the wgmma prefill family runs, "
    "WGMMA_FUSED_SHARED_PREFILL_MIN_TOKENS there with a fused shared expert) and "
    "prefill from it"
)


def dispatch_path(tokens: int, shape=None, target=None) -> str:
    """The fp4ext path SGLang's runner core serves ``tokens`` rows with (see DISPATCH_RULE):
    ``moe.tables.select`` for a ``MoEShape`` and target (this GPU by default); without a shape,
    the heuristic switch alone."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    from sglang_fp4ext.moe import tables as C

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
    """GPU, versions (SGLang's version from its metadata: never imported here) and the date."""
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
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
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


def resolve_spec(name: str) -> GPUSpec:
    """A hardware-table entry by key (``rtx-pro-6000-ws``) or device name; clear error if none."""
    try:
        return hardware.spec_by_key(name)
    except KeyError:
        spec = hardware.spec_for_device_name(name)
        if spec is None:
            keys = sorted(s.key for s in hardware.all_specs())
            raise ValueError(f"no GPU {name!r} in the hardware table; known keys: {keys}") from None
        return spec


# ---- the document ------------------------------------------------------------------------------


def base_result(mode: str, shape: ModelShape, tokens, copies, replays, seed: int) -> dict:
    """A result document of ``mode`` with the environment, preset, settings and dispatch filled
    in and everything measured still empty."""
    env = environment()
    return {
        "schema": SCHEMA,
        "mode": mode,
        "date": env["date"],
        "env": env,
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


def spec_rates(spec: GPUSpec | None, rates: dict) -> dict:
    """``rates`` plus the hardware table's figures for ``spec`` (``None``s for a GPU not in it)."""
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
