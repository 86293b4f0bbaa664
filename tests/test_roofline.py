"""Roofline arithmetic against hand-computed values and the worked tables in the reference docs
(kernel-techniques.md §5, hardware-and-model.md §5-§6)."""

import dataclasses
import itertools
import math

import pytest
import torch

from sglang_fp4ext import hardware as hw
from sglang_fp4ext import model_shapes as ms
from sglang_fp4ext import projection as pj
from sglang_fp4ext import roofline as rf

PRO = hw.spec_by_key("rtx-pro-6000-ws")
H200 = hw.spec_by_key("h200")
TP8 = ms.preset("glm5-tp8")
EP8 = ms.preset("glm5-ep8")


# ---- D(B) ---------------------------------------------------------------------------------------


def test_expected_distinct_hand_values():
    assert rf.expected_distinct_experts(0, 256, 8) == 0.0
    assert rf.expected_distinct_experts(1, 256, 8) == pytest.approx(8.0)  # one token: exactly k
    assert rf.expected_distinct_experts(2, 4, 2) == pytest.approx(3.0)  # 4·(1 − (1/2)²)
    assert rf.expected_distinct_experts(5, 6, 6) == pytest.approx(6.0)  # k = E: all, always
    assert rf.expected_distinct_experts(16, 256, 8) == pytest.approx(256 * (1 - 0.96875**16))
    assert rf.expected_distinct_experts(16, 256, 8) == pytest.approx(102.0, abs=0.05)
    ds = [rf.expected_distinct_experts(b, 256, 8) for b in range(0, 300, 7)]
    assert all(a < b for a, b in itertools.pairwise(ds)) and ds[-1] < 256
    with pytest.raises(ValueError, match="top_k"):
        rf.expected_distinct_experts(1, 8, 9)
    with pytest.raises(ValueError, match="tokens"):
        rf.expected_distinct_experts(-1, 8, 2)


# kernel-techniques.md §5 "Worked GLM-5 numbers" (TP8 columns), as printed there.
WORKED = [
    # B, D(B), TP8 MB/layer/GPU, µs PRO 6000, µs H200, ms for 75 layers on PRO 6000
    (1, 8.0, 21.2, 11.8, 4.4, 0.89),
    (2, 15.8, 41.8, 23.3, 8.7, 1.75),
    (4, 30.5, 81.0, 45.2, 16.9, 3.39),
    (8, 57.4, 152.4, 85.0, 31.8, 6.38),
    (16, 102.0, 270.6, 151.0, 56.4, 11.3),
    (32, 163.3, 433.5, 241.9, 90.3, 18.1),
    (64, 222.4, 590.4, 329.5, 123.0, 24.7),
    (128, 251.6, 667.8, 372.7, 139.1, 28.0),
]


def _printed(value, printed):
    """``value`` rounds to ``printed`` at the precision it was printed with (half a last digit)."""
    decimals = len(repr(float(printed)).split(".")[1])
    return abs(value - printed) <= 0.5 * 10**-decimals + 1e-9


@pytest.mark.parametrize("B, D, mb, us_pro, us_h200, ms75", WORKED)
def test_worked_tp8_table(B, D, mb, us_pro, us_h200, ms75):
    d = TP8.expected_distinct(B)
    nbytes = TP8.bytes_floor(d)
    us = rf.time_floor_us(nbytes, PRO.mem_bandwidth_Bps)
    assert _printed(d, D), d
    assert _printed(nbytes / 1e6, mb), nbytes
    assert _printed(us, us_pro), us
    assert _printed(rf.time_floor_us(nbytes, H200.mem_bandwidth_Bps), us_h200)
    # The doc multiplied its rounded µs column by 75 (B=128: 75 x 372.7 = 27.95 -> 28.0), so
    # allow that rounding too: 75 x 0.05 µs.
    assert abs(75 * us / 1e3 - ms75) <= 0.05 + 75 * 0.05e-3


def test_expert_bytes_hand_values():
    # 3·H·I weights at 0.5 B + one e4m3 byte per 16 + three fp32 globals.
    tp8 = 3 * 6144 * 256
    assert TP8.expert_bytes == tp8 // 2 + tp8 // 16 + 12 == 2_654_220
    ep8 = 3 * 6144 * 2048
    assert EP8.expert_bytes == ep8 // 2 + ep8 // 16 + 12 == 21_233_676
    assert round(TP8.expert_bytes / 1e6, 3) == 2.654  # HM §6
    assert round(EP8.expert_bytes / 1e6, 2) == 21.23
    # HM §6: 679.5 MB of experts per layer per GPU either way, ≈ 50.96 GB for 75 layers.
    assert round(256 * TP8.expert_bytes / 1e6, 1) == round(32 * EP8.expert_bytes / 1e6, 1) == 679.5
    assert round(75 * 256 * TP8.expert_bytes / 1e9, 2) == 50.96
    # HM §5: routed-expert traffic per decoded token over all GPUs ≈ 12.7 GB.
    assert round(75 * 8 * EP8.expert_bytes / 1e9, 1) == 12.7
    assert rf.nvfp4_expert_bytes(7168, 256) == 3 * 7168 * 256 * 9 // 16 + 12  # DeepSeek-R1 TP8
    with pytest.raises(ValueError, match="multiple of 16"):
        rf.nvfp4_expert_bytes(6144, 200)


