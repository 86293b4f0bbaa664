"""Bounded memory over long runs: workspaces, retired buffers and caches plateau.

A serving process calls the MoE millions of times with every token count from 1 to the prefill
chunk and replays ~110 captured graphs. What the calls keep alive: the decode workspaces
(``decode._WORKSPACES``; a buffer replaced by a larger one is kept in ``_RETIRED`` because an
earlier graph may hold its address), the dispatcher's counters, the self-check's verdict and
decision caches and the Gluon layout cache. Each grows only with distinct (size, config) pairs,
so after one pass over the token counts nothing may grow. CPU tier: the bookkeeping under the
interpreter at a small shape. GPU tier: 10,000 calls cycling T = 1..8192 over both paths at GLM-5
TP8 and EP8, graph replays and eager calls mixed, with ``torch.cuda.memory_allocated`` sampled
and spot checks against the torch twin.
"""

import random

import pytest
import torch

from sglang_fp4ext.bench import random_packed_weights
from sglang_fp4ext.moe import dispatch, selfcheck
from sglang_fp4ext.moe.decode import plan as decode
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.shape import Target
from sglang_fp4ext.testing.compare import assert_close


def _bookkeeping() -> dict:
    from sglang_fp4ext.moe.decode import _gluon_kernels as G

    ws = decode._WORKSPACES
    return dict(
        workspaces=len(ws),
        workspace_elems=sum(t.numel() for t in ws.values()),
        retired=len(decode._RETIRED),
        calls_keys=len(dispatch.CALLS),
        selfcheck=len(selfcheck._DECIDED) + len(selfcheck._VERDICTS),
        layouts=G.layouts.cache_info().currsize,
    )


def _routing(T, E, k, g, device, ep_local=None):
    ids = torch.rand(T, E if ep_local is None else 8 * ep_local, device=device, generator=g)
    ids = ids.topk(k, dim=1).indices
    if ep_local is not None:
        ids = torch.where(ids < ep_local, ids, -1)
    return ids.to(torch.int32).contiguous(), torch.rand(T, k, device=device, generator=g)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier (the GPU soak is below)")
def test_bookkeeping_plateaus_after_one_pass_cpu(seed):
    decode.clear_workspaces()
    g = torch.Generator().manual_seed(seed)
    E, H, I, k = 8, 256, 256, 2
    w = random_packed_weights(E, H, I, device="cpu", generator=g)
    pw = PreparedMoEWeights.from_moe_weights(w)
    Ts = [1, 6, 3, 9]
    tiny = Target("sm_90", None, 2)  # few programs per launch: the interpreter runs each one
    passes = []
    for p in range(2):
        for T in Ts:
            ids, tw = _routing(T, E, k, g, "cpu")
            x = torch.randn(T, H, generator=g).to(torch.bfloat16)
            out = dispatch.fused_moe(x, pw, ids, tw, target=tiny)
            if p == 1 and T in (1, 9):  # spot checks against the twin
                assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=1e-2, rms_rel=5e-3)
        passes.append(_bookkeeping())
    assert passes[0] == passes[1], passes
    assert passes[0]["workspaces"] > 0


@pytest.mark.gpu
def test_soak_10000_calls_memory_plateaus(seed):
    """10,000 calls over T = 1..8192, TP8 (fused shared) and EP8, eager and graph replays."""
    decode.clear_workspaces()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    rng = random.Random(seed)
    layers = {}
    for name, (E, I, k, ep) in {"tp8": (257, 256, 9, None), "ep8": (32, 2048, 8, 32)}.items():
        w = random_packed_weights(E, 6144, I, device=dev, generator=g)
        layers[name] = (w, PreparedMoEWeights.from_moe_weights(w), k, ep)
    Ts = sorted(
        {1, 2, 3, 5, 8, 13, 16, 31, 64, 100, 128, 255, 256, 511, 512, 1000, 1024, 2048, 4096, 8192}
    )
    x_all = torch.randn(8192, 6144, device=dev, generator=g).to(torch.bfloat16)

    def inputs(name, T):
        w, pw, k, ep = layers[name]
        E = pw.num_experts - (1 if name == "tp8" else 0)
        ids, tw = _routing(T, E, k - (1 if name == "tp8" else 0), g, dev, ep)
        if name == "tp8":  # the fused shared expert in the last slot
            ids = torch.cat([ids, torch.full((T, 1), E, dtype=torch.int32, device=dev)], 1)
            tw = torch.cat([tw, torch.rand(T, 1, device=dev, generator=g)], 1)
        return x_all[:T], ids.contiguous(), tw.contiguous()

    # Graphs for a few decode sizes per layer, captured SGLang's way (eager warm-up first).
    graphs = []
    for name in layers:
        for T in (1, 8, 64):
            x, ids, tw = inputs(name, T)
            pw = layers[name][1]
            dispatch.fused_moe(x, pw, ids, tw)
            torch.cuda.synchronize()
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                dispatch.fused_moe(x, pw, ids, tw)
            graphs.append(gr)
    calls, samples = 0, []
    n_calls, spot = 10_000, {0, 2_500, 9_999}
    while calls < n_calls:
        for T in Ts:
            for name in layers:
                if calls >= n_calls:
                    break
                # Pass 1 meets every size eagerly (what SGLang's warm-up does); then a mix.
                if calls >= len(Ts) * len(layers) and rng.random() < 0.5:
                    graphs[rng.randrange(len(graphs))].replay()
                else:
                    x, ids, tw = inputs(name, T)
                    out = dispatch.fused_moe(x, layers[name][1], ids, tw)
                    if calls in spot or (calls > n_calls - 40 and T in (5, 4096)):
                        ref = fused_moe_nvfp4_torch(x, layers[name][0], ids, tw)
                        assert_close(out, ref, max_rel=1e-2, rms_rel=5e-3, what=f"{name} T={T}")
                calls += 1
        x = ids = tw = out = ref = None  # this pass's last tensors: not part of the plateau
        torch.cuda.synchronize()
        samples.append(dict(calls=calls, allocated=torch.cuda.memory_allocated(), **_bookkeeping()))
    first, last = samples[0], samples[-1]
    print(
        f"soak: {calls} calls, {len(samples)} passes; allocated after pass 1 "
        f"{first['allocated'] / 2**20:.1f} MiB, at the end {last['allocated'] / 2**20:.1f} MiB, "
        f"peak {torch.cuda.max_memory_allocated() / 2**20:.1f} MiB; {last}"
    )
    for s in samples[1:]:
        assert {k: v for k, v in s.items() if k != "calls"} == {
            k: v for k, v in first.items() if k != "calls"
        }, (first, s)
