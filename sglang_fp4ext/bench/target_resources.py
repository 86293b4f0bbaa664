"""Static resources of the small-T decode on another GPU of the hardware table, compiled here.

For a model preset's per-rank shape and T in :data:`RESOURCE_TOKENS`, every launch one decode call
makes is compiled for the target's arch (``bench.aot_compile``, no GPU needed) for two families:

* ``served``: the config the target would serve (its shipped or tuned table, else the decode
  heuristic for its arch and SM count: ``moe.tables.select``);
* ``coop``: the one-launch cooperative family at :data:`COOP_CONFIG` (no table or heuristic
  serves it yet).

Per launch: grid, threads a CTA, registers a thread, spills, shared memory a CTA, and the CTAs an
SM holds under the target's per-SM limits (``target_info.sm_limits``), :func:`occupancy`. The
compiles run in a child process (``python -m sglang_fp4ext.bench.target_resources``, requests on
stdin, rows on stdout) because kernels decorated under the interpreter, which ``fp4ext bench``
uses without a GPU, cannot be compiled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence

from sglang_fp4ext import target_info
from sglang_fp4ext.gpu_spec import GPUSpec
from sglang_fp4ext.model_shapes import ModelShape
from sglang_fp4ext.moe.decode.config import CoopDecodeConfig, DecodeConfig
from sglang_fp4ext.moe.shape import MoEShape, Target

__all__ = ["COOP_CONFIG", "RESOURCE_TOKENS", "occupancy", "target_for", "target_resources"]

#: The decode token counts the projection covers (small-T decode, where MoE is latency bound).
RESOURCE_TOKENS = (1, 2, 4, 8, 16)
#: The one-launch config measured in ``benchmarks/results/decode_coop_h100/coop_ab.json`` and
#: timed phase by phase in ``benchmarks/experiments/coop_phases.py``.
COOP_CONFIG = CoopDecodeConfig(
    split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32, prefetch2=0
)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(limits: target_info.SMLimits, threads: int, regs: int, smem: int) -> dict:
    """CTAs an SM holds for a kernel of ``threads`` a CTA, ``regs`` registers a thread and
    ``smem`` bytes of shared memory a CTA (static + dynamic; the cubin's static figure already
    holds the 1 KB the driver reserves a block), as the CUDA occupancy calculator counts them:
    registers per warp rounded up to the allocation unit, whole warps in each of the register
    file's sub-partitions; shared memory rounded up to its unit; warps and blocks capped."""
    warps = -(-threads // 32)
    if threads > limits.max_threads_per_block or regs > limits.max_regs_per_thread:
        by_regs = 0
    elif regs == 0:
        by_regs = limits.max_blocks
    else:
        per_warp = _round_up(regs * 32, limits.reg_alloc_unit)
        part = limits.regs // limits.reg_sub_partitions
        by_regs = (part // per_warp) * limits.reg_sub_partitions // warps
    smem_cta = _round_up(max(smem, limits.smem_reserved_per_block), limits.smem_alloc_unit)
    fits = smem <= limits.smem_per_block_optin
    by_smem = limits.smem_per_sm // smem_cta if fits else 0
    by_threads = limits.max_warps // warps
    caps = {
        "registers": by_regs,
        "shared memory": by_smem,
        "warps": by_threads,
        "blocks": limits.max_blocks,
    }
    ctas = min(caps.values())
    return {
        "ctas_per_sm_by_registers": by_regs,
        "ctas_per_sm_by_smem": by_smem,
        "ctas_per_sm_by_warps": by_threads,
        "ctas_per_sm_max_blocks": limits.max_blocks,
        "ctas_per_sm": ctas,
        "limited_by": [k for k, v in caps.items() if v == ctas],
        "smem_fits_per_block": fits,
        "resident_warps_per_sm": ctas * warps,
        "occupancy": ctas * warps / limits.max_warps,
    }


def _served_name(spec: GPUSpec) -> str:
    """The driver's name of ``spec``'s GPU where a shipped table is named for it (the H100's
    table is ``NVIDIA H100 80GB HBM3``, its spec ``NVIDIA H100 SXM5 80GB``), else the spec's."""
    from sglang_fp4ext.hardware import spec_for_device_name
    from sglang_fp4ext.moe.tables import SHIPPED_CONFIG_DIR, read_table_file

    for path in sorted(SHIPPED_CONFIG_DIR.glob("*.json")):
        dev = read_table_file(path)[0]
        if spec_for_device_name(dev) is spec:
            return dev
    return spec.name


def target_for(spec: GPUSpec) -> Target:
    major, minor = spec.capability
    return Target(f"sm_{major}{minor}", _served_name(spec), spec.sms)


def _requests(shape: ModelShape, tokens: Sequence[int], spec: GPUSpec) -> list[dict]:
    from sglang_fp4ext.moe import tables as C

    ms = MoEShape(shape.E_local, shape.hidden, shape.I_local, shape.top_k_local, shape.ep)
    target = target_for(spec)
    out = []
    for T in tokens:
        entry = C.select(T, ms, target, quiet=True)
        source = C.table_source(T, ms, target)[0]
        if entry.path == "decode":
            out.append(dict(family="served", T=T, config=entry.config.to_dict(), source=source))
        out.append(
            dict(family="coop", T=T, config=COOP_CONFIG.to_dict(), source="fixed (COOP_CONFIG)")
        )
    return [
        dict(r, shape=[ms.E, ms.H, ms.I, ms.top_k, ms.ep], target=list(dataclasses.astuple(target)))
        for r in out
    ]


def _compile_rows(requests: list[dict]) -> list[dict]:
    """In this process (no interpreter): compile each request's launches, read resources."""
    from sglang_fp4ext.bench.aot_compile import compile_launch, decode_launches, resource_usage

    rows = []
    for req in requests:
        target = Target(*req["target"])
        cc = target.capability[0] * 10 + target.capability[1]
        limits = target_info.sm_limits(target.capability)
        cfg = DecodeConfig.from_dict(req["config"])
        for L in decode_launches(req["T"], MoEShape(*req["shape"]), cfg, target):
            grid = [int(g) for g in L.grid]
            ctas = math.prod(grid)
            threads = 32 * L.options["num_warps"]
            row = dict(
                family=req["family"], T=req["T"], config=repr(cfg),
                config_source=req["source"], kernel=L.kernel, grid=grid, ctas=ctas,
                threads_per_cta=threads, maxnreg=L.options.get("maxnreg", 0),
                cooperative=bool(L.options.get("launch_cooperative_grid")),
            )  # fmt: skip
            try:
                res = resource_usage(*compile_launch(L, cc))
            except Exception as exc:  # a launch that does not compile is a finding, not a crash
                rows.append(dict(row, error=f"{type(exc).__name__}: {str(exc)[-300:]}"))
                continue
            smem = res["static_shared_bytes"] + res["dynamic_shared_bytes"]
            occ = occupancy(limits, threads, res["registers"], smem)
            capacity = occ["ctas_per_sm"] * target.num_sms
            row.update(res, shared_bytes=smem, smem_limit_per_block=limits.smem_per_block_optin)
            row.update(occ, co_resident=ctas <= capacity, error=None)
            row["waves"] = ctas / capacity if capacity else None
            rows.append(row)
    return rows


def target_resources(shape: ModelShape, tokens: Sequence[int], spec: GPUSpec) -> dict:
    """The resources document of ``shape``'s decode at ``tokens`` on ``spec`` (compiled in two
    child processes, one per family, without ``TRITON_INTERPRET``)."""
    from pathlib import Path

    reqs = _requests(shape, tokens, spec)
    root = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    procs = []
    for fam in ("served", "coop"):
        part = [r for r in reqs if r["family"] == fam]
        p = subprocess.Popen(
            [sys.executable, "-m", "sglang_fp4ext.bench.target_resources"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env,
        )  # fmt: skip
        procs.append((p, json.dumps(part)))
    rows = []
    for p, text in procs:
        out, err = p.communicate(text, timeout=1800)
        if p.returncode:
            raise RuntimeError(f"compiling for {spec.key} failed:\n{err[-3000:]}")
        rows += json.loads(out.strip().splitlines()[-1])
    limits = target_info.sm_limits(spec.capability)
    return {
        "target": spec.name,
        "target_key": spec.key,
        "arch": target_for(spec).arch,
        "sms": spec.sms,
        "shape": reqs[0]["shape"] if reqs else None,
        "tokens": list(tokens),
        "limits": dataclasses.asdict(limits),
        "limits_source": target_info.SM_LIMITS_SOURCE,
        "note": "static: compiled here for the target's arch with this Triton; nothing ran there",
        "rows": rows,
    }


if __name__ == "__main__":
    print(json.dumps(_compile_rows(json.loads(sys.stdin.read()))))
