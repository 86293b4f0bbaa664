"""patches/: the hook manifest, the upstream diffs and ``fp4ext patches list|check`` (CPU tier).

* The manifest (``sglang_fp4ext.patches.MANIFEST``) lists exactly the hooks the plugin installs
  after SGLang's loader runs ``register()`` in a fresh interpreter, and ``patches/README.md``
  renders it.
* Every diff applies cleanly to a copy of the installed SGLang package. With all diffs applied
  (the copy first on ``PYTHONPATH`` in the children) the plugin detects the capabilities and
  installs no ``HookRegistry`` hook, and SGLang's integration scenarios still pass:
  ``tests/test_sglang_layer.py``'s single-process FusedMoE case (run verbatim), another backend's
  weight processing/apply/platform check bit-identical to pristine SGLang without the plugin, and
  the padded-row masking predicate on for fp4ext in TP mode: the diffs are complete.
* ``fp4ext patches check`` passes on the installed and on the patched SGLang, and on a copy with
  a target removed, a method's signature changed and a function renamed it exits 1 with lines
  naming each target and what is wrong.
"""

from __future__ import annotations

import ast
import concurrent.futures
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_fp4ext import patch_check, patches
from tests import test_sglang_layer
from tests.sglang_cpu import free_port, prelude_cpu_layer, run_child, run_python, tiny_model_dir

REPO = Path(__file__).resolve().parent.parent
README = REPO / "patches" / "README.md"
BEGIN, END = "<!-- manifest:begin -->", "<!-- manifest:end -->"
DIFFS = sorted({r.diff for r in patches.MANIFEST if r.diff})


# ---- the manifest itself (no SGLang) ------------------------------------------------------------


def test_readme_renders_the_manifest():
    text = README.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "manifest markers missing"
    section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert section == patches.render_markdown(), (
        "patches/README.md is out of sync with sglang_fp4ext/patches.py: paste "
        "patches.render_markdown() between the manifest markers"
    )
    # Every diff in patches/ is in the manifest, and every manifest diff exists.
    on_disk = sorted(p.name for p in (REPO / "patches").glob("*.diff"))
    assert on_disk == DIFFS
    assert [r.number for r in patches.MANIFEST] == list(range(1, len(patches.MANIFEST) + 1))
    assert len({r.target for r in patches.MANIFEST}) == len(patches.MANIFEST)


@pytest.mark.parametrize("name", DIFFS)
def test_diff_has_rationale_and_touches_only_sglang(name):
    text = (REPO / "patches" / name).read_text()
    header, _, body = text.partition("\ndiff --git ")
    assert body, f"{name}: no 'diff --git' section"
    assert len(header.strip().splitlines()) >= 3, f"{name}: needs a rationale header"
    files = re.findall(r"^\+\+\+ b/(\S+)$", text, re.MULTILINE)
    assert files and all(f.startswith("sglang/srt/") for f in files), files
    # Small: the point is an extension point, not a rewrite.
    changed = [ln for ln in body.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert len(changed) <= 60, f"{name}: {len(changed)} changed lines"


def test_list_table_names_every_hook(capsys):
    from sglang_fp4ext import cli

    assert cli.main(["patches", "list"]) == 0
    out = capsys.readouterr().out
    for r in patches.MANIFEST:
        assert r.target in out and r.short in out
        if r.diff:
            assert r.diff in out


def test_record_for_and_bad_dir():
    assert patches.record_for(patches.MANIFEST[2].target) is patches.MANIFEST[2]
    with pytest.raises(KeyError, match="not in the sglang_fp4ext hook manifest"):
        patches.record_for("sglang.nowhere")
    with pytest.raises(FileNotFoundError, match="not an sglang package directory"):
        patch_check.check_patches(REPO / "patches")


# ---- SGLang copies ------------------------------------------------------------------------------


def _copy_sglang(dest_root: Path) -> Path:
    """A full copy of the installed ``sglang`` package (``cp -a`` keeps mtimes, so the compiled
    caches stay valid and the children import as fast as from site-packages)."""
    src = patch_check.installed_sglang_dir()
    assert src is not None, "SGLang is not installed"
    dest_root.mkdir(parents=True, exist_ok=True)
    if shutil.which("cp"):
        subprocess.run(["cp", "-a", str(src), str(dest_root)], check=True)
    else:
        shutil.copytree(src, dest_root / "sglang", symlinks=True)
    return dest_root / "sglang"


def _apply(diff: Path, root: Path, *, check: bool) -> subprocess.CompletedProcess:
    """git apply in ``root`` (the directory holding sglang/), never inside an outer git tree."""
    if shutil.which("git"):
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent))
        cmd = ["git", "apply", "--verbose", *(["--check"] if check else []), str(diff)]
        proc = subprocess.run(cmd, check=False, cwd=root, env=env, capture_output=True, text=True)
        assert "Skipped patch" not in proc.stderr, proc.stderr
        return proc
    dry = ["--dry-run"] if check else []
    cmd = ["patch", "-p1", "-F0", "--batch", "--forward", *dry, "-d", str(root), "-i", str(diff)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True)


