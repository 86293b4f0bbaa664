"""Types of the hardware table: a GPU model (:class:`GPUSpec`), its per-precision peaks
(:class:`Peaks`) and the :class:`Source` every figure carries. The rows are in
``hardware_table.py``; lookup and formatting in ``hardware.py``.

Units: TFLOPS (1e12 FLOP/s), GB/s (1e9 B/s), L2 in MB as vendors quote caches (2^20 B, what
``cudaDeviceProp.l2CacheSize`` reports), memory in marketed GB, shared memory in bytes.
Precisions (``PRECISIONS``) mean tensor-core MMA with **FP32 accumulate**, the mode a GEMM kernel
uses:

* ``fp4``  NVFP4/MXFP4 block-scaled E2M1 (SM100/SM120 only),
* ``fp8``  E4M3/E5M2 (SM89+),
* ``bf16`` BF16 (FP16 has the same rate),
* ``tf32`` TF32.

Every figure carries a ``Source`` (``GPUSpec.source(field)``): ``kind`` is one of
``vendor`` (NVIDIA-published, possibly via a mirror), ``third-party`` (spec sites, press),
``derived`` (arithmetic on cited inputs, stated), ``measured``; and for an absent figure
``n/a`` (the GPU has no such mode) or ``unsourced`` (it exists but no figure was found: left
``None`` rather than invented).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ABSENT_KINDS",
    "DERIVED",
    "KINDS",
    "MEASURED",
    "NA",
    "PRECISIONS",
    "THIRD_PARTY",
    "UNSOURCED",
    "VENDOR",
    "GPUSpec",
    "Peaks",
    "Source",
    "check_precision",
]

PRECISIONS = ("fp4", "fp8", "bf16", "tf32")
VENDOR, THIRD_PARTY, DERIVED, MEASURED = "vendor", "third-party", "derived", "measured"
NA, UNSOURCED = "n/a", "unsourced"
#: Kinds for a figure that is present / absent.
KINDS = (VENDOR, THIRD_PARTY, DERIVED, MEASURED)
ABSENT_KINDS = (NA, UNSOURCED)


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")


@dataclass(frozen=True)
class Source:
    kind: str
    cite: str

    def __post_init__(self):
        if self.kind not in KINDS + ABSENT_KINDS:
            raise ValueError(
                f"Source.kind must be one of {KINDS + ABSENT_KINDS}, got {self.kind!r}"
            )


@dataclass(frozen=True)
class Peaks:
    """One number per precision (TFLOPS, or FLOP/clk/SM); ``None`` = no such mode / unsourced."""

    fp4: float | None = None
    fp8: float | None = None
    bf16: float | None = None
    tf32: float | None = None

    def get(self, precision: str) -> float | None:
        check_precision(precision)
        return getattr(self, precision)


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Frozen and hashable; figures' sources via :meth:`source`."""

    key: str
    name: str
    #: Exact ``torch.cuda.get_device_name()`` strings, after :func:`normalize_device_name`.
    #: Exact match on purpose: "H200 NVL", "A100-SXM4-40GB" or "RTX 5090 D" have other figures.
    match_names: tuple[str, ...]
    capability: tuple[int, int]
    sms: int
    boost_clock_mhz: float | None
    mem_bandwidth_gbs: float
    l2_mb: float | None
    smem_per_block_optin: int | None
    memory_gb: float
    dense_tflops: Peaks
    sparse_tflops: Peaks
    #: Dense tensor FLOP per clock per SM (2 x FMA), for reproducing peaks; None where unknown.
    flop_per_clk_per_sm: Peaks
    #: (field, Source) pairs; peak fields are named "dense.fp4", "sparse.bf16", ...
    sources: tuple[tuple[str, Source], ...]

    def source(self, field: str) -> Source | None:
        for k, s in self.sources:
            if k == field:
                return s
        return None

    @property
    def mem_bandwidth_Bps(self) -> float:
        return self.mem_bandwidth_gbs * 1e9
