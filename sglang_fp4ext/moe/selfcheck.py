"""First-use self-check: a kernel is checked where it runs before it serves.

fp4ext ships kernels for GPUs nobody here has run (sm_80, sm_100, sm_120). The first time a
process is about to launch a (GPU, Triton version, path, config) it has no verdict for, the
dispatcher (``dispatch.fused_moe``) runs that path and config once on small random data
(:data:`CHECK_SHAPE`, fixed seed) and compares it with the torch twin on the same device
(``reference.fused_moe_nvfp4_torch``): a few milliseconds plus the kernels' compile, which the
first real call would pay anyway. SGLang warms every captured size up eagerly before capturing,
so checks run outside graph capture; a call that meets an unchecked entry while capturing serves
it unchecked and says so once.

Verdicts are cached per process and on disk, ``<config dir>/selfcheck.json`` next to the tuned
tables (``SGLANG_FP4EXT_CONFIG_DIR``), so later processes skip the check. On a mismatch one error
names the GPU, Triton version, path, config and error figures, and the entry is not used: a Gluon
decode config (or a wgmma prefill config) falls back to the same tiles on the ``tl.dot`` family,
and when nothing is left the
call runs the torch twin on the kernel layout (correct and slow; logged loudly).

``SGLANG_FP4EXT_SELFCHECK``: ``on`` (default on a GPU), ``off`` (default under the Triton
interpreter, where a check would interpret the kernels once more), ``warn`` (check and log, but
serve whatever was chosen). ``SGLANG_FP4EXT_FAULT_INJECT=<path>:<family>`` (test-only,
``fault_inject.py``) corrupts one output tile of that path and kernel family after its kernels
ran, to show that a broken kernel is caught (``tests/test_selfcheck.py``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import weakref
from pathlib import Path

import torch

from sglang_fp4ext import envs, target_info
from sglang_fp4ext.moe import paths
from sglang_fp4ext.moe.tables import TableEntry

__all__ = [
    "CHECK_SHAPE",
    "check_hidden",
    "RMS_REL",
    "MAX_REL",
    "Verdict",
    "mode",
    "usable_entry",
    "verdicts",
    "disk_path",
    "clear",
    "reference_on_prepared",
]

logger = logging.getLogger("sglang_fp4ext")

#: (E, H, I) of the check: 6 K chunks for GEMM1 (every ring depth, 2 or 3, divides them: a
#: static ring unrolls by it), one for GEMM2. Its tokens are the path's ``check_tokens``, and
#: :func:`check_hidden` widens H for configs that need more K chunks.
CHECK_SHAPE = dict(E=16, H=1536, I=256)
#: A kernel that is right runs at rms_rel ~2.4e-3 (bf16 rounding of the intermediate and the
#: output); a wrong expert, slot, scale or tile gives errors of order 1.
RMS_REL, MAX_REL = 2e-2, 5e-2


@dataclasses.dataclass(frozen=True)
class Verdict:
    ok: bool
    rms_rel: float | None = None
    max_rel: float | None = None
    nonfinite: int = 0
    seconds: float = 0.0
    error: str | None = None


_VERDICTS: dict[str, Verdict] = {}
_WARNED: set[str] = set()


def mode(device: torch.device) -> str:
    """``on`` / ``off`` / ``warn`` for calls on ``device`` (module docstring)."""
    v = envs.SELFCHECK.value()
    if v is not None:
        return v
    return "off" if target_info.is_interpreter() or device.type != "cuda" else "on"


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        cap = target_info.device_capability(device)
        return f"{target_info.device_name(device)} sm_{cap[0]}{cap[1]}"
    return "cpu (Triton interpreter)" if target_info.is_interpreter() else str(device)


def _key(device: torch.device, entry: TableEntry, top_k: int) -> str:
    import triton

    return (
        f"{_device_label(device)} | Triton {triton.__version__} | {entry.path} | top_k={top_k} | "
        f"{entry.config!r}"
    )


def disk_path() -> Path:
    return Path(os.path.expanduser(envs.CONFIG_DIR.get())) / "selfcheck.json"


def _read_disk() -> dict:
    try:
        return json.loads(disk_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_disk(key: str, v: Verdict) -> None:
    path = disk_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_disk()
        data[key] = dict(dataclasses.asdict(v), date=time.strftime("%Y-%m-%d %H:%M:%S"))
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError as exc:  # a read-only cache dir only costs later processes a re-check
        logger.debug("fp4ext self-check: could not write %s: %s", path, exc)


def verdicts() -> dict[str, dict]:
    """Every verdict known to this process and on disk (``fp4ext info``)."""
    out = _read_disk()
    out.update({k: dataclasses.asdict(v) for k, v in _VERDICTS.items()})
    return out


def clear(disk: bool = False) -> None:
    """Forget this process's verdicts (tests); ``disk=True`` removes the file too."""
    _VERDICTS.clear()
    _WARNED.clear()
    _DECIDED.clear()
    if disk:
        disk_path().unlink(missing_ok=True)


# ---- the check ----


def check_hidden(entry: TableEntry) -> int:
    """H of ``entry``'s check: :data:`CHECK_SHAPE`'s, widened where the path asks for more K
    (``KernelPath.check_hidden``)."""
    return paths.get(entry.path).check_hidden(entry.config, CHECK_SHAPE["H"])