def _drop_lines(path: Path, first: int, last: int, replacement: str = "") -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: first - 1]) + replacement + "".join(lines[last:]))


def _break_copy(sglang: Path) -> None:
    """Remove ``ModelOptNvFp4FusedMoEMethod.apply``, rename the first parameter of its
    ``process_weights_after_loading`` and rename ``enable_num_token_non_padded``."""
    mq = sglang / "srt/layers/quantization/modelopt_quant.py"
    tree = ast.parse(mq.read_text())
    cls = next(
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and n.name == "ModelOptNvFp4FusedMoEMethod"
    )
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    pw, apply = methods["process_weights_after_loading"], methods["apply"]
    assert pw.lineno < apply.lineno
    _drop_lines(mq, apply.lineno, apply.end_lineno)  # later lines first: line numbers hold
    text = mq.read_text().splitlines(keepends=True)
    text[pw.lineno - 1] = text[pw.lineno - 1].replace("(self, layer:", "(self, module:")
    assert "(self, module:" in text[pw.lineno - 1]
    mq.write_text("".join(text))
    fbi = sglang / "srt/model_executor/forward_batch_info.py"
    src = fbi.read_text()
    assert src.count("\ndef enable_num_token_non_padded():") == 1
    fbi.write_text(src.replace("\ndef enable_num_token_non_padded():", "\ndef _renamed():"))


@pytest.fixture(scope="module")
def sglang_copies(tmp_path_factory):
    """{"patched": <root>, "broken": <root>}: roots holding an sglang/ copy each."""
    base = tmp_path_factory.mktemp("sglang-copies")
    roots = {"patched": base / "patched", "broken": base / "broken"}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(_copy_sglang, roots.values()))
    patched = roots["patched"]
    # Each diff on its own applies cleanly to the pristine copy ...
    for name in DIFFS:
        proc = _apply(REPO / "patches" / name, patched, check=True)
        assert proc.returncode == 0, f"{name} does not apply to SGLang:\n{proc.stderr}"
    # ... and all of them together, in order.
    for name in DIFFS:
        proc = _apply(REPO / "patches" / name, patched, check=False)
        assert proc.returncode == 0, f"{name} does not apply after the others:\n{proc.stderr}"
    _break_copy(roots["broken"] / "sglang")
    return roots


def _env_first(root: Path) -> dict[str, str]:
    path = [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join(path)}


# ---- what the plugin installs -------------------------------------------------------------------

# After load_plugins(): which HookRegistry targets and resolution steps carry an sglang_fp4ext
# function, and how each manifest hook is in effect.
_STATE = """
import sglang
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.arg_groups.resolution_hooks import _HOOKS
from sglang_fp4ext import sglang_backend as sb, capture_hooks as ch
ours = lambda f: (getattr(f, "__module__", "") or "").startswith("sglang_fp4ext")
state = {
    "sglang_file": sglang.__file__,
    "hooks": sorted(t for t, regs in HookRegistry._hooks.items()
                    if any(ours(h) for _, h, _ in regs)),
    "resolution": sorted(n for n, fns in _HOOKS.items() if any(ours(f) for f in fns)),
    "modes": sb.hook_modes(),
    "policy_status": ch.hook_status(),
    "core_bases": [c.__name__ for c in sb.Fp4ExtRunnerCore.__mro__[1:3]],
}
try:
    sb.verify_hooks()
    state["verify"] = "ok"
except RuntimeError as e:
    state["verify"] = str(e)
"""


def _manifest_sets():
    around = sorted(r.target for r in patches.MANIFEST if r.kind == "around")
    steps = sorted(r.step for r in patches.MANIFEST if r.kind == "resolution")
    return around, steps


