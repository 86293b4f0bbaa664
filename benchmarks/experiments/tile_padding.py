"""GEMM1's M-tile padding under the benchmarks' routing (no GPU): how many tiles a call runs and
what share of their MMA columns hold a token, for fixed tiles of ``block_m`` rows and for tiles of
``block_m + tail`` rows whose last ``tail`` rows sit on a second accumulator
(``PrefillConfig.tail1``). A tile decodes its expert's weights once, so tiles count decode work
and MMA columns count tensor work.

    python benchmarks/experiments/tile_padding.py [--preset glm5-tp8] [--out FILE]

Routing: ``sglang_fp4ext.bench.layer.make_routing`` (uniform top-k, as every benchmark here),
4 draws per T; the tail's MMA columns count the tail only where a tile has rows past
``block_m`` (as the shipped kernels run it since step 5: a launch of its own for those tiles),
and, printed beside, in every tile (step 4's first form).
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from sglang_fp4ext import model_shapes
from sglang_fp4ext.bench.layer import make_routing

PLANS = [(32, 0), (64, 0), (128, 0), (64, 16), (64, 32), (128, 16), (128, 32), (128, 64)]


def plan_stats(counts: torch.Tensor, bm: int, tail: int) -> dict:
    cap = bm + tail
    tiles = torch.ceil(counts / cap)
    full, rest = torch.floor(counts / cap), counts - torch.floor(counts / cap) * cap
    # Columns issued if the tail's MMAs ran only where the tile has rows past bm, and always.
    used = full * cap + torch.where(rest > bm, torch.full_like(rest, cap),
                                    torch.where(rest > 0, torch.full_like(rest, bm), rest))
    pairs = counts.sum().item()
    return dict(block_m=bm, tail=tail, tiles=int(tiles.sum().item()),
                util_tail_where_used=pairs / used.sum().item(),
                util_tail_always=pairs / (tiles.sum().item() * cap))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="glm5-tp8")
    ap.add_argument("--tokens", default="1024,2048,4096,8192")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    shape = model_shapes.preset(a.preset)
    g = torch.Generator().manual_seed(11)
    rows = []
    for T in (int(t) for t in a.tokens.split(",")):
        per = []
        for _ in range(4):
            ids, _, _ = make_routing(shape, T, device="cpu", generator=g)
            ids = ids[ids >= 0].long()
            counts = torch.bincount(ids, minlength=int(ids.max()) + 1).float()
            per.append([plan_stats(counts[counts > 0], bm, t) for bm, t in PLANS])
        for j, (bm, t) in enumerate(PLANS):
            avg = {k: sum(p[j][k] for p in per) / len(per) for k in per[0][j]}
            rows.append(dict(preset=a.preset, T=T, **avg))
            print(f"{a.preset} T={T:5d} block_m={bm:3d} tail={t:2d}: tiles {avg['tiles']:7.1f}  "
                  f"MMA columns used {100 * avg['util_tail_where_used']:3.0f}% "
                  f"({100 * avg['util_tail_always']:3.0f}% with the tail always issued)")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"what": "GEMM1 M-tile padding (benchmarks/experiments/tile_padding.py)",
                       "routing": "make_routing, uniform top-k, 4 draws per T, seed 11",
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
