"""Triton kernel of the MoE block benchmark's router top-k (``bench/block.py``): one launch where
torch needs about ten, as SGLang's fused gate kernel (``moe_fused_gate``) is one, so the block's
non-MoE share is not a torch artefact. Its twin is ``MoEBlock.route_torch``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _biased_topk(
    logits_ptr,
    bias_ptr,
    ids_ptr,
    w_ptr,
    E,
    E_LOCAL,
    scale,
    TOP_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
):
    """Token ``program_id``: sigmoid scores, the top ``TOP_K`` of score + bias (lowest id first
    among equals), their unbiased scores renormalised to sum ``scale``; ids of experts outside
    this rank's ``[0, E_LOCAL)`` are written as -1."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    ok = e < E
    s = tl.sigmoid(tl.load(logits_ptr + t * E + e, mask=ok, other=0.0).to(tl.float32))
    key = tl.where(ok, s + tl.load(bias_ptr + e, mask=ok, other=0.0), float("-inf"))
    k = tl.arange(0, TOP_K)
    ids = tl.zeros([TOP_K], tl.int32)
    ws = tl.zeros([TOP_K], tl.float32)
    for j in tl.static_range(TOP_K):
        m = tl.max(key, 0)
        i = tl.min(tl.where(key == m, e, BLOCK_E), 0)
        ids = tl.where(k == j, i, ids)
        ws = tl.where(k == j, tl.sum(tl.where(e == i, s, 0.0), 0), ws)
        key = tl.where(e == i, float("-inf"), key)
    ws = ws * (scale / tl.sum(ws, 0))
    tl.store(ids_ptr + t * TOP_K + k, tl.where(ids < E_LOCAL, ids, -1))
    tl.store(w_ptr + t * TOP_K + k, ws)
