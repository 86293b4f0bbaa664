"""The plugin through SGLang's real code paths (CPU tier): loader, argparse, resolution, hooks.

Every scenario runs in a fresh interpreter (``sglang_cpu.run_child``) because SGLang's plugin
loading and hook patching are process-global and irreversible.
"""

from __future__ import annotations

import logging

import pytest

from tests.sglang_cpu import free_port, prelude_cpu_layer, run_child, run_python, tiny_model_dir

pytestmark = pytest.mark.sglang

_STATE = """
import json
from sglang.srt.arg_groups.choices import MOE_RUNNER_BACKEND_CHOICES
from sglang.srt.layers.moe.moe_runner.runner import _CUSTOM_RUNNER_CORE_FACTORIES
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_fp4ext import sglang_backend as sb
state = {
    "choices": MOE_RUNNER_BACKEND_CHOICES.count("fp4ext"),
    "spec_choices": None,
    "factory": _CUSTOM_RUNNER_CORE_FACTORIES.get("fp4ext") is sb.make_runner_core,
    "registered_hooks": {
        s.target: sum(h is s.hook for _, h, _ in HookRegistry._hooks.get(s.target, ()))
        for s in sb.HOOKS},
    "live_hooks": sb.hook_status(),
}
"""


_DEPTH = """
from sglang.srt.layers.quantization.modelopt_quant import ModelOptNvFp4FusedMoEMethod as M
def depth(fn, hook):  # how many times our hook wraps the live method
    n = 0
    while fn is not None:
        n += any(getattr(c, 'cell_contents', None) is hook for c in (fn.__closure__ or ()))
        fn = getattr(fn, '__wrapped__', None)
    return n
"""


def test_sglang_loader_registers_once_cli_resolves_and_register_twice_is_harmless(tmp_path):
    """One process (the SGLang import paid once): SGLang's loader discovers and registers the
    plugin, logging one line that lists everything applied; ``--moe-runner-backend fp4ext``
    parses and resolves to the registered backend; ``register()`` twice more changes nothing."""
    model = tiny_model_dir(tmp_path)
    r = run_child(
        "import logging\nlogging.basicConfig(level=logging.INFO)\n"
        "from sglang.srt.plugins import load_plugins\nload_plugins()\n"
        + _STATE
        + f"""
loaded = state
from sglang.srt.server_args import prepare_server_args
from sglang.srt.layers.moe.utils import RegisteredMoeRunnerBackend, resolve_moe_runner_backend
sa = prepare_server_args(["--model-path", {str(model)!r}, "--device", "cpu",
                          "--attention-backend", "torch_native", "--skip-tokenizer-init",
                          "--moe-runner-backend", "fp4ext"])
resolved = resolve_moe_runner_backend(sa.moe_runner_backend)
cli = {{"flag": sa.moe_runner_backend,
       "registered": resolved == RegisteredMoeRunnerBackend("fp4ext")}}
from sglang_fp4ext.plugin import register
register(); register()
"""
        + _STATE
        + _DEPTH
        + """
state["apply_wraps"] = depth(M.apply, sb.hook_apply)
print(json.dumps({"loaded": loaded, "cli": cli, "twice": state}))
"""
    )
    for what in ("loaded", "twice"):
        st = r[what]
        assert st["choices"] == 1, what
        assert st["factory"] is True, what
        assert all(n == 1 for n in st["registered_hooks"].values()), (what, st)
        assert all(st["live_hooks"].values()), (what, st)
    assert r["twice"]["apply_wraps"] == 1
    # One log line lists everything applied.
    line = next(ln for ln in r["_stderr"].splitlines() if "sglang_fp4ext 0.1.0 registered" in ln)
    for what in ("choice 'fp4ext'", "runner core 'fp4ext'", "ModelOptNvFp4FusedMoEMethod.apply"):
        assert what in line
    assert r["cli"]["flag"] == "fp4ext"
    assert r["cli"]["registered"] is True


