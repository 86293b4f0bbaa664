"""The ``fp4ext`` command: each sub-command's code is its own module, imported only when it runs.

``fp4ext info``   what is installed, every ``SGLANG_FP4EXT_*`` setting, whether SGLang will load
                  the plugin, which GPU this is, its kernel path and spec row (``info.py``).
``fp4ext check``  serve a model through SGLang with ``--moe-runner-backend fp4ext`` and check its
                  greedy tokens (``check.py``).
``fp4ext bench``  time the MoE layer across token counts on this GPU (``bench/bench_cli.py``).
``fp4ext tune``   tune the kernel configs per token bucket on this GPU (``tune_cli.py``).
``fp4ext patches [list|check]``  fp4ext's hooks on SGLang and their upstream diffs
                  (``patches.py``).

``fp4ext --help`` and ``--version`` import no torch, Triton or SGLang. A user mistake (a bad
flag value, a missing checkpoint) ends in one line on stderr and exit status 2; ``--debug`` or
``SGLANG_FP4EXT_DEBUG=1`` shows the stack instead. Works without SGLang and without a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sglang_fp4ext import __version__, envs
from sglang_fp4ext.cli.usage import UsageError

__all__ = ["main", "build_parser"]

#: name -> (module, function adding its sub-parser, one-line help for ``fp4ext --help``).
COMMANDS = {
    "info": (
        "sglang_fp4ext.cli.info",
        "add_parser",
        "versions, settings, plugin discovery, GPU and kernel path",
    ),
    "check": (
        "sglang_fp4ext.cli.check",
        "add_parser",
        "serve a model with fp4ext through SGLang and check its tokens",
    ),
    "bench": (
        "sglang_fp4ext.bench.bench_cli",
        "add_bench_parser",
        "time the fp4ext MoE layer of a model preset on this GPU (JSON + roofline plot)",
    ),
    "tune": (
        "sglang_fp4ext.tune_cli",
        "add_tune_parser",
        "tune the decode/prefill kernel configs per token bucket on this GPU (JSON table)",
    ),
    "patches": (
        "sglang_fp4ext.cli.patches",
        "add_parser",
        "the hooks on SGLang and their upstream diffs: list (default), or check them",
    ),
}


def _chosen(argv: list[str]) -> str | None:
    """The sub-command named on the command line (the first word that is not a flag)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the sub-command ``argv`` names gets its real arguments (and imports)."""
    parser = argparse.ArgumentParser(
        prog="fp4ext", description="sglang_fp4ext: NVFP4 fused-MoE kernels for SGLang"
    )
    parser.add_argument("--version", action="version", version=f"sglang_fp4ext {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"show the full stack of an error instead of one line (or {envs.DEBUG.name}=1)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = _chosen(argv or [])
    for name, (module, adder, help_) in COMMANDS.items():
        if name == chosen:
            getattr(importlib.import_module(module), adder)(sub)
        else:
            sub.add_parser(name, help=help_)
    return parser


def _debug(args: argparse.Namespace) -> bool:
    try:
        return args.debug or envs.DEBUG.value() == "1"
    except ValueError:  # a bad value is itself shown, in one line, by `fp4ext info`
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        if _debug(args):
            raise
        print(f"fp4ext {args.command}: {exc}", file=sys.stderr)
        return 2
