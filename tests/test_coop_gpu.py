"""GPU tier of the one-launch decode family (``CoopDecodeConfig``, ``decode._coop_kernels``).

The family runs the two-launch Gluon family's tiles (``kstack1`` GEMM1, ``slots2`` GEMM2) in one
cooperative persistent launch with a grid-wide wait between them, so besides the fp32 twin (the
tolerances of ``test_decode_gpu.py``) every output must equal the two-launch output bit for bit.
Cases: GLM-5 TP8 as NVIDIA's checkpoints serve it (E = 256, top_k 8: the fused-shape weights with
the shared slot left out), with the fused shared expert (top_k 9) and EP8; the shapes without a
table; adversarial routings; grids from one program to every SM (each program then walks many
work items); 1,000 graph replays; and replays while a long kernel holds SMs on another stream, as
SGLang's shared expert and NCCL do. The interpreter cannot run Gluon: the CPU tier compiles the
family instead (``tests/test_coop_aot.py``).
"""

import pytest
import torch

from sglang_fp4ext.moe.decode.config import CoopDecodeConfig
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.decode.plan import plan
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.testing.compare import assert_close
from tests import glm5_cases

pytestmark = pytest.mark.gpu
MAX_REL, RMS_REL = 1e-2, 5e-3
H = glm5_cases.H

#: 16 warps a program (8 K splits x 2) at each GEMM2 prefetch; 8 warps (4 K splits).
CONFIGS = {
    "w16": CoopDecodeConfig(split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32),
    "w16late": CoopDecodeConfig(
        split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32, prefetch2=2
    ),
    "ks4": CoopDecodeConfig(split_k1=4, warps1=2, block_n1=32, warps2=1, block_n2=32, prefetch2=0),
}


def _case(name: str, T: int, g: torch.Generator):
    """``(MoEWeights, PreparedMoEWeights, x, ids, tw)``; ``tp8``: the TP8 weights, top_k 8."""
    w, pw = glm5_cases.weights("tp8_shared" if name == "tp8" else name)
    x, ids, tw = glm5_cases.inputs("tp8_shared" if name == "tp8" else name, T, g)
    if name == "tp8":
        ids, tw = ids[:, :8].contiguous(), tw[:, :8].contiguous()
    return w, pw, x, ids, tw


def _twin(w, pw, x, ids, tw):
    # The twin takes ids in [-1, E) only; an id >= E contributes nothing, as -1 does.
    return fused_moe_nvfp4_torch(x, w, torch.where(ids >= pw.num_experts, -1, ids), tw)


def _poisoned(T: int) -> torch.Tensor:
    return torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")


def _bits(a: torch.Tensor) -> torch.Tensor:
    return a.view(torch.int16)


@pytest.mark.parametrize("cfg", sorted(CONFIGS))
@pytest.mark.parametrize(
    "name,T",
    [("tp8", 1), ("tp8", 2), ("tp8", 5), ("tp8", 16), ("tp8_shared", 1), ("tp8_shared", 40),
     ("ep8", 1), ("ep8", 2), ("ep8", 9)],
)  # fmt: skip
def test_twin_and_the_two_launch_bits(name, T, cfg, seed):
    """The fp32 twin within tolerance, and the same bits as the tiles on two launches, with a
    dropped slot and an id >= E."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w, pw, x, ids, tw = _case(name, T, g)
    ids[0, 1] = -1
    ids[-1, 2] = pw.num_experts
    c = CONFIGS[cfg]
    out = _poisoned(T)
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=c)
    two = fused_moe_nvfp4(x, pw, ids, tw, config=c.two_launch())
    assert torch.equal(_bits(out), _bits(two)), f"{name} T={T} {cfg}: one launch != two"
    assert_close(out, _twin(w, pw, x, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL, what=name)


@pytest.mark.parametrize("programs", [1, 3, 64, None])
@pytest.mark.parametrize("name,T", [("tp8", 4), ("tp8_shared", 3), ("ep8", 2)])
def test_any_grid_gives_the_same_bits(name, T, programs, seed):
    """One program walks every work item, or a few do, or one per SM (None: the full grid)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    _, pw, x, ids, tw = _case(name, T, g)
    c = CONFIGS["w16"]
    want = fused_moe_nvfp4(x, pw, ids, tw, config=c.two_launch())
    out = _poisoned(T)
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=c)  # grows the workspaces
    out.fill_(float("nan"))
    [launch] = plan(x, pw, ids, tw, out, c, "coop", programs=programs)
    if programs is not None:
        assert launch.grid == (programs,)
    launch.run()
    assert torch.equal(_bits(out), _bits(want))


