"""GPU tier: the decode kernels at GLM-5 per-GPU shapes, CUDA-graph replay and determinism.

Tolerance vs the fp32 reference: the kernels round the SiLU·mul intermediate and the output to
bf16 (each <= 2^-9 relative per element, averaging out over random signs); decode and scales are
exact and accumulation is fp32. Measured on the CPU tier: rms_rel ~2.4e-3, max_rel ~3e-3 (max
normalised by max|ref|). rms_rel 5e-3 / max_rel 1e-2 leave margin; a wrong expert, slot, scale or
split would give errors of order 1.
"""

import dataclasses

import pytest
import torch

from sglang_fp4ext.moe import decode as fm
from sglang_fp4ext.moe.config import config_for
from sglang_fp4ext.moe.decode import fused_moe_nvfp4
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.testing.compare import assert_close
from tests import glm5_cases

pytestmark = pytest.mark.gpu
MAX_REL, RMS_REL = 1e-2, 5e-3

def _config(pw, ids, gemm2):
    """The config a call would use (table or heuristic), with the GEMM2 form forced."""
    cfg = config_for(ids.shape[0], pw.shape(ids.shape[1]))
    return dataclasses.replace(cfg, gemm2=gemm2, tiles2=1 if gemm2 == "tokens" else cfg.tiles2)


@pytest.mark.parametrize("gemm2", ["pairs", "tokens"])
@pytest.mark.parametrize("name", ["tp8_shared", "ep8"])
@pytest.mark.parametrize("T", [1, 7, 64, 256])
def test_glm5_vs_reference(name, T, gemm2, seed):
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    out = torch.full((T, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")  # poison
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=_config(pw, ids, gemm2))
    ref = fused_moe_nvfp4_torch(x, w, ids, tw)
    st = assert_close(out, ref, max_rel=MAX_REL, rms_rel=RMS_REL, what=f"{name} T={T} {gemm2}")
    print(f"{name} T={T}: {st}")
    for buf in ("cnt1", "cnt2"):  # graph safety: arrival counters are back at zero
        assert int(fm._WORKSPACES[("cuda:0", buf)].abs().sum()) == 0, buf


@pytest.mark.parametrize(
    "name,T,gemm2", [("tp8_shared", 8, "pairs"), ("tp8_shared", 4, "tokens"), ("ep8", 16, "pairs")]
)
def test_graph_replay_matches_eager_bit_for_bit(name, T, gemm2, seed):
    """1,000 replays with new inputs copied into static buffers == eager calls, bit for bit."""
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = 1000
    inputs = [glm5_cases.inputs(name, T, g) for _ in range(n)]
    cfg = _config(pw, inputs[0][1], gemm2)
    for i in range(0, n, 7):  # some replays with extra dropped slots / a token with none
        inputs[i][1][0] = -1
    sx, sids, stw = (t.clone() for t in inputs[0])
    sout = torch.empty(T, 6144, dtype=torch.bfloat16, device="cuda")
    fused_moe_nvfp4(sx, pw, sids, stw, out=sout, config=cfg)  # warm-up: compile + workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe_nvfp4(sx, pw, sids, stw, out=sout, config=cfg)
    replayed = torch.empty(n, T, 6144, dtype=torch.bfloat16, device="cuda")
    for i, (x, ids, tw) in enumerate(inputs):
        sx.copy_(x)
        sids.copy_(ids)
        stw.copy_(tw)
        sout.fill_(float("nan"))
        graph.replay()
        replayed[i].copy_(sout)
    for i, (x, ids, tw) in enumerate(inputs):
        eager = fused_moe_nvfp4(x, pw, ids, tw, config=cfg)
        if not torch.equal(eager.view(torch.int16), replayed[i].view(torch.int16)):
            raise AssertionError(f"replay {i} differs from eager")
    assert torch.isfinite(replayed.float()).all()


@pytest.mark.parametrize("name,T", [("tp8_shared", 3), ("tp8_shared", 128), ("ep8", 64)])
def test_deterministic_across_runs(name, T, seed):
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    first = fused_moe_nvfp4(x, pw, ids, tw)
    for _ in range(20):
        again = fused_moe_nvfp4(x, pw, ids, tw)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16))
