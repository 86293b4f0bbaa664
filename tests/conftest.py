"""Test tiers.

* CPU tier (CI): everything not marked ``gpu``. Without a GPU, Triton kernels run under the
  interpreter: ``TRITON_INTERPRET=1`` is set here, before any kernel module is imported, because
  ``triton.jit`` reads it when a kernel is decorated.
* GPU tier: tests marked ``gpu`` run only where ``torch.cuda.is_available()``; elsewhere they skip.
* Tests marked ``sglang`` need SGLang importable; they skip where it is not (e.g. the H200 box).

Under ``-n auto --dist loadfile`` (the README's command) the slowest modules start first
(``SLOW_MODULES``), so that no long module starts last while the other worker runs out of work.

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


#: Seconds per module (``--durations`` summed over its tests and fixtures, two workers on the
#: shared 2-core machine, a fresh machine's cold Triton cache: the last full CI run), for modules
#: over ~60 s. xdist's loadfile scheduler hands out modules by test count, most first, which
#: started the longest (AOT compiles, SGLang servers) among the last. Here they go first, longest
#: first, and the many short modules fill in behind. A missing or stale entry changes only the
#: order, never what runs.
SLOW_MODULES = {
    "test_prefill_kernels.py": 400,
    "test_e2e_server.py": 260,
    "test_gluon_aot.py": 170,
    "test_check_verdict.py": 150,
    "test_aot_compile.py": 85,
    "test_patches.py": 85,
    "test_plugin.py": 75,
    "test_coop_aot.py": 65,
    "test_server_harness.py": 60,
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlowModulesFirst(LoadFileScheduling):
        # xdist 3.x pops the next module from the front of ``workqueue`` here.
        def _assign_work_unit(self, node):
            slowest = max(self.workqueue, key=lambda m: SLOW_MODULES.get(m.rsplit("/", 1)[-1], 0))
            self.workqueue.move_to_end(slowest, last=False)  # max() keeps the first of ties
            super()._assign_work_unit(node)

    return SlowModulesFirst(config, log)


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
