"""The hardware table: its arithmetic, its sources, and device-name matching.

The peak figures in ``hardware_table.py`` are literals copied from their sources; these tests check
them against independent arithmetic (dense = sparse / 2; dense = SMs x clock x FLOP/clk/SM), so a
mistyped or guessed figure fails here.
"""

import dataclasses

import pytest

from sglang_fp4ext import gpu_spec as gs
from sglang_fp4ext import hardware as hw
from sglang_fp4ext import target_info

SPECS = hw.all_specs()
IDS = [s.key for s in SPECS]

# Quoted peaks are rounded to 3-4 significant digits (H100 bf16: 989 quoted, 989.4 exact), so
# arithmetic identities hold to ~0.1%; 0.3% still catches any wrong rate, clock or SM count
# (the nearest wrong values are off by >= 2x, or >= 12% for the Max-Q vs WS clock).
ROUNDING = 3e-3


def _rel(a, b):
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_dense_is_half_of_sparse(spec):
    for p in gs.PRECISIONS:
        dense, sparse = hw.dense_peak(spec, p), hw.sparse_peak(spec, p)
        assert (dense is None) == (sparse is None), f"{spec.key} {p}: one of dense/sparse missing"
        if dense is not None:
            assert _rel(dense, sparse / 2) <= ROUNDING, f"{spec.key} {p}: {dense} vs {sparse}/2"


def test_vendor_sparse_figures_are_never_listed_as_dense():
    # Where NVIDIA quotes only the sparse headline (Hopper, B200, RTX 5090 FP4), the dense
    # figure must be the derived half, not a copy of the headline.
    checked = 0
    for spec in SPECS:
        for p in gs.PRECISIONS:
            src = spec.source(f"sparse.{p}")
            if src is not None and src.kind == gs.VENDOR and spec.key != "a100-sxm4-80gb":
                assert spec.source(f"dense.{p}").kind in (gs.DERIVED, gs.THIRD_PARTY)
                assert hw.dense_peak(spec, p) < hw.sparse_peak(spec, p)
                checked += 1
    assert checked >= 10


def test_peaks_reproduce_from_sms_clock_and_rate():
    checked = 0
    for spec in SPECS:
        for p in gs.PRECISIONS:
            derived = hw.derived_dense_peak(spec, p)
            quoted = hw.dense_peak(spec, p)
            if derived is None or quoted is None:
                continue
            assert _rel(derived, quoted) <= ROUNDING, f"{spec.key} {p}: {derived:.1f} vs {quoted}"
            checked += 1
    # PRO 6000 WS + Max-Q 4 each, RTX 5090 4, H200 3, H100 3, A100 2.
    assert checked == 20


@pytest.mark.parametrize(
    "key, precision, hand",
    [
        ("rtx-pro-6000-ws", "fp4", 188 * 2.617e9 * 4096 / 1e12),  # 2015.2 (HM §3)
        ("rtx-pro-6000-ws", "bf16", 503.8),  # hmc-tech's unrounded BF16
        ("rtx-pro-6000-maxq", "fp4", 1761.8),  # 188 x 2.288 GHz x 4096
        ("rtx-5090", "fp4", 1676.0),  # HM §3: 170 x 2.407 x 4096 = 1676
        ("rtx-5090", "bf16", 209.5),  # GeForce half-rate FP32 accumulate
        ("h200", "bf16", 989.4),  # Hopper whitepaper dense BF16
        ("h100-sxm", "fp8", 1978.9),
        ("a100-sxm4-80gb", "bf16", 311.9),  # 108 x 1.41 GHz x 2048
    ],
)
def test_derived_peak_hand_values(key, precision, hand):
    assert hw.derived_dense_peak(hw.spec_by_key(key), precision) == pytest.approx(hand, abs=0.15)


