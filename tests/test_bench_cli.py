"""``fp4ext bench`` (``bench/bench_cli.py`` and the ``bench/`` modules it runs) and the
benchmark suite's GPU-less collection.

CPU tier: the CLI end to end without a GPU (correctness check only, JSON fields, PNG written,
no timing reported), bad input, the projection arithmetic against hand-computed values, the
float64 oracle's sensitivity, and ``pytest benchmarks`` skipping cleanly. GPU tier: the CLI's
measuring path at a small setting.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_fp4ext import hardware, model_shapes, target_info
from sglang_fp4ext.bench import cpu_check, figures, report, table
from sglang_fp4ext.bench.bench_cli import main
from sglang_fp4ext.bench.layer import Layer, make_routing
from sglang_fp4ext.bench.peers import SGLANG_PEERS, sglang_peer_unavailable
from sglang_fp4ext.moe import paths

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOP_KEYS = {
    "schema", "mode", "date", "env", "preset", "settings", "dispatch", "rates", "rows", "check",
    "projection", "plot", "notes",
}  # fmt: skip
ENV_KEYS = {
    "gpu", "capability", "sms", "spec_key", "torch", "triton", "cuda", "python", "sglang_fp4ext",
    "sglang", "date",
}  # fmt: skip
ROW_KEYS = {
    "T", "path", "served", "config", "inputs_rotated", "distinct_experts", "bytes_floor", "flops",
    "floor_us", "us", "us_min", "us_max", "achieved_TBps", "fraction_of_copy_bw", "tflops",
    "fraction_of_bf16_matmul", "peer_us", "speedup_vs_torch_peer", "check", "sglang_peers",
}  # fmt: skip
no_gpu = pytest.mark.skipif(target_info.has_cuda_gpu(), reason="CPU path: this machine has a GPU")


def _keys(obj) -> set:
    """Every dict key anywhere in a JSON value."""
    if isinstance(obj, dict):
        return set(obj) | set().union(*(_keys(v) for v in obj.values()))
    if isinstance(obj, list):
        return set().union(*(_keys(v) for v in obj)) if obj else set()
    return set()


@no_gpu
@pytest.mark.parametrize("preset", ["glm5-tp8", "glm5-ep8"])
def test_cli_cpu_path_end_to_end(tmp_path, capsys, seed, preset):
    pytest.importorskip("matplotlib")
    rc = main(
        ["--preset", preset, "--tokens", "1,3,64", "--seed", str(seed), "--out", str(tmp_path),
         "--name", "b", "--project", "rtx-pro-6000-ws"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "nothing is timed" in err and "no CUDA GPU" in out
    assert "PROJECTION" not in out and "needs times measured on a GPU" in out

    png = tmp_path / "b.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == PNG_MAGIC
    d = json.loads((tmp_path / "b.json").read_text())
    assert set(d) == TOP_KEYS
    assert d["schema"] == report.SCHEMA and d["mode"] == "cpu-check" and d["plot"] == "b.png"
    assert set(d["env"]) == ENV_KEYS and d["env"]["gpu"] is None
    assert d["env"]["torch"] == torch.__version__
    assert d["preset"]["name"] == preset
    assert d["preset"]["expert_bytes"] == model_shapes.preset(preset).expert_bytes
    assert d["settings"]["tokens"] == [1, 3, 64] and d["settings"]["seed"] == seed
    assert d["dispatch"]["paths"] == {"1": "decode", "3": "decode", "64": "decode"}
    # Nothing measured, so no time or speed anywhere in the file.
    assert d["rows"] == []
    assert not _keys(d) & {"us", "us_min", "peer_us", "achieved_TBps", "tflops"}
    assert d["rates"]["copy_bandwidth_Bps"] is None and d["rates"]["bf16_matmul_tflops"] is None
    assert "not measured" in d["rates"]["spec_label"]
    # The reference-path check ran (twin vs float64 and kernels under the interpreter, T <= 8).
    whats = [c["what"] for c in d["check"]]
    assert whats.count("torch twin (fp32) vs float64 oracle") == 2
    assert sum("interpreter" in w for w in whats) == 2
    assert [c["T"] for c in d["check"]] == [1, 1, 3, 3]
    for c in d["check"]:
        assert c["ok"] and c["nonfinite"] == 0 and c["rms_rel"] > 0, c
    p = d["projection"]
    assert p["target_key"] == "rtx-pro-6000-ws" and p["rows"] == []
    assert any("nothing was timed" in n for n in d["notes"])


@no_gpu
def test_cli_cpu_twin_only_writes_outputs(tmp_path, capsys, seed):
    pytest.importorskip("matplotlib")
    rc = main(["--no-interpreter", "--seed", str(seed), "--out", str(tmp_path / "o")])
    out, _ = capsys.readouterr()
    assert rc == 0, out
    js = tmp_path / "o" / "bench_glm5-tp8_cpu.json"
    d = json.loads(js.read_text())
    assert [c["what"] for c in d["check"]] == ["torch twin (fp32) vs float64 oracle"] * 2
    assert d["projection"] is None
    assert (tmp_path / "o" / d["plot"]).read_bytes()[:8] == PNG_MAGIC


def test_cli_bad_input(tmp_path, capsys):
    assert main(["--project", "rtx-9999", "--out", str(tmp_path)]) == 2
    assert "no GPU 'rtx-9999' in the hardware table" in capsys.readouterr().err
    for argv in (["--tokens", "0,4"], ["--tokens", "a"], ["--preset", "glm6"], ["--copies", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert not any(tmp_path.iterdir())


def test_add_bench_parser_wires_a_subcommand():
    import argparse

    from sglang_fp4ext.bench.bench_cli import add_bench_parser, run

    parser = argparse.ArgumentParser(prog="fp4ext")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "--preset", "glm5-ep8", "--tokens", "2,8"])
    assert args.func is run and args.preset == "glm5-ep8" and args.tokens == [2, 8]
    assert args.copies == 4 and args.out == "."


def test_projection_hand_computed():
    """H200 (spec 4800 GB/s) measured 100 us moving 2e8 B at 4.0 TB/s -> RTX PRO 6000 WS
    (spec 1792 GB/s) streaming at the same 4.0/4.8 of spec: 1.49333 TB/s."""
    shape = model_shapes.preset("glm5-tp8")  # 75 MoE layers
    rows = [{"T": 4, "us": 100.0, "bytes_floor": 2e8}]
    h200, pro = hardware.spec_by_key("h200"), hardware.spec_by_key("rtx-pro-6000-ws")
    p = figures.project_rows(rows, shape, 4.0e12, pro, h200)
    r = p["rows"][0]
    assert r["projected_layer_us"] == pytest.approx(100.0 * 4800 / 1792, rel=1e-12)  # 267.857
    assert r["projected_step_us"] == pytest.approx(267.857142857 * 75, rel=1e-9)
    assert r["projected_us_per_token"] == pytest.approx(267.857142857 * 75 / 4, rel=1e-9)
    assert r["target_floor_us"] == pytest.approx(2e8 / (1.792e12 * 4.0 / 4.8) * 1e6, rel=1e-12)
    assert r["label"].startswith("PROJECTION (not measured)")
    assert p["source_spec"] == "h200" and p["n_moe_layers"] == 75
    # Without a source spec: the target's full spec bandwidth (said to be optimistic).
    q = figures.project_rows(rows, shape, 4.0e12, pro, None)
    assert q["rows"][0]["projected_layer_us"] == pytest.approx(100.0 * 4.0 / 1.792, rel=1e-12)
    assert any("optimistic" in a for a in q["assumptions"])


def test_prefill_projection_hand_computed():
    """A prefill row measured on the H200 (1,667 us for F FLOPs at a measured 794 TFLOP/s bf16
    matmul, spec 989) -> RTX PRO 6000 WS (dense bf16 504, FP4 2015 TFLOPS): the same fraction of
    the achievable MMA rate gives us x 989 / peak, i.e. 3,271 us W4A16 and 818 us W4A4 (served:
    the target has FP4 tensor cores), each no faster than the target's bytes floor."""
    shape = model_shapes.preset("glm5-tp8")
    h200, pro = hardware.spec_by_key("h200"), hardware.spec_by_key("rtx-pro-6000-ws")
    F = 3 * 2 * 4096 * 8 * 6144 * 256
    rows = [
        {"T": 4096, "us": 1667.0, "bytes_floor": 7.8e8, "path": "prefill", "flops": F},
        {"T": 1, "us": 26.0, "bytes_floor": 1.1e8, "path": "decode", "flops": 1e9},
    ]
    p = figures.project_rows(rows, shape, 4.0e12, pro, h200, 794.0)
    r, d = p["rows"]
    assert r["prefill_w4a16_us"] == pytest.approx(1667.0 * 989 / 504, rel=1e-9)
    assert r["prefill_w4a4_us"] == pytest.approx(1667.0 * 989 / 2015, rel=1e-9)
    assert r["prefill_format"] == "w4a4" and r["projected_layer_us"] == r["prefill_w4a4_us"]
    assert r["prefill_w4a4_us"] > r["target_floor_us"]
    assert "PROJECTION (not measured)" in r["label"] and "FP4 MMA" in r["label"]
    assert "prefill_format" not in d  # decode rows: bandwidth projection only
    # A tiny byte-light measurement cannot project below the target's bytes floor.
    fast = figures.project_rows([dict(rows[0], us=10.0)], shape, 4.0e12, pro, h200, 794.0)
    q = fast["rows"][0]
    assert q["prefill_w4a4_us"] == pytest.approx(q["target_floor_us"], rel=1e-12)
    # H200 as the target: no FP4 tensor cores, W4A16 served.
    h = figures.project_rows(rows[:1], shape, 4.0e12, h200, h200, 794.0)["rows"][0]
    assert h["prefill_format"] == "w4a16" and h["prefill_w4a4_us"] is None
    assert h["prefill_w4a16_us"] == pytest.approx(1667.0, rel=1e-9)


