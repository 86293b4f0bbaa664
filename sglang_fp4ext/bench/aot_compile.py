"""Compile the launches of one decode call for any architecture, without a GPU.

A call's launches come from ``decode.plan`` on tensors of the ``meta`` device (shapes and strides,
no memory), exactly as the launcher would make them; each is compiled with ``triton.compile`` for
``sm_<cc>`` with the JIT's runtime specialisation (the integer 1 becomes a constant, pointers and
multiples of 16 get 16-byte divisibility), Gluon kernels through ``GluonASTSource``. The cubin's
resources are read with the ``cuobjdump`` Triton ships; spills and warnings come from the report
of the ptxas run that built the cubin (Triton runs it with ``-v`` and its own flags, and prints the
log with its ``dump_ptxas_log`` knob), not from a second ptxas run.

Kernels decorated under the interpreter (``TRITON_INTERPRET=1``) cannot be compiled: run this in
a process without it (``bench.target_resources`` starts one). Used by ``bench.target_resources``,
``benchmarks/experiments/sass_counts.py`` and the one-launch family's AOT test.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN, KernelMatrix
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.shape import MoEShape, Target

__all__ = [
    "POINTER_TYPES",
    "compile_launch",
    "compile_source",
    "decode_launches",
    "meta",
    "meta_matrix",
    "meta_weights",
    "resource_usage",
    "signature",
]

#: Triton's signature type of each tensor dtype a launch passes.
POINTER_TYPES = {
    torch.bfloat16: "*bf16",
    torch.float32: "*fp32",
    torch.int32: "*i32",
    torch.int64: "*i64",
    torch.uint8: "*u8",
}


def meta(dt, *shape) -> torch.Tensor:
    return torch.empty(*shape, dtype=dt, device="meta")


def meta_matrix(E: int, N: int, K: int) -> KernelMatrix:
    """One weight matrix in the kernel layout (``moe.layout``), on the meta device."""
    Np, Kp = -(-N // ROW_ALIGN) * ROW_ALIGN, -(-K // K_CHUNK) * K_CHUNK
    return KernelMatrix(
        meta(torch.uint8, E, Np, Kp // 2),
        meta(torch.uint8, E, Kp // K_CHUNK, Np, 16),
        meta(torch.float32, E, Np),
        N,
        K,
    )


def meta_weights(shape: MoEShape) -> PreparedMoEWeights:
    # Static input scales ((1,), the max over the experts): the W4A4 prefill needs them.
    return PreparedMoEWeights(
        meta_matrix(shape.E, 2 * shape.I, shape.H),
        meta_matrix(shape.E, shape.H, shape.I),
        w13_input_scale=meta(torch.float32, 1),
        w2_input_scale=meta(torch.float32, 1),
    )


def decode_launches(T: int, shape: MoEShape, cfg, target: Target) -> list:
    """The :class:`~sglang_fp4ext.moe.launch.Launch` records of one ``fused_moe_nvfp4`` call
    with ``cfg`` on ``target``: its family, PDL where ``target`` has it, a one-launch grid sized
    for ``target``'s SMs."""
    from sglang_fp4ext.moe.decode import plan as F

    x = meta(torch.bfloat16, T, shape.H)
    ids, tw = meta(torch.int32, T, shape.top_k), meta(torch.float32, T, shape.top_k)
    family = cfg.kernels
    pdl = 0
    if family == "gluon" and target_info.supports_pdl(target.capability):
        pdl = cfg.pdl
    return F.plan(x, meta_weights(shape), ids, tw, x, cfg, family, pdl, target=target)


def signature(launch) -> tuple[dict, dict, dict]:
    """``(signature, constants, attributes)`` of ``launch`` as the JIT specialises it."""
    sig, consts, attrs = {}, {}, {}
    for i, name, v, const in launch.parameters():
        if const or (not isinstance(v, torch.Tensor) and v == 1):
            sig[name], consts[name] = "constexpr", v
            continue
        if isinstance(v, torch.Tensor):
            sig[name], div = POINTER_TYPES[v.dtype], True
        else:
            sig[name], div = ("i32" if abs(v) < 2**31 else "i64"), v % 16 == 0
        if div:
            attrs[(i,)] = [["tt.divisibility", 16]]
    for p in launch.fn().params:  # what the launch leaves at its default (e.g. a probe: off)
        if p.name not in sig:
            sig[p.name], consts[p.name] = "constexpr", p.default
    return sig, consts, attrs


def compile_source(source, cc: int, options: dict):
    """``(kernel, ptxas_report)``: ``triton.compile`` of ``source`` for ``sm_<cc>``, never from
    Triton's cache (a cached kernel has no report), and what ptxas said building it: registers,
    spills, ``wgmma`` serialisation."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    if target_info.is_interpreter():
        raise RuntimeError("AOT compiles need a process without TRITON_INTERPRET")
    report = io.StringIO()  # Triton prints ptxas's -v log when asked (dump_ptxas_log)
    with knobs.compilation.scope(), knobs.nvidia.scope(), contextlib.redirect_stdout(report):
        knobs.compilation.always_compile = True
        knobs.nvidia.dump_ptxas_log = True
        kernel = triton.compile(source, target=GPUTarget("cuda", cc, 32), options=options)
    return kernel, report.getvalue()


def compile_launch(launch, cc: int):
    """``(kernel, ptxas_report)`` of ``launch`` compiled for ``sm_<cc>`` with its options."""
    from triton.compiler import ASTSource

    fn = launch.fn()
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        Source = ASTSource
    return compile_source(Source(fn, *signature(launch)), cc, dict(launch.options))


def _tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def resource_usage(kernel, ptxas_report: str) -> dict:
    """Registers a thread, static and dynamic shared memory a CTA, stack and spill bytes a
    thread, of a kernel from :func:`compile_source` (cubin via ``cuobjdump -res-usage``; spills
    from its ptxas report)."""
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        Path(cubin).write_bytes(kernel.asm["cubin"])
        res = subprocess.run(
            [_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True, check=True
        ).stdout

    def field(key: str) -> int:
        m = re.search(rf"{key}:(\d+)", res)
        return int(m.group(1)) if m else 0

    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ptxas_report)
    return {
        "registers": field("REG"),
        "static_shared_bytes": field("SHARED"),
        "dynamic_shared_bytes": int(kernel.metadata.shared),
        "stack_bytes": field("STACK"),
        "spill_store_bytes": int(spill.group(1)) if spill else None,
        "spill_load_bytes": int(spill.group(2)) if spill else None,
    }
