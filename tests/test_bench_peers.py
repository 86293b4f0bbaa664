"""SGLang peers of the benchmark suite (``bench/peers.py``), the suite's reproducible inputs and
slowed config (``bench/gpu_run.py``), and the renderer of the README's and docs/performance.md's
generated tables (``benchmarks/readme_table.py``) with the results manifest it reads.

CPU tier: each peer's availability rule (missing modules, no GPU, too old a GPU) and its answer
on this machine; a peer that cannot run refuses with its reason instead of running anything; the
weight preparation both peers share and FlashInfer's (real code, prepared on the CPU; calling
the kernels needs SGLang on a GPU, which no machine of this project has); inputs that depend
on (seed, T) only; the slowed config is the real kernels, correct, and forced; the generated
blocks equal their rendering from the committed JSON, and the manifest accounts for every
results file.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_fp4ext import model_shapes, target_info
from sglang_fp4ext.bench import peers
from sglang_fp4ext.bench.gpu_run import slowed_config
from sglang_fp4ext.bench.layer import Layer
from sglang_fp4ext.moe.tables import override_config
from sglang_fp4ext.moe.weights import random_moe_weights
from sglang_fp4ext.nvfp4.format import unswizzle_blockscale

ROOT = Path(__file__).resolve().parents[1]
no_gpu = pytest.mark.skipif(target_info.has_cuda_gpu(), reason="CPU path: this machine has a GPU")

# ---- availability ------------------------------------------------------------------------------


def test_reason_names_every_missing_module():
    spec = peers.SGLANG_PEERS["sglang-marlin"]
    got = peers.peer_unavailable_reason(spec, ["sgl_kernel", "tvm_ffi"], (9, 0))
    assert got == "sglang-marlin: sgl_kernel, tvm_ffi not importable on this machine"


def test_reason_without_gpu():
    for spec in peers.SGLANG_PEERS.values():
        got = peers.peer_unavailable_reason(spec, [], None)
        assert got == f"{spec.name}: no CUDA GPU on this machine"


@pytest.mark.parametrize(
    "name, cap, need",
    [
        ("sglang-flashinfer_cutlass", (8, 0), "sm_100"),
        ("sglang-flashinfer_cutlass", (9, 0), "sm_100"),
        ("sglang-flashinfer_cutlass", (10, 0), None),
        ("sglang-flashinfer_cutlass", (12, 0), None),
        ("sglang-marlin", (7, 5), "sm_80"),
        ("sglang-marlin", (8, 0), None),
        ("sglang-marlin", (9, 0), None),
        ("sglang-marlin", (12, 0), None),
    ],
)
def test_reason_by_architecture(name, cap, need):
    got = peers.peer_unavailable_reason(peers.SGLANG_PEERS[name], [], cap)
    if need is None:
        assert got is None
    else:
        assert got == f"{name}: needs {need} or newer, this GPU is sm_{cap[0]}{cap[1]}"


def test_availability_on_this_machine():
    cap = target_info.device_capability()
    for name, spec in peers.SGLANG_PEERS.items():
        got = peers.sglang_peer_unavailable(name)
        missing = [m for m in spec.modules if importlib.util.find_spec(m) is None]
        if missing:
            assert got is not None and all(m in got for m in missing), got
        elif cap is None:
            assert got == f"{name}: no CUDA GPU on this machine"
        else:
            assert (got is None) == (cap >= spec.min_capability), got
    with pytest.raises(KeyError, match="no SGLang peer 'sglang-triton'"):
        peers.sglang_peer_unavailable("sglang-triton")


@no_gpu
@pytest.mark.parametrize("name", sorted(peers.SGLANG_PEERS))
def test_peer_refuses_where_it_cannot_run(name, seed):
    g = torch.Generator().manual_seed(seed)
    w = random_moe_weights(2, 64, 32, generator=g)
    reason = peers.sglang_peer_unavailable(name)
    assert reason is not None
    with pytest.raises(RuntimeError) as exc:
        peers.make_sglang_peer(name, w, x_calib=torch.randn(4, 64, generator=g), ep_size=1)
    assert str(exc.value) == reason


# ---- weight preparation ------------------------------------------------------------------------


def test_shared_gate_up_scale(seed):
    g = torch.Generator().manual_seed(seed)
    w = random_moe_weights(3, 64, 32, generator=g)
    before = w.w13_scale_2.clone()
    s = peers.shared_gate_up_scale(w)
    assert torch.equal(s.w13_scale_2[:, 1], w.w13_scale_2[:, 0])
    assert torch.equal(s.w13_scale_2[:, 0], w.w13_scale_2[:, 0])
    assert torch.equal(w.w13_scale_2, before)  # the original pack is untouched
    assert s.w13 is w.w13 and s.w2_scale_2 is w.w2_scale_2
    a, b = w.dequantize()[0], s.dequantize()[0]
    assert torch.equal(a[:, :32], b[:, :32])  # gate rows unchanged


def test_calibrate_input_scales_hand_computed(seed):
    g = torch.Generator().manual_seed(seed)
    E, H, I = 5, 64, 32
    w = random_moe_weights(E, H, I, generator=g)
    x = torch.randn(7, H, generator=g).to(torch.bfloat16)
    s1, s2 = peers.calibrate_input_scales(w, x, chunk=2)  # chunks of 2, 2, 1 experts
    w13, _ = w.dequantize()
    assert s1.shape == (E,) and torch.all(s1 == x.float().abs().max() / (448 * 6))
    for e in range(E):
        h = x.float() @ w13[e].T
        amax = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]).abs().max()
        torch.testing.assert_close(s2[e], amax / (448 * 6), rtol=1e-5, atol=0)


def test_flashinfer_cutlass_weight_preparation(seed):
    """SGLang's flashinfer_cutlass preparation, built on the CPU (the call needs Blackwell):
    w13 rows [up; gate], 128x4-swizzled block scales as int32, per-expert alphas."""
    pytest.importorskip("flashinfer.fused_moe")
    g = torch.Generator().manual_seed(seed)
    E, H, I = 3, 128, 64
    w = random_moe_weights(E, H, I, generator=g)
    x = torch.randn(6, H, generator=g).to(torch.bfloat16)
    a = peers.SGLangFlashInferCutlassMoE(w, x, ep_size=2)
    assert a.w4a4 and not peers.SGLangMarlinMoE.w4a4  # which twin checks each
    s1, s2 = peers.calibrate_input_scales(w, x)
    ref = a.weights
    assert torch.equal(ref.w13_input_scale, s1) and torch.equal(ref.w2_input_scale, s2)
    assert torch.equal(ref.w13_scale_2[:, 1], w.w13_scale_2[:, 0])
    w13 = a.w13.view(torch.uint8)
    assert a.w13.dtype == torch.long and w13.shape == w.w13.shape
    assert torch.equal(w13[:, :I], w.w13[:, I:]) and torch.equal(w13[:, I:], w.w13[:, :I])
    assert torch.equal(a.w2.view(torch.uint8), w.w2)
    a1g, sf1, alpha1, a2g, sf2, alpha2 = a.quant_scales
    assert sf1.dtype == torch.int32 and sf2.dtype == torch.int32
    sf1 = unswizzle_blockscale(sf1.view(torch.float8_e4m3fn), 2 * I, H // 16).view(torch.uint8)
    up_first = torch.cat([w.w13_scale[:, I:], w.w13_scale[:, :I]], dim=1).view(torch.uint8)
    assert torch.equal(sf1, up_first)
    sf2 = unswizzle_blockscale(sf2.view(torch.float8_e4m3fn), H, I // 16).view(torch.uint8)
    assert torch.equal(sf2, w.w2_scale.view(torch.uint8))
    torch.testing.assert_close(a1g, 1.0 / s1.max(), rtol=0, atol=0)
    torch.testing.assert_close(alpha1, s1.max() * w.w13_scale_2[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(a2g, 1.0 / s2, rtol=0, atol=0)
    torch.testing.assert_close(alpha2, s2 * w.w2_scale_2, rtol=0, atol=0)


# ---- suite inputs and the slowed config --------------------------------------------------------

TINY_EP2 = model_shapes.ModelShape("tiny-ep2", 16, 4, 256, 128, 2, n_shared=1, ep=2)


def test_layer_inputs_depend_on_seed_and_T_only(seed):
    a = Layer(TINY_EP2, 2, seed=seed, device="cpu", l2_bytes=0)
    a.inputs(5)  # another T first: must not change T = 3's draw
    xa, ra, _ = a.inputs(3)
    b = Layer(TINY_EP2, 2, seed=seed, device="cpu", l2_bytes=0)
    xb, rb, _ = b.inputs(3)
    for i in range(len(xa)):
        assert torch.equal(xa[i], xb[i]) and torch.equal(ra[i][0], rb[i][0])
    assert not torch.equal(xa[0], xa[1])  # each rotated input is its own draw
    c = Layer(TINY_EP2, 2, seed=seed + 1, device="cpu", l2_bytes=0)
    assert not torch.equal(c.inputs(3)[0][0], xa[0])


def test_slowed_config_runs_the_real_kernels_correctly(seed):
    from sglang_fp4ext.moe.decode.heuristic import heuristic_config

    slow = slowed_config()
    dev = "cuda" if target_info.has_cuda_gpu() else "cpu"  # CPU: kernels under the interpreter
    layer = Layer(TINY_EP2, 1, seed=seed, device=dev, l2_bytes=0)
    mshape = layer.prepared[0].shape(TINY_EP2.top_k_local)
    for T in (1, 9):
        from sglang_fp4ext.moe.shape import current_target

        assert slow != heuristic_config(T, mshape, current_target())
        with override_config(slow):
            assert layer.config(T) == slow
            check = layer.check(T, "decode")
        assert check["ok"], check
        ids = layer.inputs(T)[1][0][0]
        # (T = 1 under EP2 may route every expert to the other rank: exact zeros on both sides.)
        assert check["rms_rel"] > 0 or not bool((ids >= 0).any()), check
    assert layer.config(1) != slow  # the override ends with its context


# ---- README and docs/performance.md generated blocks (benchmarks/readme_table.py) --------------


def _readme_table():
    spec = importlib.util.spec_from_file_location(
        "readme_table", ROOT / "benchmarks/readme_table.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _manifest_paths(man: dict) -> set[str]:
    """Every results path the manifest names (figure sources, kept folders and files)."""
    out = set(man["regression"]["paths"]) | set(man["provenance"]["paths"])
    for fig in man["figures"].values():
        out |= set(fig.get("paths", []))
        out |= {fig[k] for k in ("marlin", "ab", "path") if fig.get(k)}
        out |= set((fig.get("tk") or {}).values()) | set(fig.get("tk_dirs", []))
    return out


def test_generated_blocks_match_the_committed_results():
    """README.md and docs/performance.md hold every generated block exactly as
    ``readme_table.py`` renders it from the JSON the manifest names."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/readme_table.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + "\nrun: python benchmarks/readme_table.py --write"


