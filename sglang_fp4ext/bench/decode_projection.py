"""The small-T decode projected onto another GPU from a measured efficiency, and b12x's
published RTX PRO 6000 figures at equal bytes. Every time here is a PROJECTION, never a
measurement.

**Measured input** (:func:`load_measured`, :func:`measured_from_result`): per (shape, T, family)
the time and the fraction of the copy bandwidth measured in the same run that the bytes floor
moved at. Two sources: a decode A/B file (``benchmarks/results/decode_coop_h100/coop_ab.json``:
``gpu``, ``copy_bw_TBps``, rows of ``shape``, ``T``, ``floor_us``, ``v1`` = the shipped
two-launch decode, ``configs`` of which those with ``prefetch2`` are the one-launch family) or an
``fp4ext bench`` GPU result (its served rows).

**Projection** (:func:`project_decode`): ``t = bytes / (target streaming bandwidth x
fraction)``, the bytes being the measured run's floor (distinct experts counted from its routing,
bf16 activations in and out) and the target's streaming bandwidth its spec scaled by the measured
GPU's copy / spec ratio (``projection.projection`` with a source spec).

**b12x at equal bytes** (:func:`b12x_comparison`): each published point's bytes (NVFP4 codes +
e4m3 scales of the experts one token routes to, + bf16 activations), its fraction of the spec
bandwidth, and fp4ext's time for those bytes at the measured fraction of the point whose bytes
are nearest.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from sglang_fp4ext import projection, roofline
from sglang_fp4ext.gpu_spec import GPUSpec

__all__ = [
    "B12X_POINTS",
    "FAMILIES",
    "B12xPoint",
    "MeasuredFileError",
    "b12x_comparison",
    "load_measured",
    "measured_from_result",
    "project_decode",
]

FAMILIES = {
    "served": "shipped two-launch decode (the measured GPU's table config)",
    "coop": "one-launch cooperative decode (COOP_CONFIG)",
}
_NOT_MODELLED = "clocks, SM count and L2 size not modelled"


class MeasuredFileError(ValueError):
    """A measured-efficiency file that cannot be read; the message names the file and field."""


def _norm(name: str) -> str:
    return name.replace("_", "-").lower()


# ---- measured input ---------------------------------------------------------------------------


def _need(d: dict, key: str, where: str):
    if not isinstance(d, dict) or key not in d:
        raise MeasuredFileError(f"{where}: missing {key!r}")
    return d[key]


def _number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise MeasuredFileError(f"{where}: expected a positive number, got {v!r}")
    return float(v)


def _point(shape, T, family, cfg, us, fraction, copy_bw, where) -> dict:
    us, fraction = _number(us, f"{where}.us"), _number(fraction, f"{where}.fraction")
    return {
        "shape": _norm(shape),
        "T": int(T),
        "family": family,
        "config": cfg,
        "us": us,
        "fraction": fraction,
        "bytes": fraction * copy_bw * us * 1e-6,  # the floor bytes the fraction was taken of
    }


def load_measured(path) -> dict:
    """``{"source", "gpu", "copy_bw_Bps", "points": [...]}`` from a decode A/B file or an
    ``fp4ext bench`` GPU result; :class:`MeasuredFileError` naming what is wrong."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise MeasuredFileError(f"{path}: no such file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise MeasuredFileError(f"{path}: not a JSON document ({exc})") from None
    if isinstance(doc, dict) and doc.get("schema", "").startswith("fp4ext-bench/"):
        if doc.get("mode") != "gpu":
            raise MeasuredFileError(f"{path}: an fp4ext bench result without GPU times")
        return measured_from_result(doc, source=str(path))
    where = str(path)
    gpu = _need(doc, "gpu", where)
    copy_bw = _number(_need(doc, "copy_bw_TBps", where), f"{where}: copy_bw_TBps") * 1e12
    rows = _need(doc, "rows", where)
    if not isinstance(rows, list) or not rows:
        raise MeasuredFileError(f"{where}: 'rows' must be a non-empty list")
    points = []
    for i, r in enumerate(rows):
        at = f"{where}: rows[{i}]"
        shape, T = _need(r, "shape", at), _need(r, "T", at)
        v1 = _need(r, "v1", at)
        points.append(
            _point(shape, T, "served", _need(v1, "config", f"{at}.v1"), _need(v1, "us", f"{at}.v1"),
                   _need(v1, "pct_bw", f"{at}.v1"), copy_bw, f"{at}.v1")
        )  # fmt: skip
        for j, c in enumerate(r.get("configs") or []):
            cfg = _need(c, "config", f"{at}.configs[{j}]")
            if "prefetch2" in cfg:
                points.append(
                    _point(shape, T, "coop", cfg, _need(c, "us", f"{at}.configs[{j}]"),
                           _need(c, "pct_bw", f"{at}.configs[{j}]"), copy_bw,
                           f"{at}.configs[{j}]")
                )  # fmt: skip
    return {"source": where, "gpu": str(gpu), "copy_bw_Bps": copy_bw, "points": points}