def test_activation_bytes_and_floor():
    assert rf.activation_bytes(3, 6144) == 2 * 3 * 6144 * 2
    assert TP8.bytes_floor(8.0, tokens=1) == 8 * 2_654_220 + 4 * 6144
    assert rf.time_floor_us(1.792e6, 1.792e12) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        rf.time_floor_us(1.0, 0.0)


def test_fused_shared_expert():
    fused = ms.preset("glm5-tp8-fused-shared")
    assert (fused.E_local, fused.top_k_local) == (257, 9)
    assert (TP8.E_local, TP8.top_k_local) == (256, 8)
    assert fused.expected_distinct(1) == pytest.approx(9.0)
    assert fused.expected_distinct(0) == 0.0
    # kernel-techniques §5: the fused shared expert adds 2.654 MB per layer, +1.5 µs on PRO 6000.
    extra = fused.bytes_floor(fused.expected_distinct(1)) - TP8.bytes_floor(
        TP8.expected_distinct(1)
    )
    assert round(rf.time_floor_us(extra, PRO.mem_bandwidth_Bps), 1) == 1.5


def test_model_shapes():
    assert (EP8.E_local, EP8.I_local, TP8.E_local, TP8.I_local) == (32, 2048, 256, 256)
    # EP per-rank mean: 32/256 of D(B).
    assert EP8.expected_distinct(16) == pytest.approx(rf.expected_distinct_experts(16, 256, 8) / 8)
    for shape in ms.PRESETS.values():
        assert shape.source and hash(shape) is not None
        assert shape.I_local % 16 == 0
    qc = ms.preset("qwen3-coder-480b-nvfp4-tp8")
    assert qc.I_local == 320 and qc.expert_bytes == 3 * 6144 * 320 * 9 // 16 + 12
    with pytest.raises(dataclasses.FrozenInstanceError):
        TP8.tp = 4
    with pytest.raises(ValueError, match="not both"):
        ms.ModelShape("x", 256, 8, 6144, 2048, 1, tp=2, ep=2)
    with pytest.raises(ValueError, match="fuse_shared"):
        ms.ModelShape("x", 256, 8, 6144, 2048, 1, n_shared=1, ep=8, fuse_shared=True)
    with pytest.raises(ValueError, match="divisible"):
        ms.ModelShape("x", 256, 8, 6144, 2048, 1, ep=3)
    with pytest.raises(KeyError, match="glm5-tp8"):
        ms.preset("glm6")


# ---- FLOPs ------------------------------------------------------------------------------------


def test_flops():
    assert rf.moe_flops(1, 8, 6144, 2048) == 2 * 8 * 3 * 6144 * 2048 == 603_979_776
    # Either sharding splits the same work over 8 GPUs (EP: the mean rank).
    assert TP8.flops(64) == EP8.flops(64) == rf.moe_flops(64, 8, 6144, 2048) / 8
    # kernel-techniques §5: W4A16 with m rows per expert ≈ 3.56·m FLOP/byte.
    for m in (1, 4, 16):
        d = 40
        intensity = rf.moe_flops(d * m, 1, 6144, 256) / TP8.bytes_floor(d)
        assert intensity / m == pytest.approx(2 / 0.5625, rel=1e-3)


# ---- distinct_experts on real topk_ids --------------------------------------------------------


def test_distinct_experts_hand_cases():
    assert rf.distinct_experts(torch.tensor([[0, 1], [1, -1]])) == 2
    assert rf.distinct_experts(torch.full((4, 8), -1, dtype=torch.int32)) == 0
    assert rf.distinct_experts(torch.empty(0, 8, dtype=torch.int64)) == 0
    assert rf.distinct_experts(torch.tensor([[[5, 5, 5]], [[3, -1, 0]]], dtype=torch.int32)) == 3
    t = rf.distinct_experts_tensor(torch.tensor([2, 2, 7]))
    assert t.dim() == 0 and t.dtype == torch.int64 and int(t) == 2
    with pytest.raises(TypeError, match="integer"):
        rf.distinct_experts(torch.zeros(2, 2))


def _python_distinct(ids):
    return len({int(i) for i in ids.flatten().tolist() if i >= 0})


def test_distinct_experts_random(seed):
    for _ in range(20):
        T, k, E = (int(torch.randint(1, 65, ())), int(torch.randint(1, 10, ())), 64)
        ids = torch.randint(-1, E, (T, k), dtype=torch.int32)  # -1 = not local (EP)
        assert rf.distinct_experts(ids) == _python_distinct(ids)


@pytest.mark.gpu
def test_distinct_experts_cuda(seed):
    ids = torch.randint(-1, 256, (64, 8), dtype=torch.int32, device="cuda")
    t = rf.distinct_experts_tensor(ids)
    assert t.device.type == "cuda"
    assert int(t) == _python_distinct(ids.cpu())


