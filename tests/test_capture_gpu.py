"""GPU tier: the fp4ext MoE layer in CUDA graphs at every decode bucket of the policy.

The layer is ``experts.run_experts("triton", ...)``: what SGLang's fp4ext runner core runs from
the top-k output (``topk_ids``/``topk_weights``) to the combined output, at GLM-5 TP8 per-GPU
shapes as SGLang feeds them (256 routed experts + the fused shared expert 256 in the last
column, top-k 8 + 1, H 6144, I 256). The buckets are ``capture_policy.policy_for("glm-5", 8, 1)``
with SGLang's default maximum (512 decode requests on a 90-160 GiB GPU at TP8). Graphs are
captured the way SGLang's decode runner does: static inputs sized for the largest bucket and
sliced per graph, one shared memory pool, largest bucket first, two eager runs before each
capture. Every graph is replayed only after all are captured, so a workspace that moved while
later graphs were warmed up would show. Outputs are poisoned with NaN before every run; eager
runs are ``dispatch.fused_moe`` (what ``run_experts`` calls: the decode or prefill kernels, as the
config table says for the bucket) into a poisoned ``out``.

Padding: a batch of ``T`` real rows replayed in the policy's next bucket ``B`` with rows
``T..B`` holding stale data and their routed ids masked to ``-1`` (SGLang's CUDA masking leaves
the shared-expert column) must give, for its real rows, bit for bit what the unpadded batch gives
eagerly: the policy keeps ``B`` in ``T``'s kernel-config bucket (same path, same config), and
every row's arithmetic is independent of the other rows on both paths.
"""

from __future__ import annotations

import pytest
import torch

from sglang_fp4ext import capture_policy as cp
from sglang_fp4ext.moe import dispatch
from sglang_fp4ext.moe.experts import run_experts
from sglang_fp4ext.moe.shape import current_target
from sglang_fp4ext.moe.tables import select
from tests import glm5_cases

pytestmark = pytest.mark.gpu
H = glm5_cases.H


class Captured:
    """One graph per policy bucket over shared static buffers (as SGLang's decode runner)."""

    def __init__(self, pw, buckets, g):
        self.pw, self.buckets = pw, tuple(buckets)
        top = max(self.buckets)
        self.x, self.ids, self.tw = glm5_cases.inputs("tp8_shared", top, g)
        self.graphs, self.out = {}, {}
        pool = torch.cuda.graph_pool_handle()
        for B in sorted(self.buckets, reverse=True):
            for _ in range(2):  # SGLang's warm-up: compiles, grows workspaces outside capture
                self._layer(B)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.out[B] = self._layer(B)
            self.graphs[B] = graph
        torch.cuda.synchronize()

    def _layer(self, B):
        return run_experts("triton", self.pw, self.x[:B], self.ids[:B], self.tw[:B])

    def replay(self, B, x, ids, tw):
        """Copy ``x``/``ids``/``tw`` (B rows) into the static buffers, poison, replay."""
        self.x[:B].copy_(x)
        self.ids[:B].copy_(ids)
        self.tw[:B].copy_(tw)
        self.out[B].fill_(float("nan"))
        self.graphs[B].replay()
        return self.out[B].clone()


@pytest.fixture(scope="module")
def policy():
    p = cp.policy_for("glm5-tp8-fused-shared", 8, 1)  # a checkpoint that quantizes the shared
    s = p.inputs.per_rank_shape()
    assert (s.E, s.H, s.I, s.top_k) == (257, H, 256, 9)  # = glm5_cases "tp8_shared"
    assert p.decode_bs[-1] == 512 and p.masking == "fp4ext"
    return p


@pytest.fixture(scope="module")
def captured(policy):
    _, pw = glm5_cases.weights("tp8_shared")
    return Captured(pw, policy.decode_bs, torch.Generator(device="cuda").manual_seed(11))


def _eager(pw, x, ids, tw):
    out = torch.full((x.shape[0], H), float("nan"), dtype=torch.bfloat16, device="cuda")
    return dispatch.fused_moe(x, pw, ids, tw, out=out)


def _same_bits(a, b) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_every_policy_bucket_replays_equal_to_eager(captured, policy, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    assert set(captured.graphs) == set(policy.decode_bs)
    bad = []
    for B in policy.decode_bs:
        for _ in range(2):  # fresh inputs per replay
            x, ids, tw = glm5_cases.inputs("tp8_shared", B, g)
            got = captured.replay(B, x, ids, tw)
            want = _eager(captured.pw, x, ids, tw)
            if not torch.isfinite(got.float()).all() or not _same_bits(got, want):
                diff = (got.float() - want.float()).abs().nan_to_num(float("inf")).max()
                bad.append(f"B={B}: max |graph - eager| = {float(diff):.3g}")
    assert not bad, "graph replay differs from eager:\n" + "\n".join(bad)


@pytest.mark.parametrize("T", [33, 39, 45, 57, 63, 97, 129, 250, 257, 300, 509])
def test_padded_batch_real_rows_equal_unpadded(captured, policy, T, seed):
    B = min(b for b in policy.decode_bs if b >= T)
    assert B > T, f"T={T} is a bucket: nothing padded"
    shape = captured.pw.shape(9)
    target = current_target()
    # The policy's promise that makes bit equality the right bar: same path and kernel config.
    assert select(B, shape, target) == select(T, shape, target), (T, B)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs("tp8_shared", B, g)  # rows T..B: stale data
    ids[T:, :-1] = -1  # SGLang's mask on CUDA: routed columns of padded rows, shared one stays
    got = captured.replay(B, x, ids, tw)
    want = _eager(captured.pw, x[:T].contiguous(), ids[:T].contiguous(), tw[:T].contiguous())
    assert torch.isfinite(got.float()).all(), f"T={T} B={B}: unwritten rows"
    if not _same_bits(got[:T], want):
        diff = (got[:T].float() - want.float()).abs().max()
        rows = (got[:T].view(torch.int16) != want.view(torch.int16)).any(1).nonzero().flatten()
        raise AssertionError(
            f"T={T} padded to B={B}: real rows differ from the unpadded batch "
            f"(max |diff| {float(diff):.3g}, rows {rows[:10].tolist()})"
        )