def measured_from_result(result: dict, source: str = "this run") -> dict:
    """The served rows of an ``fp4ext bench`` GPU result as measured input."""
    bw = (result.get("rates") or {}).get("copy_bandwidth_Bps")
    if not bw:
        raise MeasuredFileError(f"{source}: no measured copy bandwidth")
    points = [
        _point(result["preset"]["name"], r["T"], "served", r["config"], r["us"],
               r["fraction_of_copy_bw"], bw, f"{source}: T={r['T']}")
        for r in result["rows"] if r.get("path") == "decode" and r.get("fraction_of_copy_bw")
    ]  # fmt: skip
    return {"source": source, "gpu": result["env"]["gpu"], "copy_bw_Bps": bw, "points": points}


def _same_config(measured_cfg: dict, coop) -> bool:
    """A coop point measured at config ``coop`` (a ``CoopDecodeConfig``)."""
    from sglang_fp4ext.moe.decode.config import CoopDecodeConfig

    try:
        return CoopDecodeConfig.from_dict(dict(measured_cfg, kernels="coop")) == coop
    except (TypeError, ValueError):
        return False


# ---- projection -------------------------------------------------------------------------------


def _project_bytes(nbytes: float, fraction: float, measured: dict, target: GPUSpec):
    """``nbytes`` moved at ``fraction`` of the measured copy bandwidth, projected onto ``target``
    by ``projection.projection`` (the target's spec scaled by the measured GPU's copy / spec
    ratio where the hardware table knows that GPU), with what is not modelled among its
    assumptions."""
    from sglang_fp4ext.hardware import spec_for_device_name

    bw = measured["copy_bw_Bps"]
    proj = projection.projection(
        nbytes / (fraction * bw) * 1e6, nbytes, bw, target,
        source_spec=spec_for_device_name(measured["gpu"]), measured_on=measured["gpu"],
    )  # fmt: skip
    return dataclasses.replace(proj, assumptions=(*proj.assumptions, _NOT_MODELLED))


def _points(measured: dict | None, family: str, coop) -> list[dict]:
    """The measured points of ``family`` (the one-launch family's at config ``coop`` only)."""
    return [
        p for p in (measured or {}).get("points", [])
        if p["family"] == family and (family != "coop" or _same_config(p["config"], coop))
    ]  # fmt: skip


def project_decode(measured: dict, shape_name: str, tokens, target: GPUSpec, coop) -> dict:
    """Projected decode time on ``target`` per family and T of ``tokens`` for the preset
    ``shape_name`` (the one-launch family at config ``coop``)."""
    rows, missing, assumptions = [], [], []
    for fam in FAMILIES:
        for T in tokens:
            pts = [p for p in _points(measured, fam, coop)
                   if p["shape"] == _norm(shape_name) and p["T"] == T]  # fmt: skip
            if not pts:
                missing.append(f"{fam} T={T}")
                continue
            p = pts[0]
            proj = _project_bytes(p["bytes"], p["fraction"], measured, target)
            assumptions = list(proj.assumptions)
            rows.append({
                "family": fam, "T": T, "config": p["config"], "measured_us": p["us"],
                "measured_fraction_of_copy_bw": p["fraction"], "bytes": p["bytes"],
                "projected_us": proj.projected_us, "target_floor_us": proj.target_floor_us,
                "label": proj.label(),
            })  # fmt: skip
    return {
        "basis": "PROJECTION (not measured)",
        "target": target.name,
        "target_key": target.key,
        "target_bw_Bps": target.mem_bandwidth_Bps,
        "measured_on": measured["gpu"],
        "measured_source": measured["source"],
        "measured_copy_bw_Bps": measured["copy_bw_Bps"],
        "formula": "projected_us = bytes / (target streaming bandwidth x fraction of the copy "
        "bandwidth measured); bytes = the measured run's floor",
        "assumptions": assumptions,
        "families": FAMILIES,
        "rows": rows,
        "missing": missing,
    }


