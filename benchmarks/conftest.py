"""Options and session-wide measurements of the pytest-benchmark suite (``test_moe_bench.py``).

Options (all optional)::

    --fp4ext-presets glm5-tp8,glm5-ep8   model layouts from model_shapes.PRESETS (default: all)
    --fp4ext-tokens 1,16,256             token counts (default 1, 2, 4, ..., 8192)
    --fp4ext-paths decode,prefill        fp4ext paths timed (default: decode, what SGLang's
                                         runner serves today; prefill is extra, marked served=no)
    --fp4ext-copies 4                    layer copies rotated per graph (beyond L2)
    --fp4ext-rounds 20                   pedantic rounds (one graph replay each)
    --fp4ext-seed 2026                   weights and inputs (each T's inputs from (seed, T) alone,
                                         so a gate run times the same routings as its baseline)
    --fp4ext-slow-config                 force gpu_run.slowed_config() on fp4ext-decode: the real
                                         kernels, deliberately slower (regression-gate demo)

Without a CUDA GPU (or without pytest-benchmark) every case is collected and skipped with the
reason; nothing is measured. The copy bandwidth and the bf16 matmul rate are measured once per
session (fixture ``rates``); every peer's time per (preset, T) is kept for fp4ext's ratios. The
terminal summary says which peers ran and why the others were skipped.
"""

from __future__ import annotations

import pytest

from sglang_fp4ext import target_info

_NO_GPU = (
    "no CUDA GPU: this suite times CUDA-graph replay on a GPU; the CPU tier of the bench code is "
    "tests/test_bench_cli.py"
)


def pytest_addoption(parser):
    g = parser.getgroup("fp4ext benchmarks")
    g.addoption("--fp4ext-presets", default=None, help="comma-separated roofline presets")
    g.addoption("--fp4ext-tokens", default=None, help="comma-separated token counts")
    g.addoption("--fp4ext-paths", default="decode", help="decode[,prefill]")
    g.addoption("--fp4ext-copies", type=int, default=4, help="layer copies per graph")
    g.addoption("--fp4ext-rounds", type=int, default=20, help="pedantic rounds per case")
    g.addoption("--fp4ext-seed", type=int, default=2026, help="seed of weights and inputs")
    g.addoption(
        "--fp4ext-slow-config",
        action="store_true",
        help="force a deliberately poor DecodeConfig on fp4ext-decode (regression-gate demo)",
    )


def pytest_collection_modifyitems(config, items):
    reason = None
    if not target_info.has_cuda_gpu():
        reason = _NO_GPU
    elif not config.pluginmanager.hasplugin("benchmark"):
        reason = "pytest-benchmark is not installed (pip install 'sglang-fp4ext[bench]')"
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def rates():
    """Copy bandwidth and bf16 matmul rate, measured once on this GPU; env and spec."""
    from sglang_fp4ext import hardware
    from sglang_fp4ext.bench.report import environment
    from sglang_fp4ext.bench.timing import bf16_matmul_tflops, copy_bandwidth_Bps

    env = environment()
    return {
        "env": env,
        "spec": hardware.spec_for_device_name(env["gpu"]),
        "copy_bw_Bps": copy_bandwidth_Bps(),
        "bf16_matmul_tflops": bf16_matmul_tflops(),
    }


class _Layers:
    """One preset's layer copies at a time (GPU memory), and the peer times of this session."""

    def __init__(self, copies: int, seed: int):
        self.copies, self.seed = copies, seed
        self.name = None
        self.layer = None
        self.peer_us: dict[tuple[str, str, int], float] = {}  # (impl, preset, T) -> us
        self.adapters: dict = {}  # peer adapters built from this preset's layer (tk_peer)

    def get(self, shape):
        if self.name != shape.name:
            import torch

            from sglang_fp4ext.bench.layer import Layer

            self.layer = None
            self.adapters.clear()
            torch.cuda.empty_cache()
            self.layer = Layer(shape, self.copies, seed=self.seed)
            self.name = shape.name
        return self.layer


@pytest.fixture(scope="session")
def layers(request):
    opt = request.config.getoption
    return _Layers(opt("--fp4ext-copies"), opt("--fp4ext-seed"))


# impl -> {"ran": n, "skipped": {reason: n}}: filled through the ``log_peer`` fixture by
# test_moe_layer, printed in the terminal summary.
_PEER_LOG = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def log_peer(request):
    log = request.config.stash.setdefault(_PEER_LOG, {})

    def record(impl: str, skip_reason: str | None) -> None:
        e = log.setdefault(impl, {"ran": 0, "skipped": {}})
        if skip_reason is None:
            e["ran"] += 1
        else:
            e["skipped"][skip_reason] = e["skipped"].get(skip_reason, 0) + 1

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    PEER_LOG = config.stash.get(_PEER_LOG, {})
    if not PEER_LOG:
        return
    tr = terminalreporter
    tr.section("fp4ext peers")
    for impl in sorted(PEER_LOG):
        e = PEER_LOG[impl]
        tr.write_line(f"{impl}: ran in {e['ran']} case(s)")
        for reason, n in sorted(e["skipped"].items()):
            tr.write_line(f"{impl}: skipped in {n} case(s): {reason}")
    if config.getoption("--fp4ext-slow-config"):
        tr.write_line(
            "fp4ext-decode ran with the deliberately slowed config (--fp4ext-slow-config)"
        )
