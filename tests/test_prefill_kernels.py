"""Prefill path (``moe/prefill.py``, ``moe/_prefill_kernels.py``) vs its torch twins.

CPU tier (kernels under ``TRITON_INTERPRET=1``; compiled on a GPU machine): the device grouping
against ``group_by_expert_torch`` bit for bit; the whole layer against ``fused_moe_nvfp4_torch``
at small shapes with skewed routing, empty experts, every token on one expert, ``-1`` ids (and a
token with none), top_k = 9 with the fused shared expert, T not a multiple of ``block_m``, padded
H and I, both K steps, GEMM2 row blocks grouped per program (with a partial last group), several grouping blocks, the atomic combine, int64 ids / bf16 weights;
determinism, config rules and validation; AOT compilation of every launch the heuristic makes at
GLM-5 shapes for sm_80/90/100/120, with tensor-core MMA and sm_120 shared memory <= 101,376 B.
GPU tier: GLM-5 TP8 (fused shared expert) and EP8 shapes for T in {512, ..., 8192}, CUDA-graph
capture/replay and run-to-run determinism.

Tolerance vs the fp32 reference: the kernels round three times to bf16 -- the SiLU·mul
intermediate, each weighted GEMM2 row (ordered combine) and the output -- each <= 2^-9 relative
per element; the FP4 x e4m3 decode is exact and accumulation is fp32. Random signs average the
roundings out: rms_rel 2.3-2.9e-3 and max_rel (normalised by max|ref|) 2.8-3.3e-3 measured here,
so rms_rel 5e-3 and max_rel 1e-2 leave margin without hiding a wrong expert, slot, row or scale
(those give errors of order 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from sglang_fp4ext.moe.shape import MoEShape, Target
from sglang_fp4ext.moe.prefill import (
    fused_moe_nvfp4_prefill,
    group_by_expert,
    group_by_expert_torch,
    max_m_tiles,
    num_bins,
)
from sglang_fp4ext.moe.prefill_config import PrefillConfig, prefill_heuristic_config
from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
from sglang_fp4ext.target_info import SM120_SMEM_PER_BLOCK
from sglang_fp4ext.testing.compare import assert_close
from tests import glm5_cases
from tests.kernel_cases import DEV, compile_per_arch, small_weights

MAX_REL, RMS_REL = 1e-2, 5e-3


@pytest.fixture(autouse=True)
def _poison_workspaces(monkeypatch):
    """Workspaces start as NaN: a kernel reading a row nobody wrote fails the comparison."""
    from sglang_fp4ext.moe import prefill

    monkeypatch.setattr(prefill, "_POISON_WORKSPACES", True)


def _weights(E, H, I):
    return small_weights(E, H, I, seed=4321)


def _routing(T, E, k, g, *, skew=0.0, live=None, shared=False, drop=0.0, one_expert=None):
    """Distinct experts per token drawn with probability ~ 1/(rank+1)^skew over the ``live``
    experts (others stay empty); optional shared last column, ``-1`` drops, one-expert mode."""
    n_routed = E - 1 if shared else E
    kr = k - 1 if shared else k
    live = list(range(n_routed)) if live is None else list(live)
    p = torch.zeros(n_routed)
    p[live] = 1.0 / torch.arange(1, len(live) + 1, dtype=torch.float32) ** skew
    ids = torch.multinomial(p.expand(T, -1), kr, replacement=False, generator=g)
    if one_expert is not None:
        hit = ids == one_expert
        ids = torch.where(hit, ids[:, :1], ids)  # swap it to slot 0 (ids stay distinct)
        ids[:, 0] = one_expert
    if drop:
        ids = torch.where(torch.rand(ids.shape, generator=g) < drop, -1, ids)
    if shared:
        ids = torch.cat([ids, torch.full((T, 1), E - 1, dtype=ids.dtype)], dim=1)
    return ids.to(torch.int32), torch.rand(T, k, generator=g) + 0.05


# ---- grouping ----


@pytest.mark.parametrize(
    "T,E,k,block_p,kw",
    [
        (37, 12, 4, 16, dict(skew=1.5)),  # skewed, 10 blocks, last one partial
        (29, 10, 9, 64, dict(shared=True, drop=0.3)),  # shared expert, -1 ids
        (40, 16, 2, 32, dict(live=[1, 5, 6])),  # 13 empty experts
        (25, 8, 3, 16, dict(one_expert=2)),
        (3, 300, 8, 1024, dict(drop=0.5)),  # NBINS = 512, one block
    ],
)
def test_group_by_expert_matches_torch(T, E, k, block_p, kw, seed):
    g = torch.Generator().manual_seed(seed)
    ids, _ = _routing(T, E, k, g, **kw)
    ids = ids.to(DEV)
    sorted_pair, counts, start = group_by_expert(ids, E, block_p)
    ref_sorted, ref_counts, ref_start = group_by_expert_torch(ids, E)
    n = ref_sorted.numel()
    assert torch.equal(counts[:E].long().cpu(), ref_counts.cpu())
    assert int(counts[E:].abs().sum()) == 0 and counts.numel() == num_bins(E)
    assert torch.equal(start[:E].long().cpu(), ref_start.cpu())
    assert torch.equal(sorted_pair[:n].long().cpu(), ref_sorted.cpu())


def test_max_m_tiles_is_a_tight_bound(seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(200):
        E = int(torch.randint(1, 40, (), generator=g))
        P = int(torch.randint(0, 300, (), generator=g))
        bm = 1 << int(torch.randint(4, 8, (), generator=g))
        counts = torch.bincount(torch.randint(0, E, (P,), generator=g), minlength=E)
        assert int(((counts + bm - 1) // bm).sum()) <= max_m_tiles(P, E, bm)
    # Worst case reached: min(E, P) experts with one row each, the rest on one expert.
    E, P, bm = 8, 100, 16
    counts = torch.tensor([P - E + 1] + [1] * (E - 1))
    assert int(((counts + bm - 1) // bm).sum()) == max_m_tiles(P, E, bm)


# ---- whole layer vs the reference ----


@dataclass(frozen=True)
class Case:
    name: str
    E: int
    H: int
    I: int
    T: int
    k: int
    cfg: PrefillConfig | None
    routing: dict


_SMALL = dict(block_m=16, block_p=64)
CASES = [
    Case(
        "skewed_k8_bk128",
        12,
        256,
        64,
        37,
        8,
        PrefillConfig(**_SMALL, block_n1=64, block_n2=64),
        dict(skew=1.5),
    ),
    Case(
        "shared_k9_drop_padded_HI_bk256",
        10,
        272,
        80,
        21,
        9,
        PrefillConfig(
            block_m=16,
            block_p=16,
            block_k1=256,
            block_k2=256,
            block_n1=32,
            block_n2=128,
            group_n2=2,  # 3 row blocks: one program takes 2, the next the last one
        ),
        dict(shared=True, drop=0.3),
    ),
    Case(
        "empty_experts_bm32",
        16,
        256,
        160,
        27,
        2,
        PrefillConfig(block_m=32, block_p=32, group_n2=2),  # GEMM2: 2 blocks x 2 K steps
        dict(live=[0, 3, 4, 9]),
    ),
    Case(
        "all_tokens_on_one_expert",
        8,
        256,
        64,
        45,
        2,
        PrefillConfig(**_SMALL, block_n2=32),
        dict(one_expert=5),
    ),
    Case(
        "atomic_combine_k9",
        10,
        272,
        80,
        19,
        9,
        PrefillConfig(**_SMALL, group_n2=4, combine="atomic"),
        dict(shared=True, drop=0.2),
    ),
    Case("heuristic_config", 12, 256, 64, 23, 8, None, dict(skew=0.5, drop=0.1)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_reference(case, seed):
    g = torch.Generator().manual_seed(seed)
    w, pw = _weights(case.E, case.H, case.I)
    ids, tw = _routing(case.T, case.E, case.k, g, **case.routing)
    x = torch.randn(case.T, case.H, generator=g).to(torch.bfloat16)
    x, ids, tw = x.to(DEV), ids.to(DEV), tw.to(DEV)
    out = torch.full((case.T, case.H), float("nan"), dtype=torch.bfloat16, device=DEV)  # poison
    res = fused_moe_nvfp4_prefill(x, pw, ids, tw, out=out, config=case.cfg)
    assert res is out
    st = assert_close(
        out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL, what=case.name
    )
    print(case.name, st)


def test_no_local_expert_zeros_int64_bf16_and_deterministic(seed):
    """Tokens without a local expert get zeros; int64 ids and bf16 weights; repeat bit-identical;
    a call with every slot dropped writes zeros everywhere."""
    g = torch.Generator().manual_seed(seed)
    w, pw = _weights(12, 256, 64)
    ids, tw = _routing(20, 12, 8, g, skew=1.0)
    ids[[2, 11]] = -1
    x = torch.randn(20, 256, generator=g).to(torch.bfloat16)
    x, ids, tw = x.to(DEV), ids.long().to(DEV), tw.to(torch.bfloat16).to(DEV)
    cfg = PrefillConfig(**_SMALL)
    out = torch.full((20, 256), float("nan"), dtype=torch.bfloat16, device=DEV)
    fused_moe_nvfp4_prefill(x, pw, ids, tw, out=out, config=cfg)
    assert out[[2, 11]].eq(0).all()
    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL)
    again = fused_moe_nvfp4_prefill(x, pw, ids, tw, config=cfg)
    assert torch.equal(again.view(torch.int16), out.view(torch.int16))
    z = torch.full((20, 256), float("nan"), dtype=torch.bfloat16, device=DEV)
    fused_moe_nvfp4_prefill(x, pw, torch.full_like(ids, -1), tw, out=z, config=cfg)
    assert z.eq(0).all()


def test_zero_tokens_and_validation():
    w, pw = _weights(12, 256, 64)
    x = torch.randn(4, 256).to(torch.bfloat16).to(DEV)
    ids = torch.zeros(4, 2, dtype=torch.int32, device=DEV)
    tw = torch.ones(4, 2, device=DEV)
    empty = fused_moe_nvfp4_prefill(x[:0], pw, ids[:0], tw[:0])
    assert empty.shape == (0, 256)
    bad = [
        (dict(weights=w), TypeError, "PreparedMoEWeights"),
        (dict(x=x.float()), ValueError, "hidden_states must be bfloat16"),
        (dict(x=x[:, :128].contiguous()), ValueError, "H=128"),
        (dict(ids=ids.float()), ValueError, "topk_ids must be int32 or int64"),
        (dict(ids=ids[:3]), ValueError, "(T, top_k)"),
        (dict(tw=tw.to(torch.int32)), ValueError, "topk_weights must be"),
        (dict(ids=ids.t().contiguous().t()), ValueError, "contiguous"),
        (dict(out=torch.empty(4, 256, device=DEV)), ValueError, "out must be a bfloat16"),
        (dict(config=dict(block_m=16)), TypeError, "PrefillConfig"),
    ]
    for kw, exc, msg in bad:
        args = dict(x=x, weights=pw, ids=ids, tw=tw, out=None, config=None) | kw
        with pytest.raises(exc, match=msg.replace("(", r"\(").replace(")", r"\)")):
            fused_moe_nvfp4_prefill(
                args["x"],
                args["weights"],
                args["ids"],
                args["tw"],
                out=args["out"],
                config=args["config"],
            )


# ---- config ----


def test_config_rules_and_round_trip():
    cfg = PrefillConfig(block_m=64, stages1=3, combine="atomic")
    assert eval(repr(cfg)) == cfg and hash(cfg) == hash(eval(repr(cfg)))
    assert PrefillConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(AttributeError):
        cfg.block_m = 32
    for bad in (
        dict(block_m=8),
        dict(block_m=48),
        dict(block_n1=16),
        dict(block_n2=256),
        dict(block_k1=64),
        dict(warps1=3),
        dict(stages2=0),
        dict(block_p=8),
        dict(combine="sum"),
        dict(block_m=64.0),
    ):
        with pytest.raises(ValueError):
            PrefillConfig(**bad)
    with pytest.raises(ValueError, match="unknown PrefillConfig fields"):
        PrefillConfig.from_dict({"block_t": 16})


def test_heuristic_is_deterministic_and_never_atomic():
    for shape in (
        MoEShape(257, 6144, 256, 9),
        MoEShape(32, 6144, 2048, 8),
        MoEShape(8, 128, 64, 2),
    ):
        for tgt in (
            Target("sm_90", None, 132),
            Target("sm_120", None, 188),
            Target("sm_80", None, 108),
        ):
            prev = 0
            for T in (1, 16, 256, 512, 1024, 2048, 4096, 8192, 65536):
                c = prefill_heuristic_config(T, shape, tgt)
                assert c == prefill_heuristic_config(T, shape, tgt)
                assert c.combine == "ordered"
                assert c.block_m >= prev  # more rows per expert never shrink the tile
                prev = c.block_m
    # GLM-5 TP8 at T = 4096: ~143 rows per routed expert -> one 256-row tile per expert on
    # sm_90 (227 KB of shared memory), capped at 128 rows on sm_120 (99 KB).
    glm5 = MoEShape(257, 6144, 256, 9)
    assert prefill_heuristic_config(4096, glm5, Target("sm_90", None, 132)).block_m == 256
    assert prefill_heuristic_config(4096, glm5, Target("sm_120", None, 188)).block_m == 128


# ---- AOT compilation (no GPU) ----

_AOT_SCRIPT = r"""
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_fp4ext.moe import _prefill_kernels as K
from sglang_fp4ext.moe.layout import K_CHUNK, ROW_ALIGN, KernelMatrix
from sglang_fp4ext.moe.prefill import _plan
from sglang_fp4ext.moe.prefill_config import PrefillConfig, prefill_heuristic_config
from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.shape import MoEShape, Target

