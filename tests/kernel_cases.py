"""Shared pieces of the decode and prefill kernel tests (CPU tier).

``small_weights(E, H, I, seed)``: one fixed random NVFP4 weight set per (shape, seed), cached per
process (quantising is the slow part under the interpreter; inputs stay fresh per test).
``compile_per_arch(script, requests, timeout)``: Triton AOT compiles run in subprocesses without
``TRITON_INTERPRET`` (kernels decorated under the interpreter cannot be compiled). The script is
run once per architecture: it reads its JSON request list on stdin and prints a JSON list on its
last stdout line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
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


#: Runs an AOT script once per architecture in one process: the imports (torch, Triton, the
#: package: ~5 s of CPU) are paid once, not once per architecture.
_DRIVER = r"""
import contextlib, io, json, sys
script, requests = sys.argv[1], json.loads(open(sys.argv[2]).read())
results = {}
for cc, req in requests.items():
    sys.argv, sys.stdin, out = ["-c", cc], io.StringIO(json.dumps(req)), io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(script, f"<AOT script, sm_{cc}>", "exec"), {"__name__": "__main__"})
    results[cc] = json.loads(out.getvalue().strip().splitlines()[-1])
print(json.dumps(results))
"""


def compile_per_arch(
    script: str, requests: dict[int, list], timeout: float, extra_path: str | None = None
) -> dict[int, list]:
    """``{cc: results}``: ``script`` run for each ``cc`` as ``python -c script <cc>`` with
    ``requests[cc]`` on stdin would run; ``extra_path`` goes first on ``PYTHONPATH`` (e.g.
    another Triton version's site dir). The architectures share processes, one per two cores
    of this machine (pytest's workers take the rest): one process on CI's 2 cores."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (extra_path, str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    ccs = sorted(requests)
    n = max(1, min(len(ccs), (os.cpu_count() or 2) // 2))
    with tempfile.TemporaryDirectory() as d:
        procs = []
        for i in range(n):
            group = ccs[i::n]
            req, err = Path(d, f"requests{i}.json"), Path(d, f"stderr{i}")
            req.write_text(json.dumps({str(cc): requests[cc] for cc in group}))
            with err.open("w") as f:  # a file, not a pipe: a full pipe would stall the child
                p = subprocess.Popen(
                    [sys.executable, "-c", _DRIVER, script, str(req)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=f, text=True, env=env,
                )  # fmt: skip
            procs.append((group, p, err))
        results = {}
        for group, p, err in procs:
            out, _ = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"sm_{group} compile failed:\n{err.read_text()[-4000:]}"
            last = json.loads(out.strip().splitlines()[-1])
            results.update({int(cc): r for cc, r in last.items()})
    return results
