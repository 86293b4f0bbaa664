"""``fp4ext patches check``: verify the hook manifest (``patches.MANIFEST``) against an SGLang
copy.

:func:`check_patches` verifies an installed or given SGLang copy: every target that still needs a
hook exists with the expected ``inspect.signature`` parameter names (checked in a child
interpreter with the copy first on ``PYTHONPATH``, so any copy can be checked without touching
this process), and every diff still applies (``git apply --check``, or ``patch --dry-run``).

This module imports no SGLang (the copy is probed in a child interpreter).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_fp4ext.patches import MANIFEST, PATCHES_DIR

__all__ = ["CheckLine", "CheckReport", "check_patches", "installed_sglang_dir"]


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
