"""Shapes this GPU has no tuned config table for: the one log line that says so, and the
``fp4ext tune`` command that tunes one.

A token bucket with no table entry runs its kernel path's heuristic config (``tables.select``).
That is correct, but the heuristic is tuned on the H100 and H200 only, so a user should know, as
vLLM's and SGLang's fused-MoE "using default config" warnings say. :func:`note_heuristic` logs
one WARNING per (GPU, shape) the first time a call falls back to the heuristics, naming the
command that tunes that shape (:func:`tune_command`) and the opt-in that tunes it when a server
starts (``SGLANG_FP4EXT_TUNE_AT_START``, ``start_tune.py``); later calls cost a set lookup.

:func:`rank_model_shape` is the layout the tuner times for a per-rank shape: a preset when one
has that shape, else the shape itself with SGLang's fused shared expert (``MoEShape.fused_shared``)
and expert parallelism restored, so the routing it times is the one served.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sglang_fp4ext import envs
from sglang_fp4ext.model_shapes import PRESETS, ModelShape
from sglang_fp4ext.moe.shape import MoEShape, Target, token_bucket

__all__ = ["clear_notes", "note_heuristic", "rank_model_shape", "tune_command"]

logger = logging.getLogger("sglang_fp4ext")

_NOTED: set[tuple[str, str]] = set()


def _rank_shape(ms: ModelShape) -> MoEShape:
    return MoEShape(ms.E_local, ms.hidden, ms.I_local, ms.top_k_local, ms.ep)


def _preset_of(shape: MoEShape) -> ModelShape | None:
    return next((p for p in PRESETS.values() if _rank_shape(p) == shape), None)


def rank_model_shape(shape: MoEShape) -> ModelShape:
    """The ``ModelShape`` whose rank-0 layer is ``shape`` (a preset when one is)."""
    preset = _preset_of(shape)
    if preset is not None:
        return preset
    name = f"E{shape.E}-H{shape.H}-I{shape.I}-k{shape.top_k}"
    if shape.fused_shared:  # the last local expert is the shared one every token picks
        return ModelShape(name, shape.E - 1, shape.top_k - 1, shape.H, shape.I, 1, n_shared=1,
                          fuse_shared=True)  # fmt: skip
    if shape.ep > 1:
        name += f"-ep{shape.ep}"
    return ModelShape(name, shape.E * shape.ep, shape.top_k, shape.H, shape.I, 1, ep=shape.ep)


def tune_command(shape: MoEShape) -> str:
    """The ``fp4ext tune`` command line that tunes ``shape`` on this GPU."""
    preset = _preset_of(shape)
    if preset is not None:
        return f"fp4ext tune --preset {preset.name}"
    cmd = f"fp4ext tune --E {shape.E} --H {shape.H} --I {shape.I} --top-k {shape.top_k}"
    return cmd + (f" --ep {shape.ep}" if shape.ep > 1 else "")


def _start_tuning_on() -> bool:
    try:
        return envs.TUNE_AT_START.value() != "off"
    except ValueError:  # reported at register() and by fp4ext info
        return False


def note_heuristic(T: int, shape: MoEShape, target: Target, table_file: Path | None) -> None:
    """Log, once per (GPU, shape), that ``T`` tokens of ``shape`` run the heuristic config
    because the GPU's tables have no entry (``table_file``: the table holding the shape's other
    buckets, or None when no table has the shape) and how to tune it."""
    seen = (target.device_name or target.arch, shape.key())
    if seen in _NOTED:
        return
    _NOTED.add(seen)
    gpu = target.device_name or target.arch
    cmd = tune_command(shape)
    if table_file is None:
        msg = (f"no tuned config table for MoE shape {shape.key()} on {gpu}: its token buckets "
               f"run the heuristic kernel configs (untuned). Tune them on this GPU (once, "
               f"minutes): {cmd}")  # fmt: skip
        if not _start_tuning_on():
            msg += ", or start the server with SGLANG_FP4EXT_TUNE_AT_START=on"
    else:
        msg = (f"the config table {table_file} has no entry for bucket {token_bucket(T)} of MoE "
               f"shape {shape.key()}: it runs the heuristic kernel config (untuned). Tune the "
               f"shape on this GPU: {cmd}")  # fmt: skip
    logger.warning("fp4ext: %s", msg)


def clear_notes() -> None:
    """Forget which shapes were reported (tests)."""
    _NOTED.clear()
