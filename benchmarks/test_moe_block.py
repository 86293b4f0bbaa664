"""pytest-benchmark cases of the MoE block as SGLang runs it for NVIDIA's GLM-5 NVFP4 checkpoints
(``bench/block.py``): router, routed experts, bf16 shared expert on the alternate stream, joined
before the add; one case per (preset, T, routed implementation).

Presets: those whose shared expert stays a separate bf16 MLP (GLM-5 TP8 and EP8, DeepSeek-R1
TP8); T = 1..256 (decode, and the MTP verify sizes ``bs x 2`` and ``bs x 4`` among them:
``extra_info["verify_of"]``). Implementations: ``fp4ext`` (the path the dispatcher serves) and
``sglang-marlin`` where SGLang's Marlin runs here (else skipped with the reason). Each is checked
against the fp32 twin of its routed experts plus the same shared expert before it is timed.
``extra_info``: the block's us per call, bytes by part and % of the copy bandwidth measured once
per session; the routed experts alone, the shared expert alone and the router alone are timed
by ``block_rows`` (``fp4ext bench --block``, ``benchmarks/experiments/block_marlin.py``).
"""

from __future__ import annotations

import statistics

import pytest

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.block import verify_of
from sglang_fp4ext.bench.report import SUITE_TOKENS

MARLIN = "sglang-marlin"
BLOCK_PRESETS = [n for n, s in model_shapes.PRESETS.items() if s.n_shared > 0 and not s.fuse_shared]


def pytest_generate_tests(metafunc):
    if "block_case" not in metafunc.fixturenames:
        return
    cfg = metafunc.config
    presets = cfg.getoption("--fp4ext-presets")
    presets = [p for p in presets.split(",") if p] if presets else BLOCK_PRESETS
    tokens = cfg.getoption("--fp4ext-tokens")
    tokens = (
        [int(t) for t in tokens.split(",")] if tokens else [t for t in SUITE_TOKENS if t <= 256]
    )
    cases = [(p, T, i) for p in presets for T in tokens for i in (MARLIN, "fp4ext")]
    metafunc.parametrize("block_case", cases, ids=[f"block-{p}-T{T}-{i}" for p, T, i in cases])


def test_moe_block(benchmark, block_case, rates, layers, log_peer, request):
    from sglang_fp4ext.bench.block import MoEBlock
    from sglang_fp4ext.bench.peers import sglang_peer_unavailable
    from sglang_fp4ext.bench.timing import capture_replay

    preset_name, T, impl = block_case
    shape = model_shapes.preset(preset_name)
    if shape.fuse_shared or shape.n_shared == 0:
        pytest.skip(f"{preset_name}: no separate bf16 shared expert")
    if impl == MARLIN:
        reason = sglang_peer_unavailable(MARLIN)
        log_peer(f"block-{MARLIN}", reason)
        if reason is not None:
            pytest.skip(reason)
    benchmark.group = f"block {preset_name} T={T}"
    layer = layers.get(shape)
    block = layers.adapters.get("block")
    if block is None or block.layer is not layer:
        block = layers.adapters["block"] = MoEBlock(layer)
    if impl == MARLIN:
        adapters = layer.sglang_adapters(MARLIN)
        routed = lambda x, c, ids, tw, i: adapters[c](x, ids, tw)  # noqa: E731
        check = block.check(T, routed, pack=adapters[0].weights, rms=2e-2, max_rel=float("inf"))
    else:
        routed = block.fp4ext(T)
        check = block.check(T, routed)
    assert check["ok"], f"block {impl} {preset_name} T={T} does not match the twin: {check}"
    n = layer.n_inputs(T)
    replay, calls = capture_replay(block.step(T, routed), n, max(1, -(-16 // n)))
    device_us: list[float] = []
    benchmark.pedantic(
        lambda: device_us.append(replay()),
        rounds=request.config.getoption("--fp4ext-rounds"),
        warmup_rounds=3,
        iterations=1,
    )
    us = statistics.median([t / calls for t in device_us[3:] or device_us])
    nbytes = block.bytes(T, block.routes(T))
    key = ("block", preset_name, T)
    info = {
        "gpu": rates["env"]["gpu"],
        "preset": preset_name,
        "T": T,
        "impl": impl,
        "verify_of": verify_of(T),
        "us": us,
        "calls_per_replay": calls,
        "bytes": nbytes,
        "copy_bandwidth_TBps": rates["copy_bw_Bps"] / 1e12,
        "pct_copy_bw": 100 * nbytes["block"] / (us * 1e-6) / rates["copy_bw_Bps"],
        "check": check,
    }
    if impl == MARLIN:
        layers.peer_us[(MARLIN, *key)] = us
    elif (MARLIN, *key) in layers.peer_us:
        info["speedup_vs_marlin"] = layers.peer_us[(MARLIN, *key)] / us
    benchmark.extra_info.update(info)
