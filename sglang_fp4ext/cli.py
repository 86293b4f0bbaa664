"""The ``fp4ext`` command.

``fp4ext info``  what is installed, whether SGLang will load the plugin, which GPU this is, which
                 fp4ext kernel path it runs, and that GPU's spec row (dense and 2:4-sparse peaks
                 kept apart).
``fp4ext check`` the main job: serve a model through SGLang with ``--moe-runner-backend fp4ext``
                 and check its greedy tokens. With no arguments it builds a tiny NVFP4 MoE model
                 (ModelOpt export) and judges every served token against ``transformers`` in
                 float32 on the dequantised weights; with ``--model-path`` and SGLang launch flags
                 it compares fp4ext with SGLang's default NVFP4 MoE backend on the same prompts.
``fp4ext bench``  time the MoE layer across token counts on this GPU against the measured
                 bandwidth and dense compute roofs (JSON + roofline PNG; see
                 ``bench/bench_cli.py``).
``fp4ext tune``   time the decode and prefill kernel configs per token bucket on this GPU for a
                 model shape, check each winner against the reference and write the config
                 table the dispatcher reads (``tune.py``; exit 2 without a GPU).
``fp4ext patches list|check``  the manifest of fp4ext's hooks on SGLang (``patches/README.md``);
                 ``check`` verifies that every hook target still exists with the expected
                 signature and every upstream diff still applies (exit 1 on any failure).

Works without SGLang and without a GPU (it says so), so it is also the first thing to run on a
machine that is being set up.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import sys
import time
import warnings
from typing import Any

from sglang_fp4ext import __version__, compat, target_info

__all__ = ["main", "collect_info"]

_GROUP = "sglang.srt.plugins"
_EP_NAME = "fp4ext"


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"torch": None, "cuda": None}
    return {"torch": torch.__version__, "cuda": torch.version.cuda}


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def _plugin_discovery() -> dict[str, Any]:
    """Does SGLang's own loader find and load our entry point, given SGLANG_PLUGINS?"""
    eps = [ep for ep in importlib.metadata.entry_points(group=_GROUP) if ep.name == _EP_NAME]
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()}
    out: dict[str, Any] = {
        "entry_point": f"{_GROUP}: {eps[0].name} = {eps[0].value}" if eps else None,
        "sglang_plugins_env": allowed or None,
        "excluded_by_sglang_plugins": bool(allowed_set) and _EP_NAME not in allowed_set,
        "discovered_by_sglang": None,
    }
    try:
        from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
    except Exception as exc:  # SGLang missing or broken: say so, do not fail `info`
        out["discovered_by_sglang"] = None
        out["sglang_error"] = f"{type(exc).__name__}: {exc}"
        return out
    sgl_logger = logging.getLogger("sglang.srt.plugins")
    level = sgl_logger.level
    sgl_logger.setLevel(logging.WARNING)  # the loader logs every plugin at INFO
    try:
        found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    finally:
        sgl_logger.setLevel(level)
    out["discovered_by_sglang"] = _EP_NAME in found
    return out


def _gpu_info() -> dict[str, Any]:
    cap = target_info.device_capability()
    info: dict[str, Any] = {
        "name": target_info.device_name(),
        "capability": None if cap is None else f"sm_{cap[0]}{cap[1]}",
        "sms": target_info.num_sms(),
        "smem_per_block": target_info.smem_per_block(),
        "kernel_path": target_info.kernel_path(cap),
        "spec": None,
    }
    try:
        from sglang_fp4ext import hardware
    except ImportError:
        return info
    spec = hardware.spec_for_device_name(info["name"]) if info["name"] else None
    info["spec"] = None if spec is None else hardware.spec_summary(spec)
    return info


