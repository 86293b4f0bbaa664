"""``fp4ext info``: what is installed, every ``SGLANG_FP4EXT_*`` setting (bad ones flagged),
whether SGLang will load the plugin, which GPU this is, which fp4ext kernel path it runs, that
GPU's spec row (dense and 2:4-sparse peaks kept apart), the first-use self-check's verdicts, the
CUDA-graph capture policy for a model preset or a checkpoint (``--model-path``: whether SGLang
fuses its shared expert, and the per-rank MoE shape fp4ext then serves), and for each token bucket
the policy captures, the kernel path it runs and the table it comes from (shipped, tuned here, or
the heuristic) on this GPU or the one ``--gpu`` names.

The model and layout are checked before anything slow is imported, so a mistake is one line.
Works without SGLang and without a GPU (it says so).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import sys
import warnings
from typing import Any

from sglang_fp4ext import __version__, compat, envs, target_info
from sglang_fp4ext.cli.usage import DEFAULT_PRESET, PRESET_HELP, UsageError
from sglang_fp4ext.model_shapes import PRESETS

__all__ = ["add_parser", "collect_info", "config_table_rows", "run", "settings_rows"]

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
        "settings": dict(settings_rows()),
        "selfcheck": _selfcheck_info(),
    }


def _selfcheck_info() -> dict[str, Any]:
    """The verdicts of the first-use self-check cached on disk (``moe/selfcheck.py``)."""
    from sglang_fp4ext.moe import selfcheck

    return {"file": str(selfcheck.disk_path()), "verdicts": selfcheck.verdicts()}


def settings_rows() -> list[tuple[str, str]]:
    """``(variable, what it is here)`` for every ``SGLANG_FP4EXT_*`` setting, bad ones flagged."""
    rows = []
    for var in envs.ALL:
        try:
            value = var.value()
        except ValueError as exc:
            rows.append((var.name, "BAD: " + str(exc).removeprefix(var.name + " ")))
            continue
        if var.is_set():
            rows.append((var.name, value))
        else:
            rows.append((var.name, "unset" if var.default is None else f"{var.default} (default)"))
    return rows


def _table_target(gpu: str | None):
    """The ``Target`` whose tables to show: ``--gpu``'s (facts from the hardware table; the name
    as a table spells it where one does), else this machine's GPU, else None."""
    from sglang_fp4ext import hardware
    from sglang_fp4ext.moe import tables
    from sglang_fp4ext.moe.shape import Target, current_target

    if gpu is None:
        target = current_target()
        return target if target.device_name else None
    spec = hardware.spec_for_device_name(gpu)
    if spec is None:
        known = ", ".join(n for s in hardware.all_specs() for n in s.match_names)
        raise UsageError(f"--gpu {gpu!r}: not a GPU of the hardware table (known: {known})")
    want = hardware.normalize_device_name(gpu)
    folders = [tables.table_path(gpu).parent]
    with contextlib.suppress(ValueError):  # a bad SGLANG_FP4EXT_CONFIG_DIR is flagged above
        folders.append(tables.user_config_dir())
    for folder in folders:
        for f in sorted(folder.glob("*.json")):
            try:
                name = json.loads(f.read_text()).get("device_name")
            except (OSError, ValueError, AttributeError):  # not a table: skip it
                continue
            if isinstance(name, str) and hardware.normalize_device_name(name) == want:
                gpu = name
    return Target(f"sm_{spec.capability[0]}{spec.capability[1]}", gpu, spec.sms)


def config_table_rows(shape, buckets, target) -> list[dict[str, Any]]:
    """Per token bucket of ``shape`` on ``target``: the kernel path and family it runs and the
    table it comes from (``moe.tables.table_source``: shipped, tuned here, heuristic)."""
    from sglang_fp4ext.moe import tables

    rows = []
    for b in buckets:
        entry = tables.select(b, shape, target, quiet=True)
        source, file = tables.table_source(b, shape, target)
        kernels = getattr(entry.config, "kernels", "") or entry.path
        rows.append({"bucket": b, "path": entry.path, "kernels": kernels, "table": source,
                     "file": None if file is None else str(file)})  # fmt: skip
    return rows


def _shipped_gpus(shape) -> list[str]:
    """The GPUs whose shipped table holds ``shape``."""
    from sglang_fp4ext.moe import tables

    gpus = []
    for f in sorted(tables.table_path("x").parent.glob("*.json")):
        try:
            name, entries = tables.read_table_file(f)
        except ValueError:  # a broken shipped file is the tests' to catch, not info's
            continue
        if shape.key() in entries:
            gpus.append(name)
    return gpus


