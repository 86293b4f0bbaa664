"""NVFP4 codec: hand-written goldens, E2M1 rounding oracle, properties, 128x4 swizzle."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_fp4ext.nvfp4 import format as F

u8 = torch.uint8


def _bytes(t: torch.Tensor) -> list[int]:
    return t.reshape(-1).view(u8).tolist()


# ---- goldens, derived by hand from the spec (not from ModelOpt) ----


def test_e2m1_table_from_bit_formula():
    # value = (-1)^s * 2^(e-1) * (1 + m/2) for e > 0, (-1)^s * m/2 for e = 0
    for code in range(16):
        s, e, m = code >> 3, (code >> 1) & 3, code & 1
        mag = 2.0 ** (e - 1) * (1 + m / 2) if e else m / 2
        want = -mag if s else mag
        got = F.E2M1_VALUES[code].item()
        assert got == want and math.copysign(1, got) == (-1 if s else 1), code


def test_golden_block_explicit_global_scale():
    first = [6.0, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5]
    second = [5.0, 1.5, -0.1, -0.0, -2.6, -4.9, -6.0, 0.74]
    x = torch.tensor([first + second])
    packed, bs, gs = F.quantize_nvfp4(x, global_scale=1.0)
    # codes 7,0 | 1,2 | 2,4 | 4,6 | 6,3 | 8,0 | 13,14 | 15,1 (even element in the low nibble)
    assert _bytes(packed) == [0x07, 0x21, 0x42, 0x64, 0x36, 0x08, 0xED, 0x1F]
    assert _bytes(bs) == [0x38]  # amax 6 / (6 * 1) = 1.0 = e4m3 0 0111 000
    assert gs.item() == 1.0 and gs.dtype == torch.float32
    deq = F.dequantize_nvfp4(packed, bs, gs)
    want = [6, 0, 0.5, 1, 1, 2, 2, 4, 4, 1.5, -0.0, 0, -3, -4, -6, 0.5]
    assert deq.reshape(-1).tolist() == want


def test_golden_scales_zero_block_min_clamp_and_max():
    x = torch.zeros(1, 64)
    x[0, 16:20] = torch.tensor([12.0, -3.0, 1.0, 0.5])  # block 1: amax 12 -> scale 2
    x[0, 32:34] = torch.tensor([1e-3, -4e-4])  # block 2: 1e-3/6 < 2^-9 -> clamped to 2^-9
    x[0, 48:52] = torch.tensor([2688.0, 1000.0, -200.0, 0.0])  # block 3: the tensor amax
    packed, bs, gs = F.quantize_nvfp4(x)
    assert gs.item() == 1.0  # 2688 / (6 * 448)
    # block scales: 1.0 (zero rule) 0x38, 2.0 0x40, 2^-9 (smallest subnormal) 0x01, 448 0x7E
    assert _bytes(bs) == [0x38, 0x40, 0x01, 0x7E]
    codes = F.unpack_fp4(packed)[0]
    assert codes[:16].tolist() == [0] * 16
    assert codes[16:20].tolist() == [7, 11, 1, 0]  # 6, -1.5, 0.5, 0.25->0 (tie to even)
    assert codes[32:34].tolist() == [1, 8]  # 0.512 -> 0.5; -0.2048 -> -0
    assert codes[48:52].tolist() == [7, 4, 9, 0]  # 6, 2.23 -> 2, -0.446 -> -0.5, 0
    deq = F.dequantize_nvfp4(packed, bs, gs)[0]
    assert deq[16:20].tolist() == [12.0, -3.0, 1.0, 0.0]
    assert deq[32].item() == 0.5 * 2.0**-9
    assert deq[48:52].tolist() == [2688.0, 896.0, -224.0, 0.0]


def test_golden_block_scale_rounds_down_and_codes_saturate():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = 7.8, 0.65  # s = 1.3 -> e4m3 1.25 (0x3A); 7.8/1.25 = 6.24 saturates to 6
    packed, bs, _ = F.quantize_nvfp4(x, global_scale=1.0)
    assert _bytes(bs) == [0x3A]
    assert F.unpack_fp4(packed)[0, :2].tolist() == [7, 1]
    assert F.dequantize_nvfp4(packed, bs, 1.0)[0, :2].tolist() == [7.5, 0.625]


def test_worked_byte_example_from_docstring():
    codes = F.quantize_e2m1(torch.tensor([1.5, -3.0]))
    assert codes.tolist() == [0x3, 0xD]
    assert F.pack_fp4(codes).tolist() == [0xD3]
    assert F.e2m1_to_float(F.unpack_fp4(torch.tensor([0xD3], dtype=u8))).tolist() == [1.5, -3.0]


def test_rtne_thresholds_and_saturation():
    v = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 6.5, 1e30, float("inf")]
    want = [0, 2, 2, 4, 4, 6, 6, 7, 7, 7, 7]
    assert F.quantize_e2m1(torch.tensor(v)).tolist() == want
    assert F.quantize_e2m1(-torch.tensor(v)).tolist() == [w | 8 for w in want]


# ---- E2M1 rounding against a brute-force nearest-value oracle ----


def _oracle_code(v: float) -> int:
    mags = [abs(F.E2M1_VALUES[i].item()) for i in range(8)]
    d = [abs(abs(v) - m) for m in mags]  # exact in float64 for float32 inputs
    best = min(d)
    idx = [i for i in range(8) if d[i] == best]
    code = next((i for i in idx if i % 2 == 0), idx[0])  # tie -> even mantissa
    return code | (8 if v < 0 else 0)


_ties = [s * t for t, _ in F.E2M1_THRESHOLDS for s in (1.0, -1.0)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-8, 8, width=32), st.sampled_from(_ties)), min_size=1))
def test_quantize_e2m1_matches_oracle(vals):
    got = F.quantize_e2m1(torch.tensor(vals, dtype=torch.float32)).tolist()
    assert got == [_oracle_code(v) for v in vals]


def test_quantize_e2m1_all_codes_round_trip():
    codes = torch.tensor([c for c in range(16) if c != 8], dtype=u8)
    assert torch.equal(F.quantize_e2m1(F.e2m1_to_float(codes)), codes)


# ---- pack/unpack ----


def test_pack_unpack_every_byte():
    b = torch.arange(256, dtype=u8)
    codes = F.unpack_fp4(b)
    assert codes[0::2].tolist() == [i & 0xF for i in range(256)]
    assert codes[1::2].tolist() == [i >> 4 for i in range(256)]
    assert torch.equal(F.pack_fp4(codes), b)


@settings(max_examples=100, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=2),
    k2=st.integers(1, 16),
    seed=st.integers(0, 2**31 - 1),
)
def test_pack_unpack_round_trip(shape, k2, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (*shape, 2 * k2), generator=g, dtype=u8)
    packed = F.pack_fp4(codes)
    assert packed.shape == (*shape, k2) and packed.dtype == u8
    assert torch.equal(F.unpack_fp4(packed), codes)


# ---- quantize -> dequantize error bound ----


def _half_step(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    return torch.where(a < 2, 0.25, torch.where(a < 4, 0.5, 1.0))


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(1, 6),
    blocks=st.integers(1, 4),
    log_scale=st.floats(-20, 20),
    tail=st.floats(0, 3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_dequant_error_within_half_step(rows, blocks, log_scale, tail, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 16 * blocks, generator=g)
    # Heavy tails and blocks of very different magnitude (exercise the min-scale clamp).
    x = x * torch.exp(tail * torch.randn(rows, 16 * blocks, generator=g)) * 2.0**log_scale
    x = x.to(dtype)
    packed, bs, gs = F.quantize_nvfp4(x)
    deq = F.dequantize_nvfp4(packed, bs, gs)
    scale = (bs.float() * gs).repeat_interleave(16, dim=-1)
    xf = x.float()
    bound = _half_step(xf / scale) * scale
    # 1e-6 relative slack: the fp32 division and product round once each.
    assert ((xf - deq).abs() <= bound * (1 + 1e-6)).all()


# ---- activations with a static input scale ----


def test_activation_saturates_above_calibrated_range(seed):
    x = torch.randn(4, 64)
    input_scale = torch.tensor(x.abs().max().item() / 2688 / 10)  # data 10x the calibrated amax
    packed, bs = F.quantize_activation_nvfp4(x, input_scale)
    assert (bs.float() <= 448).all() and torch.isfinite(bs.float()).all()
    fq = F.fake_quantize_activation(x, input_scale)
    assert torch.equal(fq, F.dequantize_nvfp4(packed, bs, input_scale))
    assert fq.abs().max().item() <= 6 * 448 * input_scale.item() * (1 + 1e-6)


def test_fake_quantize_activation_error_is_nvfp4_sized(seed):
    x = torch.randn(32, 256)
    input_scale = x.abs().max() / 2688
    err = (F.fake_quantize_activation(x, input_scale) - x).pow(2).mean().sqrt()
    # NVFP4 on Gaussian data: ~10% relative RMS error (3 magnitude bits per element).
    assert 0.03 < err.item() / x.pow(2).mean().sqrt().item() < 0.2


# ---- 128x4 swizzle ----


def _offset(r, c, cp):
    return (r // 128) * (128 * cp) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def test_swizzle_golden_offsets():
    n, c = 130, 5  # pads to 256 x 8
    s = torch.arange(n * c, dtype=torch.int32).remainder(251).add(1).to(u8).reshape(n, c)
    sw = F.swizzle_blockscale(s.view(torch.float8_e4m3fn))
    assert sw.shape == (256, 8) and sw.dtype == torch.float8_e4m3fn
    flat = sw.view(u8).reshape(-1)
    # hand-evaluated offsets: (0,0)->0, (1,0)->16, (32,0)->4, (0,1)->1, (0,4)->512, (128,0)->1024
    for (r, col), off in {
        (0, 0): 0,
        (1, 0): 16,
        (32, 0): 4,
        (0, 1): 1,
        (0, 4): 512,
        (128, 0): 1024,
        (129, 4): 1024 + 512 + 16,
    }.items():
        assert flat[off].item() == s[r, col].item()
        assert _offset(r, col, 8) == off
    assert int((flat != 0).sum()) == n * c  # padding is zero, nothing lost


@settings(max_examples=60, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    n=st.integers(1, 300),
    c=st.integers(1, 11),
    seed=st.integers(0, 2**31 - 1),
)
def test_swizzle_round_trip_and_formula(lead, n, c, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 256, (*lead, n, c), generator=g, dtype=u8).view(torch.float8_e4m3fn)
    sw = F.swizzle_blockscale(s)
    np_, cp = -(-n // 128) * 128, -(-c // 4) * 4
    assert sw.shape == (*lead, np_, cp)
    back = F.unswizzle_blockscale(sw, n, c)
    assert back.dtype == s.dtype and torch.equal(back.view(u8), s.view(u8))
    flat = sw.view(u8).reshape(-1, np_ * cp)[0]
    lin = s.view(u8).reshape(-1, n, c)[0]
    for r, col in [(0, 0), (n - 1, c - 1), (n // 2, c // 2)]:
        assert flat[_offset(r, col, cp)].item() == lin[r, col].item()


@pytest.mark.sglang
def test_swizzle_matches_sglang(seed):
    from sglang.srt.layers.quantization.utils import swizzle_blockscale as sgl_swizzle

    for shape in [(200, 13), (3, 257, 6), (2, 128, 4)]:
        s = torch.randint(0, 256, shape, dtype=u8).view(torch.float8_e4m3fn)
        assert torch.equal(sgl_swizzle(s).view(u8), F.swizzle_blockscale(s).view(u8)), shape


# ---- bad input ----


def test_errors_are_clear():
    with pytest.raises(ValueError, match="multiple of the NVFP4 block"):
        F.quantize_nvfp4(torch.randn(4, 24))
    with pytest.raises(ValueError, match="all-zero"):
        F.quantize_nvfp4(torch.zeros(2, 16))
    with pytest.raises(ValueError, match="Inf or NaN"):
        F.quantize_nvfp4(torch.tensor([[float("nan")] * 16]))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        F.quantize_nvfp4(torch.ones(2, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="finite and > 0"):
        F.quantize_nvfp4(torch.randn(2, 16), global_scale=0.0)
    with pytest.raises(ValueError, match="prefix"):
        F.quantize_nvfp4(torch.randn(2, 16), global_scale=torch.ones(3))
    with pytest.raises(ValueError, match="does not match packed"):
        bad_scale = torch.zeros(2, 2).to(torch.float8_e4m3fn)
        F.dequantize_nvfp4(torch.zeros(2, 8, dtype=u8), bad_scale, 1.0)
    with pytest.raises(ValueError, match="NaN"):
        F.quantize_e2m1(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="even"):
        F.pack_fp4(torch.zeros(3, dtype=u8))
    with pytest.raises(ValueError, match="0..15"):
        F.pack_fp4(torch.full((2,), 16, dtype=u8))
    with pytest.raises(ValueError, match="does not fit"):
        F.unswizzle_blockscale(torch.zeros(128, 4, dtype=u8), 130, 4)


def test_prefix_global_scale_equals_per_slice(seed):
    # One global scale per leading index (e.g. per expert / per gate-up) == quantizing each slice.
    x = torch.randn(3, 2, 8, 32) * torch.rand(3, 2, 1, 1) * 50
    gs = F.weight_global_scale(x, leading_dims=2)
    assert gs.shape == (3, 2)
    packed, bs, _ = F.quantize_nvfp4(x, gs)
    deq = F.dequantize_nvfp4(packed, bs, gs)
    for a in range(3):
        for b in range(2):
            p1, b1, g1 = F.quantize_nvfp4(x[a, b])
            assert g1 == gs[a, b]
            assert torch.equal(packed[a, b], p1) and torch.equal(bs[a, b].view(u8), b1.view(u8))
            assert torch.equal(deq[a, b], F.dequantize_nvfp4(p1, b1, g1))
