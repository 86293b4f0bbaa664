"""Load-time preparation of NVFP4 expert weights into the layout the decode kernels read.

One NVFP4 matrix per projection and expert, ``(N, K)`` logical, becomes a :class:`KernelMatrix`
(all tensors contiguous, ``E`` experts, ``Np`` = N rounded up to :data:`ROW_ALIGN`, ``Kp`` = K
rounded up to :data:`K_CHUNK`):

=========  ===========================  ============================================================
field      shape, dtype                 meaning
=========  ===========================  ============================================================
``q``      (E, Np, Kp/2) uint8          FP4 codes, K-contiguous, nibble order permuted per K chunk
``scale``  (E, Kp/256, Np, 16) uint8    block-scale codes (below), chunk-major: 16 per row and chunk
``alpha``  (E, Np) float32              per-row fp32 global scale (``scale_2``); 0 on padding rows
=========  ===========================  ============================================================

**K chunks.** K is cut into chunks of 256 elements (128 packed bytes, 16 block scales). Within
chunk ``c`` of a row, byte ``i`` (0 <= i < 128) holds element ``256c + i`` in its low nibble and
element ``256c + 128 + i`` in its high nibble (the checkpoint holds ``2i``/``2i+1``). A kernel
therefore decodes the low nibbles of a chunk into one contiguous 128-wide K slice and the high
nibbles into the next, with no interleave shuffle: it dots them against activation columns
``[256c, 256c+128)`` and ``[256c+128, 256c+256)``. Scale byte ``j`` of the chunk's 16 covers
elements ``256c + 16j .. 256c + 16j + 15`` (unchanged ModelOpt semantics), so bytes 0-7 scale the
low nibbles (low-nibble byte ``i`` -> scale ``i // 16``) and bytes 8-15 the high nibbles.
Scales are stored chunk-major so that a tile of rows reads one contiguous ``rows * 16``-byte run.

**Scale codes.** Each e4m3 block scale is re-encoded at load time as one byte ``c = (E + 10) << 3
| m`` for the value ``2^E * (1 + m/8)`` (``E`` in -9..8: e4m3's subnormals ``j * 2^-9`` are
normalised, every one fits 3 mantissa bits), and ``c = 0`` for a zero scale. A kernel turns a code
into the scale times 2^100 with one integer multiply-add, ``bits = c * 16 + SCALE_CODE_BF16_BIAS``
as bf16 (or the same bits shifted left by 16 as fp32): exact, with no special case for subnormal
e4m3, where decoding e4m3 bits directly costs ~6 instructions per scale (sm_90 SASS). For a
normal e4m3 byte ``b`` the code is ``b + 24``. Code 0 decodes to a non-zero number, so the codes
of a zero-scale block are zeroed (the block's weights are 0 either way). Negative and NaN scales
are rejected: ModelOpt's block scales are ``amax / 6`` over a positive global scale.

**Padding.** Rows ``N..Np`` and columns ``K..Kp`` are zero codes with zero scales and zero alpha:
they contribute exactly 0, so kernels need no masks on weight loads. Every tile height up to
``ROW_ALIGN`` (a power of two) divides ``Np``, and the layout is the same for every kernel config.

**Gate/up (w13).** Row ``2j`` of the prepared ``w13`` is gate row ``j`` and row ``2j + 1`` is up row
``j`` (j < I), so any even tile of rows yields matching gate and up outputs for the fused SiLU·mul;
``alpha`` carries the gate or up global scale per row.

Values are exact: dequantised weight ``= e2m1(code) * e4m3(scale) * alpha``, the same numbers as
``MoEWeights.dequantize`` (ModelOpt's rule). :func:`dequantize_kernel_matrix` is the torch twin
that reads this layout back; :func:`unprepare_matrix` inverts the preparation bit-exactly (up to
the codes of zero-scale blocks, which come back as 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "K_CHUNK",
    "ROW_ALIGN",
    "KernelMatrix",
    "prepare_matrix",
    "unprepare_matrix",
    "prepare_w13",
    "prepare_w2",
    "unprepare_w13",
    "dequantize_kernel_matrix",
    "E2M1_VALUES",
    "SCALE_CODE_BF16_BIAS",
    "e4m3_to_scale_code",
    "scale_code_to_e4m3",
    "scale_code_values",
    "mma_k_order",
    "to_mma_k_order",
]

#: Elements of K per chunk: 128 packed bytes and 16 block-scale codes per row.
K_CHUNK = 256
#: Rows are padded to a multiple of this; every kernel tile height (<= ROW_ALIGN) divides it.
ROW_ALIGN = 128

#: Value of each 4-bit E2M1 code (bit 3 = sign).
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


#: bf16 bits of (scale * 2^100) = code * 16 + this: exponent field (E + 10) + 217 = E + 100 + 127.
SCALE_CODE_BF16_BIAS = 217 << 7


def _e4m3_code_table() -> list[int]:
    """Scale code of every e4m3fn byte; -1 where the byte is not a valid block scale."""
    table = []
    for b in range(256):
        ef, mm = (b >> 3) & 0xF, b & 7
        if b & 0x80 or b == 0x7F:  # negative (or -0) or NaN
            table.append(0 if b == 0x80 else -1)
        elif ef:  # normal: 2^(ef-7) * (1 + mm/8)
            table.append(b + 24)
        elif mm:  # subnormal mm * 2^-9, normalised: 2^E (1 + m/8)
            E = mm.bit_length() - 1 - 9
            m = (mm << (3 - (mm.bit_length() - 1))) & 7
            table.append((E + 10) << 3 | m)
        else:
            table.append(0)
    return table


_CODE_OF_E4M3 = _e4m3_code_table()
_E4M3_OF_CODE = [0] * 256
for _b, _c in enumerate(_CODE_OF_E4M3):
    if _c > 0 or _b == 0:
        _E4M3_OF_CODE[_c] = _b


def e4m3_to_scale_code(s: torch.Tensor, what: str = "block scale") -> torch.Tensor:
    """e4m3fn block scales (or their uint8 bytes) -> scale codes (module docstring), uint8.

    Raises ValueError naming ``what`` and the first offending index for a negative or NaN scale.
    (-0 is taken as 0.)
    """
    b = _as_bytes(s)
    lut = torch.tensor(_CODE_OF_E4M3, dtype=torch.int16, device=b.device)
    c = lut[b.long()]
    bad = c < 0
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        v = float(b[idx].view(torch.float8_e4m3fn).float())
        raise ValueError(
            f"{what}: scale {v} (byte 0x{int(b[idx]):02x}) at index {idx} is negative or NaN; "
            "NVFP4 block scales must be finite and >= 0"
        )
    return c.to(torch.uint8)


def scale_code_to_e4m3(c: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`e4m3_to_scale_code` (on its image): codes -> float8_e4m3fn."""
    lut = torch.tensor(_E4M3_OF_CODE, dtype=torch.uint8, device=c.device)
    return lut[c.long()].view(torch.float8_e4m3fn)


