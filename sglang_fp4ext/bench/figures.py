"""Figures derived from a measured time: a row's bytes floor, achieved TB/s and fractions of the
measured roofs (:func:`row_numbers`), and the projection of measured rows to another GPU
(:func:`project_rows`, always labelled a PROJECTION). Definitions: ``report.py``'s docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

from sglang_fp4ext import hardware, projection, roofline
from sglang_fp4ext.gpu_spec import GPUSpec
from sglang_fp4ext.model_shapes import ModelShape

__all__ = ["project_rows", "row_numbers"]


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


def project_rows(
    rows: Sequence[dict],
    shape: ModelShape,
    measured_bw_Bps: float,
    target: GPUSpec,
    source: GPUSpec | None,
    matmul_tflops: float | None = None,
) -> dict:
    """Per-token MoE time on ``target`` from times measured here (``projection.projection``).

    Per row: the layer time is projected; a decode step runs ``shape.n_moe_layers`` such layers,
    so ``projected_step_us = layer x n_moe_layers`` and ``projected_us_per_token = step / T``.
    Prefill rows (``path == "prefill"``, with ``matmul_tflops`` measured here) are compute-bound
    too: ``projection.compute_projection`` onto the target's dense bf16 peak (W4A16) and, where it
    has one, its dense FP4 peak (W4A4, what fp4ext runs there), each no faster than the target's
    bytes floor; the layer time is the one of the format fp4ext runs on the target.
    """
    out = []
    assumptions: tuple[str, ...] = ()
    for r in rows:
        p = projection.projection(
            r["us"], r["bytes_floor"], measured_bw_Bps, target, source_spec=source
        )
        assumptions = p.assumptions
        layer, label, extra = p.projected_us, p.label(), {}
        if r.get("path") == "prefill" and matmul_tflops and r.get("flops"):
            for fmt, prec in (("w4a16", "bf16"), ("w4a4", "fp4")):
                if hardware.dense_peak(target, prec) is None:
                    extra[f"prefill_{fmt}_us"] = None
                    continue
                c = projection.compute_projection(
                    r["flops"], r["us"], matmul_tflops, target, prec, source_spec=source
                )
                extra[f"prefill_{fmt}_us"] = max(c.projected_us, p.target_floor_us)
                extra[f"prefill_{fmt}_label"] = c.label()
            fmt = "w4a4" if extra.get("prefill_w4a4_us") else "w4a16"
            if extra.get(f"prefill_{fmt}_us"):
                layer, label = extra[f"prefill_{fmt}_us"], extra[f"prefill_{fmt}_label"]
                extra["prefill_format"] = fmt
        step = layer * shape.n_moe_layers
        out.append(
            {
                "T": r["T"],
                "measured_us": r["us"],
                "projected_layer_us": layer,
                "projected_step_us": step,
                "projected_us_per_token": step / r["T"],
                "target_floor_us": p.target_floor_us,
                "label": label,
                **extra,
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
