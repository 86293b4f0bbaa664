"""Tuning at a server's first start (``SGLANG_FP4EXT_TUNE_AT_START``, off by default).

Before CUDA-graph capture, a served MoE shape that no table covers on this GPU gets the token
buckets the server will capture tuned by the tuner (``tune.py``: candidates timed as graph replay,
each bucket's winner checked against the fp32 torch twin). The result goes to the start table
(``tables.start_table_path``: the config directory, keyed by GPU name, Triton version and fp4ext
version, so an upgrade tunes again), which ``tables`` reads from then on, in this process and in
every later start. A shape in a shipped table or in a user's ``fp4ext tune`` table is never tuned
here.

* **One tuner per machine.** Every process (the ranks of a server, or servers sharing the config
  directory) takes an exclusive ``flock`` on ``<table>.lock`` before it looks at the table: the
  first tunes while the others wait, then they find its buckets and tune nothing. The OS drops
  the lock of a process that dies.
* **Reused.** The table's ``meta["tuned_at_start"]`` records per shape the buckets a start tried
  (one whose every candidate failed the check included), so a later start tunes only buckets it
  never tried: none when the capture sizes are the same.
* **Never while serving.** :func:`tune_before_capture` refuses to run inside a CUDA-graph capture;
  the server calls it when a layer's weights are ready (``capture_tune.py``), before warm-up and
  capture, once per shape and process.
* **Within a budget** shared by this process's shapes: ``tune`` splits what is left over the
  buckets and stops timing a bucket's candidates when its share is spent; each bucket's heuristic
  always runs, so a start can overrun by that.
* **Never stops the server.** A failure is logged; the shape then runs the heuristic configs.

Progress goes to the ``sglang_fp4ext`` logger, a line per bucket. Only the timer needs a GPU
(``tune``'s CUDA-graph replay); tests pass a wall-clock timer and run the rest on the CPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from sglang_fp4ext import envs
from sglang_fp4ext.moe.shape import MoEShape, Target, current_target
from sglang_fp4ext.moe.tables import (
    clear_table_cache,
    read_table_file,
    shape_table,
    start_table_path,
    table_document,
)
from sglang_fp4ext.moe.untabled import rank_model_shape
from sglang_fp4ext.tune_record import write_json

__all__ = ["tune_before_capture", "tried_buckets", "reset"]

logger = logging.getLogger("sglang_fp4ext")

_DONE: set[tuple[str, str]] = set()  # (GPU, shape key) this process has looked at
_SPENT_S = 0.0  # seconds this process has tuned


class _LogLines:
    """A text stream whose complete lines go to the logger (``tune``'s output, no bar)."""

    def __init__(self, prefix: str):
        self.prefix, self.buf = prefix, ""

    def write(self, text: str) -> int:
        self.buf += text
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            if line.strip():
                logger.info("%s%s", self.prefix, line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def _exclusive(lock_path: Path, what: str):
    """Hold an exclusive ``flock`` on ``lock_path``, saying so when another process has it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info(
                "fp4ext: another process is tuning %s; waiting for it (%s)", what, lock_path
            )
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tried_buckets(path: Path, key: str) -> set[int]:
    """The buckets of shape ``key`` that a start already tried into the table at ``path``."""
    if not path.exists():
        return set()
    _, entries = read_table_file(path)
    meta = json.loads(path.read_text()).get("meta", {})
    tried = meta.get("tuned_at_start", {}).get(key, {}).get("buckets", [])
    return set(entries.get(key, {})) | set(tried)


def _record(path: Path, device_name: str, key: str, buckets, record: dict) -> None:
    """Add ``buckets`` to the tried ones of ``key`` in the table's meta (made if still absent)."""
    entries, meta = {}, {}
    if path.exists():
        _, entries = read_table_file(path)
        meta = json.loads(path.read_text()).get("meta", {})
    meta["tuned_by"] = "first start (SGLANG_FP4EXT_TUNE_AT_START)"
    starts = meta.setdefault("tuned_at_start", {})
    tried = set(starts.get(key, {}).get("buckets", [])) | set(buckets)
    starts[key] = {"buckets": sorted(tried), **record}
    write_json(path, table_document(device_name, entries, meta))
    clear_table_cache()


def tune_before_capture(
    shape: MoEShape,
    buckets: Sequence[int],
    *,
    device="cuda",
    target: Target | None = None,
    budget_s: float | None = None,
    timer: Callable | None = None,
    copies: int = 4,
) -> dict | None:
    """Tune ``buckets`` of ``shape`` into the start table unless a table covers the shape or a
    start already tried them (module docstring). ``budget_s``: default from
    ``SGLANG_FP4EXT_TUNE_AT_START`` (None there: off, nothing happens). ``timer``: ``tune``'s
    (graph replay on the GPU). Returns what happened (``{"tuned": [...], "file": ...}``), or None
    when nothing needed a look."""
    global _SPENT_S
    budget_s = envs.tune_budget_s() if budget_s is None else budget_s
    if budget_s is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "fp4ext: tuning at start runs before CUDA-graph capture, never inside it"
        )
    target = target or current_target(device)
    if not target.device_name:  # no GPU name to key a table on
        return None
    key = shape.key()
    if (target.device_name, key) in _DONE:
        return None
    _DONE.add((target.device_name, key))
    path = start_table_path(target.device_name)
    covering = shape_table(target.device_name, key)
    if covering is not None and covering != path:
        return None  # shipped, or the user's own fp4ext tune table
    what = f"MoE shape {key} on {target.device_name}"
    with _exclusive(path.with_name(path.name + ".lock"), what):
        clear_table_cache()  # another process may have written it while this one waited
        todo = sorted(set(buckets) - tried_buckets(path, key))
        if not todo:
            logger.info("fp4ext: %s: reusing the table tuned at an earlier start (%s)", what, path)
            return {"tuned": [], "file": str(path)}
        left = budget_s - _SPENT_S
        if left <= 0:
            logger.warning("fp4ext: %s not tuned: this start's %g s tuning budget is spent; it "
                           "runs the heuristic configs", what, budget_s)  # fmt: skip
            return {"tuned": [], "file": None}
        logger.info("fp4ext: tuning %s before CUDA-graph capture: buckets %s, budget %.0f s, "
                    "into %s", what, ",".join(map(str, todo)), left, path)  # fmt: skip
        from sglang_fp4ext.tune import tune

        t0 = time.monotonic()
        lines = _LogLines("fp4ext start tuning: ")
        try:
            log = tune([rank_model_shape(shape)], todo, out=path.parent, budget_s=left,
                       copies=copies, device=device, timer=timer, target=target, stream=lines,
                       bar_stream=lines)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a failed tune must not stop the server
            logger.error("fp4ext: tuning %s failed (%s: %s); it runs the heuristic configs",
                         what, type(exc).__name__, exc)  # fmt: skip
            return {"tuned": [], "file": None, "error": str(exc)}
        finally:
            _SPENT_S += time.monotonic() - t0
        seconds = round(time.monotonic() - t0, 1)
        record = {"seconds": seconds, "budget_s": left, "ok": log["ok"], "date": log["date"]}
        _record(path, target.device_name, key, todo, record)
        logger.info("fp4ext: tuned %s in %.0f s%s; later starts read %s", what, seconds,
                    "" if log["ok"] else " (a bucket had no passing candidate: heuristic)",
                    path)  # fmt: skip
        return {"tuned": todo, "file": str(path), "ok": log["ok"], "seconds": seconds}


def reset() -> None:
    """Forget what this process looked at and spent (tests)."""
    global _SPENT_S
    _DONE.clear()
    _SPENT_S = 0.0