def scale_code_values(c: torch.Tensor) -> torch.Tensor:
    """Torch twin of the kernels' scale decode: codes -> float32 scale values (exact).

    Reproduces the kernels' bits, ``(c * 16 + SCALE_CODE_BF16_BIAS) << 16`` as fp32 = scale *
    2^100, and undoes the 2^100; code 0 (a zero scale) gives 0, where a kernel gets a finite
    number times zeroed weight codes.
    """
    bits = (c.to(torch.int32) * 16 + SCALE_CODE_BF16_BIAS) << 16
    v = bits.view(torch.float32) * 2.0**-100
    return torch.where(c == 0, torch.zeros_like(v), v)


def mma_k_order() -> torch.Tensor:
    """(128,) int64: the K order of the Gluon kernels' ``mma`` operands within each 128-wide K
    block. Position ``s = 16b + 8c1 + 2q + c0`` (k-step ``b`` of 8, k-slot ``8c1 + 2q + c0`` of
    an m16n8k16 fragment) holds element ``32q + 4b + 2c1 + c0``: thread ``q`` of a fragment then
    reads 32 contiguous code bytes of a row (``decode._gluon_kernels``). Activations that reach an
    ``mma`` through shared memory are stored in this order (``to_mma_k_order``)."""
    s = torch.arange(128)
    b, c1, q, c0 = s // 16, (s // 8) % 2, (s // 2) % 4, s % 2
    return 32 * q + 4 * b + 2 * c1 + c0


