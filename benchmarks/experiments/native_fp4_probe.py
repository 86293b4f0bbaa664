"""Does sm_100 / sm_120's native FP4 conversion compile through Gluon, and what does it cost?

    python benchmarks/experiments/native_fp4_probe.py [--out FILE]

Compiles ``_native_fp4_kernels._native_decode`` (one code word of 8 weights per thread through
``cvt.rn.f16x2.e2m1x2``, regrouped and scaled as the decode kernels' FP4X4_TO_BF16_PTX leaves
them) for sm_100 and sm_120 with the installed Triton (no GPU) and reports the PTX target, the
SASS opcodes between the loads and the stores (the decode of 8 weights) and registers. On sm_90
ptxas rejects the instruction (recorded as the error). Static counts, not times.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from _native_fp4_kernels import _native_decode  # this folder (run as a script)
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource


def probe(cc: int) -> dict:
    src = GluonASTSource(
        _native_decode, {"q_ptr": "*i32", "s_ptr": "*i32", "o_ptr": "*i32"}, {}, {}
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # Triton prints the failing PTX
            k = triton.compile(src, target=GPUTarget("cuda", cc, 32))
    except Exception as e:  # noqa: BLE001 - the answer for sm_90
        why = next((ln for ln in str(e).splitlines() if "not supported" in ln), str(e)[:200])
        return dict(cc=cc, compiled=False, error=f"{type(e).__name__}: {why.strip()}")
    bindir = Path(triton.__file__).parent / "backends/nvidia/bin"
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d, "k.cubin")
        cubin.write_bytes(k.asm["cubin"])
        sass = subprocess.run(
            [bindir / "nvdisasm", "-c", cubin], capture_output=True, text=True, check=True
        ).stdout
    ops = [m.group(1) for m in re.finditer(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)]
    first_st = next(i for i, o in enumerate(ops) if o.startswith("STG"))
    last_ld = max(i for i, o in enumerate(ops[:first_st]) if o.startswith("LDG"))
    body = [o for o in ops[last_ld + 1 : first_st] if not o.startswith(("IMAD.WIDE", "LEA"))]
    return dict(
        cc=cc,
        compiled=True,
        target=re.search(r"\.target (\S+)", k.asm["ptx"]).group(1),
        ptx_cvt=k.asm["ptx"].count("cvt.rn.f16x2.e2m1x2"),
        decode_ops=dict(collections.Counter(o.split(".")[0] for o in body)),
        decode_instructions=len(body),
        sass_f2fp=[o for o in ops if o.startswith("F2FP")],
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the JSON here (else stdout)")
    a = ap.parse_args(argv)
    doc = dict(
        what="native FP4 conversion probe (benchmarks/experiments/native_fp4_probe.py)",
        triton=triton.__version__,
        rows=[probe(cc) for cc in (90, 100, 120)],
    )
    text = json.dumps(doc, indent=1)
    Path(a.out).write_text(text + "\n") if a.out else print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
