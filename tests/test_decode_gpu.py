"""GPU tier: the decode kernels at GLM-5 per-GPU shapes, CUDA-graph replay and determinism.

Every test runs both kernel families, ``dot`` (``tl.dot``, v1) and ``gluon`` (v2), the Gluon
pairs GEMM2 whose partials a third launch sums, each expert's pair chunks over 4 programs
(``gluon3``: ``combine="kernel"``, ``split_t=4``), the Gluon launches with programmatic dependent
launch (``gluonp``: ``pdl=1``), the token GEMM2 with a token's top-k slots side by side
(``gluons``: ``slots2=1``) and GEMM1 with its K splits stacked in one program (``gluonk``:
``kstack1=1``); Gluon runs only on a GPU (the CPU
tier compiles it ahead of time, ``tests/test_gluon_aot.py``).

Tolerance vs the fp32 reference: the kernels round the SiLU·mul intermediate and the output to
bf16 (each <= 2^-9 relative per element, averaging out over random signs); decode and scales are
exact and accumulation is fp32. Measured on the CPU tier: rms_rel ~2.4e-3, max_rel ~3e-3 (max
normalised by max|ref|). rms_rel 5e-3 / max_rel 1e-2 leave margin; a wrong expert, slot, scale or
split would give errors of order 1.
"""

import dataclasses

import pytest
import torch

from sglang_fp4ext.moe.decode import plan as decode_plan
from sglang_fp4ext.moe.decode.launch import fused_moe_nvfp4
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.moe.tables import config_for
from sglang_fp4ext.testing.compare import assert_close
from tests import glm5_cases

pytestmark = pytest.mark.gpu
MAX_REL, RMS_REL = 1e-2, 5e-3

FAMILIES = ["dot", "gluon", "gluon3", "gluonp", "gluons", "gluonk"]


def _as(cfg, kernels):
    """``cfg`` on family ``kernels``; ``gluonp``: programmatic dependent launch, the pairs GEMM2
    with the third-launch combine; ``gluons``: the token GEMM2 with the slots side by side
    (``slots2``, at most 2 warps a slot: 32 warps at top_k 9); ``gluonk``: GEMM1's K splits
    stacked in one program (``kstack1``; 4 splits, or 2 where the config has fewer: every tested
    H's K chunks divide by 4). The forms that exclude the family's own (the table's or
    heuristic's stacked GEMM1 and side-by-side slots: pair chunks over programs, the pairs GEMM2)
    are dropped first, GEMM1's register cap wherever the form does not take it
    (``GluonDecodeConfig.reform``)."""
    if kernels == "gluon3":
        cfg = cfg.reform(kernels="gluon", kstack1=0, slots2=0)
    if kernels == "gluonk":
        sk = 4 if cfg.split_k1 >= 4 else 2
        w = min(cfg.warps1, 32 // sk)
        return _as(cfg, "gluon").reform(
            kstack1=1, split_k1=sk, warps1=w, block_n1=max(cfg.block_n1, 16 * w), split_t=1
        )
    if kernels == "gluons":
        w = min(cfg.warps2, 2)
        return _as(cfg, "gluon").reform(
            gemm2="tokens",
            split_k2=1,
            tiles2=1,
            slots2=1,
            warps2=w,
            block_n2=max(cfg.block_n2, 16 * w),
        )
    if kernels == "gluonp":
        c = _as(cfg, "gluon3" if cfg.gemm2 == "pairs" else "gluon")
        return c.reform(pdl=1, split_t=1)
    if kernels == "gluon3":
        pairs = cfg.gemm2 == "pairs"
        return cfg.reform(
            kernels="gluon",
            gemm2="pairs",
            combine="kernel",
            split_t=4,
            split_k2=cfg.split_k2 if pairs else 1,
            tiles2=cfg.tiles2 if pairs else 1,
        )
    return cfg.reform(kernels=kernels, **({"combine": "counter"} if kernels == "gluon" else {}))


def _with_gemm2(cfg, gemm2):
    """``cfg`` with its GEMM2 form forced to ``gemm2`` (the token GEMM2 takes no split or tiles;
    only it takes side-by-side slots, a Gluon knob)."""
    slots = {"slots2": cfg.slots2 if gemm2 == "tokens" else 0} if cfg.kernels == "gluon" else {}
    return cfg.reform(
        gemm2=gemm2,
        tiles2=1 if gemm2 == "tokens" else cfg.tiles2,
        split_k2=1 if gemm2 == "tokens" else cfg.split_k2,
        **slots,
    )


def _config(pw, ids, gemm2, kernels="dot"):
    """The config a call would use (table or heuristic), with the GEMM2 form and family forced."""
    return _as(_with_gemm2(config_for(ids.shape[0], pw.shape(ids.shape[1])), gemm2), kernels)


def _same_bits(x, pw, ids, tw, cfg, **variant):
    """``cfg`` with ``variant`` into a poisoned output, bit-equal to ``cfg`` itself; returns it."""
    a = fused_moe_nvfp4(x, pw, ids, tw, config=cfg)
    out = torch.full_like(a, float("nan"))
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=cfg.reform(**variant))
    assert torch.equal(a.view(torch.int16), out.view(torch.int16)), variant
    return out