def test_projection_random_cases(seed):
    rng = random.Random(seed)
    specs = [s for s in hardware.all_specs()]
    for _ in range(20):
        shape = rng.choice(list(model_shapes.PRESETS.values()))
        src, tgt = rng.choice(specs), rng.choice(specs)
        us, nbytes = rng.uniform(5, 5000), rng.uniform(1e6, 1e9)
        T = rng.choice([1, 7, 64, 8192])
        bw = src.mem_bandwidth_Bps * rng.uniform(0.5, 0.95)
        r = figures.project_rows([{"T": T, "us": us, "bytes_floor": nbytes}], shape, bw, tgt, src)
        layer = us * src.mem_bandwidth_gbs / tgt.mem_bandwidth_gbs  # bandwidth ratio of specs
        got = r["rows"][0]
        assert got["projected_layer_us"] == pytest.approx(layer, rel=1e-9)
        assert got["projected_us_per_token"] == pytest.approx(
            layer * shape.n_moe_layers / T, rel=1e-9
        )


def test_row_numbers_hand_computed():
    shape = model_shapes.preset("glm5-ep8")  # H 6144, I_local 2048, top_k 8, 21,233,676 B/expert
    r = figures.row_numbers(
        shape, 2, 3.0, 50.0, copy_bw_Bps=4e12, matmul_tflops=500.0, peer_us=75.0
    )
    nbytes = 3 * 21_233_676 + 2 * 2 * 6144 * 2
    assert r["bytes_floor"] == nbytes
    assert r["floor_us"] == pytest.approx(nbytes / 4e12 * 1e6)
    assert r["achieved_TBps"] == pytest.approx(nbytes / 50e-6 / 1e12)
    assert r["fraction_of_copy_bw"] == pytest.approx(nbytes / 50e-6 / 4e12)
    flops = 2 * 2 * 8 * 3 * 6144 * 2048 / 8  # EP8: rank 0 owns 1/8 of the pairs on average
    assert r["tflops"] == pytest.approx(flops / 50e-6 / 1e12)
    assert r["fraction_of_bf16_matmul"] == pytest.approx(flops / 50e-6 / 1e12 / 500.0)
    assert r["speedup_vs_torch_peer"] == pytest.approx(1.5)


