"""Ahead-of-time compilation of the Gluon decode kernels (v2) for sm_80/90/100/120 (no GPU).

Gluon kernels cannot run under the Triton interpreter (it executes ``triton.language`` only), so
the CPU tier checks them by compiling, and the GPU tier (``test_decode_gpu.py``) by running them
against the torch twin. Every Gluon config the shipped tables name, plus the Gluon form of the
heuristic's configs for the GLM-5 TP8/EP8 shapes (GEMM1, token GEMM2 and pairs GEMM2), is compiled
with ``triton.compile( GluonASTSource, target=GPUTarget(...))`` with the Triton installed here (3.8
in CI) and, where a
Triton 3.6 site directory exists (``.ci/triton36``, which ``.ci/run`` installs, or
``$FP4EXT_TRITON36``), with 3.6 too (the H200's version). The PTX must hold what the design relies
on: ``mma.sync`` m16n8k16 bf16, the inline FP4 decode (``fma.rn.bf16x2``), 16-byte global loads,
and no shared-memory traffic besides the routing scan's few words (<= 64 bytes); on sm_120 shared
memory per block stays within 101,376 bytes. ``convert_layout(..., assert_trivial=True)`` in the
kernels makes the compile itself fail if a layout change would move data between threads.
"""

import dataclasses
import json

import pytest

from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.shape import MoEShape, Target
from sglang_fp4ext.target_info import SM120_SMEM_PER_BLOCK
from tests.kernel_cases import compile_per_arch, triton36_site

_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from sglang_fp4ext.moe.decode import _gluon_kernels as G

cc, variants = int(sys.argv[1]), json.loads(sys.stdin.read())
P1 = dict(x_ptr="*bf16", ids_ptr="*i32", q_ptr="*u8", s_ptr="*u8", a_ptr="*fp32",
          inter_ptr="*bf16", ws_ptr="*fp32", cnt_ptr="*i32", plist_ptr="*i32", pcnt_ptr="*i32")
P2 = dict(inter_ptr="*bf16", ids_ptr="*i32", tw_ptr="*fp32", q_ptr="*u8", s_ptr="*u8",
          a_ptr="*fp32", out_ptr="*bf16")
P3 = dict(P2, ws_ptr="*fp32", cnt_ptr="*i32", plist_ptr="*i32", pcnt_ptr="*i32")
P5 = dict(ws_ptr="*fp32", ids_ptr="*i32", out_ptr="*bf16")
# What the JIT specialises on the real tensors: 16-byte aligned pointers, strides divisible by 16.
DIV = set(P1) | set(P2) | {"H", "I", "NP", "stride_x", "q_e_stride", "q_row_stride",
                           "s_e_stride", "s_chunk_stride", "stride_out"}
out = []
for v in variants:
    fn, ptrs = {1: (G._gemm1, P1), 2: (G._gemm2_tok, P2), 3: (G._gemm2, P3),
                5: (G._combine, P5), 6: (G._gemm2_tok_slots, P2),
                7: (G._gemm1_kstack, P1)}[v["kernel"]]
    # Copies of the row tile along the MMA rows: slots (6), K splits (7).
    c = v["constexprs"]
    kp = {6: min(c.get("K_POW2", 1), 8), 7: c.get("KS")}.get(v["kernel"], 1)
    lay = dict(G.layouts(kp * v["BN"], v["BT"], v["num_warps"])) if v["kernel"] != 5 else {}
    consts = dict(v["constexprs"], **lay)
    sig = {n: ("constexpr" if n in consts else ptrs.get(n, "i32")) for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in fn.arg_names if n in DIV}
    opts = dict(num_warps=v["num_warps"])
    if v.get("maxnreg_asked"):
        opts["maxnreg"] = v["maxnreg_asked"]
    k = triton.compile(GluonASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", cc, 32),
                       options=opts)
    ptx = k.asm["ptx"]
    out.append(dict(v, triton=triton.__version__, shared=k.metadata.shared,
                    mma="mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx,
                    decode="fma.rn.bf16x2" in ptx, wide_loads=ptx.count("ld.global.v4"),
                    acquire=".gpu.acquire." in ptx, release=".gpu.release." in ptx,
                    cp_async="cp.async" in ptx, cp_async16=ptx.count("cp.async.cg.shared.global"),
                    wait_group="cp.async.wait_group" in ptx, bar_sync=ptx.count("bar.sync"),
                    gdc_wait="griddepcontrol.wait" in ptx,
                    gdc_launch="griddepcontrol.launch_dependents" in ptx,
                    l2_prefetch=ptx.count("prefetch.global.L2"),
                    maxnreg=int(ptx.split(".maxnreg")[1].split()[0]) if ".maxnreg" in ptx else 0))