def test_readme_headline_is_the_manifests_runs():
    """The headline: for each GPU the manifest names, its rows at the manifest's T come from that
    run's Marlin and triton_kernels JSON, and every point where a peer was faster is named."""
    rt = _readme_table()
    man = rt.manifest()
    text = (ROOT / "README.md").read_text()
    block = text.split(rt.start_marker("headline"))[1].split(rt.end_marker("headline"))[0]
    assert block.strip() == rt.headline().strip()
    # CI runs the README's test command.
    cmd = "python -m pytest tests -n auto --dist loadfile"
    assert cmd in text and cmd in (ROOT / ".ci/run").read_text()
    for name in man["headline"]["gpus"]:
        fig = man["figures"][name]
        m = json.loads((rt.RESULTS / fig["marlin"]).read_text())
        assert f"**{m['env']['gpu']}**" in block
        rows = [r for r in m["rows"] if r["T"] in man["headline"]["T"]]
        assert len(rows) == 2 * len(man["headline"]["T"])
        for r in rows:
            shape = r["shape"].split("_")[1]
            tk = json.loads((rt.RESULTS / fig["tk"][shape]).read_text())
            t = next(x for x in tk["results"] if x["T"] == r["T"])
            assert (
                f"| {shape.upper()} | {r['T']} | {r['fp4ext_us']:.1f} | {r['marlin_us']:.1f} | "
                f"{t['tk']['us']:.1f} ({t['fp4ext']['us']:.1f}) | {r['fp4ext_pct_bw']:.0f}% |"
            ) in block
        section = block.split(f"**{m['env']['gpu']}**")[1].split("Over every T")[1]
        marlin_part, tk_part = section.split("\n")[0].split("; faster than `triton_kernels`")
        for r in m["rows"]:  # every T the run measured, not only the headline's
            shape = r["shape"].split("_")[1]
            named = f"{shape.upper()} T = {r['T']} (" in marlin_part
            assert named == (r["marlin_over_fp4ext"] < 1), (shape, r["T"])
            tk = json.loads((rt.RESULTS / fig["tk"][shape]).read_text())
            t = next(x for x in tk["results"] if x["T"] == r["T"])
            assert (f"{shape.upper()} T = {r['T']} (" in tk_part) == (t["tk_over_fp4ext"] < 1)


