"""Ahead-of-time compilation of the decode kernels for sm_80, sm_90, sm_100 and sm_120 (no GPU).

Every kernel specialisation used by a tuned table or by the heuristic for the GLM-5 TP8/EP8 shapes
(token bucket 1; H200 and RTX PRO 6000 targets) is compiled for sm_90 and sm_120 with
``triton.compile(ASTSource, target=GPUTarget(...))``; sm_80 and sm_100 compile one slot-grid and
one expert-grid specialisation (compiles cost ~3 s each on the 2-core CI machine). The PTX must use
tensor-core MMA and, on sm_120 (RTX PRO 6000), shared memory per block must stay within 101,376
bytes. Kernels decorated under ``TRITON_INTERPRET=1`` cannot be compiled, so each architecture
compiles in a subprocess without that variable (two at a time).
"""

import json

import pytest

from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe.decode.heuristic import heuristic_config
from sglang_fp4ext.moe.shape import MoEShape, Target
from sglang_fp4ext.target_info import SM120_SMEM_PER_BLOCK
from tests.kernel_cases import compile_per_arch

_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_fp4ext.moe.decode import _dot_kernels as K

cc, variants = int(sys.argv[1]), json.loads(sys.stdin.read())
P1 = dict(x_ptr="*bf16", ids_ptr="*i32", q_ptr="*u8", s_ptr="*u8", a_ptr="*fp32",
          inter_ptr="*bf16", ws_ptr="*fp32", cnt_ptr="*i32", plist_ptr="*i32", pcnt_ptr="*i32")
P2 = dict(inter_ptr="*bf16", ids_ptr="*i32", tw_ptr="*fp32", q_ptr="*u8", s_ptr="*u8",
          a_ptr="*fp32", out_ptr="*bf16", ws_ptr="*fp32", cnt_ptr="*i32", plist_ptr="*i32",
          pcnt_ptr="*i32")
# What the JIT specialises on the real tensors: 16-byte aligned pointers, strides divisible by 16.
DIV = set(P1) | set(P2) | {"H", "I", "NP", "stride_x", "q_e_stride", "q_row_stride",
                           "s_e_stride", "s_chunk_stride", "stride_out"}
out = []
for v in variants:
    fn, ptrs = {1: (K._moe_gemm1, P1), 2: (K._moe_gemm2, P2), 3: (K._moe_gemm2_tok, P2)}[
        v["kernel"]]
    consts = v["constexprs"]
    sig = {n: ("constexpr" if n in consts else ptrs.get(n, "i32")) for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in fn.arg_names if n in DIV}
    k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", cc, 32),
                       options=dict(num_warps=v["num_warps"], num_stages=v["num_stages"]))
    ptx = k.asm["ptx"]
    out.append(dict(v, shared=k.metadata.shared, mma=("mma.sync" in ptx) or ("wgmma" in ptx)
                    or ("tcgen05.mma" in ptx), packed_decode="fma.rn.bf16x2" in ptx))
print(json.dumps(out))
"""


def _variants():
    """Distinct kernel specialisations of all table + heuristic configs (a Gluon config as its
    tl.dot fallback: the tiles the self-check falls back to)."""
    shapes = {MoEShape(257, 6144, 256, 9), MoEShape(256, 6144, 256, 8), MoEShape(32, 6144, 2048, 8)}
    cfgs = set()
    for path in sorted(C.SHIPPED_CONFIG_DIR.glob("*.json")):
        for key, buckets in C.load_table(json.loads(path.read_text())["device_name"]).items():
            E, H, I, k = (int(kv.split("=")[1]) for kv in key.split(","))
            cfgs |= {(k, c) for c in buckets.values()}
    for s in shapes:
        for tgt in (Target("sm_90", None, 132), Target("sm_120", None, 188)):
            cfgs.add((s.top_k, heuristic_config(1, s, tgt)))
    cfgs = {(k, c.reform(kernels="dot")) for k, c in cfgs}
    seen, out = set(), []
    for k, c in sorted(cfgs, key=repr):
        slot = c.grid == "slots"
        # top_k, split_k and tiles2 are runtime arguments: they do not multiply the variants.
        v1 = dict(
            kernel=1,
            num_warps=c.warps1,
            num_stages=c.stages1,
            constexprs=dict(
                SLOT_MODE=slot, BN=c.block_n1, BT=c.block_t, BLOCK_P=c.block_p, COMPUTE_F32=False
            ),
        )
        v2 = dict(
            kernel=2,
            num_warps=c.warps2,
            num_stages=c.stages2,
            constexprs=dict(
                K_POW2=1 << (k - 1).bit_length(),
                SLOT_MODE=slot,
                BN=c.block_n2,
                BT=c.block_t,
                COMPUTE_F32=False,
            ),
        )
        if c.gemm2 == "tokens":
            v2 = dict(
                kernel=3,
                num_warps=c.warps2,
                num_stages=c.stages2,
                constexprs=dict(
                    K_POW2=1 << (k - 1).bit_length(), BN=c.block_n2, BT=c.block_t, COMPUTE_F32=False
                ),
            )
        for v in (v1, v2):
            key = json.dumps(v, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(v)
    return out


@pytest.fixture(scope="module")
def compiled():
    variants = _variants()
    subset = [v for v in variants if v["constexprs"].get("SLOT_MODE") is True][:1]
    subset += [v for v in variants if v["constexprs"].get("SLOT_MODE") is False][:1]
    subset += [v for v in variants if v["kernel"] == 2][:1]
    subset += [v for v in variants if v["kernel"] == 3][:1]
    todo = {80: subset, 90: variants, 100: subset, 120: variants}
    return todo, compile_per_arch(_SCRIPT, todo, timeout=900)


@pytest.mark.parametrize("cc", [80, 90, 100, 120])
def test_every_config_compiles_with_tensor_cores(compiled, cc):
    todo, results = compiled
    assert len(results[cc]) == len(todo[cc]) > 0
    for r in results[cc]:
        assert r["mma"], f"sm_{cc}: no tensor-core mma in PTX for {r}"
        assert r["packed_decode"], f"sm_{cc}: no inline-PTX bf16x2 decode in PTX for {r}"


def test_sm120_shared_memory_fits(compiled):
    _, results = compiled
    worst = max(results[120], key=lambda r: r["shared"])
    assert worst["shared"] <= SM120_SMEM_PER_BLOCK, worst
