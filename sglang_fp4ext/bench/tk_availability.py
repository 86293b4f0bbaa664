"""Whether the ``triton_kernels`` MXFP4 MoE peer (``tk_peer.py``) can run on this machine.

:func:`tk_peer_unavailable` is a pure rule (:func:`tk_unavailable_reason`) over facts probed
without importing ``triton_kernels`` (:func:`probe_environment`): importable, the 3.8 API
(``triton_kernels.matmul``, not v3.6's ``matmul_ogs``), Triton 3.8, a CUDA GPU, sm_90 or sm_100.
The benchmark suite skips the peer with the returned reason.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = [
    "TK_PEER",
    "TK_TRITON",
    "TKEnvironment",
    "probe_environment",
    "tk_peer_unavailable",
    "tk_unavailable_reason",
]

TK_PEER = "triton_kernels-mxfp4"
TK_TRITON = (3, 8)  # the Triton release whose triton_kernels API the peer calls


@dataclass(frozen=True)
class TKEnvironment:
    """What decides whether the peer can run, probed by :func:`probe_environment`.

    ``triton``: ``triton.__version__`` (None: not importable); ``tk_path``: the
    ``triton_kernels`` package folder (None: not importable); ``tk_api``: ``"matmul"`` (the API
    of Triton 3.7+: ``triton_kernels.matmul``), ``"matmul_ogs"`` (3.6 and older) or None;
    ``capability``: the CUDA GPU's (major, minor), None without one.
    """

    triton: str | None
    tk_path: str | None
    tk_api: str | None
    capability: tuple[int, int] | None


def _series(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def tk_unavailable_reason(env: TKEnvironment) -> str | None:
    """Why the peer cannot run in ``env``; None when it can. Checked in order: triton_kernels
    importable, its API, Triton's version, a CUDA GPU, the GPU's architecture."""
    want = "{}.{}".format(*TK_TRITON)
    triton = f"Triton {env.triton}" if env.triton else "no Triton"
    if env.tk_path is None:
        return (
            f"{TK_PEER}: triton_kernels not importable on this machine ({triton}; this peer "
            f"calls the triton_kernels shipped with Triton {want})"
        )
    if env.tk_api != "matmul":
        api = "no triton_kernels.matmul" if env.tk_api is None else f"the {env.tk_api} API"
        return (
            f"{TK_PEER}: triton_kernels at {env.tk_path} has {api}; this peer calls the Triton "
            f"{want} API (triton_kernels.matmul)"
        )
    if env.triton is None or _series(env.triton) != TK_TRITON:
        return (
            f"{TK_PEER}: the installed triton_kernels is written for Triton {want}, this machine "
            f"has {triton}"
        )
    if env.capability is None:
        return f"{TK_PEER}: no CUDA GPU on this machine"
    cap = tuple(env.capability)
    if cap != (9, 0) and cap[0] != 10:
        return (
            f"{TK_PEER}: needs sm_90 (Hopper MXFP4 layouts) or sm_100 (Blackwell), this GPU is "
            f"sm_{cap[0]}{cap[1]}"
        )
    return None


def _find(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def probe_environment() -> TKEnvironment:
    """This machine's :class:`TKEnvironment`; imports neither triton_kernels' kernels nor the
    GPU runtime beyond ``torch.cuda`` (``triton_kernels/__init__.py`` is empty)."""
    from sglang_fp4ext import target_info

    triton = None
    if _find("triton") is not None:
        try:
            import triton as _triton

            triton = _triton.__version__
        except Exception:  # a broken install counts as not importable
            triton = None
    spec = _find("triton_kernels")
    tk_path = None
    if spec is not None and spec.submodule_search_locations:
        tk_path = list(spec.submodule_search_locations)[0]
    api = None
    if tk_path is not None:
        if _find("triton_kernels.matmul") is not None:
            api = "matmul"
        elif _find("triton_kernels.matmul_ogs") is not None:
            api = "matmul_ogs"
    return TKEnvironment(triton, tk_path, api, target_info.device_capability())


def tk_peer_unavailable() -> str | None:
    """None when the triton_kernels peer can run on this machine, else the reason."""
    return tk_unavailable_reason(probe_environment())