PTR = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64",
       torch.uint8: "*u8"}
cc, req = int(sys.argv[1]), json.loads(sys.stdin.read())


def matrix(E, N, Kd):  # kernel layout on the meta device: shapes and strides, no memory
    Np, Kp = -(-N // ROW_ALIGN) * ROW_ALIGN, -(-Kd // K_CHUNK) * K_CHUNK
    m = lambda dt, *s: torch.empty(*s, dtype=dt, device="meta")
    return KernelMatrix(m(torch.uint8, E, Np, Kp // 2), m(torch.uint8, E, Kp // 256, Np, 16),
                        m(torch.float32, E, Np), N, Kd)


def specialise(fn, launch):
    # What a launch specialises on (Triton's runtime rule): ints equal to 1 become constexprs,
    # multiples of 16 (and 16-byte-aligned pointers) get tt.divisibility = 16.
    sig, consts, attrs = {}, dict(launch.constexprs), {}
    for i, (name, v) in enumerate(zip(fn.arg_names, launch.args)):
        if isinstance(v, torch.Tensor):
            sig[name] = PTR[v.dtype]
            div = v.data_ptr() % 16 == 0
        elif v == 1:
            sig[name], consts[name], div = "constexpr", 1, False
        else:
            sig[name], div = ("i32" if abs(v) < 2**31 else "i64"), v % 16 == 0
        if div:
            attrs[(i,)] = [["tt.divisibility", 16]]
    sig.update({n: "constexpr" for n in launch.constexprs})
    return sig, consts, attrs


seen, out = set(), []
for (E, H, I, k), T, arch, sms, cfg in req:
    w = PreparedMoEWeights(matrix(E, 2 * I, H), matrix(E, H, I))
    meta = lambda dt, *s: torch.empty(*s, dtype=dt, device="meta")
    shape, target = MoEShape(E, H, I, k), Target(arch, None, sms)
    cfg = eval(cfg) if cfg else prefill_heuristic_config(T, shape, target)
    x, o = meta(torch.bfloat16, T, H), meta(torch.bfloat16, T, H)
    for L in _plan(x, w, meta(torch.int32, T, k), meta(torch.float32, T, k), o, cfg, False):
        fn = getattr(K, L.kernel)
        sig, consts, attrs = specialise(fn, L)
        key = repr((L.kernel, sorted(sig.items()), sorted(consts.items()), sorted(attrs),
                    L.num_warps, L.num_stages))
        if key in seen:
            continue
        seen.add(key)
        c = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", cc, 32),
                           options=dict(num_warps=L.num_warps, num_stages=L.num_stages))
        ptx = c.asm["ptx"]
        mma = [m for m in ("tcgen05.mma", "wgmma", "mma.sync") if m in ptx]
        out.append(dict(kernel=L.kernel, shape=[E, H, I, k], T=T, config=repr(cfg),
                        shared=c.metadata.shared, mma=mma, warps=L.num_warps, stages=L.num_stages))
print(json.dumps(out))
"""

_ARCHS = {80: ("sm_80", 108), 90: ("sm_90", 132), 100: ("sm_100", 148), 120: ("sm_120", 188)}
_GLM5 = [(257, 6144, 256, 9), (32, 6144, 2048, 8)]  # TP8 with the fused shared expert; EP8


def _requests(cc):
    """The launches the heuristic makes for this arch at GLM-5 shapes -- every T bucket from 256 to
    8192 on sm_90 (H200) and sm_120 (RTX PRO 6000), T = 1024 and 4096 on sm_80/sm_100 (to keep
    the CPU tier short) -- plus the 256-deep K step and the atomic combine once, and on sm_90 the
    prefill entries of the shipped H200 table."""
    arch, sms = _ARCHS[cc]
    buckets = range(8, 14) if cc in (90, 120) else (10, 12)
    req = [[s, 1 << b, arch, sms, None] for s in _GLM5 for b in buckets]
    extra = (
        "PrefillConfig(block_m=64, block_n1=64, block_n2=64, block_k1=256, block_k2=256, "
        "stages1=2, stages2=2, combine='atomic')"
    )
    req.append([_GLM5[1], 4096, arch, sms, extra])
    if cc == 90:  # the prefill entries of the shipped H200 table (used on that GPU only)
        from sglang_fp4ext.moe import config as C

        for key, buckets in C.load_entries("NVIDIA H200").items():
            s = C.parse_shape_key(key)
            for b, entry in sorted(buckets.items()):
                if entry.path == "prefill":
                    req.append([[s.E, s.H, s.I, s.top_k], b, arch, sms, repr(entry.config)])
    return req


@pytest.fixture(scope="module")
def compiled():
    return compile_per_arch(_AOT_SCRIPT, {cc: _requests(cc) for cc in _ARCHS}, timeout=1200)


@pytest.mark.slow
@pytest.mark.parametrize("cc", [80, 90, 100, 120])
def test_aot_every_launch_compiles_with_tensor_cores(compiled, cc):
    res = compiled[cc]
    kernels = {r["kernel"] for r in res}
    assert kernels == {
        "_group_count",
        "_group_scan",
        "_group_scatter",
        "_prefill_gemm1",
        "_prefill_gemm2",
        "_prefill_combine",
    }
    for r in res:
        if r["kernel"].startswith("_prefill_gemm"):
            assert r["mma"], f"sm_{cc}: no tensor-core MMA in the PTX of {r}"
    if cc == 90:  # every launch fits the H200's opt-in shared memory per block
        assert max(r["shared"] for r in res) <= 232_448
    for r in sorted(res, key=lambda r: -r["shared"])[:4]:
        print(f"sm_{cc} {r['kernel']} shared={r['shared']} mma={r['mma']} {r['config']}")


@pytest.mark.slow
def test_aot_sm120_shared_memory_fits(compiled):
    worst = max(compiled[120], key=lambda r: r["shared"])
    print("sm_120 worst shared memory:", worst)
    assert worst["shared"] <= SM120_SMEM_PER_BLOCK, worst


# ---- GPU tier: GLM-5 shapes, graph capture, determinism ----

@pytest.mark.gpu
@pytest.mark.parametrize("name", ["tp8_shared", "ep8"])
@pytest.mark.parametrize("T", [512, 1024, 2048, 4096, 8192])
def test_glm5_vs_reference(name, T, seed):
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    out = torch.full((T, 6144), float("nan"), dtype=torch.bfloat16, device="cuda")
    fused_moe_nvfp4_prefill(x, pw, ids, tw, out=out)
    st = assert_close(
        out,
        fused_moe_nvfp4_torch(x, w, ids, tw),
        max_rel=MAX_REL,
        rms_rel=RMS_REL,
        what=f"{name} T={T}",
    )
    print(f"{name} T={T}: {st}")


@pytest.mark.gpu
@pytest.mark.parametrize("name,T", [("tp8_shared", 512), ("ep8", 1024)])
def test_glm5_atomic_combine_vs_reference(name, T, seed):
    w, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    cfg = prefill_heuristic_config(T, pw.shape(ids.shape[1]), Target("sm_90", None, 132))
    out = fused_moe_nvfp4_prefill(
        x, pw, ids, tw, config=PrefillConfig(**(cfg.to_dict() | {"combine": "atomic"}))
    )
    assert_close(out, fused_moe_nvfp4_torch(x, w, ids, tw), max_rel=MAX_REL, rms_rel=RMS_REL)


@pytest.mark.gpu
@pytest.mark.parametrize("name,T", [("tp8_shared", 512), ("ep8", 2048)])
def test_graph_replay_matches_eager_bit_for_bit(name, T, seed):
    """Capture once; replays with new inputs copied into the static buffers (routing changes, so
    every expert's tile count changes) equal eager calls bit for bit."""
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = 12
    inputs = [glm5_cases.inputs(name, T, g) for _ in range(n)]
    inputs[3][1][: T // 2] = -1  # half the tokens without a local expert
    inputs[5][1][:, 0] = 7  # one expert gets every token
    sx, sids, stw = (t.clone() for t in inputs[0])
    sout = torch.empty(T, 6144, dtype=torch.bfloat16, device="cuda")
    fused_moe_nvfp4_prefill(sx, pw, sids, stw, out=sout)  # warm-up: compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe_nvfp4_prefill(sx, pw, sids, stw, out=sout)
    for i, (x, ids, tw) in enumerate(inputs):
        sx.copy_(x)
        sids.copy_(ids)
        stw.copy_(tw)
        sout.fill_(float("nan"))
        graph.replay()
        eager = fused_moe_nvfp4_prefill(x, pw, ids, tw)
        assert torch.equal(eager.view(torch.int16), sout.view(torch.int16)), f"replay {i} differs"


@pytest.mark.gpu
@pytest.mark.parametrize("name,T", [("tp8_shared", 2048), ("ep8", 4096)])
def test_deterministic_across_runs(name, T, seed):
    _, pw = glm5_cases.weights(name)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x, ids, tw = glm5_cases.inputs(name, T, g)
    first = fused_moe_nvfp4_prefill(x, pw, ids, tw)
    for _ in range(10):
        assert torch.equal(
            fused_moe_nvfp4_prefill(x, pw, ids, tw).view(torch.int16), first.view(torch.int16)
        )