def _print_config_tables(shape, target, rows, error=None) -> None:
    if target is None or error:
        print(f"[config tables: MoE shape {shape.key()}]")
        if error:
            print(f"  unreadable: {error}")
            return
        shipped = ", ".join(_shipped_gpus(shape)) or "none"
        print(f"  shipped tables: {shipped}; other GPUs run the heuristic until tuned")
        print("  no CUDA GPU here: pass --gpu NAME (e.g. 'NVIDIA H200') for that GPU's tables")
        return
    print(f"[config tables: {target.device_name}, MoE shape {shape.key()}, captured buckets]")
    for r in rows:
        print(f"  T={r['bucket']:<6} {r['path'] + ' (' + r['kernels'] + ')':<20} {r['table']}")
    for file in sorted({r["file"] for r in rows if r["file"]}):
        print(f"  file: {file}")
    if any(r["table"] == "heuristic" for r in rows):
        from sglang_fp4ext.moe.untabled import tune_command

        print(f"  heuristic buckets: tune them on this GPU with `{tune_command(shape)}`, or "
              "set SGLANG_FP4EXT_TUNE_AT_START=on")  # fmt: skip


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
    section("settings")
    rows += list(info["settings"].items())
    sc = info["selfcheck"]
    section("kernel self-check")
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


def _policy_args(args: argparse.Namespace) -> tuple[Any, int, int]:
    """(model, TP, EP) for the capture policy: a preset sets all three (and whether the shared
    expert is fused), ``--model-path`` a checkpoint or its ``config.json`` (TP8 EP1 unless
    given; SGLang's fusion rule reads its quantization); ``--tp`` / ``--ep`` override."""
    from pathlib import Path

    if args.model is None or args.model in PRESETS:
        model = args.model or args.preset
        shape = PRESETS[model]
        tp, ep = shape.tp * shape.ep, shape.ep
    elif Path(args.model).is_dir() or Path(args.model).is_file():
        model, tp, ep = Path(args.model), 8, 1
    else:
        raise UsageError(
            f"unknown model {args.model!r}: give --preset ({', '.join(PRESETS)}) or a "
            "config.json path or its directory"
        )
    return model, args.tp if args.tp is not None else tp, args.ep if args.ep is not None else ep


def run(args: argparse.Namespace) -> int:
    from sglang_fp4ext import capture_policy

    model, tp, ep = _policy_args(args)
    target = _table_target(args.gpu)
    mrr = args.max_running_requests
    try:  # a given budget skips SGLang's bucket list: the layout is checked before any import
        capture_policy.policy_for(model, tp, ep, mrr, prefill_budget_mb=1.0)
    except (ValueError, KeyError) as exc:
        raise UsageError(exc.args[0] if exc.args else str(exc)) from exc
    with warnings.catch_warnings():
        # CPU machines with only libcuda1 (so sgl_kernel imports): torch warns the driver is
        # "too old", which here only means "no GPU" and is reported as such below.
        warnings.filterwarnings("ignore", message="CUDA initialization")
        policy = capture_policy.policy_for(model, tp, ep, mrr)
        text = capture_policy.describe_policy(model, tp, ep, mrr)
        info = collect_info()
    shape = policy.inputs.per_rank_shape()
    try:
        rows = [] if target is None else config_table_rows(shape, policy.token_buckets(), target)
        error = None
    except ValueError as exc:  # a bad config directory setting or a broken table file
        rows, error = [], str(exc)
    if args.json:
        info["capture_policy"] = policy.to_dict()
        info["config_tables"] = {
            "gpu": None if target is None else target.device_name,
            "shape": shape.key(),
            "buckets": rows,
            "error": error,
        }
        json.dump(info, sys.stdout, indent=2, default=str)
        print()
    else:
        _print_info(info)
        print(f"[capture policy: {args.model or args.preset}, TP{tp} EP{ep}]")
        for line in text.splitlines():
            print(f"  {line}")
        _print_config_tables(shape, target, rows, error)
    bad = envs.problems()
    if bad:  # the plugin refuses to start with these (plugin.register)
        print(f"fp4ext info: SGLang will not start: {'; '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``info`` to ``fp4ext``'s sub-parsers."""
    p = sub.add_parser(
        "info",
        help="versions, settings, plugin discovery, GPU and kernel path",
        description=__doc__.split("\n\n")[0],
        epilog=PRESET_HELP,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        choices=list(PRESETS),
        help=f"model and layout for the capture-policy table (default {DEFAULT_PRESET})",
    )
    p.add_argument(
        "--model-path",
        "--model",
        dest="model",
        default=None,
        help="instead of a preset: a checkpoint directory (its config.json and, for ModelOpt, "
        "hf_quant_config.json) or a config.json",
    )
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: preset's)")
    p.add_argument("--ep", type=int, default=None, help="expert-parallel size (default: preset's)")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument(
        "--gpu",
        default=None,
        help="show the config tables of this GPU, named as torch reports it (default: this one)",
    )
    p.set_defaults(func=run)
    return p
