"""The launch plan of one NVFP4 decode call: the workspaces (cached per device) and the 2-3
:class:`~sglang_fp4ext.moe.launch.Launch` records of GEMM1, GEMM2 and, with ``combine="kernel"``,
the combine, or the one cooperative launch of the one-launch family (``decode.launch`` runs
them; the AOT tests compile exactly what it plans).

Workspaces are cached per device and grow only outside graph capture: call once per token count
before capturing (SGLang's warm-up does). The arrival counters are left at zero by every call.
They are shared by all layers, so calls must be ordered on one stream.
"""

from __future__ import annotations

import torch

from sglang_fp4ext import target_info
from sglang_fp4ext.moe.decode.config import CoopDecodeConfig, DecodeConfig
from sglang_fp4ext.moe.launch import Launch
from sglang_fp4ext.moe.layout import K_CHUNK
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.shape import MoEShape, Target

__all__ = ["clear_workspaces", "coop_grid", "launch_grids", "plan"]


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


# ---- launches ----


def launch_grids(T: int, shape: MoEShape, cfg: DecodeConfig, w: PreparedMoEWeights, family: str):
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


def plan(
    x,
    w: PreparedMoEWeights,
    ids,
    tw,
    out,
    config: DecodeConfig,
    family: str,
    pdl: int = 0,
    target: Target | None = None,
    programs: int | None = None,
) -> list[Launch]:
    """The 2-3 launches of one call (GEMM1; the token GEMM2, or the pairs GEMM2 and, with
    ``combine="kernel"``, its combine) with the workspaces they share, as data, or the one launch
    of the one-launch family. ``family``: the one that runs (:func:`launch_family`; a Gluon config
    runs its tiles on the dot family there); ``pdl``: the programmatic dependent launch the Gluon
    kernels run with (0 without); ``target``: the GPU a one-launch grid is sized for, and
    ``programs`` a smaller grid than :func:`coop_grid`'s (tests)."""
    if family == "coop":
        return [_coop_launch(x, w, ids, tw, out, config, target, programs)]
    if family != config.kernels:
        config = config.reform(kernels=family)
    T, H = x.shape
    top_k = ids.shape[1]
    shape = w.shape(top_k)
    P = T * top_k
    g1, g2 = launch_grids(T, shape, config, w, family)
    kstack1 = family == "gluon" and config.kstack1
    if kstack1:
        _check_stacked_splits(w, config, "GluonDecodeConfig.kstack1=1", H)
    dev = x.device
    pairs2 = config.gemm2 == "pairs"
    nb2 = w.w2.n_pad // config.block_n2
    ws1_numel = config.split_k1 * P * w.w13.n_pad if config.split_k1 > 1 and not kstack1 else 1
    ws = dict(
        inter_ptr=_workspace(dev, "inter", P * shape.I, torch.bfloat16, zero=False),
        ws1=_workspace(dev, "ws1", ws1_numel, torch.float32, zero=False),
        cnt1=_workspace(dev, "cnt1", g1[0] * g1[1], torch.int32, zero=True),
        ws2=_workspace(
            dev, "ws2", P * config.split_k2 * w.w2.n_pad if pairs2 else 1, torch.float32, zero=False
        ),
        cnt2=_workspace(dev, "cnt2", T * nb2, torch.int32, zero=True),
        # Routing lists: GEMM1 writes every entry GEMM2 reads, so no clearing is needed.
        plist_ptr=_workspace(dev, "plist", shape.E * P, torch.int32, zero=False),
        pcnt_ptr=_workspace(dev, "pcnt", shape.E, torch.int32, zero=False),
    )
    dims = dict(E=shape.E, H=H, I=shape.I, TOP_K=top_k)
    gemm1 = _launch(family, "gemm1", config, g1, pdl, top_k, dict(
        x_ptr=x, ids_ptr=ids, inter_ptr=ws["inter_ptr"], ws_ptr=ws["ws1"], cnt_ptr=ws["cnt1"],
        plist_ptr=ws["plist_ptr"], pcnt_ptr=ws["pcnt_ptr"], P=P, stride_x=x.stride(0),
        **_matrix(w.w13, config.split_k1), SPLIT_K=config.split_k1,
        SLOT_MODE=config.grid == "slots", BN=config.block_n1, BLOCK_P=config.block_p, **dims,
    ))  # fmt: skip
    common2 = dict(inter_ptr=ws["inter_ptr"], ids_ptr=ids, tw_ptr=tw, out_ptr=out, T=T,
                   stride_out=out.stride(0), K_POW2=triton_next_pow2(top_k),
                   BN=config.block_n2, **dims)  # fmt: skip
    if not pairs2:
        tok = _matrix(w.w2, 1)
        del tok["CPS"]
        return [gemm1, _launch(family, "gemm2_tok", config, g2, pdl, top_k, dict(**common2, **tok))]
    gemm2 = _launch(family, "gemm2", config, g2, pdl, top_k, dict(
        **common2, ws_ptr=ws["ws2"], cnt_ptr=ws["cnt2"], plist_ptr=ws["plist_ptr"],
        pcnt_ptr=ws["pcnt_ptr"], P=P, NB=nb2, **_matrix(w.w2, config.split_k2),
        SPLIT_K=config.split_k2, NT=config.tiles2, SLOT_MODE=config.grid == "slots",
    ))  # fmt: skip
    if not (family == "gluon" and config.combine == "kernel"):
        return [gemm1, gemm2]
    combine = Launch(
        _GLUON, "_combine", (T, -(-H // _COMBINE_BLOCK)),
        kwargs=dict(ws_ptr=ws["ws2"], ids_ptr=ids, out_ptr=out, E=shape.E, H=H, NP=w.w2.n_pad,
                    stride_out=out.stride(0), TOP_K=top_k, SPLIT_K=config.split_k2,
                    BLOCK=_COMBINE_BLOCK, PDL=pdl),
        options=dict(num_warps=4, **_pdl_options(pdl)),
    )  # fmt: skip
    return [gemm1, gemm2, combine]


def _check_stacked_splits(w: PreparedMoEWeights, cfg: DecodeConfig, form: str, H: int) -> None:
    """GEMM1's K splits stacked on one program's warps must be equal (the self-check runs such a
    config at ``config.check_hidden``)."""
    kc1 = w.w13.k_pad // K_CHUNK
    if kc1 % cfg.split_k1:
        raise ValueError(
            f"fused_moe_nvfp4: {form} needs GEMM1's {kc1} K chunks of {K_CHUNK} (H={H}) to "
            f"divide into split_k1={cfg.split_k1} equal splits"
        )


def coop_grid(
    T: int, shape: MoEShape, cfg: CoopDecodeConfig, w: PreparedMoEWeights, target: Target
) -> tuple[int, int]:
    """(programs, register cap) of a one-launch call: one program an SM, fewer where there are
    fewer work items (GEMM1's slots x row tiles, GEMM2's tokens x row tiles); the cap keeps a
    program within an SM's 64 K registers, so that the driver can make the grid co-resident."""
    items = max(T * shape.top_k * (w.w13.n_pad // cfg.block_n1), T * (w.w2.n_pad // cfg.block_n2))
    return min(target.num_sms, items), min(255, 65536 // (cfg.warps * 32)) // 8 * 8


def _coop_launch(x, w, ids, tw, out, cfg: CoopDecodeConfig, target, programs) -> Launch:
    from sglang_fp4ext.moe.decode import _gluon_kernels as G  # the layouts are Gluon objects
    from sglang_fp4ext.moe.shape import current_target

    T, H = x.shape
    top_k = ids.shape[1]
    shape = w.shape(top_k)
    P = T * top_k
    k_pow2 = triton_next_pow2(top_k)
    _check_stacked_splits(w, cfg, "CoopDecodeConfig", H)
    sp = min(k_pow2, 8)
    if sp * cfg.block_n2 < 16 * cfg.warps:
        raise ValueError(
            f"fused_moe_nvfp4: CoopDecodeConfig at top_k={top_k} decodes {sp} slots of "
            f"block_n2={cfg.block_n2} rows on {cfg.warps} warps: fewer than 16 rows a warp"
        )
    grid, maxnreg = coop_grid(T, shape, cfg, w, target or current_target(x.device))
    if programs is not None:
        grid = min(grid, programs)
    dev = x.device
    l1, l2 = (
        G.layouts(cfg.split_k1 * cfg.block_n1, 8, cfg.warps),
        G.layouts(sp * cfg.block_n2, 8, cfg.warps),
    )
    m1, m2 = _matrix(w.w13, cfg.split_k1), _matrix(w.w2, 1)
    args = dict(
        x_ptr=x, ids_ptr=ids, tw_ptr=tw, out_ptr=out,
        inter_ptr=_workspace(dev, "inter", P * shape.I, torch.bfloat16, zero=False),
        plist_ptr=_workspace(dev, "plist", shape.E * P, torch.int32, zero=False),
        pcnt_ptr=_workspace(dev, "pcnt", shape.E, torch.int32, zero=False),
        bar_ptr=_workspace(dev, "grid_bar", 2, torch.int32, zero=True),
        q1_ptr=m1["q_ptr"], s1_ptr=m1["s_ptr"], a1_ptr=m1["a_ptr"],
        q2_ptr=m2["q_ptr"], s2_ptr=m2["s_ptr"], a2_ptr=m2["a_ptr"],
        T=T, P=P, E=shape.E, H=H, I=shape.I, NP1=m1["NP"], NP2=m2["NP"],
        NB1=w.w13.n_pad // cfg.block_n1, NB2=w.w2.n_pad // cfg.block_n2,
        stride_x=x.stride(0), stride_out=out.stride(0),
        q1_e_stride=m1["q_e_stride"], q1_row_stride=m1["q_row_stride"],
        s1_e_stride=m1["s_e_stride"], s1_chunk_stride=m1["s_chunk_stride"],
        q2_e_stride=m2["q_e_stride"], q2_row_stride=m2["q_row_stride"],
        s2_e_stride=m2["s_e_stride"], s2_chunk_stride=m2["s_chunk_stride"],
        KC2=m2["KC"], CPS1=m1["CPS"], TOP_K=top_k, K_POW2=k_pow2, BN1=cfg.block_n1,
        BN2=cfg.block_n2, BLOCK_P=cfg.block_p, KS=cfg.split_k1, PF2=cfg.prefetch2,
        WL1=l1["WL"], XL1=l1["XL"], ML1=l1["ML"], WL2=l2["WL"], XL2=l2["XL"], ML2=l2["ML"],
    )  # fmt: skip
    options = dict(num_warps=cfg.warps, maxnreg=maxnreg, launch_cooperative_grid=True)
    return Launch(_COOP, "_coop", (grid,), kwargs=args, options=options)


def _matrix(m, split_k: int) -> dict:
    """One weight matrix's kernel arguments (codes, scale codes, alphas, their strides, the K
    chunks and the chunks per split)."""
    kc = m.k_pad // K_CHUNK
    return dict(q_ptr=m.q, s_ptr=m.scale, a_ptr=m.alpha, NP=m.n_pad, q_e_stride=m.q.stride(0),
                q_row_stride=m.q.stride(1), s_e_stride=m.scale.stride(0),
                s_chunk_stride=m.scale.stride(1), KC=kc, CPS=-(-kc // split_k))  # fmt: skip


_COMBINE_BLOCK = 1024
_DOT = "decode._dot_kernels"
_GLUON = "decode._gluon_kernels"
_COOP = "decode._coop_kernels"
#: Each family's kernel of each role.
_KERNELS = {
    "dot": {"gemm1": "_moe_gemm1", "gemm2_tok": "_moe_gemm2_tok", "gemm2": "_moe_gemm2"},
    "gluon": {"gemm1": "_gemm1", "gemm2_tok": "_gemm2_tok", "gemm2": "_gemm2"},
}


def _pdl_options(pdl: int) -> dict:
    return dict(launch_pdl=True) if pdl else {}  # Triton's launch attribute


def _launch(
    family: str, role: str, cfg: DecodeConfig, grid, pdl: int, top_k: int, kwargs: dict
) -> Launch:
    """The launch of ``role`` in ``family`` with the arguments every family takes (``kwargs``),
    plus what this family and config add: ``BT``, the Gluon layouts, PDL, the forms that swap a
    kernel (``kstack1``: GEMM1 with its K splits stacked on one program's warps; ``slots2``: the
    token GEMM2 with a token's slots side by side) and the launch options."""
    gemm1 = role == "gemm1"
    warps = cfg.warps1 if gemm1 else cfg.warps2
    if family == "dot":
        stages = cfg.stages1 if gemm1 else cfg.stages2
        return Launch(_DOT, _KERNELS["dot"][role], grid,
                      kwargs=dict(kwargs, BT=cfg.block_t, COMPUTE_F32=target_info.is_interpreter()),
                      options=dict(num_warps=warps, num_stages=stages))  # fmt: skip
    from sglang_fp4ext.moe.decode import _gluon_kernels as G  # the layouts are Gluon objects

    block_n = cfg.block_n1 if gemm1 else cfg.block_n2
    kernel, rows, bt = _KERNELS["gluon"][role], 1, cfg.block_t
    extra = {}
    if role == "gemm2_tok" and cfg.slots2:
        # Up to 8 slots side by side, one MMA column each (BT = 8), in 1-2 rounds.
        kernel, rows, bt = "_gemm2_tok_slots", min(triton_next_pow2(top_k), 8), 8
        if rows * warps > 32:
            raise ValueError(
                f"GluonDecodeConfig.slots2=1 with warps2={warps} runs {rows * warps} warps per "
                f"program at top_k={top_k}: more than 32"
            )
    elif gemm1 and cfg.kstack1:
        # The K splits stacked along the MMA rows, 8 columns shared by their pairs.
        kernel, rows, bt = "_gemm1_kstack", cfg.split_k1, 8
        extra["KS"] = cfg.split_k1
    elif role != "gemm2_tok":
        extra["SPLIT_T"] = cfg.split_t
    if role == "gemm2":
        extra["COMBINE"] = cfg.combine == "counter"
    options = dict(num_warps=rows * warps, **_pdl_options(pdl))
    if gemm1 and cfg.maxnreg1:
        options["maxnreg"] = cfg.maxnreg1
    return Launch(_GLUON, kernel, grid, kwargs=dict(
        kwargs, BT=bt, **G.layouts(rows * block_n, bt, rows * warps), **extra, PDL=pdl,
    ), options=options)  # fmt: skip


def triton_next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