def test_busiest_rank_monte_carlo(seed):
    g = torch.Generator().manual_seed(seed)
    # ep=1: the busiest "rank" is the whole layer, so the estimate must converge to D(B).
    assert rf.expected_busiest_rank_experts(4, 64, 4, 1, samples=3000, generator=g) == (
        pytest.approx(rf.expected_distinct_experts(4, 64, 4), abs=0.1)
    )
    # kernel-techniques §5, EP8 busiest rank: 2.6 experts at B=1, 16.7 at B=16 (printed to
    # 0.1; Monte Carlo standard error at 4000 samples is ~0.01-0.02).
    b1 = rf.expected_busiest_rank_experts(1, 256, 8, 8, samples=4000, generator=g)
    b16 = rf.expected_busiest_rank_experts(16, 256, 8, 8, samples=4000, generator=g)
    assert abs(b1 - 2.6) <= 0.11 and abs(b16 - 16.7) <= 0.15, (b1, b16)
    assert b16 > EP8.expected_distinct(16)  # the busiest rank exceeds the mean
    assert round(b16 * EP8.expert_bytes / 1e6, -1) == pytest.approx(355, abs=10)  # "355 MB"


# ---- efficiency ---------------------------------------------------------------------------------


def test_bandwidth_efficiency_states_its_basis():
    # Appendix: GLM-5 TP8 T=1 took 57.6 µs with 4.27 TB/s measured copy bandwidth -> 0.09.
    nbytes = TP8.bytes_floor(8)
    e = rf.bandwidth_efficiency(nbytes, 57.6, 4.27e12)
    assert e.achieved == pytest.approx(nbytes / 57.6e-6 / 1e12)
    assert round(e.fraction, 2) == 0.09 and "measured" in e.basis and "this run" in e.basis
    s = rf.spec_bandwidth_efficiency(nbytes, 57.6, H200)
    assert s.fraction == pytest.approx(nbytes / 57.6e-6 / 4.8e12) and "spec" in s.basis
    assert "%" in str(e)


def test_compute_efficiency_uses_dense_peak():
    # HM §2: 8192³ bf16 matmul at 672 TFLOP/s is 68% of the H200's 989 dense peak.
    flops = 2 * 8192**3
    us = flops / 672e12 * 1e6
    e = rf.compute_efficiency(flops, us, H200, "bf16")
    assert e.achieved == pytest.approx(672) and round(e.fraction, 2) == 0.68
    assert "dense" in e.basis and "sparse" not in e.basis
    # 1,300 TFLOPS FP4 on a PRO 6000 is ~65% of the dense peak, not 32% of "4 PFLOPS".
    e = rf.compute_efficiency(1300e12, 1e6, PRO, "fp4")
    assert e.fraction == pytest.approx(1300 / 2015)
    with pytest.raises(ValueError, match="no dense fp4 peak.*FP4"):
        rf.compute_efficiency(1.0, 1.0, H200, "fp4")
    with pytest.raises(ValueError, match="Server Edition"):
        rf.compute_efficiency(1.0, 1.0, hw.spec_by_key("rtx-pro-6000-server"), "bf16")


# ---- projection ---------------------------------------------------------------------------------


def test_projection_arithmetic():
    nbytes = TP8.bytes_floor(8)
    # With the source spec the efficiency ratio cancels: scale = 4.8 / 1.792 TB/s.
    p = pj.projection(57.6, nbytes, 4.27e12, PRO, source_spec=H200)
    assert p.projection is True
    assert p.projected_us == pytest.approx(57.6 * 4800 / 1792)
    assert p.target_bw_Bps == pytest.approx(1792e9 * 4.27 / 4.8)
    assert p.target_floor_us == pytest.approx(nbytes / p.target_bw_Bps * 1e6)
    # A fixed launch cost (appendix: 5.6 µs with no work) is carried over unscaled.
    p = pj.projection(57.6, nbytes, 4.27e12, PRO, source_spec=H200, fixed_us=5.6)
    assert p.projected_us == pytest.approx(5.6 + 52.0 * 4800 / 1792)
    assert p.scaled_us == pytest.approx(52.0 * 4800 / 1792)
    # Without a source spec, the target is assumed to reach its spec bandwidth, and says so.
    p = pj.projection(57.6, nbytes, 4.27e12, PRO)
    assert p.projected_us == pytest.approx(57.6 * 4.27 / 1.792)
    assert any("optimistic" in a for a in p.assumptions)
    label = p.label()
    assert label.startswith("PROJECTION (not measured)") and PRO.name in label


def test_projection_guards():
    p = pj.projection(2.0, 21e6, 4.27e12, PRO)  # faster than the bytes allow at 4.27 TB/s
    assert any("L2" in a for a in p.assumptions)
    with pytest.raises(ValueError, match="projection=True"):
        dataclasses.replace(p, projection=False)
    with pytest.raises(ValueError, match="fixed_us"):
        pj.projection(10.0, 1e6, 1e12, PRO, fixed_us=10.0)
    with pytest.raises(ValueError):
        pj.projection(0.0, 1e6, 1e12, PRO)
    assert math.isfinite(p.projected_us)
