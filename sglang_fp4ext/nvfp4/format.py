r"""NVFP4: the format, the codec and the two block-scale layouts -- the one place that defines it.

NVFP4 stores a tensor ``x[..., K]`` as 4-bit E2M1 codes in 16-element blocks along the last dim
``K``, one FP8-E4M3 scale per block, and one FP32 scale per tensor (two-level scaling). Weights
are ``[N, K]`` (out, in) with ``K`` the GEMM reduction dim, exactly as ModelOpt checkpoints store
them. Everything below is what NVIDIA ModelOpt (``modelopt.torch.quantization.qtensor.
nvfp4_tensor.NVFP4QTensor``, v0.47) computes; ``tests/test_nvfp4_modelopt.py`` checks the codec
against it bit for bit, and ``tests/test_nvfp4_format.py`` against hand-written goldens.

E2M1 element (4 bits: sign ``s`` = bit 3, exponent ``e`` = bits 2..1, mantissa ``m`` = bit 0)
----------------------------------------------------------------------------------------------
Value = ``(-1)^s * 2^(e-1) * (1 + m/2)`` for ``e > 0`` and ``(-1)^s * m/2`` for ``e = 0``.
No Inf, no NaN; code 8 is negative zero (decoded here as ``-0.0``)::

    code   0    1    2    3    4    5    6    7  |  8..15 = same magnitudes, negative
    value  0   0.5  1.0  1.5  2.0  3.0  4.0  6.0 |

Rounding of a (scaled) real ``v`` to E2M1 is round-to-nearest, ties to even (even = mantissa bit
0), saturating at 6. Magnitude thresholds and the side a tie goes to::

    |v| <= 0.25 -> 0     (0.25 tie -> 0)     0.75 <= |v| <= 1.25 -> 1.0  (both ties -> 1.0)
    0.25 < |v| < 0.75 -> 0.5                 1.25 < |v| < 1.75   -> 1.5
    1.75 <= |v| <= 2.5 -> 2.0 (ties -> 2.0)  2.5 < |v| < 3.5     -> 3.0
    3.5 <= |v| <= 5 -> 4.0   (ties -> 4.0)   |v| > 5             -> 6.0 (also saturates)

The sign bit is ``v < 0``: a small negative value that rounds to zero gives code 8 (-0), ``-0.0``
gives code 0 (ModelOpt and the hardware ``cvt.rn.satfinite.e2m1x2.f32`` agree on this).

Packing (two codes per byte, even index in the LOW nibble)
---------------------------------------------------------
``packed[..., j] = codes[..., 2j] | (codes[..., 2j+1] << 4)``, uint8 ``[..., K/2]``. Worked example:
elements ``[1.5, -3.0]`` -> codes ``[0x3, 0xD]`` (``-3.0`` = sign 8 + code 5) -> byte
``0xD3``; unpack: ``0xD3 & 0xF = 3`` -> 1.5 (element 0), ``0xD3 >> 4 = 13`` -> -3.0 (element 1).

Scales (ModelOpt's math, fp32, in this exact operation order)
-------------------------------------------------------------
* Global (second-level) scale, one fp32 per tensor (checkpoint name ``weight_scale_2``)::

      global_scale = amax(|x|) / (6 * 448)            # 6 = E2M1 max, 448 = E4M3 max

  so the largest block scale is (close to) 448. An all-zero tensor has no global scale (ModelOpt
  yields NaN); this codec refuses it. Device note (measured on the H200, torch 2.11): PyTorch
  divides a CUDA tensor by a Python scalar as ``amax * fl32(1/2688)``, the CPU divides exactly,
  so ModelOpt's global scale -- and through it an occasional code -- can differ by one ulp
  between CPU and GPU (real checkpoints are quantized on GPUs). This codec uses ModelOpt's
  expression, so it matches ModelOpt on whichever device both run; compare a GPU kernel with
  this twin on the GPU.
* Block scale, one FP8-E4M3 (``float8_e4m3fn``) per 16 elements (checkpoint ``weight_scale``)::

      s = amax(|x[block]|) / (6 * global_scale)        # fp32; (6 * global_scale) rounded first
      s = 1.0 where s == 0                             # all-zero block ("zero-scale rule")
      block_scale = e4m3(clamp(s, 2**-9, 448))         # round-to-nearest-even cast

  The clamp is ModelOpt's min-scale rule: 2**-9 is the smallest E4M3 subnormal, so a block that
  is tiny next to the tensor's amax still gets a nonzero scale (its codes then round to 0 or
  small values); the upper clamp only bites with a static (calibrated) global scale that the
  data exceeds, e.g. activations, where it saturates instead of producing NaN.
* Codes: ``codes = e2m1_round(x / (float(block_scale) * global_scale))`` -- the product of the two
  scales is rounded to fp32 first, then one fp32 division (computed in fp32 even for bf16 ``x``).
* Dequantize: ``x_hat = e2m1(code) * (float(block_scale) * global_scale)``, again the fp32
  product of the two scales first (ModelOpt's ``dequantize`` and SGLang's
  ``quantization/dequantization.py:dequantize_nvfp4`` both use this order). Since
  ``e2m1 * e4m3`` is exact in fp32 the other order can differ by one ulp; kernels may use any
  order and are compared with tolerances, this codec is bit-exact with ModelOpt.
* Activations with a static ``input_scale`` (checkpoint ``input_scale`` = calibrated
  ``amax / (6 * 448)``) use the same formulas with ``global_scale = input_scale``; data above the
  calibrated amax saturates (block scale clamped to 448, codes to 6). ModelOpt's
  ``NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=input_scale)`` is the same thing.

Error bound: for every element, ``|x - x_hat| <= step/2 * float(block_scale) * global_scale``
(up to fp32 rounding), where ``step`` is the E2M1 spacing around ``|x|/scale`` (0.5 below 2,
1 in [2, 4], 2 in [4, 6]), provided the block is not saturated.

Block-scale layouts
-------------------
* Linear (checkpoints, SGLang's loaded ``*_weight_scale``): row-major ``[..., N, K/16]``;
  ``block_scale[n, j]`` scales ``x[n, 16j : 16j+16]``.
* Swizzled "128x4" (CUTLASS ``Sm1xxBlockScaledBasicChunk``, FlashInfer ``layout_128x4``, SGLang
  ``quantization/utils.py:swizzle_blockscale``, vLLM ``swizzle_blockscale``): pad rows ``N`` to
  ``Np = ceil(N/128)*128`` and columns ``C = K/16`` to ``Cp = ceil(C/4)*4`` with zero bytes, then
  ``reshape(B, Np/128, 4, 32, Cp/4, 4).permute(0, 1, 4, 3, 2, 5)``; the result is stored as
  ``[..., Np, Cp]`` (same bytes, contiguous). Linear entry ``(r, c)`` lands at flat offset
  (within one leading index)::

      off(r, c) = (r // 128) * (128 * Cp) + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4
                  + (c % 4)

  i.e. 512-byte atoms of 128 rows x 4 scale columns, atoms ordered row-tile major; inside an
  atom, row ``r`` sits in 16-byte line ``r % 32`` at 4-byte slot ``(r % 128) // 32``.
  ``swizzle_blockscale`` / ``unswizzle_blockscale`` convert both ways; any number of leading
  (e.g. expert) dims.

All functions here run on any device (CPU included), compute in fp32, and validate their input.
"""

