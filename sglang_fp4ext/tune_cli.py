"""``fp4ext tune``: measure the decode/prefill kernel configs per token bucket on this GPU and write
the config table the dispatcher reads (format and lookup order: ``moe/tables.py``).

    fp4ext tune                                    # GLM-5 TP8, buckets 1..8192, 600 s budget
    fp4ext tune --preset glm5-tp8,glm5-ep8 --quick --out configs/ --log tune.json

Exit status: 0 every bucket tuned and checked; 1 a bucket had no passing candidate; 2 no GPU
(nothing is written) or bad arguments. The flow is ``tune.py``, the candidates
``moe/tune_space.py``.

``add_tune_parser(subparsers)`` adds the sub-command to ``fp4ext``; ``main(argv)`` runs it alone.
"""

from __future__ import annotations

import sys

from sglang_fp4ext.moe.shape import token_bucket
from sglang_fp4ext.moe.tune_space import DECODE_MAX_BUCKET, PREFILL_MIN_BUCKET, QUICK_CANDIDATES
from sglang_fp4ext.tune import DEFAULT_BUCKETS, tune

__all__ = ["add_tune_parser", "main", "model_shape", "run_cli"]


def model_shape(
    preset: str | None = None,
    *,
    E=None,
    H=None,
    I=None,  # noqa: E741
    top_k=None,
    ep=None,
):
    """A ``model_shapes.ModelShape``: a preset by name, or the layout whose rank holds ``E``
    experts of hidden ``H`` and intermediate ``I`` with ``top_k`` ids per token (all four
    needed) out of ``ep`` expert-parallel ranks (``untabled.rank_model_shape``: a preset of that
    shape, or SGLang's fused shared expert where it fuses one), as a server's log names it."""
    from sglang_fp4ext import model_shapes
    from sglang_fp4ext.moe.shape import MoEShape
    from sglang_fp4ext.moe.untabled import rank_model_shape

    explicit = (E, H, I, top_k)
    if preset is not None:
        if any(v is not None for v in (*explicit, ep)):
            raise ValueError("give a preset or --E/--H/--I/--top-k/--ep, not both")
        return model_shapes.preset(preset)
    if any(v is None for v in explicit):
        raise ValueError("an explicit shape needs all of --E, --H, --I and --top-k")
    if any(v < 1 for v in (*explicit, ep or 1)):
        raise ValueError("--E, --H, --I, --top-k and --ep must be >= 1")
    return rank_model_shape(MoEShape(E, H, I, top_k, ep or 1))


def _buckets(text: str) -> list[int]:
    import argparse

    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--buckets must be integers like 1,2,4; got {text!r}")
    if not vals or any(v < 1 or token_bucket(v) != v for v in vals):
        raise argparse.ArgumentTypeError(f"--buckets needs powers of two >= 1, got {text!r}")
    return vals


def add_tune_parser(subparsers):
    """Add ``tune`` to ``fp4ext``'s sub-parsers."""
    from sglang_fp4ext.model_shapes import PRESETS

    p = subparsers.add_parser(
        "tune",
        help="tune the decode/prefill kernel configs per token bucket on this GPU (JSON table)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--preset", default=None,
                   help=f"comma-separated presets, e.g. glm5-tp8,glm5-ep8 (known: "
                        f"{', '.join(sorted(PRESETS))}); default glm5-tp8")  # fmt: skip
    for flag, what in (
        ("--E", "local experts"),
        ("--H", "hidden size"),
        ("--I", "per-rank intermediate size"),
        ("--top-k", "expert ids per token (with a fused shared expert)"),
        ("--ep", "expert-parallel ranks the experts are split over (default 1)"),
    ):
        p.add_argument(flag, type=int, default=None, help=f"explicit shape: {what}")
    p.add_argument(
        "--buckets",
        type=_buckets,
        default=list(DEFAULT_BUCKETS),
        help="token buckets, powers of two (default 1,2,...,8192)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory for <device>.json (default: $SGLANG_FP4EXT_CONFIG_DIR or "
        "~/.cache/sglang_fp4ext/configs, read before the shipped tables)",
    )
    p.add_argument("--log", default=None, help="also write the full tuning log JSON here")
    p.add_argument("--budget-s", type=float, default=600.0,
                   help="time budget in seconds over all shapes and buckets (default 600); each "
                        "bucket's heuristic configs always run")  # fmt: skip
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_CANDIDATES} candidates per path and bucket, 5 replays",
    )
    p.add_argument("--copies", type=int, default=4, help="layer copies rotated (beyond L2)")
    p.add_argument("--replays", type=int, default=None, help="graph replays per candidate")
    p.add_argument(
        "--decode-max",
        type=int,
        default=DECODE_MAX_BUCKET,
        help="largest bucket with decode candidates (default %(default)s)",
    )
    p.add_argument(
        "--prefill-min",
        type=int,
        default=PREFILL_MIN_BUCKET,
        help="smallest bucket with prefill candidates (default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=2026)
    p.set_defaults(func=run_cli)
    return p


def run_cli(args) -> int:
    """0: every bucket tuned and checked; 1: a bucket had no passing candidate; 2: no GPU or
    bad arguments."""
    from sglang_fp4ext import target_info

    try:
        explicit = dict(E=args.E, H=args.H, I=args.I, top_k=args.top_k, ep=args.ep)
        if args.preset is not None:
            shapes = [model_shape(n.strip(), **explicit) for n in args.preset.split(",")]
        elif any(v is not None for v in explicit.values()):
            shapes = [model_shape(**explicit)]
        else:
            shapes = [model_shape("glm5-tp8")]
        if args.decode_max < args.prefill_min / 2 or args.copies < 1 or args.budget_s <= 0:
            raise ValueError("need --copies >= 1, --budget-s > 0 and no bucket gap between "
                             "--decode-max and --prefill-min")  # fmt: skip
    except (KeyError, ValueError) as exc:
        print(f"fp4ext tune: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    if not target_info.has_cuda_gpu():
        print("fp4ext tune: no CUDA GPU here; tuning times the kernels on the GPU the table is "
              "for. Run it on that machine (nothing was written).", file=sys.stderr)  # fmt: skip
        return 2
    if not target_info.supports_triton_w4a16(target_info.device_capability()):
        print("fp4ext tune: this GPU does not run the fp4ext Triton kernels (needs SM80+)",
              file=sys.stderr)  # fmt: skip
        return 2
    log = tune(
        shapes, args.buckets, out=args.out, log_path=args.log, budget_s=args.budget_s,
        quick=args.quick, copies=args.copies, replays=args.replays, seed=args.seed,
        ranges={"decode": (1, args.decode_max), "prefill": (args.prefill_min, 1 << 30)},
    )  # fmt: skip
    return 0 if log["ok"] else 1


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fp4ext")
    add_tune_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tune", *(argv or [])])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
