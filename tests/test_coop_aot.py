"""Ahead-of-time compilation of the one-launch decode family (``CoopDecodeConfig``) for
sm_80/90/100/120 with the Triton installed here (3.8 in CI) and Triton 3.6 (the H200's) where its
site directory exists (``tests.kernel_cases.triton36_site``).

The interpreter cannot run Gluon, so the CPU tier compiles exactly what ``decode.plan`` launches
(on meta tensors) and reads the design off the PTX: a cooperative launch, ``mma.sync`` with the
inline FP4 decode, the grid-wide wait (an acq_rel arrival, a release of the generation by the last
to arrive, an acquire spin by the rest), GEMM2's weights asked of L2 (``prefetch.global.L2``)
before that wait, and the register cap that keeps the grid resident; ptxas reports the registers
and spills, and shared memory stays within sm_120's 101,376 bytes a block. The GPU tier is
``tests/test_coop_gpu.py``.
"""

import json

import pytest

from sglang_fp4ext.moe import tables as C
from sglang_fp4ext.moe.decode.config import CoopDecodeConfig
from sglang_fp4ext.target_info import SM120_SMEM_PER_BLOCK
from tests.kernel_cases import compile_per_arch, triton36_site

_SCRIPT = r"""
import json, sys
import triton
from sglang_fp4ext.bench.aot_compile import compile_launch, decode_launches
from sglang_fp4ext.moe.decode.config import CoopDecodeConfig
from sglang_fp4ext.moe.shape import MoEShape, Target

cc, req = int(sys.argv[1]), json.loads(sys.stdin.read())
out = []
for (E, H, I, k), T, cfg in req:
    target = Target(f"sm_{cc}", None, 188 if cc == 120 else 132)
    [L] = decode_launches(T, MoEShape(E, H, I, k), eval(cfg), target)
    c, info = compile_launch(L, cc)  # info: the report of the ptxas run that built it
    ptx = c.asm["ptx"]
    regs = [int(l.split("Used ")[1].split()[0]) for l in info.splitlines() if "Used " in l]
    spill = [int(l.split("bytes spill stores")[0].split(",")[-1]) for l in info.splitlines()
             if "spill stores" in l]
    out.append(dict(shape=[E, H, I, k], T=T, config=cfg, triton=triton.__version__,
                    grid=L.grid[0], warps=L.options["num_warps"], maxnreg=L.options["maxnreg"],
                    cooperative=bool(c.metadata.launch_cooperative_grid),
                    shared=c.metadata.shared,
                    mma="mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx,
                    decode="fma.rn.bf16x2" in ptx,
                    arrive="atom.global.gpu.acq_rel.add" in ptx,
                    release="atom.global.gpu.release.add" in ptx,
                    spin="ld.global.gpu.acquire" in ptx,
                    l2_prefetch=ptx.count("prefetch.global.L2"),
                    ptx_maxnreg=int(ptx.split(".maxnreg")[1].split()[0]) if ".maxnreg" in ptx
                    else 0,
                    ptxas_regs=regs[0] if regs else None, spill_stores=spill[0] if spill else None,
                    ptxas_error="" if regs else info[-300:]))
print(json.dumps(out))
"""

#: What the GPU tier runs (``test_coop_gpu.CONFIGS``) at GLM-5 TP8 (top_k 8 and 9), EP8 and
#: Qwen3-30B-A3B (8 K chunks of GEMM1, I = 768).
_FIXED = (
    "CoopDecodeConfig(split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32)",
    "CoopDecodeConfig(split_k1=8, warps1=2, block_n1=32, warps2=2, block_n2=32, prefetch2=2)",
    "CoopDecodeConfig(split_k1=4, warps1=2, block_n1=32, warps2=1, block_n2=32, prefetch2=0)",
)
_SHAPES = ((256, 6144, 256, 8), (257, 6144, 256, 9), (32, 6144, 2048, 8), (128, 2048, 768, 8))


def _requests():
    """``((E, H, I, top_k), T, repr(config))``: the fixed configs at every shape (T = 1), and every
    one-launch config the shipped tables name, at its shape and bucket."""
    req = [(s, 1, c) for s in _SHAPES for c in _FIXED]
    for path in sorted(C.SHIPPED_CONFIG_DIR.glob("*.json")):
        for key, buckets in C.load_table(json.loads(path.read_text())["device_name"]).items():
            dims = dict(kv.split("=") for kv in key.split(","))
            s = tuple(int(dims[d]) for d in ("E", "H", "I", "top_k"))
            req += [(s, T, repr(c)) for T, c in buckets.items() if c.kernels == "coop"]
    return sorted(set(req))


@pytest.fixture(scope="module")
def compiled():
    req = _requests()
    res = {"3.8": compile_per_arch(_SCRIPT, {cc: req for cc in (80, 90, 100, 120)}, 900)}
    site = triton36_site()
    if site:
        res["3.6"] = compile_per_arch(_SCRIPT, {90: req, 120: req[:3]}, 900, site)
    return res


def test_every_config_compiles_to_the_design(compiled):
    rows = [(cc, r) for per_cc in compiled.values() for cc, rs in per_cc.items() for r in rs]
    assert rows and len(compiled["3.8"]) == 4
    for cc, r in rows:
        what = f"{r['config']} at {r['shape']} on sm_{cc} (Triton {r['triton']})"
        assert r["cooperative"], what
        assert r["mma"] and r["decode"], what
        assert r["arrive"] and r["release"] and r["spin"], f"grid-wide wait: {what}"
        assert (r["l2_prefetch"] > 0) == ("prefetch2=0" not in r["config"]), what
        # The register cap that makes the grid resident: 64 K registers an SM.
        assert r["ptx_maxnreg"] == r["maxnreg"], what
        assert r["ptxas_regs"] is not None and r["ptxas_regs"] <= r["maxnreg"], r["ptxas_error"]
        assert r["grid"] <= (188 if cc == 120 else 132), what  # one program an SM
        assert r["maxnreg"] * 32 * r["warps"] <= 65536, what


def test_16_row_warp_tiles_spill_little(compiled):
    """Within the register cap, 16-row warp tiles (``block_n1 = 16 * warps1``, ``block_n2 = 16 *
    warps2``) spill at most a few words (16 warps: 0-240 bytes with Triton 3.8, top_k 9 on sm_80
    the most); 32-row warp tiles spill 300-1,200 bytes, which is why the family uses 16."""
    checked = 0
    for per_cc in compiled.values():
        for cc, rows in per_cc.items():
            for r in rows:
                c = eval(r["config"], {"CoopDecodeConfig": CoopDecodeConfig})
                if c.block_n1 == 16 * c.warps1 and c.block_n2 == 16 * c.warps2:
                    assert r["spill_stores"] is not None and r["spill_stores"] <= 256, (cc, r)
                    checked += 1
    assert checked


def test_sm120_shared_memory_fits(compiled):
    for per_cc in compiled.values():
        for r in per_cc.get(120, []):
            assert r["shared"] <= SM120_SMEM_PER_BLOCK, r


def test_triton_36_compiles_them_too(compiled):
    if "3.6" not in compiled:
        pytest.skip("no Triton 3.6 site directory (.ci/run installs one at .ci/triton36)")
    assert {r["triton"] for rs in compiled["3.6"].values() for r in rs} == {"3.6.0"}
