"""Test tiers.

* CPU tier (CI): everything not marked ``gpu``. Without a GPU, Triton kernels run under the
  interpreter: ``TRITON_INTERPRET=1`` is set here, before any kernel module is imported, because
  ``triton.jit`` reads it when a kernel is decorated.
* GPU tier: tests marked ``gpu`` run only where ``torch.cuda.is_available()``; elsewhere they skip.
* Tests marked ``sglang`` need SGLang importable; they skip where it is not (e.g. the H200 box).

Random data is fresh every run: the ``seed`` fixture draws a new seed and prints it, so a failure
can be replayed with ``FP4EXT_TEST_SEED=<seed>``.
"""

import os
import random

import pytest

try:
    import torch

    _HAS_GPU = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency via sglang
    torch = None
    _HAS_GPU = False

if not _HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _has_sglang() -> bool:
    try:
        import sglang  # noqa: F401
    except Exception:
        return False
    return True


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (GPU tier; skipped without one)")
    config.addinivalue_line("markers", "sglang: needs SGLang importable (skipped without it)")
    config.addinivalue_line("markers", "slow: takes more than ~30 s on the CI machine")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine (GPU tier)")
    skip_sgl = pytest.mark.skip(reason="SGLang is not importable here")
    has_sgl = None
    for item in items:
        if "gpu" in item.keywords and not _HAS_GPU:
            item.add_marker(skip_gpu)
        if "sglang" in item.keywords:
            if has_sgl is None:
                has_sgl = _has_sglang()
            if not has_sgl:
                item.add_marker(skip_sgl)


@pytest.fixture
def seed(request):
    """A fresh random seed per test (override with FP4EXT_TEST_SEED); printed on failure."""
    env = os.environ.get("FP4EXT_TEST_SEED")
    s = int(env) if env else random.SystemRandom().randrange(2**31)
    request.node.user_properties.append(("seed", s))
    print(f"[seed] {request.node.nodeid}: FP4EXT_TEST_SEED={s}")
    if torch is not None:
        torch.manual_seed(s)
    return s