from __future__ import annotations

import torch

__all__ = [
    "BLOCK_SIZE",
    "E2M1_MAX",
    "E4M3_MAX",
    "MIN_BLOCK_SCALE",
    "E2M1_VALUES",
    "E2M1_THRESHOLDS",
    "quantize_e2m1",
    "e2m1_to_float",
    "pack_fp4",
    "unpack_fp4",
    "weight_global_scale",
    "nvfp4_block_scale",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "quantize_activation_nvfp4",
    "fake_quantize_activation",
    "swizzle_blockscale",
    "unswizzle_blockscale",
]

#: Elements per block scale.
BLOCK_SIZE = 16
#: Largest E2M1 magnitude.
E2M1_MAX = 6.0
#: Largest finite ``float8_e4m3fn``.
E4M3_MAX = 448.0
#: Smallest positive E4M3 (subnormal 2**-9): ModelOpt's floor for block scales.
MIN_BLOCK_SCALE = 2.0**-9

_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: fp32 value of each code 0..15 (code 8 = -0.0).
E2M1_VALUES = torch.tensor([*_MAGNITUDES, *(-m for m in _MAGNITUDES)], dtype=torch.float32)
#: Midpoints between neighbouring magnitudes, with whether a tie rounds up (to the even code).
E2M1_THRESHOLDS = (
    (0.25, False),
    (0.75, True),
    (1.25, False),
    (1.75, True),
    (2.5, False),
    (3.5, True),
    (5.0, False),
)

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- validation helpers ----