print(json.dumps(out))
"""


def _served_heuristic(shape):
    """The heuristic's configs as a GPU runs them, buckets 1..256 on sm_90 and sm_120."""
    from sglang_fp4ext import target_info

    real, target_info.is_interpreter = target_info.is_interpreter, lambda: False
    try:
        return {
            heuristic_config(T, shape, tgt)
            for T in (1, 2, 4, 8, 16, 64, 256)
            for tgt in (Target("sm_90", None, 132), Target("sm_120", None, 188))
        }
    finally:
        target_info.is_interpreter = real


def _gluon_configs():
    """(top_k, DecodeConfig) of every Gluon config: tables + the heuristic's tiles as Gluon."""
    cfgs = set()
    for path in sorted(C.SHIPPED_CONFIG_DIR.glob("*.json")):
        for key, buckets in C.load_table(json.loads(path.read_text())["device_name"]).items():
            k = int(key.split("top_k=")[1])
            cfgs |= {(k, c) for c in buckets.values() if getattr(c, "kernels", "") == "gluon"}
    shapes = (MoEShape(257, 6144, 256, 9), MoEShape(32, 6144, 2048, 8))
    # What the heuristic serves where Gluon runs (the interpreter's heuristic is the dot
    # family): its stacked GEMM1, side-by-side slots (top_k 8, no EP: TP8, DeepSeek-R1 TP8,
    # Qwen3-30B-A3B) and hot-expert pair chunks (the fused shared expert).
    for s in shapes + (
        MoEShape(256, 6144, 256, 8),
        MoEShape(256, 7168, 256, 8),
        MoEShape(128, 2048, 768, 8),
    ):
        cfgs |= {(s.top_k, c) for c in _served_heuristic(s)}
    for s in shapes:
        for tgt in (Target("sm_90", None, 132), Target("sm_120", None, 188)):
            for T in (1, 16, 128):
                c = heuristic_config(T, s, tgt)
                cfgs.add((s.top_k, c.reform(kernels="gluon")))
        for T in (64, 256):  # GEMM2 partials summed by a third launch, pair chunks split
            c = heuristic_config(T, s, Target("sm_90", None, 132))
            if c.gemm2 == "pairs":
                c = c.reform(kernels="gluon", combine="kernel")
                cfgs |= {(s.top_k, c), (s.top_k, dataclasses.replace(c, split_t=8))}
        for T, pdl in ((1, 1), (4, 1), (64, 1), (1, 2), (64, 2)):  # PDL (sm_90+), both triggers
            c = heuristic_config(T, s, Target("sm_90", None, 132))
            c = c.reform(kernels="gluon", pdl=pdl)
            if c.gemm2 == "pairs":
                c = dataclasses.replace(c, combine="kernel")
            cfgs.add((s.top_k, c))
        for T, w, pdl in ((1, 1, 2), (2, 1, 0), (2, 2, 0), (8, 1, 0)):  # slot-parallel token GEMM2
            c = heuristic_config(T, s, Target("sm_90", None, 132))
            c = c.reform(
                kernels="gluon",
                gemm2="tokens",
                split_k2=1,
                tiles2=1,
                block_n2=max(c.block_n2, 16 * w),
                warps2=w,
                slots2=1,
                pdl=pdl,
                combine="counter",
            )
            cfgs.add((s.top_k, c))
        for T, sk, bn, w, pdl in (
            (1, 8, 32, 1, 2),
            (1, 8, 64, 2, 0),
            (2, 4, 32, 1, 0),
            (2, 2, 64, 4, 1),
        ):  # GEMM1's K splits stacked in a program
            c = heuristic_config(T, s, Target("sm_90", None, 132))
            cfgs.add(
                (
                    s.top_k,
                    c.reform(
                        kernels="gluon", kstack1=1, split_k1=sk, block_n1=bn, warps1=w, pdl=pdl
                    ),
                )
            )
        for T in (128, 256):  # a register cap on GEMM1 (maxnreg1, opt-in)
            c = heuristic_config(T, s, Target("sm_90", None, 132)).reform(kernels="gluon")
            if not c.kstack1:
                cfgs.add((s.top_k, c.reform(kernels="gluon", maxnreg1=128)))
    return cfgs