def to_mma_k_order(x: torch.Tensor) -> torch.Tensor:
    """Torch twin of ``prefill._dot_kernels._permute_k``: ``(..., K)`` with K a multiple of 128 ->
    the same values with each 128-wide block in :func:`mma_k_order`."""
    K = x.shape[-1]
    _check(K % 128 == 0, f"to_mma_k_order: K must be a multiple of 128, got {K}")
    idx = (torch.arange(0, K, 128)[:, None] + mma_k_order()[None, :]).reshape(-1).to(x.device)
    return x.index_select(-1, idx)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


@dataclass(frozen=True, eq=False)
class KernelMatrix:
    """One projection's weights for all experts, in the kernel layout (module docstring)."""

    q: torch.Tensor
    scale: torch.Tensor
    alpha: torch.Tensor
    n: int  # logical rows N
    k: int  # logical columns K

    @property
    def num_experts(self) -> int:
        return self.q.shape[0]

    @property
    def n_pad(self) -> int:
        return self.q.shape[1]

    @property
    def k_pad(self) -> int:
        return self.q.shape[2] * 2

    def nbytes_per_expert(self) -> int:
        """Bytes a kernel streams per expert (codes + scales + alpha), padding included."""
        per = self.q[0].numel() + self.scale[0].numel() + self.alpha[0].numel() * 4
        return int(per)

    def to(self, device) -> KernelMatrix:
        return KernelMatrix(
            self.q.to(device), self.scale.to(device), self.alpha.to(device), self.n, self.k
        )