def test_float64_oracle_agrees_with_twin_and_catches_a_wrong_scale(seed):
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
    from sglang_fp4ext.moe.weights import random_moe_weights
    from sglang_fp4ext.testing.compare import error_stats

    g = torch.Generator().manual_seed(seed)
    w = random_moe_weights(6, 64, 32, generator=g)
    shape = model_shapes.ModelShape("tiny", 6, 2, 64, 32, 1)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    ids, tw, _ = make_routing(shape, 3, device="cpu", generator=g)
    twin = fused_moe_nvfp4_torch(x, w, ids, tw)
    st = error_stats(twin, cpu_check.moe_f64(x, w, ids, tw))
    assert st.rms_rel < 1e-6 and st.max_rel < 1e-5, st  # fp32 vs fp64 sums of K <= 64
    e = int(ids[0, 0])
    w.w2_scale_2[e] *= 1.5
    bad = error_stats(twin, cpu_check.moe_f64(x, w, ids, tw))
    assert bad.rms_rel > 1e-2, bad


def test_make_routing_layouts(seed):
    g = torch.Generator().manual_seed(seed)
    ep = model_shapes.preset("glm5-ep8")
    ids, tw, d = make_routing(ep, 64, device="cpu", generator=g)
    assert ids.shape == (64, 8) and ids.dtype == torch.int32
    assert ((ids == -1) | ((ids >= 0) & (ids < 32))).all() and (ids == -1).any()
    assert d == len(set(ids[ids >= 0].tolist()))
    torch.testing.assert_close(tw.sum(1), torch.ones(64))
    fused = model_shapes.preset("glm5-tp8-fused-shared")
    ids, tw, _ = make_routing(fused, 5, device="cpu", generator=g)
    assert ids.shape == (5, 9) and (ids[:, 8] == 256).all() and (ids[:, :8] < 256).all()
    assert (tw[:, 8] == 1).all()