@pytest.mark.sglang
def test_manifest_matches_the_hooks_the_plugin_installs():
    """Pristine SGLang: the plugin hooks exactly the manifest's targets, and nothing else."""
    r = run_child(
        "import json\nfrom sglang.srt.plugins import load_plugins\nload_plugins()\n"
        + _STATE
        + "print(json.dumps(state))"
    )
    around, steps = _manifest_sets()
    assert r["hooks"] == around
    assert r["resolution"] == steps
    assert set(r["modes"].values()) == {"hook"}, r["modes"]
    assert all(r["policy_status"].values()), r["policy_status"]
    assert r["core_bases"][0] == "DispatchMoeRunnerCore"
    assert r["verify"] == "ok"


# Another backend (flashinfer_cutlass, built in) through SGLang's NVFP4 MoE method: the platform
# check, weight processing and apply. The digest covers every parameter and buffer bit.
_OTHER_BACKEND = """
import hashlib
from sglang.srt.layers.moe.utils import MoeRunnerBackend
try:
    make_layer()
    refused = "constructed"
except ValueError as e:  # this CPU is not Blackwell
    refused = str(e)
with override_platform(is_blackwell=True):
    a = make_layer()
g = torch.Generator().manual_seed({SEED})
for name, p in a.named_parameters():
    if p.dtype == torch.uint8:
        p.data.copy_(torch.randint(0, 256, p.shape, generator=g, dtype=torch.uint8))
    else:
        p.data.copy_((torch.rand(p.shape, generator=g) + 0.5).to(p.dtype))
before = a.w13_weight_scale.detach().view(torch.uint8).clone()
a.quant_method.process_weights_after_loading(a)
tensors = dict(a.named_parameters())
tensors.update({{"buffer:" + k: v for k, v in a.named_buffers()}})
h = hashlib.sha256()
for k in sorted(tensors):
    t = tensors[k].detach().contiguous().reshape(-1)
    h.update(k.encode() + str(t.dtype).encode() + t.view(torch.uint8).numpy().tobytes())
a.quant_method._moe_runner_backend = MoeRunnerBackend.TRITON
try:
    a.quant_method.apply(layer=a, dispatch_output=None)
    err = "returned"
except Exception as e:
    err = f"{{type(e).__name__}}: {{e}}"
out = {{"refused": refused, "digest": h.hexdigest(), "names": sorted(tensors), "apply": err,
        "swizzled": not torch.equal(a.w13_weight_scale.detach().view(torch.uint8), before)}}
"""

# The masking predicate after SGLang publishes a TP server config for each backend.
_PREDICATE = """
from sglang.srt.model_executor import forward_batch_info as fbi
out["predicate"] = {{}}
for backend in {BACKENDS!r}:
    sa = ServerArgs(model_path={MODEL!r}, device="cpu", attention_backend="torch_native",
                    skip_tokenizer_init=True, moe_runner_backend=backend)
    sa.resolve_once()
    runtime_context.publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0))
    out["predicate"][backend] = fbi.enable_num_token_non_padded()
"""