def _check_float(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, bfloat16 or float16, got {x.dtype}")


def _check_blocks(k: int, what: str) -> None:
    if k % BLOCK_SIZE:
        raise ValueError(
            f"{what}: last dim {k} is not a multiple of the NVFP4 block ({BLOCK_SIZE})"
        )


def _as_scale(scale, like: torch.Tensor, lead_shape: tuple[int, ...], what: str) -> torch.Tensor:
    """A global scale as fp32 on ``like``'s device, broadcastable over ``lead_shape + (blocks,)``.

    Accepts a Python float, a 0-dim tensor, or a tensor whose shape is a prefix of
    ``lead_shape`` (e.g. ``(E,)`` for ``(E, N, K)`` weights: one scale per expert).
    """
    s = torch.as_tensor(scale, dtype=torch.float32, device=like.device)
    if s.dtype != torch.float32:
        s = s.float()
    if tuple(s.shape) != tuple(lead_shape[: s.ndim]):
        raise ValueError(
            f"{what} has shape {tuple(s.shape)}; expected () or a prefix of the leading dims "
            f"{tuple(lead_shape)}"
        )
    if s.numel() and not (torch.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"{what} must be finite and > 0, got {s.flatten()[:8].tolist()}")
    # Trailing singleton dims for the remaining leading dims and for the block dim.
    return s.reshape(*s.shape, *([1] * (len(lead_shape) - s.ndim + 1)))


# ---- E2M1 codes and packing ----


def quantize_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round already-scaled values to E2M1 codes (uint8 in 0..15), RTNE, saturating at +-6.

    ``x`` may hold any float dtype; comparisons are exact in fp32. NaN is rejected.
    """
    _check_float(x, "quantize_e2m1 input")
    if torch.isnan(x).any():
        raise ValueError("quantize_e2m1: input contains NaN (E2M1 has no NaN)")
    a = x.abs().float()
    mag = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for t, tie_up in E2M1_THRESHOLDS:
        mag += (a >= t if tie_up else a > t).to(torch.uint8)
    return mag | ((x < 0).to(torch.uint8) << 3)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (any integer dtype, values 0..15) to fp32."""
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"e2m1_to_float expects integer codes, got {codes.dtype}")
    c = codes.long()
    if c.numel() and (c.min() < 0 or c.max() > 15):
        raise ValueError("e2m1_to_float: codes must lie in 0..15")
    return E2M1_VALUES.to(codes.device)[c]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes ``[..., K]`` (uint8, 0..15, K even) to bytes ``[..., K/2]``, even index low."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_fp4 expects uint8 codes, got {codes.dtype}")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4: last dim must be even, got shape {tuple(codes.shape)}")
    if codes.numel() and codes.max() > 15:
        raise ValueError("pack_fp4: codes must lie in 0..15")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes ``[..., K/2]`` (uint8) to codes ``[..., K]`` (uint8), even index from low."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_fp4 expects uint8, got {packed.dtype}")
    if packed.ndim == 0:
        raise ValueError("unpack_fp4: need at least one dim")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(
        *packed.shape[:-1], packed.shape[-1] * 2
    )


# ---- scales ----