@pytest.mark.parametrize("kind", glm5_cases.ADVERSARIAL)
@pytest.mark.parametrize("name,T", [("tp8", 5), ("tp8_shared", 16), ("ep8", 16)])
def test_adversarial_routings(name, T, kind, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w, pw, x, ids, tw = _case(name, T, g)
    ids = glm5_cases.adversarial(kind, T, pw.num_experts, ids.shape[1], g)
    out = _poisoned(T)
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=CONFIGS["w16"])
    if kind == "all_dropped":
        assert torch.equal(out, torch.zeros_like(out))
        return
    assert_close(out, _twin(w, pw, x, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL, what=kind)


@pytest.mark.parametrize("shape_name,cfg", [("dsr1_tp8", "ks4"), ("qwen3_30b", "w16")])
@pytest.mark.parametrize("T", [1, 16])
def test_shapes_without_a_table(shape_name, cfg, T, seed):
    """DeepSeek-R1 TP8 (28 K chunks: 4 splits) and Qwen3-30B-A3B (8 chunks, I = 768)."""
    w, pw, x, ids, tw = glm5_cases.other_shape_case(shape_name, T, seed)
    out = torch.full((T, x.shape[1]), float("nan"), dtype=torch.bfloat16, device="cuda")
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=CONFIGS[cfg])
    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL)


def test_zero_tokens_and_ragged_k_splits(seed):
    _, pw, x, ids, tw = _case("tp8", 2, torch.Generator(device="cuda").manual_seed(seed))
    out = fused_moe_nvfp4(x[:0], pw, ids[:0], tw[:0], config=CONFIGS["w16"])
    assert out.shape == (0, H)
    _, pw7, x7, ids7, tw7 = glm5_cases.other_shape_case("dsr1_tp8", 1, seed)
    with pytest.raises(ValueError, match="28 K chunks of 256 .* split_k1=8"):
        fused_moe_nvfp4(x7, pw7, ids7, tw7, config=CONFIGS["w16"])


def _replays(name, T, n, seed, side=None):
    """``n`` graph replays with fresh inputs copied in (every 7th with a dropped slot) and the
    eager outputs of the same inputs; ``side(i)`` runs on another stream before replay ``i``."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    cases = [_case(name, T, g)[2:] for _ in range(n)]
    for i in range(0, n, 7):
        cases[i][1][0] = -1
    pw = _case(name, T, g)[1]
    c = CONFIGS["w16"]
    sx, sids, stw = (t.clone() for t in cases[0])
    sout = torch.empty(T, H, dtype=torch.bfloat16, device="cuda")
    fused_moe_nvfp4(sx, pw, sids, stw, out=sout, config=c)  # compile, workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe_nvfp4(sx, pw, sids, stw, out=sout, config=c)
    replayed = torch.empty(n, T, H, dtype=torch.bfloat16, device="cuda")
    for i, (x, ids, tw) in enumerate(cases):
        if side is not None:
            side(i)
        sx.copy_(x)
        sids.copy_(ids)
        stw.copy_(tw)
        sout.fill_(float("nan"))
        graph.replay()
        replayed[i].copy_(sout)
    torch.cuda.synchronize()
    eager = [fused_moe_nvfp4(x, pw, ids, tw, config=c) for x, ids, tw in cases]
    return replayed, eager


@pytest.mark.parametrize("name,T", [("tp8", 1), ("tp8_shared", 4), ("ep8", 2)])
def test_graph_replay_matches_eager_bit_for_bit(name, T, seed):
    """1,000 replays == eager calls, bit for bit (and so deterministic: the grid-wide wait's
    counters come back to their start every call)."""
    replayed, eager = _replays(name, T, 1000, seed)
    for i, e in enumerate(eager):
        assert torch.equal(_bits(e), _bits(replayed[i])), f"replay {i} differs from eager"
    assert torch.isfinite(replayed.float()).all()


def test_replays_beside_a_long_kernel_on_another_stream(seed):
    """1,000 replays while GEMMs that fill every SM run on another stream (SGLang runs the shared
    expert beside the MoE): no hang, the same bits."""
    side_stream = torch.cuda.Stream()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    sink = torch.empty_like(a)

    def side(i):
        if i % 50 == 0:  # keep the other stream busy throughout
            with torch.cuda.stream(side_stream):
                for _ in range(40):
                    torch.matmul(a, a, out=sink)

    replayed, eager = _replays("tp8", 2, 1000, seed, side)
    side_stream.synchronize()
    for i, e in enumerate(eager):
        assert torch.equal(_bits(e), _bits(replayed[i])), f"replay {i} differs from eager"