@pytest.mark.sglang
def test_patched_sglang_needs_no_hooks_and_other_backends_are_unchanged(
    sglang_copies, tmp_path, seed
):
    """Patched copy + plugin: capabilities detected, no HookRegistry hook, SGLang's extension
    points wired; flashinfer_cutlass bit-identical to pristine SGLang without the plugin."""
    model = tiny_model_dir(tmp_path)
    body = _OTHER_BACKEND.format(SEED=seed)
    patched = (
        prelude_cpu_layer(model, "flashinfer_cutlass", free_port())
        + body
        + _PREDICATE.format(BACKENDS=("flashinfer_cutlass", "fp4ext"), MODEL=str(model))
        + _STATE
        + "out.update(state)\nprint(json.dumps(out))"
    )
    pristine = (
        prelude_cpu_layer(model, "flashinfer_cutlass", free_port())
        + body
        + _PREDICATE.format(BACKENDS=("flashinfer_cutlass",), MODEL=str(model))
        + "import sglang\nout['sglang_file'] = sglang.__file__\nprint(json.dumps(out))"
    )
    root = sglang_copies["patched"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        fp = pool.submit(run_child, patched, env=_env_first(root))
        fq = pool.submit(run_child, pristine, env={"SGLANG_PLUGINS": "some_other_plugin"})
        p, q = fp.result(), fq.result()
    assert Path(p["sglang_file"]).parent == root / "sglang"
    assert Path(q["sglang_file"]).parent == patch_check.installed_sglang_dir()
    # The plugin found every capability: no private hook at all, the resolution hook stays.
    around, steps = _manifest_sets()
    assert p["hooks"] == [] and p["resolution"] == steps
    assert p["modes"] == {t: "upstream" for t in around if t in p["modes"]}
    assert len(p["modes"]) == 3 and all(p["policy_status"].values()), p
    assert p["core_bases"] == ["WeightOwningRunnerCore", "DispatchMoeRunnerCore"]
    assert p["verify"] == "ok"
    # Another backend: SGLang's own behaviour, bit for bit.
    assert "does not support NVFP4" in q["refused"] and p["refused"] == q["refused"]
    assert q["swizzled"] is True  # CUTLASS processing really ran (block scales swizzled)
    assert (p["names"], p["digest"], p["swizzled"]) == (q["names"], q["digest"], q["swizzled"])
    assert "Unsupported moe_runner_backend for NVFP4 MoE" in q["apply"]
    assert p["apply"] == q["apply"]
    # Masking: SGLang alone carries no count in TP; fp4ext's registered condition turns it on.
    assert q["predicate"] == {"flashinfer_cutlass": False}
    assert p["predicate"] == {"flashinfer_cutlass": False, "fp4ext": True}


@pytest.mark.sglang
def test_fused_moe_layer_on_patched_sglang(sglang_copies, tmp_path, seed, monkeypatch):
    """tests/test_sglang_layer.py's single-process cases (routed-only and fused-shared),
    verbatim, against the patched copy:
    the platform check admits fp4ext through supports_platform, weight processing and apply
    run through the delegation (no hooks exist there), and the output matches the reference."""
    monkeypatch.setenv("PYTHONPATH", _env_first(sglang_copies["patched"])["PYTHONPATH"])
    test_sglang_layer.test_fused_moe_layer_matches_reference(tmp_path, seed)


def _cli_check(sglang_dir: Path | None) -> subprocess.CompletedProcess:
    argv = ["-m", "sglang_fp4ext.cli", "patches", "check"]
    if sglang_dir is not None:
        argv += ["--sglang-dir", str(sglang_dir)]
    return run_python(argv)


@pytest.mark.sglang
def test_cli_check_installed_patched_and_broken(sglang_copies):
    roots = [None, sglang_copies["patched"] / "sglang", sglang_copies["broken"] / "sglang"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        installed, patched, broken = pool.map(_cli_check, roots)
    mq = "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"
    fbi = "sglang.srt.model_executor.forward_batch_info"

    # Installed (pristine) SGLang: every target as verified, every diff applies.
    assert installed.returncode == 0, installed.stdout + installed.stderr
    ok = [ln for ln in installed.stdout.splitlines() if ln.startswith("OK ")]
    assert len(ok) == len(patches.MANIFEST), installed.stdout
    for name in DIFFS:
        assert f"{name} applies" in installed.stdout
    assert "all OK" in installed.stdout

    # Patched: SGLang has every extension point; the hooks are not needed.
    assert patched.returncode == 0, patched.stdout + patched.stderr
    assert patched.stdout.count("hook not needed") == len(DIFFS) + 1  # 0002 serves hooks 2 and 3

    # Broken copy: exit 1; each failing target named with what is wrong.
    assert broken.returncode == 1, broken.stdout + broken.stderr
    err = broken.stderr
    assert (
        f"FAILED {mq}.apply: target missing (LookupError: ModelOptNvFp4FusedMoEMethod no longer "
        "defines apply (only inherits FusedMoEMethodBase.apply))" in err
    ), err
    assert (
        f"FAILED {mq}.process_weights_after_loading: signature changed: expected (self, layer), "
        "found (self, module)" in err
    ), err
    assert f"FAILED {fbi}.enable_num_token_non_padded: target missing (AttributeError" in err
    failed = [ln for ln in err.splitlines() if ln.startswith("fp4ext patches check: FAILED")]
    assert len(failed) == 3, err
    for number, name in ((3, DIFFS[1]), (2, DIFFS[1]), (5, DIFFS[2])):
        target = patches.MANIFEST[number - 1].target
        line = next(ln for ln in failed if f"FAILED {target}:" in ln)
        assert f"{name} does not apply (" in line, line
    lines = broken.stdout.splitlines()
    assert next(ln for ln in lines if " 1. " in ln).startswith("OK ")  # untouched: still fine
    assert next(ln for ln in lines if " 4. " in ln).startswith("OK ")
    assert "3 of 5 hooks FAILED" in broken.stdout