# ---- b12x's published figures -----------------------------------------------------------------


@dataclass(frozen=True)
class B12xPoint:
    """One published b12x time: ``tokens`` tokens, top-``top_k`` of ``E`` experts of hidden
    ``H`` and per-rank intermediate ``I`` (NVFP4 weights), on ``gpu``."""

    name: str
    E: int
    H: int
    I: int
    top_k: int
    tokens: int
    us: float
    gpu: str
    source: str

    def nbytes(self) -> float:
        distinct = roofline.expected_distinct_experts(self.tokens, self.E, self.top_k)
        return roofline.bytes_floor(distinct, self.H, self.I, tokens=self.tokens)


_DSV4 = (
    "b12x's commits (https://github.com/lukealonso/b12x), as cited in the issue; not confirmed "
    "in a primary source here"
)
#: The published points; DeepSeek-V4-Flash's ``N = 1024`` is read both ways (gate and up
#: counted together or not), since the source does not say.
B12X_POINTS = (
    B12xPoint("DeepSeek-V4-Flash TP2, N=1024 per projection (I=1024)", 256, 4096, 1024, 6, 1,
              22.5, "RTX PRO 6000", _DSV4),
    B12xPoint("DeepSeek-V4-Flash TP2, N=1024 = gate+up (I=512)", 256, 4096, 512, 6, 1, 22.5,
              "RTX PRO 6000", _DSV4),
    B12xPoint("Qwen3.6-35B-A3B, NVFP4 W4A4", 256, 2048, 512, 8, 1, 27.7,
              "RTX PRO 6000 Blackwell Server Edition",
              "https://github.com/flashinfer-ai/flashinfer/pull/5099 (PR description's cuTile vs "
              "b12x table, SM120); 27.7 us / 14.2 MB / 7.9 us floor as quoted in "
              "kernel-techniques.md"),
)  # fmt: skip


def b12x_comparison(measured: dict | None, target: GPUSpec, coop) -> list[dict]:
    """Each :data:`B12X_POINTS` entry: bytes, time, fraction of ``target``'s spec bandwidth, and
    per family fp4ext's projected time for the same bytes at the measured fraction of the point
    whose bytes are nearest (``None`` without measured input)."""
    out = []
    for b in B12X_POINTS:
        nbytes = b.nbytes()
        frac = nbytes / (b.us * 1e-6) / target.mem_bandwidth_Bps
        row = {
            "name": b.name,
            "E": b.E, "H": b.H, "I": b.I, "top_k": b.top_k, "tokens": b.tokens,
            "bytes": nbytes,
            "b12x_us": b.us,
            "b12x_fraction_of_spec_bw": frac,
            "b12x_gpu": b.gpu,
            "source": b.source,
            "note": "faster than the bytes allow at the spec bandwidth: this reading of the "
            "shape cannot be right, or L2 served part of it" if frac > 1 else None,
            "fp4ext": {},
        }  # fmt: skip
        for fam in FAMILIES:
            pts = _points(measured, fam, coop)
            if not pts:
                continue
            near = min(pts, key=lambda p: abs(p["bytes"] - nbytes))
            proj = _project_bytes(nbytes, near["fraction"], measured, target)
            row["fp4ext"][fam] = {
                "projected_us": proj.projected_us,
                "efficiency_from": f"{near['shape']} T={near['T']} ({near['bytes'] / 1e6:.1f} MB, "
                f"{near['fraction']:.1%} of copy bw on {measured['gpu']})",
                "label": proj.label(),
            }
        out.append(row)
    return out
