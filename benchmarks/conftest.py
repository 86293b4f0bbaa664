"""Options and session-wide measurements of the pytest-benchmark suite (``test_moe_bench.py``).

Options (all optional)::

    --fp4ext-presets glm5-tp8,glm5-ep8   model layouts from roofline.PRESETS (default: all)
    --fp4ext-tokens 1,16,256             token counts (default 1, 2, 4, ..., 8192)
    --fp4ext-paths decode,prefill        fp4ext paths timed (default: decode, what SGLang's
                                         runner serves today; prefill is extra, marked served=no)
    --fp4ext-copies 4                    layer copies rotated per graph (beyond L2)
    --fp4ext-rounds 20                   pedantic rounds (one graph replay each)

Without a CUDA GPU (or without pytest-benchmark) every case is collected and skipped with the
reason; nothing is measured. The copy bandwidth and the bf16 matmul rate are measured once per
session (fixture ``rates``); the torch peer's time per (preset, T) is kept for the ratio.
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
    from sglang_fp4ext.bench.report import bf16_matmul_tflops, environment
    from sglang_fp4ext.bench.timing import copy_bandwidth_Bps

    env = environment()
    return {
        "env": env,
        "spec": hardware.spec_for_device_name(env["gpu"]),
        "copy_bw_Bps": copy_bandwidth_Bps(),
        "bf16_matmul_tflops": bf16_matmul_tflops(),
    }


class _Layers:
    """One preset's layer copies at a time (GPU memory), and the peer times of this session."""

    def __init__(self, copies: int):
        self.copies = copies
        self.name = None
        self.layer = None
        self.peer_us: dict[tuple[str, int], float] = {}

    def get(self, shape):
        if self.name != shape.name:
            import torch

            from sglang_fp4ext.bench.report import Layer

            self.layer = None
            torch.cuda.empty_cache()
            self.layer = Layer(shape, self.copies)
            self.name = shape.name
        return self.layer


@pytest.fixture(scope="session")
def layers(request):
    return _Layers(request.config.getoption("--fp4ext-copies"))
