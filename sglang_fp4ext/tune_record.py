"""What an ``fp4ext tune`` run records: the table file it writes (merged with the one there, its
``meta`` naming the run), each shape's decode/prefill switch point, what the heuristic gives away
per path, and the progress bar's postfix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sglang_fp4ext.moe import paths
from sglang_fp4ext.moe.tables import clear_table_cache, read_table_file, table_document
from sglang_fp4ext.progress import best_postfix

__all__ = ["bar_postfix", "heuristic_over_best", "switch_point", "write_json", "write_table"]


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
            for p in paths.names()}  # fmt: skip
    tail = best_postfix(best)
    return f"T={T} {n_timed}/{n_total}" + (f" {tail}" if tail else "")


def heuristic_over_best(timings: Sequence[dict]) -> dict[str, float]:
    """Per path: the heuristic config's time (the record marked ``heuristic``) over the fastest
    candidate timed for that path (1.0: the heuristic won; a lower bound when the budget cut the
    candidates short): what a shape without a tuned table gives away by running the heuristic."""
    out = {}
    for p in paths.names():
        us = [t["us"] for t in timings if t["path"] == p and "us" in t]
        hu = [t["us"] for t in timings if t["path"] == p and "us" in t and t.get("heuristic")]
        if us and hu:
            out[p] = round(hu[0] / min(us), 3)
    return out


def write_json(path: Path, doc: dict) -> None:
    """``doc`` to ``path`` atomically (a tuning log or table: never half written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def write_table(path: Path, device_name: str, entries: dict, log: dict | None = None) -> dict:
    """Merge ``{shape key: {bucket: TableEntry}}`` into the table at ``path`` (other shapes and
    buckets kept; a shape with no bucket yet is left out, as a table has no empty shapes; an
    existing file that does not parse is an error, never overwritten)."""
    path = Path(path)
    merged: dict = {}
    meta: dict = {}
    if path.exists():
        dev, merged = read_table_file(path)
        if dev != device_name:
            raise ValueError(f"{path} is the table of {dev!r}, not of {device_name!r}")
        meta = json.loads(path.read_text()).get("meta", {})
    for key, buckets in entries.items():
        if buckets or key in merged:
            merged[key] = {**merged.get(key, {}), **buckets}
    meta.setdefault("shapes", {})
    if log is not None:
        meta["tuned_by"] = "fp4ext tune"
        meta["versions"] = log["versions"]
        meta["date"] = log["date"]
        for key, slog in log["shapes"].items():
            if key in entries and key in merged:
                # Of the merged table: a decode-only run keeps prefill's buckets.
                paths = {int(b): e.path for b, e in merged[key].items()}
                meta["shapes"][key] = {"preset": slog["preset"],
                                       "switch_point": switch_point(paths)}  # fmt: skip
    doc = table_document(device_name, merged, meta)
    write_json(path, doc)
    clear_table_cache()
    return doc
