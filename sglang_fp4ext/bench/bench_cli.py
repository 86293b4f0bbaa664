"""``fp4ext bench``: measure the fp4ext MoE layer of a model preset on this GPU.

    fp4ext bench                                   # GLM-5 TP8, T = 1..256, 4 layer copies
    fp4ext bench --preset glm5-ep8 --tokens 1,8,64 --project rtx-pro-6000-ws --out results/
    fp4ext bench --block --preset glm5-tp8          # the MoE block with SGLang's shared expert

Prints a table (us, TB/s, % of the copy bandwidth measured in the same run, speed-up over the
torch bf16 grouped-GEMM peer and over SGLang's marlin / flashinfer_cutlass NVFP4 MoE where they
can run here; the notes name each peer that did not run and why) and writes ``<out>/<name>.json``
(schema in ``bench/report.py``) and ``<out>/<name>.png`` (roofline). ``--project GPU`` adds a
per-token MoE time for another GPU
of the hardware table, labelled a PROJECTION, plus that GPU's static resources of the small-T
decode (registers, shared memory, occupancy of every launch, compiled here for its arch) and, from
the fraction of the copy bandwidth measured in this run or in ``--measured FILE`` (e.g.
``benchmarks/results/decode_coop_h100/coop_ab.json``), its projected T = 1..16 decode time next to
b12x's published figures at equal bytes (``bench/decode_projection.py``). Without a CUDA GPU
nothing is timed: it runs a correctness check of the reference path (torch twin vs float64,
Triton kernels under the interpreter) at a tiny shape, says so, and writes the JSON and plot of
that.

``add_bench_parser(subparsers)`` adds the sub-command to ``fp4ext``; ``main(argv)`` runs it alone.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

__all__ = ["add_bench_parser", "main", "run"]


def _tokens(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens must be integers like 1,2,4; got {text!r}")
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"--tokens needs token counts >= 1, got {text!r}")
    return vals


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from sglang_fp4ext.bench.report import DEFAULT_TOKENS
    from sglang_fp4ext.model_shapes import PRESETS

    p.add_argument(
        "--preset",
        default="glm5-tp8",
        choices=sorted(PRESETS),
        help="model and parallel layout, as one GPU sees it (default glm5-tp8)",
    )
    p.add_argument(
        "--tokens",
        type=_tokens,
        default=list(DEFAULT_TOKENS),
        help="comma-separated token counts (default %(default)s)",
    )
    p.add_argument("--copies", type=_positive, default=4, help="layer copies rotated (beyond L2)")
    p.add_argument("--replays", type=_positive, default=20, help="graph replays per measurement")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    p.add_argument("--no-peer", action="store_true", help="skip the peers")
    p.add_argument(
        "--block",
        action="store_true",
        help="time the MoE block as SGLang runs it for checkpoints with a bf16 shared expert "
        "(router, routed experts, shared expert on the alternate stream; GPU only)",
    )
    p.add_argument(
        "--project",
        metavar="GPU",
        default=None,
        help="project per-token MoE time to this hardware-table GPU (key or name), "
        "e.g. rtx-pro-6000-ws",
    )
    p.add_argument(
        "--measured",
        metavar="FILE",
        default=None,
        help="with --project: take the measured decode efficiency from this results file "
        "(a decode A/B JSON such as benchmarks/results/decode_coop_h100/coop_ab.json, or an "
        "fp4ext bench GPU result)",
    )
    p.add_argument("--out", default=".", help="directory for the JSON and PNG (default .)")
    p.add_argument("--name", default=None, help="file stem (default bench_<preset>_<gpu>)")
    p.add_argument(
        "--no-interpreter",
        action="store_true",
        help="without a GPU: skip the Triton-interpreter kernel check (twin check only)",
    )
    p.set_defaults(func=run)
    return p


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``bench`` to an ``argparse`` sub-parser set; ``args.func(args)`` runs it."""
    p = subparsers.add_parser(
        "bench",
        help="measure the fp4ext MoE layer vs roofs and peers (JSON + roofline PNG)",
        description=__doc__.split("\n")[0],
    )
    return _configure(p)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every check passed, 1 when one failed, 2 on bad input."""
    from sglang_fp4ext import target_info
    from sglang_fp4ext.bench import report
    from sglang_fp4ext.bench.table import format_table, format_target
    from sglang_fp4ext.model_shapes import preset
    from sglang_fp4ext.progress import Progress

    shape = preset(args.preset)
    try:
        target = None if args.project is None else report.resolve_spec(args.project)
    except ValueError as exc:
        print(f"fp4ext bench: {exc}", file=sys.stderr)
        return 2
    measured = None
    if args.measured is not None:
        from sglang_fp4ext.bench.decode_projection import MeasuredFileError, load_measured

        if target is None:
            print("fp4ext bench: --measured needs --project GPU", file=sys.stderr)
            return 2
        try:
            measured = load_measured(args.measured)
        except MeasuredFileError as exc:
            print(f"fp4ext bench: --measured: {exc}", file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    if args.block:
        return _run_block(args, shape, seed)
    if target_info.has_cuda_gpu():
        from sglang_fp4ext.bench.gpu_run import run_gpu

        prog = Progress(len(args.tokens), shape.name)
        result = run_gpu(
            shape,
            args.tokens,
            copies=args.copies,
            replays=args.replays,
            seed=seed,
            peer=not args.no_peer,
            project=target,
            progress=prog,
        )
        ok = all(r["check"]["ok"] for r in result["rows"])
    else:
        print(
            "fp4ext bench: no CUDA GPU here, so nothing is timed; running a small correctness "
            "check of the reference path instead.",
            file=sys.stderr,
        )
        interp = not args.no_interpreter
        if interp and "sglang_fp4ext.moe.decode._dot_kernels" not in sys.modules:
            os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated
        interp = interp and target_info.is_interpreter()
        small = [T for T in args.tokens if T <= 8][:2] or [1, 3]
        from sglang_fp4ext.bench.cpu_check import run_cpu_check

        prog = Progress(len(small) * (2 if interp else 1), f"{shape.name} (CPU check)")
        result = run_cpu_check(
            shape, args.tokens, seed=seed, interpreter=interp, project=target, progress=prog
        )
        if not interp:
            result["notes"].append("Triton interpreter kernel check not run")
        ok = all(c["ok"] for c in result["check"])
    if target is not None:
        result["projection"]["target_decode"] = _target_section(
            result, shape, args.tokens, target, measured
        )
    js, png = report.write_outputs(result, Path(args.out), args.name or report.default_name(result))
    print(format_table(result))
    if target is not None:
        print(format_target(result["projection"]["target_decode"]))
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"wrote {js}" + ("" if png is None else f" and {png}"))
    return 0 if ok else 1


def _target_section(result: dict, shape, tokens, target, measured) -> dict:
    """``target``'s static resources of the small-T decode, and with a measured efficiency (the
    file's, else this run's GPU rows) the projected decode and the b12x comparison."""
    from sglang_fp4ext.bench import decode_projection as D
    from sglang_fp4ext.bench.target_resources import COOP_CONFIG, RESOURCE_TOKENS, target_resources

    small = [T for T in tokens if T in RESOURCE_TOKENS]
    notes = []
    try:
        resources = target_resources(shape, small, target) if small else None
    except RuntimeError as exc:
        resources, notes = None, [f"static resources not compiled: {exc}"]
    if not small:
        notes.append(f"no T of {list(RESOURCE_TOKENS)} asked for: nothing compiled or projected")
    if measured is None and result["mode"] == "gpu":
        measured = D.measured_from_result(result)
    decode = None
    if measured is not None and small:
        decode = D.project_decode(measured, shape.name, small, target, COOP_CONFIG)
    if measured is None:
        notes.append(
            "no measured efficiency (no GPU here and no --measured FILE): no times were projected"
        )
    return {
        "resources": resources,
        "decode": decode,
        "b12x": D.b12x_comparison(measured, target, COOP_CONFIG),
        "notes": notes,
    }


def _run_block(args, shape, seed) -> int:
    import json

    from sglang_fp4ext import target_info
    from sglang_fp4ext.bench.table import format_block_table
    from sglang_fp4ext.progress import Progress

    if shape.fuse_shared or shape.n_shared == 0:
        print(
            f"fp4ext bench --block: {shape.name} has no separate bf16 shared expert (use a preset "
            "whose shared expert SGLang does not fuse, e.g. glm5-tp8 or glm5-ep8)",
            file=sys.stderr,
        )
        return 2
    if not target_info.has_cuda_gpu():
        print("fp4ext bench --block: times CUDA-graph replay and needs a CUDA GPU", file=sys.stderr)
        return 2
    from sglang_fp4ext.bench.gpu_run import run_block_gpu

    result = run_block_gpu(
        shape,
        args.tokens,
        copies=args.copies,
        replays=args.replays,
        seed=seed,
        peer=not args.no_peer,
        progress=Progress(len(args.tokens), f"{shape.name} block"),
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = result["env"]["gpu"].replace(" ", "_")
    js = out / f"{args.name or f'block_{shape.name}_{gpu}'}.json"
    js.write_text(json.dumps(result, indent=1, default=str))
    print(format_block_table(result))
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"wrote {js}")
    return 0 if all(r["check"]["ok"] for r in result["rows"]) else 1


def main(argv: list[str] | None = None) -> int:
    parser = _configure(argparse.ArgumentParser(prog="fp4ext bench", description=__doc__))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
