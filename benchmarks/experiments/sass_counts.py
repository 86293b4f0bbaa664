"""SASS instruction counts of the launches one MoE call makes, compiled here (no GPU needed).

    python benchmarks/experiments/sass_counts.py [--cc 90 | --gpu KEY] [--out FILE] SHAPE:T[:path]
    ...

SHAPE is ``tp8`` / ``ep8`` (GLM-5 per-GPU shapes); path ``decode`` (default) or ``prefill``; the
config is the H200 table's (the heuristic's where the table has none), compiled for ``--cc``; with
``--gpu KEY`` (a ``hardware_table`` key, e.g. ``rtx-pro-6000-ws``) it is what that GPU serves: its
table or the heuristic for its arch and SM count, compiled for its arch (on sm_120 the prefill
path is W4A4, where the H200's ``wgmma`` configs do not compile). Each launch is compiled with
``triton.compile`` for ``sm_<cc>`` exactly as the call would launch it (tensors on the ``meta``
device, the JIT's 16-byte divisibility specialisation), disassembled with the ``nvdisasm`` that
ships with Triton, and reported: registers, spill bytes, shared memory, total instructions, the
instructions of the innermost loop that holds the MMAs (one K step of one tile) and its opcode
mix (``SASS_DUMP=DIR`` also writes each kernel's SASS there). Counts are static, per thread of a
warp; they say what a change does to the instruction stream (the decode kernels are issue-latency
bound, docs/performance.md), not its time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_fp4ext.bench.aot_compile import POINTER_TYPES, meta, meta_weights
from sglang_fp4ext.hardware import spec_by_key, spec_for_device_name
from sglang_fp4ext.model_shapes import preset
from sglang_fp4ext.moe.decode import plan as F
from sglang_fp4ext.moe.decode.config import DecodeConfig
from sglang_fp4ext.moe.prefill import plan as PF
from sglang_fp4ext.moe.prefill.config import PrefillConfig
from sglang_fp4ext.moe.shape import MoEShape, Target
from sglang_fp4ext.moe.tables import config_for, prefill_config_for, read_table_file, table_path

_H200 = Target("sm_90", "NVIDIA H200", 132)


def _record(L) -> tuple:
    """(kernel, grid, runtime args in order, constexprs, warps, stages, maxnreg) of a Launch."""
    params = L.parameters()
    o = L.options
    return (
        L.fn(),
        L.grid,
        tuple(v for _, _, v, c in params if not c),
        {n: v for _, n, v, c in params if c},
        o["num_warps"],
        o.get("num_stages", 3),
        o.get("maxnreg", 0),
    )


def decode_launches(T: int, shape: MoEShape, cfg, target: Target = _H200) -> list[tuple]:
    """The launches of one ``fused_moe_nvfp4`` call as ``decode.plan`` makes them (the family
    the config names, with its PDL as configured), on meta tensors."""
    w = meta_weights(shape)
    k = shape.top_k
    x = meta(torch.bfloat16, T, shape.H)
    family = "gluon" if cfg.kernels == "gluon" else "dot"
    plan = F.plan(
        x,
        w,
        meta(torch.int32, T, k),
        meta(torch.float32, T, k),
        x,
        cfg,
        family,
        cfg.pdl if family == "gluon" else 0,
    )
    return [_record(L) for L in plan]


def prefill_launches(T: int, shape: MoEShape, cfg) -> list[tuple]:
    w = meta_weights(shape)
    k = shape.top_k
    x = meta(torch.bfloat16, T, shape.H)
    plan = PF.plan(x, w, meta(torch.int32, T, k), meta(torch.float32, T, k), x, cfg, False)
    return [_record(L) for L in plan if "gemm" in L.kernel]


def _signature(fn, args, constexprs):
    sig, consts, attrs = {}, dict(constexprs), {}
    for i, (name, v) in enumerate(zip(fn.arg_names, args)):
        if isinstance(v, torch.Tensor):
            sig[name], div = POINTER_TYPES[v.dtype], True
        elif v == 1:  # the JIT specialises 1 to a constant
            sig[name], consts[name], div = "constexpr", 1, False
        else:
            sig[name], div = ("i32" if abs(v) < 2**31 else "i64"), v % 16 == 0
        if div:
            attrs[(i,)] = [["tt.divisibility", 16]]
    sig.update({n: "constexpr" for n in constexprs})
    for prm in fn.params:  # constexprs the launcher left at their defaults: AOT names each
        if prm.name not in sig and prm.is_constexpr:
            sig[prm.name], consts[prm.name] = "constexpr", prm.default
    return sig, consts, attrs


def _mma_loop(lines: list[str]) -> list[str]:
    """The smallest backward-branch loop body that contains an MMA instruction."""
    ins = [i for i, l in enumerate(lines) if re.match(r"\s+/\*[0-9a-f]+\*/", l)]
    labels = {l.split(":")[0]: i for i, l in enumerate(lines) if re.match(r"\.L_x_\d+:", l)}
    best = None
    for i, l in enumerate(lines):
        # Plain or predicated-uniform branches (sm_120's ptxas closes loops with BRA.U UPn).
        m = re.search(r"BRA(?:\.\w+)*\s+(?:!?U?P\w+\s*,\s*)?`\((\.L_x_\d+)\)", l)
        if m and labels.get(m.group(1), i) < i:
            body = [lines[j] for j in ins if labels[m.group(1)] < j <= i]
            if any(re.search(r"\b(HMMA|HGMMA|UTCHMMA|OMMA|QMMA)", b) for b in body):
                if best is None or len(body) < len(best):
                    best = body
    return best or []


def count(fn, grid, args, constexprs, warps, stages, maxnreg=0, *, cc: int) -> dict:
    opts = dict(num_warps=warps, num_stages=stages)
    if maxnreg:  # Triton's launch option (DecodeConfig.maxnreg1)
        opts["maxnreg"] = maxnreg
    sig, consts, attrs = _signature(fn, args, constexprs)
    gluon = fn.is_gluon()
    if gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        Source = ASTSource
    k = triton.compile(
        Source(fn, sig, consts, attrs),
        target=GPUTarget("cuda", cc, 32),
        options=opts,
    )
    bindir = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        Path(cubin).write_bytes(k.asm["cubin"])

        def tool(*cmd):
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

        sass = tool(bindir / "nvdisasm", "-c", cubin)
        res = tool(bindir / "cuobjdump", "-res-usage", cubin)
    if os.environ.get("SASS_DUMP"):  # a directory: each kernel's SASS, to read where it spills
        Path(os.environ["SASS_DUMP"], f"{fn.__name__}_sm{cc}.sass").write_text(sass)
    lines = sass.splitlines()
    loop = _mma_loop(lines)
    mix = collections.Counter()
    for l in loop:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", l)
        if m:
            mix[m.group(1)] += 1
    return dict(
        kernel=fn.__name__,
        grid=list(grid),
        warps=warps,
        stages=stages,
        maxnreg=maxnreg,
        # Layouts (Gluon) by name only: not JSON.
        constexprs={
            k: v if isinstance(v, (int, float, str)) else type(v).__name__
            for k, v in constexprs.items()
            if k != "COMPUTE_F32"
        },
        registers=int(re.search(r"REG:(\d+)", res).group(1)),
        spill_bytes=int(re.search(r"LOCAL:(\d+)", res).group(1)),
        # Register spills live in the stack frame (cuobjdump's LOCAL is other local memory).
        stack_bytes=int(re.search(r"STACK:(\d+)", res).group(1)),
        shared_bytes=k.metadata.shared,
        instructions=sum(1 for l in lines if re.match(r"\s+/\*[0-9a-f]+\*/", l)),
        mma_loop_instructions=len(loop),
        mma_loop_mix=dict(mix.most_common(12)),
    )


def _served_name(spec) -> str:
    """The driver's name of ``spec``'s GPU where a shipped table is named for it (the H100's
    table is ``NVIDIA H100 80GB HBM3``, its spec ``NVIDIA H100 SXM5 80GB``), else the spec's."""
    for path in sorted(table_path(spec.name).parent.glob("*.json")):  # the shipped tables
        dev = read_table_file(path)[0]
        if spec_for_device_name(dev) is spec:
            return dev
    return spec.name


