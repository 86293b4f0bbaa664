"""Public NVFP4 fused-MoE decode entry point: validate -> config -> workspaces -> 2 or 3 launches.

``fused_moe_nvfp4(hidden_states, weights, topk_ids, topk_weights)`` returns the routed (and fused
shared) experts' sum ``out[t] = sum_j topk_weights[t, j] * FFN_{topk_ids[t, j]}(x[t])`` as
``(T, H)`` bf16, the per-rank partial sum SGLang expects. Ids ``< 0`` (experts of another EP rank)
and ids ``>= E`` contribute nothing; a token with no local expert gets zeros. ``topk_weights`` is
used as given (SGLang already folded the routed scaling factor into it).

CUDA graphs: no host synchronisation, no allocation that depends on data, and a launch grid that
depends only on ``T``, ``top_k``, the shape and the config. Workspaces are cached per device and
grow only outside capture: call once per token count before capturing (SGLang's warm-up does).
The arrival counters are left at zero by every call. Workspaces are shared by all layers, so
calls must be ordered on one stream.

Weights come as ``prepared.PreparedMoEWeights`` (shared with the prefill path); the config is
``decode_config.KernelConfig``. The torch twin is
``sglang_fp4ext.moe.reference.fused_moe_nvfp4_torch`` (fp32 on dequantised weights).
"""

from __future__ import annotations

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.config import config_for
from sglang_fp4ext.moe.decode_config import KernelConfig
from sglang_fp4ext.moe.fault_inject import corrupt_if_asked
from sglang_fp4ext.moe.layout import K_CHUNK
from sglang_fp4ext.moe.prepared import PreparedMoEWeights, validate_moe_inputs
from sglang_fp4ext.moe.shape import MoEShape, Target, current_target

__all__ = ["fused_moe_nvfp4", "launch_grids"]


# ---- workspaces (cached per device, grown only outside graph capture) ----

_WORKSPACES: dict[tuple[str, str], torch.Tensor] = {}
# Buffers replaced by a larger one stay alive: a CUDA graph captured earlier (SGLang captures the
# largest batch first, then warms up smaller ones eagerly) may still hold their addresses.
_RETIRED: list[torch.Tensor] = []


def _workspace(
    device: torch.device, name: str, numel: int, dtype: torch.dtype, zero: bool
) -> torch.Tensor:
    key = (str(device), name)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < numel or buf.dtype != dtype:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"fused_moe_nvfp4: workspace {name!r} must grow to {numel} elements during "
                "CUDA-graph capture; run the same token count once eagerly before capturing"
            )
        if buf is not None:
            _RETIRED.append(buf)
        alloc = torch.zeros if zero else torch.empty
        buf = alloc(max(numel, 1), dtype=dtype, device=device)
        _WORKSPACES[key] = buf
    return buf[:numel]


def clear_workspaces() -> None:
    """Drop the cached workspaces (tests; no captured graph may be replayed afterwards)."""
    _WORKSPACES.clear()
    _RETIRED.clear()

# ---- launch ----


