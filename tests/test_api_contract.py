"""One contract for the Python API's ids and weights (CPU tier: the twin, and the Triton kernels
under the interpreter at small shapes).

* ``dispatch.fused_moe`` checks its weights' type first, then every shape, then the rest: an
  unprepared ``MoEWeights`` or a ``(T, 1)`` slice of the weights is named as such.
* An id ``< 0`` or ``>= E`` contributes nothing, in the torch twin as in both kernel families.
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4ext.moe import dispatch
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.prefill.launch import fused_moe_nvfp4_prefill
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.weights import random_moe_weights
from sglang_fp4ext.testing.compare import assert_close

DEV = "cuda" if torch.cuda.is_available() else "cpu"
E, H, I, K, T = 6, 256, 128, 3, 4


@pytest.fixture
def case(seed):
    g = torch.Generator().manual_seed(seed)
    w = random_moe_weights(E, H, I, generator=g)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32)
    tw = torch.rand(T, K, generator=g) + 0.1
    return w, x, ids, tw


def _out_of_range(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` with slots set to -1, E, E + 5 and -7, and the mask of those slots."""
    bad = ids.clone()
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for (t, j), v in zip([(0, 0), (1, 1), (2, 2), (3, 0)], [-1, E, E + 5, -7]):
        bad[t, j] = v
        mask[t, j] = True
    return bad, mask


def test_fused_moe_names_unprepared_weights(case):
    w, x, ids, tw = case
    with pytest.raises(TypeError, match="weights must be PreparedMoEWeights"):
        dispatch.fused_moe(x, w, ids, tw)


def test_fused_moe_reports_a_shape_mismatch_before_contiguity(case):
    w, x, ids, tw = case
    pw = PreparedMoEWeights.from_moe_weights(w)
    with pytest.raises(ValueError, match=r"topk_weights \(4, 1\) must both be \(T, top_k\)"):
        dispatch.fused_moe(x, pw, ids, tw[:, :1])
    with pytest.raises(ValueError, match="topk_ids must be 2-D"):
        dispatch.fused_moe(x, pw, ids[:, 0], tw)
    with pytest.raises(ValueError, match="topk_weights must be contiguous"):
        dispatch.fused_moe(x, pw, ids, tw.t().contiguous().t())


def test_twin_ids_out_of_range_contribute_nothing(case):
    w, x, ids, tw = case
    bad, mask = _out_of_range(ids)
    # The same slots with weight 0 on a valid expert are what "contribute nothing" means.
    want = fused_moe_nvfp4_torch(x, w, torch.where(mask, 0, ids), torch.where(mask, 0.0, tw))
    got = fused_moe_nvfp4_torch(x, w, bad, tw)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # fp32 row grouping may differ
    assert not torch.equal(got, fused_moe_nvfp4_torch(x, w, ids, tw))  # the slots mattered


@pytest.mark.parametrize("family", ["decode", "prefill"])
def test_kernels_agree_with_the_twin_on_ids_out_of_range(case, family):
    w, x, ids, tw = case
    bad, _ = _out_of_range(ids)
    pw = PreparedMoEWeights.from_moe_weights(w).to(DEV)
    run = fused_moe_nvfp4 if family == "decode" else fused_moe_nvfp4_prefill
    got = run(x.to(DEV), pw, bad.to(DEV), tw.to(DEV))
    ref = fused_moe_nvfp4_torch(x, w, bad, tw)
    assert_close(got.float().cpu(), ref, max_rel=1e-2, rms_rel=5e-3, what=family)
