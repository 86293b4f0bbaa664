"""pytest-benchmark regression suite: one MoE layer per (model preset, token count, implementation).

Cases: every ``model_shapes.PRESETS`` layout (GLM-5 TP8 with and without the fused shared expert,
GLM-5 EP8, DeepSeek-R1 NVFP4 TP8, Qwen3-Coder-480B NVFP4 TP8) x T = 1 .. 8192 x

* ``torch-bf16``: the torch bf16 grouped-GEMM MoE (``bench/peers.py``), always;
* ``sglang-flashinfer_cutlass``, ``sglang-marlin``: SGLang's own NVFP4 MoE backends
  (``bench/peers.py``), run where SGLang and their kernels import and the GPU is new enough,
  else collected and skipped with the reason (e.g. on the H200 box: no SGLang); a peer that runs
  is checked against the torch twin of the pack it computes before it is timed;
* ``triton_kernels-mxfp4``: OpenAI's triton_kernels MXFP4 MoE as SGLang's ``triton_kernel``
  backend calls it, Triton 3.8 API (``bench/tk_peer.py``), on the MXFP4 re-quantisation of the
  same packs; run where triton_kernels with that API, Triton 3.8 and an sm_90 / sm_100 GPU are
  there, else skipped with the reason (the H200 box: Triton 3.6, no triton_kernels); checked
  against the fp32 oracle of its own MXFP4 weights before it is timed;
* ``fp4ext-decode`` and, with ``--fp4ext-paths decode,prefill``, ``fp4ext-prefill``: the two
  kernel paths; ``extra_info["served"]`` marks the one SGLang's runner core takes for that T
  (``moe.dispatch`` via the config table; ``report.dispatch_path`` / ``Layer.served_path``).
  fp4ext runs last in each group, so its ``speedup_vs`` holds the ratio to every peer that ran
  in this session (``speedup_vs_torch_peer`` the torch one).

The terminal summary ("fp4ext peers") lists which peers ran and why the others were skipped.

Each case captures ONE CUDA graph of ``passes x n_inputs`` layer calls: ``--fp4ext-copies`` layer
copies and inputs (routing, x) rotated over them so one pass touches 3x the L2
(``layer.Layer``); ``passes`` and ``n_inputs`` depend on T and the GPU's L2 only, so a regression
cannot change the graph. ``benchmark.pedantic`` times one graph replay (with a device sync) per
round, so pytest-benchmark's statistics are per replay (``extra_info["calls_per_replay"]``
calls); ``extra_info`` holds the per-call numbers from CUDA events: ``us`` (median), ``us_min``,
bytes floor, floor time and achieved TB/s against the copy bandwidth measured once per session,
TFLOP/s against the bf16 matmul rate measured once per session, the ratio to the torch peer, the
kernel config, the GPU and versions. fp4ext's output is checked against the fp32 torch twin
(NaN-poisoned first) before it is timed; a case with a wrong output fails instead of reporting
a speed.

Regression gate: see ``benchmarks/README.md`` (committed H200 baseline under
``benchmarks/results/pytest-benchmark``, ``--benchmark-compare --benchmark-compare-fail=min:5%``,
and ``--fp4ext-slow-config`` to see it fail on a deliberately slowed kernel). Narrow a run with
``--fp4ext-presets``, ``--fp4ext-tokens`` or ``-k`` (see ``benchmarks/conftest.py``). Without a
GPU every case is collected and skipped with its reason.
"""

from __future__ import annotations

import contextlib
import statistics

import pytest

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.figures import row_numbers
from sglang_fp4ext.bench.peers import SGLANG_PEERS as _SGLANG_PEER_SPECS
from sglang_fp4ext.bench.report import SUITE_TOKENS
from sglang_fp4ext.bench.tk_availability import TK_PEER
from sglang_fp4ext.bench.tk_peer import ENTRY_POINT as _TK_ENTRY_POINT
from sglang_fp4ext.moe.tables import override_config

PEER = "torch-bf16"
SGLANG_PEERS = tuple(_SGLANG_PEER_SPECS)