def collect_info() -> dict[str, Any]:
    sgl = compat.check_sglang()
    return {
        "sglang_fp4ext": __version__,
        "python": platform.python_version(),
        "sglang": sgl.version,
        "sglang_supported": sgl.ok,
        "sglang_support_reason": sgl.reason,
        **_torch_info(),
        "triton": _triton_version(),
        "plugin": _plugin_discovery(),
        "gpu": _gpu_info(),
        "selfcheck": _selfcheck_info(),
    }


def _selfcheck_info() -> dict[str, Any]:
    """The first-use self-check's setting and the verdicts cached on disk (``moe/selfcheck.py``)."""
    from sglang_fp4ext import envs
    from sglang_fp4ext.moe import selfcheck

    return {
        "setting": envs.SELFCHECK.get() or "default (on with a GPU, off under the interpreter)",
        "file": str(selfcheck.disk_path()),
        "verdicts": selfcheck.verdicts(),
    }


def _yn(v: bool | None) -> str:
    return "n/a" if v is None else ("yes" if v else "NO")


def _print_info(info: dict[str, Any]) -> None:
    rows: list[tuple[str, str]] = []

    def section(title: str) -> None:
        rows.append((f"[{title}]", ""))

    section("versions")
    rows.append(("sglang_fp4ext", info["sglang_fp4ext"]))
    rows.append(("python", info["python"]))
    rows.append(
        (
            "SGLang",
            "not installed"
            if info["sglang"] is None
            else f"{info['sglang']} ({'supported' if info['sglang_supported'] else 'UNSUPPORTED'}:"
            f" needs {compat.SUPPORTED_SGLANG})",
        )
    )
    cuda = f" (CUDA {info['cuda']})" if info.get("cuda") else " (CPU build)"
    rows.append(("torch", "not installed" if info["torch"] is None else info["torch"] + cuda))
    rows.append(("Triton", info["triton"] or "not installed"))

    p = info["plugin"]
    section("plugin")
    rows.append(("entry point", p["entry_point"] or "not installed (package not pip-installed)"))
    rows.append(("SGLANG_PLUGINS", p["sglang_plugins_env"] or "unset (every plugin loads)"))
    if p["excluded_by_sglang_plugins"]:
        rows.append(("", "fp4ext is NOT in SGLANG_PLUGINS: SGLang will not load it"))
    disc = p["discovered_by_sglang"]
    rows.append(
        (
            "SGLang loader finds it",
            "n/a (SGLang not importable)" if disc is None else _yn(disc),
        )
    )

    g = info["gpu"]
    section("gpu")
    if g["name"] is None:
        rows.append(("device", "no CUDA GPU"))
    else:
        rows.append(("device", f"{g['name']} ({g['capability']}, {g['sms']} SMs)"))
        if g["smem_per_block"]:
            rows.append(("smem per block", f"{g['smem_per_block']:,} B (opt-in)"))
    rows.append(("fp4ext kernel path", g["kernel_path"]))
    spec_lines = g["spec"].splitlines() if g["spec"] else []
    if g["name"] is not None:
        rows.append(("spec row", spec_lines[0] if spec_lines else "unknown GPU: no spec row"))
    sc = info["selfcheck"]
    section("kernel self-check")
    rows.append(("SGLANG_FP4EXT_SELFCHECK", sc["setting"]))
    rows.append(("verdicts", f"{len(sc['verdicts'])} in {sc['file']}"))
    for key, v in sorted(sc["verdicts"].items()):
        figs = "" if v.get("rms_rel") is None else f" rms_rel {v['rms_rel']:.1e}"
        rows.append(("  " + ("ok" if v.get("ok") else "FAILED"), f"{key}{figs}"))
    width = max(len(k) for k, _ in rows if not k.startswith("  ")) + 2
    for k, v in rows:
        print(k if k.startswith("[") else f"  {k:<{width}}{v}")
        if k == "spec row":
            for line in spec_lines[1:]:
                print(f"  {'':<{width}}{line}")


