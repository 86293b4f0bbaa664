"""Kernel weight layout (``moe/layout.py``): bit-exact round trips, the nibble/scale order, padding,
and the torch twin of the kernels' decode against ``MoEWeights.dequantize`` (exact equality)."""

import pytest
import torch

from sglang_fp4ext.moe.layout import (
    E2M1_VALUES,
    K_CHUNK,
    ROW_ALIGN,
    SCALE_CODE_BF16_BIAS,
    dequantize_kernel_matrix,
    e4m3_to_scale_code,
    prepare_matrix,
    prepare_w2,
    prepare_w13,
    scale_code_to_e4m3,
    scale_code_values,
    unprepare_matrix,
    unprepare_w13,
)
from sglang_fp4ext.moe.weights import MoEWeights


def _random_pack(E, H, I, g):
    """Random codes (every byte value possible) and positive e4m3 scales, fp32 globals."""

    def scales(*shape):
        return (torch.rand(*shape, generator=g) * 8 + 2.0**-8).to(torch.float8_e4m3fn)

    return MoEWeights(
        w13=torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g),
        w13_scale=scales(E, 2 * I, H // 16),
        w13_scale_2=torch.rand(E, 2, generator=g) + 0.1,
        w2=torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g),
        w2_scale=scales(E, H, I // 16),
        w2_scale_2=torch.rand(E, generator=g) + 0.1,
    )


@pytest.mark.parametrize("E,H,I", [(3, 256, 128), (2, 80, 48), (1, 528, 144), (4, 512, 256)])
def test_round_trip_bit_exact(E, H, I, seed):
    g = torch.Generator().manual_seed(seed)
    w = _random_pack(E, H, I, g)
    m13 = prepare_w13(w.w13, w.w13_scale, w.w13_scale_2)
    q, s, a = unprepare_w13(m13)
    assert torch.equal(q, w.w13)
    assert torch.equal(s.view(torch.uint8), w.w13_scale.view(torch.uint8))
    assert torch.equal(a, w.w13_scale_2)
    m2 = prepare_w2(w.w2, w.w2_scale, w.w2_scale_2)
    q, s, a = unprepare_matrix(m2)
    assert torch.equal(q, w.w2)
    assert torch.equal(s.view(torch.uint8), w.w2_scale.view(torch.uint8))
    assert torch.equal(a, w.w2_scale_2[:, None].expand(E, H))


@pytest.mark.parametrize("E,H,I", [(3, 256, 128), (2, 80, 48), (1, 528, 144)])
def test_twin_decode_equals_modelopt_dequantize(E, H, I, seed):
    """The twin reads the kernel layout back to exactly ModelOpt's dequantised weights."""
    g = torch.Generator().manual_seed(seed)
    w = _random_pack(E, H, I, g)
    ref13, ref2 = w.dequantize()
    d13 = dequantize_kernel_matrix(prepare_w13(w.w13, w.w13_scale, w.w13_scale_2))
    d2 = dequantize_kernel_matrix(prepare_w2(w.w2, w.w2_scale, w.w2_scale_2))
    # Rows interleaved gate/up; both sides round the fp32 scale product first -> bit-exact.
    assert torch.equal(d13[:, 0::2], ref13[:, :I])
    assert torch.equal(d13[:, 1::2], ref13[:, I:])
    assert torch.equal(d2, ref2)


