"""``fp4ext patches [list|check]``: the manifest of fp4ext's hooks on SGLang
(``patches/README.md``), listed by default; ``check`` verifies that every hook target still
exists with the expected signature and every upstream diff still applies (exit 1 on any
failure)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def run(args: argparse.Namespace) -> int:
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


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``patches`` to ``fp4ext``'s sub-parsers."""
    p = sub.add_parser(
        "patches",
        help="the hooks on SGLang and their upstream diffs: list (default), or check them",
        description=__doc__,
    )
    p.add_argument("action", nargs="?", default="list", choices=["list", "check"])
    p.add_argument("--sglang-dir", help="an sglang package directory (default: installed)")
    p.add_argument("--patches-dir", help="where the diffs are (default: the source tree's)")
    p.set_defaults(func=run)
    return p