def test_performance_md_prefill_and_floor_rows_are_the_files():
    rt = _readme_table()
    doc = (ROOT / "docs/performance.md").read_text()
    fig = rt.manifest()["figures"]["prefill_peers_h200"]
    r, _ = rt.tk_prefill_points(rt.RESULTS / fig["tk_dirs"][0], "tp8")[4096]
    assert f"| TP8 | 4096 | {r['fp4ext']['us']:.1f} | {r['tk']['us']:.1f} |" in doc
    ab = json.loads((rt.RESULTS / fig["ab"]).read_text())
    us = {x["name"]: x for x in ab["rows"] if x["preset"] == "glm5-ep8" and x["T"] == 4096}
    v1, v2, bf = us["v1"], us["v2 shipped"], us["torch bf16"]
    assert f"{v1['us']:.0f} → {v2['us']:.0f} ({v1['us'] / v2['us']:.2f}) | {bf['us']:.0f} " in doc
    fl_file = rt.RESULTS / rt.manifest()["figures"]["decode_floors_h200"]["path"]
    fl = json.loads(fl_file.read_text())["rows"][0]
    assert (
        f"| {fl['shape']} | {fl['T']} | {fl['distinct']:.1f} | {fl['floor']:.1f} | "
        f"{fl['stream1']:.1f} | {fl['stream2']:.1f} | {fl['launch2']:.1f} |" in doc
    )
    assert doc.count("**Regression-gate baseline**") == 0  # the block names its files instead
    for b in rt.baseline_files():
        assert f"`{b.relative_to(rt.RESULTS)}`" in doc


