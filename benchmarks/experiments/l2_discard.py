"""One-off experiment (H200, prefill step 10's premise): can GEMM2's partial rows stay in L2?

At GLM-5 TP8 T = 4096 GEMM2 writes 453 MB of bf16 partial rows and the ordered combine reads them
back from DRAM (130 us). A combine that runs per column group (~19 MB of partials each) right
after the group is written reads them from L2, and ``discard.global.L2`` after the read drops the
dirty lines without writing them back, so the DRAM write could go too. This times the bytes alone
(no GEMM), as CUDA-graph replay of the launch sequence, over ``S`` bytes cut in chunks of ``C``:

* ``dram``: write every chunk, then read every chunk (today: GEMM2, then the combine pass);
* ``l2``: write chunk g, read chunk g, for each g (the per-group combine);
* ``l2_discard``: the same, each line discarded after its read;
* ``write``, ``read``: the writes alone, the reads alone (of a buffer written earlier).

Each mode's sums are checked against ``dram``'s (the reads saw what was written). Prediction
(before the run, 4.1 TB/s copy bandwidth): dram ~220 us for 2 x 453 MB; l2 ~120-150 (the writes
still reach DRAM when evicted); l2_discard ~60-110 if the discard skips the write-back. Prints a
table last; JSON to $OUT/l2_discard_h200.json.
"""
import datetime
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(__file__))
from _l2_discard_kernels import _read_words, _write_words  # noqa: E402

from sglang_fp4ext.bench.timing import capture_replay, copy_bandwidth_Bps  # noqa: E402

S = 453 << 20  # bytes: GLM-5 TP8 T = 4096's partial rows (4096 x 9 x 6144 x 2)
BLOCK = 4096  # int32 words per program (16 KB)
words = S // 4
assert words % BLOCK == 0  # every chunk is whole programs: no masks, 16-byte accesses
buf = torch.empty(words, dtype=torch.int32, device="cuda")
bw = copy_bandwidth_Bps()


def launches(mode, chunk_words, sums):
    n_chunks = -(-words // chunk_words)

    def wr(g):
        n = min(chunk_words, words - g * chunk_words)
        _write_words[(n // BLOCK,)](buf, g * chunk_words, 7 * g + 1, BLOCK=BLOCK)

    def rd(g, discard):
        n = min(chunk_words, words - g * chunk_words)
        out = sums[g * (chunk_words // BLOCK):]
        _read_words[(n // BLOCK,)](buf, g * chunk_words, out, DISCARD=discard, BLOCK=BLOCK)

    def step(_):
        if mode == "dram":
            for g in range(n_chunks):
                wr(g)
            for g in range(n_chunks):
                rd(g, False)
        elif mode in ("l2", "l2_discard"):
            for g in range(n_chunks):
                wr(g)
                rd(g, mode == "l2_discard")
        elif mode == "write":
            for g in range(n_chunks):
                wr(g)
        elif mode == "read":
            for g in range(n_chunks):
                rd(g, False)

    return step


rows = []
for chunk_mb in (8, 16, 24, 32):  # 57 .. 15 chunks: a launch per chunk and step
    cw = (chunk_mb << 20) // 4
    ref = None
    for mode in ("dram", "l2", "l2_discard", "write", "read"):
        sums = torch.full((words // BLOCK + 1,), -1, dtype=torch.int32, device="cuda")
        if mode == "read":
            launches("write", cw, sums)(0)
        replay, calls = capture_replay(launches(mode, cw, sums), 1, 1)
        for _ in range(5):
            replay()
        ts = sorted(replay() for _ in range(15))
        us = ts[len(ts) // 2]
        torch.cuda.synchronize()
        if mode == "dram":
            ref = sums.clone()
        same = None if mode == "write" else bool(torch.equal(sums, ref))
        moved = {"dram": 2, "l2": 2, "l2_discard": 2, "write": 1, "read": 1}[mode] * S
        rows.append(dict(chunk_MB=chunk_mb, mode=mode, us=round(us, 1),
                         TBps=round(moved / us / 1e6, 2), sums_match=same,
                         min_us=round(ts[0], 1), max_us=round(ts[-1], 1)))
        print(rows[-1], flush=True)

meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            copy_bandwidth_TBps=round(bw / 1e12, 3), bytes=S, block_words=BLOCK)
out = os.environ.get("OUT", ".")
with open(os.path.join(out, "l2_discard_h200.json"), "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s, {S >> 20} MB, {BLOCK * 4 >> 10} KB per program")
print(f"{'chunk MB':>8} " + " ".join(f"{m:>11}" for m in ("dram", "l2", "l2_discard", "write", "read")))
for c in sorted({r["chunk_MB"] for r in rows}):
    rs = {r["mode"]: r for r in rows if r["chunk_MB"] == c}
    print(f"{c:>8} " + " ".join(f"{rs[m]['us']:>8.1f} us" + ("" if rs[m]["sums_match"] in (None, True) else "!")
                              for m in ("dram", "l2", "l2_discard", "write", "read")))
