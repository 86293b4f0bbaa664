"""Shared pieces of the decode and prefill kernel tests (CPU tier).

``small_weights(E, H, I, seed)``: one fixed random NVFP4 weight set per (shape, seed), cached per
process (quantising is the slow part under the interpreter; inputs stay fresh per test).
``compile_per_arch(script, requests, timeout)``: Triton AOT compiles run in subprocesses without
``TRITON_INTERPRET`` (kernels decorated under the interpreter cannot be compiled), two
architectures at a time (CI has 2 cores); each child reads its JSON request list on stdin and
prints a JSON list on its last stdout line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from sglang_fp4ext.moe.prepared import PreparedMoEWeights
from sglang_fp4ext.moe.weights import random_moe_weights

ROOT = Path(__file__).resolve().parents[1]
DEV = "cuda" if torch.cuda.is_available() else "cpu"

_WEIGHTS: dict = {}


def small_weights(E: int, H: int, I: int, seed: int):
    """``(MoEWeights, PreparedMoEWeights)`` on ``DEV`` for this shape and seed, cached."""
    key = (E, H, I, seed)
    if key not in _WEIGHTS:
        g = torch.Generator().manual_seed(seed + E * 7 + H + I)
        w = random_moe_weights(E, H, I, generator=g)
        _WEIGHTS[key] = (w.to(DEV), PreparedMoEWeights.from_moe_weights(w).to(DEV))
    return _WEIGHTS[key]


def triton36_site() -> str | None:
    """A Triton 3.6 site dir (the H200's version) for AOT compiles: ``$FP4EXT_TRITON36`` or
    ``.ci/triton36`` (``.ci/run`` installs it); None when neither exists."""
    for p in (os.environ.get("FP4EXT_TRITON36"), str(ROOT / ".ci" / "triton36")):
        if p and (Path(p) / "triton" / "__init__.py").exists():
            return p
    return None


def compile_per_arch(
    script: str, requests: dict[int, list], timeout: float, extra_path: str | None = None
) -> dict[int, list]:
    """``{cc: results}``: ``script`` run as ``python -c script <cc>`` with ``requests[cc]``;
    ``extra_path`` goes first on ``PYTHONPATH`` (e.g. another Triton version's site dir)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (extra_path, str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    ccs = sorted(requests)
    results = {}
    for pair in (ccs[i : i + 2] for i in range(0, len(ccs), 2)):
        procs = {
            cc: subprocess.Popen(
                [sys.executable, "-c", script, str(cc)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for cc in pair
        }
        for cc, p in procs.items():
            out, err = p.communicate(json.dumps(requests[cc]), timeout=timeout)
            assert p.returncode == 0, f"sm_{cc} compile failed:\n{err[-4000:]}"
            results[cc] = json.loads(out.strip().splitlines()[-1])
    return results
