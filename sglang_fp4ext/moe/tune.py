"""``fp4ext tune``: measure the decode/prefill kernel configs per token bucket on this GPU and write
the config table the dispatcher reads (format and lookup order: ``moe/config.py``).

For each model shape (a ``roofline.PRESETS`` name such as ``glm5-tp8`` / ``glm5-ep8``, or an
explicit E/H/I/top-k) and each token bucket (default 1, 2, 4, ..., 8192):

1. random NVFP4 layer copies and inputs rotated beyond the L2 (``bench.layer.Layer``), uniform
   routing as rank 0 of the layout sees it (EP: other ranks' ids are -1);
2. every candidate of :func:`search_space` timed as CUDA-graph replay
   (``bench.timing.time_graph_replay``): the decode path's candidates while the bucket is
   ``<= decode_max`` (default :data:`DECODE_MAX_BUCKET`), the prefill path's from ``prefill_min``
   (default :data:`PREFILL_MIN_BUCKET`); the first candidate of each path (its heuristic) always
   runs, the others in a fixed priority order until the bucket's share of ``--budget-s`` is spent;
3. the fastest candidate is checked against the fp32 torch twin (``fused_moe_nvfp4_torch``,
   output NaN-poisoned first): ``rms_rel <= 5e-3`` and ``max_rel <= 1e-2`` (normalised by
   ``max|ref|``), the bounds the GPU tests hold both paths to (three bf16 roundings, fp32
   accumulation; a wrong expert, slot or scale is O(1)). A failing winner is dropped and the next
   fastest is checked (up to :data:`MAX_CHECKS`); a bucket with no passing candidate is left out
   of the table and makes the exit status 1;
4. the table is written after every bucket (partial results survive a time limit), merged into an
   existing table at the same place (other shapes and buckets kept), plus an optional log JSON.

**Search space** (deterministic: a function of bucket, shape and target; every candidate passes
its config's ``__post_init__``; at most :data:`MAX_CANDIDATES` per path, ``--quick`` keeps the
first :data:`QUICK_CANDIDATES`), in priority order:

* decode (:func:`decode_candidates`), around ``decode_config.heuristic_config``: the heuristic; the
  other kernel family (Gluon <-> ``tl.dot``); the other GEMM2 form (``tokens`` <-> ``pairs``);
  GEMM1 with 128 rows on 4 warps (64 if it had 128); GEMM1 split-K x2 and /2; 32-row GEMM1 tiles
  with split-K x2; GEMM2 32/64-row tiles (tokens) or ``tiles2`` x2 and /2 and split-K x2 (pairs);
  GEMM1 4 stages; the other ``block_t`` (8 <-> 16); GEMM1 split-K x4; GEMM2 4 stages (the first
  :data:`MAX_CANDIDATES`). Split-K and ``tiles2`` are runtime arguments (no recompilation).
* prefill (:func:`prefill_candidates`), around ``prefill_config.prefill_heuristic_config``: the
  heuristic; ``block_m`` x2 (<= 256; at 256 with 128-deep GEMM1 steps) and /2 (>= 16); GEMM1
  with 64 rows / 4 warps / 256-deep steps, with 128 rows / 8 warps / 256-deep steps, and the
  former at ``block_m`` /2; 4 and 16 GEMM2 row blocks per program, and 64-row GEMM2 tiles on 4
  warps with 16; the narrow GEMM1 at ``block_m`` /4 and /8 (under expert parallelism a local
  expert sees ~EP times fewer rows than the per-rank shape suggests); 64-row tiles for both GEMMs.
  The atomic combine is never a candidate (it is not deterministic run to run).

The **switch point** of a shape (in the log and the table's ``meta``) is the smallest bucket of
the written table from which the prefill path wins every larger bucket (``null`` if it never
does); the table's buckets of that shape from an earlier run count too, so a decode-only run
keeps the switch point its prefill buckets give.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sglang_fp4ext.moe.config import (
    TableEntry,
    clear_table_cache,
    read_table_file,
    table_document,
    user_table_path,
)
from sglang_fp4ext.moe.decode_config import heuristic_config
from sglang_fp4ext.moe.layout import K_CHUNK
from sglang_fp4ext.moe.shape import MoEShape, Target, token_bucket
from sglang_fp4ext.progress import best_postfix

__all__ = [
    "DEFAULT_BUCKETS",
    "DECODE_MAX_BUCKET",
    "PREFILL_MIN_BUCKET",
    "MAX_CANDIDATES",
    "QUICK_CANDIDATES",
    "decode_candidates",
    "prefill_candidates",
    "search_space",
    "model_shape",
    "tune",
    "write_table",
    "switch_point",
    "bar_postfix",
]

DEFAULT_BUCKETS = tuple(1 << i for i in range(14))  # 1 .. 8192
#: Decode candidates up to this bucket: beyond it the decode kernels only lose more (H200,
#: ``benchmarks/results/tune_h200.json``: at 2048 prefill is 1.9x faster for GLM-5 TP8, 1.7x EP8).
DECODE_MAX_BUCKET = 2048
#: Prefill candidates from this bucket: below it experts see ~1 pair and a 16-row MMA tile
#: mostly multiplies padding.
PREFILL_MIN_BUCKET = 32
MAX_CANDIDATES = 12
QUICK_CANDIDATES = 4
MAX_CHECKS = 3
#: Bounds of the winner's check against the fp32 twin (see the module docstring).
MAX_REL, RMS_REL = 1e-2, 5e-3


# ---- search space ----


def _unique_valid(make: Sequence[Callable[[], object]], limit: int) -> list:
    """Build each candidate (dropping those a config's ``__post_init__`` rejects), dedupe, cap."""
    out = []
    for f in make:
        try:
            c = f()
        except ValueError:
            continue
        if c not in out:
            out.append(c)
        if len(out) >= limit:
            break
    return out


def decode_candidates(T: int, shape: MoEShape, target: Target, limit: int = MAX_CANDIDATES):
    """Decode-path :class:`KernelConfig` candidates for ``token_bucket(T)`` (module docstring)."""
    b = token_bucket(T)
    base = heuristic_config(b, shape, target)
    kc1, kc2 = -(-shape.H // K_CHUNK), -(-shape.I // K_CHUNK)
    r = dataclasses.replace
    sk1 = base.split_k1

    def split1(s):
        if s > kc1 or s < 1:
            raise ValueError("split_k1 beyond the K chunks")
        return s

    def split2(s):
        if s > kc2:
            raise ValueError("split_k2 beyond the K chunks")
        return s

    if base.gemm2 == "tokens":
        flip = lambda: r(base, gemm2="pairs", block_n2=64, split_k2=1, tiles2=1)  # noqa: E731
        g2a = lambda: r(base, block_n2=64 if base.block_n2 == 32 else 32)  # noqa: E731
        g2b = lambda: r(base, block_n2=g2a().block_n2, split_k1=split1(2 * sk1))  # noqa: E731
        g2c = lambda: r(base, gemm2="pairs", block_n2=64, split_k2=1, tiles2=2)  # noqa: E731
    else:
        flip = lambda: r(base, gemm2="tokens", block_n2=64, split_k2=1, tiles2=1)  # noqa: E731
        g2a = lambda: r(base, tiles2=2 * base.tiles2)  # noqa: E731
        g2b = lambda: r(base, tiles2=max(1, base.tiles2 // 2))  # noqa: E731
        g2c = lambda: r(base, split_k2=split2(2 * base.split_k2))  # noqa: E731
    other = "dot" if base.kernels == "gluon" else "gluon"
    make = [
        lambda: base,
        lambda: r(base, kernels=other),  # both families are timed
        flip,
        lambda: r(base, block_n1=128 if base.block_n1 < 128 else 64, warps1=4),
        lambda: r(base, split_k1=split1(2 * sk1)),
        lambda: r(base, split_k1=split1(sk1 // 2)),
        lambda: r(base, block_n1=32, split_k1=split1(2 * sk1)),
        g2a,
        g2b,
        g2c,
        lambda: r(base, stages1=4),
        lambda: r(base, block_t=16 if base.block_t == 8 else 8),
        lambda: r(base, split_k1=split1(4 * sk1)),
        lambda: r(base, stages2=4),
    ]
    return _unique_valid(make, min(limit, MAX_CANDIDATES))


def prefill_candidates(T: int, shape: MoEShape, target: Target, limit: int = MAX_CANDIDATES):
    """Prefill-path ``PrefillConfig`` candidates for ``token_bucket(T)`` (module docstring)."""
    from sglang_fp4ext.moe.prefill_config import prefill_heuristic_config

    b = token_bucket(T)
    base = prefill_heuristic_config(b, shape, target)
    r = dataclasses.replace
    bm = base.block_m

    def m(v):
        if not 16 <= v <= 256:
            raise ValueError("block_m outside [16, 256]")
        return v

    # GEMM1 variants that won somewhere in the H200 sweep (prefill_heuristic_config's docstring).
    narrow = dict(block_n1=64, block_k1=256, warps1=4, stages1=2)
    wide = dict(block_n1=128, block_k1=256, warps1=8, stages1=2)
    half = dict(block_n1=128, block_k1=128, warps1=8, stages1=2)
    make = [
        lambda: base,
        lambda: r(base, block_m=m(2 * bm), **(half if 2 * bm == 256 else {})),
        lambda: r(base, block_m=m(bm // 2)),
        lambda: r(base, **narrow),
        lambda: r(base, **wide),
        lambda: r(base, block_m=m(bm // 2), **narrow),
        lambda: r(base, group_n2=4),
        lambda: r(base, group_n2=16),
        lambda: r(base, block_n2=64, warps2=4, group_n2=16),
        # Far smaller tiles: under expert parallelism most ids are another rank's, so the rows
        # per local expert are ~EP times fewer than the shape alone suggests.
        lambda: r(base, block_m=m(bm // 4), **narrow),
        lambda: r(base, block_m=m(bm // 8), **narrow),
        lambda: r(base, block_n1=64, block_n2=64),
    ]
    return _unique_valid(make, min(limit, MAX_CANDIDATES))


def search_space(
    T: int,
    shape: MoEShape,
    target: Target,
    *,
    limit: int = MAX_CANDIDATES,
    decode_max: int = DECODE_MAX_BUCKET,
    prefill_min: int = PREFILL_MIN_BUCKET,
) -> dict[str, list]:
    """``{"decode": [...], "prefill": [...]}`` for bucket ``token_bucket(T)``; a path outside its
    bucket range gets no candidates. At least one path always has some."""
    b = token_bucket(T)
    dec = b <= decode_max
    pre = b >= prefill_min
    if not dec and not pre:
        raise ValueError(
            f"bucket {b} is neither <= decode_max={decode_max} nor >= prefill_min={prefill_min}"
        )
    return {
        "decode": decode_candidates(b, shape, target, limit) if dec else [],
        "prefill": prefill_candidates(b, shape, target, limit) if pre else [],
    }


# ---- shapes ----


def model_shape(preset: str | None = None, *, E=None, H=None, I=None, top_k=None):  # noqa: E741
    """A ``roofline.ModelShape``: a preset by name, or one rank holding ``E`` experts of
    hidden ``H`` and intermediate ``I`` with ``top_k`` (all four needed)."""
    from sglang_fp4ext import roofline

    explicit = (E, H, I, top_k)
    if preset is not None:
        if any(v is not None for v in explicit):
            raise ValueError("give a preset or --E/--H/--I/--top-k, not both")
        return roofline.preset(preset)
    if any(v is None for v in explicit):
        raise ValueError("an explicit shape needs all of --E, --H, --I and --top-k")
    return roofline.ModelShape(f"E{E}-H{H}-I{I}-k{top_k}", E, top_k, H, I, 1)


# ---- measurement ----


def _gpu_timer(replays: int, warmup_ms: float):
    from sglang_fp4ext.bench.timing import time_graph_replay

    def timer(step, n):
        return time_graph_replay(step, n, replays=replays, warmup_ms=warmup_ms).us_per_call

    return timer


def _runner(path: str):
    if path == "decode":
        from sglang_fp4ext.moe.decode import fused_moe_nvfp4

        return fused_moe_nvfp4
    from sglang_fp4ext.moe.prefill import fused_moe_nvfp4_prefill

    return fused_moe_nvfp4_prefill


def _check(layer, T: int, path: str, cfg) -> dict:
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
    from sglang_fp4ext.testing.compare import error_stats

    xs, routes, outs = layer.inputs(T)
    outs[0].fill_(float("nan"))
    _runner(path)(xs[0], layer.prepared[0], routes[0][0], routes[0][1], out=outs[0], config=cfg)
    ref = fused_moe_nvfp4_torch(xs[0], layer.packs[0], routes[0][0], routes[0][1])
    st = error_stats(outs[0], ref)
    ok = st.nonfinite == 0 and st.rms_rel <= RMS_REL and st.max_rel <= MAX_REL
    return {"max_rel": st.max_rel, "rms_rel": st.rms_rel, "nonfinite": st.nonfinite, "ok": ok}


def switch_point(winners: dict[int, str]) -> int | None:
    """Smallest bucket from which "prefill" wins every larger bucket of ``winners``."""
    point = None
    for b in sorted(winners, reverse=True):
        if winners[b] != "prefill":
            break
        point = b
    return point


def bar_postfix(T: int, n_timed: int, n_total: int, timings: Sequence[dict]) -> str:
    """The progress bar's postfix while bucket ``T`` is timed: candidates timed so far and the
    fastest time of each path among them (``timings``: the bucket log's records)."""
    best = {p: min((t["us"] for t in timings if t["path"] == p and "us" in t), default=None)
            for p in ("decode", "prefill")}  # fmt: skip
    tail = best_postfix(best)
    return f"T={T} {n_timed}/{n_total}" + (f" {tail}" if tail else "")


def _tune_bucket(layer, T, space, deadline, timer, log, progress=None):
    """Time ``space``'s candidates for ``T`` until ``deadline``; check the fastest.
    ``progress``: a :class:`~sglang_fp4ext.progress.Progress` whose postfix follows the timing."""
    xs, routes, outs = layer.inputs(T)
    copies = layer.copies

    def step_for(path, cfg):
        run = _runner(path)

        def step(i):
            ids, tw, _ = routes[i]
            return run(xs[i], layer.prepared[i % copies], ids, tw, out=outs[i], config=cfg)

        return step

    # Heuristics first (always), then the paths' candidates alternately while time remains.
    order = [(p, space[p][0]) for p in ("decode", "prefill") if space[p]]
    rest = [space["decode"][1:], space["prefill"][1:]]
    for i in range(max(len(x) for x in rest)):
        order += [(p, x[i]) for p, x in zip(("decode", "prefill"), rest) if i < len(x)]
    timings = []
    for n, (path, cfg) in enumerate(order):
        heuristic = cfg is space[path][0]
        if not heuristic and time.monotonic() > deadline:
            log["skipped_for_budget"] = len(order) - n
            break
        rec = {"path": path, "config": cfg.to_dict()}
        try:
            rec["us"] = timer(step_for(path, cfg), len(xs))
        except Exception as exc:  # a config that fails to compile or launch is recorded, skipped
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        timings.append(rec)
        if progress is not None:
            progress.postfix(bar_postfix(T, n + 1, len(order), timings))
    log["timings"] = timings
    ranked = sorted((t for t in timings if "us" in t), key=lambda t: t["us"])
    for t in ranked[:MAX_CHECKS]:
        cls = type(space[t["path"]][0])
        cfg = cls.from_dict(t["config"])
        check = _check(layer, T, t["path"], cfg)
        t["check"] = check
        if check["ok"]:
            best = {p: min((x["us"] for x in ranked if x["path"] == p), default=None)
                    for p in ("decode", "prefill")}  # fmt: skip
            log.update(winner=t["path"], us=t["us"], config=t["config"], check=check,
                       best_us=best)  # fmt: skip
            return TableEntry(t["path"], cfg)
    log["winner"] = None
    return None


def tune(
    shapes: Sequence,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    *,
    out: Path | None = None,
    log_path: Path | None = None,
    budget_s: float = 600.0,
    quick: bool = False,
    copies: int = 4,
    replays: int | None = None,
    seed: int = 2026,
    decode_max: int = DECODE_MAX_BUCKET,
    prefill_min: int = PREFILL_MIN_BUCKET,
    device="cuda",
    timer: Callable | None = None,
    target: Target | None = None,
    stream=None,
    bar_stream=None,
) -> dict:
    """Tune ``shapes`` (``roofline.ModelShape``) over ``buckets``; write the table to ``out``
    (a directory: ``<out>/<device>.json``; default the user table directory) after every
    bucket, and the log to ``log_path``. Returns the log (``ok`` false if a bucket failed).

    ``timer(step, n) -> us`` defaults to graph replay (``bench.timing``); CPU tests pass a wall
    clock timer and ``device="cpu"`` (kernels under the interpreter). One progress bar per shape
    (its buckets, the current best) goes to ``bar_stream`` (default stderr) when that is a
    terminal; the per-bucket lines on ``stream`` (default stdout) are the same either way."""
    from sglang_fp4ext import __version__
    from sglang_fp4ext.bench.layer import Layer
    from sglang_fp4ext.moe.shape import current_target
    from sglang_fp4ext.progress import Progress

    stream = stream or sys.stdout
    bad = [b for b in buckets if b < 1 or token_bucket(b) != b]
    if bad or not buckets:
        raise ValueError(f"buckets must be powers of two >= 1, got {list(buckets)}")
    buckets = sorted(set(buckets))
    device = torch.device(device)
    if target is None:
        target = current_target(device) if device.type == "cuda" else current_target()
    device_name = target.device_name or "unknown"
    limit = QUICK_CANDIDATES if quick else MAX_CANDIDATES
    replays = replays or (5 if quick else 10)
    timer = timer or _gpu_timer(replays, 10.0 if quick else 30.0)
    import triton

    log = {
        "schema": "fp4ext-tune/1",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name,
        "target": dataclasses.asdict(target),
        "versions": {"sglang_fp4ext": __version__, "torch": torch.__version__,
                     "triton": triton.__version__},  # fmt: skip
        "settings": {"buckets": buckets, "quick": quick, "budget_s": budget_s, "copies": copies,
                     "replays": replays, "seed": seed, "decode_max": decode_max,
                     "prefill_min": prefill_min, "max_rel": MAX_REL, "rms_rel": RMS_REL,
                     "timing": "CUDA-graph replay, inputs rotated beyond L2 (bench.layer.Layer)"
                     if device.type == "cuda" else "wall clock (CPU test run)"},  # fmt: skip
        "shapes": {},
        "ok": True,
    }
    table_file = Path(out).expanduser() / (Path(user_table_path(device_name)).name) if out else (
        user_table_path(device_name)
    )
    log["table"] = str(table_file)
    t_end = time.monotonic() + budget_s
    total = len(shapes) * len(buckets)
    done = 0
    for si, ms in enumerate(shapes):
        layer = Layer(ms, copies, seed=seed + si, device=device)
        mshape = layer.prepared[0].shape(ms.top_k_local)
        slog = {"preset": ms.name, "key": mshape.key(), "buckets": {}}
        log["shapes"][mshape.key()] = slog
        entries: dict[int, TableEntry] = {}
        bar = Progress(len(buckets), f"tune {ms.name}", bar_stream, unit="bucket")
        for b in buckets:
            t0 = time.monotonic()
            left = total - done
            deadline = t0 + max(0.0, (t_end - t0) / left)
            space = search_space(b, mshape, target, limit=limit, decode_max=decode_max,
                                 prefill_min=prefill_min)  # fmt: skip
            blog = {"candidates": {p: len(c) for p, c in space.items()}}
            slog["buckets"][str(b)] = blog
            entry = _tune_bucket(layer, b, space, deadline, timer, blog, bar)
            blog["seconds"] = round(time.monotonic() - t0, 2)
            done += 1
            if entry is None:
                log["ok"] = False
                msg = "NO candidate passed the check against the reference"
            else:
                entries[b] = entry
                best = blog["best_us"]
                parts = [f"{p} {best[p]:.1f} us" for p in ("decode", "prefill") if best[p]]
                c = blog["check"]
                msg = (f"{', '.join(parts)} -> {entry.path}; check rms_rel {c['rms_rel']:.1e} "
                       f"max_rel {c['max_rel']:.1e} ok")  # fmt: skip
            n_t = len(blog["timings"])
            bar.write(f"[tune {done}/{total}] {ms.name} T={b}: {msg} ({n_t} timed, "
                      f"{blog['seconds']:.1f} s)", stream)  # fmt: skip
            bar.step(bar_postfix(b, n_t, n_t, blog["timings"]))
            doc = write_table(table_file, device_name, {mshape.key(): entries}, log)
            slog["switch_point"] = doc["meta"]["shapes"][mshape.key()]["switch_point"]
            if log_path:
                _write_json(Path(log_path), log)
        bar.close()
        del layer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    stream.write("switch points (first bucket of prefill): "
                 + ", ".join(f"{s['preset']} {s.get('switch_point')}"
                             for s in log["shapes"].values()) + "\n")  # fmt: skip
    stream.write(f"wrote {table_file}" + (f" and {log_path}" if log_path else "") + "\n")
    return log


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def write_table(path: Path, device_name: str, entries: dict, log: dict | None = None) -> dict:
    """Merge ``{shape key: {bucket: TableEntry}}`` into the table at ``path`` (other shapes and
    buckets kept; an existing file that does not parse is an error, never overwritten)."""
    path = Path(path)
    merged: dict = {}
    meta: dict = {}
    if path.exists():
        dev, merged = read_table_file(path)
        if dev != device_name:
            raise ValueError(f"{path} is the table of {dev!r}, not of {device_name!r}")
        meta = json.loads(path.read_text()).get("meta", {})
    for key, buckets in entries.items():
        merged[key] = {**merged.get(key, {}), **buckets}
    meta.setdefault("shapes", {})
    if log is not None:
        meta["tuned_by"] = "fp4ext tune"
        meta["versions"] = log["versions"]
        meta["date"] = log["date"]
        for key, slog in log["shapes"].items():
            if key in entries:  # of the merged table: a decode-only run keeps prefill's buckets
                paths = {int(b): e.path for b, e in merged[key].items()}
                meta["shapes"][key] = {"preset": slog["preset"],
                                       "switch_point": switch_point(paths)}  # fmt: skip
    doc = table_document(device_name, merged, meta)
    _write_json(path, doc)
    clear_table_cache()
    return doc


# ---- command line ----


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
    from sglang_fp4ext.roofline import PRESETS

    p = subparsers.add_parser(
        "tune",
        help="tune the decode/prefill kernel configs per token bucket on this GPU (JSON table)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--preset", default=None,
                   help=f"comma-separated presets, e.g. glm5-tp8,glm5-ep8 (known: "
                        f"{', '.join(sorted(PRESETS))}); default glm5-tp8")  # fmt: skip
    for flag, what in (("--E", "local experts"), ("--H", "hidden size"),
                       ("--I", "per-rank intermediate size"), ("--top-k", "experts per token")):
        p.add_argument(flag, type=int, default=None, help=f"explicit shape: {what}")
    p.add_argument("--buckets", type=_buckets, default=list(DEFAULT_BUCKETS),
                   help="token buckets, powers of two (default 1,2,...,8192)")
    p.add_argument("--out", default=None,
                   help="directory for <device>.json (default: $SGLANG_FP4EXT_CONFIG_DIR or "
                        "~/.cache/sglang_fp4ext/configs, read before the shipped tables)")
    p.add_argument("--log", default=None, help="also write the full tuning log JSON here")
    p.add_argument("--budget-s", type=float, default=600.0,
                   help="time budget in seconds over all shapes and buckets (default 600); each "
                        "bucket's heuristic configs always run")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_CANDIDATES} candidates per path and bucket, 5 replays")
    p.add_argument("--copies", type=int, default=4, help="layer copies rotated (beyond L2)")
    p.add_argument("--replays", type=int, default=None, help="graph replays per candidate")
    p.add_argument("--decode-max", type=int, default=DECODE_MAX_BUCKET,
                   help="largest bucket with decode candidates (default %(default)s)")
    p.add_argument("--prefill-min", type=int, default=PREFILL_MIN_BUCKET,
                   help="smallest bucket with prefill candidates (default %(default)s)")
    p.add_argument("--seed", type=int, default=2026)
    p.set_defaults(func=run_cli)
    return p


def run_cli(args) -> int:
    """0: every bucket tuned and checked; 1: a bucket had no passing candidate; 2: no GPU or
    bad arguments."""
    from sglang_fp4ext import target_info

    try:
        explicit = dict(E=args.E, H=args.H, I=args.I, top_k=args.top_k)
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
        decode_max=args.decode_max, prefill_min=args.prefill_min,
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