def _run_check(entry: TableEntry, top_k: int, device: torch.device) -> Verdict:
    from sglang_fp4ext.compare import error_stats
    from sglang_fp4ext.moe.prepared import PreparedMoEWeights
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
    from sglang_fp4ext.moe.synthetic import random_packed_weights

    t0 = time.perf_counter()
    path = paths.get(entry.path)
    E, H, I = max(CHECK_SHAPE["E"], top_k), check_hidden(entry), CHECK_SHAPE["I"]
    T = path.check_tokens
    g = torch.Generator(device=device).manual_seed(20261201)
    try:
        w = random_packed_weights(E, H, I, device=device, generator=g)
        ids = torch.rand(T, E, device=device, generator=g).topk(top_k, dim=1).indices
        ids = ids.to(torch.int32)
        ids[0, -1] = -1  # a dropped slot, as EP sends
        tw = torch.rand(T, top_k, device=device, generator=g)
        x = torch.randn(T, H, device=device, generator=g).to(torch.bfloat16)
        w4a4 = path.nvfp4_activations(entry.config)
        if w4a4:  # static activation scales, calibrated on this input as ModelOpt does
            from sglang_fp4ext.moe.synthetic import calibrate_input_scales

            w.w13_input_scale, w.w2_input_scale = calibrate_input_scales(w, x)
        pw = PreparedMoEWeights.from_moe_weights(w)
        out = torch.full((T, H), float("nan"), dtype=torch.bfloat16, device=device)
        path.run(x, pw, ids.contiguous(), tw, out=out, config=entry.config)
        if w4a4:  # like with like: the twin with NVFP4 activations
            from sglang_fp4ext.moe.prepared import w4a4_twin_weights

            ref = fused_moe_nvfp4_torch(x, w4a4_twin_weights(w), ids, tw, quantize_activations=True)
        else:
            ref = fused_moe_nvfp4_torch(x, w, ids, tw)
        st = error_stats(out, ref)
    except Exception as exc:  # noqa: BLE001 - a kernel that does not compile or run fails
        return Verdict(
            False, error=f"{type(exc).__name__}: {str(exc)[:300]}", seconds=time.perf_counter() - t0
        )
    ok = st.nonfinite == 0 and st.rms_rel <= RMS_REL and st.max_rel <= MAX_REL
    return Verdict(ok, st.rms_rel, st.max_rel, st.nonfinite, time.perf_counter() - t0)


def _verdict(entry: TableEntry, top_k: int, device: torch.device) -> Verdict | None:
    key = _key(device, entry, top_k)
    v = _VERDICTS.get(key)
    if v is not None:
        return v
    disk = _read_disk().get(key)
    if disk is not None:
        v = Verdict(**{f.name: disk.get(f.name) for f in dataclasses.fields(Verdict)})
        _VERDICTS[key] = v
        return v
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        if key not in _WARNED:
            _WARNED.add(key)
            logger.warning(
                "fp4ext self-check: %s first met during CUDA-graph capture; serving it "
                "unchecked (warm the size up eagerly first)",
                key,
            )
        return None
    v = _run_check(entry, top_k, device)
    _VERDICTS[key] = v
    _write_disk(key, v)
    if v.ok:
        logger.info(
            "fp4ext self-check passed: %s (rms_rel %.1e, %.2f s)", key, v.rms_rel, v.seconds
        )
    else:
        logger.error(
            "fp4ext self-check FAILED: %s: rms_rel %s, max_rel %s, non-finite %d%s. This "
            "kernel is not used on this GPU.",
            key,
            v.rms_rel,
            v.max_rel,
            v.nonfinite,
            f", error {v.error}" if v.error else "",
        )
    return v


def _fallbacks(entry: TableEntry) -> list[TableEntry]:
    """``entry``, then its path's fallbacks for its config, in order."""
    more = paths.get(entry.path).fallbacks(entry.config)
    return [entry] + [TableEntry(entry.path, c) for c in more]


_DECIDED: dict = {}  # (entry, top_k, device, mode) -> the entry to run: the per-call fast path


def usable_entry(entry: TableEntry, top_k: int, device: torch.device) -> TableEntry | None:
    """``entry``, or its verified fallback, or None (run the torch twin) for this device."""
    m = mode(device)
    if m == "off":
        return entry
    memo = (entry, top_k, str(device), m)
    if memo in _DECIDED:
        return _DECIDED[memo]
    for e in _fallbacks(entry):
        v = _verdict(e, top_k, device)
        if v is None:  # met during capture: serve unchecked, decide again next time
            return e
        if v.ok or m == "warn":
            _DECIDED[memo] = e if v.ok else entry
            return _DECIDED[memo]
    _DECIDED[memo] = None
    key = _key(device, entry, top_k)
    if key not in _WARNED:
        _WARNED.add(key)
        logger.error("fp4ext: no verified kernel for %s: serving the torch reference (slow)", key)
    return None


_REF_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reference_on_prepared(x, pw, ids, tw, out=None) -> torch.Tensor:
    """The torch twin on ``PreparedMoEWeights`` (its checkpoint layout rebuilt once, exactly)."""
    from sglang_fp4ext.moe.layout import unprepare_matrix, unprepare_w13
    from sglang_fp4ext.moe.reference import fused_moe_nvfp4_torch
    from sglang_fp4ext.moe.weights import MoEWeights

    w = _REF_WEIGHTS.get(pw)
    if w is None:
        w13, s13, a13 = unprepare_w13(pw.w13)
        w2, s2, a2 = unprepare_matrix(pw.w2)
        w = MoEWeights(w13, s13, a13, w2, s2, a2[:, 0].contiguous())
        _REF_WEIGHTS[pw] = w
    y = fused_moe_nvfp4_torch(x, w, ids, tw)
    if out is None:
        return y.to(torch.bfloat16)
    return out.copy_(y)