def _cmd_info(args: argparse.Namespace) -> int:
    from sglang_fp4ext import capture_policy

    with warnings.catch_warnings():
        # CPU machines with only libcuda1 (so sgl_kernel imports): torch warns the driver is
        # "too old", which here only means "no GPU" and is reported as such below.
        warnings.filterwarnings("ignore", message="CUDA initialization")
        info = collect_info()
        policy = capture_policy.policy_for(args.model, args.tp, args.ep, args.max_running_requests)
    if args.json:
        info["capture_policy"] = policy.to_dict()
        json.dump(info, sys.stdout, indent=2, default=str)
        print()
    else:
        _print_info(info)
        print(f"[capture policy: {args.model}, TP{args.tp} EP{args.ep}]")
        text = capture_policy.describe_policy(
            args.model, args.tp, args.ep, args.max_running_requests
        )
        for line in text.splitlines():
            print(f"  {line}")
    return 0


class _CheckProgress:
    """``fp4ext check``'s output: one line per phase with the time since the start, and while
    a server starts a "waiting for ..." line every 15 s (``server.start_all``)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, kind: str, text: str) -> None:
        indent = "    " if kind in ("wait", "retry") else ""
        print(f"  [{time.monotonic() - self.t0:6.1f} s] {indent}{text}", flush=True)


def _cmd_check(args: argparse.Namespace) -> int:
    from sglang_fp4ext.testing import server

    launch = list(args.sglang_args)
    if launch[:1] == ["--"]:
        launch = launch[1:]
    progress = _CheckProgress()
    try:
        if args.model_path:
            return _check_model(args, launch, progress)
        return _check_tiny(args, launch, progress)
    except server.ServerStartError as exc:
        print(f"  [{time.monotonic() - progress.t0:6.1f} s] FAILED: {exc}", flush=True)
        print("verdict: FAIL (a server did not come up)")
        return 1


def _check_model(args: argparse.Namespace, launch: list[str], progress) -> int:
    from pathlib import Path

    from sglang_fp4ext.testing import e2e

    cfg = json.loads((Path(args.model_path) / "config.json").read_text())
    prompts = e2e.prompts_for(cfg["vocab_size"], args.prompts, seed=args.seed)
    print(
        f"fp4ext check: {args.model_path}, {args.prompts} prompts x {args.tokens} tokens, "
        f"fp4ext vs SGLang's default NVFP4 MoE backend"
    )
    r = e2e.check_against_default_backend(
        args.model_path, launch, prompts=prompts, max_new_tokens=args.tokens, progress=progress
    )
    for i, d in enumerate(r["first_divergence"]):
        print(f"  prompt {i}: " + ("identical" if d is None else f"diverges at token {d}"))
    ok = r["fp4ext_layers_logged"]
    print(
        f"verdict: {r['identical_prompts']}/{args.prompts} prompts identical; fp4ext served "
        f"the MoE layers: {'yes' if ok else 'NO'} ({time.monotonic() - progress.t0:.0f} s)"
    )
    return 0 if ok else 1


def _check_tiny(args: argparse.Namespace, launch: list[str], progress) -> int:
    import tempfile
    from pathlib import Path

    from sglang_fp4ext.testing import cpu_workarounds, e2e
    from sglang_fp4ext.testing.checkpoint import make_tiny_checkpoint

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fp4ext-check-"))
    extra, env, dims = [], None, {}
    if not target_info.has_cuda_gpu():
        extra, env = cpu_workarounds.cpu_server_args()
        # SGLang 0.5.23's GLM-4.5/DeepSeek MoE blocks multiply by routed_scaling_factor again on
        # non-CUDA devices although NVFP4 folds it into the top-k weights (docs/measured-facts.md).
        dims["routed_scaling_factor"] = 1.0
        print(
            "  no GPU: SGLang's CPU engine; tiny model with routed_scaling_factor 1.0 "
            "(SGLang applies the factor twice on CPU for NVFP4)"
        )
    extra += launch
    print(f"fp4ext check: tiny {args.arch} NVFP4 model (ModelOpt export) in {work}")
    progress("phase", "quantizing and exporting the tiny model")
    ckpt = make_tiny_checkpoint(
        work / "model", arch=args.arch, seed=args.seed, quantize_shared_experts=False, **dims
    )
    r = e2e.check_checkpoint_against_oracle(
        ckpt,
        n_prompts=args.prompts,
        max_new_tokens=args.tokens,
        extra_args=extra,
        env=env,
        work_dir=work,
        seed=args.seed,
        progress=progress,
    )
    progress("phase", "done")
    print(f"  prompts identical to the oracle's greedy tokens: {r['exact_prompts']}/{args.prompts}")
    print(
        f"  largest logit gap of a served token below the oracle's best: {r['max_gap']:.4f} "
        f"(tolerance {e2e.GAP_TOLERANCE}: near-ties flip under bf16)"
    )
    print(
        f"  SGLang log says fp4ext served the MoE layers: "
        f"{'yes' if r['fp4ext_layers_logged'] else 'NO'} ({r['server_log']})"
    )
    print(f"verdict: {'PASS' if r['ok'] else 'FAIL'}")
    return 0 if r["ok"] else 1


def _cmd_patches(args: argparse.Namespace) -> int:
    from sglang_fp4ext import patch_check, patches

    if args.action == "list":
        print(patches.render_table())
        return 0
    try:
        report = patch_check.check_patches(args.sglang_dir, patches_dir=args.patches_dir)
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"fp4ext patches check: {exc}", file=sys.stderr)
        return 2
    print(report.format())
    for line in report.failures:
        print(f"fp4ext patches check: FAILED {line.target}: {line.message}", file=sys.stderr)
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fp4ext", description="sglang_fp4ext: NVFP4 fused-MoE kernels for SGLang"
    )
    parser.add_argument("--version", action="version", version=f"sglang_fp4ext {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="versions, plugin discovery, GPU and kernel path")
    p_info.add_argument("--json", action="store_true", help="machine-readable output")
    p_info.add_argument(
        "--model",
        default="glm-5",
        help="model for the capture-policy table: a preset or a config.json path",
    )
    p_info.add_argument("--tp", type=int, default=8, help="tensor-parallel size (default 8)")
    p_info.add_argument("--ep", type=int, default=1, help="expert-parallel size (default 1)")
    p_info.add_argument("--max-running-requests", type=int, default=None)
    p_info.set_defaults(func=_cmd_info)
    p_check = sub.add_parser(
        "check", help="serve a model with fp4ext through SGLang and check its tokens"
    )
    p_check.add_argument("--model-path", help="an NVFP4 model; default: a bundled tiny model")
    p_check.add_argument(
        "--arch",
        default="glm4_moe",
        choices=["glm4_moe", "deepseek_v3"],
        help="architecture of the tiny model (default glm4_moe: GLM-4.5 family)",
    )
    p_check.add_argument("--prompts", type=int, default=4)
    p_check.add_argument("--tokens", type=int, default=16)
    p_check.add_argument("--seed", type=int, default=0)
    p_check.add_argument(
        "--work-dir", help="where the tiny model and logs go (default: a temp dir)"
    )
    p_check.add_argument(
        "sglang_args",
        nargs=argparse.REMAINDER,
        help="extra SGLang launch flags after --, e.g. -- --tp 8",
    )
    p_check.set_defaults(func=_cmd_check)
    p_patches = sub.add_parser(
        "patches", help="the hooks on SGLang and their upstream diffs: list, or check them"
    )
    p_patches.add_argument("action", choices=["list", "check"])
    p_patches.add_argument("--sglang-dir", help="an sglang package directory (default: installed)")
    p_patches.add_argument("--patches-dir", help="where the diffs are (default: the source tree's)")
    p_patches.set_defaults(func=_cmd_patches)
    from sglang_fp4ext.bench.bench_cli import add_bench_parser

    add_bench_parser(sub)
    from sglang_fp4ext.tune_cli import add_tune_parser

    add_tune_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