def test_sglang_plugins_whitelist_excludes_fp4ext_and_the_cli_rejects_it(tmp_path):
    """``SGLANG_PLUGINS`` naming another plugin: nothing of fp4ext is registered, and SGLang's
    argument parser rejects ``--moe-runner-backend fp4ext``."""
    model = tiny_model_dir(tmp_path)
    r = run_child(
        "from sglang.srt.plugins import load_plugins\nload_plugins()\n"
        + _STATE
        + f"""
from sglang.srt.server_args import prepare_server_args
try:
    prepare_server_args(["--model-path", {str(model)!r}, "--moe-runner-backend", "fp4ext"])
    state["exit"] = None
except SystemExit as e:  # argparse's error exit; its message is on stderr
    state["exit"] = e.code
print(json.dumps(state))
""",
        env={"SGLANG_PLUGINS": "some_other_plugin"},
    )
    assert r["choices"] == 0
    assert r["factory"] is False
    assert not any(r["registered_hooks"].values())
    assert not any(r["live_hooks"].values())
    assert r["exit"] not in (None, 0)
    assert "invalid choice: 'fp4ext'" in r["_stderr"]


@pytest.mark.parametrize("version", ["0.5.22", "0.6.0"])
def test_unsupported_sglang_version_is_refused(version, monkeypatch, caplog):
    """``register()`` (what SGLang's loader calls) refuses each unsupported version with one
    warning, before it imports SGLang; the child below shows the loader path registers nothing.
    An override that is no version at all is a bad setting (``tests/test_settings.py``)."""
    from sglang_fp4ext import compat, plugin

    monkeypatch.setenv("SGLANG_FP4EXT_SGLANG_VERSION", version)
    assert compat.check_sglang().ok is False
    with caplog.at_level(logging.WARNING, logger="sglang_fp4ext"):
        plugin.register()
    (msg,) = [r.getMessage() for r in caplog.records if r.name == "sglang_fp4ext"]
    assert "sglang_fp4ext 0.1.0 is inactive" in msg and "fp4ext is not registered" in msg
    assert version in msg


def test_unsupported_sglang_version_registers_nothing():
    r = run_child(
        "import logging\nlogging.basicConfig(level=logging.WARNING)\n"
        "from sglang.srt.plugins import load_plugins\nload_plugins()\n"
        + _STATE
        + "print(json.dumps(state))",
        env={"SGLANG_FP4EXT_SGLANG_VERSION": "0.6.0"},
    )
    assert r["choices"] == 0
    assert r["factory"] is False
    assert not any(r["registered_hooks"].values())
    assert "sglang_fp4ext 0.1.0 is inactive" in r["_stderr"]
    assert "fp4ext is not registered" in r["_stderr"]


def test_hook_targets_resolve_on_installed_sglang():
    import pkgutil

    from sglang_fp4ext.sglang_backend import HOOKS

    for spec in HOOKS:
        obj = pkgutil.resolve_name(spec.target)
        assert callable(obj), spec.target