def test_dispatch_path_is_the_dispatchers_choice():
    """The suite's "served" marking asks the code the runner core runs (moe.dispatch): the
    heuristic switch without a table, the shipped table's per-bucket path on a tabled GPU."""
    from sglang_fp4ext.moe import dispatch, experts
    from sglang_fp4ext.moe import shape as S
    from sglang_fp4ext.moe import tables as C

    assert "dispatch" in inspect.getsource(experts.run_experts)  # the runner's path goes there
    assert "select(" in inspect.getsource(dispatch.choose)
    for T in report.SUITE_TOKENS:
        want = "prefill" if S.token_bucket(T) >= C.PREFILL_MIN_TOKENS else "decode"
        assert report.dispatch_path(T) == want
    h200 = S.Target("sm_90", "NVIDIA H200", 132)
    tp8 = S.MoEShape(256, 6144, 256, 8)
    paths = {T: report.dispatch_path(T, tp8, h200) for T in report.SUITE_TOKENS}
    assert paths == {T: C.select(T, tp8, h200).path for T in report.SUITE_TOKENS}
    assert paths[1] == "decode" and paths[8192] == "prefill"
    assert report.SUITE_TOKENS[0] == 1 and report.SUITE_TOKENS[-1] == 8192
    with pytest.raises(ValueError, match="tokens must be >= 0"):
        report.dispatch_path(-1)


@no_gpu
def test_benchmark_suite_collects_and_skips_without_gpu():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "benchmarks", "-q", "-rs", "-p", "no:cacheprovider",
         "--fp4ext-tokens", "1,8192"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    # layer: presets x T x (torch peer, fp4ext, 2 SGLang peers, the triton_kernels peer);
    # block: presets with a separate bf16 shared expert x T x (fp4ext, SGLang's Marlin)
    from benchmarks.test_moe_block import BLOCK_PRESETS

    n = len(model_shapes.PRESETS) * 2 * 5 + len(BLOCK_PRESETS) * 2 * 2
    assert f"{n} skipped" in r.stdout, r.stdout
    assert "passed" not in r.stdout and "error" not in r.stdout.lower()
    assert "no CUDA GPU: this suite times CUDA-graph replay" in r.stdout