def launch_grids(T: int, shape: MoEShape, cfg: KernelConfig, w: PreparedMoEWeights, family: str):
    """Static launch grids ((G1, NB1, SK1 * ST), (G2, cdiv(NB2, tiles2), SK2 * ST)) for ``T``
    tokens on ``family`` ("gluon" or "dot", the one that runs: no default, a dot launch on a
    Gluon grid would misread its K splits); ``ST`` = ``cfg.split_t`` on Gluon, 1 on dot."""
    P = T * shape.top_k
    slots = cfg.grid == "slots"
    st = cfg.split_t if family == "gluon" else 1
    nb2 = w.w2.n_pad // cfg.block_n2
    sk1 = 1 if family == "gluon" and cfg.kstack1 else cfg.split_k1  # its splits on one's warps
    g1 = (P if slots else shape.E, w.w13.n_pad // cfg.block_n1, sk1 * st)
    if cfg.gemm2 == "tokens":
        g2 = (T, nb2, 1)
    else:
        g2 = (P if slots else max(shape.E, T), -(-nb2 // cfg.tiles2), cfg.split_k2 * st)
    return g1, g2


def fused_moe_nvfp4(
    hidden_states: torch.Tensor,
    weights: PreparedMoEWeights,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: KernelConfig | None = None,
    target: Target | None = None,
) -> torch.Tensor:
    """NVFP4 W4A16 MoE decode. Args:

    hidden_states: (T, H) bf16; weights: :class:`PreparedMoEWeights` (E experts);
    topk_ids: (T, top_k) int32/int64 in [-1, E); topk_weights: (T, top_k) fp32/bf16/fp16;
    out: optional (T, H) bf16 destination; config: force a :class:`KernelConfig` (else
    :func:`config_for`); target: the GPU description for the config choice (default: this
    device). Always deterministic: the same inputs give bit-identical outputs. Returns ``out``.
    """
    validate_moe_inputs("fused_moe_nvfp4", hidden_states, weights, topk_ids, topk_weights, out)
    T, H = hidden_states.shape
    top_k = topk_ids.shape[1]
    dev = hidden_states.device
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    if T == 0:
        return out
    shape = weights.shape(top_k)
    if config is None:
        config = config_for(
            T, shape, target or (current_target(dev) if dev.type == "cuda" else None)
        )
    w13, w2 = weights.w13, weights.w2
    E, I = shape.E, shape.I
    P = T * top_k
    # The interpreter runs only the tl.dot family: a Gluon config runs its tiles there.
    family = "gluon" if config.kernels == "gluon" and not target_info.is_interpreter() else "dot"
    (g1, g2) = launch_grids(T, shape, config, weights, family)
    kc1, kc2 = w13.k_pad // K_CHUNK, w2.k_pad // K_CHUNK
    cps1, cps2 = -(-kc1 // config.split_k1), -(-kc2 // config.split_k2)
    kstack1 = family == "gluon" and config.kstack1
    if kstack1 and kc1 % config.split_k1:
        raise ValueError(
            f"fused_moe_nvfp4: KernelConfig.kstack1=1 needs GEMM1's {kc1} K chunks of "
            f"{K_CHUNK} (H={H}) to divide into split_k1={config.split_k1} equal splits"
        )

    inter = _workspace(dev, "inter", P * I, torch.bfloat16, zero=False)
    ws1 = _workspace(
        dev,
        "ws1",
        config.split_k1 * P * w13.n_pad if config.split_k1 > 1 and not kstack1 else 1,
        torch.float32,
        zero=False,
    )
    cnt1 = _workspace(dev, "cnt1", g1[0] * g1[1], torch.int32, zero=True)
    pairs2 = config.gemm2 == "pairs"
    ws2 = _workspace(
        dev, "ws2", P * config.split_k2 * w2.n_pad if pairs2 else 1, torch.float32, zero=False
    )
    nb2 = w2.n_pad // config.block_n2
    cnt2 = _workspace(dev, "cnt2", T * nb2, torch.int32, zero=True)
    # Routing lists: GEMM1 writes every entry GEMM2 reads, so no clearing is needed.
    plist = _workspace(dev, "plist", E * P, torch.int32, zero=False)
    pcnt = _workspace(dev, "pcnt", E, torch.int32, zero=False)

    pdl = _pdl(family, config, dev)
    gemm1, extra1 = _kernel(family, "gemm1", config.block_n1, config, config.warps1,
                            config.stages1, pdl)
    role2 = "gemm2_tok" if config.gemm2 == "tokens" else "gemm2"
    gemm2, extra2 = _kernel(family, role2, config.block_n2, config, config.warps2,
                            config.stages2, pdl, top_k)
    gemm1[g1](
        hidden_states,
        topk_ids,
        w13.q,
        w13.scale,
        w13.alpha,
        inter,
        ws1,
        cnt1,
        plist,
        pcnt,
        P,
        E,
        H,
        I,
        w13.n_pad,
        hidden_states.stride(0),
        w13.q.stride(0),
        w13.q.stride(1),
        w13.scale.stride(0),
        w13.scale.stride(1),
        kc1,
        cps1,
        top_k,
        config.split_k1,
        SLOT_MODE=config.grid == "slots",
        BN=config.block_n1,
        BLOCK_P=config.block_p,
        **extra1,
    )
    if config.gemm2 == "tokens":
        gemm2[g2](
            inter,
            topk_ids,
            topk_weights,
            w2.q,
            w2.scale,
            w2.alpha,
            out,
            T,
            E,
            H,
            I,
            w2.n_pad,
            out.stride(0),
            w2.q.stride(0),
            w2.q.stride(1),
            w2.scale.stride(0),
            w2.scale.stride(1),
            kc2,
            top_k,
            K_POW2=triton_next_pow2(top_k),
            BN=config.block_n2,
            **extra2,
        )
        corrupt_if_asked("decode", family, out)
        return out
    gemm2[g2](
        inter,
        topk_ids,
        topk_weights,
        w2.q,
        w2.scale,
        w2.alpha,
        out,
        ws2,
        cnt2,
        plist,
        pcnt,
        T,
        P,
        E,
        H,
        I,
        w2.n_pad,
        nb2,
        out.stride(0),
        w2.q.stride(0),
        w2.q.stride(1),
        w2.scale.stride(0),
        w2.scale.stride(1),
        kc2,
        cps2,
        top_k,
        config.split_k2,
        config.tiles2,
        K_POW2=triton_next_pow2(top_k),
        SLOT_MODE=config.grid == "slots",
        BN=config.block_n2,
        **extra2,
    )
    if family == "gluon" and config.combine == "kernel":  # (the token GEMM2 returned above)
        from sglang_fp4ext.moe import _decode_gluon_kernels as G

        G._combine[(T, -(-H // _COMBINE_BLOCK))](
            ws2, topk_ids, out, E, H, w2.n_pad, out.stride(0), top_k, config.split_k2,
            BLOCK=_COMBINE_BLOCK, num_warps=4, **_pdl_args(pdl),
        )
    corrupt_if_asked("decode", family, out)
    return out


_COMBINE_BLOCK = 1024
_PDL_DEVICE: dict[int, bool] = {}


def _pdl(family: str, cfg: KernelConfig, dev: torch.device) -> int:
    """The programmatic dependent launch this call's Gluon kernels run with: ``cfg.pdl`` on a GPU
    that has it (asked once per device), else 0."""
    if family != "gluon" or not cfg.pdl:
        return 0
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    if idx not in _PDL_DEVICE:
        _PDL_DEVICE[idx] = target_info.supports_pdl(target_info.device_capability(idx))
    return cfg.pdl if _PDL_DEVICE[idx] else 0


def _pdl_args(pdl: int) -> dict:
    """A PDL kernel's constexpr and Triton's launch option (the launch attribute)."""
    return dict(PDL=pdl, launch_pdl=True) if pdl else {}


#: Each family's kernel of each role (module ``_decode_<family>_kernels``).
_KERNELS = {
    "dot": {"gemm1": "_moe_gemm1", "gemm2_tok": "_moe_gemm2_tok", "gemm2": "_moe_gemm2"},
    "gluon": {"gemm1": "_gemm1", "gemm2_tok": "_gemm2_tok", "gemm2": "_gemm2"},
}


def _kernel(family: str, role: str, block_n: int, cfg: KernelConfig, warps: int, stages: int,
            pdl: int = 0, top_k: int = 1):
    """The kernel of ``role`` in ``family`` and its launch-only arguments (Triton is imported
    only when launching; ``BT`` included where the launch decides it); ``pdl``: Gluon with
    programmatic dependent launch (``_pdl``); ``top_k``: the call's, for the slot-parallel token
    GEMM2 (``cfg.slots2``). ``cfg.kstack1`` swaps GEMM1 for its split-stacked form."""
    if family == "gluon":
        from sglang_fp4ext.moe import _decode_gluon_kernels as G

        if role == "gemm2_tok" and cfg.slots2:
            # Up to 8 slots side by side, one MMA column each (BT = 8), in 1-2 rounds.
            sp = min(triton_next_pow2(top_k), 8)
            if sp * warps > 32:
                raise ValueError(
                    f"KernelConfig.slots2=1 with warps2={warps} runs {sp * warps} warps per "
                    f"program at top_k={top_k}: more than 32"
                )
            lay = G.layouts(sp * block_n, 8, sp * warps)
            extra = dict(num_warps=sp * warps, BT=8, **lay, **_pdl_args(pdl))
            return G._gemm2_tok_slots, extra
        if role == "gemm1" and cfg.kstack1:
            # The K splits stacked along the MMA rows, 8 columns shared by their pairs.
            ks = cfg.split_k1
            lay = G.layouts(ks * block_n, 8, ks * warps)
            extra = dict(num_warps=ks * warps, BT=8, KS=ks, **lay, **_pdl_args(pdl))
            return G._gemm1_kstack, extra
        lay = G.layouts(block_n, cfg.block_t, warps)
        extra = dict(num_warps=warps, BT=cfg.block_t, **lay, **_pdl_args(pdl))
        if role != "gemm2_tok":
            extra["SPLIT_T"] = cfg.split_t
        if role == "gemm1" and cfg.maxnreg1:
            extra["maxnreg"] = cfg.maxnreg1  # a launch option (Triton's), not a kernel argument
        if role == "gemm2":
            extra["COMBINE"] = cfg.combine == "counter"
        return getattr(G, _KERNELS[family][role]), extra
    from sglang_fp4ext.moe import _decode_dot_kernels as K

    interp = target_info.is_interpreter()
    extra = dict(COMPUTE_F32=interp, num_warps=warps, num_stages=stages, BT=cfg.block_t)
    return getattr(K, _KERNELS[family][role]), extra


def triton_next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