def test_write_replaces_only_the_block_and_check_sees_a_stale_one(tmp_path):
    rt = _readme_table()
    start, end = rt.start_marker("x"), rt.end_marker("x")
    doc = f"head\n{start}\nstale\n{end}\ntail\n"
    assert rt.replace_block(doc, "x", "NEW") == f"head\n{start}\n\nNEW\n\n{end}\ntail\n"
    readme = (ROOT / "README.md").read_text()
    stale = readme.replace("| TP8 | 1 |", "| TP8 | 1 | 0.0 |", 1)
    assert stale != readme and rt.rendered(rt.README, rt.blocks()[rt.README], stale) != stale
    with pytest.raises(SystemExit):
        rt.replace_block("no markers", "x", "NEW")


def test_results_manifest_names_existing_runs_and_covers_every_file():
    """Every path benchmarks/results/manifest.json names exists, and every file under
    benchmarks/results is one of them or inside one (nothing kept that backs nothing)."""
    rt = _readme_table()
    paths = _manifest_paths(rt.manifest())
    missing = sorted(p for p in paths if not (rt.RESULTS / p).exists())
    assert not missing, f"manifest names missing results: {missing}"
    uncovered = []
    for f in rt.RESULTS.rglob("*"):
        if not f.is_file() or f == rt.MANIFEST:
            continue
        rel = f.relative_to(rt.RESULTS)
        if not any(rel == Path(p) or Path(p) in rel.parents for p in paths):
            uncovered.append(str(rel))
    assert not uncovered, f"results no manifest entry backs: {sorted(uncovered)[:20]}"


def test_readme_suite_table_lists_each_peer(tmp_path):
    """Formatting only: a pytest-benchmark file built here (inputs to the renderer, not
    measurements) with an SGLang peer next to the torch one."""
    rt = _readme_table()
    base = {"gpu": "NVIDIA B200", "versions": {"torch": "2.11", "triton": "3.6"}, "copies": 4,
            "copy_bandwidth_TBps": 7.0, "bf16_matmul_tflops": 1500.0, "preset": "glm5-tp8",
            "T": 4, "calls_per_replay": 16}  # fmt: skip
    ours = dict(base, impl="fp4ext-decode", us=20.0, floor_us=10.0, fraction_of_copy_bw=0.5,
                tflops=3.0, fraction_of_bf16_matmul=0.002,
                speedup_vs={"torch-bf16": 4.0, "sglang-marlin": 1.5})  # fmt: skip
    bench = [{"extra_info": dict(base, impl="torch-bf16", us=80.0), "stats": {"min": 1e-3}},
             {"extra_info": dict(base, impl="sglang-marlin", us=30.0), "stats": {"min": 1e-3}},
             {"extra_info": ours, "stats": {"min": 1e-3}}]  # fmt: skip
    p = tmp_path / "0001_x.json"
    p.write_text(json.dumps({"benchmarks": bench, "datetime": "2027-01-02T03:04:05",
                             "version": "5.2.3", "commit_info": {"id": "abcdef0123"}}))  # fmt: skip
    text = rt.suite_tables(p, "X")
    assert (
        "vs sglang-marlin" in text
        and "| 4 | 20.0 | 10.0 | 50% | 3.0 (0.2%) | 1.50× | 4.00× |" in text
    )
    assert "Not in this file" in text and "sglang-flashinfer_cutlass" in text
    assert "commit abcdef0" in text and "NVIDIA B200" in text
