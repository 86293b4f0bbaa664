"""``fp4ext tune``: measure the decode/prefill kernel configs per token bucket on this GPU and write
the config table the dispatcher reads (format and lookup order: ``moe/tables.py``).

For each model shape (a ``model_shapes.PRESETS`` name such as ``glm5-tp8`` / ``glm5-ep8``, or an
explicit E/H/I/top-k) and each token bucket (default 1, 2, 4, ..., 8192):

1. random NVFP4 layer copies and inputs rotated beyond the L2 (``timed_layer.TimedLayer``),
   uniform routing as rank 0 of the layout sees it (EP: other ranks' ids are -1);
2. every candidate of :func:`search_space` timed as CUDA-graph replay
   (``graph_timing.time_graph_replay``): each kernel path's candidates (``paths.KernelPath``)
   while the bucket is in that path's range (``ranges``, else its ``tune_buckets``: decode up to
   ``tune_space.DECODE_MAX_BUCKET``, prefill from ``tune_space.PREFILL_MIN_BUCKET``); the first
   candidate of each path
   (its heuristic) always runs, and so does the **incumbent**, the entry the tables already give
   this bucket on this GPU (shipped or user table, when its path is in range): a re-tune never
   writes a config slower than the one it replaces (the tables hold configs from hand sweeps that
   the search space may not reach), and keeps it unless a candidate is :data:`KEEP_MARGIN` (1%)
   faster; the others run in a fixed priority order while a candidate's median time (compile
   included) still fits in the bucket's share of ``--budget-s``;
3. the fastest candidate is checked against the fp32 torch twin (``fused_moe_nvfp4_torch``,
   output NaN-poisoned first): ``rms_rel <= 5e-3`` and ``max_rel <= 1e-2`` (normalised by
   ``max|ref|``), the bounds the GPU tests hold both paths to (three bf16 roundings, fp32
   accumulation; a wrong expert, slot or scale is O(1)). A failing winner is dropped and the next
   fastest is checked (up to :data:`MAX_CHECKS`); a bucket with no passing candidate is left out
   of the table and makes the exit status 1;
4. each bucket's log records the heuristic's time over the fastest timed candidate per path
   (``heuristic_over_best``), and each shape's worst bucket (``heuristic_worst``, also printed):
   what a shape without a tuned table loses;
5. the table is written after every bucket (partial results survive a time limit), merged into an
   existing table at the same place (other shapes and buckets kept), plus an optional log JSON.

The candidates per path, in priority order, are in ``moe/tune_space.py``; the command line
(flags, exit status) in ``tune_cli.py``.

The **switch point** of a shape (in the log and the table's ``meta``) is the smallest bucket of
the written table from which the prefill path wins every larger bucket (``null`` if it never
does); the table's buckets of that shape from an earlier run count too, so a decode-only run
keeps the switch point its prefill buckets give.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sglang_fp4ext.moe import paths
from sglang_fp4ext.moe.shape import MoEShape, Target, token_bucket
from sglang_fp4ext.moe.tables import (
    TableEntry,
    load_entries,
    user_table_path,
)
from sglang_fp4ext.moe.tune_space import MAX_CANDIDATES, QUICK_CANDIDATES
from sglang_fp4ext.tune_record import bar_postfix, heuristic_over_best, write_json, write_table

__all__ = ["DEFAULT_BUCKETS", "search_space", "tune"]

logger = logging.getLogger("sglang_fp4ext")

DEFAULT_BUCKETS = tuple(1 << i for i in range(14))  # 1 .. 8192
MAX_CHECKS = 3
#: A candidate replaces the bucket's table entry (the incumbent) only when faster by this share:
#: same-config timings in one run differ by ~0.5-1%, and a table should not churn on noise.
KEEP_MARGIN = 0.01
#: Bounds of the winner's check against the fp32 twin (see the module docstring).
MAX_REL, RMS_REL = 1e-2, 5e-3


# ---- measurement ----


def _gpu_timer(replays: int, warmup_ms: float):
    from sglang_fp4ext.graph_timing import time_graph_replay

    def timer(step, n):
        return time_graph_replay(step, n, replays=replays, warmup_ms=warmup_ms).us_per_call

    return timer


def search_space(
    T: int,
    shape: MoEShape,
    target: Target,
    *,
    limit: int = MAX_CANDIDATES,
    ranges: dict[str, tuple[int, int]] | None = None,
) -> dict[str, list]:
    """``{path: [configs]}`` for bucket ``token_bucket(T)``, every registered path in order
    (heuristic first); a path outside its bucket range (``ranges[path]``, else its
    ``tune_buckets``) gets none. At least one path always has some."""
    b = token_bucket(T)
    ranges = ranges or {}
    out = {}
    for name in paths.names():
        path = paths.get(name)
        lo, hi = ranges.get(name, path.tune_buckets)
        out[name] = path.candidates(b, shape, target, limit) if lo <= b <= hi else []
    if not any(out.values()):
        spans = ", ".join(f"{n} {ranges.get(n, paths.get(n).tune_buckets)}" for n in out)
        raise ValueError(f"bucket {b} is in no kernel path's tuning range ({spans})")
    return out


def _check(layer, T: int, path: str, cfg) -> dict:
    from sglang_fp4ext.compare import error_stats
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch

    xs, routes, outs = layer.inputs(T)
    outs[0].fill_(float("nan"))
    paths.get(path).run(
        xs[0], layer.prepared[0], routes[0][0], routes[0][1], out=outs[0], config=cfg
    )
    ref = fused_moe_nvfp4_torch(xs[0], layer.packs[0], routes[0][0], routes[0][1])
    st = error_stats(outs[0], ref)
    ok = st.nonfinite == 0 and st.rms_rel <= RMS_REL and st.max_rel <= MAX_REL
    return {"max_rel": st.max_rel, "rms_rel": st.rms_rel, "nonfinite": st.nonfinite, "ok": ok}


def _incumbent(device_name: str, key: str, bucket: int) -> TableEntry | None:
    """The entry the tables (shipped, then user) give ``bucket`` of shape ``key`` on this GPU."""
    try:
        return load_entries(device_name).get(key, {}).get(bucket)
    except Exception as exc:  # noqa: BLE001 - a broken user table is reported when written
        logger.warning("fp4ext tune: no incumbent for %s bucket %d: %s", key, bucket, exc)
        return None


def _tune_bucket(layer, T, space, deadline, timer, log, progress=None, incumbent=None, spent=None):
    """Time ``space``'s candidates for ``T`` until ``deadline``; check the fastest.
    ``progress``: a :class:`~sglang_fp4ext.progress.Progress` whose postfix follows the timing.
    ``incumbent``: the tables' entry for this bucket, timed right after the heuristics, always.
    ``spent``: seconds each earlier candidate took (compile included; appended to): one is
    started only when the median of those still fits before ``deadline``, so a budget is not
    overrun by a candidate begun just before its end."""
    spent = [] if spent is None else spent
    xs, routes, outs = layer.inputs(T)
    copies = layer.copies

    def step_for(path, cfg):
        run = paths.get(path).launcher()

        def step(i):
            ids, tw, _ = routes[i]
            return run(xs[i], layer.prepared[i % copies], ids, tw, out=outs[i], config=cfg)

        return step

    # Heuristics first (always), then the paths' candidates alternately while time remains.
    names = list(space)
    order = [(p, space[p][0]) for p in names if space[p]]
    inc = None
    if incumbent is not None and space[incumbent.path]:
        inc = incumbent.config
        if inc != space[incumbent.path][0]:  # else the heuristic's record is the incumbent's
            order.append((incumbent.path, inc))
    rest = [[c for c in space[p][1:] if not (inc is not None and p == incumbent.path and c == inc)]
            for p in names]  # fmt: skip
    for i in range(max(len(x) for x in rest)):
        order += [(p, x[i]) for p, x in zip(names, rest) if i < len(x)]
    timings = []
    for n, (path, cfg) in enumerate(order):
        heuristic = cfg is space[path][0]
        always = heuristic or cfg is inc
        is_inc = inc is not None and path == incumbent.path and cfg == inc
        t0 = time.monotonic()
        if not always and t0 + (statistics.median(spent) if spent else 0.0) > deadline:
            log["skipped_for_budget"] = len(order) - n
            break
        rec = {"path": path, "config": cfg.to_dict(), "heuristic": heuristic}
        if is_inc:
            rec["incumbent"] = True
        try:
            rec["us"] = timer(step_for(path, cfg), len(xs))
        except Exception as exc:  # a config that fails to compile or launch is recorded, skipped
            rec["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        spent.append(time.monotonic() - t0)
        timings.append(rec)
        if progress is not None:
            progress.postfix(bar_postfix(T, n + 1, len(order), timings))
    log["timings"] = timings
    log["heuristic_over_best"] = heuristic_over_best(timings)
    inc_us = [t["us"] for t in timings if t.get("incumbent") and "us" in t]
    if inc_us:
        log["incumbent_us"] = inc_us[0]
    ranked = sorted((t for t in timings if "us" in t), key=lambda t: t["us"])
    inc_rec = next((t for t in ranked if t.get("incumbent")), None)
    if inc_rec is not None and ranked[0]["us"] > (1 - KEEP_MARGIN) * inc_rec["us"]:
        ranked.remove(inc_rec)  # within the margin of the best: the incumbent stays (no churn)
        ranked.insert(0, inc_rec)
    for t in ranked[:MAX_CHECKS]:
        cfg = paths.get(t["path"]).config_type.from_dict(t["config"])
        check = _check(layer, T, t["path"], cfg)
        t["check"] = check
        if check["ok"]:
            best = {p: min((x["us"] for x in ranked if x["path"] == p), default=None)
                    for p in names}  # fmt: skip
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
    ranges: dict[str, tuple[int, int]] | None = None,
    device="cuda",
    timer: Callable | None = None,
    target: Target | None = None,
    stream=None,
    bar_stream=None,
) -> dict:
    """Tune ``shapes`` (``model_shapes.ModelShape``) over ``buckets``; write the table to ``out``
    (a directory: ``<out>/<device>.json``; default the user table directory) after every
    bucket, and the log to ``log_path``. Returns the log (``ok`` false if a bucket failed).

    ``timer(step, n) -> us`` defaults to graph replay (``graph_timing``); CPU tests pass a wall
    clock timer and ``device="cpu"`` (kernels under the interpreter). One progress bar per shape
    (its buckets, the current best) goes to ``bar_stream`` (default stderr) when that is a
    terminal; the per-bucket lines on ``stream`` (default stdout) are the same either way."""
    from sglang_fp4ext import __version__
    from sglang_fp4ext.moe.shape import current_target
    from sglang_fp4ext.progress import Progress
    from sglang_fp4ext.timed_layer import TimedLayer

    stream = stream or sys.stdout
    bad = [b for b in buckets if b < 1 or token_bucket(b) != b]
    if bad or not buckets:
        raise ValueError(f"buckets must be powers of two >= 1, got {list(buckets)}")
    buckets = sorted(set(buckets))
    device = torch.device(device)
    if target is None:
        target = current_target(device)
    device_name = target.device_name or "unknown"
    limit = QUICK_CANDIDATES if quick else MAX_CANDIDATES
    replays = replays or (5 if quick else 10)
    timer = timer or _gpu_timer(replays, 10.0 if quick else 30.0)
    import triton

    log = {
        "schema": "fp4ext-tune/1",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device": device_name,
        "target": dataclasses.asdict(target),
        "versions": {
            "sglang_fp4ext": __version__,
            "torch": torch.__version__,
            "triton": triton.__version__,
        },  # fmt: skip
        "settings": {
            "buckets": buckets,
            "quick": quick,
            "budget_s": budget_s,
            "copies": copies,
            "replays": replays,
            "seed": seed,
            "ranges": {
                n: list((ranges or {}).get(n, paths.get(n).tune_buckets)) for n in paths.names()
            },
            "max_rel": MAX_REL,
            "rms_rel": RMS_REL,
            "timing": "CUDA-graph replay, inputs rotated beyond L2 (timed_layer.TimedLayer)"
            if device.type == "cuda"
            else "wall clock (CPU test run)",
        },  # fmt: skip
        "shapes": {},
        "ok": True,
    }
    table_file = (
        Path(out).expanduser() / (Path(user_table_path(device_name)).name)
        if out
        else (user_table_path(device_name))
    )
    log["table"] = str(table_file)
    t_end = time.monotonic() + budget_s
    spent: list[float] = []  # seconds per timed candidate, compile included
    total = len(shapes) * len(buckets)
    done = 0
    for si, ms in enumerate(shapes):
        layer = TimedLayer(ms, copies, seed=seed + si, device=device)
        mshape = layer.prepared[0].shape(ms.top_k_local)
        slog = {"preset": ms.name, "key": mshape.key(), "buckets": {}}
        log["shapes"][mshape.key()] = slog
        entries: dict[int, TableEntry] = {}
        bar = Progress(len(buckets), f"tune {ms.name}", bar_stream, unit="bucket")
        for b in buckets:
            t0 = time.monotonic()
            left = total - done
            deadline = t0 + max(0.0, (t_end - t0) / left)
            space = search_space(b, mshape, target, limit=limit, ranges=ranges)
            blog = {"candidates": {p: len(c) for p, c in space.items()}}
            slog["buckets"][str(b)] = blog
            incumbent = _incumbent(device_name, mshape.key(), b)
            entry = _tune_bucket(layer, b, space, deadline, timer, blog, bar, incumbent, spent)
            blog["seconds"] = round(time.monotonic() - t0, 2)
            done += 1
            if entry is None:
                log["ok"] = False
                msg = "NO candidate passed the check against the reference"
            else:
                entries[b] = entry
                best = blog["best_us"]
                parts = [f"{p} {best[p]:.1f} us" for p in best if best[p]]
                c = blog["check"]
                hob = blog["heuristic_over_best"].get(entry.path)
                msg = (f"{', '.join(parts)} -> {entry.path}; check rms_rel {c['rms_rel']:.1e} "
                       f"max_rel {c['max_rel']:.1e} ok"
                       + (f"; heuristic {hob:.2f}x the best" if hob else "")
                       + (f"; the table's entry {blog['incumbent_us']:.1f} us"
                          if "incumbent_us" in blog else ""))  # fmt: skip
            n_t = len(blog["timings"])
            bar.write(f"[tune {done}/{total}] {ms.name} T={b}: {msg} ({n_t} timed, "
                      f"{blog['seconds']:.1f} s)", stream)  # fmt: skip
            bar.step(bar_postfix(b, n_t, n_t, blog["timings"]))
            doc = write_table(table_file, device_name, {mshape.key(): entries}, log)
            slog["switch_point"] = doc["meta"]["shapes"].get(mshape.key(), {}).get("switch_point")
            if log_path:
                write_json(Path(log_path), log)
        bar.close()
        del layer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for s in log["shapes"].values():
        worst = {}
        for b, blog in s["buckets"].items():
            for p, r in blog.get("heuristic_over_best", {}).items():
                if r > worst.get(p, (0.0, 0))[0]:
                    worst[p] = (r, int(b))
        s["heuristic_worst"] = {p: {"ratio": r, "bucket": b} for p, (r, b) in worst.items()}
        if worst:
            stream.write(
                f"heuristic vs the best timed, {s['preset']}: "
                + ", ".join(f"{p} at most {r:.2f}x (T={b})" for p, (r, b) in sorted(worst.items()))
                + "\n"
            )
    if log_path:
        write_json(Path(log_path), log)
    stream.write("switch points (first bucket of prefill): "
                 + ", ".join(f"{s['preset']} {s.get('switch_point')}"
                             for s in log["shapes"].values()) + "\n")  # fmt: skip
    stream.write(f"wrote {table_file}" + (f" and {log_path}" if log_path else "") + "\n")
    return log