def _variants():
    """Distinct kernel specialisations (split-K, top_k and the grid are runtime arguments)."""
    seen, out = set(), []
    for k, c in sorted(_gluon_configs(), key=repr):
        pdl = dict(PDL=c.pdl)  # AOT: constexprs are named, defaults too
        vs = [
            dict(
                kernel=1,
                BN=c.block_n1,
                BT=c.block_t,
                num_warps=c.warps1,
                constexprs=dict(
                    SLOT_MODE=c.grid == "slots",
                    BN=c.block_n1,
                    BT=c.block_t,
                    BLOCK_P=c.block_p,
                    SPLIT_T=c.split_t,
                    **pdl,
                ),
            )
        ]
        if c.maxnreg1:  # a launch option, not a constexpr
            vs[0]["maxnreg_asked"] = c.maxnreg1
        if c.kstack1:
            vs = [
                dict(
                    kernel=7,
                    BN=c.block_n1,
                    BT=8,
                    num_warps=c.split_k1 * c.warps1,
                    constexprs=dict(
                        SLOT_MODE=c.grid == "slots",
                        BN=c.block_n1,
                        BT=8,
                        BLOCK_P=c.block_p,
                        KS=c.split_k1,
                        **pdl,
                    ),
                )
            ]
        k_pow2 = 1 << (k - 1).bit_length()
        if c.slots2:
            vs.append(
                dict(
                    kernel=6,
                    BN=c.block_n2,
                    BT=8,
                    num_warps=min(k_pow2, 8) * c.warps2,
                    constexprs=dict(K_POW2=k_pow2, BN=c.block_n2, BT=8, **pdl),
                )
            )
        elif c.gemm2 == "tokens":
            vs.append(
                dict(
                    kernel=2,
                    BN=c.block_n2,
                    BT=c.block_t,
                    num_warps=c.warps2,
                    constexprs=dict(K_POW2=k_pow2, BN=c.block_n2, BT=c.block_t, **pdl),
                )
            )
        else:
            vs.append(
                dict(
                    kernel=3,
                    BN=c.block_n2,
                    BT=c.block_t,
                    num_warps=c.warps2,
                    constexprs=dict(
                        K_POW2=k_pow2,
                        SLOT_MODE=c.grid == "slots",
                        BN=c.block_n2,
                        BT=c.block_t,
                        COMBINE=c.combine == "counter",
                        SPLIT_T=c.split_t,
                        **pdl,
                    ),
                )
            )
            if c.combine == "kernel":
                vs.append(
                    dict(kernel=5, BN=0, BT=0, num_warps=4, constexprs=dict(BLOCK=1024, **pdl))
                )
        for v in vs:
            key = json.dumps(v, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(v)
    return out


@pytest.fixture(scope="module")
def compiled():
    variants = _variants()
    some = [
        next(v for v in variants if v["kernel"] == i and not v["constexprs"].get("PDL"))
        for i in (1, 2, 3, 5, 6, 7)
    ]
    pdl = [
        next(v for v in variants if v["kernel"] == i and v["constexprs"].get("PDL") == p)
        for i in (1, 2, 3, 5)
        for p in (1, 2)
    ]  # griddepcontrol: sm_90+ (none on sm_80)
    pdl += [
        next(v for v in variants if v["kernel"] == i and v["constexprs"]["PDL"] == 2)
        for i in (6, 7)
    ]
    todo = {80: some, 90: variants, 100: some + pdl, 120: variants}
    res = {"3.8": compile_per_arch(_SCRIPT, todo, timeout=900)}
    site = triton36_site()
    if site:
        res["3.6"] = compile_per_arch(_SCRIPT, {90: variants, 120: some}, 900, site)
    return todo, res


def test_there_are_gluon_configs_to_compile():
    kinds = {v["kernel"] for v in _variants()}
    assert kinds == {1, 2, 3, 5, 6, 7}, kinds
    assert {v["constexprs"]["KS"] for v in _variants() if v["kernel"] == 7} == {2, 4, 8}
    assert {v["constexprs"]["K_POW2"] for v in _variants() if v["kernel"] == 6} == {8, 16}
    assert {v.get("maxnreg_asked") for v in _variants() if v["kernel"] == 1} >= {None, 128}
    pdl = {(v["kernel"], v["constexprs"]["PDL"]) for v in _variants() if v["constexprs"].get("PDL")}
    assert pdl == {(k, p) for k in (1, 2, 3, 5) for p in (1, 2)} | {(6, 2), (7, 1), (7, 2)}, pdl


@pytest.mark.parametrize("cc", [80, 90, 100, 120])
def test_every_gluon_config_compiles_to_the_design(compiled, cc):
    todo, res = compiled
    got = res["3.8"][cc]
    assert len(got) == len(todo[cc]) > 0
    for r in got:
        if r["kernel"] == 5:  # the top-k sum: fp32 loads and adds only
            assert r["shared"] == 0 and not r["cp_async"], r
            continue
        assert r["mma"] and r["decode"], f"sm_{cc}: no bf16 mma.sync / inline decode: {r}"
        if r["kernel"] == 6:
            _check_slots(r, cc)
        elif r["kernel"] == 7:
            _check_kstack(r, cc)
        else:
            assert r["wide_loads"] >= 4 and not r["cp_async"], f"sm_{cc}: loads not direct: {r}"
            assert r["shared"] <= 64, f"sm_{cc}: unexpected shared memory: {r}"
        # GEMM1's register cap (maxnreg1) reaches ptxas as the kernel's .maxnreg, and only there
        assert r["maxnreg"] == r.get("maxnreg_asked", 0), f"sm_{cc}: {r}"
        _check_pdl(r, cc)


def _check_slots(r, cc):
    """The slot-parallel token GEMM2: direct 16-byte weight loads as the others; its shared
    memory is each slot's products and coefficients, fp32 2 x [K_POW2 * BN] (their slot-order
    sum reads them back after one CTA barrier)."""
    sums = 2 * r["constexprs"]["K_POW2"] * r["BN"] * 4
    assert r["wide_loads"] >= 4 and not r["cp_async"], f"sm_{cc}: loads not direct: {r}"
    assert sums <= r["shared"] <= sums + 64 and r["bar_sync"] >= 1, f"sm_{cc}: {r}"


def _check_kstack(r, cc):
    """GEMM1 with its K splits stacked in one program: direct 16-byte loads as the others, no
    arrival counter; its shared memory is the splits' gate and up partials, fp32 2 x [KS * BN /
    2] per pair of a pass x 8 / KS pairs = 8 * BN * 4 bytes, summed after a CTA barrier."""
    sums = 8 * r["BN"] * 4
    assert r["wide_loads"] >= 4 and not r["cp_async"], f"sm_{cc}: loads not direct: {r}"
    assert not r["acquire"] and not r["release"], f"sm_{cc}: split-K counter left in: {r}"
    assert sums <= r["shared"] <= sums + 64 and r["bar_sync"] >= 2, f"sm_{cc}: {r}"


def _check_pdl(r, cc):
    """A PDL variant waits for the previous grid and lets the next start (1: every kernel, at
    once; 2: GEMM1 after its K loops, the others implicitly at exit); a GEMM2 that knows its
    experts before GEMM1 ends (token GEMM2, slot-grid pairs GEMM2) prefetches their weights into
    L2 first. Without PDL none of it is in the PTX."""
    c = r["constexprs"]
    if not c.get("PDL"):
        assert not (r["gdc_wait"] or r["gdc_launch"]), f"sm_{cc}: {r}"
        assert r["l2_prefetch"] == 0, f"sm_{cc}: L2 prefetch without PDL: {r}"
        return
    launches = c["PDL"] == 1 or r["kernel"] in (1, 7)
    assert cc >= 90 and r["gdc_wait"] and r["gdc_launch"] == launches, f"sm_{cc}: {r}"
    prefetches = r["kernel"] in (2, 6) or (r["kernel"] == 3 and c["SLOT_MODE"])
    assert (r["l2_prefetch"] > 0) == prefetches, f"sm_{cc}: L2 prefetch: {r}"


def test_sm120_shared_memory_fits(compiled):
    _, res = compiled
    assert max(r["shared"] for r in res["3.8"][120]) <= SM120_SMEM_PER_BLOCK


def test_triton_36_compiles_them_too(compiled):
    _, res = compiled
    if "3.6" not in res:
        pytest.skip(
            "no Triton 3.6 site dir (.ci/triton36 or $FP4EXT_TRITON36): .ci/run installs one"
        )
    for cc, rows in res["3.6"].items():
        assert rows and all(r["triton"].startswith("3.6") for r in rows), rows
        for r in rows:
            ok = r["kernel"] == 5 or r["mma"] and r["decode"] and r["wide_loads"] >= 4
            assert ok, f"3.6 sm_{cc}: {r}"
            _check_pdl(r, cc)


def _plan(cfg, family="gluon", *, E=8, H=512, top_k=2, pdl=0, T=3):
    """``decode.plan`` of one call on CPU tensors (nothing is launched)."""
    import torch

    from sglang_fp4ext.moe.decode import plan as decode
    from sglang_fp4ext.moe.prepared import PreparedMoEWeights
    from sglang_fp4ext.moe.weights import random_moe_weights

    pw = PreparedMoEWeights.from_moe_weights(random_moe_weights(E, H, 64))
    x = torch.randn(T, H).to(torch.bfloat16)
    ids = torch.arange(T * top_k, dtype=torch.int32).reshape(T, top_k) % E
    out = torch.empty(T, H, dtype=torch.bfloat16)
    return decode.plan(x, pw, ids, torch.rand(T, top_k), out, cfg, family, pdl), pw


_LAUNCH_OPTIONS = {"num_warps", "num_stages", "launch_pdl", "maxnreg"}  # Triton's


def _assert_named_fully(launch):
    """Every argument by name, each naming a parameter of the kernel, and only Triton's options
    beside them (an unknown keyword fails only at launch, on a GPU)."""
    assert set(launch.kwargs) == set(launch.fn().arg_names), (
        launch.kernel,
        set(launch.kwargs) ^ set(launch.fn().arg_names),
    )
    assert set(launch.options) <= _LAUNCH_OPTIONS, launch.options


@pytest.mark.parametrize("gemm2", ["tokens", "pairs"])
def test_both_families_take_the_launchers_arguments(gemm2):
    """The plan passes one argument set to either family: each Gluon kernel takes the dot
    kernel's arguments, its layouts (and COMBINE, SPLIT_T, PDL) instead of COMPUTE_F32."""
    from sglang_fp4ext.moe.decode.config import GluonDecodeConfig

    cfg = GluonDecodeConfig(gemm2=gemm2, combine="counter")
    gluon, _ = _plan(cfg, "gluon")
    dot, _ = _plan(cfg, "dot")
    assert len(gluon) == len(dot) == 2
    for g, d in zip(gluon, dot):
        _assert_named_fully(g)
        _assert_named_fully(d)
        assert set(d.kwargs) - {"COMPUTE_F32"} == set(g.kwargs) - {
            "WL",
            "XL",
            "ML",
            "COMBINE",
            "SPLIT_T",
            "PDL",
        }
        assert g.kwargs["BT"] == d.kwargs["BT"] == cfg.block_t and g.grid[:2] == d.grid[:2]
        assert g.options["num_warps"] == d.options["num_warps"] and "num_stages" in d.options


@pytest.mark.parametrize(
    "knobs",
    [
        dict(gemm2="tokens"),
        dict(gemm2="tokens", pdl=2),
        dict(gemm2="tokens", slots2=1, block_n2=32, warps2=1),
        dict(gemm2="tokens", kstack1=1, split_k1=4, block_n1=32, warps1=1),
        dict(gemm2="pairs", pdl=1, combine="kernel", split_t=2),
        dict(gemm2="pairs", kstack1=1, split_k1=2),
        dict(gemm2="pairs", maxnreg1=128, split_t=2),
    ],
)
def test_every_launch_keyword_is_a_kernel_parameter(knobs):
    """Each launch of the plan, for each knob, names every parameter of the kernel it launches
    and nothing else (a keyword meant for one role must not reach another)."""
    from sglang_fp4ext.moe.decode.config import GluonDecodeConfig

    cfg = GluonDecodeConfig(**knobs)
    launches, _ = _plan(cfg, "gluon", H=2048, top_k=8, pdl=cfg.pdl)
    assert len(launches) == (3 if cfg.combine == "kernel" else 2)
    for launch in launches:
        _assert_named_fully(launch)
        assert ("launch_pdl" in launch.options) == bool(cfg.pdl)
    assert ("maxnreg" in launches[0].options) == bool(cfg.maxnreg1)


def test_slot_parallel_token_gemm2_takes_the_same_arguments():
    """``slots2=1`` swaps the token GEMM2 for ``_gemm2_tok_slots`` under the same launch: the
    same arguments, up to 8 times the warps and rows, an MMA column per slot of a round."""
    from sglang_fp4ext.moe.decode import _gluon_kernels as G
    from sglang_fp4ext.moe.decode.config import GluonDecodeConfig

    cfg = GluonDecodeConfig(gemm2="tokens", slots2=1, block_n2=32, warps2=2)
    (_, g), _ = _plan(cfg, E=16, top_k=9)
    assert g.kernel == "_gemm2_tok_slots" and g.fn().arg_names == G._gemm2_tok.arg_names
    assert g.options["num_warps"] == 16 and g.kwargs["BT"] == 8  # 8 slots a round, 2 rounds
    assert g.kwargs["WL"] == G.weight_layout(8 * 32, 16)
    with pytest.raises(ValueError, match="more than 32"):
        _plan(dataclasses.replace(cfg, warps2=8, block_n2=128), E=16, top_k=9)


def test_split_stacked_gemm1_takes_the_same_arguments():
    """``kstack1=1`` swaps GEMM1 for ``_gemm1_kstack`` under the same launch: the same arguments,
    ``split_k1`` times the warps and rows in one program, 8 MMA columns, and no K splits left
    on the grid; GEMM1's K chunks must divide into the splits."""
    from sglang_fp4ext.moe.decode import _gluon_kernels as G
    from sglang_fp4ext.moe.decode.config import GluonDecodeConfig

    cfg = GluonDecodeConfig(split_k1=8, kstack1=1, block_n1=32, warps1=1)
    (g, _), pw = _plan(cfg, H=2048)
    assert g.kernel == "_gemm1_kstack"
    assert [a for a in g.fn().arg_names if a != "KS"] == [
        a for a in G._gemm1.arg_names if a != "SPLIT_T"
    ]
    assert g.options["num_warps"] == 8 and g.kwargs["BT"] == 8 and g.kwargs["KS"] == 8
    assert g.kwargs["WL"] == G.weight_layout(8 * 32, 8)
    assert g.grid == (6, pw.w13.n_pad // 32, 1)
    (d, _), _ = _plan(cfg, "dot", H=2048)  # the dot family splits across programs
    assert d.grid == (6, pw.w13.n_pad // 32, 8)
    with pytest.raises(ValueError, match="to divide into split_k1=8 equal splits"):
        _plan(cfg, H=512)
