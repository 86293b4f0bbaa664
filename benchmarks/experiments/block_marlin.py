"""GLM-5's MoE block as SGLang runs it for NVIDIA's checkpoints (``bench/block.py``: router, routed
NVFP4 experts, bf16 shared expert on the alternate stream) with fp4ext's routed experts and with
SGLang 0.5.23's Marlin NVFP4 MoE, in one process: TP8 and EP8, T = 1..256 (the MTP verify sizes
are among them). Marlin comes from the peer harness (``.peers/marlin``: SGLang's sources and its
JIT kernels, no SGLang install); both sides run on the same packs with gate and up sharing one
global scale (Marlin's format). Writes ``block.json`` to ``--out``.

    bash .peers/marlin/device_run.sh --check                    # on the CPU first
    bash benchmarks/experiments/close_card.sh                   # PARTS=block (device)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

PEERS = Path(os.environ.get("MARLIN_PEER", ".peers/marlin")).resolve()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--presets", default="glm5-tp8,glm5-ep8")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--replays", type=int, default=20)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(PEERS))
    import run_marlin_peer as M  # the harness: SGLang's Marlin, its JIT modules

    from sglang_fp4ext.bench.block import MoEBlock, block_rows
    from sglang_fp4ext.bench.layer import Layer
    from sglang_fp4ext.bench.peers import shared_gate_up_scale
    from sglang_fp4ext.bench.report import environment
    from sglang_fp4ext.bench.timing import copy_bandwidth_Bps
    from sglang_fp4ext.model_shapes import preset
    from sglang_fp4ext.moe.prepared import PreparedMoEWeights

    torch.set_grad_enabled(False)
    t0 = time.time()
    M.build_jit_modules(16, M.PREBUILT)
    res = {"env": environment(), "jit_load_s": round(time.time() - t0, 1), "rows": []}
    res["copy_bw_TBps"] = copy_bandwidth_Bps() / 1e12
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.presets.split(","):
        shape = preset(name)
        layer = Layer(shape, args.copies, seed=2026)
        layer.packs = [shared_gate_up_scale(p) for p in layer.packs]
        layer.prepared = [PreparedMoEWeights.from_moe_weights(p, shape.ep) for p in layer.packs]
        marlin = [M.SGLangMarlin(p, E_global=shape.n_experts, E_local=shape.E_local)
                  for p in layer.packs]  # fmt: skip
        block = MoEBlock(layer)
        for T in [int(t) for t in args.tokens.split(",")]:
            impls = {
                "fp4ext": block.fp4ext(T),
                "marlin": lambda x, c, ids, tw, i, m=marlin: m[c](x, ids, tw),
            }
            checks = {
                "fp4ext": block.check(T, impls["fp4ext"]),
                "marlin": block.check(T, impls["marlin"], rms=2e-2, max_rel=float("inf")),
            }
            row = block_rows(block, T, impls, copy_bw_Bps=res["copy_bw_TBps"] * 1e12,
                             replays=args.replays)  # fmt: skip
            row.update(preset=name, checks=checks)
            res["rows"].append(row)
            f, m = row["impls"]["fp4ext"], row["impls"]["marlin"]
            print(
                f"{name} T={T:4d} block fp4ext {f['block_us']:7.1f} us "
                f"({f['block_pct_copy_bw']:4.1f}%) marlin {m['block_us']:7.1f} us; routed "
                f"{f['routed_us']:6.1f} / {m['routed_us']:6.1f}; shared {row['shared_us']:5.1f}"
                f" router {row['router_us']:5.1f}; ok {checks['fp4ext']['ok']}/"
                f"{checks['marlin']['ok']}",
                flush=True,
            )
            (out / "block.json").write_text(json.dumps(res, indent=1))
        del layer, block, marlin, impls
        torch.cuda.empty_cache()
    res["copy_bw_TBps_after"] = copy_bandwidth_Bps() / 1e12
    (out / "block.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
