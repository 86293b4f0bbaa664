"""The MoE block benchmark (``bench/block.py``): GLM-5's block as SGLang runs it for NVIDIA's
checkpoints (router, routed NVFP4 experts, bf16 shared expert on the alternate stream).

CPU tier: the router's Triton top-k (under the interpreter) chooses and weighs exactly as its
torch twin and as SGLang 0.5.23's own torch top-k (``biased_grouped_topk_impl``, one group,
renormalised, scaled on the output); the block's
output matches the fp32 twin of the routed experts plus the shared expert with fp4ext's kernels
under the interpreter, on poisoned outputs, at TP and EP, and its check fails on a wrong routed
output; the shared expert's width is SGLang's (TP-sharded over the server's ``tp``); bytes and
verify sizes. Timing needs a GPU (``benchmarks/experiments/block_marlin.py``,
``benchmarks/test_moe_block.py``).
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.block import ROUTED_SCALING_FACTOR, MoEBlock, verify_of
from sglang_fp4ext.bench.layer import Layer

TINY_TP2 = model_shapes.ModelShape("tiny-tp2", 16, 4, 256, 512, 1, n_shared=1, tp=2)
TINY_EP2 = model_shapes.ModelShape("tiny-ep2", 16, 4, 256, 256, 1, n_shared=1, ep=2)


def _block(shape, seed):
    return MoEBlock(Layer(shape, 2, seed=seed, device="cpu", l2_bytes=0))


def test_router_is_sglangs_biased_top_k():
    from sglang.srt.layers.moe.topk import biased_grouped_topk_impl

    block = _block(TINY_TP2, 11)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(9, TINY_TP2.hidden, generator=g).to(torch.bfloat16)
    ids, tw = block.route(x, 1)
    logits = torch.nn.functional.linear(x, block.gate[1]).float()
    w_ref, ids_ref = biased_grouped_topk_impl(
        x, logits, block.bias[1], TINY_TP2.top_k, True, 1, 1,
        routed_scaling_factor=ROUTED_SCALING_FACTOR, apply_routed_scaling_factor_on_output=True,
    )  # fmt: skip
    assert ids.dtype == torch.int32 and tw.dtype == torch.float32
    for t in range(x.shape[0]):  # SGLang's top-k is unsorted: compare as id -> weight maps
        ours = dict(zip(ids[t].tolist(), tw[t].tolist()))
        ref = dict(zip(ids_ref[t].tolist(), w_ref[t].tolist()))
        assert ours.keys() == ref.keys()
        for e in ours:
            assert ours[e] == pytest.approx(ref[e], rel=1e-5)


@pytest.mark.parametrize("shape", [TINY_TP2, TINY_EP2], ids=lambda s: s.name)
def test_router_kernel_matches_its_torch_twin(shape):
    block = _block(shape, 21)
    x = torch.randn(33, shape.hidden, generator=torch.Generator().manual_seed(22))
    x = x.to(torch.bfloat16)
    ids, tw = block.route(x, 0)
    ids_t, tw_t = block.route_torch(x, 0)
    assert torch.equal(ids, ids_t)  # both lowest-score-last: the same order
    torch.testing.assert_close(tw, tw_t, rtol=1e-5, atol=1e-6)
    ids0, tw0 = block.route(x[:0], 0)
    assert ids0.shape == (0, shape.top_k) and tw0.shape == (0, shape.top_k)


def test_ep_router_gives_other_ranks_experts_minus_one():
    block = _block(TINY_EP2, 3)
    x = torch.randn(64, TINY_EP2.hidden, generator=torch.Generator().manual_seed(4))
    ids, _ = block.route(x.to(torch.bfloat16), 0)
    local = TINY_EP2.n_experts // TINY_EP2.ep
    assert ((ids == -1) | ((ids >= 0) & (ids < local))).all()
    assert (ids == -1).any() and (ids >= 0).any()


@pytest.mark.parametrize("shape", [TINY_TP2, TINY_EP2], ids=lambda s: s.name)
@pytest.mark.parametrize("T", [1, 5])
def test_block_with_fp4ext_matches_the_twin(shape, T):
    block = _block(shape, 100 + T)
    chk = block.check(T, block.fp4ext(T))
    assert chk["ok"], chk
    assert chk["rms_rel"] > 0  # the kernels' bf16 output, not the twin itself


def test_check_fails_on_a_wrong_routed_output():
    block = _block(TINY_TP2, 7)
    right = block.fp4ext(2)

    def dropped_slot(x, c, ids, tw, i):  # forgets each token's last expert
        return right(x, c, ids[:, :-1].contiguous(), tw[:, :-1].contiguous(), i)

    assert not block.check(2, dropped_slot)["ok"]


def test_shared_width_is_tp_sharded_and_fused_shapes_are_refused():
    assert _block(TINY_TP2, 1).I_shared == 256 and _block(TINY_EP2, 1).I_shared == 128
    glm5 = model_shapes.preset("glm5-tp8")
    assert glm5.moe_intermediate * glm5.n_shared // (glm5.tp * glm5.ep) == 256
    fused = model_shapes.ModelShape("f", 16, 4, 256, 256, 1, n_shared=1, tp=2, fuse_shared=True)
    with pytest.raises(ValueError, match="fused"):
        MoEBlock(Layer(fused, 1, device="cpu", l2_bytes=0))


def test_bytes_and_verify_sizes():
    block = _block(TINY_TP2, 5)
    T = 4
    b = block.bytes(T, block.routes(T))
    s = TINY_TP2
    assert b["router"] == s.n_experts * s.hidden * 2 + s.n_experts * 4
    assert b["shared"] == 3 * s.hidden * 256 * 2 + 2 * T * s.hidden * 2
    assert 1 <= b["distinct"] <= min(s.n_experts, T * s.top_k)
    assert b["block"] == b["router"] + b["routed"] + b["shared"]
    assert verify_of(1) == [] and verify_of(8) == ["4x2", "2x4"] and verify_of(6) == ["3x2"]