@pytest.mark.gpu
@pytest.mark.slow
def test_cli_gpu_path_small(tmp_path, capsys, seed):
    rc = main(
        ["--tokens", "1,16", "--copies", "2", "--replays", "3", "--seed", str(seed),
         "--out", str(tmp_path), "--name", "g", "--project", "rtx-pro-6000-ws"]
    )  # fmt: skip
    out, _ = capsys.readouterr()
    assert rc == 0, out
    d = json.loads((tmp_path / "g.json").read_text())
    assert d["mode"] == "gpu" and d["env"]["gpu"] == torch.cuda.get_device_name()
    assert d["rates"]["copy_bandwidth_Bps"] > 1e11 and d["rates"]["bf16_matmul_tflops"] > 10
    assert [r["T"] for r in d["rows"]] == [1, 16]
    for r in d["rows"]:
        assert set(r) == ROW_KEYS and r["check"]["ok"] and r["us"] > 0
        assert r["us_min"] <= r["us"] <= r["us_max"]
        assert 0 < r["fraction_of_copy_bw"] < 2  # > 1 only through L2 hits
    assert len(d["projection"]["rows"]) == 2 and "PROJECTION (not measured)" in out
    # Each SGLang peer either ran (a row entry per T) or is named in notes with its reason.
    for name in SGLANG_PEERS:
        why = sglang_peer_unavailable(name)
        if why is None:
            assert all(name in r["sglang_peers"] for r in d["rows"]), d["notes"]
        else:
            assert f"{name} not run: {why}" in d["notes"]
            assert all(name not in r["sglang_peers"] for r in d["rows"])
    if d["plot"] is None:  # the H200 box may lack matplotlib; then the JSON says so
        assert any("matplotlib is not installed" in n for n in d["notes"])
    else:
        assert (tmp_path / "g.png").read_bytes()[:8] == PNG_MAGIC


def test_gpu_mode_table_and_plot_from_given_rows(tmp_path, seed):
    """The GPU-mode table and roofline plot, fed rows built by ``row_numbers`` from given times
    (formatting and plotting only: these are inputs to the code under test, not measurements)."""
    pytest.importorskip("matplotlib")
    rng = random.Random(seed)
    shape = model_shapes.preset("glm5-tp8")
    result = report.base_result("gpu", shape, [1, 64], 4, 20, seed)
    result["env"]["gpu"] = "NVIDIA H200"
    result["rates"] = report.spec_rates(
        hardware.spec_by_key("h200"),
        {"copy_bandwidth_Bps": 4.2e12, "bf16_matmul_tflops": 700.0},
    )
    for T in (1, 64):
        us = rng.uniform(20, 400)
        row = {"T": T, "path": "decode", "served": True, "config": "cfg", "us_min": us,
               "us_max": us, "check": {"ok": True}}  # fmt: skip
        row.update(
            figures.row_numbers(
                shape, T, shape.expected_distinct(T), us, copy_bw_Bps=4.2e12,
                matmul_tflops=700.0, peer_us=2 * us if T == 1 else None,
            )
        )  # fmt: skip
        result["rows"].append(row)
    h200 = hardware.spec_by_key("h200")
    pro = hardware.spec_by_key("rtx-pro-6000-ws")
    result["projection"] = figures.project_rows(result["rows"], shape, 4.2e12, pro, h200)
    text = table.format_table(result)
    assert "4.20 TB/s" in text and "700 TFLOP/s" in text and "measured in this run" in text
    assert " 2.00 " in text  # T=1 speed-up over the peer; T=64 has none and prints "-"
    assert text.count("PROJECTION (not measured)") == 1 and "us/token" in text
    assert "x marlin" not in text  # no SGLang peer ran: no column for one
    result["rows"][0]["sglang_peers"] = {"sglang-marlin": {"us": 1.0, "speedup": 0.25}}
    result["rows"][1]["sglang_peers"] = {"sglang-marlin": None}  # did not match: not timed
    lines = table.format_table(result).splitlines()
    assert lines[1].endswith("x marlin") and lines[2].endswith(" 0.25") and lines[3].endswith(" -")
    js, png = report.write_outputs(result, tmp_path, "g")
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    assert json.loads(js.read_text())["rows"][0]["T"] == 1