def prepare_matrix(
    q: torch.Tensor, scale: torch.Tensor, alpha: torch.Tensor, name: str = "scale"
) -> KernelMatrix:
    """Checkpoint layout -> kernel layout, for one projection of all experts.

    Args:
        q: (E, N, K/2) uint8, ModelOpt packing (element ``2i`` in the low nibble of byte ``i``).
        scale: (E, N, K/16) float8_e4m3fn (or its uint8 bytes), row-major block scales.
        alpha: (E, N) float32 per-row global scale.
        name: what errors about ``scale``'s values call it (e.g. SGLang's parameter name).
    """
    _check(
        q.dim() == 3 and q.dtype == torch.uint8,
        f"q must be (E, N, K/2) uint8, got {tuple(q.shape)} {q.dtype}",
    )
    E, N, K2 = q.shape
    _check(
        tuple(scale.shape) == (E, N, 2 * K2 // 16),
        f"scale must be (E, N, K/16)={(E, N, 2 * K2 // 16)}, got {tuple(scale.shape)}",
    )
    return _prepare(q, e4m3_to_scale_code(scale, name), alpha)


def _prepare(q: torch.Tensor, sc: torch.Tensor, alpha: torch.Tensor) -> KernelMatrix:
    """:func:`prepare_matrix` on scale codes ``sc`` (E, N, K/16) uint8 (shapes checked there)."""
    E, N, K2 = q.shape
    K = 2 * K2
    _check(K % 16 == 0, f"K={K} must be a multiple of 16 (NVFP4 block size)")
    _check(tuple(alpha.shape) == (E, N), f"alpha must be (E, N)={(E, N)}, got {tuple(alpha.shape)}")
    Np, Kp = _round_up(N, ROW_ALIGN), _round_up(K, K_CHUNK)
    nc = Kp // K_CHUNK
    dev = q.device

    # A zero scale has no code that decodes to 0: zero its block's weight codes instead (exact).
    q = q.reshape(E, N, K // 16, 8).masked_fill((sc == 0)[..., None], 0).view(E, N, K2)
    codes = torch.zeros(E, Np, Kp, dtype=torch.uint8, device=dev)
    codes[:, :N, 0:K:2] = q & 0xF
    codes[:, :N, 1:K:2] = q >> 4
    codes = codes.view(E, Np, nc, 2, K_CHUNK // 2)  # [.., chunk, half, i]
    qk = (codes[:, :, :, 0, :] | (codes[:, :, :, 1, :] << 4)).reshape(E, Np, Kp // 2)

    sk = torch.zeros(E, Np, Kp // 16, dtype=torch.uint8, device=dev)
    sk[:, :N, : K // 16] = sc
    sk = sk.view(E, Np, nc, 16).permute(0, 2, 1, 3).contiguous()

    ak = torch.zeros(E, Np, dtype=torch.float32, device=dev)
    ak[:, :N] = alpha.to(torch.float32)
    return KernelMatrix(qk.contiguous(), sk, ak, N, K)


def unprepare_matrix(m: KernelMatrix) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`prepare_matrix`: (q uint8, scale float8_e4m3fn, alpha float32)."""
    E, Np, Kp2 = m.q.shape
    Kp, nc = Kp2 * 2, Kp2 * 2 // K_CHUNK
    b = m.q.view(E, Np, nc, K_CHUNK // 2)
    codes = torch.stack([b & 0xF, b >> 4], dim=3).reshape(E, Np, Kp)  # checkpoint element order
    codes = codes[:, : m.n, : m.k]
    q = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
    s = m.scale.permute(0, 2, 1, 3).reshape(E, Np, Kp // 16)[:, : m.n, : m.k // 16]
    return q, scale_code_to_e4m3(s.contiguous()), m.alpha[:, : m.n].contiguous()


def prepare_w13(
    w13: torch.Tensor, w13_scale: torch.Tensor, w13_scale_2: torch.Tensor
) -> KernelMatrix:
    """SGLang's stacked ``[gate; up]`` w13 -> kernel layout with gate/up rows interleaved.

    ``w13`` (E, 2I, H/2) uint8, ``w13_scale`` (E, 2I, H/16) e4m3, ``w13_scale_2`` (E, 2) fp32.
    """
    _check(
        w13.dim() == 3 and w13.shape[1] % 2 == 0,
        f"w13 must be (E, 2I, H/2), got {tuple(w13.shape)}",
    )
    E, I2 = w13.shape[:2]
    I = I2 // 2
    _check(
        tuple(w13_scale_2.shape) == (E, 2),
        f"w13_scale_2 must be (E, 2), got {tuple(w13_scale_2.shape)}",
    )

    def inter(t):  # [E, 2I, ...] gate rows then up rows -> rows g0 u0 g1 u1 ...
        return torch.stack([t[:, :I], t[:, I:]], dim=2).reshape(t.shape)

    _check(
        tuple(w13_scale.shape) == (E, I2, 2 * w13.shape[2] // 16),
        f"w13_scale must be (E, 2I, H/16), got {tuple(w13_scale.shape)}",
    )
    # Codes before the interleave, so that an error's index is in SGLang's row order.
    codes = e4m3_to_scale_code(w13_scale, "w13_weight_scale")
    alpha = w13_scale_2.to(torch.float32)[:, :, None].expand(E, 2, I).transpose(1, 2).reshape(E, I2)
    return _prepare(inter(w13), inter(codes), alpha)


def unprepare_w13(m: KernelMatrix) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`prepare_w13`: (w13, w13_scale, w13_scale_2) in SGLang's layout."""
    q, s, a = unprepare_matrix(m)

    def deinter(t):
        return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()

    return deinter(q), deinter(s), torch.stack([a[:, 0], a[:, 1]], dim=1)


def prepare_w2(w2: torch.Tensor, w2_scale: torch.Tensor, w2_scale_2: torch.Tensor) -> KernelMatrix:
    """Down projection ``w2`` (E, H, I/2), ``w2_scale`` (E, H, I/16), ``w2_scale_2`` (E,)."""
    _check(w2.dim() == 3, f"w2 must be (E, H, I/2), got {tuple(w2.shape)}")
    E, H = w2.shape[:2]
    _check(
        tuple(w2_scale_2.shape) == (E,), f"w2_scale_2 must be (E,), got {tuple(w2_scale_2.shape)}"
    )
    alpha = w2_scale_2.to(torch.float32)[:, None].expand(E, H)
    return prepare_matrix(w2, w2_scale, alpha, "w2_weight_scale")


def dequantize_kernel_matrix(m: KernelMatrix) -> torch.Tensor:
    """Torch twin of the kernels' weight decode: (E, N, K) float32 read from the kernel layout."""
    E, Np, Kp2 = m.q.shape
    nc = Kp2 * 2 // K_CHUNK
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=m.q.device)
    b = m.q.view(E, Np, nc, K_CHUNK // 2).long()
    vals = torch.stack([lut[b & 0xF], lut[b >> 4]], dim=3)  # [E, Np, nc, half, 128]
    s = scale_code_values(m.scale).permute(0, 2, 1, 3)  # [E, Np, nc, 16]
    s = s.view(E, Np, nc, 2, 8).repeat_interleave(16, dim=4)  # per element of each half
    # ModelOpt's order: the fp32 product of the two scales first, then times the code.
    w = (vals * (s * m.alpha[:, :, None, None, None])).reshape(E, Np, nc * K_CHUNK)
    return w[:, : m.n, : m.k].contiguous()