def weight_global_scale(w: torch.Tensor, leading_dims: int = 0) -> torch.Tensor:
    """ModelOpt's second-level scale ``amax(|w|) / (6 * 448)`` as fp32.

    ``leading_dims = 0`` gives one 0-dim scale for the whole tensor; ``leading_dims = d`` gives one
    scale per index of the first ``d`` dims (shape ``w.shape[:d]``), e.g. per expert -- identical
    to calling this on each sub-tensor. Raises on empty, non-finite or all-zero (sub-)tensors.
    """
    _check_float(w, "weight")
    if not 0 <= leading_dims < max(w.ndim, 1):
        raise ValueError(f"leading_dims={leading_dims} must be in [0, {w.ndim})")
    if w.numel() == 0:
        raise ValueError(f"cannot take a global scale of an empty tensor {tuple(w.shape)}")
    if not torch.isfinite(w).all():
        raise ValueError("weight contains Inf or NaN")
    amax = w.abs().reshape(*w.shape[:leading_dims], -1).amax(dim=-1).float()
    if (amax == 0).any():
        raise ValueError("all-zero tensor: NVFP4 global scale would be 0 (ModelOpt yields NaN)")
    return amax / (E2M1_MAX * E4M3_MAX)


def nvfp4_block_scale(x: torch.Tensor, global_scale) -> torch.Tensor:
    """Block scales ``[..., K/16]`` float8_e4m3fn for ``x[..., K]`` (zero rule and clamp applied).

    ``global_scale``: float, 0-dim tensor, or a tensor shaped like a prefix of ``x.shape[:-1]``.
    """
    _check_float(x, "input")
    _check_blocks(x.shape[-1], "nvfp4_block_scale")
    gs = _as_scale(global_scale, x, tuple(x.shape[:-1]), "global_scale")
    amax = x.reshape(*x.shape[:-1], -1, BLOCK_SIZE).abs().amax(dim=-1).float()
    s = amax / (E2M1_MAX * gs)
    s = torch.where(s == 0, torch.ones_like(s), s)
    return s.clamp(min=MIN_BLOCK_SCALE, max=E4M3_MAX).to(torch.float8_e4m3fn)


# ---- quantize / dequantize ----


