"""Gluon kernel of ``native_fp4_probe.py`` (``@gluon.jit`` only): one code word of 8 FP4 weights
per thread through sm_100 / sm_120's native e2m1 conversion, in the output arrangement of the
decode kernels' ``FP4X4_TO_BF16_PTX`` (pairs of low nibbles, then of high nibbles), times an
f16 scale pair."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# Byte j -> f16x2 (low nibble, high nibble) with cvt; regroup into (L0, L1), (L2, L3), (H0, H1),
# (H2, H3) with prmt; scale with mul.f16x2.
FP4X4_TO_F16_NATIVE_PTX = gl.constexpr(
    """
    {
    .reg .b8 b0, b1, b2, b3;
    .reg .b32 c0, c1, c2, c3, t;
    mov.b32 {b0, b1, b2, b3}, $4;
    cvt.rn.f16x2.e2m1x2 c0, b0;
    cvt.rn.f16x2.e2m1x2 c1, b1;
    cvt.rn.f16x2.e2m1x2 c2, b2;
    cvt.rn.f16x2.e2m1x2 c3, b3;
    prmt.b32 t, c0, c1, 0x5410;
    mul.rn.f16x2 $0, t, $5;
    prmt.b32 t, c2, c3, 0x5410;
    mul.rn.f16x2 $1, t, $5;
    prmt.b32 t, c0, c1, 0x7632;
    mul.rn.f16x2 $2, t, $6;
    prmt.b32 t, c2, c3, 0x7632;
    mul.rn.f16x2 $3, t, $6;
    }
    """
)


@gluon.jit
def _native_decode(q_ptr, s_ptr, o_ptr):
    """Thread i: code word q[i], scale pairs s[2i] (low nibbles) and s[2i+1] (high) -> 4 words."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    i = gl.arange(0, 128, layout=L)
    lo01, lo23, hi01, hi23 = gl.inline_asm_elementwise(
        FP4X4_TO_F16_NATIVE_PTX,
        "=r,=r,=r,=r,r,r,r",
        args=[gl.load(q_ptr + i), gl.load(s_ptr + 2 * i), gl.load(s_ptr + 2 * i + 1)],
        dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )
    gl.store(o_ptr + 4 * i, lo01)
    gl.store(o_ptr + 4 * i + 1, lo23)
    gl.store(o_ptr + 4 * i + 2, hi01)
    gl.store(o_ptr + 4 * i + 3, hi23)
