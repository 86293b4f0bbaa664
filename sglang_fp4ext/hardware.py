"""Hardware table: look up and format the GPUs this project names, every figure sourced and
tagged. The rows are in ``hardware_table.py``; the types (``GPUSpec``, ``Peaks``, ``Source``,
the precisions and source kinds) in ``gpu_spec.py``.

Why this exists: a peak that is guessed makes every efficiency number wrong. NVIDIA's
headline tensor figures are **2:4-sparse**; the dense figure is half. Efficiency in this project
is only ever computed against a **dense** peak or against bandwidth measured in the same run
(see ``roofline.py``); sparse peaks are listed so that a quoted marketing number can be
recognised, never used as a denominator.
"""

from __future__ import annotations

import re
from dataclasses import fields

from sglang_fp4ext.gpu_spec import (
    DERIVED,
    MEASURED,
    NA,
    PRECISIONS,
    THIRD_PARTY,
    VENDOR,
    GPUSpec,
)
from sglang_fp4ext.hardware_table import SPECS as _SPECS

__all__ = [
    "all_specs",
    "dense_peak",
    "derived_dense_peak",
    "format_row",
    "format_table",
    "normalize_device_name",
    "sparse_peak",
    "spec_by_key",
    "spec_for_device_name",
    "spec_summary",
]

_LEGEND = (
    "tags: NV vendor, 3P third-party, DER derived, MEAS measured; n/a no such mode; ? unsourced"
)
_SHORT = {VENDOR: "NV", THIRD_PARTY: "3P", DERIVED: "DER", MEASURED: "MEAS"}

_BY_KEY = {s.key: s for s in _SPECS}
_BY_NAME = {n: s for s in _SPECS for n in s.match_names}
assert len(_BY_KEY) == len(_SPECS) and len(_BY_NAME) == sum(len(s.match_names) for s in _SPECS)


# ---- lookup -----------------------------------------------------------------------------------


def all_specs() -> tuple[GPUSpec, ...]:
    return _SPECS


def spec_by_key(key: str) -> GPUSpec:
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"no GPU spec {key!r}; known: {sorted(_BY_KEY)}") from None


def normalize_device_name(name: str) -> str:
    """Lower-case, collapse whitespace, drop a leading 'NVIDIA '."""
    n = re.sub(r"\s+", " ", name.strip().lower())
    return n.removeprefix("nvidia ")


def spec_for_device_name(name: str) -> GPUSpec | None:
    """The spec for a ``torch.cuda.get_device_name()`` string, or None for a GPU not in the
    table (never a near match: a variant with other clocks or memory must not borrow figures)."""
    return _BY_NAME.get(normalize_device_name(name))


def dense_peak(spec: GPUSpec, precision: str) -> float | None:
    """Dense tensor peak in TFLOPS: the only peak an efficiency may be computed against."""
    return spec.dense_tflops.get(precision)


def sparse_peak(spec: GPUSpec, precision: str) -> float | None:
    """2:4-sparse tensor peak in TFLOPS (NVIDIA's headline figure). Not an efficiency basis."""
    return spec.sparse_tflops.get(precision)


def derived_dense_peak(spec: GPUSpec, precision: str) -> float | None:
    """``sms x boost_clock x FLOP/clk/SM`` in TFLOPS, or None where an input is unknown."""
    rate = spec.flop_per_clk_per_sm.get(precision)
    if rate is None or spec.boost_clock_mhz is None:
        return None
    return spec.sms * spec.boost_clock_mhz * 1e6 * rate / 1e12


# ---- formatting -------------------------------------------------------------------------------


def _peak_cell(spec: GPUSpec, kind: str, precision: str) -> str:
    v = getattr(spec, f"{kind}_tflops").get(precision)
    src = spec.source(f"{kind}.{precision}")
    if v is None:
        return f"{precision.upper()} " + ("n/a" if src is not None and src.kind == NA else "?")
    tag = _SHORT.get(src.kind, "?") if src is not None else "?"
    return f"{precision.upper()} {v:g} [{tag}]"


def _peaks_line(spec: GPUSpec, kind: str) -> str:
    return " · ".join(_peak_cell(spec, kind, p) for p in PRECISIONS)


def format_row(spec: GPUSpec) -> str:
    """One line for a table: dense and 2:4-sparse peaks kept apart and labelled."""
    clock = "?" if spec.boost_clock_mhz is None else f"{spec.boost_clock_mhz:g}"
    l2 = "?" if spec.l2_mb is None else f"{spec.l2_mb:g}"
    arch = f"sm_{spec.capability[0]}{spec.capability[1]}"
    return (
        f"{spec.key:<20} {arch:<6} {spec.sms:>4} SM "
        f"{clock:>5} MHz {spec.mem_bandwidth_gbs:>6g} GB/s L2 {l2:>4} MB | "
        f"dense TFLOPS: {_peaks_line(spec, 'dense')} | "
        f"2:4-sparse TFLOPS (not an efficiency basis): {_peaks_line(spec, 'sparse')}"
    )


def format_table(specs: tuple[GPUSpec, ...] | None = None) -> str:
    rows = [format_row(s) for s in (all_specs() if specs is None else specs)]
    return "\n".join([*rows, _LEGEND])


def spec_summary(spec: GPUSpec) -> str:
    """A few lines for ``fp4ext info``."""
    clock = (
        "boost clock unsourced" if spec.boost_clock_mhz is None else f"{spec.boost_clock_mhz:g} MHz"
    )
    l2 = "L2 unsourced" if spec.l2_mb is None else f"L2 {spec.l2_mb:g} MB"
    smem = "?" if spec.smem_per_block_optin is None else f"{spec.smem_per_block_optin:,} B"
    return "\n".join(
        [
            (
                f"{spec.name} (sm_{spec.capability[0]}{spec.capability[1]}): {spec.sms} SMs @ "
                f"{clock}, {spec.memory_gb:g} GB @ {spec.mem_bandwidth_gbs:g} GB/s, {l2}, "
                f"smem/block {smem}"
            ),
            f"dense TFLOPS (efficiency basis): {_peaks_line(spec, 'dense')}",
            f"2:4-sparse TFLOPS (never an efficiency basis): {_peaks_line(spec, 'sparse')}",
            _LEGEND,
        ]
    )


def _field_names() -> tuple[str, ...]:
    """Every sourced field name (scalar fields + "dense.<p>"/"sparse.<p>"); used by the tests."""
    skip = {"key", "name", "match_names", "sources", "dense_tflops", "sparse_tflops"}
    scalar = tuple(f.name for f in fields(GPUSpec) if f.name not in skip)
    return scalar + tuple(f"{k}.{p}" for k in ("dense", "sparse") for p in PRECISIONS)