def quantize_nvfp4(
    x: torch.Tensor, global_scale=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x[..., K]`` (K % 16 == 0) to NVFP4 exactly as ModelOpt does.

    Args:
        x: float32 / bfloat16 / float16, finite.
        global_scale: ``None`` -> ``weight_global_scale(x)`` (whole tensor); otherwise a float,
            0-dim tensor, or tensor shaped like a prefix of ``x.shape[:-1]`` (e.g. ``(E,)``).

    Returns:
        ``(packed uint8 [..., K/2], block_scale float8_e4m3fn [..., K/16], global_scale fp32)``.
    """
    _check_float(x, "input")
    if x.ndim == 0:
        raise ValueError("quantize_nvfp4: input must have at least one dim")
    _check_blocks(x.shape[-1], "quantize_nvfp4")
    if not torch.isfinite(x).all():
        raise ValueError("quantize_nvfp4: input contains Inf or NaN")
    if global_scale is None:
        global_scale = weight_global_scale(x)
    lead = tuple(x.shape[:-1])
    gs = _as_scale(global_scale, x, lead, "global_scale")  # aligned with (lead..., blocks)
    block_scale = nvfp4_block_scale(x, global_scale)
    xb = x.reshape(*lead, -1, BLOCK_SIZE)
    scaled = xb / (block_scale.float() * gs).unsqueeze(-1)
    packed = pack_fp4(quantize_e2m1(scaled.reshape(x.shape)))
    return packed, block_scale, torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)


def dequantize_nvfp4(
    packed: torch.Tensor, block_scale: torch.Tensor, global_scale, dtype=torch.float32
) -> torch.Tensor:
    """Inverse of :func:`quantize_nvfp4`: ``e2m1(code) * (float(block_scale) * global_scale)``.

    ``packed`` uint8 ``[..., K/2]``, ``block_scale`` float8_e4m3fn ``[..., K/16]`` (linear layout),
    ``global_scale`` float / 0-dim / prefix-of-leading-dims tensor. Returns ``[..., K]`` in
    ``dtype`` (computed in fp32).
    """
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be uint8, got {packed.dtype}")
    if block_scale.dtype != torch.float8_e4m3fn:
        raise TypeError(f"block_scale must be float8_e4m3fn, got {block_scale.dtype}")
    if packed.ndim == 0:
        raise ValueError("packed must have at least one dim")
    k = packed.shape[-1] * 2
    _check_blocks(k, "dequantize_nvfp4")
    want = (*packed.shape[:-1], k // BLOCK_SIZE)
    if tuple(block_scale.shape) != want:
        raise ValueError(
            f"block_scale shape {tuple(block_scale.shape)} does not match packed "
            f"{tuple(packed.shape)}: expected {want}"
        )
    if block_scale.device != packed.device:
        raise ValueError(f"block_scale on {block_scale.device}, packed on {packed.device}")
    lead = tuple(packed.shape[:-1])
    gs = _as_scale(global_scale, packed, lead, "global_scale")
    per_block = block_scale.float() * gs
    vals = E2M1_VALUES.to(packed.device)[unpack_fp4(packed).long()]
    out = vals.reshape(*lead, -1, BLOCK_SIZE) * per_block.unsqueeze(-1)
    return out.reshape(*lead, k).to(dtype)


def quantize_activation_nvfp4(x: torch.Tensor, input_scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize activations ``x[..., K]`` with a static (calibrated) ``input_scale``.

    Same math as :func:`quantize_nvfp4` with ``global_scale = input_scale``; values beyond the
    calibrated range saturate. Returns ``(packed uint8 [..., K/2], block_scale e4m3 [..., K/16])``.
    """
    packed, block_scale, _ = quantize_nvfp4(x, global_scale=input_scale)
    return packed, block_scale


def fake_quantize_activation(x: torch.Tensor, input_scale) -> torch.Tensor:
    """``dequantize(quantize_activation(x))`` in fp32, same shape as ``x`` (W4A4 emulation)."""
    packed, block_scale = quantize_activation_nvfp4(x, input_scale)
    return dequantize_nvfp4(packed, block_scale, input_scale)


# ---- 128x4 swizzled scale layout ----


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def swizzle_blockscale(scale: torch.Tensor) -> torch.Tensor:
    """Linear ``[..., N, C]`` block scales -> 128x4-swizzled ``[..., ceil128(N), ceil4(C)]``.

    Any 1-byte dtype (float8_e4m3fn or uint8); padding bytes are zero. Byte-identical to SGLang's
    and vLLM's ``swizzle_blockscale`` for 2-D and 3-D inputs.
    """
    if scale.element_size() != 1:
        raise TypeError(f"block scales must be a 1-byte dtype, got {scale.dtype}")
    if scale.ndim < 2:
        raise ValueError(f"block scales must be at least 2-D [..., N, C], got {tuple(scale.shape)}")
    *lead, n, c = scale.shape
    np_, cp = _round_up(n, 128), _round_up(c, 4)
    b = scale.reshape(-1, n, c).view(torch.uint8)
    padded = torch.zeros((b.shape[0], np_, cp), dtype=torch.uint8, device=scale.device)
    padded[:, :n, :c] = b
    sw = padded.reshape(-1, np_ // 128, 4, 32, cp // 4, 4).permute(0, 1, 4, 3, 2, 5)
    return sw.contiguous().reshape(*lead, np_, cp).view(scale.dtype)


def unswizzle_blockscale(scale_swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_blockscale`: ``[..., Np, Cp]`` -> linear ``[..., rows, cols]``."""
    if scale_swizzled.element_size() != 1:
        raise TypeError(f"block scales must be a 1-byte dtype, got {scale_swizzled.dtype}")
    if scale_swizzled.ndim < 2:
        raise ValueError(f"swizzled scales must be at least 2-D, got {tuple(scale_swizzled.shape)}")
    *lead, np_, cp = scale_swizzled.shape
    if rows < 0 or cols < 0 or (np_, cp) != (_round_up(rows, 128), _round_up(cols, 4)):
        raise ValueError(
            f"swizzled shape {(np_, cp)} does not fit rows={rows}, cols={cols}: expected "
            f"{(_round_up(rows, 128), _round_up(cols, 4))}"
        )
    b = scale_swizzled.reshape(-1, np_, cp).view(torch.uint8)
    lin = b.reshape(-1, np_ // 128, cp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5)
    lin = lin.reshape(-1, np_, cp)[:, :rows, :cols].contiguous()
    return lin.reshape(*lead, rows, cols).view(scale_swizzled.dtype)