def test_nibble_and_scale_order_golden():
    """Chunk byte i holds element i (low) and 128 + i (high); scale byte j covers 16j..16j+15."""
    K = 2 * K_CHUNK
    codes = torch.tensor([(k * 7 + k // 16) % 16 for k in range(K)], dtype=torch.uint8)
    q = (codes[0::2] | (codes[1::2] << 4))[None, None, :]  # checkpoint packing, one row
    scale = torch.arange(K // 16, dtype=torch.float32).add(1).mul(0.125).to(torch.float8_e4m3fn)
    m = prepare_matrix(q, scale[None, None, :], torch.ones(1, 1))
    for c in range(K // K_CHUNK):
        for i in (0, 5, 127):
            b = int(m.q[0, 0, c * 128 + i])
            assert b & 0xF == int(codes[c * K_CHUNK + i])
            assert b >> 4 == int(codes[c * K_CHUNK + 128 + i])
        # Scale codes: normal e4m3 bytes + 24, in the checkpoint's block order.
        sc = m.scale[0, c, 0]
        assert torch.equal(sc.int(), scale[c * 16 : c * 16 + 16].view(torch.uint8).int() + 24)
        assert torch.equal(scale_code_values(sc), scale[c * 16 : c * 16 + 16].float())
    # The twin agrees with a direct LUT decode of the checkpoint codes.
    lut = torch.tensor(E2M1_VALUES)
    ref = lut[codes.long()] * scale.float().repeat_interleave(16)
    assert torch.equal(dequantize_kernel_matrix(m)[0, 0], ref)


def test_padding_is_zero_and_shapes(seed):
    g = torch.Generator().manual_seed(seed)
    E, H, I = 2, 80, 48  # 2I = 96 -> 128 rows; H = 80 -> K padded to 256
    w = _random_pack(E, H, I, g)
    m = prepare_w13(w.w13, w.w13_scale, w.w13_scale_2)
    assert m.q.shape == (E, ROW_ALIGN, K_CHUNK // 2)
    assert m.scale.shape == (E, 1, ROW_ALIGN, 16) and m.alpha.shape == (E, ROW_ALIGN)
    assert m.q[:, 2 * I :].eq(0).all() and m.scale[:, :, 2 * I :].eq(0).all()
    assert m.alpha[:, 2 * I :].eq(0).all()
    # Columns K..Kp: low nibbles of bytes >= H (first half) and every high nibble (H < 128+i).
    assert (m.q[:, : 2 * I, H:] & 0xF).eq(0).all()
    assert m.scale[:, 0, : 2 * I, H // 16 :].eq(0).all()
    assert m.n == 2 * I and m.k == H and m.n_pad == ROW_ALIGN and m.k_pad == K_CHUNK
    assert all(t.is_contiguous() for t in (m.q, m.scale, m.alpha))


def test_gate_up_interleave_and_alpha(seed):
    g = torch.Generator().manual_seed(seed)
    E, H, I = 2, 256, 64
    w = _random_pack(E, H, I, g)
    m = prepare_w13(w.w13, w.w13_scale, w.w13_scale_2)
    assert torch.equal(m.alpha[:, 0 : 2 * I : 2], w.w13_scale_2[:, :1].expand(E, I))
    assert torch.equal(m.alpha[:, 1 : 2 * I : 2], w.w13_scale_2[:, 1:].expand(E, I))
    # Row 2j = gate j, row 2j+1 = up j: same bytes, permuted within each chunk.
    q, _, _ = unprepare_matrix(m)
    assert torch.equal(q[:, 0::2], w.w13[:, :I]) and torch.equal(q[:, 1::2], w.w13[:, I:])


def test_bad_inputs_raise_clear_errors():
    q = torch.zeros(1, 32, 8, dtype=torch.uint8)
    s = torch.zeros(1, 32, 1, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="q must be"):
        prepare_matrix(q.float(), s, torch.ones(1, 32))
    with pytest.raises(ValueError, match="scale must be"):
        prepare_matrix(q, s[:, :16], torch.ones(1, 32))
    with pytest.raises(ValueError, match="alpha must be"):
        prepare_matrix(q, s, torch.ones(1, 31))
    with pytest.raises(ValueError, match="w13_scale_2"):
        prepare_w13(q, s, torch.ones(1, 3))
    with pytest.raises(ValueError, match="w2_scale_2"):
        prepare_w2(q, s, torch.ones(2))
    # A bad scale value is named by its SGLang parameter, at its index in SGLang's row order.
    bad = torch.full((1, 32, 1), 0x38, dtype=torch.uint8)
    bad[0, 17, 0] = 0xB8  # -1.0, up row 1 (rows 0-15 gate, 16-31 up)
    with pytest.raises(ValueError, match=r"w13_weight_scale: scale -1.0 .* index \(0, 17, 0\)"):
        prepare_w13(q, bad.view(torch.float8_e4m3fn), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"w2_weight_scale: scale -1.0 .* index \(0, 17, 0\)"):
        prepare_w2(q, bad.view(torch.float8_e4m3fn), torch.ones(1))


def test_scale_codes_every_e4m3_byte():
    """Every finite non-negative e4m3 byte gets a distinct code whose decode (the kernels' bits,
    ``c * 16 + bias`` as bf16 = scale * 2^100) is its exact value, and the inverse gives the byte
    back; -0 is 0; negative and NaN scales are refused with the tensor's name and index."""
    b = torch.arange(256, dtype=torch.uint8)
    ok = (b < 0x7F) | (b == 0x80)
    c = e4m3_to_scale_code(b[ok])
    vals = b[ok].view(torch.float8_e4m3fn).float()
    assert torch.equal(scale_code_values(c), vals.abs())
    assert c[:-1].unique().numel() == 127 and int(c[-1]) == 0 and int(c.max()) == 150
    assert torch.equal(scale_code_to_e4m3(c[:-1]).view(torch.uint8), b[:0x7F])
    # The kernels' bf16 bits, computed as they are (16-bit multiply-add), then widened exactly.
    bits = (c.to(torch.int32) * 16 + SCALE_CODE_BF16_BIAS).to(torch.int16)
    as_bf16 = bits.view(torch.bfloat16).float() * 2.0**-100
    assert torch.equal(as_bf16[c > 0], vals[c > 0])
    for bad, what in ((0x81, "-0.001953125"), (0xB8, "-1.0"), (0x7F, "nan"), (0xFF, "nan")):
        s = torch.full((2, 3), 0x38, dtype=torch.uint8)
        s[1, 2] = bad
        msg = rf"w2_weight_scale: scale {what} .* at index \(1, 2\) is negative or NaN"
        with pytest.raises(ValueError, match=msg):
            e4m3_to_scale_code(s.view(torch.float8_e4m3fn), "w2_weight_scale")


def test_zero_scale_blocks_zero_their_codes(seed):
    """A zero scale has no zero code: the layout zeroes the block's weight codes, so kernels (any
    finite decoded scale times code 0) and the twin still give ModelOpt's exact 0."""
    g = torch.Generator().manual_seed(seed)
    E, H, I = 2, 256, 64
    w = _random_pack(E, H, I, g)
    zero = torch.rand(w.w2_scale.shape, generator=g) < 0.2
    s = w.w2_scale.view(torch.uint8).clone()
    s[zero] = torch.where(torch.rand(int(zero.sum()), generator=g) < 0.5, 0x00, 0x80).to(s.dtype)
    s = s.view(torch.float8_e4m3fn)
    m = prepare_w2(w.w2, s, w.w2_scale_2)
    q, sb, _ = unprepare_matrix(m)

    def blocks(t):  # (E, H, I/16, 8): the 8 packed bytes of each 16-element block
        return t.reshape(E, H, I // 16, 8)

    assert blocks(w.w2)[zero].ne(0).any()  # the random codes there were not all zero
    assert blocks(q)[zero].eq(0).all()
    assert torch.equal(blocks(q)[~zero], blocks(w.w2)[~zero])
    assert sb.view(torch.uint8)[zero].eq(0).all()
    _, ref = MoEWeights(w.w13, w.w13_scale, w.w13_scale_2, w.w2, s, w.w2_scale_2).dequantize()
    assert torch.equal(dequantize_kernel_matrix(m), ref)