TINY_TP2_FUSED = model_shapes.ModelShape("tiny-tp2-fused", 16, 4, 256, 256, 2, n_shared=1, tp=2,
                                     fuse_shared=True)  # fmt: skip
TINY_EP2 = model_shapes.ModelShape("tiny-ep2", 16, 4, 256, 128, 2, n_shared=1, ep=2)


@pytest.mark.parametrize(
    "shape, T, path",
    [(TINY_TP2_FUSED, 3, "decode"), (TINY_EP2, 5, "prefill")],
    ids=["tp2-fused-decode", "ep2-prefill"],
)
def test_layer_inputs_check_and_peer_on_cpu(shape, T, path, seed):
    """The measuring code's layer (copies, routing, config, NaN-poisoned check against the twin,
    torch peer) at a tiny shape, kernels under the interpreter."""
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
    from sglang_fp4ext.testing.compare import assert_close

    per_call = shape.bytes_floor(shape.expected_distinct(T), tokens=T)
    # An "L2" of 1.5 x two copies' calls / L2_FACTOR: 2 rotations, so 4 inputs on 2 copies.
    l2 = per_call * 2 * 1.5 / Layer.L2_FACTOR
    dev = "cuda" if target_info.has_cuda_gpu() else "cpu"  # CPU: kernels under the interpreter
    layer = Layer(shape, 2, seed=seed, device=dev, l2_bytes=l2)
    assert layer.n_inputs(T) == 4
    check = layer.check(T, path)
    assert check["ok"] and check["nonfinite"] == 0 and check["rms_rel"] > 0, check
    xs, routes, _ = layer.inputs(T)
    assert len(xs) == 4 and xs[0].shape == (T, 256) and not torch.equal(xs[0], xs[2])
    assert routes[0][0].shape == (T, shape.top_k_local)
    assert layer.distinct(T) == sum(r[2] for r in routes) / 4 > 0
    assert isinstance(layer.config(T, path), paths.get(path).config_type)
    # Input 3 runs on copy 1 (i % copies), for the peer as for fp4ext.
    ref = fused_moe_nvfp4_torch(xs[3], layer.packs[1], routes[3][0], routes[3][1])
    # bf16 weights and activations in the peer: ~3e-3 rms measured; a wrong expert is O(1).
    assert_close(layer.peer(T)(3), ref, max_rel=3e-2, rms_rel=1e-2, what="torch peer")


def test_layer_rotations_cover_l2():
    shape = TINY_EP2
    layer = Layer(shape, 3, device="cpu", l2_bytes=0)
    assert [layer.n_inputs(T) for T in (1, 64)] == [3, 3]  # no L2 known: one input per copy
    per_call = shape.bytes_floor(shape.expected_distinct(7), tokens=7)
    layer.l2_bytes = per_call * 3 * 4.5 / Layer.L2_FACTOR
    assert layer.n_inputs(7) == 3 * 5  # ceil(4.5) rotations
    layer.l2_bytes = 1e12
    assert layer.n_inputs(7) == 3 * Layer.MAX_ROTATIONS
    with pytest.raises(ValueError, match="copies must be >= 1"):
        Layer(shape, 0, device="cpu")


def test_write_outputs_without_matplotlib_says_so(tmp_path, monkeypatch, seed):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a)
    )
    result = report.base_result("cpu-check", model_shapes.preset("glm5-tp8"), [1], None, None, seed)
    js, png = report.write_outputs(result, tmp_path, "n")
    d = json.loads(js.read_text())
    assert png is None and d["plot"] is None and not (tmp_path / "n.png").exists()
    assert any("matplotlib is not installed" in n for n in d["notes"])
