"""``fp4ext bench`` without a GPU: nothing is timed. At a tiny stand-in of the preset's layout the
fp32 torch twin is checked against an independent float64 oracle (own E2M1 decode, own loops:
:func:`moe_f64`), and the Triton decode kernels under the interpreter against the twin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from sglang_fp4ext import hardware
from sglang_fp4ext.bench.layer import make_routing
from sglang_fp4ext.bench.report import base_result, spec_rates
from sglang_fp4ext.gpu_spec import GPUSpec
from sglang_fp4ext.model_shapes import ModelShape
from sglang_fp4ext.progress import Progress

__all__ = ["moe_f64", "run_cpu_check"]


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
    project: GPUSpec | None = None,
    progress: Progress | None = None,
) -> dict:
    """No GPU: check the reference path at a tiny shape with ``shape``'s routing structure
    (EP -1 slots, fused shared column). Nothing is timed."""
    from sglang_fp4ext.compare import error_stats
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
    from sglang_fp4ext.moe.weights import random_moe_weights

    # Tiny stand-in of the layout: 16 routed experts (ep divides 16 for every preset), top-4.
    tiny = dataclasses.replace(
        shape, n_experts=16, top_k=min(4, shape.top_k), hidden=256, moe_intermediate=128 * shape.tp
    )
    small_T = [T for T in tokens if T <= 8][:2] or [1, 3]
    result = base_result("cpu-check", shape, tokens, None, None, seed)
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
    result["rates"] = spec_rates(
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
            "note": "the per-token step needs times measured on a GPU; none were measured here, "
            "so none projected (the small-T decode below projects from --measured when given)",
        }
    return result


def _interpreter_check(w, x, ids, tw, twin, dims, T) -> dict:
    from sglang_fp4ext import target_info
    from sglang_fp4ext.compare import error_stats
    from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
    from sglang_fp4ext.moe.prepared import PreparedMoEWeights

    if not target_info.is_interpreter():
        raise RuntimeError("the kernel check needs TRITON_INTERPRET=1 set before kernels import")
    out = torch.full_like(x, float("nan"))
    fused_moe_nvfp4(x, PreparedMoEWeights.from_moe_weights(w), ids, tw, out=out)
    # Same bound as tests/test_decode_gpu.py: bf16 output of fp32-accumulated GEMMs.
    return _check_entry(
        "Triton decode kernels (interpreter) vs twin", dims, T, error_stats(out, twin), (1e-2, 5e-3)
    )
