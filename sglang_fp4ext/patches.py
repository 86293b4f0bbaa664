"""The manifest of fp4ext's hooks on SGLang, as data, and its check against an SGLang copy.

One :class:`HookRecord` per hook the plugin installs (``sglang_backend.HOOKS`` and
``capture_hooks.install``): the dotted target, why the hook exists, how it works, the SGLang
version it was verified on, the diff in ``patches/`` that adds the missing extension point to
SGLang, the *capability* (a dotted name that exists once SGLang has that extension point) and when
to remove the hook. ``patches/README.md`` renders :func:`render_markdown` between its manifest
markers (a test keeps them equal).

Capability, not version: when :func:`upstream_has` finds a record's capability in the running
SGLang, the plugin registers with that extension point and installs no hook for the record.

:func:`check_patches` verifies an installed or given SGLang copy: every target that still needs a
hook exists with the expected ``inspect.signature`` parameter names (checked in a child
interpreter with the copy first on ``PYTHONPATH``, so any copy can be checked without touching
this process), and every diff still applies (``git apply --check``, or ``patch --dry-run``).

This module imports no SGLang at import time (``fp4ext patches list`` works without it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST",
    "PATCHES_DIR",
    "CheckLine",
    "CheckReport",
    "HookRecord",
    "check_patches",
    "installed_sglang_dir",
    "list_patches",
    "record_for",
    "render_markdown",
    "render_table",
    "upstream_has",
    "upstream_object",
]

#: The diffs ship with the source tree (repo ``patches/``), not with the wheel.
PATCHES_DIR = Path(__file__).resolve().parent.parent / "patches"

_METHOD = "sglang.srt.layers.quantization.modelopt_quant.ModelOptNvFp4FusedMoEMethod"
_VERIFIED = "0.5.23"


@dataclass(frozen=True)
class HookRecord:
    """One hook on SGLang. ``kind``: ``around`` (a ``HookRegistry`` AROUND hook on ``target``)
    or ``resolution`` (``register_resolution_hook`` on the step named by ``target``'s last part).
    ``params``: the target's ``inspect.signature`` parameter names, as verified. ``diff``: file in
    ``patches/`` (None: the hook uses a public extension point). ``capability``: dotted name that
    exists once SGLang has the upstream change (None: nothing upstream to wait for)."""

    number: int
    target: str
    kind: str
    params: tuple[str, ...]
    why: str
    how: str
    upstream: str
    remove_when: str
    diff: str | None = None
    capability: str | None = None
    verified: str = _VERIFIED

    @property
    def short(self) -> str:
        """``Class.method`` or ``module.function``: the last two dotted parts."""
        return ".".join(self.target.split(".")[-2:])

    @property
    def step(self) -> str:
        """The resolution step name (``resolution`` records)."""
        return self.target.rsplit(".", 1)[-1]


MANIFEST: tuple[HookRecord, ...] = (
    HookRecord(
        number=1,
        target=f"{_METHOD}.__init__",
        kind="around",
        params=("self", "quant_config"),
        why="the constructor raises 'Current platform does not support NVFP4' unless the "
        "platform is Blackwell or the backend is marlin; fp4ext's Triton kernels run on SM80+ "
        "(H100/H200, A100) and its torch reference on the CPU.",
        how="with fp4ext selected on a non-Blackwell platform, run the original inside SGLang's "
        "own override_platform(is_blackwell=True) scope.",
        upstream="register_moe_runner_core(name, factory, supports_platform=...) and "
        "runner_core_supports_platform(backend), consulted by the NVFP4 MoE platform check; "
        "fp4ext registers supports_platform.",
        remove_when="SGLang's NVFP4 MoE constructor asks registered runner cores about the "
        "platform.",
        diff="0001-runner-core-supports-platform.diff",
        capability="sglang.srt.layers.moe.moe_runner.runner.runner_core_supports_platform",
    ),
    HookRecord(
        number=2,
        target=f"{_METHOD}.process_weights_after_loading",
        kind="around",
        params=("self", "layer"),
        why="for an unknown backend the original falls into the CUTLASS path: it swizzles the "
        "block scales in place into the 128x4 layout (destroying the row-major scales fp4ext "
        "reads) and, with EP > 1, computes alphas from global [Eg] input scales against local "
        "[E] weight scales (a broadcast error).",
        how="with fp4ext, skip the original; build fp4ext's kernel layout from the loaded "
        "parameters (sglang_backend.process_weights), free the swizzled-scale placeholders and "
        "the checkpoint-layout copies, clear the dispatcher's FP4 input scale.",
        upstream="WeightOwningRunnerCore (moe_runner/base.py): a DispatchMoeRunnerCore with "
        "process_weights_after_loading(quant_method, layer); the NVFP4 method delegates to it "
        "after deinterleaving. Fp4ExtRunnerCore subclasses it.",
        remove_when="the NVFP4 MoE method delegates weight processing to registered runner cores.",
        diff="0002-nvfp4-moe-delegates-to-runner-core.diff",
        capability="sglang.srt.layers.moe.moe_runner.base.WeightOwningRunnerCore",
    ),
    HookRecord(
        number=3,
        target=f"{_METHOD}.apply",
        kind="around",
        params=("self", "layer", "dispatch_output"),
        why="for an unknown backend the original raises 'Unsupported moe_runner_backend for "
        "NVFP4 MoE'.",
        how="with fp4ext, call self.runner.run(dispatch_output, Fp4ExtQuantInfo); SGLang's "
        "MoeRunner hands it to Fp4ExtRunnerCore.",
        upstream="the same WeightOwningRunnerCore: apply returns "
        "self.runner.run(dispatch_output, core.build_quant_info(layer)).",
        remove_when="the NVFP4 MoE method delegates apply to registered runner cores.",
        diff="0002-nvfp4-moe-delegates-to-runner-core.diff",
        capability="sglang.srt.layers.moe.moe_runner.base.WeightOwningRunnerCore",
    ),
    HookRecord(
        number=4,
        target="sglang.srt.arg_groups.memory_hook.handle_gpu_memory_settings",
        kind="resolution",
        params=("server_args",),
        why="choose the decode batch sizes and prefill token buckets SGLang captures (dense "
        "where decode lives, aligned with the fp4ext kernel buckets; prefill at the 128-token "
        "tile).",
        how="register_resolution_hook('handle_gpu_memory_settings') (launcher process): run "
        "SGLang's step first, then declare_resolution(cuda_graph_config=with_phase(...)) for "
        "every key the user did not set (_cuda_graph_config_locked), only when the backend is "
        "fp4ext.",
        upstream="none needed: register_resolution_hook is SGLang's public extension point.",
        remove_when="never (public API); re-verify the step name on SGLang upgrades.",
    ),
    HookRecord(
        number=5,
        target="sglang.srt.model_executor.forward_batch_info.enable_num_token_non_padded",
        kind="around",
        params=(),
        why="in TP mode SGLang routes CUDA-graph padding rows like real tokens, so a padded "
        "batch reads more experts' weights; SGLang only carries the real token count (and masks "
        "padded rows to -1 in TopK) for EP > 1, DP gather or a custom a2a.",
        how="original() or (backend is fp4ext and a2a none and no DP attention): plain TP then "
        "runs exactly the masking SGLang already runs for EP.",
        upstream="register_num_token_non_padded_condition(condition) in forward_batch_info: the "
        "predicate is also on while a registered condition holds; fp4ext registers its "
        "TP-mode condition.",
        remove_when="SGLang lets a runner backend ask for the non-padded token count.",
        diff="0003-num-token-non-padded-condition.diff",
        capability="sglang.srt.model_executor.forward_batch_info."
        "register_num_token_non_padded_condition",
    ),
)


def list_patches() -> tuple[HookRecord, ...]:
    """The manifest, in hook order."""
    return MANIFEST


def record_for(target: str) -> HookRecord:
    """The manifest record of a hook target (dotted path); KeyError names unknown targets."""
    for r in MANIFEST:
        if r.target == target:
            return r
    raise KeyError(f"{target!r} is not in the sglang_fp4ext hook manifest")


# ---- capability detection (in this process, against the imported SGLang) ------------------------


def upstream_object(target: str) -> Any | None:
    """The capability object for ``target`` when the running SGLang has it, else None."""
    cap = record_for(target).capability
    if cap is None:
        return None
    try:
        return pkgutil.resolve_name(cap)
    except (ImportError, AttributeError, ValueError):
        return None


def upstream_has(target: str) -> bool:
    """Does the running SGLang contain the extension point that replaces ``target``'s hook?"""
    return upstream_object(target) is not None


# ---- rendering ---------------------------------------------------------------------------------


def _doc_target(r: HookRecord) -> str:
    if r.kind == "resolution":
        return f"resolution step `{r.step}` (`{r.target}`)"
    return f"`{r.target}`"


def render_markdown() -> str:
    """The manifest section of ``patches/README.md`` (kept equal by a test)."""
    out = []
    for r in MANIFEST:
        sig = "(" + ", ".join(r.params) + ")"
        out += [
            f"### {r.number}. `{r.short}`"
            + (" (resolution hook)" if r.kind == "resolution" else ""),
            f"- **Target**: {_doc_target(r)}, {r.kind} hook; signature `{sig}`.",
            f"- **Why**: {r.why}",
            f"- **How**: {r.how}",
            f"- **Verified on**: SGLang {r.verified}.",
            f"- **Upstream change**: {r.upstream}",
            "- **Diff**: " + (f"[`{r.diff}`]({r.diff})" if r.diff else "none"),
            "- **Capability probe**: "
            + (
                f"`{r.capability}` (present: the plugin skips this hook)"
                if r.capability
                else "none"
            ),
            f"- **Remove when**: {r.remove_when}",
            "",
        ]
    return "\n".join(out).rstrip() + "\n"


def render_table() -> str:
    """``fp4ext patches list``: one row per hook."""
    rows = [("#", "kind", "target", "signature", "diff", "capability probe")]
    for r in MANIFEST:
        rows.append(
            (
                str(r.number),
                r.kind,
                r.short,
                "(" + ", ".join(r.params) + ")",
                r.diff or "- (public API)",
                (r.capability or "-").rsplit(".", 1)[-1],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines += [f"{r.number}. {r.target}\n   remove when: {r.remove_when}" for r in MANIFEST]
    return "\n".join(lines)


# ---- check against an SGLang copy --------------------------------------------------------------


@dataclass(frozen=True)
class CheckLine:
    """The verdict for one hook: ``ok`` and a message naming the target and what is wrong."""

    number: int
    target: str
    ok: bool
    message: str

    def format(self) -> str:
        return f"{'OK  ' if self.ok else 'FAIL'} {self.number}. {self.target}: {self.message}"


@dataclass(frozen=True)
class CheckReport:
    sglang_dir: str
    sglang_version: str | None
    lines: tuple[CheckLine, ...]

    @property
    def ok(self) -> bool:
        return all(line.ok for line in self.lines)

    @property
    def failures(self) -> tuple[CheckLine, ...]:
        return tuple(line for line in self.lines if not line.ok)

    def format(self) -> str:
        head = f"SGLang {self.sglang_version or '(version unknown)'} at {self.sglang_dir}"
        body = [line.format() for line in self.lines]
        n_fail = len(self.failures)
        tail = (
            f"{len(self.lines)} hooks checked: all OK"
            if not n_fail
            else f"{n_fail} of {len(self.lines)} hooks FAILED: the plugin would not work with "
            "this SGLang until the targets/diffs above are updated"
        )
        return "\n".join([head, *body, tail])


def installed_sglang_dir() -> Path | None:
    """The installed ``sglang`` package directory, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# Runs in a child interpreter with the checked copy first on sys.path: resolves every target and
# capability and reports parameter names. Prints one JSON object.
_PROBE = r"""
import inspect, json, pkgutil, sys, warnings
warnings.simplefilter("ignore")
records = json.loads(sys.argv[1])
out = {"records": {}, "sglang_file": None, "version": None}
try:
    import sglang
    out["sglang_file"] = sglang.__file__
    out["version"] = getattr(sglang, "__version__", None)
except Exception as e:
    out["import_error"] = f"{type(e).__name__}: {e}"
for r in records:
    res = {"capability": False}
    if r["capability"]:
        try:
            pkgutil.resolve_name(r["capability"])
            res["capability"] = True
        except Exception:
            pass
    try:
        obj = pkgutil.resolve_name(r["target"])
        # A hook on a method the class only inherits would patch the wrong code.
        owner_path, attr = r["target"].rsplit(".", 1)
        owner = pkgutil.resolve_name(owner_path)
        if isinstance(owner, type) and attr not in vars(owner):
            base = next((c.__qualname__ for c in owner.__mro__ if attr in vars(c)), None)
            raise LookupError(f"{owner.__qualname__} no longer defines {attr}"
                              + (f" (only inherits {base}.{attr})" if base else ""))
        res["params"] = list(inspect.signature(obj).parameters)
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
    if r["kind"] == "resolution" and "error" not in res:
        try:
            from sglang.srt.arg_groups.resolution_hooks import _OVERRIDABLE_HOOKS
            step = r["target"].rsplit(".", 1)[-1]
            if step not in _OVERRIDABLE_HOOKS:
                res["error"] = f"{step!r} is not an overridable resolution step"
        except Exception as e:
            res["error"] = f"resolution hooks unavailable: {type(e).__name__}: {e}"
    out["records"][r["target"]] = res
print(json.dumps(out))
"""


def _probe(sglang_dir: Path, timeout: float) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(sglang_dir.parent)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env.setdefault("PYTHONWARNINGS", "ignore")
    payload = json.dumps(
        [{"target": r.target, "kind": r.kind, "capability": r.capability} for r in MANIFEST]
    )
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, payload],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(sglang_dir.parent),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"probing SGLang at {sglang_dir} failed (rc={proc.returncode}): "
            f"{proc.stderr.strip()[-2000:]}"
        )
    return json.loads(lines[-1])


def _run_apply_check(diff: Path, root: Path, reverse: bool) -> tuple[bool, str]:
    """``git apply --check`` of ``diff`` in ``root`` (the directory holding ``sglang/``).

    git is kept from discovering a repository above ``root`` (an SGLang inside a git work tree,
    e.g. a venv in a checkout): there it would silently skip every path ("Skipped patch").
    """
    rev = ["--reverse"] if reverse else []
    git = shutil.which("git")
    if git is not None:
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent))
        env.pop("GIT_DIR", None)
        env.pop("GIT_WORK_TREE", None)
        proc = subprocess.run(
            [git, "apply", "--check", "--verbose", *rev, str(diff)],
            check=False,
            cwd=root,
            capture_output=True,
            text=True,
            env=env,
        )
        text = (proc.stderr + proc.stdout).strip()
        if proc.returncode == 0 and "Skipped patch" not in text:
            return True, ""
        if "Skipped patch" in text:
            return False, "git skipped the patch (is the directory inside a git work tree?)"
        return False, _first_error(text)
    patch = shutil.which("patch")
    if patch is None:
        return False, "neither git nor patch is available to check the diff"
    direction = "--reverse" if reverse else "--forward"
    cmd = [patch, "-p1", "--dry-run", "-F0", "--batch", direction, "-d", str(root), "-i", str(diff)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    return proc.returncode == 0, _first_error(proc.stdout + proc.stderr)


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("error:") and ("patch failed" in line or "does not" in line):
            return line.removeprefix("error: ").strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("Checking")]
    return (lines[-1] if lines else text).strip()[:300]


def _diff_status(diff: str, root: Path, patches_dir: Path) -> tuple[str, str]:
    """("applies" | "applied" | "missing" | "fails", detail)."""
    path = patches_dir / diff
    if not path.is_file():
        return "missing", f"{path} not found (the diffs ship with the source tree's patches/)"
    ok, err = _run_apply_check(path, root, reverse=False)
    if ok:
        return "applies", ""
    if _run_apply_check(path, root, reverse=True)[0]:
        return "applied", ""
    return "fails", err


def check_patches(
    sglang_dir: str | os.PathLike | None = None,
    *,
    patches_dir: str | os.PathLike | None = None,
    timeout: float = 300,
) -> CheckReport:
    """Verify the manifest against SGLang at ``sglang_dir`` (the ``sglang`` package directory;
    default: the installed one). Per hook: when the copy has the upstream capability the hook is
    not needed (OK); otherwise the target must exist with the manifest's parameter names and its
    diff must apply cleanly (or be applied already)."""
    root_dir = Path(sglang_dir) if sglang_dir is not None else installed_sglang_dir()
    if root_dir is None:
        raise FileNotFoundError("SGLang is not installed; pass the sglang package directory")
    root_dir = root_dir.resolve()
    if not (root_dir / "__init__.py").is_file() or root_dir.name != "sglang":
        raise FileNotFoundError(f"{root_dir} is not an sglang package directory")
    pdir = Path(patches_dir) if patches_dir is not None else PATCHES_DIR
    probe = _probe(root_dir, timeout)
    used = probe.get("sglang_file")
    if used is None or Path(used).resolve().parent != root_dir:
        raise RuntimeError(
            f"probing {root_dir} imported SGLang from {used} instead "
            f"({probe.get('import_error', 'another copy is first on sys.path')})"
        )
    diffs: dict[str, tuple[str, str]] = {}
    lines = []
    for r in MANIFEST:
        res = probe["records"][r.target]
        if res["capability"]:
            lines.append(
                CheckLine(
                    r.number,
                    r.target,
                    True,
                    f"SGLang has the extension point ({r.capability}): hook not needed",
                )
            )
            continue
        problems, notes = [], []
        if "error" in res:
            problems.append(f"target missing ({res['error']})")
        elif tuple(res["params"]) != r.params:
            problems.append(
                f"signature changed: expected ({', '.join(r.params)}), "
                f"found ({', '.join(res['params'])})"
            )
        else:
            notes.append(f"target ({', '.join(r.params)}) ok")
        if r.diff:
            if r.diff not in diffs:
                diffs[r.diff] = _diff_status(r.diff, root_dir.parent, pdir)
            status, detail = diffs[r.diff]
            if status == "applies":
                notes.append(f"{r.diff} applies")
            elif status == "applied":
                notes.append(f"{r.diff} already applied")
            elif status == "missing":
                notes.append(f"{r.diff} not checked: {detail}")
            else:
                problems.append(f"{r.diff} does not apply ({detail})")
        else:
            notes.append("public extension point, no diff")
        lines.append(CheckLine(r.number, r.target, not problems, "; ".join(problems or notes)))
    return CheckReport(str(root_dir), probe.get("version"), tuple(lines))