def _changed(cfg, fields: str):
    """``cfg`` with ``--set``'s integer fields replaced."""
    kv = dict(f.split("=") for f in fields.split(",") if f)
    return dataclasses.replace(cfg, **{k: int(v) for k, v in kv.items()}) if kv else cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+", help="SHAPE:T[:decode|prefill], SHAPE tp8 or ep8")
    ap.add_argument(
        "--cc", type=int, help="compute capability to compile for (default 90, or --gpu's)"
    )
    ap.add_argument("--gpu", help="hardware_table key: compile what that GPU serves, for its arch")
    ap.add_argument("--out", help="write the JSON here (else stdout)")
    ap.add_argument(
        "--config", help="a decode or prefill config, e.g. GluonDecodeConfig(...), for every case"
    )
    ap.add_argument(
        "--set",
        default="",
        help="KEY=INT,...: change these fields of each case's "
        "served config (e.g. maxnreg1=168,kstack1=0)",
    )
    a = ap.parse_args(argv)
    target = _H200
    if a.gpu:
        spec = spec_by_key(a.gpu)
        major, minor = spec.capability
        target = Target(f"sm_{major}{minor}", _served_name(spec), spec.sms)
        a.cc = a.cc or major * 10 + minor
    a.cc = a.cc or 90
    rows = []
    for case in a.cases:
        name, T, *rest = case.split(":")
        path = rest[0] if rest else "decode"
        bs = preset({"tp8": "glm5-tp8", "ep8": "glm5-ep8"}[name])
        shape = MoEShape(bs.E_local, bs.hidden, bs.I_local, bs.top_k)
        families = (*DecodeConfig.families().values(), *PrefillConfig.families().values())
        names = {c.__name__: c for c in families}
        forced = eval(a.config, names) if a.config else None
        if path == "decode":
            cfg = _changed(forced or config_for(int(T), shape, target), a.set)
            launches = decode_launches(int(T), shape, cfg, target)
        else:
            cfg = _changed(forced or prefill_config_for(int(T), shape, target), a.set)
            launches = prefill_launches(int(T), shape, cfg)
        for L in launches:
            r = dict(case=case, config=repr(cfg), **count(*L, cc=a.cc))
            rows.append(r)
            print(
                f"{case:16} {r['kernel']:16} regs {r['registers']:3} spill {r['spill_bytes']} "
                f"stack {r['stack_bytes']} loop {r['mma_loop_instructions']:5} "
                f"total {r['instructions']}",
                file=sys.stderr,
            )
    doc = dict(
        what="static SASS counts (benchmarks/experiments/sass_counts.py)",
        triton=triton.__version__,
        torch=torch.__version__,
        cc=a.cc,
        gpu=target.device_name,
        num_sms=target.num_sms,
        rows=rows,
    )
    text = json.dumps(doc, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