def test_launch_server_help_lists_fp4ext():
    proc = run_python(["-m", "sglang.launch_server", "--help"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if "[--moe-runner-backend {" in ln)
    assert "fp4ext" in line


def test_fp4ext_layer_builds_on_cpu_through_hooks(tmp_path):
    """SGLang's FusedMoE + ModelOptFp4Config with fp4ext: our __init__ hook admits the platform,
    SGLang's MoeRunner gets our runner core, and without the hook SGLang refuses."""
    r = run_child(
        prelude_cpu_layer(tiny_model_dir(tmp_path), "fp4ext", free_port())
        + """
from sglang.srt.layers.moe.utils import get_moe_runner_backend
from sglang_fp4ext.sglang_backend import Fp4ExtRunnerCore
layer = make_layer()
method = layer.quant_method
params = {n: [list(p.shape), str(p.dtype)] for n, p in layer.named_parameters()}
try:
    ModelOptNvFp4FusedMoEMethod.__init__.__wrapped__(object.__new__(ModelOptNvFp4FusedMoEMethod),
                                                     QUANT_CONFIG)
    unhooked = "constructed"
except ValueError as e:
    unhooked = str(e)
print(json.dumps({
    "backend": str(get_moe_runner_backend()),
    "method": type(method).__name__,
    "core": type(method.runner.runner_core).__name__,
    "is_ours": isinstance(method.runner.runner_core, Fp4ExtRunnerCore),
    "params": params,
    "unhooked": unhooked,
}))
"""
    )
    assert r["backend"] == "RegisteredMoeRunnerBackend(value='fp4ext')"
    assert r["method"] == "ModelOptNvFp4FusedMoEMethod"
    assert r["is_ours"] is True
    assert r["params"]["w13_weight"] == [[8, 256, 128], "torch.uint8"]
    assert r["params"]["w2_weight"] == [[8, 256, 64], "torch.uint8"]
    assert "does not support NVFP4" in r["unhooked"]


def test_other_backend_runs_sglang_code_unchanged(tmp_path):
    """flashinfer_cutlass selected: hooked process_weights_after_loading gives bit-identical
    parameters to SGLang's original; hooked apply raises exactly what the original raises."""
    r = run_child(
        prelude_cpu_layer(tiny_model_dir(tmp_path), "flashinfer_cutlass", free_port())
        + """
M = ModelOptNvFp4FusedMoEMethod
with override_platform(is_blackwell=True):  # this CPU is not Blackwell; SGLang would refuse
    a, b = make_layer(), make_layer()
g = torch.Generator().manual_seed(1234)
for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
    if pa.dtype == torch.uint8:
        v = torch.randint(0, 256, pa.shape, generator=g, dtype=torch.uint8)
    else:
        v = (torch.rand(pa.shape, generator=g) + 0.5).to(pa.dtype)
    pa.data.copy_(v); pb.data.copy_(v)
before = a.w13_weight_scale.detach().view(torch.uint8).clone()
a.quant_method.process_weights_after_loading(a)            # through our hook
M.process_weights_after_loading.__wrapped__(b.quant_method, b)  # SGLang's original
pa_, pb_ = dict(a.named_parameters()), dict(b.named_parameters())
def bits(t):
    return t.detach().view(torch.uint8) if t.element_size() == 1 else t.detach()
same = sorted(pa_) == sorted(pb_) and all(torch.equal(bits(pa_[k]), bits(pb_[k])) for k in pa_)
changed = not torch.equal(bits(pa_["w13_weight_scale"]), before)
from sglang.srt.layers.moe.utils import MoeRunnerBackend
errs = []
for fn in (M.apply, M.apply.__wrapped__):
    a.quant_method._moe_runner_backend = MoeRunnerBackend.TRITON
    try:
        fn(a.quant_method, layer=a, dispatch_output=None)
        errs.append("returned")
    except Exception as e:
        errs.append(f"{type(e).__name__}: {e}")
print(json.dumps({"same": same, "changed": changed, "names": sorted(pa_), "errs": errs}))
"""
    )
    assert r["same"] is True
    assert r["changed"] is True  # processing really ran (CUTLASS swizzle in place)
    assert "g1_alphas" in r["names"]
    assert r["errs"][0] == r["errs"][1]
    assert "Unsupported moe_runner_backend for NVFP4 MoE" in r["errs"][0]


def test_runner_factory_raises_when_hooks_not_applied():
    """SGLang swallows hook errors; our factory must not: registered but unapplied -> a clear
    error."""
    r = run_child(
        """
import json
from sglang.srt.plugins.hook_registry import _current_plugin_source, HookSource
from sglang_fp4ext import sglang_backend as sb
sb.install()   # registers, but nobody calls HookRegistry.apply_hooks()
try:
    sb.make_runner_core(None)
    err = None
except RuntimeError as e:
    err = str(e)
print(json.dumps({"err": err}))
"""
    )
    assert r["err"] is not None
    assert "hooks are not in effect" in r["err"]
    assert "ModelOptNvFp4FusedMoEMethod.apply" in r["err"]