def _counters_zero():
    """Graph safety: the arrival counters are back at zero."""
    for buf in ("cnt1", "cnt2"):
        if ("cuda:0", buf) in decode_plan._WORKSPACES:
            assert int(decode_plan._WORKSPACES[("cuda:0", buf)].abs().sum()) == 0, buf


@pytest.mark.parametrize("kernels", FAMILIES)
@pytest.mark.parametrize("gemm2", ["pairs", "tokens"])
@pytest.mark.parametrize("name", ["tp8_shared", "ep8"])
@pytest.mark.parametrize("T", [1, 7, 64, 256])
def test_glm5_vs_reference(name, T, gemm2, kernels, seed):
    if kernels == "gluon3" and gemm2 == "tokens":
        pytest.skip("combine='kernel' sums the pairs GEMM2's partials")
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    out = torch.full((T, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")  # poison
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=_config(pw, ids, gemm2, kernels))
    ref = fused_moe_nvfp4_torch(x, w, ids, tw)
    what = f"{name} T={T} {gemm2} {kernels}"
    st = assert_close(out, ref, max_rel=MAX_REL, rms_rel=RMS_REL, what=what)
    print(f"{name} T={T}: {st}")
    _counters_zero()


@pytest.mark.parametrize("name,T,split_k2", [("tp8_shared", 96, 1), ("ep8", 40, 2)])
def test_combine_kernel_matches_the_in_kernel_combine_bit_for_bit(name, T, split_k2, seed):
    """The third launch sums the same partials in the same order as the arrival counter's last
    program, and spreading pair chunks over programs (``split_t``) leaves each pair's sums
    alone: the outputs are equal to the bit."""
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    ids[3] = -1  # a token with no local expert: zeros either way
    cfg = dataclasses.replace(_config(pw, ids, "pairs", "gluon"), split_k2=split_k2)
    a = fused_moe_nvfp4(x, pw, ids, tw, config=cfg)
    b = fused_moe_nvfp4(x, pw, ids, tw, config=dataclasses.replace(cfg, combine="kernel"))
    c = fused_moe_nvfp4(
        x, pw, ids, tw, config=dataclasses.replace(cfg, combine="kernel", split_t=8)
    )
    assert torch.equal(a.view(torch.int16), c.view(torch.int16))
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    assert a[3].eq(0).all()


@pytest.mark.parametrize("kernels", FAMILIES)
@pytest.mark.parametrize(
    "name,T,gemm2", [("tp8_shared", 8, "pairs"), ("tp8_shared", 4, "tokens"), ("ep8", 16, "pairs")]
)
def test_graph_replay_matches_eager_bit_for_bit(name, T, gemm2, kernels, seed):
    """1,000 replays with new inputs copied into static buffers == eager calls, bit for bit."""
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = 1000
    inputs = [glm5_cases.inputs(name, T, g) for _ in range(n)]
    cfg = _config(pw, inputs[0][1], gemm2, kernels)
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


@pytest.mark.parametrize("pdl", [1, 2])
@pytest.mark.parametrize(
    "name,T,gemm2",
    [
        ("tp8_shared", 1, "pairs"),
        ("tp8_shared", 4, "tokens"),
        ("tp8_shared", 64, "pairs"),
        ("ep8", 2, "pairs"),
        ("ep8", 16, "tokens"),
    ],
)
def test_pdl_chain_matches_eager_bit_for_bit(name, T, gemm2, pdl, seed):
    """Three layer calls in one graph with programmatic dependent launch, either trigger (each
    GEMM2 starts while its GEMM1 runs, each GEMM1 while the previous layer ends, all sharing the
    workspaces), replayed with fresh inputs: every output equals the eager calls without PDL to
    the bit, so no kernel read a workspace before the kernel writing it had finished."""
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    base = dataclasses.replace(
        _config(pw, glm5_cases.inputs(name, T, g)[1], gemm2, "gluonp"), pdl=pdl
    )
    plain = dataclasses.replace(base, pdl=0)
    static = [[t.clone() for t in glm5_cases.inputs(name, T, g)] for _ in range(3)]
    outs = [torch.empty(T, 6144, dtype=torch.bfloat16, device="cuda") for _ in range(3)]

    def layers():
        for (x, ids, tw), o in zip(static, outs):
            fused_moe_nvfp4(x, pw, ids, tw, out=o, config=base)

    layers()  # warm-up: compile + workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layers()
    for rep in range(50):
        fresh = [glm5_cases.inputs(name, T, g) for _ in range(3)]
        if rep % 5 == 0:
            fresh[1][1][0] = -1  # a token with no local expert in the middle layer
        for dst, src in zip(static, fresh):
            for d, s_ in zip(dst, src):
                d.copy_(s_)
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        for i, (x, ids, tw) in enumerate(fresh):
            want = fused_moe_nvfp4(x, pw, ids, tw, config=plain)
            if not torch.equal(want.view(torch.int16), outs[i].view(torch.int16)):
                raise AssertionError(f"replay {rep}, layer {i}: PDL differs from eager")
    _counters_zero()


@pytest.mark.parametrize("warps2,block_n2,pdl", [(1, 32, 0), (2, 32, 2), (1, 64, 0), (2, 64, 1)])
@pytest.mark.parametrize(
    "name,T", [("tp8_shared", 1), ("tp8_shared", 2), ("ep8", 2), ("ep8", 9), ("tp8_shared", 24)]
)
def test_slots2_changes_no_bit(name, T, warps2, block_n2, pdl, seed):
    """The token GEMM2 with the slots side by side (``slots2``) sums the same per-slot products
    in the same slot order as the walk it replaces: the same bits, with a dropped slot and an id
    >= E among the routings, at top_k 8 and 9 (16 slot rows, 7 of them empty), I = 256 (one K
    chunk) and 2048 (8 chunks), with and without PDL; and the fp32 twin within tolerance."""
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    ids[0, 1] = -1  # a dropped slot
    ids[-1, 2] = pw.num_experts  # an id >= E: no expert
    cfg = dataclasses.replace(
        _as(_config(pw, ids, "tokens", "gluon"), "gluon"), pdl=pdl, warps2=warps2, block_n2=block_n2
    )
    out = _same_bits(x, pw, ids, tw, cfg, slots2=1)
    ref = fused_moe_nvfp4_torch(x, w, torch.where(ids >= pw.num_experts, -1, ids), tw)
    assert_close(out, ref, max_rel=MAX_REL, rms_rel=RMS_REL, what=f"{name} T={T} slots2")


@pytest.mark.parametrize("split_t", [2, 4, 8])
@pytest.mark.parametrize("split_k1", [1, 2])
@pytest.mark.parametrize("T", [32, 40])
def test_split_t_beside_the_token_gemm2_changes_no_bit(T, split_k1, split_t, seed):
    """GEMM1 with the fused shared expert's pair chunks over ``split_t`` programs beside the
    token GEMM2 (the heuristic's form on the expert grid): each chunk computed as
    in one program, split-K partials reduced in split order, so the same bits as ``split_t=1``;
    40 tokens leave a partial last chunk; and the fp32 twin within tolerance."""
    w, pw = glm5_cases.weights("tp8_shared")
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs("tp8_shared", T, g)
    ids[0, 1] = -1  # a dropped slot
    cfg = dataclasses.replace(
        _as(_config(pw, ids, "tokens", "gluon"), "gluon"),
        grid="experts",
        kstack1=0,
        slots2=0,
        split_k1=split_k1,
        split_t=1,
        pdl=0,
    )
    out = _same_bits(x, pw, ids, tw, cfg, split_t=split_t)
    assert_close(
        out,
        fused_moe_nvfp4_torch(x, w, ids, tw),
        max_rel=MAX_REL,
        rms_rel=RMS_REL,
        what=f"tp8_shared T={T} split_t={split_t} split_k1={split_k1}",
    )
    _counters_zero()


@pytest.mark.parametrize(
    "split_k1,block_n1,warps1,pdl",
    [(8, 32, 1, 2), (8, 64, 2, 0), (4, 32, 1, 0), (2, 64, 4, 1), (4, 128, 4, 0)],
)
@pytest.mark.parametrize(
    "name,T", [("tp8_shared", 1), ("tp8_shared", 2), ("ep8", 2), ("ep8", 9), ("tp8_shared", 40)]
)
def test_kstack1_changes_no_bit(name, T, split_k1, block_n1, warps1, pdl, seed):
    """GEMM1 with its K splits on one program's warps (``kstack1``) sums the same split
    partials in the same order as the splits across programs through the workspace: the same
    bits, with a dropped slot and an id >= E, at top_k 9 (the shared expert's pairs: 40 tokens
    take 5-20 passes of 8 / split_k1 pairs) and 8, I = 256 and 2048, 1-3 chunks per split,
    with and without PDL; and the fp32 twin within tolerance."""
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    ids[0, 1] = -1  # a dropped slot
    ids[-1, 2] = pw.num_experts  # an id >= E: no expert
    # maxnreg1=0: a table's register cap was picked for its own GEMM1 tile, not the one set here
    cfg = dataclasses.replace(
        _as(_config(pw, ids, "tokens", "gluon"), "gluon"),
        pdl=pdl,
        split_k1=split_k1,
        block_n1=block_n1,
        warps1=warps1,
        split_t=1,
        maxnreg1=0,
    )
    out = _same_bits(x, pw, ids, tw, cfg, kstack1=1)
    ref = fused_moe_nvfp4_torch(x, w, torch.where(ids >= pw.num_experts, -1, ids), tw)
    assert_close(out, ref, max_rel=MAX_REL, rms_rel=RMS_REL, what=f"{name} T={T} kstack1")
    _counters_zero()


def test_kstack1_needs_k_chunks_that_divide(seed):
    """DeepSeek-R1's H = 7,168 is 28 K chunks: 8 splits on one program's warps would be ragged;
    the launcher says so instead of reading past a split."""
    _, pw, x, ids, tw = glm5_cases.other_shape_case("dsr1_tp8", 1, seed)
    cfg = dataclasses.replace(
        _as(config_for(1, pw.shape(8)), "gluon"), kstack1=1, split_k1=8, warps1=1, split_t=1
    )
    with pytest.raises(ValueError, match="28 K chunks of 256 .* split_k1=8"):
        fused_moe_nvfp4(x, pw, ids, tw, config=cfg)


@pytest.mark.parametrize("maxnreg1", [96, 128, 168, 184])  # 168 / 184: what the tuner tries
@pytest.mark.parametrize("name,T", [("tp8_shared", 128), ("ep8", 64), ("tp8_shared", 3)])
def test_maxnreg1_changes_no_bit(name, T, maxnreg1, seed):
    """GEMM1 under a register cap (``maxnreg1``): the same instructions on fewer registers (maybe
    spilled), so the same bits; and the fp32 twin within tolerance."""
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    ids[0, 1] = -1  # a dropped slot
    cfg = _config(pw, ids, "pairs", "gluon")
    if cfg.kstack1:  # the cap is _gemm1's: its K splits across programs
        cfg = dataclasses.replace(cfg, kstack1=0, split_k1=1)
    out = _same_bits(x, pw, ids, tw, cfg, maxnreg1=maxnreg1)
    assert_close(
        out,
        fused_moe_nvfp4_torch(x, w, ids, tw),
        max_rel=MAX_REL,
        rms_rel=RMS_REL,
        what=f"{name} T={T} maxnreg1={maxnreg1}",
    )


@pytest.mark.parametrize("kernels", FAMILIES)
@pytest.mark.parametrize("name,T", [("tp8_shared", 3), ("tp8_shared", 128), ("ep8", 64)])
def test_deterministic_across_runs(name, T, kernels, seed):
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    cfg = _as(config_for(T, pw.shape(ids.shape[1])), kernels)
    first = fused_moe_nvfp4(x, pw, ids, tw, config=cfg)
    for _ in range(20):
        again = fused_moe_nvfp4(x, pw, ids, tw, config=cfg)
        assert torch.equal(again.view(torch.int16), first.view(torch.int16))


@pytest.mark.parametrize("kernels", FAMILIES)
@pytest.mark.parametrize("kind", glm5_cases.ADVERSARIAL)
@pytest.mark.parametrize("name,T", [("tp8_shared", 5), ("tp8_shared", 96), ("ep8", 33)])
def test_adversarial_routings(name, T, kind, kernels, seed):
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    ids = glm5_cases.adversarial(kind, T, pw.num_experts, ids.shape[1], g)
    cfg = _as(config_for(T, pw.shape(ids.shape[1])), kernels)
    out = torch.full((T, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")  # poison
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=cfg)
    # The twin takes ids in [-1, E) only; an id >= E contributes nothing, as -1 does.
    ref = fused_moe_nvfp4_torch(x, w, torch.where(ids >= pw.num_experts, -1, ids), tw)
    if kind == "all_dropped":
        assert torch.equal(out, torch.zeros_like(out))
        return
    st = assert_close(out, ref, max_rel=MAX_REL, rms_rel=RMS_REL, what=f"{name} T={T} {kind}")
    print(f"{name} T={T} {kind} {kernels}: {st}")


@pytest.mark.parametrize("kernels", FAMILIES)
@pytest.mark.parametrize("shape_name", sorted(glm5_cases.OTHER_SHAPES))
@pytest.mark.parametrize("T", [1, 16, 200])
def test_other_shapes_vs_reference(shape_name, T, kernels, seed):
    w, pw, x, ids, tw = glm5_cases.other_shape_case(shape_name, T, seed)
    H = x.shape[1]
    cfg = _as(config_for(T, pw.shape(8)), kernels)
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device="cuda")
    fused_moe_nvfp4(x, pw, ids, tw, out=out, config=cfg)
    ref = fused_moe_nvfp4_torch(x, w, ids, tw)
    st = assert_close(out, ref, max_rel=MAX_REL, rms_rel=RMS_REL, what=f"{shape_name} T={T}")
    print(f"{shape_name} T={T} {kernels}: {st}")
