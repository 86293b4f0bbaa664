"""``fp4ext check``: serve a model through SGLang with ``--moe-runner-backend fp4ext`` and check
its greedy tokens. With no arguments it builds a tiny NVFP4 MoE model (ModelOpt export) and
judges every served token against ``transformers`` in float32 on the dequantised weights; with
``--model-path`` (a local checkpoint directory) and SGLang launch flags it compares fp4ext with
SGLang's default NVFP4 MoE backend on the same prompts (or the one ``--moe-runner-backend`` in the
flags names: on a CPU, where SGLang's own need a GPU, only fp4ext runs): that server scores
fp4ext's tokens teacher-forced, and one further than ``--tolerance`` below its best fails the
check (exit 1), as does an MoE layer fp4ext did not serve. ``--against no-speculation`` checks
speculative decoding instead: flags that turn it on (``--speculative-algorithm NEXTN``, fp4ext
the draft's MoE backend too) against the same flags without it.

The arguments are checked before anything heavy is imported. Known third-party noise is kept
off the terminal (``quiet``): torch's FutureWarnings and ModelOpt's untested-transformers
warning are filtered, and what the quantizer prints goes to ``quantize.log`` in the work dir.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
import time
import warnings
from pathlib import Path

from sglang_fp4ext import target_info
from sglang_fp4ext.cli.usage import PRESET_HELP, UsageError
from sglang_fp4ext.model_shapes import PRESETS

__all__ = ["add_parser", "checkpoint_config", "quiet", "run"]

#: Third-party warnings that say nothing about the check: (category, message regex).
KNOWN_WARNINGS = (
    (FutureWarning, r".*"),  # torch / transformers deprecations, not ours to act on
    (UserWarning, r"transformers .* is not tested with current version of modelopt"),
    (DeprecationWarning, r"nvidia-modelopt will drop"),
    (UserWarning, r"CUDA initialization"),  # a CPU machine with libcuda: "no GPU" is reported
)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@contextlib.contextmanager
def quiet(log_path: Path):
    """Filter ``KNOWN_WARNINGS`` and send what third-party code prints to ``log_path``."""
    with warnings.catch_warnings(), open(log_path, "a") as log:
        for category, message in KNOWN_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield
        finally:
            # A logging handler made inside (torch makes one at import) would keep the closed
            # log as its stream: give it the terminal back.
            loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
            for logger in loggers:
                for h in getattr(logger, "handlers", ()):
                    if isinstance(h, logging.StreamHandler) and h.stream is log:
                        h.setStream(sys.stderr)


def checkpoint_config(model_path: str) -> dict:
    """The checkpoint's ``config.json``; a :class:`UsageError` saying what to pass otherwise."""
    path = Path(model_path).expanduser()
    if model_path in PRESETS:
        raise UsageError(
            f"--model-path {model_path}: a preset names a shape, not a checkpoint; pass the "
            "directory of a downloaded NVFP4 checkpoint"
        )
    if not path.exists() and _HUB_ID.match(model_path):
        raise UsageError(
            f"--model-path {model_path} looks like a Hugging Face repo id: download it first "
            f"(hf download {model_path} --local-dir DIR) and pass --model-path DIR"
        )
    if not path.is_dir():
        raise UsageError(f"--model-path {model_path} is not a directory")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise UsageError(f"--model-path {model_path} has no config.json: not a checkpoint")
    try:
        return json.loads(cfg.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{cfg} is not valid JSON: {exc}") from exc


class _CheckProgress:
    """``fp4ext check``'s output: one line per phase with the time since the start, and while
    a server starts a "waiting for ..." line every 15 s (``server.start_all``)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, kind: str, text: str) -> None:
        indent = "    " if kind in ("wait", "retry") else ""
        print(f"  [{time.monotonic() - self.t0:6.1f} s] {indent}{text}", flush=True)


def run(args: argparse.Namespace) -> int:
    cfg = checkpoint_config(args.model_path) if args.model_path else None
    from sglang_fp4ext.testing import server

    launch = list(args.sglang_args)
    if launch[:1] == ["--"]:
        launch = launch[1:]
    if args.against == "no-speculation":
        if not args.model_path:
            raise UsageError("--against no-speculation checks a checkpoint: pass --model-path DIR")
        if server.flag_value(launch, "--speculative-algorithm") is None:
            raise UsageError(
                "--against no-speculation compares a speculative server with the same flags "
                "without speculation: pass e.g. -- --speculative-algorithm NEXTN"
            )
    progress = _CheckProgress()
    try:
        if args.model_path:
            return _check_model(args, cfg, launch, progress)
        return _check_tiny(args, launch, progress)
    except server.ServerStartError as exc:
        print(f"  [{time.monotonic() - progress.t0:6.1f} s] FAILED: {exc}", flush=True)
        print("verdict: FAIL (a server did not come up)")
        return 1


def _check_model(args: argparse.Namespace, cfg: dict, launch: list[str], progress) -> int:
    from sglang_fp4ext.testing import e2e, server

    tolerance = e2e.GAP_TOLERANCE if args.tolerance is None else args.tolerance
    prompts = e2e.prompts_for(cfg["vocab_size"], args.prompts, seed=args.seed)
    named = server.flag_value(launch, "--moe-runner-backend")
    no_spec = args.against == "no-speculation"
    against = f"the {named} MoE backend" if named else "SGLang's default NVFP4 MoE backend"
    if no_spec:
        against = "the same server without speculation"
    checked = "fp4ext with speculation" if no_spec else "fp4ext"
    print(
        f"fp4ext check: {args.model_path}, {args.prompts} prompts x {args.tokens} tokens, "
        f"{checked} vs {against}"
    )
    if not no_spec and e2e.reference_is_checked_server(launch):
        print(
            "  reference: the fp4ext server itself (the flags name fp4ext and no fault is "
            "injected: a second server would run the same command)"
        )
    r = e2e.check_against_default_backend(
        args.model_path,
        launch,
        prompts=prompts,
        max_new_tokens=args.tokens,
        tolerance=tolerance,
        against_no_speculation=no_spec,
        progress=progress,
    )
    for i, d in enumerate(r["first_divergence"]):
        worst = max(r["gaps"][i], default=0.0)
        print(
            f"  prompt {i}: "
            + ("identical" if d is None else f"diverges at token {d}")
            + f"; largest gap of an fp4ext token below the default backend's best {worst:.2f}"
        )
    for layer, runs in r["moe_layers_served"].items():
        how = ", ".join(f"{path} path, {n} local experts" for path, n in runs)
        print(f"  fp4ext served MoE layer {layer}: {how}")
    print(f"verdict: {r['line']} ({time.monotonic() - progress.t0:.0f} s)")
    return 0 if r["ok"] else 1


def _check_tiny(args: argparse.Namespace, launch: list[str], progress) -> int:
    import tempfile

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="fp4ext-check-"))
    work.mkdir(parents=True, exist_ok=True)
    with quiet(work / "quantize.log"):
        from sglang_fp4ext.testing import cpu_workarounds, e2e
        from sglang_fp4ext.testing.checkpoint import make_tiny_checkpoint

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
    with quiet(work / "quantize.log"):
        ckpt = make_tiny_checkpoint(
            work / "model", arch=args.arch, seed=args.seed, quantize_shared_experts=False, **dims
        )
    with warnings.catch_warnings():
        for category, message in KNOWN_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
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
    gap_ok = r["max_gap"] <= e2e.GAP_TOLERANCE
    note = "" if r["exact_prompts"] == args.prompts else " (others pass only as near-ties: gap)"
    print(
        f"  prompts identical to the oracle's greedy tokens: {r['exact_prompts']}/{args.prompts}"
        + note
    )
    print(
        f"  largest logit gap of a served token below the oracle's best: {r['max_gap']:.4f} "
        f"({'<=' if gap_ok else '>'} tolerance {e2e.GAP_TOLERANCE}: near-ties flip under bf16)"
    )
    print(
        f"  SGLang log says fp4ext served the MoE layers: "
        f"{'yes' if r['fp4ext_layers_logged'] else 'NO'} ({r['server_log']}; its last lines are "
        "the check stopping the server, not a crash)"
    )
    print(f"verdict: {'PASS' if r['ok'] else 'FAIL'}")
    return 0 if r["ok"] else 1


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``check`` to ``fp4ext``'s sub-parsers."""
    p = sub.add_parser(
        "check",
        help="serve a model with fp4ext through SGLang and check its tokens",
        description=__doc__.split("\n\n")[0],
        epilog=PRESET_HELP + " (they name shapes for info, bench and tune; check serves a "
        "checkpoint: --model-path DIR, or the tiny model)",
    )
    p.add_argument(
        "--model-path", help="a local NVFP4 checkpoint directory; default: a bundled tiny model"
    )
    p.add_argument(
        "--arch",
        default="glm4_moe",
        choices=["glm4_moe", "deepseek_v3"],
        help="architecture of the tiny model (default glm4_moe: GLM-4.5 family)",
    )
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", help="where the tiny model and logs go (default: a temp dir)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="with --model-path: how far (in logits) an fp4ext token may sit below the default "
        "backend's best, scored teacher-forced (default 0.5: near-ties flip under bf16)",
    )
    p.add_argument(
        "--against",
        choices=["default-backend", "no-speculation"],
        default="default-backend",
        help="with --model-path: the reference server. default-backend (default): the same "
        "flags with SGLang's default MoE backend; no-speculation: fp4ext on the same flags "
        "without their --speculative-* ones, which must turn speculation on (e.g. -- "
        "--speculative-algorithm NEXTN): the draft and the verify batches against plain decode",
    )
    p.add_argument(
        "sglang_args",
        nargs=argparse.REMAINDER,
        help="extra SGLang launch flags after --, e.g. -- --tp 8",
    )
    p.set_defaults(func=run)
    return p