def _passes(T: int, n_inputs: int) -> int:
    """Graph passes over the rotated inputs: at least 16 calls per replay at small T, so the host
    sync is ~1-2% of a replay; depends on T and the GPU's L2 only (see the module docstring)."""
    return max(1, -(-16 // n_inputs)) if T <= 256 else 1


def _csv(text: str | None, default, cast=str):
    if not text:
        return list(default)
    return [cast(v.strip()) for v in text.split(",") if v.strip()]


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    cfg = metafunc.config
    presets = _csv(cfg.getoption("--fp4ext-presets"), model_shapes.PRESETS)
    for p in presets:
        model_shapes.preset(p)  # clear error for an unknown name
    tokens = _csv(cfg.getoption("--fp4ext-tokens"), SUITE_TOKENS, int)
    paths = _csv(cfg.getoption("--fp4ext-paths"), ["decode"])
    bad = set(paths) - {"decode", "prefill"}
    if bad:
        raise pytest.UsageError(f"--fp4ext-paths: unknown {sorted(bad)}; use decode,prefill")
    impls = [PEER, *SGLANG_PEERS, TK_PEER, *(f"fp4ext-{p}" for p in paths)]
    cases = [(p, T, impl) for p in presets for T in tokens for impl in impls]
    metafunc.parametrize("case", cases, ids=[f"{p}-T{T}-{i}" for p, T, i in cases])


def test_moe_layer(benchmark, case, rates, layers, log_peer, request):
    preset_name, T, impl = case
    shape = model_shapes.preset(preset_name)
    benchmark.group = f"{preset_name} T={T}"
    from sglang_fp4ext.bench.gpu_run import slowed_config
    from sglang_fp4ext.bench.peers import has_grouped_mm, sglang_peer_unavailable
    from sglang_fp4ext.bench.timing import capture_replay

    if impl in SGLANG_PEERS:
        reason = sglang_peer_unavailable(impl)
        log_peer(impl, reason)
        if reason is not None:
            pytest.skip(reason)
    elif impl == TK_PEER:
        from sglang_fp4ext.bench.tk_availability import tk_peer_unavailable

        reason = tk_peer_unavailable()
        log_peer(impl, reason)
        if reason is not None:
            pytest.skip(reason)
    elif impl == PEER:
        log_peer(impl, None if has_grouped_mm() else "torch has no torch._grouped_mm")

    layer = layers.get(shape)
    info = {
        "gpu": rates["env"]["gpu"],
        "versions": {
            k: rates["env"][k]
            for k in ("torch", "triton", "cuda", "python", "sglang_fp4ext", "sglang")
        },
        "preset": preset_name,
        "T": T,
        "impl": impl,
        "served_path": layer.served_path(T),
        "copies": layer.copies,
        "seed": layer.seed,
        "copy_bandwidth_TBps": rates["copy_bw_Bps"] / 1e12,
        "bf16_matmul_tflops": rates["bf16_matmul_tflops"],
    }
    slow = request.config.getoption("--fp4ext-slow-config") and impl == "fp4ext-decode"
    # The override is read when the step is built (Layer.ours -> config_for): the check, the
    # captured graph and the recorded config all use the slowed config.
    with override_config(slowed_config()) if slow else contextlib.nullcontext():
        if impl == PEER:
            if not has_grouped_mm():
                pytest.skip("torch has no torch._grouped_mm (the bf16 peer needs it)")
            step = layer.peer(T)
            info.update(served=None, config="torch._grouped_mm bf16 (weights dequantised once)")
        elif impl in SGLANG_PEERS:
            check = layer.check_sglang_peer(T, impl)
            assert check["ok"], f"{impl} {preset_name} T={T} does not match the twin: {check}"
            step = layer.sglang_peer(T, impl)
            info.update(served=None, config=_SGLANG_PEER_SPECS[impl].entry_point, check=check)
        elif impl == TK_PEER:
            from sglang_fp4ext.bench.tk_peer import suite_check, suite_step

            check = suite_check(layer, T, layers.adapters)
            assert check["ok"], f"{impl} {preset_name} T={T} does not match its oracle: {check}"
            step = suite_step(layer, T, layers.adapters)
            info.update(served=None, config=_TK_ENTRY_POINT, check=check)
        else:
            path = impl.removeprefix("fp4ext-")
            check = layer.check(T, path)
            assert check["ok"], f"{impl} {preset_name} T={T} does not match the twin: {check}"
            step = layer.ours(T, path)
            info.update(
                served=path == layer.served_path(T),
                config=repr(layer.config(T, path)),
                check=check,
                slowed=bool(slow),
            )
        n_inputs = layer.n_inputs(T)
        replay, calls = capture_replay(step, n_inputs, _passes(T, n_inputs))
    device_us: list[float] = []

    def one_replay():
        device_us.append(replay())

    benchmark.pedantic(
        one_replay,
        rounds=request.config.getoption("--fp4ext-rounds"),
        warmup_rounds=3,
        iterations=1,
    )
    per_call = [t / calls for t in device_us[3:] or device_us]
    us = statistics.median(per_call)
    peer_us = None
    if not impl.startswith("fp4ext-"):
        layers.peer_us[(impl, preset_name, T)] = us
    else:
        peer_us = layers.peer_us.get((PEER, preset_name, T))
        info["speedup_vs"] = {
            p: layers.peer_us[(p, preset_name, T)] / us
            for p in (PEER, *SGLANG_PEERS, TK_PEER)
            if (p, preset_name, T) in layers.peer_us
        }
    info.update(calls_per_replay=calls, inputs_rotated=n_inputs, us=us, us_min=min(per_call))
    info.update(
        row_numbers(
            shape,
            T,
            layer.distinct(T),
            us,
            copy_bw_Bps=rates["copy_bw_Bps"],
            matmul_tflops=rates["bf16_matmul_tflops"],
            peer_us=peer_us,
        )
    )
    benchmark.extra_info.update(info)