def test_absent_modes():
    for key in ("h200", "h100-sxm", "a100-sxm4-80gb"):
        spec = hw.spec_by_key(key)
        assert hw.dense_peak(spec, "fp4") is None and hw.sparse_peak(spec, "fp4") is None
        assert spec.source("dense.fp4").kind == gs.NA
    a100 = hw.spec_by_key("a100-sxm4-80gb")
    assert hw.dense_peak(a100, "fp8") is None and a100.source("dense.fp8").kind == gs.NA
    # Unsourced, not invented: the Server Edition's clock and peaks were not found.
    server = hw.spec_by_key("rtx-pro-6000-server")
    assert server.boost_clock_mhz is None and hw.dense_peak(server, "fp4") is None
    assert server.source("dense.fp4").kind == gs.UNSOURCED


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_fp4_presence_agrees_with_target_info(spec):
    # A GPU the table marks "no FP4 mode" must be one target_info says has no native FP4 MMA.
    no_fp4 = spec.source("dense.fp4").kind == gs.NA
    assert no_fp4 == (not target_info.has_native_fp4_mma(spec.capability))
    if spec.capability[0] == 12:
        assert spec.smem_per_block_optin == target_info.SM120_SMEM_PER_BLOCK


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_every_figure_is_sourced(spec):
    for field in hw._field_names():
        if field.startswith(("dense.", "sparse.")):
            kind, p = field.split(".")
            value = getattr(spec, f"{kind}_tflops").get(p)
        else:
            value = getattr(spec, field)
            if isinstance(value, gs.Peaks):
                value = None if all(v is None for v in dataclasses.astuple(value)) else value
        src = spec.source(field)
        assert src is not None, f"{spec.key}.{field} has no source"
        assert src.cite.strip(), f"{spec.key}.{field} has an empty citation"
        allowed = gs.KINDS if value is not None else gs.ABSENT_KINDS
        assert src.kind in allowed, f"{spec.key}.{field}={value!r} tagged {src.kind!r}"


@pytest.mark.parametrize(
    "device_name, key",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000-ws"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx-pro-6000-maxq"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-server"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("  nvidia   h200 ", "h200"),  # case and whitespace do not matter
    ],
)
def test_device_name_matching(device_name, key):
    spec = hw.spec_for_device_name(device_name)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize(
    "device_name",
    [
        "NVIDIA H200 NVL",  # PCIe variant, lower peaks
        "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL",
        "NVIDIA A100-SXM4-40GB",  # 1,555 GB/s, not 2,039
        "NVIDIA A100 80GB PCIe",
        "NVIDIA GeForce RTX 5090 D",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA RTX PRO 6000 Blackwell",
        "Tesla T4",
        "",
    ],
)
def test_unknown_device_names(device_name):
    assert hw.spec_for_device_name(device_name) is None


def test_lookup_errors_and_immutability():
    with pytest.raises(ValueError, match="fp16"):
        hw.dense_peak(SPECS[0], "fp16")
    with pytest.raises(KeyError, match="h200"):
        hw.spec_by_key("h300")
    spec = hw.spec_by_key("h200")
    assert len({hash(s) for s in SPECS}) == len(SPECS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.sms = 1
    with pytest.raises(ValueError, match="kind"):
        gs.Source("guess", "x")


def test_formatting_keeps_dense_and_sparse_apart():
    h200 = hw.spec_by_key("h200")
    row = hw.format_row(h200)
    _, dense, sparse = row.split(" | ")
    assert dense.startswith("dense TFLOPS") and "BF16 989 [DER]" in dense and "FP4 n/a" in dense
    assert sparse.startswith("2:4-sparse") and "BF16 1979 [NV]" in sparse
    assert "not an efficiency basis" in sparse
    summary = hw.spec_summary(hw.spec_by_key("rtx-pro-6000-server")).splitlines()
    assert "boost clock unsourced" in summary[0]
    assert summary[1].startswith("dense TFLOPS (efficiency basis): FP4 ?")
    assert summary[2].startswith("2:4-sparse TFLOPS (never an efficiency basis)")
    table = hw.format_table().splitlines()
    assert len(table) == len(SPECS) + 1 and table[-1].startswith("tags:")


@pytest.mark.gpu
def test_this_gpu_matches_its_row():
    import torch

    spec = hw.spec_for_device_name(torch.cuda.get_device_name())
    if spec is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in the table")
    props = torch.cuda.get_device_properties(0)
    assert props.multi_processor_count == spec.sms
    assert tuple(torch.cuda.get_device_capability()) == spec.capability
    assert getattr(props, "shared_memory_per_block_optin", spec.smem_per_block_optin) == (
        spec.smem_per_block_optin
    )
    # Marketed HBM/GDDR "GB" are close to GiB; the driver reports a little less (reservations).
    # H200: 141 marketed, 139.8 GiB reported.
    assert 0.9 * spec.memory_gb <= props.total_memory / 2**30 <= 1.02 * spec.memory_gb
    l2 = getattr(props, "L2_cache_size", None)
    if l2 and spec.l2_mb is not None:
        assert l2 / 2**20 == pytest.approx(spec.l2_mb, rel=0.02)
